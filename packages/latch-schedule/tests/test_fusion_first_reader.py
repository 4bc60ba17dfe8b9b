"""Producer fusion into the first reader: a pointwise group read by several groups joins the
earliest when that one is pointwise of the same shape (TinyMoE's silu(gate), read by the SwiGLU
product and again by the backward), its value still written for the later readers; and where the
rule does not apply. The schedules validate under both strategies."""

from __future__ import annotations

import attrs
import pytest

from latch_core.document import Document
from latch_core.ir import GraphSection
from latch_schedule import testing
from latch_schedule.fusion import fuse
from latch_schedule.schedulers import barrier_scheduler, dataflow_scheduler
from latch_schedule.testing import Builder
from latch_schedule.validate import check


def _names(plans):
    return [[n.name for n in p.nodes] for p in plans]


def _swiglu(ops, later="matmul"):
    """s = relu(g); h = s * u (the first reader); a later reader of s (a matmul, or an add)."""
    b = Builder(ops)
    gate = b.input("batch", "gate", (16, 8), role="batch")
    up = b.input("batch", "up", (16, 8), role="batch")
    w = b.input("params", "w", (8, 8))
    (s,) = b.node("relu", [gate], name="s")
    (h,) = b.node("mul", [s, up], name="h")
    (m,) = b.node("matmul", [h, w], name="mm")
    if later == "matmul":
        (z,) = b.node("matmul", [s, w], name="z")
    else:
        (z,) = b.node("add", [s, m], name="z")
    return b.graph({"loss": [m, z]})


def test_a_shared_pointwise_value_is_computed_by_its_first_reader(ops):
    plans = fuse(_swiglu(ops), ops)
    assert _names(plans) == [["s", "h"], ["mm"], ["z"]]
    p = plans[0]
    assert p.primary == "h" and set(p.outputs) == {"s", "h"} and not p.internal  # s still written for z
    # without the rule (fusion off) s is a pass of its own, written and read back
    assert _names(fuse(_swiglu(ops), ops, enabled=False)) == [["s"], ["h"], ["mm"], ["z"]]


def test_a_later_pointwise_reader_does_not_pull_the_value_past_an_earlier_one(ops):
    # z (pointwise, of s's shape) reads s after mm: s joins h's group, the earliest reader, not z's
    plans = fuse(_swiglu(ops, later="add"), ops)
    assert _names(plans) == [["s", "h"], ["mm"], ["z"]]


def test_a_first_reader_that_is_not_pointwise_is_left_alone(ops):
    # the earliest reader is a reduction (its values of another shape): s stays a pass of its own
    b = Builder(ops)
    gate = b.input("batch", "gate", (16, 8), role="batch")
    w = b.input("params", "w", (8, 8))
    (s,) = b.node("relu", [gate], name="s")
    (t,) = b.node("sum", [s], {"dims": (1,), "keepdim": True}, name="t")  # a reduction reads s first
    (m,) = b.node("matmul", [s, w], name="mm")
    plans = fuse(b.graph({"loss": [t, m]}), ops)
    assert ["s"] in _names(plans)


@pytest.mark.parametrize("scheduler", [barrier_scheduler, dataflow_scheduler])
def test_schedules_with_a_first_reader_group_validate(ops, scheduler):
    doc = Document(graph=GraphSection([_swiglu(ops)]))
    doc = attrs.evolve(doc, schedule=scheduler(doc, {"ops": ops, "num_sms": 4}))
    check(testing.distinct_placements(doc), ops=ops)
    groups = doc.schedule.programs[0].groups
    assert any(set(gr.outputs) == {"s", "h"} for gr in groups)
