"""memory.fuse_cross_entropy on hand-built graphs (no torch): the LM-head chain is rewritten into
the cross_entropy pair with logits stored in the product's operand dtype; look-alikes are not."""

from latch_core.ir import Graph, Group, Node, Value
from latch_core.lint import lint
from latch_memory.cross_entropy import fuse_program

N, D, V = 8, 4, 16


def _graph(*, weight=False, logits_reader=False, reduction="mean", cast=True):
    vals = [Value("x", (N, D), "bf16", "param"), Value("w", (D, V), "bf16", "param"), Value("t", (N,), "i64", "batch"),
            Value("logits", (N, V), "f32"), Value("logp", (N, V), "f32"), Value("loss", (), "f32"),
            Value("total", (), "f32"), Value("one", (), "f32"), Value("dlogp", (N, V), "f32"),
            Value("dlogits", (N, V), "f32"), Value("dx", (N, D), "f32")]
    nodes = [Node("mm", "latch::matmul", ("x", "w"), ("logits",), {"operand_dtype": "bf16", "out_dtype": "f32"}),
             Node("lsm", "latch::log_softmax", ("logits",), ("logp",)),
             Node("nll", "latch::nll_loss", ("logp", "t", "cw" if weight else None), ("loss", "total"),
                  {"reduction": reduction, "ignore_index": -100}),
             Node("one", "latch::full", (), ("one",), {"shape": (), "value": 1.0, "dtype": "f32"}),
             Node("nllb", "latch::nll_loss_backward", ("one", "logp", "t", "cw" if weight else None, "total"),
                  ("dlogp",), {"reduction": reduction, "ignore_index": -100}),
             Node("lsmb", "latch::log_softmax_backward", ("dlogp", "logp"), ("dlogits",))]
    outs = [Group("loss", ["loss"])]
    if weight:
        vals.append(Value("cw", (V,), "f32", "param"))
    if cast:
        vals.append(Value("dlogits.bf16", (N, V), "bf16"))
        nodes.append(Node("c", "latch::cast", ("dlogits",), ("dlogits.bf16",), {"dtype": "bf16"}))
        nodes.append(Node("mm2", "latch::matmul", ("dlogits.bf16", "w"), ("dx",), {"trans_b": True}))
    else:
        nodes.append(Node("mm2", "latch::matmul", ("dlogits", "w"), ("dx",), {"trans_b": True}))
    outs.append(Group("grads", ["dx"]))
    if logits_reader:
        vals.append(Value("m", (N, V), "f32"))
        nodes.append(Node("peek", "latch::mul", ("logits",), ("m",), {"scalar": 2.0}))
        outs.append(Group("metrics", ["m"]))
    ins = [Group("params", ["x", "w"] + (["cw"] if weight else [])), Group("batch", ["t"])]
    return Graph("update", vals, nodes, ins, outs)


def test_chain_becomes_the_pair_with_bf16_logits():
    assert lint(_graph()) == []
    g, n = fuse_program(_graph())
    assert n == 1 and lint(g) == []
    ops = [x.op for x in g.nodes]
    assert ops == ["latch::matmul", "latch::cross_entropy", "latch::sum", "latch::sum", "latch::div", "latch::full",
                   "latch::cross_entropy_backward", "latch::matmul"]
    assert g.value("logits").dtype == "bf16" and g.nodes[0].attr("out_dtype") == "bf16"
    bwd = g.nodes[6]
    assert bwd.outputs == ("dlogits.bf16",) and bwd.attr("out_dtype") == "bf16" and bwd.attr("reduction") == "mean"
    assert bwd.inputs == ("one", "logits", "t", g.nodes[1].outputs[1], "total")
    names = {v.name for v in g.values}
    assert not names & {"logp", "dlogp", "dlogits"}
    assert not [v for v in g.values if v.shape == (N, V) and v.dtype == "f32"]


def test_sum_reduction_and_no_cast():
    g, n = fuse_program(_graph(reduction="sum", cast=False))
    assert n == 1
    assert [x.op for x in g.nodes].count("latch::div") == 0
    bwd = next(x for x in g.nodes if x.op == "latch::cross_entropy_backward")
    assert bwd.outputs == ("dlogits",) and bwd.attr("out_dtype") == "f32"


def test_look_alikes_are_left_alone():
    for kw in ({"weight": True}, {"logits_reader": True}, {"reduction": "none"}):
        g0 = _graph(**kw)
        g, n = fuse_program(g0)
        assert n == 0 and g is g0, kw
