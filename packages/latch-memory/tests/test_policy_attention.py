"""memory.policy stores BF16-policy attention in BF16 (store_attention): q, k, v and grad_out cast once
and shared by the forward and the backward, out / dq / dk / dv written in BF16 under new names, the
backward reading the forward's out as written, view chains retyped with their base, the matmul
operand cast at the end of one dropped, FP32 readers served by a cast back that keeps the name.
(Run 26: with FP32 storage the model's attention ran the mma.sync bodies at 92 us per backward task.)"""

from __future__ import annotations

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.registry import ATTENTION, COPY, ELEMENTWISE, MATMUL, VIEW, OpSpec, Registry
from latch_memory.policy import policy_pass


def _reg() -> Registry:
    reg = Registry("op")
    for name, tags in [("matmul", {MATMUL}), ("permute", {VIEW}), ("reshape", {VIEW}), ("slice", {VIEW}),
                       ("cast", {ELEMENTWISE, COPY}), ("add", {ELEMENTWISE}), ("sdpa", {ATTENTION}),
                       ("sdpa_backward", {ATTENTION})]:
        reg.add(f"latch::{name}", OpSpec(f"latch::{name}", f"{name}(...)", lambda i, a: [], tags=tags), "test")
    return reg


REG = _reg()
B, H, T, D = 2, 4, 16, 8
QS = (B, H, T, D)


