"""moe.store_operands (latch_ops.moe.policy), the ragged products' out_dtype and token_topk's row
tiling. No torch: the pass and the rules work on the document alone."""

import pytest

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, TensorType, Value
from latch_core.registry import ShapeError
from latch_ops.moe import specs as S
from latch_ops.moe import tilings
from latch_ops.moe.policy import store_operands_pass, store_ragged_operands

F, BF = "f32", "bf16"


def _graph(operand_dtype="bf16"):
    R, d, h, E = 16, 8, 4, 2
    values = [Value("x", (R, d), F, "batch"), Value("w1", (E, d, h), F, "param"),
              Value("w3", (E, d, h), F, "param"), Value("off", (E + 1,), "i64", "batch"),
              Value("a", (R, h), F), Value("b", (R, h), F), Value("dw", (E, d, h), F)]
    at = {} if operand_dtype is None else {"operand_dtype": operand_dtype, "accum_dtype": F}
    nodes = [Node("m1", S.RAGGED_MM, ("x", "w1", "off"), ("a",), at),
             Node("m3", S.RAGGED_MM, ("x", "w3", "off"), ("b",), at),
             Node("gw", S.RAGGED_MM_GRAD_W, ("x", "a", "off"), ("dw",), at)]
    return Graph("update", values, nodes, [Group("batch", ["x", "off"]), Group("params", ["w1", "w3"])],
                 [Group("metrics", ["b", "dw"])])


def test_ragged_operands_are_cast_once_and_results_keep_their_dtype():
    g, nodes, casts = store_ragged_operands(_graph())
    assert (nodes, casts) == (3, 4)  # x (shared by all three), w1, w3, a
    ops = [n.op for n in g.nodes]
    assert ops == ["latch::cast", "latch::cast", S.RAGGED_MM, "latch::cast", S.RAGGED_MM, "latch::cast",
                   S.RAGGED_MM_GRAD_W]
    by = {n.name: n for n in g.nodes}
    assert by["m1"].inputs == ("x.bf16", "w1.bf16", "off") and by["m3"].inputs[0] == "x.bf16"
    assert by["gw"].inputs == ("x.bf16", "a.bf16", "off")
    assert all(by[n].attr("out_dtype") == F for n in ("m1", "m3", "gw"))
    assert g.value("x.bf16").dtype == BF and g.value("w1.bf16").shape == (2, 8, 4)
    # the rules agree with the rewritten graph: FP32 results of BF16 operands
    spec = {s.name: s for s in S.SPECS}
    for n in g.nodes:
        if n.op in spec:
            out = spec[n.op].infer([g.value(v) for v in n.inputs], n.attr_dict)
            assert out[0].dtype == g.value(n.outputs[0]).dtype == F


def test_nothing_to_store_leaves_the_graph_alone():
    for g in (_graph(operand_dtype=None), _graph(operand_dtype=F)):
        g2, nodes, casts = store_ragged_operands(g)
        assert g2 is g and (nodes, casts) == (0, 0)


def test_the_pass_says_what_it_did():
    g = _graph()
    doc = Document(graph=GraphSection([g], (), {}))
    out, said = store_operands_pass(doc)
    assert said == "3 ragged products read stored operands (4 casts)"
    assert doc.graph.programs[0] is g  # the input document is untouched


def test_out_dtype_rule_and_its_error():
    x, w, off = TensorType((6, 8), BF), TensorType((2, 8, 4), BF), TensorType((3,), "i64")
    assert S.infer_ragged_mm([x, w, off], {"out_dtype": F})[0] == TensorType((6, 4), F)
    assert S.infer_ragged_mm([x, w, off], {})[0].dtype == BF
    with pytest.raises(ShapeError, match="out_dtype.*float dtype"):
        S.infer_ragged_mm_grad_w([x, TensorType((6, 4), BF), off], {"out_dtype": "i64"})


def test_token_topk_tiles_rows():
    probs = TensorType((10, 4), F)
    t = tilings.token_topk([probs], [TensorType((10, 2), F), TensorType((10, 2), "i64")], {"k": 2})
    assert t.split_dims == (0,) and t.granule_of(0) == 0
    ins, outs = t.footprint(((3, 7), (0, 2)))
    assert ins == [((3, 7), (0, 4))] and outs == [((3, 7), (0, 2)), ((3, 7), (0, 2))]


def test_a_gather_read_only_by_ragged_products_gathers_stored_rows():
    """xs = index_select(x, token) feeding the products: x is cast (N rows), the gather moves BF16."""
    g = _graph()
    values = [Value("h", (8, 8), F, "batch"), Value("tok", (16,), "i64", "batch")] + [
        v for v in g.values if v.name != "x"] + [Value("x", (16, 8), F)]
    nodes = [Node("gather", "latch::index_select", ("h", "tok"), ("x",), {"dim": 0})] + list(g.nodes)
    g = Graph("update", values, nodes, [Group("batch", ["h", "tok", "off"]), Group("params", ["w1", "w3"])],
              [Group("metrics", ["b", "dw"])])
    g2, nodes_, casts = store_ragged_operands(g)
    by = {n.name: n for n in g2.nodes}
    assert [n.op for n in g2.nodes][:2] == ["latch::cast", "latch::index_select"]
    assert by["gather"].inputs == ("h.bf16", "tok") and by["gather"].outputs == ("x.bf16",)
    assert g2.value("x.bf16").dtype == BF and "x" not in {v.name for v in g2.values}
    assert by["m1"].inputs[0] == by["m3"].inputs[0] == by["gw"].inputs[0] == "x.bf16"
    # read by anything else (here: an output), the FP32 rows stay and are cast after the gather
    g3 = Graph("update", values, nodes, g.inputs, [Group("metrics", ["b", "dw", "x"])])
    g4, _, _ = store_ragged_operands(g3)
    assert {n.name: n for n in g4.nodes}["gather"].outputs == ("x",)


def test_a_cast_already_in_the_graph_is_reused_for_the_gathers_source():
    g = _graph()
    values = [Value("h", (8, 8), F, "batch"), Value("tok", (16,), "i64", "batch"), Value("h.bf16", (8, 8), BF)] + [
        v for v in g.values if v.name != "x"] + [Value("x", (16, 8), F)]
    nodes = [Node("c0", "latch::cast", ("h",), ("h.bf16",), {"dtype": BF}),
             Node("gather", "latch::index_select", ("h", "tok"), ("x",), {"dim": 0})] + list(g.nodes)
    g = Graph("update", values, nodes, [Group("batch", ["h", "tok", "off"]), Group("params", ["w1", "w3"])],
              [Group("metrics", ["b", "dw", "h.bf16"])])
    g2, _, _ = store_ragged_operands(g)
    assert [n.op for n in g2.nodes].count("latch::cast") == 4  # h (kept), w1, w3, a: no second cast of h
    assert {n.name: n for n in g2.nodes}["gather"].inputs == ("h.bf16", "tok")
