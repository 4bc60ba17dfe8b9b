"""The column and row paths of the reductions (lower_reduce ``column_statements``: sums, means and
maxima over the leading dims, a warp's lanes over consecutive outputs; ``rows_statements``: a warp
per row with the row in registers, several rows at once), compiled as HOST C++ and run on 256 host
threads with real barriers for ``latch::block_sync`` and the warp's shuffles: every output of the
tile is the reduction of its column or row, in a fixed order (two runs give the same bits),
nothing else written."""

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
#include <cstdlib>
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
static std::barrier<>* wbar_[8];
static double wbuf_[8][32];
static long long vec4_ = 0;
template <class Op, class T> T warp_reduce(T v) {  // the xor butterfly of __shfl_xor_sync, lane by lane
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  wbuf_[w][l] = (double)v;
  wbar_[w]->arrive_and_wait();
  T x[32];
  for (int i = 0; i < 32; ++i) x[i] = (T)wbuf_[w][i];
  for (int o = 16; o > 0; o >>= 1) {
    T y[32];
    for (int i = 0; i < 32; ++i) y[i] = Op::apply(x[i], x[i ^ o]);
    for (int i = 0; i < 32; ++i) x[i] = y[i];
  }
  wbar_[w]->arrive_and_wait();
  return x[l];
}
template <class S> inline bool aligned4(const S* p, i64 i) {
  return ((reinterpret_cast<uintptr_t>(p + i)) & (4 * sizeof(S) - 1)) == 0;
}
template <class S> inline void gld4(const S* p, i64 i, S (&r)[4]) {
  if (!aligned4(p, i)) abort();
  __atomic_add_fetch(&vec4_, 1, __ATOMIC_RELAXED);
  for (int j = 0; j < 4; ++j) r[j] = p[i + j];
}
// the line-head L2 prefetch (lower_reduce's short path): addresses logged, no data moved
static uintptr_t pf4_log_[1 << 16];
static long long pf4_n_ = 0;
template <class S> inline void gpf4(const S* p, i64 i) {
  if ((reinterpret_cast<uintptr_t>(p + i) & 127) >= 4 * sizeof(S)) return;
  const long long k = __atomic_fetch_add(&pf4_n_, 1, __ATOMIC_RELAXED);
  if (k < (long long)(sizeof(pf4_log_) / sizeof(pf4_log_[0]))) pf4_log_[k] = reinterpret_cast<uintptr_t>(p + i);
}
template <class Acc, class Op, class... A> inline void reduce_warp_per_output(A...) { abort(); }  // the test takes the vector path
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
    if name == "sum_rows_of_product_vec":  # RMSNorm backward's dw = sum over rows of dy * x * r: 16-byte columns
        R, K = 300, 72
        a, b, r = g.inp("a", (R, K)), g.inp("b", (R, K)), g.inp("r", (R, 1))
        y = g.op("sum", (g.op("mul", (g.op("mul", (a, b), (R, K)), r), (R, K)),), (K,), {"dims": (0,), "keepdim": False})
        return g, y, (K,), lambda v: [math.fsum(v["a"][i * K + k] * v["b"][i * K + k] * v["r"][i] for i in range(R))
                                      for k in range(K)]
    if name == "amax_rows_vec":  # a plain column reduction, kept dim a multiple of four
        R, K = 77, 40
        a = g.inp("a", (R, K))
        y = g.op("amax", (a,), (K,), {"dims": (0,), "keepdim": False})
        return g, y, (K,), lambda v: [max(v["a"][r * K + k] for r in range(R)) for k in range(K)]
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
    if name == "row_sum_of_squares":  # a (T, 768) row: six groups of four per lane, one row per warp
        T, K = 37, 768
        a = g.inp("a", (T, K))
        y = g.op("sum", (g.op("mul", (a, a), (T, K)),), (T,), {"dims": (1,), "keepdim": False})
        return g, y, (T,), lambda v: [math.fsum(v["a"][t * K + k] ** 2 for k in range(K)) for t in range(T)]
    if name == "row_mean_short":  # (T, 64): half the lanes idle, four rows per warp at once
        T, K = 45, 64
        a = g.inp("a", (T, K))
        y = g.op("mean", (a,), (T, 1), {"dims": (1,), "keepdim": True})
        return g, y, (T, 1), lambda v: [math.fsum(v["a"][t * K:(t + 1) * K]) / K for t in range(T)]
    if name == "row_amax":
        T, K = 21, 260
        a = g.inp("a", (T, K))
        y = g.op("amax", (a,), (T,), {"dims": (1,), "keepdim": False})
        return g, y, (T,), lambda v: [max(v["a"][t * K:(t + 1) * K]) for t in range(T)]
    if name == "row_mean_broadcast_prologue":  # RMSNorm backward's mean(dy * w * x), a (K,) weight
        T, K = 19, 96
        dy, w, x = g.inp("dy", (T, K)), g.inp("w", (K,)), g.inp("x", (T, K))
        y = g.op("mean", (g.op("mul", (g.op("mul", (dy, w), (T, K)), x), (T, K)),), (T, 1),
                 {"dims": (1,), "keepdim": True})
        return g, y, (T, 1), lambda v: [math.fsum(v["dy"][t * K + k] * v["w"][k] * v["x"][t * K + k]
                                                  for k in range(K)) / K for t in range(T)]
    if name == "row_sum_rstd_prologue":  # sum(x * r) over rows with a (T, 1) statistic: one load per four
        T, K = 23, 128
        x, r = g.inp("x", (T, K)), g.inp("r", (T, 1))
        y = g.op("sum", (g.op("mul", (x, r), (T, K)),), (T,), {"dims": (1,), "keepdim": False})
        return g, y, (T,), lambda v: [math.fsum(v["x"][t * K + k] * v["r"][t] for k in range(K)) for t in range(T)]
    raise KeyError(name)


