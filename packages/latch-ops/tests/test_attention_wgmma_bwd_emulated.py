"""The wgmma backward (cuda/latch_attention_wgmma_bwd.cuh) runs on the CPU: the header is compiled
with g++ against the wgmma forward's model of the worker (attention_emulator/wgmma_model.h,
emulator_wgmma_bwd.cpp: producer and 256 consumer fibers, mbarriers with transaction bytes, 3-D TMA
boxes with the 128-byte swizzle and zero fill, 1-D boxes of lse/glse, SS and register-A wgmma
decoding the descriptors, the block-wide and per-warpgroup named barriers) and gated against the
FP64 reference at odd lengths (77, 1000), both head dims, causal and not, grouped-query attention, a
gradient of lse, Tq != Tk, tasks of one or several row blocks and heads, rings of 2 to 5 stages.
Determinism is checked as bit-identity of two runs; the hardware's asynchrony and rounding are the
GPU tests' (latch-check test_gpu_attention.py)."""

from __future__ import annotations

import ctypes
import math
import shutil

import pytest

from latch_ops import attention as A

torch = pytest.importorskip("torch")

from test_attention_emulated import build_emulator  # noqa: E402
from test_attention_wgmma_emulated import HEADER as FWD_HEADER  # noqa: E402

HEADER = FWD_HEADER.parent / "latch_attention_wgmma_bwd.cuh"
GATE = 1e-2  # BF16 outputs, P and dS rounded to BF16 as the products' operands (as the mma model's test)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("emu_wgmma_bwd")
    shutil.copy(FWD_HEADER, d / FWD_HEADER.name)  # the backward header includes the forward's
    return build_emulator(d, HEADER, "emulator_wgmma_bwd.cpp", "-Wno-unknown-pragmas")


VARIANTS = (1, 2)  # latch::awg's backward bodies: "wgmma", "wgmma2" (overlapped)


def _boxes(B, H, Tq, rows, heads):
    """Task boxes (b0, b1, h0, h1, r0, r1) in schedule order: ``rows`` (a multiple of 64) query rows and
    ``heads`` (a multiple of the group) query heads each, as tiling_sdpa_backward makes them."""
    out = []
    for b in range(B):
        for h in range(0, H, heads):
            for r in range(0, Tq, rows):
                out += [b, b + 1, h, min(H, h + heads), r, min(Tq, r + rows)]
    return out


def _inputs(B, H, Hkv, Tq, Tk, D, causal, glse, seed):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v, go = mk(B, H, Tq, D), mk(B, Hkv, Tk, D), mk(B, Hkv, Tk, D), mk(B, H, Tq, D)
    gl = torch.randn(B, H, Tq, generator=g) if glse else None
    out, lse = A.sdpa_forward_math(q.double(), k.double(), v.double(), causal, 1 / math.sqrt(D))
    return q, k, v, go, gl, out.to(torch.bfloat16), lse.float()


def _backward(lib, ins, B, H, Hkv, Tq, Tk, D, causal, stages, rows, heads, scale, variant=1):
    q, k, v, go, gl, out, lse = ins
    assert lib.attn_backward_wgmma_variant(variant) == 0
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    boxes = _boxes(B, H, Tq, rows, heads)
    arr = (ctypes.c_int * len(boxes))(*boxes)
    p = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.attn_backward_wgmma(D, int(causal), B, H, Hkv, Tq, Tk, ctypes.c_float(scale), stages, len(boxes) // 6, arr,
                                 p(q), p(k), p(v), p(go), p(out), p(lse), p(gl), p(dq), p(dk), p(dv))
    assert rc == 0, f"the model failed with code {rc} (emulator_wgmma_bwd.cpp attn_backward_wgmma)"
    return dq, dk, dv


def _run(lib, B, H, Hkv, Tq, Tk, D, causal, glse=False, stages=3, rows=64, heads=None, scale=None, seed=0, variant=1):
    heads = H // Hkv if heads is None else heads
    ins = _inputs(B, H, Hkv, Tq, Tk, D, causal, glse, seed)
    scale = 1 / math.sqrt(D) if scale is None else scale
    got = _backward(lib, ins, B, H, Hkv, Tq, Tk, D, causal, stages, rows, heads, scale, variant)
    d = lambda t: None if t is None else t.double()  # noqa: E731
    q, k, v, go, gl, out, lse = ins
    want = A.sdpa_backward_math(d(go), d(gl), d(q), d(k), d(v), d(out), d(lse), causal, 1 / math.sqrt(D))
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    return {n: rel(a, b) for n, a, b in zip(("dq", "dk", "dv"), got, want)}, got


