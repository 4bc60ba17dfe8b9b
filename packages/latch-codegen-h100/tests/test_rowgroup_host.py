"""The row group body (lower_rowgroup.py: a row reduction, the chain on its statistic and the
broadcast consumer in one pass), compiled as HOST C++ and run on 256 host threads with real
barriers for the warps' shuffles (test_column_host's harness): RMSNorm forward (its statistic
written as a second output), RMSNorm backward as autograd captures it, LayerNorm (two statistics
of the same rows, the second's prologue reading the first): every element of the tile's rows is
right against a double-precision reference, nothing outside the tile is written, two runs give
the same bits, and the 16-byte path reads every row-shaped input exactly once."""

from __future__ import annotations

import ctypes
import math
import random
import shutil
import struct

import pytest

from latch_codegen_h100.bodies import FUNC, render_body
from latch_codegen_h100.codegen import _lowerings

from test_column_host import HARNESS, RUN, _host_lib
from test_ilp_host import G

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

EXTRA = r"""
namespace latch {
template <class S, class V> inline void gst4(S* p, i64 i, const V (&v)[4]) {
  if (!aligned4(p, i)) abort();
  for (int j = 0; j < 4; ++j) p[i + j] = (S)v[j];
}
namespace ew {
inline float rsqrt_(float x) { return 1.0f / std::sqrt(x); }
inline float pow_(float a, float b) { return std::pow(a, b); }
inline float div_(float a, float b) { return a / b; }
}
}  // namespace latch
"""
EPS = 1e-6


