"""The global-norm clip's first level (``mul+sum`` partials of split_reductions: ``sum(g * g)`` over
the trailing dims of each gradient, rows of 512 or 768) on the contiguous row path
(lower_reduce ``rows_contig_statements``, results/gn.md).

Run 39 (H200, TinyMoE-200M at 2 x 1024): the expert weight gradients' partials ran at 30% of their
bytes floor and the embedding's at 61%: rows_statements computed each row's input offset with
``base(o)`` (a run-time 64-bit division by the tile's extents, behind branches), so ptxas issued one
row's 4 or 6 loads, waited, squared them, then the next row's: one HBM round trip per row. On a
tile that is one contiguous range of the output the rows are one contiguous range of the input:
the new path computes ``(first + o) * R``, clamps the rows so every load of a batch sits in one
straight line, and prefetches the warp's batches ahead into L2.

- generated text and SASS (nvcc + cuobjdump, sm_90a): 16 (rows of 512) or 18 (rows of 768)
  LDG.E.128 issued with no arithmetic between them, the L2 prefetches, no local memory;
- host runs (g++, 256 host threads, test_column_host's harness): on contiguous tiles the same bits
  as the box-tile path (rows_statements: the same operations in the same order), the same bits
  twice, right against math.fsum, nothing outside the tile written; every prefetch inside the
  tile's rows of the input, every line of every batch after each warp's first prefetched once;
  each output's bits equal a Python model of rows_statements' order (the bits of before)."""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import struct

import pytest

from latch_codegen_h100 import lower_reduce
from latch_codegen_h100.bodies import FUNC, render_body
from latch_codegen_h100.codegen import _lowerings

from test_column_host import HARNESS, RUN, _host_lib, random_inputs
from test_ilp_host import G
from test_prefetch_bodies import _longest_load_run, _sass, needs_sass

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# the unconditional L2 prefetch (latch::gpf), logged into the harness's prefetch log
EXTRA = r"""
namespace latch {
template <class S> inline void gpf(const S* p, i64 i) {
  const long long k = __atomic_fetch_add(&pf4_n_, 1, __ATOMIC_RELAXED);
  if (k < (long long)(sizeof(pf4_log_) / sizeof(pf4_log_[0]))) pf4_log_[k] = reinterpret_cast<uintptr_t>(p + i);
}
}  // namespace latch
"""


def _partial(shape, lead: int, op: str = "sum", square: bool = True):
    """split_reductions' first level of ``op(g * g)`` over ``shape``: the trailing dims reduced."""
    g = G()
    x = g.inp("x", shape)
    m = g.op("mul", (x, x), shape) if square else x
    y = g.op(op, (m,), tuple(shape[:lead]), {"dims": tuple(range(lead, len(shape))), "keepdim": False})
    return g, y


def _src(g, y) -> str:
    return render_body(g.spec([y]), _lowerings()).source


# ---- generated text -------------------------------------------------------------------------

def test_the_expert_partial_takes_the_straight_line_prefetched_row_path():
    src = _src(*_partial((16, 768, 512), 2))
    assert "const int n_ = (int)(" in src and "first_ = (int)(" in src  # contiguous: no per-row decode
    assert "const long long b_ = (long long)(first_ + oc_) * 512LL;" in src
    assert "load4v(b_ + r_, v_[u_][k_]);" in src and "float v_[4][4][4];" in src  # 16 loads per lane
    assert "latch::gpf(in0, pb_ + e_);" in src  # the L2 prefetch of the gradient
    assert "L2 prefetch of batch +2's rows" in src
    assert "latch::st<float>(out0, (long long)(first_ + o0_ + u_)" in src
    assert "atomic" not in src
    # the box-tile path stays beside it (a tile that is not one contiguous range)
    assert "base(o0_ + u_)" in src


def test_the_embedding_partial_holds_three_rows_of_768_per_warp():
    src = _src(*_partial((49152, 768), 1))
    assert "float v_[3][6][4];" in src  # 18 loads per lane
    assert "latch::gpf(in0, pb_ + e_);" in src


def test_a_small_row_reduction_is_not_prefetched():
    src = _src(*_partial((37, 768), 1))
    assert "load4v(b_ + r_, v_[u_][k_]);" in src and "gpf" not in src


