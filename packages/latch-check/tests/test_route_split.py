"""moe.route_split: route_order over many SMs keeps the update PyTorch's.

TinyMoE (small widths, enough tokens for several chunks of pairs) with the split and the
fixed-order scatters, against eager PyTorch in FP64 and on the arena simulator (whose tasks see
only their read boxes: a route_place task its chunk of indices and the counts), at top-2 and at
top-3 (chunks that cut a token's slots apart). The split form leaves no route_order and no scatter:
the combine's gradient gathers by route_rows' ``pairs``, and the dispatch's gradient is one
``gather_sum`` per layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from latch_capture.examples import load_example
from latch_core.lint import lint_section
from latch_core.plugins import registries
from latch_check.compare import compare
from latch_check.simulator import check_example, prepare
from latch_ops.moe import route_split
from latch_ops.moe.route_split import plan_chunks, route_split_pass
from latch_ops.moe.scatter import fixed_order_scatters_pass

ROOT = Path(__file__).resolve().parents[3]
SMALL = dict(d_model=16, heads=2, experts=4, expert_hidden=8, vocab=32, layers=1, batch=2)


def _ops(g):
    return [n.op for n in g.nodes]


def test_the_chunks_cover_the_pairs_in_one_wave():
    assert plan_chunks(65_536, 16) == 512  # TinyMoE-200M at 32 x 1024: 128 chunks
    assert plan_chunks(4_096, 16) == 512  # 2 x 1024: 8 chunks
    assert plan_chunks(1_000_000, 16) == 7_840 and -(-1_000_000 // 7_840) <= route_split.MAX_CHUNKS
    assert plan_chunks(65_536, 64) == 1_024  # C * E <= MAX_COUNTS: 64 chunks
    assert plan_chunks(1_023, 16) is None  # fewer than two chunks: route_order stays one task
    assert plan_chunks(65_536, 65) is None  # more experts than route_rows takes


@pytest.mark.parametrize("top_k,seq", [(2, 256), (3, 200)])
def test_the_split_update_matches_eager_pytorch_and_the_simulator(top_k, seq):
    ex = load_example(str(ROOT / "examples" / "tinymoe.py"), top_k=top_k, seq=seq, **SMALL)
    doc = ex.capture(grads=True)
    assert _ops(doc.graph.program("update")).count("latch::route_order") == 1
    split, said = route_split_pass(doc)
    assert said.startswith("1 route_order(s) split")
    new, said = fixed_order_scatters_pass(split)
    assert said.startswith("2 MoE scatters")
    g = new.graph.program("update")
    ops = _ops(g)
    assert "latch::route_order" not in ops and "latch::scatter" not in ops and "latch::index_add" not in ops
    # the dispatch's gradient back to tokens: one gather_sum, no N*k gathered rows written and summed
    assert ops.count("latch::gather_sum") == 1
    gs = next(n for n in g.nodes if n.op == "latch::gather_sum")
    assert len(gs.inputs) == 3  # the residual stream's gradient folded in as its base (no add pass)
    for op in (route_split.ROUTE_COUNT, route_split.ROUTE_PLACE, route_split.ROUTE_ROWS, route_split.ROUTE_OFFSETS):
        assert ops.count(op) == 1, op
    counts = next(n for n in g.nodes if n.op == route_split.ROUTE_COUNT).outputs[0]
    assert g.value(counts).shape[0] >= 2  # several chunks, so several route_count and route_place tasks
    assert lint_section(new.graph, registries().ops, require_known_ops=True) == []
    res = compare(ex, doc=new, steps=2)
    assert res.passed, res.format()
    planned = prepare(new, num_sms=8)
    tasks = planned.schedule.program("update")
    groups = {grp.id: grp for grp in tasks.groups}
    op_of = {n.name: n.op for n in g.nodes}
    per_op = {}
    for t in tasks.tasks:
        for name in groups[t.group].nodes:
            per_op[op_of[name]] = per_op.get(op_of[name], 0) + 1
    assert per_op[route_split.ROUTE_PLACE] >= 2 and per_op[route_split.ROUTE_ROWS] >= 2, per_op
    sim = check_example(ex, planned, steps=1)
    assert sim.passed, sim.format()
