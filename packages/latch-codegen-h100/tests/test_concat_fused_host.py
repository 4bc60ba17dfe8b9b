"""A concat fused with its producers and consumers (latch_schedule.fusion "Concatenation"; fuse.py
``_Puller._concat``), compiled as HOST C++ and run thread by thread as in test_ilp_host.py: RoPE's
forward as the scheduler plans it (the q/k/v product's output read through reshape, permute,
select and the two half slices, the rotation, the concat) and the backward's d(qkv) assembly (a
concat of rotated halves, stacked with a second operand by another concat along the leading dim,
permuted back and reshaped to the product's layout, then scaled). Every element of the tile is
written once with the right value and nothing outside it is touched, for whole, row and box
tiles; the generated text branches per operand region and evaluates no operand outside it."""

from __future__ import annotations

import ctypes
import math
import random
import re
import shutil
import struct

import pytest

from latch_codegen_h100.bodies import FUNC, render_body
from latch_codegen_h100.codegen import _lowerings

from test_flat_host import HARNESS, host_library
from test_ilp_host import HARNESS_EXTRA, G, _inside, _strides

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

B, T, H, D = 2, 6, 2, 8
HALF = D // 2


def _rope_forward():
    g = G()
    qkv, cos, sin = g.inp("qkv", (B * T, 3 * H * D)), g.inp("cos", (T, HALF)), g.inp("sin", (T, HALF))
    r = g.op("reshape", (qkv,), (B, T, 3, H, D), {"shape": (B, T, 3, H, D)})
    p = g.op("permute", (r,), (3, B, H, T, D), {"perm": (2, 0, 3, 1, 4)})
    k = g.op("select", (p,), (B, H, T, D), {"dim": 0, "index": 1})  # the k third
    x1 = g.op("slice", (k,), (B, H, T, HALF), {"dim": 3, "start": 0, "end": HALF, "step": 1})
    x2 = g.op("slice", (k,), (B, H, T, HALF), {"dim": 3, "start": HALF, "end": D, "step": 1})
    a = g.op("sub", (g.op("mul", (x1, cos), (B, H, T, HALF)), g.op("mul", (x2, sin), (B, H, T, HALF))), (B, H, T, HALF))
    b = g.op("add", (g.op("mul", (x2, cos), (B, H, T, HALF)), g.op("mul", (x1, sin), (B, H, T, HALF))), (B, H, T, HALF))
    y = g.op("concat", (a, b), (B, H, T, D), {"dim": 3})

    def ref(v):
        out = []
        for bb in range(B):
            for h in range(H):
                for t in range(T):
                    row = (bb * T + t) * 3 * H * D + 1 * H * D + h * D
                    for d in range(D):
                        j = d % HALF
                        c, s = v["cos"][t * HALF + j], v["sin"][t * HALF + j]
                        u1, u2 = v["qkv"][row + j], v["qkv"][row + HALF + j]
                        out.append(u1 * c - u2 * s if d < HALF else u2 * c + u1 * s)
        return [out]
    return g, [y], (B, H, T, D), ref


def _dqkv_assembly():
    g = G()
    dq, dk = g.inp("dq", (B, H, T, D)), g.inp("dk", (B, H, T, D))
    lo = g.op("neg", (g.op("slice", (dq,), (B, H, T, HALF), {"dim": 3, "start": 0, "end": HALF, "step": 1}),),
              (B, H, T, HALF))
    hi = g.op("mul", (g.op("slice", (dq,), (B, H, T, HALF), {"dim": 3, "start": HALF, "end": D, "step": 1}),),
              (B, H, T, HALF), {"scalar": 3.0})
    c1 = g.op("concat", (hi, lo), (B, H, T, D), {"dim": 3})
    s1 = g.op("reshape", (c1,), (1, B, H, T, D), {"shape": (1, B, H, T, D)})
    s2 = g.op("reshape", (dk,), (1, B, H, T, D), {"shape": (1, B, H, T, D)})
    st = g.op("concat", (s1, s2), (2, B, H, T, D), {"dim": 0})
    pm = g.op("permute", (st,), (B, T, 2, H, D), {"perm": (1, 3, 0, 2, 4)})
    rs = g.op("reshape", (pm,), (B * T, 2 * H * D), {"shape": (B * T, 2 * H * D)})
    y = g.op("mul", (rs,), (B * T, 2 * H * D), {"scalar": 0.5})
    sq = _strides((B, H, T, D))

    def ref(v):
        out = []
        for bb in range(B):
            for t in range(T):
                for w in range(2):
                    for h in range(H):
                        for d in range(D):
                            base = bb * sq[0] + h * sq[1] + t * sq[2]
                            if w == 1:
                                x = v["dk"][base + d]
                            elif d < HALF:
                                x = 3.0 * v["dq"][base + HALF + d]
                            else:
                                x = -v["dq"][base + d - HALF]
                            out.append(0.5 * x)
        return [out]
    return g, [y], (B * T, 2 * H * D), ref


