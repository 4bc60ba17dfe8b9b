"""The tensor-core attention bodies (cuda/latch_attention_mma.cuh) run on the CPU: the header is
compiled with g++ against a model of the warp (attention_emulator/: 256 fibers, warp shuffles and
mma.sync m16n8k16 with the PTX fragment layouts) and gated against the FP64 reference at odd
lengths, both head dims, causal and not, grouped-query attention, a gradient of lse, Tq != Tk.
This checks the bodies' indexing, masking, online softmax and partial sums without a GPU; the
hardware's own rounding and the memory model are the GPU tests' (latch-check test_gpu_attention)."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from latch_ops import attention as A

torch = pytest.importorskip("torch")

HERE = Path(__file__).parent
HEADER = Path(A.__file__).parent / "cuda" / "latch_attention_mma.cuh"
GATE = 1e-2  # BF16 outputs and P: ~2e-3 measured here; a wrong index or mask gives O(1e-1)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def build_emulator(d: Path, headers, source: str, *flags: str, models=("attention_emulator",),
                   timeout: int = 300) -> ctypes.CDLL:
    """The emulator ``source`` (a file of one of the ``models`` directories next to the tests) with the
    body header(s) ``headers`` beside every file of those directories, compiled with g++ in
    directory ``d`` and loaded. The attention, gemm and route emulators all build through it."""
    for m in models:
        for f in (HERE / m).iterdir():
            shutil.copy(f, d / f.name)
    for h in ([headers] if isinstance(headers, Path) else headers):
        shutil.copy(h, d / h.name)
    so = d / (Path(source).stem + ".so")
    r = subprocess.run(["g++", "-std=c++20", "-O2", "-fno-strict-aliasing", *flags, "-shared", "-fPIC", "-o", str(so),
                        str(d / source)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return ctypes.CDLL(str(so))


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_emulator(tmp_path_factory.mktemp("emu"), HEADER, "emulator.cpp")


def _p(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _run(lib, B, H, Hkv, Tq, Tk, D, causal, glse=False, scale=None, seed=0, f32=False):
    g = torch.Generator().manual_seed(seed)
    dt = torch.float32 if f32 else torch.bfloat16
    mk = lambda *s: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    q, k, v, go = mk(B, H, Tq, D), mk(B, Hkv, Tk, D), mk(B, Hkv, Tk, D), mk(B, H, Tq, D)
    gl = torch.randn(B, H, Tq, generator=g) if glse else None
    scale = 1 / math.sqrt(D) if scale is None else scale
    ll, f = ctypes.c_longlong, ctypes.c_float
    out, lse = torch.zeros(B, H, Tq, D, dtype=dt), torch.zeros(B, H, Tq)
    assert lib.attn_forward(D, int(causal), int(f32), B, H, Hkv, ll(Tq), ll(Tk), f(scale), _p(q), _p(k), _p(v), _p(out),
                            _p(lse)) == 0
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    assert lib.attn_backward(D, int(causal), int(f32), B, H, Hkv, ll(Tq), ll(Tk), f(scale), _p(go), _p(gl), _p(q), _p(k), _p(v),
                             _p(out), _p(lse), _p(dq), _p(dk), _p(dv)) == 0
    true_scale = 1 / math.sqrt(D)
    # FP32 storage: the body rounds its operands to BF16 (operand_dtype); the reference takes them as
    # stored, so the gate also covers that rounding
    d = lambda t: None if t is None else t.double()  # noqa: E731
    ro, rl = A.sdpa_forward_math(d(q), d(k), d(v), causal, true_scale)
    # the backward's reference uses the body's own out and lse (as the op's backward does)
    want = A.sdpa_backward_math(d(go), d(gl), d(q), d(k), d(v), d(out), d(lse), causal, true_scale)
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    return {"out": rel(out, ro), "lse": rel(lse, rl), "dq": rel(dq, want[0]), "dk": rel(dk, want[1]),
            "dv": rel(dv, want[2])}


@pytest.mark.parametrize("B, H, Hkv, Tq, Tk, D, causal, glse, f32", [
    (1, 1, 1, 77, 77, 64, True, False, False),
    (1, 2, 2, 77, 77, 128, False, False, False),
    (1, 4, 2, 150, 150, 64, True, True, False),
    (1, 2, 1, 200, 200, 128, True, False, False),
    (1, 1, 1, 70, 150, 64, True, False, False),    # Tk > Tq: the last backward task takes the trailing keys
    (1, 1, 1, 150, 70, 64, False, True, False),    # Tq > Tk: tasks past the last key block have no dk/dv rows
    (2, 2, 2, 64, 64, 64, False, False, False),    # exactly one block
    (1, 2, 1, 77, 77, 64, True, True, True),       # FP32 storage, BF16 operands (the models' policy)
    (1, 2, 2, 130, 130, 128, False, False, True),
])
def test_mma_bodies_match_fp64_on_the_cpu_model(lib, B, H, Hkv, Tq, Tk, D, causal, glse, f32):
    errs = _run(lib, B, H, Hkv, Tq, Tk, D, causal, glse, f32=f32)
    # lse in FP32 from BF16 operands: exact up to FP32 sums; from FP32 values it also carries their
    # rounding to BF16 (~2e-4 relative)
    assert errs["lse"] < (1e-3 if f32 else 1e-5), errs
    assert all(e < GATE for e in errs.values()), errs


def test_the_model_catches_a_wrong_body(lib):
    # the same run with a scale the reference does not use: the gate must fail (the check can fail)
    errs = _run(lib, 1, 1, 1, 77, 77, 64, True, scale=0.2)
    assert errs["out"] > 10 * GATE
