"""Two-level reductions: the rewrite keeps the program's meaning (checked with latch-ops'
references where torch is installed), and only big full reductions are split."""

from __future__ import annotations

import pytest

from latch_core.ir import Graph, Group, Node, Value
from latch_core.lint import lint
from latch_schedule.split import split_reductions
from latch_schedule.tiling import CostModel


def _program(shape, op="latch::sum", keepdim=False):
    out_shape = tuple(1 for _ in shape) if keepdim else ()
    vals = [Value("x", shape, "f32", "batch"), Value("y", shape, "f32"), Value("s", out_shape, "f32")]
    nodes = [Node("sq", "latch::mul", ["x", "x"], ["y"], source="model.py:3 in loss"),
             Node("s", op, ["y"], ["s"], {"dims": tuple(range(len(shape))), "keepdim": keepdim},
                  source="model.py:4 in loss")]
    return Graph("update", vals, nodes, [Group("batch", ["x"])], [Group("loss", ["s"])])


@pytest.fixture(scope="module")
def real_ops():
    from latch_core.plugins import load_with

    ops_plugin = pytest.importorskip("latch_ops.plugin")
    return load_with(("ops", ops_plugin), entry_points=False).ops


@pytest.mark.parametrize("op", ["latch::sum", "latch::mean", "latch::amax", "latch::amin"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_split_keeps_the_meaning(real_ops, op, keepdim):
    torch = pytest.importorskip("torch")
    g = _program((16, 6, 5), op, keepdim)
    g2, names = split_reductions(g, real_ops, cost=CostModel(min_task=1e-12), num_sms=8)
    assert names == ["s"]
    assert lint(g2, real_ops, require_known_ops=True) == []
    first, second = [n for n in g2.nodes if n.op == op]
    assert first.name == "s.partial" and second.name == "s" and second.source == "model.py:4 in loss"
    assert g2.value("s.partial").shape[:1] == (16,)  # 16 leading rows already give 8 SMs work

    x = torch.randn(16, 6, 5, dtype=torch.float64)

    def run(graph):
        env = {"x": x}
        for n in graph.nodes:
            ref = real_ops.get(n.op).extra["reference"]
            outs = ref([env[i] for i in n.inputs], n.attr_dict)
            env.update(zip(n.outputs, outs))
        return env["s"]

    a, b = run(g), run(g2)
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_small_or_partial_reductions_are_left_alone(real_ops):
    g = _program((16, 6, 5))
    assert split_reductions(g, real_ops, cost=CostModel())[1] == []  # 480 elements: one small task
    vals = [Value("x", (4096, 4096), "f32", "batch"), Value("r", (4096,), "f32")]
    rows = Graph("update", vals, [Node("r", "latch::sum", ["x"], ["r"], {"dims": (1,), "keepdim": False})],
                 [Group("batch", ["x"])], [Group("loss", ["r"])])
    assert split_reductions(rows, real_ops, cost=CostModel())[1] == []  # tiled over its kept rows already
    big = _program((8192, 4096))
    g2, names = split_reductions(big, real_ops, cost=CostModel(), num_sms=132)
    assert names == ["s"] and g2.value("s.partial").shape == (8192,)


def test_the_split_is_its_own_pass_and_schedule_no_longer_rewrites(real_ops):
    """``schedule.split_reductions`` rewrites the graph (recording the nodes in its provenance);
    ``schedule`` leaves the graph section as it finds it and refuses the old split options."""
    from latch_core.document import program_doc
    from latch_core.passes import run_pass
    from latch_schedule.passes import SCHEDULE, SPLIT_REDUCTIONS

    doc = program_doc(_program((4096, 2048)))
    out = run_pass(SPLIT_REDUCTIONS, doc, num_sms=132, ops=real_ops)
    assert doc.graph.programs[0].has_value("s.partial") is False  # the input is untouched
    assert out.graph.programs[0].has_value("s.partial")
    assert out.provenance[-1].name == "schedule.split_reductions" and "update: s" in out.provenance[-1].detail
    lint(out.graph.programs[0], real_ops)
    small = program_doc(_program((4, 4)))
    same = run_pass(SPLIT_REDUCTIONS, small, num_sms=132, ops=real_ops)
    assert same.graph == small.graph and same.provenance[-1].detail == "nothing to split"
    scheduled = run_pass(SCHEDULE, doc, num_sms=132, ops=real_ops)
    assert scheduled.graph == doc.graph  # the schedule pass never rewrites the graph
    with pytest.raises(ValueError, match="run the pass schedule.split_reductions"):
        run_pass(SCHEDULE, doc, num_sms=132, ops=real_ops, split_reductions=True)
