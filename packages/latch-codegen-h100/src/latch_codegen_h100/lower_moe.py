"""Lowerings of the MoE ops (latch_ops/moe): token_topk (+ backward), route_order, ragged_mm and its
two gradients. Registered here, by latch-codegen-h100's plugin; a third-party op package would
register its lowerings through its own ``latch_register_lowerings`` the same way.

Routing decisions are data: the ragged bodies read ``offsets`` at run time and walk the expert
segments inside their tile (``latch_moe.cuh``); the matrix work reuses the matmul tile loop, with
``operand_dtype`` rounding like latch::matmul.
"""

from __future__ import annotations

from . import cgen
from .lowering import BodyContext, Lowering, LoweringError

HEADER = "latch_moe.cuh"
MAX_EXPERTS = 8192  # route_order keeps one counter per expert in shared memory


def _round(ctx: BodyContext) -> int:
    return {None: 0, "f32": 0, "f64": 0, "bf16": 1, "f16": 2}[ctx.attr("operand_dtype")]


def _acc(ctx: BodyContext) -> str:
    return "double" if ctx.inputs[0].dtype == "f64" else "float"


def _token_topk(ctx: BodyContext) -> str:
    (probs,) = ctx.inputs
    values, indices = ctx.outputs
    if not (values.present and indices.present):
        raise LoweringError(f"{ctx.op}: both outputs (values, indices) must reach memory")
    E = probs.shape[1]
    k = int(ctx.attr("k"))
    return (f"latch::token_topk_rows<{probs.ctype}, {indices.ctype}>({probs.ptr}, {values.ptr}, {indices.ptr}, "
            f"{E}LL, {k}, c.t->lo[0], c.t->hi[0]);")


def _token_topk_backward(ctx: BodyContext) -> str:
    g, idx = ctx.inputs
    out = ctx.outputs[0]
    k = g.shape[1]
    E = out.shape[1]
    lines = [f"const long long n_tile = {cgen.tile_count(2)};",
             "for (long long i = threadIdx.x; i < n_tile; i += LATCH_THREADS) {"]
    lines += cgen.tile_decode("i", 2, "y", "  ")
    lines += [f"  float v = 0.0f;" if out.dtype != "f64" else "  double v = 0.0;",
              f"  for (int s = 0; s < {k}; ++s)",
              f"    if ((long long){idx.ptr}[y0 * {k}LL + s] == y1) v = latch::ld<{g.ctype}>({g.ptr}, y0 * {k}LL + s);",
              f"  latch::st<{out.ctype}>({out.ptr}, y0 * {E}LL + y1, v);",
              "}"]
    return "\n".join(lines)


def _route_order(ctx: BodyContext) -> str:
    (idx,) = ctx.inputs
    token, position, offsets = ctx.outputs
    if not (token.present and position.present and offsets.present):
        raise LoweringError(f"{ctx.op}: every output (token, position, offsets) must reach memory")
    N, k = idx.shape
    E = int(ctx.attr("num_experts"))
    if E > MAX_EXPERTS:
        raise LoweringError(f"{ctx.op}: {E} experts exceed {MAX_EXPERTS}, the most this body counts in shared memory")
    return (f"latch::route_order_all<{idx.ctype}, {token.ctype}>({idx.ptr}, {token.ptr}, {position.ptr}, "
            f"{offsets.ptr}, {N}LL, {k}, {E}LL, (int*){ctx.smem});")


def _route_smem(ctx: BodyContext) -> int:
    return 4 * (int(ctx.attr("num_experts")) + ctx.threads)


def _ragged(mode: int):
    def body(ctx: BodyContext) -> str:
        x, w, offsets = ctx.inputs
        out = ctx.outputs[0]
        E = w.shape[0]
        K = x.shape[1]
        N = out.shape[1]
        return (f"latch::ragged_rows<{x.ctype}, {w.ctype}, {out.ctype}, {_acc(ctx)}, {_round(ctx)}, {mode}>("
                f"{x.ptr}, {w.ptr}, {offsets.ptr}, {out.ptr}, {E}LL, {K}LL, {N}LL, c.t->lo[0], c.t->hi[0], "
                f"c.t->lo[1], c.t->hi[1], {ctx.smem});")
    return body


def _ragged_grad_w(ctx: BodyContext) -> str:
    x, g, offsets = ctx.inputs
    dw = ctx.outputs[0]
    _, Din, Dout = dw.shape
    return (f"latch::ragged_grad_w_tile<{x.ctype}, {g.ctype}, {dw.ctype}, {_acc(ctx)}, {_round(ctx)}>("
            f"{x.ptr}, {g.ptr}, {offsets.ptr}, {dw.ptr}, {Din}LL, {Dout}LL, c.t->lo[0], c.t->hi[0], c.t->lo[1], "
            f"c.t->hi[1], c.t->lo[2], c.t->hi[2], {ctx.smem});")


def _mm_smem(ctx: BodyContext) -> int:
    return (8 if _acc(ctx) == "double" else 4) * 32 * ((64 + 1) + (64 + 1))


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::token_topk", body=_token_topk, headers=h, doc="thread per row, k selection passes"),
        Lowering("latch::token_topk_backward", body=_token_topk_backward, headers=h),
        Lowering("latch::route_order", body=_route_order, headers=h, smem=_route_smem, whole=True,
                 doc="one block: expert counts, offsets, stable ranks 256 pairs at a time"),
        Lowering("latch::ragged_mm", body=_ragged(0), headers=h, smem=_mm_smem),
        Lowering("latch::ragged_mm_grad_x", body=_ragged(1), headers=h, smem=_mm_smem),
        Lowering("latch::ragged_mm_grad_w", body=_ragged_grad_w, headers=h, smem=_mm_smem),
    ]
