"""Row groups (latch_schedule.rowgroups): a row reduction, the pointwise chain on its per-row
statistic and the broadcast consumer become ONE group whose tasks cover whole rows; a statistic
read later stays an output; the rule stays off where the merge would be illegal (a reader of the
statistic that the consumer depends on), where a row is too long, or when switched off."""

from __future__ import annotations

from latch_schedule import tasks
from latch_schedule.fusion import fuse
from latch_schedule.rowgroups import ROW_GROUP_MAX_ROW
from latch_schedule.testing import Builder, op
from latch_schedule.tiling import CostModel, split

PROLOGUE = frozenset({op("sum")})


def _names(plans):
    return [[n.name for n in p.nodes] for p in plans]


def _norm(ops, R=32, keep_stat=False, detour=False, T=64):
    """y = (x * relu(sum(x * x, -1, keepdim))) * w; ``keep_stat``: the statistic is also read by a
    later node; ``detour``: a matmul reads the statistic and the consumer adds its product."""
    b = Builder(ops)
    x = b.input("batch", "x", (T, R), role="batch")
    w = b.input("params", "w", (R,))
    (sq,) = b.node("mul", [x, x], name="sq")
    (s,) = b.node("sum", [sq], {"dims": (1,), "keepdim": True}, name="s")
    (t,) = b.node("relu", [s], name="t")
    (xt,) = b.node("mul", [x, t], name="xt")
    if detour:
        v = b.input("params", "v", (1, R))
        (m,) = b.node("matmul", [t, v], name="m")
        (xt,) = b.node("add", [xt, m], name="xtm")
    (y,) = b.node("mul", [xt, w], name="y")
    outs = {"metrics": [y]}
    if keep_stat:
        (later,) = b.node("relu", [t], name="later")
        outs["metrics"].append(later)
    return b.graph(outs)


def test_statistic_chain_and_consumer_are_one_group(ops):
    g = _norm(ops)
    plans = fuse(g, ops, prologue_ops=PROLOGUE, row_groups=True)
    assert _names(plans) == [["sq", "s", "t", "xt", "y"]]
    p = plans[0]
    assert p.row == 32 and p.inputs == ("x", "w") and p.outputs == ("y",) and {"s", "t", "sq", "xt"} <= p.internal
    # without the rule: the reduction (with its prologue), the statistic's chain, the scale
    assert _names(fuse(g, ops, prologue_ops=PROLOGUE)) == [["sq", "s"], ["t"], ["xt", "y"]]
    assert all(p.row == 0 for p in fuse(g, ops, prologue_ops=PROLOGUE))


def test_a_statistic_read_later_stays_an_output_written_once_per_row(ops):
    g = _norm(ops, keep_stat=True)
    plans = fuse(g, ops, prologue_ops=PROLOGUE, row_groups=True)
    row = next(p for p in plans if p.row)
    assert [n.name for n in row.nodes] == ["sq", "s", "t", "xt", "y"]
    assert set(row.outputs) == {"t", "y"} and row.primary == "y"


def test_tasks_cover_whole_rows_and_read_each_row_once(ops):
    g = _norm(ops, R=256, T=4096)
    (plan,) = fuse(g, ops, prologue_ops=PROLOGUE, row_groups=True)
    tiler = tasks.GroupTiler(g, plan, ops, CostModel())
    assert tiler.tiling.split_dims == (0,)  # the tail's elementwise tiling would split both dims
    boxes = split(tiler.shape, tiler.tiling, 200)
    assert len(boxes) > 8
    for box in boxes:
        assert box[1] == (0, 256)
        reads, writes = tiler.footprint(box)
        assert reads["x"] == box  # exactly the task's rows
        assert set(writes) == {"y"} and writes["y"] == box
    # without the rule the tail's tiling splits the innermost dim too
    plain = [p for p in fuse(g, ops, prologue_ops=PROLOGUE) if p.primary == "y"][0]
    assert tasks.GroupTiler(g, plain, ops, CostModel()).tiling.split_dims == (0, 1)


def test_a_reader_of_the_statistic_that_the_consumer_depends_on_blocks_the_merge(ops):
    """m = t @ v runs between the statistic and the consumer and feeds it: moving the statistic to
    the consumer's position would leave m without its input."""
    g = _norm(ops, detour=True)
    plans = fuse(g, ops, prologue_ops=PROLOGUE, row_groups=True)
    assert not any(p.row for p in plans)
    assert ["sq", "s"] in _names(plans)


def test_rows_too_long_or_not_a_multiple_of_four_keep_the_plain_groups(ops):
    for R in (ROW_GROUP_MAX_ROW + 4, 30):
        plans = fuse(_norm(ops, R=R, T=8), ops, prologue_ops=PROLOGUE, row_groups=True)
        assert not any(p.row for p in plans), R
    assert any(p.row for p in fuse(_norm(ops, R=ROW_GROUP_MAX_ROW, T=8), ops, prologue_ops=PROLOGUE, row_groups=True))