# ---- SASS -------------------------------------------------------------------------------------

def _report(ins: list[str]) -> tuple[int, int, int]:
    local = sum(i.split()[0].startswith(("LDL", "STL")) for i in ins)
    return _longest_load_run(ins, "LDG.E.128"), sum("CCTL.E.PF2" in i for i in ins), local


@needs_sass
@pytest.mark.parametrize("shape,lead,run", [((16, 768, 512), 2, 16), ((16, 512, 768), 2, 18),
                                             ((49152, 768), 1, 18)])
def test_the_partials_issue_every_load_of_a_batch_before_any_arithmetic(tmp_path, shape, lead, run):
    """Before: the longest run of LDG.E.128 with no FMUL/F2F/DADD between was one row's (4 for rows
    of 512, 6 for 768): the rows' loads waited for the previous row's squares."""
    ins = _sass(tmp_path, _src(*_partial(shape, lead)))
    longest, pf, local = _report(ins)
    assert longest >= run
    assert pf >= 2  # the batch ahead's lines (and the task's first batches)
    assert local == 0


# ---- host runs --------------------------------------------------------------------------------

def _lib(tmp_path, g, y):
    src = _src(g, y).replace(FUNC, "body")
    lib = _host_lib(tmp_path, HARNESS + EXTRA + src + RUN)
    lib.prefetches.restype = ctypes.c_longlong
    return src, lib


def _run(lib, bufs, n_out, lo, hi):
    out = (ctypes.c_float * n_out)(*([float("nan")] * n_out))
    ptrs = (ctypes.c_void_p * (len(bufs) + 1))(*[ctypes.addressof(b) for b in bufs + [out]])
    lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * (8 - len(lo)))), (ctypes.c_int * 8)(*(hi + [0] * (8 - len(hi)))))
    cap = 1 << 16
    addrs = (ctypes.c_size_t * cap)()
    n = lib.prefetches(addrs, cap)
    assert n <= cap
    return list(out), list(addrs[:n])


