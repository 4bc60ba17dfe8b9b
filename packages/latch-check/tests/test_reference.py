"""The FP64 reference interpreter on hand-built graphs: float64 execution, input checks naming the
tensor, constants, node-level errors naming the node and its source."""

import pytest

torch = pytest.importorskip("torch")

from latch_core.document import program_doc  # noqa: E402
from latch_core.hookspecs import hookimpl  # noqa: E402
from latch_core.ir import Graph, Group, Node, TensorType, Value  # noqa: E402
from latch_core.plugins import load_with  # noqa: E402
from latch_core.registry import OpSpec  # noqa: E402
from latch_check.reference import ReferenceError, run  # noqa: E402
from latch_ops import plugin as core_ops  # noqa: E402


@pytest.fixture(scope="module")
def ops():
    return load_with(("core-ops", core_ops), entry_points=False).ops


def _graph():
    """y = softmax(x @ w + b) * 2 ; s = sum(y); idx used through embedding."""
    values = [
        Value("x", (2, 3), "f32", "batch"), Value("w", (3, 4), "f32", "param"), Value("ids", (2,), "i64", "batch"),
        Value("b", (4,), "f32", "const", data=[0.5, -0.5, 1.0, 0.0]),
        Value("h", (2, 4), "f32"), Value("hb", (2, 4), "f32"), Value("y", (2, 4), "f32"), Value("y2", (2, 4), "f32"),
        Value("s", (), "f32"), Value("rows", (2, 4), "f32"),
    ]
    nodes = [
        Node("n1", "latch::matmul", ("x", "w"), ("h",), source="model.py:3 in forward"),
        Node("n2", "latch::add", ("h", "b"), ("hb",)),
        Node("n3", "latch::softmax", ("hb",), ("y",)),
        Node("n4", "latch::mul", ("y",), ("y2",), {"scalar": 2.0}),
        Node("n5", "latch::sum", ("y2",), ("s",), {"dims": (0, 1), "keepdim": False}),
        Node("n6", "latch::embedding", ("y2", "ids"), ("rows",)),
    ]
    return Graph("update", values, nodes, [Group("params", ["w"]), Group("batch", ["x", "ids"])],
                 [Group("loss", ["s"]), Group("metrics", ["y2", "rows"])])


def _inputs():
    torch.manual_seed(0)
    return {"x": torch.randn(2, 3), "w": torch.randn(3, 4), "ids": torch.tensor([1, 0])}


def test_runs_in_float64_and_matches_torch(ops):
    ins = _inputs()
    out = run(_graph(), None, ins, ops=ops)
    x, w = ins["x"].double(), ins["w"].double()
    y2 = torch.softmax(x @ w + torch.tensor([0.5, -0.5, 1.0, 0.0], dtype=torch.float64), -1) * 2
    assert out["y2"].dtype == torch.float64
    assert torch.allclose(out["y2"], y2, rtol=0, atol=1e-15)
    assert out["s"].item() == pytest.approx(4.0, abs=1e-14)
    assert torch.equal(out["rows"], y2[[1, 0]])
    assert set(out) == {"s", "y2", "rows"}


def test_float_width_can_be_chosen(ops):
    out = run(_graph(), None, _inputs(), ops=ops, float_dtype=torch.float32)
    assert out["y2"].dtype == torch.float32


def test_runs_a_document_program_by_name(ops):
    doc = program_doc(_graph())
    assert set(run(doc, "update", _inputs(), ops=ops)) == {"s", "y2", "rows"}
    with pytest.raises(ReferenceError, match="no program 'nope'"):
        run(doc, "nope", _inputs(), ops=ops)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("w"), "input 'w' (param f32[3,4]) was not given"),
    (lambda d: d.update(extra=torch.zeros(1)), "no inputs named ['extra']"),
    (lambda d: d.update(x=torch.zeros(3, 2)), "input 'x' has shape [3, 2], the program needs [2, 3]"),
    (lambda d: d.update(ids=torch.zeros(2)), "input 'ids' is torch.float32, the program needs i64"),
    (lambda d: d.update(w=torch.zeros(3, 4, dtype=torch.int32)), "input 'w' is torch.int32, the program needs f32"),
])
def test_input_errors_name_the_tensor(ops, change, message):
    ins = _inputs()
    change(ins)
    with pytest.raises(ReferenceError) as e:
        run(_graph(), None, ins, ops=ops)
    assert message in str(e.value)


def test_unknown_op_names_the_node_and_its_source(ops):
    g = _graph()
    nodes = list(g.nodes)
    nodes[0] = Node("n1", "latch::no_such_op", ("x", "w"), ("h",), source="model.py:3 in forward")
    g = Graph(g.name, g.values, nodes, g.inputs, g.outputs)
    with pytest.raises(ReferenceError) as e:
        run(g, None, _inputs(), ops=ops)
    assert "node 'n1' (latch::no_such_op) (from model.py:3 in forward)" in str(e.value)
    assert "not registered" in str(e.value)


def test_a_reference_that_breaks_its_rule_is_caught_at_its_node():
    class Broken:
        @hookimpl
        def latch_register_ops(self, register):
            register(OpSpec("latch::broken", "broken(x)", lambda i, a: [i[0]], num_inputs=(1, 1),
                            extra={"reference": lambda i, a: [i[0].reshape(-1)]}))

    regs = load_with(("broken", Broken()), entry_points=False)
    g = Graph("p", [Value("x", (2, 2), "f32", "batch"), Value("y", (2, 2), "f32")],
              [Node("n", "latch::broken", ("x",), ("y",))], [Group("batch", ["x"])], [Group("loss", ["y"])])
    with pytest.raises(ReferenceError, match=r"gave torch.float64\[4\] for output 'y' declared f32\[2,2\]"):
        run(g, None, {"x": torch.zeros(2, 2)}, ops=regs.ops)


def test_reference_errors_are_reported_with_the_node(ops):
    ins = _inputs()
    ins["ids"] = torch.tensor([5, 0])  # out of range for 2 rows
    with pytest.raises(ReferenceError, match=r"node 'n6' \(latch::embedding\): the reference raised IndexError"):
        run(_graph(), None, ins, ops=ops)


def test_integer_inputs_keep_their_declared_dtype(ops):
    g = Graph("p", [Value("i", (3,), "i32", "batch"), Value("j", (3,), "i32")],
              [Node("n", "latch::add", ("i",), ("j",), {"scalar": 1})], [Group("batch", ["i"])], [Group("loss", ["j"])])
    out = run(g, None, {"i": torch.tensor([1, 2, 3])}, ops=ops)  # given as int64
    assert out["j"].dtype == torch.int32 and out["j"].tolist() == [2, 3, 4]
    assert TensorType((3,), "i32") == g.value("j").type
