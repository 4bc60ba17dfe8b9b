"""Lowerings of the indexing ops (latch_ops/indexing.py).

Gathers (embedding, gather, index_select) compute each output element of the tile from one input
element chosen by an index. Scatters (scatter, scatter_add, index_add) fill
the task's tile of the output (zeros or a copy of x), then walk every source element and apply the
ones whose target falls inside the tile (atomically for the accumulating forms), so tiles of one
scatter never write each other's bytes. An index outside its dimension is reported through the
kernel's error record (``latch_report``), naming the task, instead of reading wild memory.
embedding_backward is deterministic (no float atomics; see its body).
"""

from __future__ import annotations

from . import cgen
from .lowering import BodyContext, Lowering, compute_type

HEADER = "latch_common.cuh"


def _tile_loop(rank: int, prefix: str = "y") -> list[str]:
    lines = [f"const long long n_tile = {cgen.tile_count(rank)};",
             "for (long long i = threadIdx.x; i < n_tile; i += LATCH_THREADS) {"]
    lines += cgen.tile_decode("i", rank, prefix, "  ")
    return lines


def _check(var: str, bound: int, indent: str = "  ", on_fail: str = "continue;") -> str:
    return (f"{indent}if ({var} < 0 || {var} >= {bound}LL) {{ latch_report(latch::ERR_INDEX_RANGE, {var}, "
            f"{bound}LL); {on_fail} }}")


def _in_tile(coords: list[str]) -> str:
    return " && ".join(f"{c} >= c.t->lo[{d}] && {c} < c.t->hi[{d}]" for d, c in enumerate(coords)) or "true"


def _embedding(ctx: BodyContext) -> str:
    w, idx = ctx.inputs
    out = ctx.outputs[0]
    r = out.rank
    V, D = w.shape
    ys = [f"y{d}" for d in range(r)]
    lines = _tile_loop(r)
    lines.append(f"  long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, "
                 f"{cgen.dot(ys[:-1], cgen.strides(idx.shape))});")
    lines.append(_check("t", V, on_fail="t = 0;"))
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, "
                 f"latch::ld<{w.ctype}>({w.ptr}, t * {D}LL + y{r - 1}));")
    lines.append("}")
    return "\n".join(lines)


def _fill_tile(out, value: str, src=None) -> list[str]:
    """Statements writing the tile of ``out``: a constant, or a copy of ``src`` (same shape)."""
    ys = [f"y{d}" for d in range(out.rank)]
    off = cgen.dot(ys, cgen.strides(out.shape))
    lines = _tile_loop(out.rank)
    v = f"latch::ld<{src.ctype}>({src.ptr}, {off})" if src is not None else value
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {off}, {v});")
    lines.append("}")
    lines.append("latch::block_sync();  // the tile is filled before any thread accumulates into it")
    return lines


def _embedding_backward(ctx: BodyContext) -> str:
    """Deterministic, no atomics: consumer thread ``x`` owns the columns ``lo1 + x, lo1 + x + THREADS,
    ...`` of the tile, zeroes them, then walks the indices in order (k = 0, 1, ...) and adds grad
    row k into row idx[k] when that row is in the tile. Every element of dW is written by one
    thread, its terms summed in index order: the same bits every run, whatever the tiling."""
    g, idx = ctx.inputs
    dw = ctx.outputs[0]
    n, D = dw.shape
    N = idx.numel
    pad = int(ctx.attr("padding_idx", -1) if ctx.attr("padding_idx") is not None else -1)
    acc = compute_type(dw.dtype)
    return "\n".join([
        "const long long r0_ = c.t->lo[0], r1_ = c.t->hi[0], c0_ = c.t->lo[1], c1_ = c.t->hi[1];",
        "for (long long d = c0_ + threadIdx.x; d < c1_; d += LATCH_THREADS)",
        f"  for (long long r = r0_; r < r1_; ++r) latch::st<{dw.ctype}>({dw.ptr}, r * {D}LL + d, ({acc})0);",
        f"for (long long k = 0; k < {N}LL; ++k) {{",
        f"  const long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, k);",
        f"  if (t < 0 || t >= {n}LL) {{ if (threadIdx.x == 0) latch_report(latch::ERR_INDEX_RANGE, t, {n}LL); continue; }}",
        f"  if (t < r0_ || t >= r1_ || t == {pad}LL) continue;",
        "  for (long long d = c0_ + threadIdx.x; d < c1_; d += LATCH_THREADS)",
        f"    latch::st<{dw.ctype}>({dw.ptr}, t * {D}LL + d, latch::ld<{dw.ctype}>({dw.ptr}, t * {D}LL + d) + "
        f"latch::ld<{g.ctype}>({g.ptr}, k * {D}LL + d));",
        "}",
    ])


