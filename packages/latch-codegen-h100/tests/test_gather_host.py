"""The gathers' row path (lower_indexing.py ``_row_gather``), compiled as HOST C++ and run with one
host thread per GPU thread: the 32 lanes of each warp run concurrently and meet in ``__shfl_sync``
(a barrier per shuffle, so a shuffle that not every lane of a warp reaches shows as a deadlock,
reported instead of hanging). Checks, without a GPU, what the chunked index loads and the per-step
shuffles must keep: every element of the tile is the bits of its source row (BF16 and FP32 rows,
ragged tiles, tiles not starting at row 0, odd widths where rows start misaligned, column tiles,
rows over two dims, an index_select along dim 1, block-wide rows, a converting gather), nothing
outside the tile is written, the 16-byte accesses are aligned (the harness aborts otherwise) and
taken where the rows are aligned, an index out of range is reported (and its row copied from row 0),
and the L2 prefetches stay inside gathered rows and cover every row from each warp's second step on."""

from __future__ import annotations

import ctypes
import math
import random
import re
import shutil
import struct
import subprocess

import pytest

from latch_codegen_h100.bodies import FUNC, group_spec, render_body
from latch_codegen_h100.codegen import _lowerings
from latch_codegen_h100.lower_indexing import _row_plan
from latch_codegen_h100.lowering import Operand
from latch_core.ir import BATCH, Graph, Group, Node, Value
from latch_core.sections import FusionGroup

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

HARNESS = r"""
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __noinline__
#define LATCH_THREADS 256
struct uint4 { unsigned x, y, z, w; };
struct Dim3 { unsigned x; };
static thread_local Dim3 threadIdx;
struct __nv_bfloat16 { uint16_t b; };
static inline float bf2f(__nv_bfloat16 v) { uint32_t u = (uint32_t)v.b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline __nv_bfloat16 f2bf(float f) {  // round to nearest even (no NaN inputs here)
  uint32_t u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); __nv_bfloat16 r; r.b = (uint16_t)(u >> 16); return r;
}
static std::mutex mu;
static long long vec_loads = 0, vec_stores = 0, reports = 0, report_a = 0, report_b = 0, report_code = 0;
static int deadlock = 0;
static std::vector<uintptr_t> pf_log;
// a warp: the barrier its lanes meet at in every shuffle, and the slots they exchange through
struct Warp {
  std::mutex m; std::condition_variable cv; int count = 0; long long gen = 0; long long slot[32];
  void wait() {
    std::unique_lock<std::mutex> l(m);
    const long long g = gen;
    if (++count == 32) { count = 0; ++gen; cv.notify_all(); return; }
    if (!cv.wait_for(l, std::chrono::seconds(5), [&] { return gen != g; })) { deadlock = 1; count = 0; ++gen; cv.notify_all(); }
  }
};
static thread_local Warp* my_warp;
template <class T> inline T __shfl_sync(unsigned mask, T v, int src) {
  if (mask != 0xffffffffu || src < 0 || src >= 32) abort();
  const int lane = threadIdx.x % 32;
  my_warp->slot[lane] = (long long)v;
  my_warp->wait();
  const T r = (T)my_warp->slot[src];
  my_warp->wait();
  return r;
}
inline uint4 __ldcg(const uint4* p) {
  if (reinterpret_cast<uintptr_t>(p) & 15) abort();
  { std::lock_guard<std::mutex> l(mu); ++vec_loads; }
  return *p;
}
inline void __stcg(uint4* p, uint4 v) {
  if (reinterpret_cast<uintptr_t>(p) & 15) abort();
  { std::lock_guard<std::mutex> l(mu); ++vec_stores; }
  *p = v;
}
namespace latch {
typedef long long i64;
enum { ERR_INDEX_RANGE = 4 };
struct Task { int32_t body, task, group, ndim, op_begin, op_count, tmap, dep; int32_t lo[8]; int32_t hi[8]; };
struct Ctx { const Task* t; char* const* ops; };
template <class S> struct Compute { typedef S type; };
template <> struct Compute<__nv_bfloat16> { typedef float type; };
template <class S> inline typename Compute<S>::type ld(const S* p, i64 i) { return p[i]; }
template <> inline float ld<__nv_bfloat16>(const __nv_bfloat16* p, i64 i) { return bf2f(p[i]); }
template <class S, class V> inline void st(S* p, i64 i, V v) { p[i] = (S)v; }
template <> inline void st<__nv_bfloat16, float>(__nv_bfloat16* p, i64 i, float v) { p[i] = f2bf(v); }
template <class S> inline bool aligned4(const S* p, i64 i) {
  return ((reinterpret_cast<uintptr_t>(p + i)) & (4 * sizeof(S) - 1)) == 0;
}
template <class S> inline void ld4(const S* p, i64 i, typename Compute<S>::type (&r)[4]) {
  if (!aligned4(p, i)) abort();
  { std::lock_guard<std::mutex> l(mu); ++vec_loads; }
  for (int j = 0; j < 4; ++j) r[j] = ld(p, i + j);
}
template <class S, class V> inline void st4(S* p, i64 i, const V (&v)[4]) {
  if (!aligned4(p, i)) abort();
  { std::lock_guard<std::mutex> l(mu); ++vec_stores; }
  for (int j = 0; j < 4; ++j) st<S, V>(p, i + j, v[j]);
}
template <class S> inline void gpf(const S* p, i64 i) {
  std::lock_guard<std::mutex> l(mu); pf_log.push_back(reinterpret_cast<uintptr_t>(p + i));
}
}  // namespace latch
inline void latch_report(int code, long long a, long long b) {
  std::lock_guard<std::mutex> l(mu);
  if (reports++ == 0) { report_code = code; report_a = a; report_b = b; }
}
"""

