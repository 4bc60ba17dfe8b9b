"""Loads in flight in the short reductions' vector path and the general fused body's row-tile path
(results/mb2.md). TinyMoE-200M's combine (``reshape+reshape+mul+sum``: each expert row times its
routing weight, the top-2 summed) ran at 38% of its bytes floor and its RoPE backward (the ILP
path: a permute of three bf16 gradients with the rotate-half concat) at 39% (run 53):

- the combine's fused prologue multiplies right after its loads, and each group's loads sat behind
  a branch (``if (g < n4_)``), so ptxas issued one group's two 16-byte loads, waited, multiplied,
  then the next group's: two loads in flight per thread. Now the register loads are clamped to the
  tile's last group (straight-line code), software pipelined, U = 6 groups, and the lines of the
  groups two iterations ahead are prefetched into L2;
- the RoPE body's U = 4 groups move 8 bytes from HBM each (its cos/sin tables come from L2): 8 KiB
  in flight per SM. Now the lines of its full-size inputs are prefetched into L2 several
  iterations ahead (``latch::gpf4``: the thread whose group opens a line).

Host runs (g++, the test harnesses of test_column_host / test_flat_host) check that the values are
the same bits with and without the prefetch and that every prefetched address is inside an input
the body reads; the SASS checks (nvcc + cuobjdump) that the loads really are in flight together."""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
import struct

import pytest

from latch_codegen_h100 import fuse, lower_reduce
from latch_codegen_h100.bodies import FUNC, render_body
from latch_codegen_h100.codegen import _lowerings, include_dirs_of
from latch_codegen_h100.sass import SassError, find_cuobjdump

from test_column_host import HARNESS, RUN, _host_lib, random_inputs
from test_flat_host import HARNESS as FLAT_HARNESS, host_library, prefetched
from test_ilp_host import HARNESS_EXTRA, G
from test_short_reduce_host import EXTRA, _thread_per_output

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def _have_sass_tools() -> bool:
    try:
        find_cuobjdump()
    except SassError:
        return False
    return shutil.which("nvcc") is not None


needs_sass = pytest.mark.skipif(not _have_sass_tools(), reason="nvcc or cuobjdump not installed")


def _combine(N: int, K: int):
    """TinyMoE's combine: (2N, K) expert rows times (N, 2) routing weights, summed over the 2."""
    g = G()
    x, w = g.inp("x", (2 * N, K)), g.inp("w", (N, 2))
    r = g.op("reshape", (x,), (N, 2, K), {"shape": (N, 2, K)})
    rw = g.op("reshape", (w,), (N, 2, 1), {"shape": (N, 2, 1)})
    y = g.op("sum", (g.op("mul", (r, rw), (N, 2, K)),), (N, K), {"dims": (1,), "keepdim": False})
    return g, y


def _heads(B: int, H: int, S: int, D: int):
    """RoPE backward's shape of access: (B, H, S, D) -> (B, S, H, D) as rows of H * D, times a
    (S, D) table (small: stays in L2) plus a second (B, H, S, D) input read the same way."""
    g = G()
    a, b, t = g.inp("a", (B, H, S, D)), g.inp("b", (B, H, S, D)), g.inp("t", (S, D))
    pa = g.op("permute", (a,), (B, S, H, D), {"perm": (0, 2, 1, 3)})
    pb = g.op("permute", (b,), (B, S, H, D), {"perm": (0, 2, 1, 3)})
    tt = g.op("reshape", (t,), (1, S, 1, D), {"shape": (1, S, 1, D)})
    y = g.op("add", (g.op("mul", (pa, tt), (B, S, H, D)), pb), (B, S, H, D))
    out = g.op("reshape", (y,), (B * S, H * D), {"shape": (B * S, H * D)})
    return g, out


# ---- generated text -------------------------------------------------------------------------

def test_the_combine_clamps_its_register_loads_pipelines_and_prefetches():
    g, y = _combine(32768, 768)
    src = render_body(g.spec([y]), _lowerings()).source
    assert "auto pf4v = [&](long long i)" in src and "latch::gpf4(in0," in src  # the expert rows
    assert "latch::gpf4(in1" not in src  # the (N, 2) weights: one load per row, not prefetched
    assert "const int gc_ = " in src and ": n4_ - 1;" in src  # the register loads clamped, not branched
    assert "L2 prefetch of iteration +2's rows" in src
    assert "float v_[6][2][4];" in src and "float c_[6][2][4];" in src  # U = 6, double-buffered
    assert "float a_[4] = {latch::SumOp::template init<float>()" in src  # exact in float (R = 2)


