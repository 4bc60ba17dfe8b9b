"""The wgmma forward (cuda/latch_attention_wgmma.cuh) runs on the CPU: the header is compiled with
g++ against a model of the worker (attention_emulator/wgmma_model.h, emulator_wgmma.cpp: the
producer and 256 consumer fibers, mbarriers, TMA boxes with the 128-byte swizzle, register-A wgmma
reading its B operand through the shared-memory descriptor) and gated against the FP64 reference at
odd lengths, both head dims, causal and not, grouped-query attention, Tq != Tk, tasks of one or
several tiles and rings of 2 to 5 stages. This checks the body's indexing, swizzled layouts,
masking, online softmax and its ring protocol (a disagreement between the roles hangs: the model
reports it); the hardware's asynchrony and rounding are the GPU tests' (test_gpu_attention.py)."""

from __future__ import annotations

import ctypes
import math
import shutil
from pathlib import Path

import pytest

from latch_ops import attention as A

torch = pytest.importorskip("torch")

from test_attention_emulated import build_emulator  # noqa: E402

HEADER = Path(A.__file__).parent / "cuda" / "latch_attention_wgmma.cuh"
GATE = 1e-2  # BF16 outputs and P (as the mma model's test)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_emulator(tmp_path_factory.mktemp("emu_wgmma"), HEADER, "emulator_wgmma.cpp", "-Wno-unknown-pragmas")


def _boxes(B, H, Tq, rows, heads):
    """Task boxes (b0, b1, h0, h1, r0, r1) in schedule order: ``rows`` query rows and ``heads`` heads each."""
    out = []
    for b in range(B):
        for h in range(0, H, heads):
            for r in range(0, Tq, rows):
                out += [b, b + 1, h, min(H, h + heads), r, min(Tq, r + rows)]
    return out


def _run(lib, B, H, Hkv, Tq, Tk, D, causal, stages=3, rows=128, heads=1, scale=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v = mk(B, H, Tq, D), mk(B, Hkv, Tk, D), mk(B, Hkv, Tk, D)
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = torch.full((B, H, Tq, D), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((B, H, Tq), float("nan"))
    boxes = _boxes(B, H, Tq, rows, heads)
    arr = (ctypes.c_int * len(boxes))(*boxes)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.attn_forward_wgmma(D, int(causal), B, H, Hkv, Tq, Tk, ctypes.c_float(scale), stages, len(boxes) // 6, arr,
                                p(q), p(k), p(v), p(out), p(lse))
    assert rc == 0, f"the model failed with code {rc} (emulator_wgmma.cpp attn_forward_wgmma)"
    ro, rl = A.sdpa_forward_math(q.double(), k.double(), v.double(), causal, 1 / math.sqrt(D))
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    return {"out": rel(out, ro), "lse": rel(lse, rl)}


@pytest.mark.parametrize("B, H, Hkv, Tq, Tk, D, causal, stages, rows, heads", [
    (1, 1, 1, 77, 77, 64, True, 3, 128, 1),
    (1, 2, 2, 77, 77, 128, False, 3, 128, 1),
    (1, 2, 1, 300, 300, 64, True, 3, 128, 1),      # several key blocks, the last partial; GQA
    (1, 2, 1, 300, 300, 128, True, 2, 128, 1),     # the smallest ring
    (1, 4, 2, 200, 200, 128, True, 5, 256, 2),     # tasks of two heads x two tiles, a ring that wraps unevenly
    (2, 2, 2, 256, 256, 64, False, 4, 128, 2),     # whole tiles and blocks
    (1, 1, 1, 70, 150, 64, True, 3, 128, 1),       # Tk > Tq
    (1, 1, 1, 150, 70, 128, False, 3, 128, 1),     # Tq > Tk
    (1, 1, 1, 150, 70, 64, True, 3, 128, 1),       # causal, Tq > Tk: rows past the last key see every key
])
def test_wgmma_forward_matches_fp64_on_the_cpu_model(lib, B, H, Hkv, Tq, Tk, D, causal, stages, rows, heads):
    errs = _run(lib, B, H, Hkv, Tq, Tk, D, causal, stages, rows, heads)
    assert errs["lse"] < 1e-5, errs  # FP32 from BF16 operands: exact up to FP32 sums
    assert errs["out"] < GATE, errs


def test_the_wgmma_model_catches_a_wrong_body(lib):
    errs = _run(lib, 1, 1, 1, 77, 77, 64, True, scale=0.2)
    assert errs["out"] > 10 * GATE
