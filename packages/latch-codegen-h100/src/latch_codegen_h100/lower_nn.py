"""Lowerings of the row-wise neural-network ops (latch_ops/nn.py): softmax, log_softmax and their
backward, layer_norm and its backward, nll_loss and its backward.

Row-wise bodies walk the rows of the task's tile (its box over the leading dims), one warp per
row, and reduce every row in full; nll_loss and layer_norm_backward reduce across rows and compute
their whole output in one task (``whole=True``).
"""

from __future__ import annotations

from . import cgen
from .lowering import BodyContext, Lowering, compute_type

HEADER = "latch_nn.cuh"
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _acc(dtype: str) -> str:
    return "double" if dtype == "f64" else "float"


def _rows_loop(lead_rank: int, lead_shape, call: str) -> list[str]:
    """A warp-per-row loop over the tile's box of the leading ``lead_rank`` dims; ``call`` uses
    ``row`` (the flat row index)."""
    lines = ["const int warp_ = threadIdx.x >> 5, nwarps_ = LATCH_THREADS >> 5;",
             f"const long long n_rows = {cgen.tile_count(lead_rank)};",
             "for (long long i = warp_; i < n_rows; i += nwarps_) {"]
    lines += cgen.tile_decode("i", lead_rank, "y", "  ")
    lines.append(f"  const long long row = {cgen.dot([f'y{d}' for d in range(lead_rank)], cgen.strides(lead_shape))};")
    lines.append(f"  {call}")
    lines.append("}")
    return lines


def _softmax(log: bool):
    def body(ctx: BodyContext) -> str:
        x, y = ctx.inputs[0], ctx.outputs[0]
        r, C = x.rank, x.shape[-1]
        call = (f"latch::softmax_row<{'true' if log else 'false'}, {x.ctype}, {y.ctype}, {_acc(x.dtype)}>"
                f"({x.ptr} + row * {C}LL, {y.ptr} + row * {C}LL, {C}LL, c.t->lo[{r - 1}], c.t->hi[{r - 1}]);")
        return "\n".join(_rows_loop(r - 1, x.shape[:-1], call))
    return body


def _softmax_backward(log: bool):
    def body(ctx: BodyContext) -> str:
        g, yv = ctx.inputs
        dx = ctx.outputs[0]
        r, C = g.rank, g.shape[-1]
        call = (f"latch::softmax_backward_row<{'true' if log else 'false'}, {g.ctype}, {_acc(g.dtype)}>"
                f"({g.ptr} + row * {C}LL, {yv.ptr} + row * {C}LL, {dx.ptr} + row * {C}LL, {C}LL, "
                f"c.t->lo[{r - 1}], c.t->hi[{r - 1}]);")
        return "\n".join(_rows_loop(r - 1, g.shape[:-1], call))
    return body


def _layer_norm(ctx: BodyContext) -> str:
    x, w, b = ctx.inputs
    y, mean, rstd = ctx.outputs
    k = ctx.attr("normalized_ndim")
    lead = x.shape[:-k]
    D = 1
    for d in x.shape[-k:]:
        D *= d

    def p(o, off):
        return f"{o.ptr} + {off}" if o is not None and o.present else "nullptr"

    acc = _acc(x.dtype)
    call = (f"latch::layer_norm_row<{x.ctype}, {acc}>({x.ptr} + row * {D}LL, {w.ptr if w else 'nullptr'}, "
            f"{b.ptr if b else 'nullptr'}, {p(y, f'row * {D}LL')}, {p(mean, 'row')}, {p(rstd, 'row')}, {D}LL, "
            f"({acc}){float(ctx.attr('eps'))!r});")
    return "\n".join(_rows_loop(len(lead), lead, call))