RUNNER = r"""
extern "C" int run(char** ops, const int* lo, const int* hi) {
  latch::Task t{};
  for (int d = 0; d < 8; ++d) { t.lo[d] = lo[d]; t.hi[d] = hi[d]; }
  latch::Ctx c{&t, ops};
  vec_loads = vec_stores = reports = 0; deadlock = 0; pf_log.clear();
  std::vector<Warp> warps(LATCH_THREADS / 32);
  std::vector<std::thread> th;
  for (unsigned k = 0; k < LATCH_THREADS; ++k)
    th.emplace_back([&, k] { threadIdx.x = k; my_warp = &warps[k / 32]; body(c); });
  for (auto& x : th) x.join();
  return deadlock;
}
extern "C" long long counter(int which) {
  const long long v[] = {vec_loads, vec_stores, reports, report_code, report_a, report_b, (long long)pf_log.size()};
  return v[which];
}
extern "C" long long prefetches(uintptr_t* out, long long cap) {
  for (long long k = 0; k < (long long)pf_log.size() && k < cap; ++k) out[k] = pf_log[k];
  return (long long)pf_log.size();
}
"""

SIZE = {"f32": 4, "bf16": 2, "i64": 8}
CT = {"f32": ctypes.c_float, "bf16": ctypes.c_uint16, "i64": ctypes.c_int64}


def _body(op, x_shape, xd, idx_shape, out_shape, od, dim=None, tmp=None):
    vals = [Value("x", x_shape, xd, BATCH), Value("idx", idx_shape, "i64", BATCH), Value("y", out_shape, od)]
    attrs = {} if dim is None else {"dim": dim}
    g = Graph("p", vals, [Node("n", op, ("x", "idx"), ("y",), attrs)], (Group("batch", ("x", "idx")),),
              (Group("metrics", ("y",)),))
    spec = group_spec(g, FusionGroup(0, ["n"], ("x", "idx"), ("y",), "y", "k"))
    src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
    assert "// row path" in src
    (tmp / "b.cpp").write_text(HARNESS + src + RUNNER)
    subprocess.run(["g++", "-O1", "-std=c++17", "-w", "-shared", "-fPIC", "-pthread", str(tmp / "b.cpp"), "-o",
                    str(tmp / "b.so")], check=True)
    lib = ctypes.CDLL(str(tmp / "b.so"))
    lib.counter.restype = ctypes.c_longlong
    lib.prefetches.restype = ctypes.c_longlong
    return lib, src


def _bits_bf16(f: float) -> int:
    u = struct.unpack("<I", struct.pack("<f", f))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


