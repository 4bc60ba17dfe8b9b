"""The short reductions' vector path (lower_reduce ``short_vec_statements``: R <= THREAD_THRESHOLD
reduced elements per output, the kept innermost dim the input's innermost): TinyMoE's sum of the
top-2 expert rows (``reshape+sum``: (2N, K) -> (N, 2, K) summed over the 2), the combine with the
routing weights (``reshape+reshape+mul+sum``: the rows scaled first, a fused prologue), a split-K
sum over leading partials, a mean over a middle dim kept. Compiled as HOST C++ (test_column_host's
harness) and run on 256 host threads:

- row tiles take the vector path: four consecutive outputs per thread, every row of every group
  read with one 16-byte access per operand, every output written once by a 16-byte store;
- box tiles (not one contiguous range) take the one-thread-per-output loop of before
  (``reduce_thread_per_output``, compiled from the header's own text), and on the outputs both
  compute, the two paths give the same bits (each output reduced in index order from the same
  identity in the same accumulator type);
- every output is right against math.fsum, nothing outside the tile is written."""

from __future__ import annotations

import ctypes
import math
import random
import shutil
import struct
from pathlib import Path

import pytest

from latch_codegen_h100.bodies import FUNC, render_body
from latch_codegen_h100.codegen import _lowerings
from latch_codegen_h100 import lower_reduce

from test_column_host import HARNESS, RUN, _host_lib, random_inputs
from test_ilp_host import G

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

N, K = 40, 24


def _thread_per_output() -> str:
    """latch_reduce.cuh's ``reduce_thread_per_output`` (the device text), for the host."""
    import latch_ops

    text = (Path(latch_ops.__file__).parent / "cuda" / "latch_reduce.cuh").read_text()
    body = text.index("void reduce_thread_per_output(")
    start = text.rindex("template", 0, body)
    depth, i = 0, text.index("{", body)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
        i += 1


EXTRA = r"""
namespace latch {
static long long st4_ = 0;
template <class S, class V> inline void gst4(S* p, i64 i, const V (&v)[4]) {
  if (!aligned4(p, i)) abort();
  __atomic_add_fetch(&st4_, 1, __ATOMIC_RELAXED);
  for (int j = 0; j < 4; ++j) p[i + j] = (S)v[j];
}
struct ProdOp {
  template <class T> static T init() { return T(1); }
  template <class T> static T apply(T a, T b) { return a * b; }
};
""" + "%s" + r"""
}  // namespace latch
extern "C" long long st4() { long long v = latch::st4_; latch::st4_ = 0; return v; }
"""


def _case(name):
    g = G()
    if name == "topk_sum":  # d(combine): (2N, K) as (N, 2, K), summed over the 2
        x = g.inp("x", (2 * N, K))
        r = g.op("reshape", (x,), (N, 2, K), {"shape": (N, 2, K)})
        y = g.op("sum", (r,), (N, K), {"dims": (1,), "keepdim": False})
        return g, y, (N, K), 1, lambda v: [math.fsum(v["x"][(2 * n + k) * K + c] for k in range(2))
                                           for n in range(N) for c in range(K)]
    if name == "weighted_topk_sum":  # the combine: each expert row times its routing weight, summed
        x, w = g.inp("x", (2 * N, K)), g.inp("w", (N, 2))
        r = g.op("reshape", (x,), (N, 2, K), {"shape": (N, 2, K)})
        rw = g.op("reshape", (w,), (N, 2, 1), {"shape": (N, 2, 1)})
        y = g.op("sum", (g.op("mul", (r, rw), (N, 2, K)),), (N, K), {"dims": (1,), "keepdim": False, "accum_dtype": "f32"})

        def ref(v):
            f32 = lambda a: struct.unpack("f", struct.pack("f", a))[0]  # noqa: E731 (the product rounds to f32)
            return [math.fsum(f32(v["x"][(2 * n + k) * K + c] * v["w"][2 * n + k]) for k in range(2))
                    for n in range(N) for c in range(K)]
        return g, y, (N, K), 1, ref
    if name == "split_k_sum":  # S = 4 partial products summed over the leading dim
        p = g.inp("p", (4, N, K))
        y = g.op("sum", (p,), (N, K), {"dims": (0,), "keepdim": False})
        return g, y, (N, K), 1, lambda v: [math.fsum(v["p"][s * N * K + i] for s in range(4)) for i in range(N * K)]
    if name == "middle_mean_keepdim":  # a mean over a middle dim of 3, kept: (N, 3, K) -> (N, 1, K)
        x = g.inp("x", (N, 3, K))
        y = g.op("mean", (x,), (N, 1, K), {"dims": (1,), "keepdim": True})
        return g, y, (N, 1, K), 1, lambda v: [math.fsum(v["x"][(n * 3 + k) * K + c] for k in range(3)) / 3
                                              for n in range(N) for c in range(K)]
    raise KeyError(name)


