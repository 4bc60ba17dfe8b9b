"""The flat vector path of fused elementwise bodies (flat.py), compiled as HOST C++ and run thread
by thread (the body has no inter-thread communication, so 256 sequential "threads" compute what
256 concurrent ones do): every element of the tile is written exactly once with the right value,
nothing outside it is touched, the vector accesses are aligned (the harness aborts otherwise) and
taken when the operands are aligned, and unaligned tiles and tails fall back element by element.
This checks the index arithmetic of the generated text without a GPU, and the L2 prefetches of the
vector loop (``latch::gpf``, logged by the harness): inside the vector range, one per 128-byte line,
every line from the PREFETCH_AHEAD'th iteration on."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import random
import pytest

from latch_codegen_h100.bodies import FUNC, group_spec, render_body
from latch_codegen_h100.codegen import _lowerings
from latch_core.ir import BATCH, Graph, Group, Node, Value
from latch_core.sections import FusionGroup
from latch_codegen_h100.flat import PREFETCH_AHEAD

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

HARNESS = r"""
#include <cstdint>
#include <cstdlib>
#include <cmath>
#define __device__
#define __forceinline__ inline
#define __noinline__
#define LATCH_THREADS 256
static struct { unsigned x; } threadIdx;
namespace latch {
typedef long long i64;
struct Task { int32_t lo[8]; int32_t hi[8]; };
struct Ctx { const Task* t; char* const* ops; };
static long long vec_accesses = 0, stores = 0;
template <class S> inline S ld(const S* p, i64 i) { return p[i]; }
template <class S, class V> inline void st(S* p, i64 i, V v) { ++stores; p[i] = (S)v; }
template <class S> inline bool aligned4(const S* p, i64 i) {
  return ((reinterpret_cast<uintptr_t>(p + i)) & (4 * sizeof(S) - 1)) == 0;
}
template <class S> inline void ld4(const S* p, i64 i, S (&r)[4]) {
  if (!aligned4(p, i)) abort();
  ++vec_accesses;
  for (int j = 0; j < 4; ++j) r[j] = p[i + j];
}
template <class S, class V> inline void st4(S* p, i64 i, const V (&v)[4]) {
  if (!aligned4(p, i)) abort();
  ++vec_accesses;
  stores += 4;
  for (int j = 0; j < 4; ++j) p[i + j] = (S)v[j];
}
template <class S> inline long long peel4(const S* p) {
  const uintptr_t A = 4 * sizeof(S);
  return (long long)(((A - (reinterpret_cast<uintptr_t>(p) & (A - 1))) & (A - 1)) / sizeof(S));
}
// the global-space forms (latch_kernel.cuh) behave the same on the host
// the L2 prefetch moves no data: the host logs its addresses for the tests' bound checks
static uintptr_t pf_log[1 << 16];
static long long pf_n = 0;
template <class S> inline void gpf(const S* p, i64 i) {
  if (pf_n < (long long)(sizeof(pf_log) / sizeof(pf_log[0]))) pf_log[pf_n] = reinterpret_cast<uintptr_t>(p + i);
  ++pf_n;
}
// the line-head prefetch (fuse.py's row-tile path): logged as gpf when the group opens its line
template <class S> inline void gpf4(const S* p, i64 i) {
  if ((reinterpret_cast<uintptr_t>(p + i) & 127) < 4 * sizeof(S)) gpf(p, i);
}
template <class S> inline void gld4(const S* p, i64 i, S (&r)[4]) { ld4(p, i, r); }
template <class S, class V> inline void gst4(S* p, i64 i, const V (&v)[4]) { st4(p, i, v); }
namespace ew { inline float sqrt_(float x) { return std::sqrt(x); } }
}  // namespace latch
"""


# Every thread of a block runs the body in turn on one task's tile: ``run(ops, lo, hi)`` returns the
# 16-byte accesses made, ``stores()`` the elements stored.
RUNNER = r"""
extern "C" long long run(char** ops, const int* lo, const int* hi) {
  latch::Task t;
  for (int d = 0; d < 8; ++d) { t.lo[d] = lo[d]; t.hi[d] = hi[d]; }
  latch::Ctx c{&t, ops};
  latch::vec_accesses = 0;
  latch::stores = 0;
  latch::pf_n = 0;
  for (unsigned k = 0; k < LATCH_THREADS; ++k) { threadIdx.x = k; body(c); }
  return latch::vec_accesses;
}
extern "C" long long stores() { return latch::stores; }
extern "C" long long prefetches(uintptr_t* out, long long cap) {
  for (long long k = 0; k < latch::pf_n && k < cap; ++k) out[k] = latch::pf_log[k];
  return latch::pf_n;
}
"""


def host_library(code: str, d) -> ctypes.CDLL:
    """``code`` (a harness and a body named ``body``) with :data:`RUNNER`, compiled as host C++ in
    directory ``d`` and loaded."""
    (d / "b.cpp").write_text(code + RUNNER)
    subprocess.run(["g++", "-O1", "-std=c++17", "-w", "-shared", "-fPIC", str(d / "b.cpp"), "-o", str(d / "b.so")],
                   check=True)
    lib = ctypes.CDLL(str(d / "b.so"))
    lib.run.restype = ctypes.c_longlong
    lib.stores.restype = ctypes.c_longlong
    lib.prefetches.restype = ctypes.c_longlong
    return lib


def prefetched(lib) -> list[int]:
    """The addresses ``latch::gpf`` was called with in the last ``run``, in call order."""
    cap = 1 << 16
    out = (ctypes.c_size_t * cap)()
    n = lib.prefetches(out, cap)
    assert n <= cap, "more prefetches than the harness logs"
    return list(out[:n])


def check_prefetches(addrs: list[int], bases: list[int], vlo: int, vend: int, unroll: int, ahead: int,
                     size: int = 4) -> None:
    """The L2 prefetches of one task's vector loop over elements [vlo, vend) of inputs whose element
    0 is at byte address ``bases[k]``: each is the start of a group of four inside the range (never
    past it: the bound), no line of an input is prefetched twice (one thread per line), and every
    line lying wholly in what the loop reads from its ``ahead``'th iteration on (the groups from
    ahead * unroll * 256) is prefetched."""
    lines: list[list[int]] = [[] for _ in bases]
    for a in addrs:
        k = [k for k, b in enumerate(bases) if b + size * vlo <= a < b + size * vend]
        assert k, f"prefetch of {a:#x} outside every input's vector range"
        assert (a - bases[k[0]] - size * vlo) % (4 * size) == 0, "not a group's start"
        lines[k[0]].append(a // 128)
    for k, b in enumerate(bases):
        assert len(set(lines[k])) == len(lines[k]), "a line prefetched twice"
        first = b + size * (vlo + 4 * ahead * unroll * 256)
        want = set(range(-(-first // 128), (b + size * vend) // 128)) if ahead > 0 else set()
        assert want <= set(lines[k]), f"input {k}: {len(want - set(lines[k]))} lines not prefetched"

def _group(shape):
    """out = sqrt((x * s + y)^2 + 1) and t = x * s: two outputs, a scalar, the AdamW shape of body."""
    vals = [Value("x", shape, "f32", BATCH), Value("y", shape, "f32", BATCH), Value("s", (), "f32", BATCH)]
    nodes, k = [], 0

    def n(op, ins, attrs=None):
        nonlocal k
        k += 1
        vals.append(Value(f"v{k}", shape, "f32"))
        nodes.append(Node(f"n{k}", f"latch::{op}", ins, (f"v{k}",), attrs or {}))
        return f"v{k}"

    t = n("mul", ("x", "s"))
    u = n("add", (t, "y"))
    w = n("add", (n("mul", (u, u)),), {"scalar": 1.0})
    out = n("sqrt", (w,))
    g = Graph("p", vals, nodes, (Group("batch", ("x", "y", "s")),), (Group("metrics", (t, out)),))
    grp = FusionGroup(0, [x.name for x in nodes], ("x", "s", "y"), (t, out), out, "k")
    return g, grp


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """The body over ``shape`` compiled on the host, generated with ``PREFETCH_AHEAD = ahead``
    (default: the module's)."""
    from latch_codegen_h100 import flat

    libs = {}

    def get(shape, ahead=None):
        ahead = flat.PREFETCH_AHEAD if ahead is None else ahead
        if (shape, ahead) in libs:
            return libs[shape, ahead]
        g, grp = _group(shape)
        spec = group_spec(g, grp)
        saved, flat.PREFETCH_AHEAD = flat.PREFETCH_AHEAD, ahead
        try:
            src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
        finally:
            flat.PREFETCH_AHEAD = saved
        assert "latch::gld4(" in src  # the flat path was chosen
        assert ("latch::gpf(" in src) == (ahead > 0)
        libs[shape, ahead] = host_library(HARNESS + src, tmp_path_factory.mktemp("flat"))
        return libs[shape, ahead]

    return get


def _run(lib, shape, lo, hi, shift: int = 0, skew: int = 0, ahead=None):
    """Run one tile over fresh arrays (operands offset by ``shift`` elements from an aligned base, x by
    ``skew`` more);
    returns (t, out, expected t, expected out, vector accesses) as lists. ``_run.prefetch``: the
    prefetched addresses, the inputs' (x, y) element-0 addresses and the vector range the body
    takes (where x's tile start reaches 16 bytes, empty unless every operand is aligned there)."""
    n = math.prod(shape)
    rng = random.Random(0)
    bufs = [(ctypes.c_float * (n + 8))() for _ in range(5)]
    for b in bufs:  # ctypes arrays of floats are at least 16-byte aligned by the allocator
        assert ctypes.addressof(b) % 16 == 0
    x, s, y, t, out = bufs
    for i in range(n):
        x[shift + skew + i] = rng.gauss(0, 1)
        y[shift + i] = rng.gauss(0, 1)
        t[shift + i] = out[shift + i] = float("nan")
    s[0] = 0.75
    addr = [ctypes.addressof(b) + 4 * (0 if b is s else shift + (skew if b is x else 0)) for b in (x, s, y, t, out)]
    ptrs = (ctypes.c_void_p * 5)(*addr)
    lo8 = (ctypes.c_int * 8)(*(list(lo) + [0] * (8 - len(lo))))
    hi8 = (ctypes.c_int * 8)(*(list(hi) + [0] * (8 - len(hi))))
    vec = lib(shape, ahead).run(ptrs, lo8, hi8)
    _run.stores = lib(shape, ahead).stores()
    row = math.prod(shape[1:])
    start, end = lo[0] * row, hi[0] * row
    vlo = min(start + ((16 - (addr[0] + 4 * start) % 16) % 16) // 4, end)
    vend = vlo + (end - vlo) // 4 * 4 if skew == 0 else vlo
    _run.prefetch = (prefetched(lib(shape, ahead)), [addr[0], addr[2]], vlo, vend)
    xs = [x[shift + skew + i] for i in range(n)]
    ys = [y[shift + i] for i in range(n)]
    et = [v * 0.75 for v in xs]
    eo = [math.sqrt((a + b) * (a + b) + 1) for a, b in zip(et, ys)]
    return [t[shift + i] for i in range(n)], [out[shift + i] for i in range(n)], et, eo, vec


def _inside(shape, lo, hi):
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    return [all(lo[d] <= (i // strides[d]) % shape[d] < hi[d] for d in range(len(shape))) for i in range(math.prod(shape))]


@pytest.mark.parametrize("shape,lo,hi,shift", [
    ((1000,), (0,), (1000,), 0),          # one aligned 1-d tile: vector loop + no tail
    ((1003,), (0,), (1003,), 0),          # a tail of 3
    ((1003,), (5,), (998,), 0),           # a tile starting at an unaligned element: element by element
    ((1003,), (4,), (1003,), 1),          # aligned index, unaligned base pointers
    ((64, 48), (3, 0), (17, 48), 0),      # row tiles of a 2-d value (flat range rows * 48)
    ((64, 47), (3, 0), (17, 47), 0),      # an odd row length
    ((64, 48), (3, 5), (17, 40), 0),      # a column tile: the general (coordinate) path
    ((9000,), (0,), (9000,), 0),          # more than 6 x 4 x 256 elements: the loop goes round
    ((30011,), (2,), (30011,), 0),        # several rounds, a head of 2, a partial last round
    ((50001,), (3,), (50001,), 2),        # a head of 1, lines straddling runs of 8 threads, prefetches
])
def test_every_element_of_the_tile_once_and_nothing_else(lib, shape, lo, hi, shift):
    t, out, et, eo, vec = _run(lib, shape, lo, hi, shift)
    inside = _inside(shape, lo, hi)
    assert _run.stores == 2 * sum(inside)  # two outputs, each element stored exactly once
    for i, ins in enumerate(inside):
        if ins:
            assert t[i] == pytest.approx(et[i], rel=1e-6, abs=1e-6), i
            assert out[i] == pytest.approx(eo[i], rel=1e-6), i
        else:  # nothing outside the tile written
            assert math.isnan(t[i]) and math.isnan(out[i]), i
    row = math.prod(shape[1:])
    flat_tile = all(a == 0 and b == e for a, b, e in zip(lo[1:], hi[1:], shape[1:]))
    start = lo[0] * row
    if flat_tile and (hi[0] - lo[0]) * row >= 8:
        assert vec > 0  # the operands are aligned alike: after a head of < 4 elements the vector path ran
    if not flat_tile:
        assert vec == 0
    addrs, bases, vlo, vend = _run.prefetch
    if flat_tile:
        check_prefetches(addrs, bases, vlo, vend, 6, PREFETCH_AHEAD)
    else:  # the general path prefetches nothing
        assert addrs == []


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_the_prefetch_distance_moves_the_prefetches_and_only_them(lib, ahead):
    """Other distances (0: none at all) keep every prefetch inside the vector range and each line
    once, and compute the same values."""
    shape, lo, hi = (50001,), (3,), (50001,)
    t, out, et, eo, vec = _run(lib, shape, lo, hi, 2, ahead=ahead)
    assert _run.stores == 2 * (hi[0] - lo[0]) and vec > 0
    assert t[3:] == pytest.approx(et[3:], rel=1e-6, abs=1e-6) and out[3:] == pytest.approx(eo[3:], rel=1e-6)
    addrs, bases, vlo, vend = _run.prefetch
    assert (len(addrs) > 0) == (ahead > 0)
    check_prefetches(addrs, bases, vlo, vend, 6, ahead)


def test_a_line_is_16_groups_of_bf16_and_8_of_fp32():
    """One thread per 128-byte line: a BF16 input's groups of four are 8 bytes, so every 16th
    thread prefetches them, and an FP32 input's every 8th."""
    from latch_codegen_h100.flat import prefetch_lanes

    assert (prefetch_lanes("f32"), prefetch_lanes("bf16"), prefetch_lanes("f64")) == (8, 16, 4)
    for src_t, dst_t, guard in (("bf16", "f32", "(threadIdx.x & 15) == 0"), ("f32", "bf16", "(threadIdx.x & 7) == 0")):
        vals = [Value("x", (64, 768), src_t, BATCH), Value("y", (64, 768), dst_t)]
        g = Graph("p", vals, [Node("n", "latch::cast", ("x",), ("y",), {"dtype": dst_t})],
                  (Group("batch", ("x",)),), (Group("metrics", ("y",)),))
        src = render_body(group_spec(g, FusionGroup(0, ["n"], ("x",), ("y",), "y", "k")), _lowerings()).source
        pf = [ln for ln in src.splitlines() if "latch::gpf(" in ln]
        assert len(pf) == 1, src  # the one input, once in the unrolled loop
        assert guard in src, src


@pytest.mark.parametrize("shape,lo,hi", [((1003,), (5,), (998,)), ((64, 47), (3, 0), (17, 47))])
def test_operands_misaligned_differently_run_element_by_element(lib, shape, lo, hi):
    t, out, et, eo, vec = _run(lib, shape, lo, hi, 0, skew=1)
    inside = _inside(shape, lo, hi)
    assert vec == 0 and _run.stores == 2 * sum(inside)
    for i, ins in enumerate(inside):
        if ins:
            assert out[i] == pytest.approx(eo[i], rel=1e-6), i
        else:
            assert math.isnan(out[i]), i


def test_the_unroll_keeps_about_192_bytes_of_loads_per_thread_in_flight():
    from latch_codegen_h100.flat import flat_spec, unroll_for

    g, grp = _group((64, 48))
    flat = flat_spec(group_spec(g, grp), _lowerings())
    assert unroll_for(flat) == 6  # two FP32 full-shape inputs: 2 x 16 B per step, 6 steps


# --------------------------------------------------------------------------------------------
# AdamW with weight decay and the clip scale, as examples/_optim.py captures it (one fused group per
# parameter: p, g, m, v in, new p, m, v out IN PLACE, four per-task scalars): the flat body over a
# tile of a 2-d weight, run in place on the host.

ADAM_HARNESS = HARNESS.replace(
    "namespace ew { inline float sqrt_(float x) { return std::sqrt(x); } }",
    "namespace ew { inline float sqrt_(float x) { return std::sqrt(x); }\n"
    "inline float div_(float a, float b) { return a / b; }\n"
    "inline float rcp_(float a) { return 1.0f / a; } }")


def _adamw_group(shape):
    b1, b2, eps = 0.9, 0.999, 1e-8
    vals = [Value(n, shape, "f32", BATCH) for n in ("p", "g", "m", "v")]
    vals += [Value(n, (), "f32", BATCH) for n in ("coef", "step_size", "decay", "sqrt_bias2")]
    nodes, k = [], 0

    def n(op, ins, attrs=None, out=None):
        nonlocal k
        k += 1
        name = out or f"t{k}"
        vals.append(Value(name, shape, "f32"))
        nodes.append(Node(f"n{k}", f"latch::{op}", ins, (name,), attrs or {}))
        return name

    g = n("mul", ("g", "coef"))
    m2 = n("add", ("m", n("mul", (n("sub", (g, "m")),), {"scalar": 1 - b1})), out="new_m")
    v2 = n("add", (n("mul", ("v",), {"scalar": b2}), n("mul", (n("mul", (g,), {"scalar": 1 - b2}), g))), out="new_v")
    pd = n("mul", ("p", "decay"))
    denom = n("add", (n("div", (n("sqrt", (v2,)), "sqrt_bias2")),), {"scalar": eps})
    p2 = n("sub", (pd, n("div", (n("mul", ("step_size", m2)), denom))), out="new_p")
    ins = ("p", "g", "m", "v", "coef", "step_size", "decay", "sqrt_bias2")
    graph = Graph("adam", vals, nodes, (Group("batch", ins),), (Group("metrics", (m2, v2, p2)),))
    return graph, FusionGroup(0, [x.name for x in nodes], ins, (m2, v2, p2), p2, "k")


def test_adamw_takes_the_flat_path_in_place_with_three_groups_in_flight_and_branch_free_math(tmp_path):
    from latch_codegen_h100.flat import flat_spec, unroll_for

    shape = (40, 768)
    graph, grp = _adamw_group(shape)
    spec = group_spec(graph, grp, aliased=True)
    assert unroll_for(flat_spec(spec, _lowerings())) == 3  # 4 FP32 inputs x 16 B x 3 = 192 B per thread
    src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
    assert "latch::gld4(" in src and "latch::gst4(" in src
    # the divisions and the square root are the branch-free forms; 32-bit offsets in the vector loop
    assert src.count("latch::ew::div_(") >= 2 and "latch::ew::sqrt_(" in src and " / (" not in src.split("} else {")[0]
    assert "const int nq_" in src
    lib = host_library(ADAM_HARNESS + src, tmp_path)
    n = math.prod(shape)
    rng = random.Random(1)
    p, g, m, v = ([rng.gauss(0, s) for _ in range(n)] for s in (0.02, 1e-3, 1e-3, 1.0))
    v = [abs(x) * 1e-6 for x in v]
    coef, step_size, decay, sb2 = 0.07, 3e-4 / (1 - 0.9 ** 10), 1 - 3e-4 * 0.1, math.sqrt(1 - 0.999 ** 10)
    bufs = [(ctypes.c_float * n)(*x) for x in (p, g, m, v)] + [(ctypes.c_float * 1)(x) for x in (coef, step_size, decay, sb2)]
    P, G, M, V = (list(b) for b in bufs[:4])  # the float32 inputs
    addr = [ctypes.addressof(b) for b in bufs] + [ctypes.addressof(bufs[i]) for i in (2, 3, 0)]  # outputs m, v, p in place
    ptrs = (ctypes.c_void_p * len(addr))(*addr)
    lo, hi = (3, 0), (37, 768)  # a row tile: elements [2304, 28416), an aligned vector range, several rounds
    lo8 = (ctypes.c_int * 8)(*(list(lo) + [0] * 6))
    hi8 = (ctypes.c_int * 8)(*(list(hi) + [0] * 6))
    vec = lib.run(ptrs, lo8, hi8)
    assert lib.stores() == 3 * (hi[0] - lo[0]) * 768 and vec > 0
    # the four inputs prefetched two iterations (2 x 3 x 256 groups) ahead, inside the tile
    check_prefetches(prefetched(lib), [ctypes.addressof(b) for b in bufs[:4]], lo[0] * 768, hi[0] * 768, 3,
                     PREFETCH_AHEAD)
    c = float(ctypes.c_float(coef).value)
    for i in range(n):
        inside = lo[0] * 768 <= i < hi[0] * 768
        if not inside:  # untouched
            assert (bufs[0][i], bufs[2][i], bufs[3][i]) == (P[i], M[i], V[i]), i
            continue
        gg = G[i] * c
        em = M[i] + (gg - M[i]) * 0.1
        ev = V[i] * 0.999 + 0.001 * gg * gg
        ep = P[i] * decay - step_size * em / (math.sqrt(ev) / sb2 + 1e-8)
        assert bufs[2][i] == pytest.approx(em, rel=1e-5, abs=1e-12), i
        assert bufs[3][i] == pytest.approx(ev, rel=1e-5, abs=1e-16), i
        assert bufs[0][i] == pytest.approx(ep, rel=1e-5, abs=1e-9), i