def test_a_small_input_is_not_prefetched():
    g, y = _combine(40, 24)
    src = render_body(g.spec([y]), _lowerings()).source
    assert "gpf4" not in src and "pf4v" not in src


def test_the_row_tile_path_prefetches_full_size_inputs_only():
    g, y = _heads(4, 12, 512, 64)  # a, b: 6 MiB each; t: 128 KiB
    src = render_body(g.spec([y]), _lowerings()).source
    assert "row tiles: U groups" in src
    pf = [ln for ln in src.splitlines() if "latch::gpf4(" in ln]
    assert pf and all("in2" not in ln for ln in pf)  # the (S, D) table is not prefetched
    assert any("in0" in ln for ln in pf) and any("in1" in ln for ln in pf)
    m = re.search(r"L2 prefetch of iteration \+(\d+)'s lines", src)
    assert m and fuse.ILP_PREFETCH_AHEAD <= int(m.group(1)) <= fuse.ILP_PREFETCH_MAX


def test_the_exact_in_float_rule_is_narrow():
    assert lower_reduce.exact_in_float("sum", 2, "double", "float", "float")
    assert not lower_reduce.exact_in_float("sum", 3, "double", "float", "float")  # three terms round twice
    assert not lower_reduce.exact_in_float("mean", 2, "double", "float", "float")
    assert not lower_reduce.exact_in_float("sum", 2, "double", "float", "double")


# ---- host runs --------------------------------------------------------------------------------

@needs_gxx
def test_the_prefetched_combine_keeps_the_bits_and_prefetches_inside_its_input(tmp_path, monkeypatch):
    """With every input prefetched (threshold 0): the vector path's outputs are the thread loop's
    bits (float sums of two, the identity first), every output is written once, each prefetch is
    a line head inside the expert rows of the tile's outputs."""
    monkeypatch.setattr(lower_reduce, "PREFETCH_MIN_BYTES", 0)
    N, K = 1500, 32  # enough groups that iterations +2 and on exist
    g, y = _combine(N, K)
    src = render_body(g.spec([y]), _lowerings()).source.replace(FUNC, "body")
    assert "latch::gpf4(in0," in src and "latch::gpf4(in1" not in src  # the weight is one load per row
    lib = _host_lib(tmp_path, HARNESS + EXTRA % _thread_per_output() + src + RUN)
    lib.st4.restype = ctypes.c_longlong
    lib.prefetches.restype = ctypes.c_longlong
    bufs, flat = random_inputs(g, 7)
    outs = []
    for lo, hi in (([5, 0], [N - 7, K]), ([5, 1], [N - 7, K - 1])):  # rows: the vector path; box: the thread loop
        out = (ctypes.c_float * (N * K))(*([float("nan")] * (N * K)))
        ptrs = (ctypes.c_void_p * 3)(ctypes.addressof(bufs[0]), ctypes.addressof(bufs[1]), ctypes.addressof(out))
        lib.run(ptrs, (ctypes.c_int * 8)(*(lo + [0] * 6)), (ctypes.c_int * 8)(*(hi + [0] * 6)))
        cap = 1 << 16
        addrs = (ctypes.c_size_t * cap)()
        n = lib.prefetches(addrs, cap)
        outs.append((list(out), list(addrs[:min(n, cap)]), lib.st4()))
    (rows, pf, st4), (box, pf_box, st4_box) = outs
    assert st4 == (N - 12) * K // 4 and st4_box == 0 and not pf_box
    x0 = ctypes.addressof(bufs[0])
    lo_b, hi_b = x0 + 4 * (2 * 5 * K), x0 + 4 * (2 * (N - 7) * K)  # the expert rows of outputs 5 .. N-8
    assert pf and all(a % 128 < 16 for a in pf)  # line heads only
    assert all(lo_b <= a < hi_b for a in pf)
    assert len({a for a in pf if lo_b <= a < hi_b}) >= 0.5 * (hi_b - lo_b) / 128  # most lines of the rows
    for i in range(N * K):
        n_, c = divmod(i, K)
        if 5 <= n_ < N - 7 and 1 <= c < K - 1:
            assert struct.pack("f", rows[i]) == struct.pack("f", box[i]), i
        if 5 <= n_ < N - 7:
            f32 = lambda a: struct.unpack("f", struct.pack("f", a))[0]  # noqa: E731
            want = f32(f32(flat["x"][2 * n_ * K + c] * flat["w"][2 * n_]) + f32(flat["x"][(2 * n_ + 1) * K + c] * flat["w"][2 * n_ + 1]))
            assert rows[i] == want, i
        else:
            assert math.isnan(rows[i]), i