def _rope_backward(T: int = T):
    """The RoPE backward group as TinyMoE plans it (small shapes, FP32): dq and dk each rotated back
    by halves and concatenated, stacked with dv along a new leading dim, permuted and reshaped to the
    q/k/v product's layout: five regions (q lo | q hi | k lo | k hi | v) of one output."""
    g = G()
    shape, hs = (B, H, T, D), (B, H, T, HALF)
    cos, sin = g.inp("cos", (T, HALF)), g.inp("sin", (T, HALF))
    grads = [g.inp(n, shape) for n in ("dq", "dk", "dv")]
    stacked = []
    for x in grads[:2]:
        da = g.op("slice", (x,), hs, {"dim": 3, "start": 0, "end": HALF, "step": 1})
        db = g.op("slice", (x,), hs, {"dim": 3, "start": HALF, "end": D, "step": 1})
        lo = g.op("add", (g.op("mul", (db, sin), hs), g.op("mul", (da, cos), hs)), hs)
        hi = g.op("add", (g.op("mul", (db, cos), hs), g.op("mul", (g.op("neg", (da,), hs), sin), hs)), hs)
        stacked.append(g.op("concat", (lo, hi), shape, {"dim": 3}))
    stacked.append(grads[2])
    ones = [g.op("reshape", (x,), (1,) + shape, {"shape": (1,) + shape}) for x in stacked]
    st = g.op("concat", tuple(ones), (3,) + shape, {"dim": 0})
    pm = g.op("permute", (st,), (B, T, 3, H, D), {"perm": (1, 3, 0, 2, 4)})
    y = g.op("reshape", (pm,), (B * T, 3 * H * D), {"shape": (B * T, 3 * H * D)})
    sq = _strides(shape)

    def ref(v):
        out = []
        for bb in range(B):
            for t in range(T):
                for w in range(3):
                    for h in range(H):
                        for d in range(D):
                            x = v[("dq", "dk", "dv")[w]]
                            base = bb * sq[0] + h * sq[1] + t * sq[2]
                            j = d % HALF
                            c, s_ = v["cos"][t * HALF + j], v["sin"][t * HALF + j]
                            if w == 2:
                                out.append(x[base + d])
                            elif d < HALF:
                                out.append(x[base + HALF + j] * s_ + x[base + j] * c)
                            else:
                                out.append(x[base + HALF + j] * c + (-x[base + j]) * s_)
        return [out]
    return g, [y], (B * T, 3 * H * D), ref


def _straddling():
    """A concat along the last dim with a boundary at 2 (not a multiple of W = 4): a group of four
    lanes straddles two regions, so the group keeps the per-element loop."""
    g = G()
    a, b = g.inp("a", (B * T, 2)), g.inp("b", (B * T, D - 2))
    y = g.op("mul", (g.op("concat", (g.op("neg", (a,), (B * T, 2)), b), (B * T, D), {"dim": 1}),), (B * T, D),
             {"scalar": 3.0})

    def ref(v):
        return [[3.0 * (-v["a"][r * 2 + d] if d < 2 else v["b"][r * (D - 2) + d - 2]) for r in range(B * T) for d in range(D)]]
    return g, [y], (B * T, D), ref


def _transposed_rows():
    """A concat along the rows of a plain operand (16-byte loads) and a transposed one (its lanes
    read with a stride: per-lane loads): the two regions' accesses share a register, so the load
    phase branches between the two kinds of access instead of selecting one pointer."""
    g = G()
    b, a = g.inp("b", (B * T - 4, D)), g.inp("a", (D, 4))
    at = g.op("permute", (a,), (4, D), {"perm": (1, 0)})
    y = g.op("mul", (g.op("concat", (b, at), (B * T, D), {"dim": 0}),), (B * T, D), {"scalar": 2.0})

    def ref(v):
        n = B * T - 4
        return [[2.0 * (v["b"][r * D + d] if r < n else v["a"][d * 4 + r - n]) for r in range(B * T) for d in range(D)]]
    return g, [y], (B * T, D), ref


