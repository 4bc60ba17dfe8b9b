"""Lowerings of the LM head's cross-entropy pair (latch_ops/cross_entropy.py, bodies in
latch_xent.cuh): ``cross_entropy`` a warp per row of its tile, ``cross_entropy_backward`` every
consumer thread over chunks of 8 elements of its (rows x columns) tile, 16 16-byte loads in flight per
thread (results/ce.md: why run 26's body ran at 4.2x its model)."""

from __future__ import annotations

from .lowering import BodyContext, Lowering

HEADER = "latch_xent.cuh"


def _acc(dtype: str) -> str:
    return "double" if dtype == "f64" else "float"


def _ptr(o) -> str:
    return o.ptr if o is not None and o.present else "nullptr"


def _cross_entropy(ctx: BodyContext) -> str:
    x, t = ctx.inputs
    nll, lse, valid = ctx.outputs
    V = x.shape[1]
    to = next(o for o in ctx.outputs).ctype
    return "\n".join([
        "const int warp_ = threadIdx.x >> 5, nwarps_ = LATCH_THREADS >> 5;",
        f"for (long long row = {ctx.lo(0)} + warp_; row < {ctx.hi(0)}; row += nwarps_)",
        f"  latch::cross_entropy_row<{x.ctype}, {t.ctype}, {to}, {_acc(x.dtype)}>({x.ptr}, {t.ptr}, {_ptr(nll)}, "
        f"{_ptr(lse)}, {_ptr(valid)}, row, {V}LL, {int(ctx.attr('ignore_index'))}LL);",
    ])


def _cross_entropy_backward(ctx: BodyContext) -> str:
    g, x, t, lse, total = ctx.inputs
    dx = ctx.outputs[0]
    V = x.shape[1]
    mean = "true" if ctx.attr("reduction") == "mean" else "false"
    return (f"latch::cross_entropy_grad_tile<{x.ctype}, {t.ctype}, {lse.ctype}, {dx.ctype}, {_acc(x.dtype)}>("
            f"{g.ptr}, {x.ptr}, {t.ptr}, {lse.ptr}, {total.ptr}, {dx.ptr}, {V}LL, {ctx.lo(0)}, {ctx.hi(0)}, "
            f"{ctx.lo(1)}, {ctx.hi(1)}, {int(ctx.attr('ignore_index'))}LL, {mean});")


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::cross_entropy", body=_cross_entropy, headers=h,
                 doc="warp per row: online max/sum-exp over the stored logits, lse and the target's nll"),
        Lowering("latch::cross_entropy_backward", body=_cross_entropy_backward, headers=h,
                 doc="softmax - onehot, scaled, in chunks of 8 (16-byte loads and stores, 16 in flight per thread)"),
    ]