def _rms_fwd(T, R, lead=None):
    g = G()
    shape = (T, R) if lead is None else lead + (R,)
    stat = shape[:-1] + (1,)
    x, w = g.inp("x", shape), g.inp("w", (R,))
    ms = g.op("mean", (g.op("pow", (x,), shape, {"scalar": 2.0}),), stat, {"dims": (len(shape) - 1,), "keepdim": True})
    r = g.op("rsqrt", (g.op("add", (ms,), stat, {"scalar": EPS}),), stat)
    y = g.op("mul", (g.op("mul", (x, r), shape), w), shape)

    def ref(v):
        rows = math.prod(shape[:-1])
        rs = [1 / math.sqrt(math.fsum(v["x"][i * R + j] ** 2 for j in range(R)) / R + EPS) for i in range(rows)]
        return {y: [v["x"][k] * rs[k // R] * v["w"][k % R] for k in range(rows * R)], r: rs}
    return g, [y, r], shape, ref


def _rms_bwd(T, R, residual=False):
    """The backward as autograd captures it (examples/transformer.py): dy * w, sum((dy * w) * x),
    r ** 3, * -0.5, expand, / R, 2 * x, + (dy * w) * r; ``residual``: plus the residual stream's
    gradient (a third row input: the body loads one batch at a time, no second buffer)."""
    g = G()
    shape, stat = (T, R), (T, 1)
    x, w, dy, r = g.inp("x", shape), g.inp("w", (R,)), g.inp("dy", shape), g.inp("r", stat)
    res = g.inp("res", shape) if residual else None
    gw = g.op("mul", (dy, w), shape)
    s = g.op("sum", (g.op("mul", (gw, x), shape),), stat, {"dims": (1,), "keepdim": True})
    m = g.op("mul", (g.op("mul", (s,), stat, {"scalar": -0.5}), g.op("pow", (r,), stat, {"scalar": 3.0})), stat)
    e = g.op("div", (g.op("expand", (m,), shape, {"shape": shape}),), shape, {"scalar": float(R)})
    dx = g.op("add", (g.op("mul", (gw, r), shape), g.op("mul", (e, g.op("mul", (x,), shape, {"scalar": 2.0})), shape)), shape)
    if residual:
        dx = g.op("add", (dx, res), shape)

    def ref(v):
        out = []
        for i in range(T):
            ri = v["r"][i]
            si = math.fsum(v["dy"][i * R + j] * v["w"][j] * v["x"][i * R + j] for j in range(R))
            for j in range(R):
                gwj = v["dy"][i * R + j] * v["w"][j]
                out.append(gwj * ri - si * ri ** 3 * v["x"][i * R + j] / R + (v["res"][i * R + j] if residual else 0))
        return {dx: out}
    return g, [dx], shape, ref


def _layernorm(T, R):
    g = G()
    shape, stat = (T, R), (T, 1)
    x, w, b = g.inp("x", shape), g.inp("w", (R,)), g.inp("b", (R,))
    mu = g.op("mean", (x,), stat, {"dims": (1,), "keepdim": True})
    xc = g.op("sub", (x, mu), shape)
    var = g.op("mean", (g.op("mul", (xc, xc), shape),), stat, {"dims": (1,), "keepdim": True})
    rstd = g.op("rsqrt", (g.op("add", (var,), stat, {"scalar": 1e-5}),), stat)
    y = g.op("add", (g.op("mul", (g.op("mul", (xc, rstd), shape), w), shape), b), shape)

    def ref(v):
        out = []
        for i in range(T):
            row = v["x"][i * R:(i + 1) * R]
            m = math.fsum(row) / R
            var_ = math.fsum((a - m) ** 2 for a in row) / R
            out += [(a - m) / math.sqrt(var_ + 1e-5) * v["w"][j] + v["b"][j] for j, a in enumerate(row)]
        return {y: out}
    return g, [y], shape, ref


CASES = {
    "rms_fwd_96": lambda: _rms_fwd(37, 96),  # rows shorter than 128: lanes idle, four rows per warp
    "rms_fwd_768": lambda: _rms_fwd(41, 768),  # the dense transformer's rows: six groups of four per lane
    "rms_fwd_3d": lambda: _rms_fwd(None, 256, (3, 13)),  # (B, T, d): the tile spans two leading dims
    "rms_bwd_768": lambda: _rms_bwd(29, 768),  # two row inputs: one batch at a time
    "rms_bwd_residual_768": lambda: _rms_bwd(21, 768, residual=True),
    "layernorm_320": lambda: _layernorm(23, 320),
}


@pytest.mark.parametrize("pipeline", [0, 48], ids=["one_batch", "pipelined"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_row_body_computes_statistic_chain_and_consumer_in_one_pass(tmp_path, monkeypatch, name, pipeline):
    """``pipeline``: lower_rowgroup.PIPELINE_REGS (0, the default: one batch of rows at a time; 48:
    the next batch loaded into a second buffer while this one is computed, where it fits)."""
    from latch_codegen_h100 import lower_rowgroup

    monkeypatch.setattr(lower_rowgroup, "PIPELINE_REGS", pipeline)
    g, outs, shape, ref = CASES[name]()
    spec = g.spec(outs)
    src = render_body(spec, _lowerings()).source.replace(FUNC, "body")
    assert "row group: rows of" in src and "atomic" not in src and "warp_reduce<latch::SumOp>" in src
    assert ("the next batch's loads" in src) == (pipeline > 0 and name != "rms_bwd_residual_768")
    lib = _host_lib(tmp_path, HARNESS + EXTRA + src + RUN)
    rng = random.Random(5)
    vals = {v.name: v for v in g.vals}
    flat, bufs = {}, []
    for vname in g.ins:
        n = math.prod(vals[vname].shape)
        if vname == "r":  # a real statistic: positive
            flat[vname] = [float(ctypes.c_float(rng.uniform(0.5, 2.0)).value) for _ in range(n)]
        else:
            flat[vname] = [float(ctypes.c_float(rng.gauss(0, 1)).value) for _ in range(n)]
        bufs.append((ctypes.c_float * n)(*flat[vname]))
    want = ref(flat)
    R = shape[-1]
    # a tile of rows: leading dims [1, e - 1) of the first, and of the second when there is one
    lo = [0] * len(shape)
    hi = list(shape)
    lo[0], hi[0] = 1, shape[0] - 1
    if len(shape) == 3:
        lo[1], hi[1] = 2, shape[1] - 3
    inside = set()
    for idx in range(math.prod(shape[:-1])):
        coords, q = [], idx
        for e in reversed(shape[:-1]):
            coords.append(q % e)
            q //= e
        coords.reverse()
        if all(lo[d] <= coords[d] < hi[d] for d in range(len(shape) - 1)):
            inside.add(idx)
    runs = []
    for _ in range(2):
        out_bufs = [(ctypes.c_float * math.prod(vals[o].shape))(*([float("nan")] * math.prod(vals[o].shape))) for o in outs]
        ptrs = (ctypes.c_void_p * (len(bufs) + len(outs)))(*[ctypes.addressof(b) for b in bufs + out_bufs])
        lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * (8 - len(lo)))), (ctypes.c_int * 8)(*(hi + [0] * (8 - len(hi)))))
        runs.append([list(b) for b in out_bufs])
        vec = lib.vec4()
        n_full = sum(1 for v in g.ins if math.prod(vals[v].shape) == math.prod(shape))
        n_vec = sum(1 for v in g.ins if vals[v].shape == (R,))
        # every row-shaped input read once per row of the tile, four elements per access; the
        # weights once per task by each of the 8 warps
        assert vec == n_full * len(inside) * R // 4 + n_vec * 8 * R // 4
    assert [[struct.pack("f", a) for a in b] for b in runs[0]] == [[struct.pack("f", a) for a in b] for b in runs[1]]
    for o, got in zip(outs, runs[0]):
        per = math.prod(vals[o].shape) // math.prod(shape[:-1])  # R for rows, 1 for the statistic
        for k, a in enumerate(got):
            if k // per in inside:
                assert a == pytest.approx(want[o][k], rel=2e-5, abs=2e-5), (o, k)
            else:
                assert math.isnan(a), (o, k)
