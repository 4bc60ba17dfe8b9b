"""The matmul bodies (cuda/latch_gemm.cuh: the cooperative body; cuda/latch_gemm_pingpong.cuh: the
ping-pong body) run on the CPU: the headers are compiled with g++ against a model of the worker
(gemm_emulator/gemm_model.h, emulator_gemm.cpp: the producer and 256 consumer fibers, mbarriers
that refuse an arrival past their count, 2-D TMA loads and stores with the 128-byte swizzle, wgmma
reading A and B through their shared-memory descriptors) and gated against the FP64 product of the
same BF16 operands, in the three layouts of a training step, with BF16 and FP32 outputs through
both epilogues (registers; shared memory and TMA stores), tasks of one or several sub-tiles (an odd
count leaves a ping-pong warpgroup idle), ragged edges, K not a multiple of 64, and rings of 2 to 5
stages. Checked too: every output element written (the output starts as NaN), and every consumer
thread ends each body with the same ``async_stores`` (the worker reads it per thread). The
hardware's asynchrony and rounding are the GPU's (bench-matmul)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_attention_emulated import build_emulator  # noqa: E402

HERE = Path(__file__).parent
CUDA = HERE.parent / "src" / "latch_ops" / "cuda"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_emulator(tmp_path_factory.mktemp("emu_gemm"), [CUDA / "latch_gemm.cuh", CUDA / "latch_gemm_pingpong.cuh"],
                          "emulator_gemm.cpp", "-Wno-unknown-pragmas", models=("attention_emulator", "gemm_emulator"),
                          timeout=600)


def _boxes(M, N, bm, bw):
    return [(m, min(M, m + bm), n, min(N, n + bw)) for m in range(0, M, bm) for n in range(0, N, bw)]


def _run(lib, M, N, K, ta, tb, pp, tma, f32, stages, bw, bm=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((K, M) if ta else (M, K), generator=g).to(torch.bfloat16)
    b = torch.randn((N, K) if tb else (K, N), generator=g).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.float32 if f32 else torch.bfloat16)
    boxes = _boxes(M, N, bm, bw)
    flat = [x for bx in boxes for x in bx]
    arr = (ctypes.c_int * len(flat))(*flat)
    asy = torch.full((len(boxes), 256), -1, dtype=torch.int32)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.gemm_emulated(M, N, K, int(ta), int(tb), int(pp), int(tma), int(f32), stages, len(boxes), arr,
                           p(a), p(b), p(out), p(asy), 8)
    assert rc == 0, f"the model failed with code {rc} (emulator_gemm.cpp gemm_emulated)"
    A = a.double().t() if ta else a.double()
    B = b.double().t() if tb else b.double()
    ref = A @ B
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements never written"
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < (1e-5 if f32 else 4e-3), rel
    # every consumer thread ends a body alike: the worker's done/pending bookkeeping reads it per thread
    assert bool((asy == asy[:, :1]).all()), asy
    return asy


LAYOUTS = {"fwd": (False, True), "dgrad": (False, False), "wgrad": (True, False)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("tma,f32", [(True, False), (True, True), (False, False)])
def test_pingpong_body_matches_fp64_in_every_layout_and_epilogue(lib, layout, tma, f32):
    ta, tb = LAYOUTS[layout]
    # tasks of 128 x 384 (three sub-tiles: warpgroup 0 takes two), ragged edges in M and N, K = 200
    asy = _run(lib, 200, 328, 200, ta, tb, pp=True, tma=tma, f32=f32, stages=3, bw=384)
    assert bool((asy == (1 if tma else 0)).all())


@pytest.mark.parametrize("stages", [2, 4, 5])
@pytest.mark.parametrize("bw,bm", [(128, 128), (256, 128), (512, 256)])
def test_pingpong_ring_protocol_over_task_shapes_and_ring_depths(lib, stages, bw, bm):
    # one sub-tile per task (warpgroup 1 idle: it still covers its earlier stores), two, and boxes of
    # several sub-tile rows (the turn order runs on across the box's rows)
    _run(lib, 256, 512, 320, False, True, pp=True, tma=True, f32=False, stages=stages, bw=bw, bm=bm, seed=stages)


def _raw(lib, M, N, K, boxes, empty_count=8, stages=2):
    a = torch.ones((M, max(K, 8)), dtype=torch.bfloat16)
    b = torch.ones((N, max(K, 8)), dtype=torch.bfloat16)
    out = torch.full((M, N), float("nan"))
    flat = [x for bx in boxes for x in bx]
    arr = (ctypes.c_int * len(flat))(*flat)
    asy = torch.zeros((len(boxes), 256), dtype=torch.int32)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.gemm_emulated(M, N, K, 0, 1, 1, 1, 1, stages, len(boxes), arr, p(a), p(b), p(out), p(asy), empty_count)
    return rc, out


def test_pingpong_k_zero_writes_zeros(lib):
    rc, out = _raw(lib, 128, 256, 0, [(0, 128, 0, 256)])
    assert rc == 0 and bool((out == 0).all())


def test_the_model_refuses_releases_past_an_empty_barriers_count(lib):
    # the reading warpgroup's four warps arrive twice each (8, the worker's count); with a count of
    # 4 or 16 the stages' phases go wrong, and the model reports it (an over-arrival, code 6, or a
    # wait that never completes, code 1) instead of passing silently
    for count in (4, 16):
        rc, _ = _raw(lib, 128, 256, 128, [(0, 128, 0, 256)], empty_count=count)
        assert rc in (1, 6), (count, rc)
    assert _raw(lib, 128, 256, 128, [(0, 128, 0, 256)])[0] == 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cooperative_body_still_matches_after_the_slot_change(lib, layout):
    ta, tb = LAYOUTS[layout]
    _run(lib, 200, 328, 200, ta, tb, pp=False, tma=True, f32=False, stages=3, bw=256)
