"""Pass ops.embedding_grad_sum: add(G, embedding_backward(g, idx)) -> embedding_backward(g, idx, G)."""

from __future__ import annotations

import pytest

from latch_core.ir import Graph, Group, Node, Value
from latch_ops.embedding_grad import rewrite

F, I = "f32", "i64"


def _graph(order=("G", "dw"), extra_reader=False, out_of_dw=False, G_shape=(40, 8)):
    values = [Value("g", (2, 5, 8), F, "batch"), Value("tok", (2, 5), I, "batch"),
              Value("h", (40, 8), F, "batch"), Value("G", G_shape, F), Value("dw", (40, 8), F),
              Value("sum", (40, 8), F), Value("other", (40, 8), F)]
    nodes = [Node("head", "latch::exp", ("h",), ("G",)),
             Node("eb", "latch::embedding_backward", ("g", "tok"), ("dw",), {"num_weights": 40, "padding_idx": -1},
                  source="model.py:3 in forward"),
             Node("tied", "latch::add", order, ("sum",))]
    outs = ["sum"] + (["dw"] if out_of_dw else [])
    if extra_reader:
        nodes.append(Node("also", "latch::neg", ("dw",), ("other",)))
        outs.append("other")
    else:
        values = [v for v in values if v.name != "other"]
    return Graph("update", values, nodes, (Group("batch", ("g", "tok", "h")),), (Group("metrics", tuple(outs)),))


@pytest.mark.parametrize("order", [("G", "dw"), ("dw", "G")])
def test_the_tied_sum_becomes_the_backward_onto_G(order):
    g2, n = rewrite(_graph(order))
    assert n == 1
    eb = [x for x in g2.nodes if x.op == "latch::embedding_backward"]
    assert len(eb) == 1 and eb[0].inputs == ("g", "tok", "G") and eb[0].outputs == ("sum",)
    assert eb[0].source == "model.py:3 in forward" and eb[0].attr("num_weights") == 40
    assert not any(x.op == "latch::add" for x in g2.nodes) and not g2.has_value("dw")
    names = [x.name for x in g2.nodes]
    assert names.index("head") < names.index("eb")  # after G's producer


@pytest.mark.parametrize("kw", [dict(extra_reader=True), dict(out_of_dw=True), dict(G_shape=(1, 8))])
def test_left_alone_when_dw_is_read_elsewhere_or_the_add_broadcasts(kw):
    g = _graph(**kw)
    g2, n = rewrite(g)
    assert n == 0 and g2 is g


def test_the_reference_starts_from_base():
    torch = pytest.importorskip("torch")
    from latch_core.plugins import registries

    spec = registries().ops.get("latch::embedding_backward")
    gen = torch.Generator().manual_seed(0)
    g, tok = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64), torch.randint(0, 40, (2, 5), generator=gen)
    G = torch.randn(40, 8, generator=gen, dtype=torch.float64)
    attrs = {"num_weights": 40, "padding_idx": 3}
    plain, = spec.extra["reference"]([g, tok], attrs)
    onto, = spec.extra["reference"]([g, tok, G], attrs)
    assert torch.allclose(onto, G + plain) and torch.equal(onto[3], G[3])
    from latch_core.ir import TensorType
    from latch_core.registry import ShapeError

    with pytest.raises(ShapeError, match="base"):
        spec.infer([TensorType((2, 5, 8), "f32"), TensorType((2, 5), "i64"), TensorType((40, 4), "f32")], attrs)
