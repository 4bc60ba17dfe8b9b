"""Boxes, the overlap index, and tilings: every footprint is a superset of what the op reads,
checked element by element against index maps written independently here."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latch_core.ir import TensorType
from latch_schedule import tiling, tiling_ops
from latch_schedule.boxes import BoxIndex, MultiIndex, covered, full_box, overlaps, volume
from latch_schedule.tiling import CostModel, Tiling, split


def _elements(box):
    return itertools.product(*[range(lo, hi) for lo, hi in box])


def _inside(idx, box):
    return all(lo <= i < hi for i, (lo, hi) in zip(idx, box))


# ---------------------------------------------------------------------------------------------
# The overlap index against brute force

def _random_boxes(rng, shape, n, grid):
    if grid:  # tiles of a grid, some repeated (several readers of one box)
        cuts = []
        for d in shape:
            pts = sorted({0, d} | {rng.randrange(1, d) for _ in range(rng.randint(0, 3))} if d > 1 else {0, d})
            cuts.append(list(zip(pts, pts[1:])))
        cells = list(itertools.product(*cuts))
        return [rng.choice(cells) for _ in range(n)]
    out = []
    for _ in range(n):
        box = []
        for d in shape:
            a, b = sorted(rng.sample(range(d + 1), 2))
            box.append((a, b))
        out.append(tuple(box))
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31), st.booleans(), st.integers(1, 3))
def test_box_index_matches_brute_force(seed, grid, rank):
    rng = random.Random(seed)
    shape = [rng.randint(1, 9) for _ in range(rank)]
    boxes = _random_boxes(rng, shape, rng.randint(0, 12), grid)
    idx = BoxIndex([(b, i) for i, b in enumerate(boxes)])
    for q in _random_boxes(rng, shape, 8, False) + _random_boxes(rng, shape, 4, True):
        want = sorted(i for i, b in enumerate(boxes) if overlaps(b, q))
        assert sorted(idx.query(q)) == want
    want_pairs = {(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if overlaps(boxes[i], boxes[j])}
    got = {tuple(sorted(p)) for p in idx.pairs()}
    assert got == want_pairs
    multi = MultiIndex([(b, i, i % 3) for i, b in enumerate(boxes)])
    q = _random_boxes(rng, shape, 1, False)[0]
    assert sorted(multi.query(q)) == sorted(i for i, b in enumerate(boxes) if overlaps(b, q))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31))
def test_covered_is_exact(seed):
    rng = random.Random(seed)
    shape = [rng.randint(1, 6) for _ in range(2)]
    parts = _random_boxes(rng, shape, rng.randint(0, 6), False)
    box = _random_boxes(rng, shape, 1, False)[0]
    want = all(any(_inside(e, p) for p in parts) for e in _elements(box))
    assert covered(box, parts, False) == want
    disjoint = all(not overlaps(a, b) for a, b in itertools.combinations(parts, 2))
    if disjoint:
        assert covered(box, parts, True) == want


def test_scalar_boxes_overlap():
    idx = BoxIndex([((), "w")])
    assert idx.query(()) == ["w"]


# ---------------------------------------------------------------------------------------------
# split: a partition of the shape

@pytest.mark.parametrize("shape,target", [((2048, 768), 132), ((7,), 3), ((2, 1024, 768), 50), ((5, 3), 100),
                                          ((1000,), 1), ((3, 0), 5)])
def test_split_partitions_the_shape(shape, target):
    t = tiling.elementwise([TensorType(shape, "f32")], [TensorType(shape, "f32")])
    boxes = split(shape, t, target)
    assert sum(volume(b) for b in boxes) == math.prod(shape) or math.prod(shape) == 0
    assert all(not overlaps(a, b) for a, b in itertools.combinations(boxes, 2))
    assert len(boxes) <= max(1, target)


def test_matmul_tiles_follow_the_granule_and_grow_with_size():
    cost = CostModel()
    small = tiling.matmul([TensorType((256, 64), "f32"), TensorType((64, 256), "f32")],
                          [TensorType((256, 256), "f32")], cost)
    assert small.granule == (128, 128)
    big = tiling.matmul([TensorType((2048, 768), "f32"), TensorType((768, 49152), "f32")],
                        [TensorType((2048, 49152), "f32")], cost)
    assert big.granule == (256, 256)
    boxes = split((256, 256), small, 1)
    assert len(boxes) == 4 and all(hi - lo == 128 for b in boxes for lo, hi in b)


# ---------------------------------------------------------------------------------------------
# Footprints against independent index maps


def _check(t: Tiling, out_shape, deps, samples=40, seed=0):
    """``deps(out_idx) -> [(operand k, in_idx)]``: what the op reads for one output element."""
    rng = random.Random(seed)
    boxes = split(out_shape, t, 7) if t.split_dims else [full_box(out_shape)]
    for box in boxes:
        ins, _ = t.footprint(box)
        elems = list(_elements(box))
        for e in rng.sample(elems, min(samples, len(elems))):
            for k, idx in deps(e):
                assert ins[k] is not None and _inside(idx, ins[k]), (box, e, k, idx, ins[k])


def test_elementwise_broadcast_footprint():
    a, b = TensorType((4, 1, 5), "f32"), TensorType((3, 5), "f32")
    out = TensorType((4, 3, 5), "f32")
    t = tiling.elementwise([a, b], [out])
    _check(t, out.shape, lambda e: [(0, (e[0], 0, e[2])), (1, (e[1], e[2]))])


def test_reduction_footprint_keepdim_and_not():
    x = TensorType((4, 6, 5), "f32")
    for keep in (True, False):
        out = TensorType((4, 1, 5) if keep else (4, 5), "f32")
        t = tiling.reduction([x], [out], {"dims": (1,), "keepdim": keep})
        assert t.split_dims == ((0, 2) if keep else (0, 1))

        def deps(e, keep=keep):
            i, k = e[0], e[-1]
            return [(0, (i, j, k)) for j in range(6)]

        _check(t, out.shape, deps)
    full = tiling.reduction([x], [TensorType((), "f32")], {"dims": (0, 1, 2), "keepdim": False})
    assert full.split_dims == ()


def test_matmul_footprint():
    a, b = TensorType((2, 40, 12), "f32"), TensorType((2, 12, 30), "f32")
    out = TensorType((2, 40, 30), "f32")
    t = tiling.matmul([a, b], [out], CostModel(matmul_tiles=((16, 16),)))
    _check(t, out.shape, lambda e: [(0, (e[0], e[1], k)) for k in range(12)] + [(1, (e[0], k, e[2])) for k in range(12)])


def test_norm_footprint_reads_whole_rows_and_stats():
    x, w = TensorType((6, 8), "f32"), TensorType((8,), "f32")
    t = tiling.norm([x, w], [TensorType((6, 8), "f32"), TensorType((6,), "f32")], {})
    assert t.split_dims == (0,)
    _check(t, (6, 8), lambda e: [(0, (e[0], j)) for j in range(8)] + [(1, (j,)) for j in range(8)])
    ins, outs = t.footprint(((2, 4), (0, 8)))
    assert outs[1] == ((2, 4),)
    ln = tiling.norm([TensorType((2, 3, 4, 5), "f32")], [TensorType((2, 3, 4, 5), "f32")], {"normalized_ndim": 2})
    assert ln.split_dims == (0, 1)


def _flat(shape, idx):
    f = 0
    for d, i in zip(shape, idx):
        f = f * d + i
    return f


def _unflat(shape, f):
    out = []
    for d in reversed(shape):
        out.append(f % d)
        f //= d
    return tuple(reversed(out))


def test_view_footprints():
    x = TensorType((4, 6, 5), "f32")
    # reshape: same flat element
    out_shape = (24, 5)
    t = tiling_ops.reshape([x], [TensorType(out_shape, "f32")], {"shape": out_shape})
    _check(t, out_shape, lambda e: [(0, _unflat(x.shape, _flat(out_shape, e)))])
    out_shape2 = (2, 60)
    t = tiling_ops.reshape([x], [TensorType(out_shape2, "f32")], {"shape": out_shape2})
    _check(t, out_shape2, lambda e: [(0, _unflat(x.shape, _flat(out_shape2, e)))])
    # permute
    perm = (2, 0, 1)
    t = tiling_ops.permute([x], [TensorType((5, 4, 6), "f32")], {"perm": perm})
    _check(t, (5, 4, 6), lambda e: [(0, tuple(e[perm.index(d)] for d in range(3)))])
    # expand
    t = tiling_ops.expand([TensorType((6, 1), "f32")], [TensorType((3, 6, 4), "f32")], {"shape": (3, 6, 4)})
    _check(t, (3, 6, 4), lambda e: [(0, (e[1], 0))])
    # slice with a step
    t = tiling_ops.slice_([x], [TensorType((4, 2, 5), "f32")], {"dim": 1, "start": 1, "end": 6, "step": 3})
    _check(t, (4, 2, 5), lambda e: [(0, (e[0], 1 + 3 * e[1], e[2]))])
    # select
    t = tiling_ops.select([x], [TensorType((4, 5), "f32")], {"dim": 1, "index": 4})
    _check(t, (4, 5), lambda e: [(0, (e[0], 4, e[1]))])


def test_concat_and_scatter_footprints():
    a, b = TensorType((4, 2), "f32"), TensorType((4, 3), "f32")
    t = tiling_ops.concat([a, b], [TensorType((4, 5), "f32")], {"dim": 1})
    # split the concat dim too, to exercise partial overlaps
    t2 = Tiling((0, 1), t.footprint)
    _check(t2, (4, 5), lambda e: [(0, (e[0], e[1]))] if e[1] < 2 else [(1, (e[0], e[1] - 2))])
    x, src = TensorType((9, 3), "f32"), TensorType((3, 3), "f32")
    t = tiling_ops.slice_scatter([x, src], [x], {"dim": 0, "start": 2, "end": 9, "step": 3})
    t2 = Tiling((0,), t.footprint)

    def deps(e):
        i = e[0]
        d = [(0, e)]
        if 2 <= i < 9 and (i - 2) % 3 == 0:
            d.append((1, ((i - 2) // 3, e[1])))
        return d

    _check(t2, (9, 3), deps)
    t = tiling_ops.select_scatter([x, TensorType((3,), "f32")], [x], {"dim": 0, "index": 5})
    _check(Tiling((0,), t.footprint), (9, 3), lambda e: [(0, e)] + ([(1, (e[1],))] if e[0] == 5 else []))


def test_indexing_footprints_read_whole_indexed_dims():
    w, idx = TensorType((50, 8), "f32"), TensorType((3, 7), "i64")
    t = tiling_ops.embedding([w, idx], [TensorType((3, 7, 8), "f32")], {})
    _check(t, (3, 7, 8), lambda e: [(1, (e[0], e[1]))] + [(0, (r, e[2])) for r in range(50)])
    g = tiling_ops.gather([TensorType((5, 6), "f32"), TensorType((5, 4), "i64")], [TensorType((5, 4), "f32")],
                          {"dim": 1})
    _check(g, (5, 4), lambda e: [(1, e)] + [(0, (e[0], j)) for j in range(6)])


def test_an_ops_own_tiling_wins(ops):
    spec = ops.get("sched_test::transpose")
    t = tiling.tiling_for(spec, [TensorType((4, 6), "f32")], [TensorType((6, 4), "f32")], {}, CostModel())
    assert t.kind == "transpose"
    _check(t, (6, 4), lambda e: [(0, (e[1], e[0]))])


def test_bad_custom_tiling_is_named(ops):
    from latch_core.registry import OpSpec

    bad = OpSpec("x::bad", "bad(x)", lambda i, a: [i[0]], extra={"tiling": lambda i, o, a: "nope"})
    with pytest.raises(TypeError, match="x::bad"):
        tiling.tiling_for(bad, [TensorType((2,), "f32")], [TensorType((2,), "f32")], {}, CostModel())


def test_scatter_tiles_read_every_source_and_write_only_their_tile():
    x, idx, src = TensorType((10, 4), "f32"), TensorType((6,), "i64"), TensorType((6, 4), "f32")
    t = tiling_ops.scatter_like([x, idx, src], [x], {"dim": 0})
    assert t.split_dims == (0,)
    for box in split((10, 4), t, 3):
        ins, outs = t.footprint(box)
        assert ins[0] == box and ins[1] == full_box((6,)) and ins[2] == full_box((6, 4)) and outs == [box]
    g, ix = TensorType((2, 3, 4), "f32"), TensorType((2, 3), "i64")
    t = tiling_ops.scatter_like([g, ix], [TensorType((50, 4), "f32")], {"num_weights": 50})
    ins, outs = t.footprint(((0, 25), (0, 4)))
    assert ins == [full_box((2, 3, 4)), full_box((2, 3))] and outs == [((0, 25), (0, 4))]


def test_ops_with_enough_work_spread_over_every_sm():
    """Under a barrier a phase lasts as long as its longest task: a 0.5 ms row op must not sit on
    25 SMs (the 20 us rule alone; run 14 measured 62% of SM-time waiting so), while a tiny one
    stays one task."""
    cost = CostModel()
    assert tiling.target_tiles(500e-6, cost, 132) == 132
    assert tiling.target_tiles(501e-6, attrs_evolve(cost, min_spread_task=1.0), 132) == 25  # the old rule
    assert tiling.target_tiles(101e-6, cost, 132) == 50  # 2 us tiles: fewer SMs rather than tiny tasks
    assert tiling.target_tiles(1e-6, cost, 132) == 1


def attrs_evolve(obj, **kw):
    import attrs

    return attrs.evolve(obj, **kw)


def test_column_reductions_split_their_kept_innermost_dim_finely():
    """A norm-weight gradient ((2048, 768) summed over rows) or the clip's per-row partial sums: each
    output reads a whole column, so the kept innermost dim is cut at 32 elements (the column body's
    lanes), not 128 (6 tasks)."""
    x = TensorType((2048, 768), "f32")
    t = tiling.reduction([x], [TensorType((768,), "f32")], {"dims": (0,), "keepdim": False})
    boxes = split((768,), t, 132)
    assert len(boxes) == 24 and all((hi - lo) == 32 for ((lo, hi),) in boxes)
    e = tiling.elementwise([TensorType((768,), "f32")], [TensorType((768,), "f32")])
    assert len(split((768,), e, 132)) == 6  # elementwise rows keep 128-element (vector) cuts


def test_matmul_raster_order_keeps_what_runs_together_in_l2():
    """The LM head's forward at 32 x 1024 tokens (256 x 192 tiles of 128 x 256, K 768) in plain
    row-major order re-read its 75 MB weight for every row block (run 13: 71% of cuBLAS); grouped by
    63 column blocks (24.8 MB of B in L2) it reads B once. At 2 x 1024 tokens the 16 row blocks walk
    fastest, as before; long-K products keep the plain order."""
    cost = CostModel()
    a_blk, b_blk = 128 * 768 * 2, 256 * 768 * 2
    assert tiling.raster(256, 192, a_blk, b_blk, cost) == ("n", 63)
    assert tiling.raster(16, 192, a_blk, b_blk, cost) == ("m", 16)
    assert tiling.raster(256, 9, a_blk, b_blk, cost) == ()  # QKV: all 9 column blocks fit
    # a weight gradient with K = 32768 (8 MB blocks stream through the ring in step): plain order
    assert tiling.raster(384, 3, 128 * 32768 * 2, 256 * 32768 * 2, cost) == ()

    bf = "bf16"
    t = tiling.matmul([TensorType((32768, 768), bf), TensorType((49152, 768), bf)],
                      [TensorType((32768, 49152), bf)], cost, {"trans_b": True})
    tm, tn = t.granule[-2:]
    n_m, n_n = 32768 // tm, 49152 // tn
    fast, g = t.raster
    assert fast == ("m" if n_m < n_n else "n") and 1 < g < max(n_m, n_n)
    boxes = split((32768, 49152), t, 0)
    assert len(boxes) == n_m * n_n and len(set(boxes)) == len(boxes)
    k = 0 if fast == "m" else 1  # the dim walked fastest, g blocks at a time
    head = boxes[:g]
    assert len({b[1 - k] for b in head}) == 1 and [b[k][0] for b in head] == [j * (tm, tn)[k] for j in range(g)]
    assert boxes[g][1 - k] != boxes[0][1 - k] and boxes[g][k] == boxes[0][k]
    group = boxes[:g * (n_n if fast == "m" else n_m)]
    assert len({b[k] for b in group}) == g  # one group of g blocks covers every block of the other dim first