# The entry points of a host build: run(operands, tile lo, tile hi) runs the body on LATCH_THREADS
# threads (the block barrier and the per-warp barriers of HARNESS), vec4() counts 16-byte accesses.
RUN = r"""
extern "C" void run(char** ops, const int* lo, const int* hi) {
  latch::Task t;
  for (int d = 0; d < 8; ++d) { t.lo[d] = lo[d]; t.hi[d] = hi[d]; }
  static double smem[1024];
  latch::Ctx c{&t, ops, (char*)smem};
  std::barrier<> b(LATCH_THREADS);
  bar_ = &b;
  std::vector<std::barrier<>*> wb;
  for (int w = 0; w < 8; ++w) wb.push_back(latch::wbar_[w] = new std::barrier<>(32));
  std::vector<std::thread> th;
  for (unsigned k = 0; k < LATCH_THREADS; ++k) th.emplace_back([&c, k] { threadIdx.x = k; body(c); });
  for (auto& x : th) x.join();
  for (auto* x : wb) delete x;
}
extern "C" long long vec4() { long long v = latch::vec4_; latch::vec4_ = 0; return v; }
extern "C" long long prefetches(uintptr_t* out, long long cap) {
  const long long n = latch::pf4_n_;
  for (long long k = 0; k < n && k < cap && k < (1 << 16); ++k) out[k] = latch::pf4_log_[k];
  latch::pf4_n_ = 0;
  return n;
}
"""


def _host_lib(tmp_path, code: str):
    """``code`` compiled with g++ into a shared library, loaded (``vec4`` returns a long long)."""
    (tmp_path / "b.cpp").write_text(code)
    subprocess.run(["g++", "-O1", "-std=c++20", "-w", "-shared", "-fPIC", "-pthread", str(tmp_path / "b.cpp"), "-o",
                    str(tmp_path / "b.so")], check=True)
    lib = ctypes.CDLL(str(tmp_path / "b.so"))
    lib.vec4.restype = ctypes.c_longlong
    return lib


