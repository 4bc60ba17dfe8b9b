"""memory.policy option ``products`` (off by default): a BF16-policy product whose result reaches
only BF16 consumers through elementwise ops and views writes BF16; views are retyped with it and
every other reader reads its own cast back to f32. A result also read by a reduction, or one that
reaches a program output, stays f32."""

from __future__ import annotations

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.registry import COPY, ELEMENTWISE, MATMUL, REDUCTION, VIEW, OpSpec, Registry
from latch_memory.policy import policy_pass


def _reg() -> Registry:
    reg = Registry("op")
    for name, tags in [("matmul", {MATMUL}), ("reshape", {VIEW}), ("cast", {ELEMENTWISE, COPY}),
                       ("mul", {ELEMENTWISE}), ("silu", {ELEMENTWISE}), ("sum", {REDUCTION})]:
        reg.add(f"latch::{name}", OpSpec(f"latch::{name}", f"{name}(...)", lambda i, a: [], tags=tags), "test")
    return reg


REG = _reg()


def _mlp(extra_reader: str | None = None):
    """h = x @ w1; a = silu(h) * h; y = a @ w2 (a swish-like FFN); ``extra_reader``: another reader
    of h ("sum": a reduction; "out": h is also a program output)."""
    vals = [Value("x", (64, 32), "f32", "batch"), Value("w1", (32, 48), "f32", "param"),
            Value("w2", (48, 32), "f32", "param")]
    nodes = []

    def node(op, ins, shape, name):
        vals.append(Value(name, shape, "f32"))
        nodes.append(Node(name, f"latch::{op}", ins, (name,), {}, source=f"m.py:{len(nodes) + 1} in f"))
        return name
    h = node("matmul", ["x", "w1"], (64, 48), "h")
    hv = node("reshape", [h], (64, 48), "hv")
    s = node("silu", [hv], (64, 48), "s")
    a = node("mul", [s, h], (64, 48), "a")
    y = node("matmul", [a, "w2"], (64, 32), "y")
    outs = [y]
    if extra_reader == "sum":
        outs.append(node("sum", [h], (48,), "hs"))
    elif extra_reader == "out":
        outs.append(h)
    g = Graph("update", vals, nodes, [Group("batch", ["x"]), Group("params", ["w1", "w2"])], [Group("loss", outs)])
    return Document(graph=GraphSection([g]))


def _by(g, name):
    return next(n for n in g.nodes if n.name == name)


def test_off_by_default_the_product_writes_f32():
    g = policy_pass(_mlp(), registry=REG).graph.programs[0]
    assert _by(g, "h").outputs == ("h",) and g.value("h").dtype == "f32"
    assert _by(g, "h").attr("out_dtype") == "f32"


def test_a_product_feeding_only_bf16_consumers_writes_bf16():
    doc = policy_pass(_mlp(), registry=REG, products=True)
    g = doc.graph.programs[0]
    h = _by(g, "h")
    assert h.attr("out_dtype") == "bf16" and h.outputs == ("h.bf16",) and g.value("h.bf16").dtype == "bf16"
    assert "h" not in {v.name for v in g.values}
    # the view is retyped with it and reads the BF16 value itself
    assert _by(g, "hv").inputs == ("h.bf16",) and g.value("hv").dtype == "bf16"
    # each non-view reader has its own widening cast, placed just before it
    widen = [n for n in g.nodes if n.op == "latch::cast" and n.attr("dtype") == "f32"]
    assert sorted(n.inputs[0] for n in widen) == ["h.bf16", "hv"]
    order = [n.name for n in g.nodes]
    for c in widen:
        (reader,) = [n for n in g.nodes if c.outputs[0] in n.inputs]
        assert order.index(c.name) < order.index(reader.name)
    # the second product's result is a program output: it stays f32
    assert _by(g, "y").attr("out_dtype") == "f32" and g.value("y").dtype == "f32"


def test_a_reduction_reader_or_a_program_output_keeps_f32():
    for extra in ("sum", "out"):
        g = policy_pass(_mlp(extra), registry=REG, products=True).graph.programs[0]
        assert _by(g, "h").outputs == ("h",) and g.value("h").dtype == "f32", extra
        assert _by(g, "h").attr("out_dtype") == "f32", extra


def test_counts_record_the_products_and_bytes():
    from latch_memory.policy import apply_policy

    _, summary = apply_policy(_mlp().graph, REG, products=True)
    # h: 64 x 48 elements, 2 bytes saved on its write and on each of its two reads
    assert summary["stored"]["products_stored_low"] == 1
    assert summary["stored"]["product_bytes_saved"] == 64 * 48 * 2 * 3
