"""Lowering of ``latch::matmul`` (latch_ops/matmul.py): a[*B, M, K] @ b[*B, K, N] -> out[*B, M, N].

Attributes (all optional): ``trans_a`` (a stored [*B, K, M]), ``trans_b`` (b stored [*B, N, K]),
``out_dtype`` (the output operand's dtype), ``split_k`` = S (the output has a leading split dim
[S, *B, M, N]; partial s sums K in [s * chunk, min(K, (s + 1) * chunk)), chunk = ``split_chunk`` if
given, else ceil(K / S)), ``config`` (the body configuration the scheduler chose, e.g.
``wgmma_128x96x64``: latch_codegen_h100.matmul_configs).

Two bodies:
- **wgmma** (latch_ops/cuda/latch_gemm.cuh): rank-2 products (plus the split dim) of BF16 or F16
  operands whose rows are 16-byte aligned: TMA loads into the worker's ring, wgmma into FP32
  accumulators, the store fused into the epilogue. A task's box is computed in 128 x BN sub-tiles.
  Taken when the node's ``config`` names it, or, with no ``config``, whenever it is legal.
  Configuration ``wgmma_pp_128x<W>x64`` (W a multiple of 128) is its **ping-pong** form
  (latch_ops/cuda/latch_gemm_pingpong.cuh): the same producer half over 128 x 128 sub-tiles,
  each consumer warpgroup computing whole sub-tiles in turn, so one's epilogue overlaps the
  other's products; a task's box is 128 x W (W / 128 sub-tiles), every epilogue below applies.
  The epilogue goes through shared memory and TMA stores (``GemmStoreTma``: the consumers return
  to the next tile while the copy engine writes this one; a third tensor map, 8 KiB of scratch per
  ``epilogue_slots``, 16 KiB by default)
  when :func:`tma_store` allows it: no split-K, a BF16/F16/F32 output whose rows are 16-byte
  multiples, and BN whole 128-byte box rows (BN % 64 for 2-byte outputs, BN % 32 for FP32);
  otherwise the accumulators are stored from registers (``GemmStore``).
- **simt** (latch_ops/cuda/latch_matmul.cuh): everything else (FP32/FP64 operands, batch dims);
  ``operand_dtype`` ("bf16"/"f16") rounds the operands before the multiply, ``accum_dtype`` "f32"
  (the default) accumulates in float, f64 operands in double.
"""

from __future__ import annotations

import math
import re

from .lowering import BodyContext, Lowering, LoweringError, OnlyWhen, TensorMap

HEADER = "latch_matmul.cuh"
GEMM_HEADER = "latch_gemm.cuh"
PINGPONG_HEADER = "latch_gemm_pingpong.cuh"
BM, BK = 128, 64
WGMMA_N = (16, 32, 64, 96, 128, 192, 256)
CONFIG = re.compile(r"wgmma_(\d+)x(\d+)x(\d+)$")
PINGPONG = re.compile(r"wgmma_pp_(\d+)x(\d+)x(\d+)$")
PINGPONG_BN = 128  # latch_gemm_pingpong.cuh GEMM_PP_BN: the sub-tile one warpgroup owns is 128 x 128


# --------------------------------------------------------------------------------------------
# Shapes and attributes shared by both bodies

class _Mm:
    """The product a node computes, in M/N/K terms, whatever its operand layouts."""

    def __init__(self, ctx: BodyContext):
        a, b = ctx.inputs
        out = ctx.outputs[0]
        self.ta = bool(ctx.attr("trans_a", False))
        self.tb = bool(ctx.attr("trans_b", False))
        self.split = int(ctx.attr("split_k", 0) or 0)
        self.M = a.shape[-1] if self.ta else a.shape[-2]
        self.K = a.shape[-2] if self.ta else a.shape[-1]
        self.N = b.shape[-2] if self.tb else b.shape[-1]
        chunk = ctx.attr("split_chunk")
        self.chunk = int(chunk) if chunk else (math.ceil(self.K / self.split) if self.split else self.K)
        self.batch_dims = out.rank - 2 - (1 if self.split else 0)
        self.a, self.b, self.out = a, b, out