VEC_COLUMNS = {"sum_rows_of_product_vec", "amax_rows_vec", "mean_lead_two"}  # kept dim a multiple of four


def random_inputs(g, seed: int):
    """(ctypes float buffers in ``g.ins`` order, their values by name): standard normal, FP32-exact."""
    rng = random.Random(seed)
    bufs, flat = [], {}
    for vname in g.ins:
        n = math.prod(next(x for x in g.vals if x.name == vname).shape)
        flat[vname] = [float(ctypes.c_float(rng.gauss(0, 1)).value) for _ in range(n)]
        bufs.append((ctypes.c_float * n)(*flat[vname]))
    return bufs, flat


@pytest.mark.parametrize("name", ["sum_rows_of_product", "sum_rows_of_product_vec", "amax_rows_vec",
                                  "mean_lead_two", "amax_rows", "row_sum_of_squares",
                                  "row_mean_short", "row_amax", "row_mean_broadcast_prologue",
                                  "row_sum_rstd_prologue"])
def test_column_and_row_reductions_reduce_in_a_fixed_order(tmp_path, name):
    g, y, oshape, ref = _case(name)
    spec = g.spec([y])
    src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
    row = name.startswith("row_")
    marker = "load4v(b_ + r_, v_[u_][k_])" if row else "cs_[warp_ * 32 + lane_]"
    assert marker in src and "atomic" not in src  # the row / column path, no atomics
    if name in VEC_COLUMNS:  # four consecutive columns per thread, 16-byte loads, and the scalar path beside it
        assert "load4(b_ + off(r_ + k_ * RW_), v_[k_])" in src
    lib = _host_lib(tmp_path, HARNESS + src + RUN)
    bufs, flat = random_inputs(g, 3)
    n_out = math.prod(oshape)
    # a tile of the outputs: [3, n - 2) along the one dim longer than 1 (off a multiple of four: the
    # vector column path does not apply), and for the vector cases [4, n - 4) (it does)
    (dim,) = [d for d, e in enumerate(oshape) if e > 1]
    want = ref(flat)
    for first, last in [(3, 2)] + ([(4, 4)] if name in VEC_COLUMNS else []):
        lo = [0] * len(oshape)
        hi = list(oshape)
        lo[dim], hi[dim] = first, oshape[dim] - last
        assert hi[dim] - lo[dim] >= 10
        runs, vecs = [], []
        for _ in range(2):
            out = (ctypes.c_float * n_out)(*([float("nan")] * n_out))
            ptrs = (ctypes.c_void_p * (len(bufs) + 1))(*[ctypes.addressof(b) for b in bufs + [out]])
            lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * (8 - len(lo)))), (ctypes.c_int * 8)(*(hi + [0] * (8 - len(hi)))))
            runs.append(list(out))
            vecs.append(lib.vec4())
        assert [struct.pack("f", a) for a in runs[0]] == [struct.pack("f", a) for a in runs[1]]  # the same bits
        if not row and first == 4:  # every row of every group of four columns: one 16-byte access per operand
            R = math.prod(next(x for x in g.vals if x.name == g.ins[0]).shape) // math.prod(oshape)
            n_vec = sum(1 for v in g.ins if math.prod(next(x for x in g.vals if x.name == v).shape) == R * n_out)
            assert vecs[0] == n_vec * R * (hi[dim] - lo[dim]) // 4
        elif not row:
            assert vecs[0] == 0  # the scalar column path
        for k in range(n_out):
            if lo[dim] <= k < hi[dim]:
                assert runs[0][k] == pytest.approx(want[k], rel=1e-5, abs=1e-5), k
            else:
                assert math.isnan(runs[0][k]), k