def _row_order(vals, R: int, mean: bool) -> float:
    """One row's result in the order of rows_statements (and rows_contig_statements), in Python's
    IEEE doubles: lane l's four accumulators over its groups k (elements 4 l + 128 k + j) from 0,
    then (a0 + a1) + (a2 + a3), then the xor butterfly over the 32 lanes; lane 0's value rounded
    to FP32. The bits the body must keep."""
    lanes = []
    for lane in range(32):
        a = [0.0] * 4
        for k in range(-(-R // 128)):
            for j in range(4):
                r = 4 * lane + 128 * k + j
                a[j] = a[j] + (vals[r] if 4 * lane + 128 * k < R else 0.0)
        lanes.append((a[0] + a[1]) + (a[2] + a[3]))
    for o in (16, 8, 4, 2, 1):
        lanes = [lanes[i] + lanes[i ^ o] for i in range(32)]
    v = lanes[0] / R if mean else lanes[0]
    return struct.unpack("f", struct.pack("f", v))[0]


def _bits(xs):
    return [struct.pack("f", x) for x in xs]


CASES = {
    # (shape, lead, op, square): rows of 512 (the expert gradients, scaled down), of 768 (the
    # embedding's), of 260 (lanes past the row's end: clamped loads), a plain mean
    "experts": ((4, 160, 512), 2, "sum", True),
    "embedding": ((200, 768), 1, "sum", True),
    "ragged_rows": ((3, 90, 260), 2, "sum", True),
    "plain_mean": ((300, 384), 1, "mean", False),
}


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_contiguous_tiles_keep_the_bits_of_the_box_path_and_prefetch_inside_the_tile(tmp_path, monkeypatch, name):
    monkeypatch.setattr(lower_reduce, "PREFETCH_MIN_BYTES", 0)  # prefetch even these small inputs
    shape, lead, op, square = CASES[name]
    g, y = _partial(shape, lead, op, square)
    src, lib = _lib(tmp_path, g, y)
    assert "latch::gpf(in0, pb_ + e_);" in src
    bufs, flat = random_inputs(g, 17)
    oshape = shape[:lead]
    n_out = math.prod(oshape)
    R = math.prod(shape[lead:])
    xs = flat["x"]
    f32 = lambda a: struct.unpack("f", struct.pack("f", a))[0]  # noqa: E731 (the square rounds to FP32)
    want = [math.fsum((f32(v * v) if square else v) for v in xs[o * R:(o + 1) * R]) / (R if op == "mean" else 1)
            for o in range(n_out)]
    # a contiguous tile (rows [first, first + count) of the flat output) and a box tile that is not
    if lead == 2:
        contig = ([1, 0], [3, oshape[1]])  # two whole rows of dim 0: one contiguous range
        box = ([1, 1], [3, oshape[1] - 1])
    else:
        contig = ([7], [oshape[0] - 5])
        box = None
    got, pf = _run(lib, bufs, n_out, *contig)
    again, _ = _run(lib, bufs, n_out, *contig)
    assert _bits(got) == _bits(again)  # the same bits twice
    st = [math.prod(oshape[d + 1:]) for d in range(len(oshape))]
    inside = lambda k, lo, hi: all(lo[d] <= (k // st[d]) % oshape[d] < hi[d] for d in range(len(oshape)))  # noqa: E731
    for k in range(n_out):
        if inside(k, *contig):
            assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-6), k
            row = [(f32(v * v) if square else v) for v in xs[k * R:(k + 1) * R]]
            assert _bits([got[k]]) == _bits([_row_order(row, R, op == "mean")]), k  # the bits of before
        else:
            assert math.isnan(got[k]), k
    # the prefetches: line-spaced addresses inside the tile's rows, each warp's batches after its
    # first one (RU rows each, warp w's batch b from row (b * 8 + w) * RU of the tile) exactly once
    first = sum(contig[0][d] * st[d] for d in range(len(oshape)))
    count = math.prod(h - lo_ for lo_, h in zip(*contig))
    per = -(-R // 128)
    ru = max(1, min(lower_reduce.ROW_MAX_RU, -(-lower_reduce.ROW_CONTIG_ACCESSES // per)))
    x0 = ctypes.addressof(bufs[0])
    expect = []
    for b0 in range(8 * ru, count, ru):  # batch starts (rows of the tile), each warp's first excluded
        p0, pe = b0, min(ru, count - b0) * R
        expect += [x0 + 4 * ((first + p0) * R + e) for e in range(0, pe, 32)]
    assert len(pf) == len(set(pf)) and sorted(pf) == sorted(expect)
    assert pf and all(x0 + 4 * first * R <= a < x0 + 4 * (first + count) * R for a in pf)
    if box is not None:  # the box tile: rows_statements (base() decode), the same bits per output
        got_box, pf_box = _run(lib, bufs, n_out, *box)
        assert not pf_box
        assert sum(inside(k, *box) for k in range(n_out)) > 0
        for k in range(n_out):
            if inside(k, *box):  # inside the contiguous tile too
                assert _bits([got_box[k]]) == _bits([got[k]]), k
            else:
                assert math.isnan(got_box[k]), k


@needs_gxx
def test_a_tile_shorter_than_a_batch_reads_and_prefetches_nothing_past_it(tmp_path, monkeypatch):
    """Three rows (fewer than one warp's batch): the loads clamped to the tile's last row, no
    prefetch (no warp has a second batch), only the three outputs written."""
    monkeypatch.setattr(lower_reduce, "PREFETCH_MIN_BYTES", 0)
    g, y = _partial((64, 512), 1)
    _, lib = _lib(tmp_path, g, y)
    bufs, flat = random_inputs(g, 5)
    got, pf = _run(lib, bufs, 64, [10], [13])
    assert not pf
    for k in range(64):
        if 10 <= k < 13:
            want = math.fsum(struct.unpack("f", struct.pack("f", v * v))[0] for v in flat["x"][k * 512:(k + 1) * 512])
            assert got[k] == pytest.approx(want, rel=1e-5), k
        else:
            assert math.isnan(got[k]), k
    assert re.search(r"oc_ = o0_ \+ u_ < n_ \? o0_ \+ u_ : n_ - 1", _src(g, y))