def _layer_norm_backward(ctx: BodyContext) -> str:
    g, x, mean, rstd, w, _b = ctx.inputs
    mask = list(ctx.attr("output_mask"))
    outs = iter(ctx.outputs)
    dx, dw, db = (next(outs) if m else None for m in mask)
    k = ctx.attr("normalized_ndim")
    D = 1
    for d in x.shape[-k:]:
        D *= d
    R = x.numel // D

    def p(o):
        return o.ptr if o is not None and o.present else "nullptr"

    return (f"latch::layer_norm_backward_all<{x.ctype}, {_acc(x.dtype)}>({g.ptr}, {x.ptr}, {mean.ptr}, {rstd.ptr}, "
            f"{w.ptr if w else 'nullptr'}, {p(dx)}, {p(dw)}, {p(db)}, {R}LL, {D}LL);")


def _nll_loss(ctx: BodyContext) -> str:
    logp, target, weight = ctx.inputs
    loss, total = ctx.outputs
    C = logp.shape[-1]
    N = logp.numel // C
    red = REDUCTIONS[ctx.attr("reduction")]
    return (f"latch::nll_loss_all<{logp.ctype}, {target.ctype}>({logp.ptr}, {target.ptr}, "
            f"{weight.ptr if weight else 'nullptr'}, {loss.ptr if loss.present else 'nullptr'}, "
            f"{total.ptr if total.present else 'nullptr'}, {N}LL, {C}LL, {int(ctx.attr('ignore_index'))}LL, {red}, "
            f"(double*){ctx.smem});")


def _nll_loss_backward(ctx: BodyContext) -> str:
    g, logp, target, weight, total = ctx.inputs
    dl = ctx.outputs[0]
    C = logp.shape[-1]
    r = dl.rank
    red = REDUCTIONS[ctx.attr("reduction")]
    ign = int(ctx.attr("ignore_index"))
    ys = [f"y{d}" for d in range(r)]
    row = cgen.dot(ys[:-1], cgen.strides(dl.shape[:-1])) if r > 1 else "0LL"
    ct = compute_type(dl.dtype)
    gval = f"(double)latch::ld<{g.ctype}>({g.ptr}, {row})" if red == 0 else f"(double)latch::ld<{g.ctype}>({g.ptr}, 0)"
    scale = f" / (double)latch::ld<{total.ctype}>({total.ptr}, 0)" if red == 1 else ""
    w = f"(double)latch::ld<{weight.ctype}>({weight.ptr}, t)" if weight is not None else "1.0"
    lines = [f"const long long n_tile = {cgen.tile_count(r)};",
             "for (long long i = threadIdx.x; i < n_tile; i += LATCH_THREADS) {"]
    lines += cgen.tile_decode("i", r, "y", "  ")
    lines += [f"  const long long t = (long long){target.ptr}[{row}];",
              f"  {ct} v = ({ct})0;",
              f"  if (t != {ign}LL && t == y{r - 1}) v = ({ct})(-{w} * {gval}{scale});",
              f"  latch::st<{dl.ctype}>({dl.ptr}, {cgen.dot(ys, cgen.strides(dl.shape))}, v);",
              "}"]
    return "\n".join(lines)


def _scratch(ctx: BodyContext) -> int:
    return 33 * 8


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::softmax", body=_softmax(False), headers=h, doc="warp per row, online max/sum"),
        Lowering("latch::log_softmax", body=_softmax(True), headers=h, doc="warp per row, online max/sum"),
        Lowering("latch::softmax_backward", body=_softmax_backward(False), headers=h),
        Lowering("latch::log_softmax_backward", body=_softmax_backward(True), headers=h),
        Lowering("latch::layer_norm", body=_layer_norm, headers=h, doc="warp per row, two-pass statistics"),
        Lowering("latch::layer_norm_backward", body=_layer_norm_backward, headers=h, whole=True,
                 doc="one block: dx per row, dw/db per column in row order"),
        Lowering("latch::nll_loss", body=_nll_loss, headers=h, smem=_scratch, whole=True,
                 doc="one block, double accumulation"),
        Lowering("latch::nll_loss_backward", body=_nll_loss_backward, headers=h,
                 doc="elementwise over dlogp: -w[t] g (/ total_weight) at the target class"),
    ]
