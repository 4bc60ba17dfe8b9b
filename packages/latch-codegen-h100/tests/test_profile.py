"""Aggregation of profiling records (latch_codegen_h100.profile) on synthetic records: a known
schedule with known busy and wait times must give exactly the fractions and per-op sums worked out
by hand below. CPU only."""

from __future__ import annotations

import attrs
import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import generate
from latch_codegen_h100.profile import (
    GroupInfo, LaunchRecords, ProfileError, ProgramLayout, aggregate, format_report, layout_from_document, report,
)

# Two SM lists and a spare third block. Group 0 is one op, group 1 a fused pair.
#   SM 0: task 0 [10, 40]   barrier 0 [40, 60]                 task 2 [62, 92]
#   SM 1: task 1 [12, 22]   barrier 0 [23, 60]   wait [60, 70]  task 3 [70, 85]  signal [85, 86]
#   blocks: (5, 95), (8, 90), spare (6, 61)  ->  window [5, 95] = 90 ns, SM-time 3 x 90 = 270 ns
LAYOUT = ProgramLayout(
    "update",
    ((("task", 0), ("barrier", 0), ("task", 2)),
     (("task", 1), ("barrier", 0), ("wait", 0), ("task", 3), ("signal", 0))),
    (0, 0, 1, 1),
    {0: GroupInfo("latch::mul", "mul_f32_8", ("m",), "ex.py:3 in f"),
     1: GroupInfo("latch::add+latch::relu", "add_relu_f32_8", ("a", "r"), None)},
)
INSTRS = [(10, 40), (40, 60), (62, 92), (12, 22), (23, 60), (60, 70), (70, 85), (85, 86)]
BLOCKS = [(5, 95), (8, 90), (6, 61)]


def _launch(shift=0, event_ms=None):
    return LaunchRecords("update", [(b + shift, e + shift) for b, e in INSTRS],
                         [(b + shift, e + shift) for b, e in BLOCKS], event_ms)


def test_known_schedule_gives_the_hand_computed_times_and_fractions():
    rep = aggregate(LAYOUT, [_launch()])
    assert rep.kernel_ns == 90 and rep.grid == 3 and rep.lists == 2 and rep.sm_time_ns == 270
    sm0, sm1, spare = rep.sms
    assert sm0.tasks == 2 and sm1.tasks == 2 and spare.tasks == 0
    assert sm0.times == {"busy": 60, "barrier": 20, "counter": 0, "signal": 0, "idle_start": 5, "idle_end": 3,
                         "other": 2, "spare": 0}
    assert sm1.times == {"busy": 25, "barrier": 37, "counter": 10, "signal": 1, "idle_start": 7, "idle_end": 9,
                         "other": 1, "spare": 0}
    assert spare.times["spare"] == 90 and sum(spare.times.values()) == 90
    for s in rep.sms:  # every SM's categories add up to the window
        assert sum(s.times.values()) == 90
    assert rep.waiting_fraction == pytest.approx((20 + 37 + 10) / 270)
    assert rep.fraction("barrier") == pytest.approx(57 / 270)
    assert rep.fraction("counter") == pytest.approx(10 / 270)
    assert rep.fraction("busy") == pytest.approx(85 / 270)
    assert rep.timer_step_ns == 1


def test_per_op_body_and_group_sums():
    rep = aggregate(LAYOUT, [_launch()])
    assert [(r.name, r.tasks, r.total_ns) for r in rep.by_op] == [("latch::add+latch::relu", 2, 45),
                                                                 ("latch::mul", 2, 40)]
    assert rep.by_op[0].share == pytest.approx(45 / 270) and rep.by_op[0].mean_ns == 22.5
    assert [(r.name, r.total_ns) for r in rep.by_body] == [("add_relu_f32_8", 45), ("mul_f32_8", 40)]
    assert [r.name for r in rep.by_group] == ["g1 a,r", "g0 m (ex.py:3 in f)"]
    assert sum(r.total_ns for r in rep.by_op) == rep.totals["busy"]


def test_each_op_is_set_beside_the_cost_models_estimate_of_its_tasks():
    """Tasks 0-3 modelled at 10, 20, 5 and 5 ns: the mul (tasks 0, 1: measured 30 + 10 ns) ran at the
    model's speed (40 / 30 = 1.33x), the add+relu (tasks 2, 3: 30 + 15 ns) 4.5x slower than modelled."""
    lay = attrs.evolve(LAYOUT, task_cost=(10e-9, 20e-9, 5e-9, 5e-9))
    rep = aggregate(lay, [_launch(), _launch(shift=1000)])
    by = {r.name: r for r in rep.by_op}
    assert by["latch::mul"].model_ns == pytest.approx(2 * 30) and by["latch::mul"].vs_model == pytest.approx(80 / 60)
    assert by["latch::add+latch::relu"].vs_model == pytest.approx(90 / 20)
    text = format_report(rep)
    assert "against the cost model's" in text and "(2.12x)" in text, text   # busy 170 ns / model 80 ns
    assert "4.50x" in text and "1.33x" in text
    plain = format_report(aggregate(LAYOUT, [_launch()]))   # no costs known: no model columns' values
    assert "against the cost model's" not in plain and aggregate(LAYOUT, [_launch()]).by_op[0].vs_model is None


