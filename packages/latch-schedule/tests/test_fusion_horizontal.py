"""Horizontal fusion: pointwise groups of one shape reading a common input merge (the input is read
once), unless something between them reads the earlier group's output."""

from __future__ import annotations

from latch_schedule.fusion import fuse
from latch_schedule.testing import Builder


def _names(plans):
    return [sorted(n.name for n in p.nodes) for p in plans]


def _swiglu_bwd(ops, between: bool = False, other_shape: bool = False):
    """da = relu(do * c) * a-ish, dc = do * relu(a): two results from the same do and a."""
    b = Builder(ops)
    do = b.input("batch", "do", (16, 8), role="batch")
    a = b.input("batch", "a", (16, 8), role="batch")
    c = b.input("batch", "c", (16, 8), role="batch")
    w = b.input("params", "w", (8, 8))
    (t,) = b.node("mul", [do, c], name="t")
    (da,) = b.node("mul", [t, a], name="da")
    outs = [da]
    if between:  # a matmul reads da before the second group runs
        (mm,) = b.node("matmul", [da, w], name="mm")
        outs.append(mm)
    (r,) = b.node("relu", [a], name="r")
    if other_shape:
        b2 = b.input("batch", "s", (16, 1), role="batch")
        (dc,) = b.node("mul", [r, b2], name="dc")
    else:
        (dc,) = b.node("mul", [do, r], name="dc")
    outs.append(dc)
    return b.graph({"grads": outs})


def test_two_pointwise_groups_reading_the_same_input_merge(ops):
    g = _swiglu_bwd(ops)
    plans = fuse(g, ops)
    assert _names(plans) == [["da", "dc", "r", "t"]]
    p = plans[0]
    assert set(p.outputs) == {"da", "dc"} and p.primary == "dc" and p.internal == {"t", "r"}
    assert p.inputs.count("do") == 1 and p.inputs.count("a") == 1  # read once
    assert len(fuse(g, ops, enabled=False)) == 4


def test_no_merge_when_a_group_between_reads_the_earlier_output(ops):
    plans = fuse(_swiglu_bwd(ops, between=True), ops)
    assert ["da", "t"] in _names(plans) and ["dc", "r"] in _names(plans)


def test_a_broadcast_operand_does_not_stop_the_merge(ops):
    # dc = relu(a) * s with s [16, 1]: every value of the group is still (16, 8) and a is shared
    plans = fuse(_swiglu_bwd(ops, other_shape=True), ops)
    assert _names(plans) == [["da", "dc", "r", "t"]]


def test_merged_groups_stay_in_topological_order(ops):
    g = _swiglu_bwd(ops, between=True)
    plans = fuse(g, ops)
    produced_by = {o: k for k, p in enumerate(plans) for n in p.nodes for o in n.outputs}
    for k, p in enumerate(plans):
        for v in p.inputs:
            assert produced_by.get(v, -1) < k, (v, k)


def test_the_residual_pattern_merges_and_the_shared_value_stays_in_registers(ops):
    """h = relu(x + y) read by z = h + x and by its BF16 copy (sibling fusion): z's group reads x
    too, so it merges, and h, read only inside the merged group now, never reaches memory."""
    b = Builder(ops)
    x = b.input("batch", "x", (64, 32), role="batch")
    y = b.input("batch", "y", (64, 32), role="batch")
    w = b.input("params", "w", (32, 32), dtype="bf16")
    (a,) = b.node("add", [x, y], name="a")
    (h,) = b.node("relu", [a], name="h")
    (z,) = b.node("add", [h, x], name="z")
    (hb,) = b.node("cast", [h], {"dtype": "bf16"}, name="h_bf16")
    (m,) = b.node("matmul", [hb, w], name="mm")
    plans = fuse(b.graph({"loss": [m, z]}), ops)
    assert _names(plans) == [["a", "h", "h_bf16", "z"], ["mm"]]
    p = plans[0]
    assert set(p.outputs) == {"z", "h_bf16"} and p.internal == {"a", "h"} and p.primary == "h_bf16"
