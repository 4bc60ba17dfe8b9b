"""The vector/ILP path of the general fused body (fuse.py ``ilp_lines``: groups with views,
broadcasts, slices, selects and permutes over row tiles), compiled as HOST C++ and run thread by
thread as in test_flat_host.py: every element of the tile is written once with the right value,
nothing outside it is touched, the 16-byte accesses are aligned (the harness aborts otherwise),
and the generated text has the shape the GPU needs (loads of every group before any store)."""

from __future__ import annotations

import ctypes
import math
import random
import shutil

import pytest

from latch_codegen_h100.bodies import FUNC, group_spec, render_body
from latch_codegen_h100.codegen import _lowerings
from latch_core.ir import BATCH, Graph, Group, Node, Value
from latch_core.sections import FusionGroup

from test_flat_host import HARNESS, host_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

HARNESS_EXTRA = r"""
namespace latch { namespace ew { inline float rsqrt_(float x) { return 1.0f / std::sqrt(x); } } }
"""


class G:
    """A group under test: inputs (name, shape), nodes, one or more outputs; ``ref`` computes the
    outputs from the inputs in Python (nested lists flattened row-major)."""

    def __init__(self):
        self.vals, self.nodes, self.ins, self.k = [], [], [], 0

    def inp(self, name, shape):
        self.vals.append(Value(name, tuple(shape), "f32", BATCH))
        self.ins.append(name)
        return name

    def op(self, op, ins, shape, attrs=None):
        self.k += 1
        out = f"v{self.k}"
        self.vals.append(Value(out, tuple(shape), "f32"))
        self.nodes.append(Node(f"n{self.k}", f"latch::{op}", tuple(ins), (out,), dict(attrs or {})))
        return out

    def spec(self, outs):
        g = Graph("p", self.vals, self.nodes, (Group("batch", tuple(self.ins)),), (Group("metrics", tuple(outs)),))
        grp = FusionGroup(0, [n.name for n in self.nodes], tuple(self.ins), tuple(outs), outs[0], "k")
        return group_spec(g, grp)


