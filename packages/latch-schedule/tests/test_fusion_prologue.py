"""Elementwise prologues fused into reductions: ``sum(g * g)`` reads g once and the squares never
reach memory; the rule's limits (program outputs, values read elsewhere) and the tasks' footprints."""

from __future__ import annotations

from latch_schedule import tasks
from latch_schedule.fusion import fuse
from latch_schedule.testing import Builder, op

PROLOGUE = frozenset({op("sum")})


def _names(plans):
    return [[n.name for n in p.nodes] for p in plans]


def _square_sum(ops, keep_square: bool = False, reuse: bool = False):
    b = Builder(ops)
    g = b.input("batch", "g", (64, 32), role="batch")
    (sq,) = b.node("mul", [g, g], name="sq")
    (s,) = b.node("sum", [sq], {"dims": (0, 1), "keepdim": False}, name="ss")
    outs = {"metrics": [s]}
    if keep_square:
        outs["metrics"].append(sq)
    if reuse:
        (r,) = b.node("relu", [sq], name="other")
        outs["metrics"].append(r)
    return b.graph(outs)


def test_the_square_joins_its_sum_and_never_reaches_memory(ops):
    g = _square_sum(ops)
    plans = fuse(g, ops, prologue_ops=PROLOGUE)
    assert _names(plans) == [["sq", "ss"]]
    p = plans[0]
    assert p.inputs == ("g",) and p.outputs == ("ss",) and p.internal == {"sq"} and p.primary == "ss"
    assert not p.pointwise  # a reduction: never an in-place candidate
    # without the rule (or without fusion) the squares are a value of their own
    assert _names(fuse(g, ops, prologue_ops=frozenset())) == [["sq"], ["ss"]]
    assert _names(fuse(g, ops, enabled=False, prologue_ops=PROLOGUE)) == [["sq"], ["ss"]]


def test_a_chain_of_elementwise_producers_joins_too(ops):
    b = Builder(ops)
    x = b.input("batch", "x", (16, 8), role="batch")
    w = b.input("params", "w", (8,))
    (a,) = b.node("mul", [x, w], name="a")  # broadcast operand: an input of the group, read by index
    (r,) = b.node("relu", [a], name="r")
    (s,) = b.node("sum", [r], {"dims": (1,), "keepdim": True}, name="rows")
    plans = fuse(b.graph({"metrics": [s]}), ops, prologue_ops=PROLOGUE)
    assert _names(plans) == [["a", "r", "rows"]]
    assert set(plans[0].inputs) == {"x", "w"} and plans[0].internal == {"a", "r"}


def test_a_prologue_value_that_is_a_program_output_or_read_elsewhere_stays_out(ops):
    assert _names(fuse(_square_sum(ops, keep_square=True), ops, prologue_ops=PROLOGUE)) == [["sq"], ["ss"]]
    plans = fuse(_square_sum(ops, reuse=True), ops, prologue_ops=PROLOGUE)
    names = _names(plans)
    assert ["ss"] in names and not any("sq" in grp and "ss" in grp for grp in names)


def test_the_fused_groups_footprint_reads_the_input_once_and_writes_only_the_result(ops):
    from latch_schedule.boxes import full_box
    from latch_schedule.tiling import CostModel

    b = Builder(ops)
    x = b.input("batch", "x", (16, 8), role="batch")
    (sq,) = b.node("mul", [x, x], name="sq")
    (s,) = b.node("sum", [sq], {"dims": (1,), "keepdim": False}, name="rows")
    g = b.graph({"metrics": [s]})
    (plan,) = fuse(g, ops, prologue_ops=PROLOGUE)
    tiler = tasks.GroupTiler(g, plan, ops, CostModel())
    reads, writes = tiler.footprint(((4, 10),))  # rows 4..9 of the result
    assert set(reads) == {"x"} and set(writes) == {"rows"}  # the squares: neither read nor written
    assert reads["x"] == ((4, 10), (0, 8)) and writes["rows"] == ((4, 10),)
    assert tiler.footprint(full_box((16,)))[0]["x"] == full_box((16, 8))
