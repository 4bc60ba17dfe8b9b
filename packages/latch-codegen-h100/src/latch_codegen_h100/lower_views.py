"""Lowerings of views and layout ops (latch_ops/views.py).

Views (reshape, permute, expand, slice, select) and copy have index-map / expression forms, so they
fuse with elementwise ops (``fuse.py``); alone they are copies (every value is contiguous in its
own placement). concat, slice_scatter and select_scatter are single-node bodies: each output
element is read from exactly one operand, chosen by its coordinate along ``dim``.
"""

from __future__ import annotations

import math

from . import cgen
from .lowering import BodyContext, Lowering, NodeInfo, compute_type

HEADER = "latch_common.cuh"


def _reshape(coords, n: NodeInfo) -> list[str]:
    so, si = n.out_shapes[0], n.in_shapes[0]
    if tuple(so) == tuple(si):
        return list(coords)
    # Unsqueeze/squeeze: the same non-1 dims in the same order map coordinate to coordinate.
    nz_o = [(d, s) for d, s in enumerate(so) if s != 1]
    nz_i = [(d, s) for d, s in enumerate(si) if s != 1]
    if [s for _, s in nz_o] == [s for _, s in nz_i]:
        out = ["0LL"] * len(si)
        for (do, _), (di, _) in zip(nz_o, nz_i):
            out[di] = coords[do]
        return out
    lin = cgen.dot(coords, cgen.strides(so))
    st = cgen.strides(si)
    out = []
    for d, size in enumerate(si):
        if size == 1:
            out.append("0LL")
        elif d == 0:
            out.append(f"(({lin}) / {st[0]}LL)" if st[0] != 1 else f"({lin})")
        else:
            q = f"(({lin}) / {st[d]}LL)" if st[d] != 1 else f"({lin})"
            out.append(f"({q} % {size}LL)")
    return out


def _permute(coords, n: NodeInfo) -> list[str]:
    perm = n.attr("perm")
    out = [None] * len(perm)
    for k, p in enumerate(perm):
        out[p] = coords[k]
    return out


def _expand(coords, n: NodeInfo) -> list[str]:
    si, so = n.in_shapes[0], n.out_shapes[0]
    lead = len(so) - len(si)
    return ["0LL" if si[d] == 1 else coords[d + lead] for d in range(len(si))]


def _slice(coords, n: NodeInfo) -> list[str]:
    dim, start, step = n.attr("dim"), n.attr("start"), n.attr("step")
    out = list(coords)
    c = coords[dim]
    term = c if step == 1 else f"{c} * {step}LL"
    out[dim] = f"({start}LL + {term})" if start else term
    return out


def _select(coords, n: NodeInfo) -> list[str]:
    dim, index = n.attr("dim"), n.attr("index")
    return list(coords[:dim]) + [f"{index}LL"] + list(coords[dim:])


def _copy(a, n: NodeInfo) -> str:
    return a[0]


# --------------------------------------------------------------------------------------------
# Structural bodies


def _loop(ctx: BodyContext) -> list[str]:
    out = ctx.outputs[0]
    lines = [f"const long long n_tile = {cgen.tile_count(out.rank)};",
             "for (long long i = threadIdx.x; i < n_tile; i += LATCH_THREADS) {"]
    lines += cgen.tile_decode("i", out.rank, "y", "  ")
    return lines


CONCAT_UNROLL = 4  # groups of four elements per thread and iteration (all loads before the stores)


def _concat_rows(ctx: BodyContext) -> list[str] | None:
    """Row tiles of a concatenation, vectorised: each thread takes CONCAT_UNROLL groups of four
    consecutive output elements per iteration; the group's coordinate along ``dim`` picks ONE
    operand (every boundary along ``dim`` is a multiple of four when ``dim`` is the last dim), so
    the group is one 16-byte load from it and one 16-byte store, all loads of the iteration issued
    before its stores. None when the shapes or dtypes do not allow it (the element loop serves)."""
    out = ctx.outputs[0]
    dim = ctx.attr("dim") % out.rank
    last = out.rank - 1
    if out.rank < 1 or out.shape[-1] % 4 or any(x.dtype != out.dtype for x in ctx.inputs):
        return None
    if dim == last and any(x.shape[dim] % 4 for x in ctx.inputs):
        return None
    if math.prod(out.shape) >= 2**31:
        return None
    U = CONCAT_UNROLL
    ct = compute_type(out.dtype)
    from .cgen import contiguous_tile

    full, first, count = contiguous_tile(out.shape, "int")
    aligned = " && ".join(f"latch::aligned4({p}, 0)" for p in [x.ptr for x in ctx.inputs] + [out.ptr])
    L = [f"if (({full}) && ({aligned}) && ({first}) % 4 == 0) {{",
         f"  const int n_ = {count};",
         f"  const int base_ = {first};",
         f"  {ct} r_[{U}][4];",
         f"  for (int q_ = 4 * (int)threadIdx.x; q_ < n_; q_ += {4 * U} * LATCH_THREADS) {{",
         "    #pragma unroll",
         f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
         f"      const int l_ = base_ + q_ + u_ * 4 * LATCH_THREADS;",
         "      if (q_ + u_ * 4 * LATCH_THREADS < n_) {"]
    acc = 1
    for d in reversed(range(out.rank)):
        div = f"l_ / {acc}" if acc != 1 else "l_"
        L.append(f"        const int y{d} = ({div}) % {out.shape[d]};" if d else f"        const int y0 = {div};")
        acc *= out.shape[d]
    ys = [f"y{d}" for d in range(out.rank)]
    L.append(f"        const {ctx.inputs[0].ctype}* p_; long long o_;")
    lo, n_in = 0, len(ctx.inputs)
    for k, x in enumerate(ctx.inputs):
        hi = lo + x.shape[dim]
        cs = list(ys)
        cs[dim] = f"(y{dim} - {lo})" if lo else ys[dim]
        pick = f"{{ p_ = {x.ptr}; o_ = {cgen.dot(cs, cgen.strides(x.shape))}; }}"
        if k == n_in - 1:
            L.append(f"        {'else ' if k else ''}{pick}")
        else:
            L.append(f"        {'else ' if k else ''}if (y{dim} < {hi}) {pick}")
        lo = hi
    L += ["        latch::gld4(p_, o_, r_[u_]);", "      }", "    }",
          "    #pragma unroll", f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
          "      if (q_ + u_ * 4 * LATCH_THREADS < n_) {",
          f"        latch::gst4({out.ptr}, base_ + q_ + u_ * 4 * LATCH_THREADS, r_[u_]);", "      }", "    }",
          "  }", "} else {"]
    return L