def _config(ctx: BodyContext, mm: _Mm) -> tuple[int, int] | None:
    """(BM, BN) of the wgmma body, or None when the SIMT body must compute this node."""
    cfg = ctx.attr("config")
    if isinstance(cfg, str) and not cfg.startswith("wgmma_"):
        return None
    a, b = mm.a, mm.b
    if a.dtype not in ("bf16", "f16") or b.dtype != a.dtype or mm.batch_dims:
        if cfg:
            raise ctx.fail(f"config {cfg!r} needs rank-2 BF16/F16 operands; got a {a.dtype}{list(a.shape)}, "
                           f"b {b.dtype}{list(b.shape)}")
        return None
    if any(d % 8 for d in (a.shape[-1], b.shape[-1])):  # TMA: 16-byte row strides
        if cfg:
            raise ctx.fail(f"config {cfg!r}: the operands' rows ({a.shape[-1]}, {b.shape[-1]} elements) must be "
                           "multiples of 8 elements (16 bytes) for TMA")
        return None
    if mm.split and mm.chunk % BK:
        if cfg:
            raise ctx.fail(f"config {cfg!r}: a split-K chunk of {mm.chunk} is not a multiple of {BK}")
        return None
    if cfg and cfg.startswith("wgmma_pp_"):
        m = PINGPONG.match(cfg)
        bm, bw, bk = (int(x) for x in m.groups()) if m else (0, 0, 0)
        if not m or bm != BM or bk != BK or bw % PINGPONG_BN:
            raise ctx.fail(f"config {cfg!r} is not one the ping-pong body runs (wgmma_pp_{BM}x<W>x{BK}, W a "
                           f"multiple of {PINGPONG_BN}: a task of W / {PINGPONG_BN} sub-tiles of {BM} x {PINGPONG_BN})")
        return BM, PINGPONG_BN
    if cfg:
        m = CONFIG.match(cfg)
        if not m:
            raise ctx.fail(f"unknown matmul config {cfg!r}; expected wgmma_<BM>x<BN>x<BK>")
        bm, bn, bk = (int(x) for x in m.groups())
        if bm != BM or bk != BK or bn not in WGMMA_N or (not mm.tb and bn % 64):
            raise ctx.fail(f"config {cfg!r} is not one the wgmma body runs (BM {BM}, BK {BK}, BN in {WGMMA_N}, "
                           "BN a multiple of 64 when b is stored [K, N])")
        return bm, bn
    if mm.tb:
        bn = next(n for n in WGMMA_N if n >= min(mm.N, 128))
    else:
        bn = 128 if mm.N > 64 else 64
    return BM, bn


# --------------------------------------------------------------------------------------------
# wgmma body

def _split_loop(mm: _Mm, ctx: BodyContext, shared: bool = False) -> tuple[list[str], str, str]:
    """Lines opening the loop over the task's split indices (one pass without split-K) and the
    K-range expressions; the caller closes the block. ``shared``: the wgmma body, whose sizes are
    run-time constants (``c.args``: M, N, K, chunk) so that one function serves every shape."""
    M, N, K, chunk = ("c.args[0]", "c.args[1]", "c.args[2]", "c.args[3]") if shared else (mm.M, mm.N, mm.K, mm.chunk)
    if not mm.split:
        return [f"{{ const int k_begin = 0, k_end = (int){K}; const long long c_off = 0;"], "k_begin", "k_end"
    return [
        "for (int s = c.t->lo[0]; s < c.t->hi[0]; ++s) {",
        f"  const int k_begin = s * (int){chunk}, k_end = min((int){K}, (s + 1) * (int){chunk});",
        f"  const long long c_off = (long long)s * {M} * {N};",
    ], "k_begin", "k_end"


def _pingpong(ctx: BodyContext) -> bool:
    """The node's configuration is the ping-pong body's (legality: :func:`_config`)."""
    cfg = ctx.attr("config")
    return isinstance(cfg, str) and cfg.startswith("wgmma_pp_")


def _args(ctx: BodyContext) -> tuple[int, ...]:
    mm = _Mm(ctx)
    return (mm.M, mm.N, mm.K, mm.chunk) if _is_wgmma(ctx) else ()


def _box(mm: _Mm) -> str:
    r = mm.out.rank
    return (f"const int m_lo = c.t->lo[{r - 2}], m_hi = c.t->hi[{r - 2}], "
            f"n_lo = c.t->lo[{r - 1}], n_hi = c.t->hi[{r - 1}];")


