"""Fusion rules, convexity, and body signature keys."""

from __future__ import annotations

from latch_schedule.fusion import fuse
from latch_schedule.testing import Builder


def _names(plans):
    return [[n.name for n in p.nodes] for p in plans]


def test_elementwise_chain_fuses_and_its_intermediates_never_reach_memory(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    y = b.input("batch", "y", (8, 4), role="batch")
    (a,) = b.node("add", [x, y], name="a")
    (r,) = b.node("relu", [a], name="r")
    (m,) = b.node("mul", [r, y], name="m")
    g = b.graph({"loss": [m]})
    plans = fuse(g, ops)
    assert _names(plans) == [["a", "r", "m"]]
    p = plans[0]
    assert p.outputs == ("m",) and p.internal == {"a", "r"} and p.primary == "m"
    assert p.inputs == ("x", "y") and p.pointwise
    assert _names(fuse(g, ops, enabled=False)) == [["a"], ["r"], ["m"]]


def test_two_consumers_in_different_groups_do_not_fuse(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    w = b.input("params", "w", (4, 4))
    (a,) = b.node("relu", [x], name="a")
    (m,) = b.node("matmul", [a, w], name="mm")
    (s,) = b.node("mul", [a, x], name="sq")
    g = b.graph({"loss": [m, s]})
    # sq reads x as well, so it is no sibling of a's group (test_sibling_fusion.py)
    assert _names(fuse(g, ops)) == [["a"], ["mm"], ["sq"]]


def test_program_output_joins_when_it_has_the_primary_shape(ops):
    """The optimizer pattern: a new moment is a program output and also feeds the weight update."""
    b = Builder(ops)
    w = b.input("params", "w", (8, 4))
    m = b.input("state", "m", (8, 4), role="state")
    gr = b.input("batch", "g", (8, 4), role="batch")
    lr = b.input("hyper", "lr", (), role="hyper")
    (m2,) = b.node("add", [m, gr], name="m_new")
    (w2,) = b.node("sgd", [w, m2, lr], name="w_new")
    g = b.graph({"new_params": [w2], "new_state": [m2]}, inplace=[(w2, w), (m2, m)])
    plans = fuse(g, ops)
    assert _names(plans) == [["m_new", "w_new"]]
    assert set(plans[0].outputs) == {"m_new", "w_new"} and plans[0].primary == "w_new"
    assert plans[0].internal == frozenset()


def test_broadcast_producer_is_not_recomputed(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 1), role="batch")
    y = b.input("batch", "y", (8, 4), role="batch")
    (a,) = b.node("relu", [x], name="a")  # [8, 1]
    (m,) = b.node("mul", [a, y], name="m")  # [8, 4]: different shape, stays apart
    g = b.graph({"loss": [m]})
    assert _names(fuse(g, ops)) == [["a"], ["m"]]


def test_groups_are_convex_and_topologically_ordered(ops):
    """a feeds b and c; c also reads b. Fusing must never leave a path out of a group and back."""
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    w = b.input("params", "w", (4, 4))
    (a,) = b.node("relu", [x], name="a")
    (mm,) = b.node("matmul", [a, w], name="mm")
    (c,) = b.node("add", [a, mm], name="c")
    g = b.graph({"loss": [c]})
    plans = fuse(g, ops)
    position = {}
    for i, p in enumerate(plans):
        for n in p.nodes:
            position[n.name] = i
    for i, p in enumerate(plans):
        for n in p.nodes:
            for v in n.inputs:
                prod = next((q for q in g.nodes if v in q.outputs), None)
                if prod is not None:
                    assert position[prod.name] <= i
    assert position["a"] != position["c"]  # a is read by mm outside c's group


def test_equal_groups_share_a_body_key(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    y = b.input("batch", "y", (8, 4), role="batch")
    (a1,) = b.node("add", [x, y], name="a1")
    (r1,) = b.node("relu", [a1], name="r1")
    # its own inputs of the same types: a group reading x and y as well would merge with the first
    # (horizontal fusion, test_fusion_horizontal.py)
    x2 = b.input("batch", "x2", (8, 4), role="batch")
    y2 = b.input("batch", "y2", (8, 4), role="batch")
    (a2,) = b.node("add", [y2, x2], name="a2")
    (r2,) = b.node("relu", [a2], name="r2")
    (z,) = b.node("matmul", [r1, b.input("params", "w", (4, 4))], name="mm")
    (a3,) = b.node("add", [x, y], name="a3")
    (c3,) = b.node("cast", [a3], {"dtype": "bf16"}, name="c3")
    g = b.graph({"loss": [r2, z, c3]})
    plans = {p.primary: p for p in fuse(g, ops)}
    assert plans["r1"].body == plans["r2"].body  # same ops, types and wiring, other value names
    assert plans["r1"].body != plans["c3"].body
    assert plans["r1"].body.startswith("add+relu/")


def test_in_place_safety_looks_only_at_what_is_computed_from_the_old_value():
    """Gradient accumulation: new_acc = acc + reshape(g). The view is on the other operand, so a
    task may overwrite acc element by element; through a view of acc itself it may not."""
    from latch_core.ir import Graph, Group, Node, Value
    from latch_core.plugins import load_with
    from latch_core.registry import ELEMENTWISE, VIEW, OpSpec
    from latch_core.ir import TensorType

    specs = [OpSpec("v::add", "add", lambda i, a: [i[0]], tags={ELEMENTWISE}),
             OpSpec("latch::reshape", "reshape", lambda i, a: [TensorType(tuple(a["shape"]), i[0].dtype)], tags={VIEW}),
             OpSpec("latch::permute", "permute", lambda i, a: [TensorType(tuple(i[0].shape[p] for p in a["perm"]),
                                                                           i[0].dtype)], tags={VIEW})]

    class P:
        from latch_core.hookspecs import hookimpl

        @hookimpl
        def latch_register_ops(self, register):
            for s in specs:
                register(s)

    ops = load_with(("p", P()), entry_points=False).ops

    def graph(view_on_old: bool):
        vals = [Value("acc", (4, 6), "f32", "state"), Value("g", (24,), "f32", "batch"),
                Value("r", (4, 6), "f32"), Value("new", (4, 6), "f32")]
        if view_on_old:  # new = permute(acc) + reshape-free: the old value itself goes through a view
            nodes = [Node("r", "latch::permute", ["acc"], ["r"], {"perm": (0, 1)}),
                     Node("new", "v::add", ["r", "r"], ["new"])]
        else:
            nodes = [Node("r", "latch::reshape", ["g"], ["r"], {"shape": (4, 6)}),
                     Node("new", "v::add", ["acc", "r"], ["new"])]
        return Graph("p", vals, nodes, [Group("state", ["acc"]), Group("batch", ["g"])],
                     [Group("new_state", ["new"])], inplace=[("new", "acc")])

    g = graph(False)
    (plan,) = fuse(g, ops)
    assert not plan.pointwise and plan.inplace_safe(g, "acc", "new")
    g = graph(True)
    (plan,) = fuse(g, ops)
    assert len(plan.nodes) == 2 and not plan.inplace_safe(g, "acc", "new")


def test_an_op_accumulating_into_one_input_may_write_over_it():
    """OpSpec.extra["accumulates_into"] = j: each output element starts from input j's element and
    only adds to it (embedding_backward onto its base, ops.embedding_grad_sum): in-place safe
    through input j, never through another input (the planner's latch_memory.liveness.self_update_ok
    follows the same rule)."""
    from latch_core.ir import Graph, Group, Node, TensorType, Value
    from latch_core.plugins import load_with
    from latch_core.registry import INDEXING, OpSpec

    acc = OpSpec("v::onto", "onto", lambda i, a: [TensorType(i[2].shape, i[2].dtype)], tags={INDEXING})
    acc.extra["accumulates_into"] = 2

    class P:
        from latch_core.hookspecs import hookimpl

        @hookimpl
        def latch_register_ops(self, register):
            register(acc)

    ops = load_with(("p", P()), entry_points=False).ops
    vals = [Value("g", (4, 6), "f32", "batch"), Value("i", (4,), "i64", "batch"), Value("base", (4, 6), "f32", "batch"),
            Value("new", (4, 6), "f32")]
    g = Graph("p", vals, [Node("n", "v::onto", ["g", "i", "base"], ["new"])],
              [Group("batch", ["g", "i", "base"])], [Group("out", ["new"])])
    (plan,) = fuse(g, ops)
    assert dict(plan.onto) == {"n": 2}
    assert plan.inplace_safe(g, "base", "new") and not plan.inplace_safe(g, "g", "new")
