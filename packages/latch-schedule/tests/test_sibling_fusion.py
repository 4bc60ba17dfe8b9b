"""Sibling fusion: a pointwise node whose only input is an elementwise group's sink joins that group
as an extra output (the BF16 copy written by the pass that computes the f32 value), only where
the rule allows, and the schedules of such groups validate under both strategies."""

from __future__ import annotations

import attrs
import pytest

from latch_core.document import Document
from latch_core.ir import GraphSection
from latch_schedule import testing
from latch_schedule.fusion import fuse
from latch_schedule.schedulers import barrier_scheduler, dataflow_scheduler
from latch_schedule.tasks import GroupTiler
from latch_schedule.testing import Builder
from latch_schedule.tiling import CostModel
from latch_schedule.validate import check


def _names(plans):
    return [[n.name for n in p.nodes] for p in plans]


def _residual(ops):
    """h = relu(x + y) feeds a matmul (through its bf16 copy) and the next residual add."""
    b = Builder(ops)
    x = b.input("batch", "x", (64, 32), role="batch")
    y = b.input("batch", "y", (64, 32), role="batch")
    w = b.input("params", "w", (32, 32), dtype="bf16")
    (a,) = b.node("add", [x, y], name="a")
    (h,) = b.node("relu", [a], name="h")
    # another reader of h, not pointwise (were it an add of h's shape, h's group would join it:
    # the first-reader rule, test_fusion_first_reader.py; were it reading x, horizontal fusion
    # would merge them: test_fusion_horizontal.py)
    (z,) = b.node("sum", [h], {"dims": (1,), "keepdim": False}, name="z")
    (hb,) = b.node("cast", [h], {"dtype": "bf16"}, name="h_bf16")
    (m,) = b.node("matmul", [hb, w], name="mm")
    return b, b.graph({"loss": [m, z]})


def test_a_cast_of_a_shared_value_joins_its_producer_group(ops):
    _, g = _residual(ops)
    plans = fuse(g, ops)
    assert _names(plans) == [["a", "h", "h_bf16"], ["z"], ["mm"]]
    p = plans[0]
    assert p.outputs == ("h", "h_bf16") and p.primary == "h_bf16" and p.internal == {"a"}
    # the sibling's footprint starts from the tile (it is no input of the group's other nodes)
    tiler = GroupTiler(g, p, ops, CostModel())
    reads, writes = tiler.footprint(((0, 16), (0, 32)))
    assert writes == {"h": ((0, 16), (0, 32)), "h_bf16": ((0, 16), (0, 32))}
    assert reads == {"x": ((0, 16), (0, 32)), "y": ((0, 16), (0, 32))}
    assert _names(fuse(g, ops, enabled=False)) == [[n] for n in ("a", "h", "z", "h_bf16", "mm")]


def test_a_sink_whose_readers_all_joined_becomes_internal(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    (a,) = b.node("relu", [x], name="a")
    (c1,) = b.node("cast", [a], {"dtype": "bf16"}, name="c1")
    (c2,) = b.node("cast", [a], {"dtype": "f16"}, name="c2")
    plans = fuse(b.graph({"loss": [c1, c2]}), ops)
    assert _names(plans) == [["a", "c1", "c2"]]
    assert plans[0].outputs == ("c1", "c2") and plans[0].internal == {"a"}


@pytest.mark.parametrize("case", ["two_inputs", "not_elementwise", "already_grouped"])
def test_the_rule_does_not_stretch(ops, case):
    b = Builder(ops)
    x = b.input("batch", "x", (8, 4), role="batch")
    w = b.input("params", "w", (4, 4))
    if case == "not_elementwise":
        (a,) = b.node("matmul", [x, w], name="a")  # a matmul's output: no elementwise group
    else:
        (a,) = b.node("relu", [x], name="a")
    (m,) = b.node("matmul", [a, w], name="mm")  # keeps a shared
    if case == "two_inputs":
        (s,) = b.node("mul", [a, x], name="s")
    elif case == "already_grouped":
        (s,) = b.node("relu", [a], name="s")
        (t,) = b.node("mul", [s, x], name="t")  # s fuses into t's group first
        g = b.graph({"loss": [m, t]})
        assert _names(fuse(g, ops)) == [["a"], ["mm"], ["s", "t"]]
        return
    else:
        (s,) = b.node("cast", [a], {"dtype": "bf16"}, name="s")
    g = b.graph({"loss": [m, s]})
    assert _names(fuse(g, ops)) == [["a"], ["mm"], ["s"]]


@pytest.mark.parametrize("scheduler", [barrier_scheduler, dataflow_scheduler])
def test_schedules_with_siblings_validate(ops, scheduler):
    _, g = _residual(ops)
    doc = Document(graph=GraphSection([g]))
    doc = attrs.evolve(doc, schedule=scheduler(doc, {"ops": ops, "num_sms": 4}))
    check(testing.distinct_placements(doc), ops=ops)
    groups = doc.schedule.programs[0].groups
    assert any(set(gr.outputs) == {"h", "h_bf16"} for gr in groups)