def _wgmma_args(ctx: BodyContext) -> tuple[_Mm, int, str]:
    mm = _Mm(ctx)
    cfg = _config(ctx, mm)
    assert cfg is not None
    _, bn = cfg
    tmpl = f"{BM}, {bn}, {'true' if mm.ta else 'false'}, {'true' if mm.tb else 'false'}"
    return mm, bn, tmpl


TMA_STORE_DTYPES = {"bf16": 2, "f16": 2, "f32": 4}
EPILOGUE_SLOTS = 2  # latch_gemm.cuh GemmStoreTma: 1 KiB boxes staged per consumer warp (node attr epilogue_slots)


def epilogue_slots(ctx: BodyContext) -> int:
    return int(ctx.attr("epilogue_slots") or EPILOGUE_SLOTS)


def tma_store_smem(slots: int) -> int:
    return 8 * 1024 * slots  # latch_gemm.cuh gemm_tma_store_smem: SLOTS KiB per consumer warp


def tma_store(mm: _Mm, bn: int) -> bool:
    """Whether the wgmma body's epilogue goes through shared memory and TMA stores (module docstring)."""
    es = TMA_STORE_DTYPES.get(mm.out.dtype)
    return bool(es) and not mm.split and (mm.N * es) % 16 == 0 and bn % (128 // es) == 0


def _wgmma_body(ctx: BodyContext) -> str:
    mm, bn, tmpl = _wgmma_args(ctx)
    out = mm.out
    lines = [_box(mm), "latch::Pipe p = c.pipe;"]
    head, kb, ke = _split_loop(mm, ctx, shared=True)
    lines += head
    regs = f"{{{out.ptr} + c_off, c.args[1], m_hi, n_hi, (c.args[1] & 1) == 0}}"
    if tma_store(mm, bn):
        lines.append(f"  latch::GemmStoreTma<{out.ctype}, {epilogue_slots(ctx)}> epi{{{regs}, {ctx.tmap(2)}, {ctx.smem}, (int)c.args[0], "
                     "(int)c.args[1], &c.async_stores};")
    else:
        lines.append(f"  latch::GemmStore<{out.ctype}> epi{regs};")
    if _pingpong(ctx):
        flags = f"{'true' if mm.ta else 'false'}, {'true' if mm.tb else 'false'}"
        lines.append(f"  if (!latch::gemm_pp_consume<{mm.a.ctype}, {flags}>(p, epi, m_lo, m_hi, n_lo, n_hi, {kb}, {ke})) return;")
    else:
        lines.append(f"  if (!latch::gemm_consume<{mm.a.ctype}, {tmpl}>(p, epi, m_lo, m_hi, n_lo, n_hi, {kb}, {ke})) return;")
    lines.append("}")
    return "\n".join(lines)


def _wgmma_producer(ctx: BodyContext) -> str:
    mm, bn, tmpl = _wgmma_args(ctx)
    lines = [_box(mm)]
    head, kb, ke = _split_loop(mm, ctx, shared=True)
    lines += head
    lines.append(f"  if (!latch::gemm_produce<{tmpl}>(p, {ctx.tmap(0)}, {ctx.tmap(1)}, m_lo, m_hi, n_lo, n_hi, "
                 f"{kb}, {ke})) return false;")
    lines.append("}")
    return "\n".join(lines)


def _tensor_maps(ctx: BodyContext) -> list[TensorMap]:
    mm, bn, _ = _wgmma_args(ctx)
    # a: [M, K] K-major, boxes of 64 K x 128 rows; [K, M] M-major, boxes of 64 M x 64 K rows.
    amap = TensorMap(0, (mm.M, mm.K), (64, 64)) if mm.ta else TensorMap(0, (mm.K, mm.M), (64, BM))
    # b: [N, K] K-major, boxes of 64 K x BN rows; [K, N] N-major, boxes of 64 N x 64 K rows.
    bmap = TensorMap(1, (mm.K, mm.N), (64, bn)) if mm.tb else TensorMap(1, (mm.N, mm.K), (64, 64))
    if not tma_store(mm, bn):
        return [amap, bmap]
    # the output (TMA stores): boxes of one 128-byte row x 8 rows (GemmStoreTma)
    cw = 128 // TMA_STORE_DTYPES[mm.out.dtype]
    return [amap, bmap, TensorMap(2, (mm.N, mm.M), (cw, 8))]


def _stage_bytes(ctx: BodyContext) -> int:
    _, bn, _ = _wgmma_args(ctx)
    return (BM + bn) * BK * 2


# --------------------------------------------------------------------------------------------
# SIMT body

def _acc(ctx: BodyContext) -> str:
    if ctx.attr("accum_dtype") == "f64" or ctx.inputs[0].dtype == "f64":
        return "double"
    return "float"


def _round(ctx: BodyContext) -> int:
    return {None: 0, "f32": 0, "f64": 0, "bf16": 1, "f16": 2}[ctx.attr("operand_dtype")]


def _simt_body(ctx: BodyContext) -> str:
    mm = _Mm(ctx)
    a, b, out = mm.a, mm.b, mm.out
    r = out.rank
    nb = mm.batch_dims
    bdims = list(range(1 if mm.split else 0, r - 2))  # the batch dims of the output
    bstrides, acc = [], 1
    for d in reversed(bdims):
        bstrides.append(acc)
        acc *= out.shape[d]
    bstrides.reverse()
    ta, tb = ("true" if mm.ta else "false"), ("true" if mm.tb else "false")
    lines = []
    head, _, _ = _split_loop(mm, ctx)
    lines += head
    call = (f"latch::matmul_tile<{a.ctype}, {b.ctype}, {out.ctype}, {_acc(ctx)}, {_round(ctx)}, {ta}, {tb}>"
            f"({a.ptr}, {b.ptr}, {out.ptr} + c_off, {mm.M}LL, {mm.N}LL, {mm.K}LL, {{blo}}, {{bhi}}, "
            f"c.t->lo[{r - 2}], c.t->hi[{r - 2}], c.t->lo[{r - 1}], c.t->hi[{r - 1}], {ctx.smem}, k_begin, k_end);")
    if nb == 0:
        lines.append("  " + call.format(blo="0LL", bhi="1LL"))
    elif nb == 1:
        d = bdims[0]
        lines.append("  " + call.format(blo=f"(long long)c.t->lo[{d}]", bhi=f"(long long)c.t->hi[{d}]"))
    else:
        # A box over several batch dims is not one flat range: walk it one flat batch index at a time.
        ext = " * ".join(f"((long long)c.t->hi[{d}] - c.t->lo[{d}])" for d in bdims)
        lines.append(f"  const long long nbatch = {ext};")
        lines.append("  for (long long i = 0; i < nbatch; ++i) {")
        lines.append("    long long q = i, flat = 0;")
        for d, st in reversed(list(zip(bdims, bstrides))):
            e = f"((long long)c.t->hi[{d}] - c.t->lo[{d}])"
            lines.append(f"    flat += (c.t->lo[{d}] + q % {e}) * {st}LL; q /= {e};")
        lines.append("    " + call.format(blo="flat", bhi="flat + 1"))
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _simt_smem(ctx: BodyContext) -> int:
    size = 8 if _acc(ctx) == "double" else 4
    return size * 32 * ((64 + 1) + (64 + 1))


# --------------------------------------------------------------------------------------------
# One lowering, two bodies: the producer half exists only where the wgmma body is taken.

def _is_wgmma(ctx: BodyContext) -> bool:
    return _config(ctx, _Mm(ctx)) is not None


def _body(ctx: BodyContext) -> str:
    return _wgmma_body(ctx) if _is_wgmma(ctx) else _simt_body(ctx)


def _smem(ctx: BodyContext) -> int:
    if not _is_wgmma(ctx):
        return _simt_smem(ctx)
    mm, bn, _ = _wgmma_args(ctx)
    return tma_store_smem(epilogue_slots(ctx)) if tma_store(mm, bn) else 0


def lowerings() -> list[Lowering]:
    return [Lowering("latch::matmul", body=_body, headers=(HEADER, GEMM_HEADER, PINGPONG_HEADER), smem=_smem,
                     producer=OnlyWhen(_is_wgmma, _wgmma_producer), tensor_maps=OnlyWhen(_is_wgmma, _tensor_maps),
                     stage_bytes=OnlyWhen(_is_wgmma, _stage_bytes), args=_args,
                     doc="wgmma + TMA through the worker's ring for BF16/F16 rank-2 products (FP32 accumulation, "
                         "fused store); tiled SIMT otherwise")]


__all__ = ["lowerings", "LoweringError"]
