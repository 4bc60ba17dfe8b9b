"""The column path of the reductions (lower_reduce ``column_statements``: sums, means and maxima
over the leading dims, a warp's lanes over consecutive outputs), compiled as HOST C++ and run on
256 host threads with a real barrier for ``latch::block_sync``: every output of the tile is the
reduction of its column, in a fixed order (two runs give the same bits), nothing else written."""

from __future__ import annotations

import ctypes
import math
import random
import shutil
import struct
import subprocess

import pytest

from latch_codegen_h100.bodies import FUNC, render_body
from latch_codegen_h100.codegen import _lowerings

from test_ilp_host import G

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

HARNESS = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __noinline__
#define LATCH_THREADS 256
static thread_local struct { unsigned x; } threadIdx;
static std::barrier<>* bar_;
namespace latch {
typedef long long i64;
struct Task { int32_t lo[8]; int32_t hi[8]; };
struct Ctx { const Task* t; char* const* ops; char* smem; };
template <class S> inline S ld(const S* p, i64 i) { return p[i]; }
template <class S, class V> inline void st(S* p, i64 i, V v) { p[i] = (S)v; }
inline void block_sync() { bar_->arrive_and_wait(); }
struct SumOp {
  template <class T> static T init() { return T(0); }
  template <class T> static T apply(T a, T b) { return a + b; }
};
struct MaxOp {
  template <class T> static T init() { return -INFINITY; }
  template <class T> static T apply(T a, T b) { return (a != a || a > b) ? a : b; }
};
}  // namespace latch
"""


def _case(name):
    g = G()
    if name == "sum_rows_of_product":  # dw = sum over rows of dy * x: a fused prologue
        R, K = 300, 70
        a, b = g.inp("a", (R, K)), g.inp("b", (R, K))
        y = g.op("sum", (g.op("mul", (a, b), (R, K)),), (K,), {"dims": (0,), "keepdim": False})
        return g, y, (K,), lambda v: [math.fsum(v["a"][r * K + k] * v["b"][r * K + k] for r in range(R)) for k in range(K)]
    if name == "mean_lead_two":  # mean over the two leading dims, keepdim
        A, B, K = 5, 41, 40
        a = g.inp("a", (A, B, K))
        y = g.op("mean", (a,), (1, 1, K), {"dims": (0, 1), "keepdim": True})
        return g, y, (1, 1, K), lambda v: [math.fsum(v["a"][i * K + k] for i in range(A * B)) / (A * B) for k in range(K)]
    if name == "amax_rows":
        R, K = 77, 33
        a = g.inp("a", (R, K))
        y = g.op("amax", (a,), (K,), {"dims": (0,), "keepdim": False})
        return g, y, (K,), lambda v: [max(v["a"][r * K + k] for r in range(R)) for k in range(K)]
    raise KeyError(name)


@pytest.mark.parametrize("name", ["sum_rows_of_product", "mean_lead_two", "amax_rows"])
def test_column_reductions_reduce_each_column_in_a_fixed_order(tmp_path, name):
    g, y, oshape, ref = _case(name)
    spec = g.spec([y])
    src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
    assert "cs_[warp_ * 32 + lane_]" in src and "atomic" not in src  # the column path, no atomics
    code = HARNESS + src + r"""
extern "C" void run(char** ops, const int* lo, const int* hi) {
  latch::Task t;
  for (int d = 0; d < 8; ++d) { t.lo[d] = lo[d]; t.hi[d] = hi[d]; }
  static double smem[256];
  latch::Ctx c{&t, ops, (char*)smem};
  std::barrier<> b(LATCH_THREADS);
  bar_ = &b;
  std::vector<std::thread> th;
  for (unsigned k = 0; k < LATCH_THREADS; ++k) th.emplace_back([&c, k] { threadIdx.x = k; body(c); });
  for (auto& x : th) x.join();
}
"""
    (tmp_path / "b.cpp").write_text(code)
    subprocess.run(["g++", "-O1", "-std=c++20", "-w", "-shared", "-fPIC", "-pthread", str(tmp_path / "b.cpp"), "-o",
                    str(tmp_path / "b.so")], check=True)
    lib = ctypes.CDLL(str(tmp_path / "b.so"))
    rng = random.Random(3)
    bufs, flat = [], {}
    for vname in g.ins:
        n = math.prod(next(x for x in g.vals if x.name == vname).shape)
        flat[vname] = [float(ctypes.c_float(rng.gauss(0, 1)).value) for _ in range(n)]
        bufs.append((ctypes.c_float * n)(*flat[vname]))
    n_out = math.prod(oshape)
    # a tile of the outputs: [3, n_out - 2) along the last dim
    lo = [0] * len(oshape)
    hi = list(oshape)
    lo[-1], hi[-1] = 3, oshape[-1] - 2
    want = ref(flat)
    runs = []
    for _ in range(2):
        out = (ctypes.c_float * n_out)(*([float("nan")] * n_out))
        ptrs = (ctypes.c_void_p * (len(bufs) + 1))(*[ctypes.addressof(b) for b in bufs + [out]])
        lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * (8 - len(lo)))), (ctypes.c_int * 8)(*(hi + [0] * (8 - len(hi)))))
        runs.append(list(out))
    assert [struct.pack("f", a) for a in runs[0]] == [struct.pack("f", a) for a in runs[1]]  # the same bits
    for k in range(n_out):
        if lo[-1] <= k < hi[-1]:
            assert runs[0][k] == pytest.approx(want[k], rel=1e-5, abs=1e-5), k
        else:
            assert math.isnan(runs[0][k]), k