CASES = {"rope_forward": _rope_forward, "dqkv_assembly": _dqkv_assembly, "rope_backward": _rope_backward,
         "rope_backward_long": lambda: _rope_backward(64), "straddling": _straddling,
         "transposed_rows": _transposed_rows}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            g, outs, shape, ref = CASES[name]()
            src = render_body(g.spec(outs), _lowerings()).source.replace(FUNC, "body")
            lib = host_library(HARNESS + HARNESS_EXTRA + src, tmp_path_factory.mktemp(name))
            cache[name] = (g, outs, shape, ref, src, lib)
        return cache[name]

    return get


def _run(build, name, lo, hi):
    g, outs, shape, ref, src, lib = build(name)
    return _run_lib(g, shape, ref, lib, lo, hi)


def _run_lib(g, shape, ref, lib, lo, hi):
    rng = random.Random(7)
    bufs, flat = [], {}
    for vname in g.ins:
        v = next(x for x in g.vals if x.name == vname)
        n = math.prod(v.shape)
        b = (ctypes.c_float * n)()
        flat[vname] = [rng.gauss(0, 1) for _ in range(n)]
        for i, a in enumerate(flat[vname]):
            b[i] = a
        bufs.append(b)
    n = math.prod(shape)
    ob = (ctypes.c_float * n)()
    for i in range(n):
        ob[i] = float("nan")
    ptrs = (ctypes.c_void_p * (len(bufs) + 1))(*[ctypes.addressof(b) for b in bufs + [ob]])
    lo8 = (ctypes.c_int * 8)(*(list(lo) + [0] * (8 - len(lo))))
    hi8 = (ctypes.c_int * 8)(*(list(hi) + [0] * (8 - len(hi))))
    _run.vec = lib.run(ptrs, lo8, hi8)
    want = ref({k: [float(ctypes.c_float(a).value) for a in v] for k, v in flat.items()})[0]
    return [ob[i] for i in range(n)], want, lib.stores(), shape


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("tile", ["all", "rows", "box", "inner"])
def test_fused_concat_every_element_once_and_right(build, name, tile):
    shape = build(name)[2]
    lo, hi = [0] * len(shape), list(shape)
    if tile in ("rows", "box"):
        lo[0], hi[0] = 1, shape[0] - 1 if shape[0] > 2 else shape[0]
    if tile == "box":  # not spanning the trailing dims: the general coordinate loop
        lo[-1], hi[-1] = 1, shape[-1] - 1
    if tile == "inner":  # a tile inside one operand's region along the last dim only
        lo[-1], hi[-1] = 0, 3
    got, want, stores, shape = _run(build, name, lo, hi)
    inside = _inside(shape, lo, hi)
    assert stores == sum(inside)  # each element of the tile stored exactly once
    for i, ins in enumerate(inside):
        if ins:
            assert got[i] == pytest.approx(want[i], rel=1e-5, abs=1e-6), i
        else:
            assert math.isnan(got[i]), i


def test_fused_concat_branches_per_region(build):
    """The text: one branch per operand region, each operand's loads inside its own branch (the
    rotation's four products are computed once per element, not for both halves)."""
    src = build("rope_forward")[4]
    body = src[src.index("row tiles"):src.index("} else {\n    const long long e0")]
    assert body.count(f"< {HALF}LL) {{") == 1 and body.count("} else {") == 1
    first, second = body.split("} else {")
    for branch in (first, second):  # each branch loads the two halves of x, cos and sin once
        assert branch.count("latch::ld<float>(in0,") == 2
        assert branch.count("latch::ld<float>(in1,") == 1 and branch.count("latch::ld<float>(in2,") == 1
    src2 = build("dqkv_assembly")[4]
    assert src2.count("if (") >= 2  # the stack concat and, nested in its first branch, the halves


@pytest.mark.parametrize("name", ["rope_forward", "dqkv_assembly", "rope_backward", "rope_backward_long",
                                  "transposed_rows"])
