"""memory.policy stores BF16 matmul operands: one cast per value, seen through transposing permutes
so the layout fold still applies, f32 results kept (out_dtype), output casts folded into the matmul,
and the counts recorded. (The whole pipeline on the examples: tests/test_matmul_pipeline.py.)"""

from __future__ import annotations

import pytest

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.registry import COPY, ELEMENTWISE, MATMUL, VIEW, OpSpec, Registry
from latch_memory.policy import apply_policy, policy_pass


def _reg() -> Registry:
    reg = Registry("op")
    for name, tags in [("matmul", {MATMUL}), ("permute", {VIEW}), ("reshape", {VIEW}), ("cast", {ELEMENTWISE, COPY}),
                       ("add", {ELEMENTWISE})]:
        reg.add(f"latch::{name}", OpSpec(f"latch::{name}", f"{name}(...)", lambda i, a: [], tags=tags), "test")
    return reg


REG = _reg()


class G:
    def __init__(self):
        self.values, self.nodes, self.ins = [], [], {}

    def input(self, group, name, shape, role="param"):
        self.values.append(Value(name, shape, "f32", role))
        self.ins.setdefault(group, []).append(name)
        return name

    def node(self, op, ins, out_shape, name, **attr):
        self.values.append(Value(name, out_shape, "f32"))
        self.nodes.append(Node(name, f"latch::{op}", ins, (name,), attr, source=f"model.py:{len(self.nodes) + 1} in f"))
        return name

    def doc(self, *outs):
        g = Graph("update", self.values, self.nodes, [Group(k, v) for k, v in self.ins.items()], [Group("loss", outs)])
        return Document(graph=GraphSection([g]))


def _linear():
    """forward y = x @ W^T, input gradient dx = dy @ W, weight gradient dW = dy^T @ x."""
    b = G()
    w = b.input("params", "w", (48, 32))
    x = b.input("batch", "x", (64, 32), role="batch")
    dy = b.input("batch", "dy", (64, 48), role="batch")
    t = b.node("permute", [w], (32, 48), "t", perm=(1, 0))
    y = b.node("matmul", [x, t], (64, 48), "y")
    dx = b.node("matmul", [dy, w], (64, 32), "dx")
    dt = b.node("permute", [dy], (48, 64), "dt", perm=(1, 0))
    dw = b.node("matmul", [dt, x], (48, 32), "dw")
    r = b.node("add", [x, x], (64, 32), "r")  # x is read in f32 elsewhere too
    return b.doc(y, dx, dw, r)


def _by(g, name):
    return next(n for n in g.nodes if n.name == name)


def test_each_value_is_cast_once_and_weights_are_read_through_their_transpose():
    doc = policy_pass(_linear(), registry=REG)
    g = doc.graph.programs[0]
    casts = [n for n in g.nodes if n.op == "latch::cast"]
    assert sorted(n.inputs[0] for n in casts) == ["dy", "w", "x"]  # one per value, shared
    assert all(n.attr("dtype") == "bf16" and g.value(n.outputs[0]).dtype == "bf16" for n in casts)
    cast_of = {n.inputs[0]: n.outputs[0] for n in casts}
    # the permutes now read the bf16 copies (so the layout fold still applies)
    assert _by(g, "t").inputs == (cast_of["w"],) and g.value("t").dtype == "bf16"
    assert _by(g, "dt").inputs == (cast_of["dy"],) and g.value("dt").dtype == "bf16"
    assert _by(g, "y").inputs == (cast_of["x"], "t") and _by(g, "dx").inputs == (cast_of["dy"], cast_of["w"])
    assert _by(g, "dw").inputs == ("dt", cast_of["x"])
    for mm in ("y", "dx", "dw"):
        n = _by(g, mm)
        assert n.attr("out_dtype") == "f32" and g.value(mm).dtype == "f32"
        assert n.attr("operand_dtype") == "bf16" and n.attr("accum_dtype") == "f32"  # kept for other readers
    assert _by(g, "r").inputs == ("x", "x")  # the f32 reader is untouched
    order = [n.name for n in g.nodes]
    for c in casts:  # before every reader, with the first matmul's source line
        readers = [n.name for n in g.nodes if c.outputs[0] in n.inputs]
        assert all(order.index(c.name) < order.index(r) for r in readers)
    assert _by(g, "cast.w.bf16").source == _by(g, "y").source
    stored = dict(dict(dict(doc.graph.metadata)["memory.policy"])["stored"])
    assert stored == {"matmuls_with_stored_operands": 3, "operand_casts": 3, "transposes_seen_through": 2,
                      "output_casts_folded": 0}
    assert policy_pass(doc, registry=REG).graph.programs == doc.graph.programs  # idempotent


def test_a_permute_with_an_f32_reader_is_not_seen_through():
    b = G()
    w = b.input("params", "w", (8, 4))
    x = b.input("batch", "x", (2, 4), role="batch")
    t = b.node("permute", [w], (4, 8), "t", perm=(1, 0))
    y = b.node("matmul", [x, t], (2, 8), "y")
    z = b.node("add", [t, t], (4, 8), "z")
    g = policy_pass(b.doc(y, z), registry=REG).graph.programs[0]
    assert g.value("t").dtype == "f32" and _by(g, "t").inputs == ("w",)
    assert _by(g, "y").inputs == ("x.bf16", "t.bf16")  # the transposed copy is what gets cast


def test_an_output_read_only_by_bf16_casts_is_written_in_bf16():
    b = G()
    x = b.input("batch", "x", (8, 8), role="batch")
    w1, w2 = b.input("params", "w1", (8, 8)), b.input("params", "w2", (8, 8))
    h = b.node("matmul", [x, w1], (8, 8), "h")
    y = b.node("matmul", [h, w2], (8, 8), "y")  # h only feeds another bf16 product
    g = policy_pass(b.doc(y), registry=REG).graph.programs[0]
    hn = _by(g, "h")
    assert hn.attr("out_dtype") == "bf16" and g.value(hn.outputs[0]).dtype == "bf16" and not g.has_value("h")
    assert _by(g, "y").inputs[0] == hn.outputs[0]
    assert sum(n.op == "latch::cast" for n in g.nodes) == 3  # x, w1, w2; h's cast folded away
    stored = dict(dict(dict(policy_pass(b.doc(y), registry=REG).graph.metadata)["memory.policy"])["stored"])
    assert stored["output_casts_folded"] == 1


@pytest.mark.parametrize("override", [{"nodes": {"y": {"operand_dtype": None}}}, {"store": False},
                                      {"table": {"matmul": {"operand_dtype": "f32"}}}])
def test_no_casts_without_a_low_precision_policy(override):
    g = policy_pass(_linear(), registry=REG, **override).graph.programs[0]
    casts = {n.inputs[0] for n in g.nodes if n.op == "latch::cast"}
    if "nodes" in override:
        assert _by(g, "y").inputs == ("x", "t") and _by(g, "t").inputs == ("w",)  # y keeps f32 operands
        assert "w" in casts  # dx still reads w in bf16
    else:
        assert casts == set()


def test_the_input_document_is_not_mutated():
    doc = _linear()
    before = [n for n in doc.graph.programs[0].nodes]
    apply_policy(doc.graph, REG)
    assert list(doc.graph.programs[0].nodes) == before
