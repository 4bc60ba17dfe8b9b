"""Scale: a synthetic transformer-shaped program of ~40,000 tasks is scheduled and validated in
seconds (indexes and interval reasoning, never all pairs of tasks: 40,000^2 pairs would take hours).
The bound is loose because CI machines are shared; tools/schedule_report.py gives real numbers."""

from __future__ import annotations

import time

import attrs

from latch_schedule import testing
from latch_schedule.schedulers import dataflow_scheduler
from latch_schedule.validate import validate


def test_forty_thousand_tasks_schedule_and_validate_in_seconds(ops):
    doc = testing.residual_stack(ops, layers=48)
    t0 = time.perf_counter()
    s = dataflow_scheduler(doc, {"ops": ops})
    t1 = time.perf_counter()
    planned = testing.distinct_placements(attrs.evolve(doc, schedule=s))
    problems = validate(planned, ops=ops)
    t2 = time.perf_counter()
    n = len(s.programs[0].tasks)
    assert n >= 38_000
    assert problems == []
    assert t1 - t0 < 60 and t2 - t1 < 60, (n, t1 - t0, t2 - t1)