def _strides(shape):
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _case(name):
    """(G, outputs, output shape, reference(inputs: dict name -> flat list) -> list of flat outputs)."""
    g = G()
    if name == "rms_scale":  # y = x * r * w: a (T, 1) row statistic and a (d,) weight
        T, d = 24, 64
        x, r, w = g.inp("x", (T, d)), g.inp("r", (T, 1)), g.inp("w", (d,))
        y = g.op("mul", (g.op("mul", (x, r), (T, d)), w), (T, d))
        return g, [y], (T, d), lambda v: [[v["x"][i] * v["r"][i // d] * v["w"][i % d] for i in range(T * d)]]
    if name == "rms_scale_odd":  # an odd row length: W = 1
        T, d = 24, 47
        x, r = g.inp("x", (T, d)), g.inp("r", (T, 1))
        y = g.op("mul", (x, r), (T, d))
        return g, [y], (T, d), lambda v: [[v["x"][i] * v["r"][i // d] for i in range(T * d)]]
    if name == "reshape_heads":  # (T, 96) -> (T, 3, 32), scaled: a reshape of a group input
        T = 20
        x = g.inp("x", (T, 96))
        y = g.op("mul", (g.op("reshape", (x,), (T, 3, 32), {"shape": (T, 3, 32)}),), (T, 3, 32), {"scalar": 2.0})
        return g, [y], (T, 3, 32), lambda v: [[2.0 * a for a in v["x"]]]
    if name == "reshape_heads_w":  # the same times a (32,) weight: not flat, the ILP path
        T = 20
        x, w = g.inp("x", (T, 96)), g.inp("w", (32,))
        y = g.op("mul", (g.op("reshape", (x,), (T, 3, 32), {"shape": (T, 3, 32)}), w), (T, 3, 32))
        return g, [y], (T, 3, 32), lambda v: [[a * v["w"][i % 32] for i, a in enumerate(v["x"])]]
    if name == "permute_keep_last":  # (B, S, H, D) -> (B, H, S, D) + 1
        B, S, H, D = 2, 6, 3, 8
        x = g.inp("x", (B, S, H, D))
        y = g.op("add", (g.op("permute", (x,), (B, H, S, D), {"perm": (0, 2, 1, 3)}),), (B, H, S, D), {"scalar": 1.0})
        st = _strides((B, S, H, D))

        def ref(v):
            out = []
            for b in range(B):
                for h in range(H):
                    for s in range(S):
                        for dd in range(D):
                            out.append(v["x"][b * st[0] + s * st[1] + h * st[2] + dd] + 1.0)
            return [out]
        return g, [y], (B, H, S, D), ref
    if name == "heads_split":  # bench-memory's heads.permute: (T, 96) -> (2, T/2, 3, 32) -> (2, 3, T/2, 32)
        T, H, D = 20, 3, 32
        x = g.inp("x", (T, H * D))
        r = g.op("reshape", (x,), (2, T // 2, H, D), {"shape": (2, T // 2, H, D)})
        y = g.op("permute", (r,), (2, H, T // 2, D), {"perm": (0, 2, 1, 3)})

        def ref(v):
            return [[v["x"][(b * (T // 2) + s) * H * D + h * D + dd]
                     for b in range(2) for h in range(H) for s in range(T // 2) for dd in range(D)]]
        return g, [y], (2, H, T // 2, D), ref
    if name == "transpose_last":  # (R, C) -> (C, R): the innermost dim moves (GEN loads)
        R, C = 12, 16
        x = g.inp("x", (R, C))
        y = g.op("mul", (g.op("permute", (x,), (C, R), {"perm": (1, 0)}),), (C, R), {"scalar": 3.0})
        return g, [y], (C, R), lambda v: [[3.0 * v["x"][r * C + c] for c in range(C) for r in range(R)]]
    if name == "slice_cols_add":  # the middle third of (T, 3d) columns plus (T, d): an aligned column slice
        T, d = 16, 32
        x, z = g.inp("x", (T, 3 * d)), g.inp("z", (T, d))
        s = g.op("slice", (x,), (T, d), {"dim": 1, "start": d, "end": 2 * d, "step": 1})
        y = g.op("add", (s, z), (T, d))
        return g, [y], (T, d), lambda v: [[v["x"][t * 3 * d + d + c] + v["z"][t * d + c] for t in range(T) for c in range(d)]]
    if name == "slice_cols_unaligned":  # start 3: contiguous but not aligned (GEN)
        T, d = 16, 32
        x = g.inp("x", (T, d + 5))
        y = g.op("neg", (g.op("slice", (x,), (T, d), {"dim": 1, "start": 3, "end": 3 + d, "step": 1}),), (T, d))
        return g, [y], (T, d), lambda v: [[-v["x"][t * (d + 5) + 3 + c] for t in range(T) for c in range(d)]]
    if name == "select_lead":  # (3, T, d) select dim 0 index 2, times a (T, d) value, and a second output
        T, d = 10, 16
        x, z = g.inp("x", (3, T, d)), g.inp("z", (T, d))
        s = g.op("select", (x,), (T, d), {"dim": 0, "index": 2})
        y = g.op("mul", (s, z), (T, d))
        y2 = g.op("add", (s, z), (T, d))
        off = 2 * T * d
        return g, [y, y2], (T, d), lambda v: [[v["x"][off + i] * v["z"][i] for i in range(T * d)],
                                              [v["x"][off + i] + v["z"][i] for i in range(T * d)]]
    if name == "select_last":  # (T, d, 2) select dim 2 index 1: strided (GEN)
        T, d = 10, 16
        x = g.inp("x", (T, d, 2))
        y = g.op("add", (g.op("select", (x,), (T, d), {"dim": 2, "index": 1}),), (T, d), {"scalar": 0.5})
        return g, [y], (T, d), lambda v: [[v["x"][2 * i + 1] + 0.5 for i in range(T * d)]]
    if name == "select_1d":  # (8, 6) select dim 1 index 2: a 1-d output, its tiles start anywhere
        x = g.inp("x", (8, 6))
        y = g.op("add", (g.op("select", (x,), (8,), {"dim": 1, "index": 2}),), (8,), {"scalar": 1.0})
        return g, [y], (8,), lambda v: [[v["x"][6 * i + 2] + 1.0 for i in range(8)]]
    if name == "expand_rows":  # (1, d) expanded to (T, d) and a (T, 1) expanded to (T, d)
        T, d = 12, 20
        a, b = g.inp("a", (1, d)), g.inp("b", (T, 1))
        ea = g.op("expand", (a,), (T, d), {"shape": (T, d)})
        eb = g.op("expand", (b,), (T, d), {"shape": (T, d)})
        y = g.op("sub", (ea, eb), (T, d))
        return g, [y], (T, d), lambda v: [[v["a"][i % d] - v["b"][i // d] for i in range(T * d)]]
    if name == "concat_cols":  # concat along the last dim: boundaries at multiples of four
        T = 12
        a, b = g.inp("a", (T, 32)), g.inp("b", (T, 16))
        y = g.op("concat", (a, b), (T, 48), {"dim": 1})
        return g, [y], (T, 48), lambda v: [[(v["a"][t * 32 + c] if c < 32 else v["b"][t * 16 + c - 32])
                                            for t in range(T) for c in range(48)]]
    if name == "concat_rows":  # three operands along dim 0
        a, b, e = g.inp("a", (4, 8)), g.inp("b", (6, 8)), g.inp("e", (3, 8))
        y = g.op("concat", (a, b, e), (13, 8), {"dim": 0})
        return g, [y], (13, 8), lambda v: [v["a"] + v["b"] + v["e"]]
    if name == "concat_odd_cols":  # a boundary at 6: the element loop
        T = 12
        a, b = g.inp("a", (T, 6)), g.inp("b", (T, 10))
        y = g.op("concat", (a, b), (T, 16), {"dim": 1})
        return g, [y], (T, 16), lambda v: [[(v["a"][t * 6 + c] if c < 6 else v["b"][t * 10 + c - 6])
                                            for t in range(T) for c in range(16)]]
    raise KeyError(name)


CASES = ["rms_scale", "rms_scale_odd", "reshape_heads", "reshape_heads_w", "permute_keep_last", "heads_split", "transpose_last", "slice_cols_add",
         "slice_cols_unaligned", "select_lead", "select_last", "expand_rows", "concat_cols", "concat_rows",
         "concat_odd_cols", "select_1d"]
FLAT = {"reshape_heads"}  # a reshape of the same element count: flat.py's path
SCALAR_ONLY = {"rms_scale_odd", "concat_odd_cols", "select_1d"}  # no 16-byte access possible


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    cache = {}

    def get(name):
        if name in cache:
            return cache[name]
        g, outs, shape, ref = _case(name)
        spec = g.spec(outs)
        src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
        lib = host_library(HARNESS + HARNESS_EXTRA + src, tmp_path_factory.mktemp(name))
        cache[name] = (g, outs, shape, ref, src, lib)
        return cache[name]

    return get


def _run(build, name, lo, hi, shift=0):
    g, outs, shape, ref, src, lib = build(name)
    rng = random.Random(1)
    bufs, flat = [], {}
    for vname in g.ins:
        v = next(x for x in g.vals if x.name == vname)
        n = math.prod(v.shape)
        b = (ctypes.c_float * (n + 8))()
        flat[vname] = [rng.gauss(0, 1) for _ in range(n)]
        for i, a in enumerate(flat[vname]):
            b[shift + i] = a
        bufs.append(b)
    n = math.prod(shape)
    obufs = []
    for _ in outs:
        b = (ctypes.c_float * (n + 8))()
        for i in range(n + 8):
            b[i] = float("nan")
        obufs.append(b)
    ptrs = (ctypes.c_void_p * (len(bufs) + len(obufs)))(*[ctypes.addressof(b) + 4 * shift for b in bufs + obufs])
    lo8 = (ctypes.c_int * 8)(*(list(lo) + [0] * (8 - len(lo))))
    hi8 = (ctypes.c_int * 8)(*(list(hi) + [0] * (8 - len(hi))))
    vec = lib.run(ptrs, lo8, hi8)
    got = [[b[shift + i] for i in range(n)] for b in obufs]
    # recompute the reference with the values the kernel saw (float32 round trip)
    want = ref({k: [float(ctypes.c_float(a).value) for a in v] for k, v in flat.items()})
    return got, want, vec, lib.stores(), shape


def _inside(shape, lo, hi):
    st = _strides(shape)
    return [all(lo[d] <= (i // st[d]) % shape[d] < hi[d] for d in range(len(shape))) for i in range(math.prod(shape))]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("tile", ["all", "rows", "box", "shifted", "contig"])
def test_every_element_of_the_tile_once_and_right(build, name, tile):
    shape = build(name)[2]
    lo, hi, shift = [0] * len(shape), list(shape), 0
    if tile in ("rows", "box"):
        lo[0], hi[0] = 1, shape[0] - (2 if shape[0] > 3 else 0)
    if tile == "contig" and len(shape) >= 2:  # one row block of dim 1: contiguous, not a row tile
        lo[0], hi[0] = 1, 2
        lo[1], hi[1] = (1, shape[1] - 1) if len(shape) >= 3 else (4, shape[1])
    if tile == "box":  # not spanning the trailing dims: the general coordinate loop
        lo[-1], hi[-1] = 1, shape[-1] - 1
    if tile == "shifted":  # base pointers not 16-byte aligned: the element-by-element row loop
        shift = 1
    got, want, vec, stores, shape = _run(build, name, lo, hi, shift)
    inside = _inside(shape, lo, hi)
    assert stores == len(got) * sum(inside)  # each output element of the tile stored exactly once
    for o in range(len(got)):
        for i, ins in enumerate(inside):
            if ins:
                assert got[o][i] == pytest.approx(want[o][i], rel=1e-5, abs=1e-6), (o, i)
            else:
                assert math.isnan(got[o][i]), (o, i)
    vector_case = name not in SCALAR_ONLY
    if tile == "contig" and vector_case and len(shape) >= 2 and shape[-1] % 4 == 0 and shape[1] > 2:
        assert vec > 0  # a contiguous tile takes the 16-byte path too (the dense model's (1, 16, 768) tiles)
    if tile in ("all", "rows") and vector_case:
        assert vec > 0  # the 16-byte path ran (at least the output's stores)
    if tile == "box" or (tile == "shifted" and name not in FLAT):
        assert vec == 0  # the general loop / the row loop one element at a time
    if tile == "shifted" and name in FLAT:
        assert vec > 0  # the flat path peels a head and aligns every operand alike


@pytest.mark.parametrize("name,n_ld4", [("rms_scale", 2), ("rms_scale_odd", 0), ("reshape_heads_w", 2),
                                        ("permute_keep_last", 1), ("transpose_last", 0), ("slice_cols_add", 2),
                                        ("slice_cols_unaligned", 0), ("select_lead", 2), ("select_last", 0),
                                        ("expand_rows", 1)])
def test_the_generated_text_loads_every_group_before_computing(build, name, n_ld4):
    src = build(name)[4]
    ilp = src[src.index("row tiles: U groups"):src.index("operands not aligned")]
    assert ilp.count("latch::gld4(") == n_ld4  # one 16-byte load per VEC operand access
    # every load sits in the load phase, before the first computed value and the first store
    first_compute = ilp.index("const float v")
    last_load = max(ilp.rfind("latch::ld"), ilp.rfind("latch::gld4"))
    first_store = min(i for i in (ilp.find("latch::st"), ilp.find("latch::gst4")) if i >= 0)
    assert 0 <= last_load < first_compute < first_store
    # 32-bit coordinates decoded with constant extents (no run-time 64-bit division)
    assert "const int x0" in ilp and "const long long x" not in ilp


def test_a_reshape_of_the_same_element_count_takes_the_flat_path(build):
    src = build("reshape_heads")[4]
    assert "one flat range" in src and "row tiles: U groups" not in src and "latch::gld4(" in src


def test_concat_row_tiles_are_one_16_byte_load_and_store_per_group(build):
    src = build("concat_cols")[4]
    rows = src[:src.index("} else {")]
    assert rows.count("latch::gld4(") == 1 and rows.count("latch::gst4(") == 1
    assert rows.index("latch::gld4(") < rows.index("latch::gst4(")
    assert "latch::gld4(" not in build("concat_odd_cols")[4]


def test_a_standalone_reshape_and_mul_reshape_cast_take_the_flat_vector_path():
    """The dense transformer's `reshape` copies and `mul+reshape+cast` (a scaled head split written
    as BF16): a reshape keeps the flat index, so both are flat 16-byte passes."""
    T = 64
    g = G()
    x = g.inp("x", (T, 768))
    h = g.op("reshape", (x,), (T, 12, 64), {"shape": (T, 12, 64)})
    src = render_body(g.spec([h]), _lowerings()).source
    assert "one flat range" in src and "latch::gld4(" in src and "latch::gst4(" in src

    g = G()
    x, s = g.inp("x", (T, 768)), g.inp("s", ())
    m = g.op("mul", (x, s), (T, 768))
    r = g.op("reshape", (m,), (2, T // 2, 12, 64), {"shape": (2, T // 2, 12, 64)})
    g.nodes.append(Node("ncast", "latch::cast", (r,), ("o",), {"dtype": "bf16"}))
    g.vals.append(Value("o", (2, T // 2, 12, 64), "bf16"))
    src = render_body(g.spec(["o"]), _lowerings()).source
    assert "one flat range" in src and "latch::gld4(" in src and "latch::gst4(" in src
    assert "% 64" not in src.split("} else {")[0]  # no coordinate decode on the flat path


def test_the_head_split_cut_in_one_head_row_ranges_takes_the_16_byte_path(build):
    """bench-memory's heads.permute output (2, 12, 16384, 64) is tiled (1, 1, n, 64) from any row:
    a contiguous tile, so the ILP path (one 16-byte load and store per group of four) runs; run 16
    measured it at 8% of its floor in the one-element general loop."""
    _, _, shape, _, src, _ = build("heads_split")
    lo, hi = [1, 2, 3, 0], [2, 3, shape[2] - 2, shape[3]]
    got, want, vec, stores, shape = _run(build, "heads_split", lo, hi)
    inside = _inside(shape, lo, hi)
    assert stores == sum(inside)
    n = sum(inside)
    assert vec == 2 * n // 4  # every element through one 16-byte load and one 16-byte store
    for i, ins in enumerate(inside):
        if ins:
            assert got[0][i] == want[0][i], i
        else:
            assert math.isnan(got[0][i]), i