def _doc(dk_is_output: bool = True) -> Document:
    """A layer's attention, forward and backward, with the readers the model gives its results."""
    v32 = lambda n, s, role="intermediate": Value(n, s, "f32", role)  # noqa: E731
    values = [v32("x", (B, H, T, D), "batch"), v32("k", QS, "batch"), v32("v", QS, "batch"),
              v32("w", (H * D, H * D), "param"), v32("g", (B, T, H * D), "batch"),
              v32("q", QS), v32("o", QS), v32("lse", (B, H, T)), v32("ot", (B, T, H, D)), v32("o2", (B, T, H * D)),
              v32("wt", (H * D, H * D)), v32("y", (B, T, H * D)), v32("gr", (B, T, H, D)), v32("go", QS),
              v32("dq", QS), v32("dk", QS), v32("dv", QS), v32("dq1", (B, H, T, D // 2)), v32("r", (B, H, T, D // 2)),
              v32("dv2", (B, H * T, D))]
    src = lambda i: f"model.py:{i} in forward"  # noqa: E731
    att = {"causal": True, "scale": 0.35}
    nodes = [
        Node("q", "latch::add", ("x", "x"), ("q",), {}, source=src(1)),
        Node("sdpa", "latch::sdpa", ("q", "k", "v"), ("o", "lse"), att, source=src(2)),
        Node("ot", "latch::permute", ("o",), ("ot",), {"perm": (0, 2, 1, 3)}, source=src(3)),
        Node("o2", "latch::reshape", ("ot",), ("o2",), {"shape": (B, T, H * D)}, source=src(3)),
        Node("wt", "latch::permute", ("w",), ("wt",), {"perm": (1, 0)}, source=src(4)),
        Node("y", "latch::matmul", ("o2", "wt"), ("y",), {}, source=src(4)),
        Node("gr", "latch::reshape", ("g",), ("gr",), {"shape": (B, T, H, D)}, source=src(5)),
        Node("go", "latch::permute", ("gr",), ("go",), {"perm": (0, 2, 1, 3)}, source=src(5)),
        Node("sdpa_backward", "latch::sdpa_backward", ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"),
             att, source=src(2)),
        Node("dq1", "latch::slice", ("dq",), ("dq1",), {"dim": 3, "start": 0, "end": D // 2, "step": 1}, source=src(6)),
        Node("r", "latch::add", ("dq1", "dq1"), ("r",), {}, source=src(6)),
        Node("dv2", "latch::reshape", ("dv",), ("dv2",), {"shape": (B, H * T, D)}, source=src(7)),
    ]
    ins = [Group("batch", ["x", "k", "v", "g"]), Group("params", ["w"])]
    outs = [Group("loss", ["y", "r", "dv2"] + (["dk"] if dk_is_output else []))]
    return Document(graph=GraphSection([Graph("update", values, nodes, ins, outs)]))


def _by(g, name):
    return next(n for n in g.nodes if n.name == name)


def _producer(g, value):
    return next(n for n in g.nodes if value in n.outputs)


def test_attention_reads_and_writes_bf16_and_every_reader_is_served():
    doc = policy_pass(_doc(), registry=REG)
    g = doc.graph.programs[0]
    fwd, bwd = _by(g, "sdpa"), _by(g, "sdpa_backward")
    # q, k, v cast once, shared by the forward and the backward; grad_out cast for the backward
    assert fwd.inputs == ("q.bf16", "k.bf16", "v.bf16")
    assert bwd.inputs == ("go.bf16", None, "q.bf16", "k.bf16", "v.bf16", "o.bf16", "lse")
    for c in ("q.bf16", "k.bf16", "v.bf16", "go.bf16"):
        n = _producer(g, c)
        assert n.op == "latch::cast" and n.attr("dtype") == "bf16" and g.value(c).dtype == "bf16"
    # results in bf16 under new names; lse stays f32
    assert fwd.outputs == ("o.bf16", "lse") and g.value("lse").dtype == "f32"
    assert bwd.outputs == ("dq.bf16", "dk.bf16", "dv.bf16")
    assert all(g.value(v).dtype == "bf16" for v in ("o.bf16", "dq.bf16", "dk.bf16", "dv.bf16"))
    # out's view chain is retyped and the matmul operand cast that store_operands put there is gone:
    # the attention-output product reads the chain as the forward wrote it
    assert _by(g, "ot").inputs == ("o.bf16",) and g.value("ot").dtype == "bf16" and g.value("o2").dtype == "bf16"
    assert _by(g, "y").inputs[0] == "o2"
    assert not g.has_value("o")  # nobody reads out in f32 any more
    # dq's slice is retyped; its f32 reader (add) reads a widening cast of the slice
    assert g.value("dq1").dtype == "bf16" and _by(g, "dq1").inputs == ("dq.bf16",)
    widen = _producer(g, "dq1.f32")
    assert widen.op == "latch::cast" and widen.attr("dtype") == "f32" and widen.inputs == ("dq1",)
    assert _by(g, "r").inputs == ("dq1.f32", "dq1.f32")
    # a program output keeps its name and dtype: dk is a cast back of dk.bf16; dv's reshape is an
    # output itself, so it reads the widened dv under its old name
    assert _producer(g, "dk").op == "latch::cast" and _producer(g, "dk").inputs == ("dk.bf16",)
    assert g.value("dk").dtype == "f32" and g.value("dv2").dtype == "f32"
    assert _producer(g, "dv").inputs == ("dv.bf16",) and _by(g, "dv2").inputs == ("dv",)
    # the graph is in order: every value is written before it is read
    written = set(v for grp in g.inputs for v in grp.values)
    for n in g.nodes:
        assert all(v is None or v in written for v in n.inputs), n.name
        written.update(n.outputs)
    assert set(g.output_names()) <= written
    stored = dict(dict(dict(doc.graph.metadata)["memory.policy"])["stored"])
    assert stored["attention_nodes_stored"] == 2 and stored["attention_operand_casts"] == 4
    assert stored["attention_results_low"] == 4 and stored["attention_casts_dropped"] == 1
    assert stored["attention_widening_casts"] == 3  # dq1, dk (output), dv (the output reshape)
    assert policy_pass(doc, registry=REG).graph.programs == doc.graph.programs  # idempotent


def test_no_attention_storage_keeps_fp32_attention_and_the_matmul_cast():
    g = policy_pass(_doc(), registry=REG, attention=False).graph.programs[0]
    assert _by(g, "sdpa").inputs == ("q", "k", "v") and _by(g, "sdpa").outputs == ("o", "lse")
    assert _by(g, "sdpa_backward").outputs == ("dq", "dk", "dv")
    assert _by(g, "y").inputs[0] == "o2.bf16"  # the matmul's own operand cast


def test_fp32_attention_without_a_low_policy_is_untouched():
    g = policy_pass(_doc(), registry=REG, table={"attention": {"operand_dtype": None}}).graph.programs[0]
    assert _by(g, "sdpa").inputs == ("q", "k", "v") and _by(g, "sdpa_backward").inputs[0] == "go"
    assert all(not n.name.startswith("cast.") or n.inputs[0] not in ("q", "k", "v", "go") for n in g.nodes)
