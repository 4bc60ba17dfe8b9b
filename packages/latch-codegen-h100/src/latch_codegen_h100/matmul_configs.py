"""The body configurations of ``latch::matmul`` on the H100/H200 (hook ``latch_register_configs``).

The scheduler (``latch_schedule.matmul_configs``) picks one per node with its cost model and
records its name (attribute ``config``); the matmul lowering instantiates that body.

- **wgmma** (tensor cores fed by TMA): rank-2 products whose operands are BF16 or F16. ``BM = 128``,
  ``BK = 64``, ``BN`` in {16, 32, 64, 96, 128, 192, 256}; ``stage_bytes = (BM + BN) * BK * 2`` (one
  A and one B tile per pipeline stage); name ``wgmma_{BM}x{BN}x{BK}``. Legal only when
  - every operand's row stride is a multiple of 16 bytes (TMA): ``K % 8 == 0`` for ``a`` stored
    ``[M, K]``, ``M % 8`` for ``[K, M]`` (``trans_a``), ``N % 8`` for ``b`` stored ``[K, N]``,
    ``K % 8`` for ``[N, K]`` (``trans_b``);
  - ``BN`` is a multiple of 64 when ``b`` is stored ``[K, N]`` (its tile is loaded N-major, in
    64-element swizzled rows).
- **wgmma ping-pong** (``latch_gemm_pingpong.cuh``): the same legality; a task is ``128 x W`` with
  ``W`` in ``PINGPONG_WIDTHS`` (256, 512, 1024), computed as ``W / 128`` sub-tiles of 128 x 128,
  each consumer warpgroup owning whole sub-tiles in turn (one's epilogue runs while the other's
  products do); ``stage_bytes = (128 + 128) * BK * 2``; name ``wgmma_pp_128x{W}x{BK}``. The
  scheduler prices it with the ping-pong formula (``latch_schedule.matmul_configs``, names that
  start ``wgmma_pp_``).
- **simt** (CUDA cores, ``latch_matmul.cuh``): everything else (F32/F64 operands, batch dims,
  misaligned strides): ONE configuration whose tile is the scheduler's historical rule (the largest
  of 128 x 128 / 128 x 256 / 256 x 256 that still gives two waves on the 132 SMs of an H100/H200),
  name ``simt_{BM}x{BN}``; ``k_tile`` and ``stage_bytes`` are the SIMT body's (32-deep K slices of
  64 x 64 blocks in shared memory).

The function depends only on the operand/output types and the layout attributes (``trans_a``,
``trans_b``), never on ``split_k``/``out_dtype``/``config``, so a split-K partial finds the same
configuration its product was priced with.
"""

from __future__ import annotations

import math

from latch_core.configs import BodyConfig

WGMMA_BM = 128
WGMMA_BK = 64
WGMMA_BN = (16, 32, 64, 96, 128, 192, 256)
TENSOR_CORE_DTYPES = ("bf16", "f16")
PINGPONG_BN = 128  # the sub-tile one consumer warpgroup owns (latch_gemm_pingpong.cuh GEMM_PP_BN)
PINGPONG_WIDTHS = (256, 512, 1024)  # task widths: 2, 4, 8 sub-tiles

# The SIMT body (latch_matmul.cuh): MM_BM = MM_BN = 64, MM_BK = 32, MM_PAD = 1.
SIMT_BK = 32
SIMT_TILES = ((128, 128), (128, 256), (256, 256))
SIMT_WAVES = 2
NUM_SMS = 132  # H100 SXM / H200


def _dims(a, b, attrs):
    ta, tb = bool(attrs.get("trans_a", False)), bool(attrs.get("trans_b", False))
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    n = b.shape[-2] if tb else b.shape[-1]
    return m, k, n, ta, tb


def aligned(m: int, k: int, n: int, ta: bool, tb: bool) -> bool:
    """Every operand's row stride (in 2-byte elements) is a multiple of 16 bytes."""
    a_row = m if ta else k
    b_row = k if tb else n
    return a_row % 8 == 0 and b_row % 8 == 0


def simt_config(batch: int, m: int, n: int, acc_bytes: int = 4) -> BodyConfig:
    bm, bn = SIMT_TILES[0]
    for tm, tn in SIMT_TILES[1:]:
        if batch * math.ceil(m / tm) * math.ceil(n / tn) >= SIMT_WAVES * NUM_SMS:
            bm, bn = tm, tn
    smem = acc_bytes * SIMT_BK * ((64 + 1) + (64 + 1))
    return BodyConfig(f"simt_{bm}x{bn}", (bm, bn), SIMT_BK, smem, "simt",
                      notes="latch_matmul.cuh: 64x64 blocks, K slices of 32, FMA in registers")


def configs(in_types, out_types, attrs) -> list[BodyConfig]:
    """``fn(in_types, out_types, attrs)`` of ``latch_register_configs`` for ``latch::matmul``."""
    a, b = in_types[0], in_types[1]
    m, k, n, ta, tb = _dims(a, b, attrs)
    batch = math.prod(a.shape[:-2])
    if len(a.shape) == 2 and a.dtype in TENSOR_CORE_DTYPES and b.dtype == a.dtype and aligned(m, k, n, ta, tb):
        out = []
        for bn in WGMMA_BN:
            if not tb and bn % 64:
                continue
            out.append(BodyConfig(f"wgmma_{WGMMA_BM}x{bn}x{WGMMA_BK}", (WGMMA_BM, bn), WGMMA_BK,
                                  (WGMMA_BM + bn) * WGMMA_BK * 2, "wgmma",
                                  notes=f"TMA + wgmma, b stored {'[N, K]' if tb else '[K, N]'}"))
        for w in PINGPONG_WIDTHS:
            out.append(BodyConfig(f"wgmma_pp_{WGMMA_BM}x{w}x{WGMMA_BK}", (WGMMA_BM, w), WGMMA_BK,
                                  (WGMMA_BM + PINGPONG_BN) * WGMMA_BK * 2, "wgmma",
                                  notes=f"ping-pong: {w // PINGPONG_BN} sub-tiles of 128 x {PINGPONG_BN}, the two "
                                        "consumer warpgroups alternating (epilogue under the other's products)"))
        return out
    return [simt_config(batch, m, n, 8 if a.dtype == "f64" else 4)]
