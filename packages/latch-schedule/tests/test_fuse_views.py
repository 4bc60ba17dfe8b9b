"""Views never materialise inside elementwise chains; ``latch::concat`` fuses with its producers
(issue 11, results/vf.md).

Units: the fusion rule for a concat (operands join, a program-output operand does not, a concat
never enters a reduction's prologue, it joins an elementwise or injective-view consumer) and the
pass ``schedule.fuse_views`` (a view read by several nodes is cloned per reader that absorbs it,
readers that do not keep the original, chains are cloned whole, program outputs never).
On the captured transformer and TinyMoE (small sizes, the same structure as the full-size ones):
every group holding a node of ``apply_rope`` also holds its concat (RoPE's forward is ONE group
per q and per k, its backward one group for dq and dk together with the d(qkv) assembly), no
view-only group holds a RoPE node, and the documents pass the hazard proof under both strategies.
"""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("torch")

import latch_schedule.testing as testing  # noqa: E402
from conftest_examples import planned  # noqa: E402,F401  (fixtures: registries, captured)
from latch_schedule.fuse_views import clone_fusable_views  # noqa: E402
from latch_schedule.fusion import fuse  # noqa: E402


class Builder(testing.Builder):
    """The test builder over the real ``latch::`` ops (views, concat)."""

    def node(self, opname, inputs, attrs=None, n_out=1, name=None):
        old, testing.NS = testing.NS, "latch"
        try:
            return super().node(opname, inputs, attrs, n_out, name)
        finally:
            testing.NS = old


@pytest.fixture(scope="module")
def ops(registries):
    return registries.ops


def _names(plans):
    return [[n.name for n in p.nodes] for p in plans]


def _rope(b, x, cos, sin, half):
    """x (.., 2*half) -> cat(x1*cos - x2*sin, x2*cos + x1*sin)."""
    *lead, d = b._types[x].shape
    (x1,) = b.node("slice", [x], {"dim": len(lead), "start": 0, "end": half, "step": 1}, name="x1")
    (x2,) = b.node("slice", [x], {"dim": len(lead), "start": half, "end": d, "step": 1}, name="x2")
    (a1,) = b.node("mul", [x1, cos], name="a1")
    (a2,) = b.node("mul", [x2, sin], name="a2")
    (a,) = b.node("sub", [a1, a2], name="a")
    (b1,) = b.node("mul", [x2, cos], name="b1")
    (b2,) = b.node("mul", [x1, sin], name="b2")
    (bb,) = b.node("add", [b1, b2], name="b")
    (y,) = b.node("concat", [a, bb], {"dim": len(lead)}, name="cat")
    return y


def test_rope_is_one_group_with_its_concat(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (2, 4, 8, 16), role="batch")
    cos = b.input("batch", "cos", (8, 8), role="batch")
    sin = b.input("batch", "sin", (8, 8), role="batch")
    y = _rope(b, x, cos, sin, 8)
    (m,) = b.node("amax", [y], {"dims": (3,), "keepdim": True}, name="mx")
    g = b.graph({"loss": [m]})
    plans = fuse(g, ops)
    assert _names(plans) == [["x1", "x2", "a1", "a2", "a", "b1", "b2", "b", "cat"], ["mx"]]
    p = plans[0]
    assert p.inputs == ("x", "cos", "sin") and p.outputs == ("cat",) and not p.pointwise
    # without the concat rule: the halves are a group (horizontal fusion), the views and the concat copies
    before = _names(fuse(g, ops, concat=False))
    assert ["cat"] in before and len(before) > 2