def test_a_row_reduction_with_a_broadcast_prologue_never_reads_the_unplaced_input():
    """mean(dy * w * x) over rows with a (K,) weight: the prologue is not flat, so the reduction
    reads through ``load`` (the prologue), never from its input's pointer (which has no memory)."""
    g = G()
    T, K = 16, 64
    dy, w, x = g.inp("dy", (T, K)), g.inp("w", (K,)), g.inp("x", (T, K))
    y = g.op("mean", (g.op("mul", (g.op("mul", (dy, w), (T, K)), x), (T, K)),), (T, 1), {"dims": (1,), "keepdim": True})
    src = render_body(g.spec([y]), _lowerings()).source
    assert "nullptr" not in src and "auto load = [&]" in src


def _device_template(name: str) -> str:
    """The text of template ``name`` in latch_reduce.cuh (the real device code), for the host."""
    from pathlib import Path

    import latch_ops

    text = (Path(latch_ops.__file__).parent / "cuda" / "latch_reduce.cuh").read_text()
    start = text.index("template", text.index("#define REDUCE_BLOCK_UNROLL"))
    start = text.rindex("#define REDUCE_BLOCK_UNROLL", 0, start)
    body_start = text.index(f"void {name}(", start)
    depth, i = 0, text.index("{", body_start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
        i += 1


def test_a_long_row_reduction_keeps_eight_loads_in_flight_and_sums_in_index_order(tmp_path):
    """A full reduction's second level (rows longer than BLOCK_THRESHOLD: the whole block on one
    row, latch_reduce.cuh ``reduce_rows_vec4_block``) issues eight 16-byte loads per thread before
    accumulating them; compiled from the header's own text on 256 host threads: every row right,
    the same bits twice, every element read once through the 16-byte access."""
    T, K = 3, 4 * 256 * 8 * 3 + 4 * 256 * 5 + 16  # three unrolled rounds, five single steps, a short one
    g = G()
    a = g.inp("a", (T, K))
    y = g.op("sum", (a,), (T,), {"dims": (1,), "keepdim": False})
    src = render_body(g.spec([y]), _lowerings()).source.replace(FUNC, "body")
    assert "latch::reduce_rows_vec4_block<double, latch::SumOp>" in src
    block = r"""
namespace latch {
template <class Acc, class Op, class... A> inline void reduce_block_per_output(A...) { abort(); }  // the vector path runs
static double bred_[256];
template <class Op, class T> T block_reduce(T v, T*) {  // thread order, on the host
  bred_[threadIdx.x] = (double)v;
  block_sync();
  T s = (T)bred_[0];
  for (int i = 1; i < LATCH_THREADS; ++i) s = Op::apply(s, (T)bred_[i]);
  block_sync();
  return s;
}
""" + _device_template("reduce_rows_vec4_block") + "\n}  // namespace latch\n"
    code = HARNESS + block + src + RUN
    assert "for (int k = 0; k < U; ++k) load4(b + r + S * k, v[k]);" in code
    lib = _host_lib(tmp_path, code)
    rng = random.Random(5)
    x = [float(ctypes.c_float(rng.gauss(0, 1)).value) for _ in range(T * K)]
    buf = (ctypes.c_float * (T * K))(*x)
    runs = []
    for _ in range(2):
        out = (ctypes.c_float * T)(*([float("nan")] * T))
        ptrs = (ctypes.c_void_p * 2)(ctypes.addressof(buf), ctypes.addressof(out))
        lib.run(ptrs, (ctypes.c_int * 8)(*([0] * 8)), (ctypes.c_int * 8)(*([T] + [0] * 7)))
        runs.append(list(out))
        assert lib.vec4() == T * K // 4
    assert [struct.pack("f", v) for v in runs[0]] == [struct.pack("f", v) for v in runs[1]]
    for t in range(T):
        assert runs[0][t] == pytest.approx(math.fsum(x[t * K:(t + 1) * K]), rel=1e-6, abs=1e-4), t
