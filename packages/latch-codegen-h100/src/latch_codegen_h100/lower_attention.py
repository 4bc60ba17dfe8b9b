"""Lowerings of ``latch::sdpa`` and ``latch::sdpa_backward`` (latch_ops/attention.py).

The forward walks the task's box of query rows (dims B, H, Tq of ``out``), one warp per row; the
backward computes dq, dk and dv whole for every (batch, head) in the task's box of dims B, H of
``dq`` (the op's tiling splits only those). Head dims up to 256 (8 chunks of 32 per lane). ``operand_dtype="bf16"`` rounds q, k, v (and P) to bf16.
"""

from __future__ import annotations

from . import cgen
from .lowering import BodyContext, Lowering, LoweringError

HEADER = "latch_attention.cuh"
MAX_HEAD = 256


def _common(ctx: BodyContext, q, k, v):
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if max(D, Dv) > MAX_HEAD:
        raise LoweringError(f"{ctx.op}: head dims {D}/{Dv} exceed {MAX_HEAD}, the most this body handles")
    acc = "double" if q.dtype == "f64" else "float"
    nc = -(-max(D, Dv) // 32)
    rnd = 1 if ctx.attr("operand_dtype") == "bf16" else (2 if ctx.attr("operand_dtype") == "f16" else 0)
    causal = "true" if ctx.attr("causal") else "false"
    scale = f"({acc}){float(ctx.attr('scale'))!r}"
    return B, H, Tq, Tk, D, Dv, acc, nc, rnd, causal, scale


def _forward(ctx: BodyContext) -> str:
    q, k, v = ctx.inputs
    out, lse = ctx.outputs
    B, H, Tq, Tk, D, Dv, acc, nc, rnd, causal, scale = _common(ctx, q, k, v)
    lse_arg = f"{lse.ptr} + bh * {Tq}LL" if lse.present else f"({lse.ctype}*)nullptr"
    lse_t = lse.ctype
    lines = ["const int warp_ = threadIdx.x >> 5, nwarps_ = LATCH_THREADS >> 5;",
             f"{acc}* wsm = ({acc}*){ctx.smem} + warp_ * 64;",
             f"const long long n_rows = {cgen.tile_count(3)};",
             "for (long long r = warp_; r < n_rows; r += nwarps_) {"]
    lines += cgen.tile_decode("r", 3, "y", "  ")
    lines += [f"  const long long bh = y0 * {H}LL + y1;",
              f"  latch::sdpa_forward_row<{q.ctype}, {lse_t}, {acc}, {nc}, {causal}, {rnd}>("
              f"{q.ptr} + bh * {Tq * D}LL, {k.ptr} + bh * {Tk * D}LL, {v.ptr} + bh * {Tk * Dv}LL, "
              f"{out.ptr} + bh * {Tq * Dv}LL, {lse_arg}, y2, {Tk}LL, {D}, {Dv}, "
              f"{scale}, wsm);",
              "}"]
    return "\n".join(lines)


def _backward(ctx: BodyContext) -> str:
    go, glse, q, k, v, o, lse = ctx.inputs
    dq, dk, dv = ctx.outputs
    if not (dq.present and dk.present and dv.present):
        raise LoweringError(f"{ctx.op}: every output (dq, dk, dv) must reach memory")
    B, H, Tq, Tk, D, Dv, acc, nc, rnd, causal, scale = _common(ctx, q, k, v)
    gl = f"{glse.ptr} + bh * {Tq}LL" if glse is not None else f"(const {lse.ctype}*)nullptr"
    lt = lse.ctype
    return "\n".join([
        "for (long long b_ = c.t->lo[0]; b_ < c.t->hi[0]; ++b_)",
        "for (long long h_ = c.t->lo[1]; h_ < c.t->hi[1]; ++h_) {",
        f"  const long long bh = b_ * {H}LL + h_;",
        f"  latch::sdpa_backward_bh<{q.ctype}, {lt}, {acc}, {nc}, {causal}, {rnd}>("
        f"{go.ptr} + bh * {Tq * Dv}LL, {gl}, {q.ptr} + bh * {Tq * D}LL, {k.ptr} + bh * {Tk * D}LL, "
        f"{v.ptr} + bh * {Tk * Dv}LL, {o.ptr} + bh * {Tq * Dv}LL, {lse.ptr} + bh * {Tq}LL, "
        f"{dq.ptr} + bh * {Tq * D}LL, {dk.ptr} + bh * {Tk * D}LL, {dv.ptr} + bh * {Tk * Dv}LL, "
        f"{Tq}LL, {Tk}LL, {D}, {Dv}, {scale}, ({acc}*){ctx.smem});",
        "}",
    ])


def _smem(ctx: BodyContext) -> int:
    size = 8 if ctx.inputs[2 if ctx.op.endswith("backward") else 0].dtype == "f64" else 4
    return (ctx.threads // 32) * 64 * size


def lowerings() -> list[Lowering]:
    return [
        Lowering("latch::sdpa", body=_forward, headers=(HEADER,), smem=_smem,
                 doc="warp per query row: online max/sum, then P V in registers"),
        Lowering("latch::sdpa_backward", body=_backward, headers=(HEADER,), smem=_smem,
                 doc="per (batch, head) of the tile: dq by query rows, dk/dv by key rows, P rebuilt from lse"),
    ]