CASES = ("topk_sum", "weighted_topk_sum", "split_k_sum", "middle_mean_keepdim")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            g, y, oshape, _, ref = _case(name)
            src = render_body(g.spec([y]), _lowerings()).source.replace(FUNC, "body")
            lib = _host_lib(tmp_path_factory.mktemp(name), HARNESS + EXTRA % _thread_per_output() + src + RUN)
            lib.st4.restype = ctypes.c_longlong
            cache[name] = (g, y, oshape, ref, src, lib)
        return cache[name]

    return get


def _run(g, lib, oshape, lo, hi):
    bufs, flat = random_inputs(g, 11)
    n_out = math.prod(oshape)
    out = (ctypes.c_float * n_out)(*([float("nan")] * n_out))
    ptrs = (ctypes.c_void_p * (len(bufs) + 1))(*[ctypes.addressof(b) for b in bufs + [out]])
    lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * (8 - len(lo)))), (ctypes.c_int * 8)(*(hi + [0] * (8 - len(hi)))))
    return list(out), flat, lib.vec4(), lib.st4()


def _inside(oshape, lo, hi):
    st = [math.prod(oshape[d + 1:]) for d in range(len(oshape))]
    return [all(lo[d] <= (i // st[d]) % oshape[d] < hi[d] for d in range(len(oshape))) for i in range(math.prod(oshape))]


@pytest.mark.parametrize("name", CASES)
def test_short_reductions_take_the_vector_path_on_row_tiles_with_the_bits_of_the_thread_loop(built, name):
    g, y, oshape, ref, src, lib = built(name)
    assert "n4_ = " in src and "latch::gst4(" in src  # the vector path, the thread loop beside it
    assert "latch::reduce_thread_per_output<" in src
    rows = [0] * len(oshape), list(oshape)
    rows[0][0], rows[1][0] = 3, N - 5  # a row tile: one contiguous range of the output
    box = [list(rows[0]), list(rows[1])]
    box[0][-1], box[1][-1] = 1, K - 2  # not contiguous: the thread per output loop
    got, flat, vec, st4 = _run(g, lib, oshape, *rows)
    want = ref(flat)
    inside = _inside(oshape, *rows)
    n_in = sum(inside)
    R = math.prod(next(x for x in g.vals if x.name == g.ins[0]).shape) // math.prod(oshape)
    assert st4 == n_in // 4  # every output through one 16-byte store
    # every row of every group: one 16-byte access (the weight is not one), plus the register loads
    # clamped to the tile's last group (the threads past its end, and the pipeline's loads after the
    # last iteration: U groups x R rows per thread at most, reading valid addresses, values unused)
    U = max(1, lower_reduce.SHORT_LOADS // R)
    assert R * n_in // 4 <= vec <= R * n_in // 4 + 2 * U * R * 256
    for i, ok in enumerate(inside):
        if ok:
            assert got[i] == pytest.approx(want[i], rel=1e-6, abs=1e-6), i
        else:
            assert math.isnan(got[i]), i
    got_box, _, vec_box, st4_box = _run(g, lib, oshape, *box)
    assert vec_box == 0 and st4_box == 0  # the thread loop: element by element
    inside_box = _inside(oshape, *box)
    assert sum(inside_box) > 0
    for i, ok in enumerate(inside_box):
        if ok:
            assert struct.pack("f", got_box[i]) == struct.pack("f", got[i]), i  # the same bits
        else:
            assert math.isnan(got_box[i]), i


def test_a_short_reduction_over_the_innermost_dim_keeps_the_thread_loop():
    """A sum over the last dim (the kept dims are not innermost): consecutive outputs are not
    consecutive in memory, so no 16-byte groups of outputs; the thread per output loop alone."""
    g = G()
    x = g.inp("x", (N, 4))
    y = g.op("sum", (x,), (N,), {"dims": (1,), "keepdim": False})
    src = render_body(g.spec([y]), _lowerings()).source
    assert "n4_ = " not in src and "latch::reduce_thread_per_output<double, latch::SumOp>(n_out, 4LL," in src


def test_the_top2_sums_of_awkward_pairs_keep_the_bits_of_the_double_sum(built):
    """The vector path and the thread loop give the same bits for pairs that stress a sum: signed
    zeros, subnormals, exponents far apart, ties at FP32's rounding, overflow to infinity (both
    start from the identity and add in index order in double, then round to FP32)."""
    g, y, oshape, ref, src, lib = built("topk_sum")
    f32 = lambda a: struct.unpack("f", struct.pack("f", a))[0]  # noqa: E731
    tiny = struct.unpack("f", struct.pack("I", 1))[0]  # the smallest subnormal
    pairs = [(-0.0, -0.0), (-0.0, 0.0), (0.0, -0.0), (tiny, tiny), (tiny, -tiny), (1.0, 2.0 ** -30),
             (1.0, 2.0 ** -24), (1.0, 3 * 2.0 ** -25), (1.0 + 2.0 ** -23, 2.0 ** -24), (-1.0, -(2.0 ** -24)),
             (3.0e38, 3.0e38), (-3.0e38, -3.0e38), (2.0 ** 100, -(2.0 ** 70)), (1.5, -1.5),
             (f32(1.0 / 3.0), f32(2.0 ** -26 / 3.0)), (float("inf"), 1.0), (float("inf"), float("-inf"))]
    rng = random.Random(5)
    x = [0.0] * (2 * N * K)
    for n in range(N):
        for c in range(K):
            a, b = pairs[rng.randrange(len(pairs))]
            x[(2 * n) * K + c], x[(2 * n + 1) * K + c] = f32(a), f32(b)
    buf = (ctypes.c_float * len(x))(*x)
    outs = []
    for lo, hi in (([0, 0], [N, K]), ([0, 1], [N, K - 1])):  # row tile: vector path; box: thread loop
        out = (ctypes.c_float * (N * K))(*([float("nan")] * (N * K)))
        ptrs = (ctypes.c_void_p * 2)(ctypes.addressof(buf), ctypes.addressof(out))
        lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * 6)), (ctypes.c_int * 8)(*(hi + [0] * 6)))
        outs.append(list(out))
    # the row tile only (the box runs the loop); the loads clamped to the last group as above
    U = max(1, lower_reduce.SHORT_LOADS // 2)
    assert lib.st4() == N * K // 4 and 2 * N * K // 4 <= lib.vec4() <= 2 * N * K // 4 + 2 * U * 2 * 256
    for i in range(N * K):
        if 1 <= i % K < K - 1:
            assert struct.pack("f", outs[0][i]) == struct.pack("f", outs[1][i]), (i, x[(i // K) * 2 * K + i % K])