def _concat_body(ctx: BodyContext) -> str:
    rows = _concat_rows(ctx)
    general = _concat_elements(ctx)
    if rows is None:
        return general
    return "\n".join(rows + ["  " + x for x in general.splitlines()] + ["}"])


def _concat_elements(ctx: BodyContext) -> str:
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    ys = [f"y{d}" for d in range(out.rank)]
    lines = _loop(ctx)
    lines.append(f"  {compute_type(out.dtype)} v;")
    lo, last = 0, len(ctx.inputs) - 1
    for k, x in enumerate(ctx.inputs):
        hi = lo + x.shape[dim]
        cs = list(ys)
        cs[dim] = f"(y{dim} - {lo}LL)" if lo else ys[dim]
        load = f"{{ v = latch::ld<{x.ctype}>({x.ptr}, {cgen.dot(cs, cgen.strides(x.shape))}); }}"
        if k == last:
            lines.append(f"  {'else ' if k else ''}{load}")
        else:
            lines.append(f"  {'else ' if k else ''}if (y{dim} < {hi}LL) {load}")
        lo = hi
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, v);")
    lines.append("}")
    return "\n".join(lines)


def _slice_scatter_body(ctx: BodyContext) -> str:
    x, src = ctx.inputs
    out = ctx.outputs[0]
    dim, start, end, step = (ctx.attr(k) for k in ("dim", "start", "end", "step"))
    ys = [f"y{d}" for d in range(out.rank)]
    cs = list(ys)
    cs[dim] = f"((y{dim} - {start}LL) / {step}LL)"
    cond = f"(y{dim} >= {start}LL && y{dim} < {end}LL && (y{dim} - {start}LL) % {step}LL == 0)"
    lines = _loop(ctx)
    lines.append(f"  const {compute_type(out.dtype)} v = {cond} ? "
                 f"latch::ld<{src.ctype}>({src.ptr}, {cgen.dot(cs, cgen.strides(src.shape))}) : "
                 f"latch::ld<{x.ctype}>({x.ptr}, {cgen.dot(ys, cgen.strides(x.shape))});")
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, v);")
    lines.append("}")
    return "\n".join(lines)


def _select_scatter_body(ctx: BodyContext) -> str:
    x, src = ctx.inputs
    out = ctx.outputs[0]
    dim, index = ctx.attr("dim"), ctx.attr("index")
    ys = [f"y{d}" for d in range(out.rank)]
    cs = ys[:dim] + ys[dim + 1:]
    lines = _loop(ctx)
    lines.append(f"  const {compute_type(out.dtype)} v = (y{dim} == {index}LL) ? "
                 f"latch::ld<{src.ctype}>({src.ptr}, {cgen.dot(cs, cgen.strides(src.shape))}) : "
                 f"latch::ld<{x.ctype}>({x.ptr}, {cgen.dot(ys, cgen.strides(x.shape))});")
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, v);")
    lines.append("}")
    return "\n".join(lines)


def lowerings() -> list[Lowering]:
    out = [Lowering(f"latch::{name}", view_map=fn, doc=f"index map of the view {name}")
           for name, fn in (("reshape", _reshape), ("permute", _permute), ("expand", _expand),
                            ("slice", _slice), ("select", _select))]
    out.append(Lowering("latch::copy", expr=_copy, doc="identity expression (a fresh value)"))
    out += [Lowering("latch::concat", body=_concat_body, headers=(HEADER,), doc="concatenation along dim"),
            Lowering("latch::slice_scatter", body=_slice_scatter_body, headers=(HEADER,)),
            Lowering("latch::select_scatter", body=_select_scatter_body, headers=(HEADER,))]
    return out
