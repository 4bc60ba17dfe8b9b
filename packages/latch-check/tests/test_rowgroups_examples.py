"""Row groups (latch_schedule.rowgroups) on a captured transformer: every RMSNorm forward and
backward is one row group (statistic, its chain and the broadcast consumer; tasks over whole
rows), the plan has fewer groups and barrier phases than without the rule, the per-row mean and
the backward's per-row sum never reach memory (only ``r``, which the backward reads, does), and
the arena simulator matches the FP64 interpreter under both strategies."""

from pathlib import Path

import pytest

pytest.importorskip("latch_memory")
pytest.importorskip("latch_schedule")
pytest.importorskip("latch_capture")

from latch_capture.examples import load_example  # noqa: E402
from latch_core.passes import run_pass  # noqa: E402
from latch_core.plugins import registries  # noqa: E402
from latch_check.simulator import check_example  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)
_captured: dict = {}


def _planned(strategy: str, row_groups: bool):
    if "ex" not in _captured:
        ex = load_example(EXAMPLES / "transformer.py", **SMALL)
        _captured["ex"] = (ex, ex.capture(grads=True))
    ex, doc = _captured["ex"]
    p = registries().passes
    doc = run_pass(p.get("memory.policy"), doc)
    doc = run_pass(p.get("schedule.split_reductions"), doc, num_sms=4)
    doc = run_pass(p.get("schedule"), doc, scheduler=strategy, num_sms=4, row_groups=row_groups)
    doc = run_pass(p.get("memory.plan"), doc)
    run_pass(p.get("schedule.validate"), doc)  # the static hazard proof accepts the plan
    return ex, doc


def _row_stats(doc):
    """Names of the per-row statistics (outputs of sum/mean over the last dim with keepdim)."""
    g = doc.graph.programs[0]
    out = set()
    for n in g.nodes:
        if n.op in ("latch::mean", "latch::sum") and n.attr("keepdim", False):
            x = g.value(n.inputs[0])
            if tuple(d % len(x.shape) for d in n.attr("dims")) == (len(x.shape) - 1,):
                out.add(n.outputs[0])
    return out


def test_every_rmsnorm_is_one_row_group_and_the_plan_is_shorter():
    _, on = _planned("barrier", True)
    _, off = _planned("barrier", False)
    ps_on, ps_off = on.schedule.programs[0], off.schedule.programs[0]
    stats = _row_stats(on)
    # 2 layers x 2 norms + the final norm, forward and backward
    assert len(stats) == 10
    grouped = [grp for grp in ps_on.groups if set(grp.nodes) & {n.name for n in on.graph.programs[0].nodes
                                                                  if n.outputs and n.outputs[0] in stats}]
    assert len(grouped) == 10
    for grp in grouped:
        assert len(grp.nodes) > 3  # the statistic, its chain and the consumer together
        # a task covers whole rows: its tile spans the primary's innermost dim
        shape = on.graph.programs[0].value(grp.primary).shape
        for t in ps_on.tasks:
            if t.group == grp.id:
                assert tuple(t.tile[-1]) == (0, shape[-1])
    # the per-row statistics never reach memory with the rule; without it every one does
    placed_on = {p.value for p in on.memory.programs[0].placements}
    placed_off = {p.value for p in off.memory.programs[0].placements}
    assert not stats & placed_on
    assert stats <= placed_off
    assert len(ps_on.groups) < len(ps_off.groups) - 20
    assert ps_on.num_barriers < ps_off.num_barriers
    assert dict(on.schedule.stats)["row_group_count"] == 10 and dict(off.schedule.stats)["row_group_count"] == 0


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
def test_the_row_groups_plan_matches_fp64_on_the_simulator(strategy):
    ex, doc = _planned(strategy, True)
    result = check_example(ex, doc, steps=1, seed=5)
    assert result.passed, result.format()