@pytest.mark.parametrize("B, H, Hkv, Tq, Tk, D, causal, glse, stages, rows, heads", [
    (1, 1, 1, 77, 77, 64, True, False, 3, 64, None),
    (1, 2, 2, 77, 77, 128, False, False, 3, 64, None),
    (1, 4, 2, 150, 150, 64, True, True, 4, 64, None),      # GQA, a gradient of lse
    (1, 2, 1, 200, 200, 128, True, False, 2, 128, None),   # GQA, the smallest ring, tasks of two row blocks
    (1, 4, 2, 130, 130, 128, False, True, 5, 128, 4),      # tasks of two groups, a ring that wraps unevenly
    (1, 1, 1, 70, 150, 64, True, False, 3, 64, None),      # Tk > Tq: the last task takes the trailing keys
    (1, 1, 1, 150, 70, 128, False, True, 3, 64, None),     # Tq > Tk: tasks past the last key block: no dk/dv rows
    (2, 2, 2, 64, 64, 64, False, False, 3, 64, None),      # exactly one block
    (2, 4, 2, 77, 77, 64, True, False, 3, 64, None),       # the H200 fault (run 45): lse boxes of heads past the first
])
@pytest.mark.parametrize("variant", VARIANTS)
def test_wgmma_backward_matches_fp64_on_the_cpu_model(lib, B, H, Hkv, Tq, Tk, D, causal, glse, stages, rows, heads,
                                                      variant):
    errs, _ = _run(lib, B, H, Hkv, Tq, Tk, D, causal, glse, stages, rows, heads, variant=variant)
    assert all(e < GATE for e in errs.values()), errs


@pytest.mark.parametrize("D, causal, variant", [(64, True, 1), (128, False, 1), (64, False, 2), (128, True, 2)])
def test_wgmma_backward_at_length_1000(lib, D, causal, variant):
    errs, _ = _run(lib, 1, 1, 1, 1000, 1000, D, causal, glse=True, stages=4, rows=128, variant=variant)
    assert all(e < GATE for e in errs.values()), errs


def test_wgmma_backward_is_bit_identical_across_runs_and_rings(lib):
    ins = _inputs(1, 2, 1, 150, 150, 64, True, True, 3)
    a = _backward(lib, ins, 1, 2, 1, 150, 150, 64, True, 3, 64, 2, 1 / 8)
    b = _backward(lib, ins, 1, 2, 1, 150, 150, 64, True, 5, 128, 2, 1 / 8)  # another ring and tiling
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))


@pytest.mark.parametrize("D", [64, 128])
def test_wgmma2_gives_the_bits_of_wgmma(lib, D):
    """The overlapped body (variant 2, attention_body="wgmma2") computes the same sums in the same
    order as variant 1: the same bits, at an odd length with GQA and a gradient of lse."""
    ins = _inputs(1, 4, 2, 150, 150, D, True, True, 1)
    a = _backward(lib, ins, 1, 4, 2, 150, 150, D, True, 3, 64, 2, 0.125, variant=1)
    b = _backward(lib, ins, 1, 4, 2, 150, 150, D, True, 4, 128, 2, 0.125, variant=2)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))


def test_the_model_runs_a_product_only_at_its_wait(tmp_path):
    """The model's wgmma is asynchronous: a product runs at the wait that retires its group. Built with
    LATCH_EMU_WAIT_SLACK=1 (every wait<N > 0> leaves one more group in flight), variant 2, which
    reads S after wait<1>, computes P from S before its product ran and fails the gate; variant 1
    (only wait<0>) is unaffected."""
    shutil.copy(FWD_HEADER, tmp_path / FWD_HEADER.name)
    slack = build_emulator(tmp_path, HEADER, "emulator_wgmma_bwd.cpp", "-Wno-unknown-pragmas", "-DLATCH_EMU_WAIT_SLACK=1")
    errs, _ = _run(slack, 1, 1, 1, 77, 77, 64, True, variant=1)
    assert all(e < GATE for e in errs.values()), errs
    errs, _ = _run(slack, 1, 1, 1, 77, 77, 64, True, variant=2)
    assert not any(e < GATE for e in errs.values()), errs


def test_the_wgmma_backward_model_catches_a_wrong_body(lib):
    errs, _ = _run(lib, 1, 1, 1, 77, 77, 64, True, scale=0.2)
    assert min(errs.values()) > 10 * GATE, errs