class Case:
    """One gather over fresh buffers (x's and out's element 0 ``shift`` elements past a 16-byte
    boundary): runs the tile [lo, hi) and checks the output bits against Python's gather."""

    def __init__(self, op, x_shape, xd, idx_shape, out_shape, od, dim, tmp):
        self.op, self.x_shape, self.xd, self.idx_shape, self.out_shape, self.od, self.dim = (
            op, x_shape, xd, idx_shape, out_shape, od, dim)
        self.lib, self.src = _body(op, x_shape, xd, idx_shape, out_shape, od, dim, tmp)

    def run(self, lo, hi, idx=None, shift=0, seed=0):
        rng = random.Random(seed)
        nx, no, ni = math.prod(self.x_shape), math.prod(self.out_shape), math.prod(self.idx_shape)
        xbuf = (CT[self.xd] * (nx + 8))()
        obuf = (CT[self.od] * (no + 8))()
        ibuf = (ctypes.c_int64 * ni)()
        bound = self.x_shape[0 if self.dim is None else self.dim]
        idx = idx if idx is not None else [rng.randrange(bound) for _ in range(ni)]
        for i, t in enumerate(idx):
            ibuf[i] = t
        if self.xd == "f32":
            xs = [rng.uniform(-4, 4) for _ in range(nx)]
        else:
            xs = [rng.randrange(1, 0x7F00) for _ in range(nx)]  # BF16 bit patterns (finite)
        for i, v in enumerate(xs):
            xbuf[shift + i] = v
        xs = [xbuf[shift + i] for i in range(nx)]  # as stored (FP32 rounding)
        sentinel = 0x5A5A if self.od == "bf16" else -7.25
        for i in range(no + 8):
            obuf[i] = sentinel
        ops = (ctypes.c_char_p * 3)(ctypes.cast(ctypes.byref(xbuf, shift * SIZE[self.xd]), ctypes.c_char_p),
                                    ctypes.cast(ibuf, ctypes.c_char_p),
                                    ctypes.cast(ctypes.byref(obuf, shift * SIZE[self.od]), ctypes.c_char_p))
        lo8 = (ctypes.c_int * 8)(*lo, *([0] * (8 - len(lo))))
        hi8 = (ctypes.c_int * 8)(*hi, *([0] * (8 - len(hi))))
        assert self.lib.run(ops, lo8, hi8) == 0, "a shuffle not reached by every lane of a warp (deadlock)"
        self.xaddr = ctypes.addressof(xbuf) + shift * SIZE[self.xd]
        # the expected output: per out coordinate, the x element its index picks (out-of-range -> 0)
        ost = [math.prod(self.out_shape[d + 1:]) for d in range(len(self.out_shape))]
        xst = [math.prod(self.x_shape[d + 1:]) for d in range(len(self.x_shape))]
        ist = [math.prod(self.idx_shape[d + 1:]) for d in range(len(self.idx_shape))]
        bad, rows = [], {}
        for o in range(no):
            ys = [(o // ost[d]) % self.out_shape[d] for d in range(len(self.out_shape))]
            inside = all(lo[d] <= ys[d] < hi[d] for d in range(len(ys)))
            got = obuf[shift + o]
            if not inside:
                if got != sentinel:
                    bad.append(f"out {ys} outside the tile written")
                continue
            if self.op == "latch::embedding":
                t = idx[sum(ys[d] * ist[d] for d in range(len(ys) - 1))]
                t = t if 0 <= t < bound else 0
                xo = t * self.x_shape[1] + ys[-1]
                rows[tuple(ys[:-1])] = t
            else:
                t = idx[ys[self.dim]]
                t = t if 0 <= t < bound else 0
                xc = list(ys)
                xc[self.dim] = t
                xo = sum(c * s for c, s in zip(xc, xst))
                rows[tuple(ys[:self.dim + 1])] = xo - xo % xst[self.dim]
            want = _bits_bf16(xs[xo]) if (self.xd, self.od) == ("f32", "bf16") else xs[xo]
            if got != want:
                bad.append(f"out {ys}: {got!r} != {want!r}")
        assert not bad, f"{len(bad)} wrong: " + "; ".join(bad[:5])
        return self

    def counter(self, k):
        return self.lib.counter(k)

    def prefetched(self):
        cap = 1 << 20
        out = (ctypes.c_size_t * cap)()
        n = self.lib.prefetches(out, cap)
        return list(out[:n])


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    cache = {}

    def get(*key):
        if key not in cache:
            cache[key] = Case(*key, tmp_path_factory.mktemp("g"))
        return cache[key]

    return get


IS = "latch::index_select"


@pytest.mark.parametrize("xd", ["bf16", "f32"])
def test_rows_of_768_over_many_chunks_copy_the_bits(case, xd):
    """700 gathered rows, the tile [13, 690): several chunks of indices per warp, a ragged last step."""
    c = case(IS, (64, 768), xd, (700,), (700, 768), xd, 0)
    c.run((13, 0), (690, 768))
    vw = 16 // SIZE[xd]
    assert c.counter(0) == 677 * 768 // vw and c.counter(1) == 677 * 768 // vw  # every row by 16-byte copies
    assert c.counter(2) == 0


def test_the_small_tile_of_sixteen_rows(case):
    """TinyMoE at 2 x 1024 tokens: tasks of 16 rows (one step per warp, no prefetch)."""
    c = case(IS, (64, 768), "bf16", (4096,), (4096, 768), "bf16", 0)
    c.run((160, 0), (176, 768))
    assert c.counter(0) == 16 * 96 and c.counter(6) == 0


def test_odd_widths_misaligned_rows_and_column_tiles(case):
    """771 BF16 columns: rows start misaligned every other row (those steps copy element by element),
    a 3-element tail; a column tile from 5 (the run's start misaligned) and from 8 (aligned)."""
    c = case(IS, (50, 771), "bf16", (300,), (300, 771), "bf16", 0)
    c.run((0, 0), (300, 771))
    assert c.counter(0) > 0  # steps whose rows are all aligned still copy 16 bytes at a time
    c.run((3, 5), (290, 700), seed=1)
    c.run((3, 8), (290, 700), seed=2)
    c.run((0, 0), (300, 771), shift=1, seed=3)  # x and out misaligned from element 0


def test_rows_over_two_dims_and_an_index_select_along_dim_one(case):
    e = case("latch::embedding", (40, 96), "f32", (3, 50), (3, 50, 96), "f32", None)
    e.run((0, 0, 0), (3, 50, 96))
    e.run((1, 7, 0), (3, 41, 96), seed=1)
    s = case(IS, (8, 6, 40), "f32", (5,), (8, 5, 40), "f32", 1)
    s.run((0, 0, 0), (8, 5, 40))
    s.run((2, 1, 0), (7, 4, 40), seed=1)


def test_block_wide_rows_and_a_converting_gather(case):
    b = case(IS, (6, 4102), "f32", (9,), (9, 4102), "f32", 0)
    assert "the block per row" in b.src
    b.run((0, 0), (9, 4102))
    b.run((2, 3), (8, 4100), seed=1)
    cv = case(IS, (64, 768), "f32", (300,), (300, 768), "bf16", 0)
    cv.run((0, 0), (300, 768))
    assert cv.counter(0) == 300 * 192


def test_an_index_out_of_range_is_reported_and_its_row_copied_from_row_0(case):
    c = case(IS, (64, 768), "bf16", (700,), (700, 768), "bf16", 0)
    idx = [random.Random(5).randrange(64) for _ in range(700)]
    idx[400], idx[401] = 99, -1
    c.run((0, 0), (700, 768), idx=idx)
    assert c.counter(2) == 2 and c.counter(3) == 4 and c.counter(4) in (99, -1) and c.counter(5) == 64
    e = case("latch::embedding", (40, 96), "f32", (3, 50), (3, 50, 96), "f32", None)
    idx = [random.Random(6).randrange(40) for _ in range(150)]
    idx[77] = 40
    e.run((0, 0, 0), (3, 50, 96), idx=idx)
    assert (e.counter(2), e.counter(4), e.counter(5)) == (1, 40, 40)


@pytest.mark.parametrize("xd", ["bf16", "f32"])
def test_the_rows_ahead_are_prefetched_inside_the_rows(case, xd):
    """Every prefetch lies in a gathered row's bytes, and every 128-byte line of every row a warp copies
    from its PF'th step on is prefetched (PF steps ahead; the indices a permutation, so no row's lines
    are prefetched on behalf of another)."""
    n = 700
    c = case(IS, (n, 768), xd, (n,), (n, 768), xd, 0)
    pf_steps = int(re.search(r"the rows (\d+) step\(s\) ahead to L2", c.src).group(1))
    idx = list(range(n))
    random.Random(3).shuffle(idx)
    lo, hi = 13, 690
    c.run((lo, 0), (hi, 768), idx=idx)
    row = 768 * SIZE[xd]
    x0 = c.xaddr
    pf = c.prefetched()
    assert pf
    tile_rows = {idx[r] for r in range(lo, hi)}
    for a in pf:
        assert x0 <= a < x0 + n * row and (a - x0) // row in tile_rows, f"prefetch {a:#x} outside the gathered rows"
    _, _, R, _, _ = _row_plan(Operand("p", (1, 768), xd), Operand("p", (1, 768), xd), 768)
    lines = {a // 128 for a in pf}
    for r in range(8 * R * pf_steps, hi - lo):  # the tile's rows from each warp's PF'th step
        t = idx[lo + r]
        want = set(range((x0 + t * row) // 128, (x0 + (t + 1) * row - 1) // 128 + 1))
        assert want <= lines, f"row {r} (x row {t}): {len(want - lines)} lines not prefetched"