def test_program_output_operand_does_not_join_a_concat(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    z = b.input("batch", "z", (8, 4), role="batch")
    (a,) = b.node("relu", [x], name="a")
    (e,) = b.node("exp", [z], name="e")
    (c,) = b.node("concat", [a, e], {"dim": 1}, name="cat")
    g = b.graph({"loss": [c], "metrics": [a]})
    assert _names(fuse(g, ops)) == [["a"], ["e", "cat"]]


def test_concat_joins_its_elementwise_and_view_consumers_not_a_prologue(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    z = b.input("batch", "z", (8, 4), role="batch")
    (a,) = b.node("relu", [x], name="a")
    (c,) = b.node("concat", [a, z], {"dim": 1}, name="cat")
    (p,) = b.node("permute", [c], {"perm": (1, 0)}, name="t")
    (m,) = b.node("mul", [p], {"scalar": 2.0}, name="m")
    g = b.graph({"loss": [m]})
    assert _names(fuse(g, ops)) == [["a", "cat", "t", "m"]]
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    z = b.input("batch", "z", (8, 4), role="batch")
    (c,) = b.node("concat", [x, z], {"dim": 1}, name="cat")
    (sq,) = b.node("mul", [c, c], name="sq")
    (s,) = b.node("sum", [sq], {"dims": (1,), "keepdim": True}, name="s")
    g = b.graph({"loss": [s]})
    assert _names(fuse(g, ops)) == [["cat"], ["sq", "s"]]  # the prologue's body reads flat elements


def test_concat_of_one_value_twice_is_not_fused(ops):
    """cat(a, a): each element of a would feed two outputs (recomputed); a stays its own group."""
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    (a,) = b.node("relu", [x], name="a")
    (c,) = b.node("concat", [a, a], {"dim": 1}, name="cat")
    g = b.graph({"loss": [c]})
    assert _names(fuse(g, ops)) == [["a"], ["cat"]]


def test_fuse_views_clones_per_absorbing_reader(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (4, 8), role="batch")
    w = b.input("params", "w", (4, 4))
    (t,) = b.node("permute", [x], {"perm": (1, 0)}, name="t")  # (8, 4): read by a matmul and two pointwise
    (m,) = b.node("matmul", [t, w], name="mm")
    (r,) = b.node("relu", [t], name="r")
    (e,) = b.node("exp", [t], name="e")
    g = b.graph({"loss": [m, r, e]})
    g2, rep = clone_fusable_views(g, ops)
    assert rep == {"views": 1, "clones": 2}
    by = {n.name: n for n in g2.nodes}
    assert by["mm"].inputs[0] == "t" and by["r"].inputs == ("t.v1",) and by["e"].inputs == ("t.v2",)
    assert [n.name for n in g2.nodes] == ["t", "t.v1_", "t.v2_", "mm", "r", "e"]  # node names avoid value names
    # the permute no longer materialises for the pointwise readers: each reads x through the map
    plans = fuse(g2, ops)
    assert ["t.v1_", "r"] in _names(plans) and ["t.v2_", "e"] in _names(plans) and ["t"] in _names(plans)
    assert [["t"], ["mm"], ["r", "e"]] == _names(fuse(g, ops))  # before: both read the copy


def test_fuse_views_leaves_non_absorbing_readers_and_outputs_alone(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (4, 8), role="batch")
    w = b.input("params", "w", (4, 4))
    (t,) = b.node("permute", [x], {"perm": (1, 0)}, name="t")
    (m1,) = b.node("matmul", [t, w], name="mm1")
    (m2,) = b.node("matmul", [t, w], name="mm2")
    g = b.graph({"loss": [m1, m2]})
    assert clone_fusable_views(g, ops) == (g, {})  # two matmuls: one copy stays one copy
    b = Builder(ops)
    x = b.input("batch", "x", (4, 8), role="batch")
    (t,) = b.node("permute", [x], {"perm": (1, 0)}, name="t")
    (r,) = b.node("relu", [t], name="r")
    (e,) = b.node("exp", [t], name="e")
    g = b.graph({"loss": [r, e], "metrics": [t]})
    assert clone_fusable_views(g, ops) == (g, {})  # a program output is written anyway


def test_fuse_views_clones_a_chain_whole(ops):
    """reshape -> permute -> select read by two RoPE-like pointwise chains: the whole chain is cloned
    per reader, and each copy fuses (no view-only group left)."""
    b = Builder(ops)
    x = b.input("batch", "x", (6, 3 * 8), role="batch")
    (r,) = b.node("reshape", [x], {"shape": (6, 3, 8)}, name="r")
    (p,) = b.node("permute", [r], {"perm": (1, 0, 2)}, name="p")
    (q,) = b.node("select", [p], {"dim": 0, "index": 0}, name="q")
    (k,) = b.node("select", [p], {"dim": 0, "index": 1}, name="k")
    (a,) = b.node("relu", [q], name="a")
    (c,) = b.node("exp", [k], name="c")
    g = b.graph({"loss": [a, c]})
    g2, rep = clone_fusable_views(g, ops)
    assert rep["clones"] >= 2
    plans = fuse(g2, ops)
    assert len(plans) == 2 and all(p.inputs == ("x",) for p in plans)
    assert len(fuse(g, ops)) == 3  # before: the reshape+permute copy, then the two chains


# ---------------------------------------------------------------------------------------------
# the captured examples


def _plan(registries, doc, strategy, on: bool):
    from latch_core.passes import run_pass
    from latch_schedule.passes import ALIAS_VIEWS, FUSE_VIEWS, SCHEDULE

    if on:
        doc = run_pass(FUSE_VIEWS, doc)
    doc = run_pass(ALIAS_VIEWS, doc)
    d = SCHEDULE.run(doc, scheduler=strategy, num_sms=16, alias_views=True)
    return registries.passes.get("memory.plan").run(d)


def _rope_groups(doc, ops):
    """(ops of the group, view-only, the ops producing its inputs) per group holding a RoPE node."""
    from latch_core.registry import STRUCTURAL, VIEW

    ps = doc.schedule.programs[0]
    g = doc.graph.program(ps.program)
    nodes = {n.name: n for n in g.nodes}
    producer = {o: n.op for n in g.nodes for o in n.outputs}
    out = []
    for grp in ps.groups:
        gn = [nodes[x] for x in grp.nodes]
        if any("apply_rope" in (n.source or "") for n in gn):
            view_only = all(ops.get(n.op).tags & {VIEW, STRUCTURAL} for n in gn)
            out.append((tuple(n.op for n in gn), view_only, {producer.get(v) for v in grp.inputs}))
    return out


@pytest.mark.parametrize("example,layers", [("transformer", 2), ("tinymoe", 2)])
def test_rope_forward_and_backward_are_one_group_each(registries, captured, example, layers):
    from latch_schedule.validate import validate

    doc = captured[example]
    after = _plan(registries, doc, "barrier", True)
    groups = _rope_groups(after, registries.ops)
    cats = collections.Counter(ops.count("latch::concat") for ops, _, _ in groups)
    assert not any(v for _, v, _ in groups), groups  # no RoPE view or concat is a copy task of its own
    assert all("latch::concat" in ops for ops, _, _ in groups), groups
    # forward: one group per q and per k and layer (its concat); backward: one per layer holding
    # dq's and dk's concats and the d(qkv) stack
    assert len(groups) == 3 * layers, groups
    assert cats == {1: 2 * layers, 3: layers}, cats
    # the forward groups read the q/k/v product's output through reshape, permute and select; without
    # schedule.fuse_views they read a copy (the permute shared with v's reader is its own group)
    fwd = [ins for ops, _, ins in groups if ops.count("latch::concat") == 1]
    assert all("latch::matmul" in ins and "latch::permute" not in ins for ins in fwd), groups
    plain = _plan(registries, doc, "barrier", False)
    before = _rope_groups(plain, registries.ops)
    assert all("latch::permute" in ins for ops, _, ins in before if ops.count("latch::concat") == 1), before

    def stats(d):
        return dict(dict(d.schedule.stats)[f"program.{d.schedule.programs[0].program}"])
    # the copy the forward groups read is still written for v (its reader is the attention): never more
    assert stats(after)["groups"] <= stats(plain)["groups"] and stats(after)["phases"] <= stats(plain)["phases"]
    for strategy in ("barrier", "dataflow"):
        d = after if strategy == "barrier" else _plan(registries, doc, strategy, True)
        assert validate(d, ops=registries.ops) == []


@pytest.mark.parametrize("perm,dim,index", [((2, 0, 1), 1, 1), ((1, 0, 2), 0, 2), ((0, 2, 1), 2, 0)])
def test_select_moves_before_its_permute(ops, perm, dim, index):
    """select(permute(x)) == permute'(select(x)): the rewrite keeps every element in place (each
    output coordinate traced back to x's through both index maps, from the rewritten nodes'
    attributes), and the permute nobody reads any more is gone."""
    import itertools

    from latch_schedule.fuse_views import select_before_permute

    def permute(src, pr):  # coordinates of the output -> coordinates of the operand
        return lambda o: src(tuple(o[pr.index(k)] for k in range(len(pr))))

    def select(src, d, i):
        return lambda o: src(tuple(o[:d]) + (i,) + tuple(o[d:]))

    b = Builder(ops)
    x = b.input("batch", "x", (3, 4, 5), role="batch")
    (p,) = b.node("permute", [x], {"perm": perm}, name="p")
    (s,) = b.node("select", [p], {"dim": dim, "index": index}, name="s")
    (r,) = b.node("relu", [s], name="r")
    g = b.graph({"loss": [r]})
    g2, n = select_before_permute(g)
    assert n == 1 and [m.op for m in g2.nodes] == ["latch::select", "latch::permute", "latch::relu"]
    sel, per = g2.nodes[0].attr_dict, g2.nodes[1].attr_dict
    ident = lambda c: c  # noqa: E731
    want = select(permute(ident, tuple(perm)), dim, index)
    got = permute(select(ident, sel["dim"], sel["index"]), tuple(per["perm"]))
    shape = g.value(s).shape
    assert g2.value(g2.nodes[1].outputs[0]).shape == shape and not g2.has_value("p")
    assert all(want(o) == got(o) for o in itertools.product(*(range(e) for e in shape)))