def _select_along(ctx: BodyContext, index_offset) -> str:
    """out[y] = x[y with y[dim] replaced by idx[index_offset(ys)]]: gather and index_select differ
    only in where the index of an output element lives."""
    x, idx = ctx.inputs
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    ys = [f"y{d}" for d in range(out.rank)]
    xs = list(ys)
    xs[dim] = "t"
    lines = _tile_loop(out.rank)
    lines.append(f"  long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, {index_offset(ys, dim, idx)});")
    lines.append(_check("t", x.shape[dim], on_fail="t = 0;"))
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, "
                 f"latch::ld<{x.ctype}>({x.ptr}, {cgen.dot(xs, cgen.strides(x.shape))}));")
    lines.append("}")
    return "\n".join(lines)


def _gather(ctx: BodyContext) -> str:
    # idx has the output's shape
    return _select_along(ctx, lambda ys, dim, idx: cgen.dot(ys, cgen.strides(idx.shape)))


def _index_select(ctx: BodyContext) -> str:
    # idx is 1-D, indexed by the output's coordinate along dim
    return _select_along(ctx, lambda ys, dim, idx: f"y{dim}")


def _scatter(accumulate: bool):
    def body(ctx: BodyContext) -> str:
        x, idx, src = ctx.inputs
        out = ctx.outputs[0]
        dim = ctx.attr("dim")
        js = [f"j{d}" for d in range(idx.rank)]
        ts = list(js)
        ts[dim] = "t"
        lines = _fill_tile(out, "", src=x)
        lines.append(f"for (long long k = threadIdx.x; k < {idx.numel}LL; k += LATCH_THREADS) {{")
        lines += cgen.const_decode("k", idx.shape, "j", "  ")
        lines.append(f"  const long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, k);")
        lines.append(_check("t", x.shape[dim]))
        lines.append(f"  if (!({_in_tile(ts)})) continue;")
        val = f"latch::ld<{src.ctype}>({src.ptr}, {cgen.dot(js, cgen.strides(src.shape))})"
        dst = f"{out.ptr} + {cgen.dot(ts, cgen.strides(out.shape))}"
        if accumulate:
            lines.append(f"  latch::atomic_add({dst}, {val});")
        else:
            lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ts, cgen.strides(out.shape))}, {val});")
        lines.append("}")
        return "\n".join(lines)
    return body


def _index_add(ctx: BodyContext) -> str:
    x, idx, src = ctx.inputs
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    js = [f"j{d}" for d in range(src.rank)]
    ts = list(js)
    ts[dim] = "t"
    lines = _fill_tile(out, "", src=x)
    lines.append(f"for (long long k = threadIdx.x; k < {src.numel}LL; k += LATCH_THREADS) {{")
    lines += cgen.const_decode("k", src.shape, "j", "  ")
    lines.append(f"  const long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, j{dim});")
    lines.append(_check("t", x.shape[dim]))
    lines.append(f"  if (!({_in_tile(ts)})) continue;")
    lines.append(f"  latch::atomic_add({out.ptr} + {cgen.dot(ts, cgen.strides(out.shape))}, "
                 f"latch::ld<{src.ctype}>({src.ptr}, k));")
    lines.append("}")
    return "\n".join(lines)


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::embedding", body=_embedding, headers=h, doc="row gather"),
        Lowering("latch::embedding_backward", body=_embedding_backward, headers=h,
                 doc="each thread owns tile columns: zero them, add the grad rows in index order (no atomics)"),
        Lowering("latch::gather", body=_gather, headers=h),
        Lowering("latch::index_select", body=_index_select, headers=h),
        Lowering("latch::scatter", body=_scatter(False), headers=h),
        Lowering("latch::scatter_add", body=_scatter(True), headers=h),
        Lowering("latch::index_add", body=_index_add, headers=h),
    ]