def test_launches_add_up_and_fractions_stay():
    one = aggregate(LAYOUT, [_launch()])
    two = aggregate(LAYOUT, [_launch(event_ms=0.5), _launch(shift=1000, event_ms=0.25)])
    assert two.launches == 2 and two.kernel_ns == 180 and two.event_ms == pytest.approx(0.75)
    assert two.waiting_fraction == pytest.approx(one.waiting_fraction)
    assert [r.total_ns for r in two.by_op] == [90, 80]
    assert one.event_ms is None


def test_format_report_prints_the_waiting_fraction_and_tables():
    text = format_report(aggregate(LAYOUT, [_launch(event_ms=0.0001)]), per_sm=True)
    assert "WAITING at synchronisation: 24.81% of the update" in text and "NOT met" in text
    assert "per op (top 2 of 2 by time)" in text and "add+relu" in text and "latch::" not in text
    assert "CUDA events 0.0001 ms" in text and "kernel 0.0001 ms" in text
    assert "most waiting SMs: SM 1" in text


@pytest.mark.parametrize("damage, message", [
    (lambda i, b: i.__setitem__(5, (0, 0)), "instruction 5 (wait 0)"),
    (lambda i, b: i.__setitem__(2, (55, 92)), "instruction 2 (task 2)"),  # overlaps the barrier before it
    (lambda i, b: b.__setitem__(1, (8, 0)), "block 1 has no entry/exit"),
    (lambda i, b: i.pop(), "7 instruction records, the schedule has 8"),
])
def test_records_that_cannot_be_the_kernels_are_refused(damage, message):
    instrs, blocks = list(INSTRS), list(BLOCKS)
    damage(instrs, blocks)
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        aggregate(LAYOUT, [LaunchRecords("update", instrs, blocks)])
    with pytest.raises(ProfileError, match="'other'"):
        aggregate(LAYOUT, [LaunchRecords("other", INSTRS, BLOCKS)])


def test_layout_from_a_planned_document_matches_the_generated_tables():
    F = "f32"
    values = [Value("w", (8,), F, "param"), Value("x", (8,), F, "batch"), Value("y", (8,), F), Value("w2", (8,), F)]
    nodes = [("m", "latch::mul", ("w", "x"), ("y",)), ("s", "latch::sub", ("w", "y"), ("w2",))]
    g = H.graph("update", values, nodes, [("params", ["w"]), ("batch", ["x"])], [("new_params", ["w2"])],
                inplace=[("w2", "w")])
    for strategy in ("barrier", "dataflow"):
        doc = H.planned([g], [g.value("w")], strategy=strategy, num_sms=3)
        lay = layout_from_document(doc, "update")
        gen = generate(doc, jobs=1)
        sm_begin = gen.tables["update"].sm_begin
        assert lay.num_instrs == int.from_bytes(sm_begin[-4:], "little")
        assert len(lay.sms) == len(sm_begin) // 4 - 1
        ops = {lay.groups[gid].op for gid in lay.task_group}
        assert ops == {"latch::mul", "latch::sub"}
        # records that follow the lists in order (1 ns apart) aggregate without complaint
        t, instrs = 100, []
        for sm in lay.sms:
            for _ in sm:
                instrs.append((t, t + 1))
                t += 2
        rep = report(doc, [LaunchRecords("update", instrs, [(99, t)] * 3)])[0]
        assert rep.program == "update" and sum(s.tasks for s in rep.sms) == len(lay.task_group)
    with pytest.raises(ProfileError, match="no program 'nope'"):
        layout_from_document(doc, "nope")


def test_task_overhead_is_the_gap_between_consecutive_tasks_on_an_sm():
    # SM 0: task [0, 10], task [13, 20] (gap 3), barrier, task; SM 1: task [1, 5], task [9, 12] (gap 4)
    layout = ProgramLayout("update", ((("task", 0), ("task", 1), ("barrier", 0), ("task", 2)),
                                      (("task", 3), ("task", 4), ("barrier", 0))),
                           (0, 0, 0, 0, 0), {0: GroupInfo("latch::mul", "b", ("m",), None)})
    rec = LaunchRecords("update", [(1, 10), (13, 20), (20, 30), (31, 40), (1, 5), (9, 12), (12, 30)],
                        [(1, 41), (1, 40)])
    rep = aggregate(layout, [rec])
    assert sorted(rep.task_gaps_ns) == [3, 4]  # a task after a barrier is not a consecutive pair
    assert "per-task overhead" in format_report(rep)