@needs_gxx
def test_the_prefetched_row_tile_body_keeps_the_bits_and_prefetches_inside_its_inputs(tmp_path, monkeypatch):
    B, H, S, D = 2, 3, 256, 16  # enough groups for the iterations ahead

    def run(threshold, d):
        monkeypatch.setattr(lower_reduce, "PREFETCH_MIN_BYTES", threshold)
        g, y = _heads(B, H, S, D)
        src = render_body(g.spec([y]), _lowerings()).source.replace(FUNC, "body")
        d.mkdir()
        lib = host_library(FLAT_HARNESS + HARNESS_EXTRA + src, d)
        bufs, _ = random_inputs(g, 5)
        n = B * S * H * D
        out = (ctypes.c_float * n)(*([float("nan")] * n))
        ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(b) for b in bufs + [out]])
        lo, hi = [3, 0] + [0] * 6, [B * S - 2, H * D] + [0] * 6
        lib.run(ptrs, (ctypes.c_int * 8)(*lo), (ctypes.c_int * 8)(*hi))
        return src, list(out), prefetched(lib), bufs

    src_on, on, pf, bufs = run(0, tmp_path / "on")
    src_off, off, pf_off, _ = run(1 << 40, tmp_path / "off")
    assert "latch::gpf4(" in src_on and "latch::gpf4(" not in src_off and not pf_off
    assert [struct.pack("f", v) for v in on] == [struct.pack("f", v) for v in off]
    assert not math.isnan(on[3 * H * D]) and math.isnan(on[0])
    ranges = [(ctypes.addressof(b), ctypes.addressof(b) + 4 * len(b)) for b in bufs]
    assert pf and all(any(lo <= a < hi for lo, hi in ranges) for a in pf)
    assert all(a % 128 == 0 for a in pf)  # line heads (16-byte groups of FP32)


# ---- SASS -------------------------------------------------------------------------------------

WRAP = """#define LATCH_MAX_OPERANDS 8
#define LATCH_NUM_BODIES 1
#define LATCH_MAX_ARGS 5
#define LATCH_STAGES 4
#define LATCH_STAGE_BYTES 49152
#define LATCH_SCRATCH_BYTES 18432
#define LATCH_TICKETS 0
#include "latch_kernel.cuh"
#include "latch_elementwise.cuh"
#include "latch_reduce.cuh"
#include "latch_common.cuh"
%s
__global__ void __launch_bounds__(384, 1) wrap_k(const latch::Ctx* c) { body_under_test(*c); }
"""


def _sass(tmp_path, src: str) -> list[str]:
    """The body's SASS instructions (opcode and operands), compiled for sm_90a behind a one-call kernel."""
    cu = tmp_path / "b.cu"
    cu.write_text(WRAP % src.replace(FUNC, "body_under_test"))
    inc = [f"-I{d}" for d in include_dirs_of(_lowerings())]
    subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-cubin", *inc,
                    "-o", str(tmp_path / "b.cubin"), str(cu)], check=True, capture_output=True)
    text = subprocess.run([find_cuobjdump(), "-sass", str(tmp_path / "b.cubin")], check=True,
                          capture_output=True, text=True).stdout
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", text)]


def _longest_load_run(ins: list[str], load: str) -> int:
    """Most ``load`` instructions issued with no floating-point arithmetic between them."""
    best = cur = 0
    for i in ins:
        op = i.split()[0] if not i.startswith("@") else i.split()[1]
        if op.startswith(load):
            cur += 1
            best = max(best, cur)
        elif op.split(".")[0] in ("FMUL", "FADD", "FFMA", "DADD", "DMUL", "F2F"):
            cur = 0
    return best


@needs_sass
def test_the_combine_has_twelve_16_byte_loads_in_flight_and_prefetches(tmp_path):
    g, y = _combine(32768, 768)
    ins = _sass(tmp_path, render_body(g.spec([y]), _lowerings()).source)
    assert not any(i.split()[0] in ("LDL", "STL") or i.split()[0].startswith(("LDL.", "STL.")) for i in ins)
    # before: each group's two row loads, then its multiply (a run of 2)
    assert _longest_load_run(ins, "LDG.E.128") >= 12
    assert sum("CCTL.E.PF2" in i for i in ins) >= 12


@needs_sass
def test_the_row_tile_body_prefetches_its_full_size_inputs(tmp_path):
    g, y = _heads(32, 12, 1024, 64)
    ins = _sass(tmp_path, render_body(g.spec([y]), _lowerings()).source)
    assert not any(i.split()[0].startswith(("LDL", "STL")) for i in ins)
    assert sum("CCTL.E.PF2" in i for i in ins) >= 2  # a and b, every group of the unrolled loop