def test_row_tiles_of_a_lane_uniform_concat_take_the_vector_path(build, name):
    """Every concat boundary is a multiple of 4 (or the concat's dim is not the innermost): row tiles
    run the vector/ILP path: 16-byte accesses, the same values (the rows and whole-tile cases above
    check every element), each region's source chosen once per group of four lanes."""
    shape = build(name)[2]
    lo, hi = [0] * len(shape), list(shape)
    got, want, stores, shape = _run(build, name, lo, hi)
    n = math.prod(shape)
    assert stores == n
    assert _run.vec >= n // 4  # at least the output's own 16-byte stores, plus the operands' loads
    assert all(g == pytest.approx(w, rel=1e-5, abs=1e-6) for g, w in zip(got, want))
    src = build(name)[4]
    ilp = src[src.index("U groups of W"):src.index("operands not aligned")]
    # no branch around a vector load: a region's source chosen once per group (one pointer, one
    # load; where no region of it holds, the operand's own base, so the load is unconditional)
    assert "latch::gld4(s_, 0," in ilp and " ? " in ilp and "nullptr" not in ilp and "if (s_" not in ilp
    if name == "transposed_rows":  # a strided region and a contiguous one: each in its own register
        strided = re.search(r"(r\d+_)\[u_\]\[j_\] = latch::ld<float>\(in1,", ilp)
        vector = re.search(r"latch::gld4\(s_, 0, (r\d+_)\[u_\]\)", ilp)
        assert strided and vector and strided[1] != vector[1]
    assert "LL" not in ilp.split("{", 1)[1]  # every index of these small values in 32 bits


def test_a_concat_boundary_inside_a_group_of_four_keeps_the_element_loop(build):
    src = build("straddling")[4]
    assert "U groups of W" not in src and "constant-extent decode" in src
    shape = build("straddling")[2]
    got, want, stores, _ = _run(build, "straddling", [0, 0], list(shape))
    assert _run.vec == 0 and stores == math.prod(shape)
    assert all(g == pytest.approx(w, rel=1e-6) for g, w in zip(got, want))


@pytest.mark.parametrize("name", ["rope_forward", "dqkv_assembly", "rope_backward", "rope_backward_long",
                                  "transposed_rows"])
def test_joint_regions_compute_the_bits_of_separate_regions(build, name, tmp_path, monkeypatch):
    """The vector path pulls a concat's regions jointly (fuse.py ``_IlpPuller._joint``: one
    expression over operands whose source is chosen per group, a select where the regions'
    expressions differ). Rendered again with every region pulled on its own (the form before,
    ``JOINT_REGIONS = False``), the same inputs give the same bits in every element: per element
    the same operations on the same operands in the same order. The RoPE backward computes one
    rotation per lane instead of four (its forward's halves differ at the root, sub | add: a select)."""
    from latch_codegen_h100 import fuse

    g, outs, shape, ref, src, lib = build(name)
    monkeypatch.setattr(fuse, "JOINT_REGIONS", False)
    src0 = render_body(g.spec(outs), _lowerings()).source.replace(FUNC, "body")
    lib0 = host_library(HARNESS + HARNESS_EXTRA + src0, tmp_path)
    lo, hi = [0] * len(shape), list(shape)
    got, _, _, _ = _run_lib(g, shape, ref, lib, lo, hi)
    want, _, _, _ = _run_lib(g, shape, ref, lib0, lo, hi)
    assert [struct.pack("<f", x) for x in got] == [struct.pack("<f", x) for x in want]

    def arithmetic(text):  # statements per lane in the vector path's arithmetic
        ilp = text[text.index("U groups of W"):text.index("operands not aligned")]
        lane = ilp[ilp.index("for (int j_ = 0; j_ < 4; ++j_) {"):]
        return len(re.findall(r"^\s+const float [vc]\d+ = ", lane[:lane.index("for (int u_")], re.M))

    if name.startswith("rope_backward"):  # one rotation for the four rotated regions (q, k x lo, hi), not four
        assert len(set(re.findall(r"latch::gld4\(s_, 0, (r\d+_)", src))) == 4, "four registers of loads"
        assert arithmetic(src) <= arithmetic(src0) // 2, \
            (arithmetic(src), arithmetic(src0))
