"""Lowerings of the indexing ops (latch_ops/indexing.py).

Gathers (embedding, gather, index_select) compute each output element of the tile from one input
element chosen by an index. index_select and embedding copy whole rows where the run after the
indexed dim is long enough (the row path below: one index per row, 16-byte copies); gather (an
index per element), short runs and tiles that split the run keep one element per thread. Scatters (scatter, scatter_add, index_add) fill
the task's tile of the output (zeros or a copy of x), then walk every source element and apply the
ones whose target falls inside the tile (atomically for the accumulating forms), so tiles of one
scatter never write each other's bytes. An index outside its dimension is reported through the
kernel's error record (``latch_report``), naming the task, instead of reading wild memory.
embedding_backward is deterministic (no float atomics; see its body).
"""

from __future__ import annotations

import math

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
    ost = cgen.strides(out.shape)
    if out.shape[-1] >= ROW_MIN:
        # rows: out's dims 0..r-2 (one index each); the run: its last dim (the table row, D wide)
        return "\n".join(_row_gather(
            x=w, out=out, idx=idx, k=r - 2, bound=V,
            index_off=lambda ys: cgen.dot(ys, cgen.strides(idx.shape)),
            x_row=lambda ys: f"t * {D}LL",
            o_row=lambda ys: cgen.dot(ys, ost[:r - 1])))
    return "\n".join(_embedding_scalar(ctx))


def _embedding_scalar(ctx: BodyContext) -> list[str]:
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
    return lines


# ---- the row path of the gathers (index_select, embedding) -------------------------------------
# An output row (the coordinates up to and including the indexed dim) takes ONE index; the dims
# after it are copied as one contiguous run of x. A group of G threads (a warp, or the whole block
# for rows of 16 KB and more) copies a row: the index loaded once per row (a broadcast load, every
# lane of the group the same address), the run in 16-byte vectors where both row starts are aligned
# (a raw copy when x and out have one dtype, as LDG/STG.E.128 through __ldcg/__stcg: the operands
# are generic pointers, so plain accesses compile to generic LD/ST.128, and .cg reads L2, where other
# SMs' writes are seen; 4-element ld4/st4 with the conversion when the dtypes differ), the scalar loop for the run's tail and for misaligned rows. Every lane issues the loads of RW rows x U
# vectors before it stores any of them, so a task keeps ~LOADS_IN_FLIGHT 16-byte loads per thread in
# flight (the H200 needs ~30-50 KB in flight per SM at its share of the bandwidth).
ROW_MIN = 32  # elements of a full run below which the row path is not taken (a warp would idle lanes)
LOADS_IN_FLIGHT = 8  # vector loads per lane issued before the stores (ptxas spills the noinline body at 12)
BLOCK_ROW_VECTORS = 1024  # a run of this many vectors (16 KB) or more is copied by the whole block


def _row_plan(x, out, run_full: int) -> tuple[int, int, int, int, bool]:
    """(G threads per row, U vectors per lane per row, RW rows per group step, VW elements per
    vector, raw) for a gather whose full run has ``run_full`` elements."""
    raw = x.dtype == out.dtype
    vw = 16 // _itemsize(x.dtype) if raw else 4
    nv = max(1, run_full // vw)
    g = 256 if nv >= BLOCK_ROW_VECTORS else 32
    u = max(1, min(8, -(-nv // g)))
    rw = 1 if g == 256 else max(1, min(4, LOADS_IN_FLIGHT // u))
    return g, u, rw, vw, raw


def _itemsize(dtype: str) -> int:
    return {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1}[dtype]


def _row_gather(*, x, out, idx, k: int, bound: int, index_off, x_row, o_row) -> list[str]:
    """Statements copying the task's tile of ``out`` row by row. Rows are out's dims ``0..k`` (the
    tile's box there), the run its dims ``k+1..`` from ``lo[k+1]``: the caller guarantees (at run
    time) that the tile spans every dim after ``k+1`` whole. ``index_off(ys)``: the row's index offset
    in ``idx``; ``x_row(ys)`` / ``o_row(ys)``: the row's first element in x (in terms of ``t``, the
    index) and in out, before the run's offset."""
    r = out.rank
    ost = cgen.strides(out.shape)
    run_full = math.prod(out.shape[k + 1:])
    G, U, RW, VW, raw = _row_plan(x, out, run_full)
    ext = lambda d: f"((long long)c.t->hi[{d}] - c.t->lo[{d}])"  # noqa: E731
    ys = [f"y{d}" for d in range(k + 1)]
    nrows = " * ".join(ext(d) for d in range(k + 1)) or "1LL"
    sx, so = x.ctype, out.ctype
    valid = "src_[w_] != nullptr && v_ < nv_"
    if raw:
        vec_ok = ("((reinterpret_cast<unsigned long long>(src_[w_]) | reinterpret_cast<unsigned long long>(dst_[w_]))"
                  " & 15ULL) == 0")
        reg = f"uint4 a_[{RW}][{U}];"
        ld = "a_[w_][u_] = __ldcg(reinterpret_cast<const uint4*>(src_[w_]) + v_);"
        st = "__stcg(reinterpret_cast<uint4*>(dst_[w_]) + v_, a_[w_][u_]);"
        tail = "dst_[w_][e_] = src_[w_][e_];"
    else:
        vec_ok = "latch::aligned4(src_[w_], 0) && latch::aligned4(dst_[w_], 0)"
        reg = f"typename latch::Compute<{sx}>::type a_[{RW}][{U}][4];"
        ld = f"latch::ld4<{sx}>(src_[w_], v_ * 4, a_[w_][u_]);"
        st = f"latch::st4<{so}>(dst_[w_], v_ * 4, a_[w_][u_]);"
        tail = f"latch::st<{so}>(dst_[w_], e_, latch::ld<{sx}>(src_[w_], e_));"
    lines = [
        f"// row path: {G} threads per row, {RW} row(s) x {U} {'16-byte' if raw else '4-element'} vector(s) per lane in flight",
        f"const long long nrows_ = {nrows};",
        f"const long long run_ = {ext(k + 1)} * {ost[k + 1]}LL, ro_ = (long long)c.t->lo[{k + 1}] * {ost[k + 1]}LL;",
        f"const long long nv_ = run_ / {VW};",
        f"const int lane_ = threadIdx.x % {G}, grp_ = threadIdx.x / {G};",
        f"for (long long rb_ = (long long)grp_ * {RW}; rb_ < nrows_; rb_ += (LATCH_THREADS / {G}) * {RW}) {{",
        f"  const {sx}* src_[{RW}];",
        f"  {so}* dst_[{RW}];",
        "  bool vec_ = true;",
        "#pragma unroll",
        f"  for (int w_ = 0; w_ < {RW}; ++w_) {{",
        "    src_[w_] = nullptr; dst_[w_] = nullptr;",
        "    const long long r_ = rb_ + w_;",
        "    if (r_ < nrows_) {",
    ]
    if k >= 0:
        lines.append("      long long q_ = r_;")
        for d in reversed(range(1, k + 1)):
            lines.append(f"      const long long y{d} = c.t->lo[{d}] + q_ % {ext(d)}; q_ /= {ext(d)};")
        lines.append("      const long long y0 = c.t->lo[0] + q_;")
    lines += [
        f"      long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, {index_off(ys)});",
        f"      if (t < 0 || t >= {bound}LL) {{ if (lane_ == 0) latch_report(latch::ERR_INDEX_RANGE, t, {bound}LL); t = 0; }}",
        f"      src_[w_] = {x.ptr} + ({x_row(ys)}) + ro_;",
        f"      dst_[w_] = {out.ptr} + ({o_row(ys)}) + ro_;",
        f"      vec_ = vec_ && ({vec_ok});",
        "    }",
        "  }",
        "  if (vec_) {",
        f"    for (long long v0_ = lane_; v0_ < nv_; v0_ += {G * U}LL) {{",
        f"      {reg}",
        "#pragma unroll",
        f"      for (int w_ = 0; w_ < {RW}; ++w_)",
        "#pragma unroll",
        f"        for (int u_ = 0; u_ < {U}; ++u_) {{ const long long v_ = v0_ + u_ * {G}; if ({valid}) {ld} }}",
        "#pragma unroll",
        f"      for (int w_ = 0; w_ < {RW}; ++w_)",
        "#pragma unroll",
        f"        for (int u_ = 0; u_ < {U}; ++u_) {{ const long long v_ = v0_ + u_ * {G}; if ({valid}) {st} }}",
        "    }",
        "#pragma unroll",
        f"    for (int w_ = 0; w_ < {RW}; ++w_)",
        f"      if (src_[w_] != nullptr) for (long long e_ = nv_ * {VW} + lane_; e_ < run_; e_ += {G}) {tail}",
        "  } else {",
        "#pragma unroll",
        f"    for (int w_ = 0; w_ < {RW}; ++w_)",
        f"      if (src_[w_] != nullptr) for (long long e_ = lane_; e_ < run_; e_ += {G}) "
        f"latch::st<{so}>(dst_[w_], e_, latch::ld<{sx}>(src_[w_], e_));",
        "  }",
        "}",
    ]
    return lines


def row_path_taken(op: str, x_shape, out_shape, dim: int | None = None) -> bool:
    """Whether the gather's body has the row path (tests and reports read it): the run after the
    indexed dim is at least ROW_MIN elements."""
    if op == "latch::embedding":
        return out_shape[-1] >= ROW_MIN
    if op == "latch::index_select":
        return dim < len(out_shape) - 1 and math.prod(out_shape[dim + 1:]) >= ROW_MIN
    return False


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


EMB_CHUNK = 1024  # indices examined per step of the embedding backward (4 per thread, one load round)
EMB_BATCH = 8  # hits whose grad values a thread loads before it adds them (in index order)


def emb_backward_smem(ctx) -> int:
    """Scratch of the embedding backward: 32 counts (sub-round x warp), then EMB_CHUNK hits (int2)."""
    return 128 + EMB_CHUNK * 8


def _embedding_backward(ctx: BodyContext) -> str:
    """Deterministic, no atomics: consumer thread ``x`` owns the columns ``lo1 + x, lo1 + x + THREADS,
    ...`` of the tile. The tile is zeroed first (whole rows: one contiguous range, 16-byte stores),
    or, with a third input ``base`` (pass ops.embedding_grad_sum: a tied embedding's other gradient),
    starts as base's rows (a copy, four 16-byte loads in flight per thread; none where dW is base:
    the planner writes dW over base's bytes when nothing else reads base, OpSpec
    extra["accumulates_into"], and then only the hits move);
    then the indices are examined in order in chunks of ``EMB_CHUNK`` (each thread loads 4 of them at
    once): the ones naming a row of the tile (the hits) are compacted into shared memory in index
    order (warp ballots, then a prefix over the 32 warp counts), and every thread walks only the hits,
    adding grad row k into row idx[k] for its columns, the grad values of ``EMB_BATCH`` hits loaded
    before they are added. Every element of dW is written by one thread, its terms summed in index
    order: the same bits every run, whatever the tiling, and the same bits as the previous body.

    Why (run 26, dense 49152 x 768 table, 2048 indices, 373-row tiles: 190 us per task against a 48 us
    model): the previous body made every thread walk all 2048 indices from shared memory (~15 of them
    hit a 373-row tile), staged 256 indices per step (8 dependent global round trips, 16 block syncs),
    and added each hit with a load of g, a load of dW and a store in sequence, one hit at a time.
    (Run 14: one global index load per k and scalar zeroing took ~424 us per task.)"""
    g, idx = ctx.inputs[0], ctx.inputs[1]
    base = ctx.inputs[2] if len(ctx.inputs) > 2 else None  # ops.embedding_grad_sum: start from base's rows
    dw = ctx.outputs[0]
    n, D = dw.shape
    N = idx.numel
    T = ctx.threads
    if T % 32 or EMB_CHUNK % T or (EMB_CHUNK // T) * (T // 32) > 32:
        raise ctx.fail(f"the embedding backward's compaction needs a multiple of 32 threads dividing "
                       f"{EMB_CHUNK}, at most 32 warp counts; got {T} threads")
    S, NW, H = EMB_CHUNK // T, T // 32, EMB_BATCH
    pad = int(ctx.attr("padding_idx", -1) if ctx.attr("padding_idx") is not None else -1)
    acc = compute_type(dw.dtype)
    zero_vec = dw.dtype in ("f32", "bf16", "f16")
    lines = [
        "const long long r0_ = c.t->lo[0], r1_ = c.t->hi[0], c0_ = c.t->lo[1], c1_ = c.t->hi[1];",
        f"int* cnt_ = reinterpret_cast<int*>({ctx.smem});  // hits per (sub-round, warp)",
        f"int2* hit_ = reinterpret_cast<int2*>({ctx.smem} + 128);  // (k - k0, row) of the chunk's hits, in k order",
        "const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;",
    ]
    # the tile's start: zeros, or base's rows (a copy; nothing to do where dW is written over base)
    first = "0" if base is None else f"latch::ld<{base.ctype}>({base.ptr}, i)"
    if base is not None:
        lines.append(f"if (static_cast<const void*>({base.ptr}) != static_cast<const void*>({dw.ptr})) {{")
    if zero_vec:
        aligned = f"(reinterpret_cast<unsigned long long>({dw.ptr}) % (4 * sizeof(*{dw.ptr}))) == 0"
        if base is not None:
            aligned += f" && (reinterpret_cast<unsigned long long>({base.ptr}) % (4 * sizeof(*{base.ptr}))) == 0"
        lines += [
            f"if (c0_ == 0 && c1_ == {D}LL && ((r0_ * {D}LL) % 4) == 0 && {aligned}) {{",
            f"  const long long b_ = r0_ * {D}LL, e_ = r1_ * {D}LL, v_ = b_ + ((e_ - b_) / 4) * 4;",
        ]
        if base is None:
            lines += [f"  const {acc} z_[4] = {{({acc})0, ({acc})0, ({acc})0, ({acc})0}};",
                      "  for (long long i = b_ + 4 * threadIdx.x; i < v_; i += 4 * LATCH_THREADS) latch::st4(" + dw.ptr + ", i, z_);"]
        else:  # four 16-byte loads in flight per thread, then their stores
            lines += ["  long long i = b_ + 4 * threadIdx.x;",
                      "  for (; i + 12 * LATCH_THREADS < v_; i += 16 * LATCH_THREADS) {",
                      f"    {acc} q_[4][4];",
                      "#pragma unroll",
                      f"    for (int u = 0; u < 4; ++u) latch::ld4({base.ptr}, i + u * 4 * LATCH_THREADS, q_[u]);",
                      "#pragma unroll",
                      f"    for (int u = 0; u < 4; ++u) latch::st4({dw.ptr}, i + u * 4 * LATCH_THREADS, q_[u]);",
                      "  }",
                      "  for (; i < v_; i += 4 * LATCH_THREADS) {",
                      f"    {acc} q_[4];",
                      f"    latch::ld4({base.ptr}, i, q_);",
                      f"    latch::st4({dw.ptr}, i, q_);",
                      "  }"]
        lines += [
            f"  for (long long i = v_ + threadIdx.x; i < e_; i += LATCH_THREADS) latch::st<{dw.ctype}>({dw.ptr}, i, ({acc}){first});",
            "} else {",
        ]
    lines += [
        "for (long long d = c0_ + threadIdx.x; d < c1_; d += LATCH_THREADS)",
        f"  for (long long r = r0_; r < r1_; ++r) {{ const long long i = r * {D}LL + d; "
        f"latch::st<{dw.ctype}>({dw.ptr}, i, ({acc}){first}); }}",
    ]
    if zero_vec:
        lines.append("}")
    if base is not None:
        lines.append("}")
    lines += [
        f"for (long long k0 = 0; k0 < {N}LL; k0 += {EMB_CHUNK}) {{",
        "  latch::block_sync();  // the previous chunk's hits are walked (and the tile zeroed) before they are replaced",
        f"  long long tk_[{S}];",
        f"  unsigned bal_[{S}];",
        "#pragma unroll",
        f"  for (int s = 0; s < {S}; ++s) {{  // k = k0 + s * THREADS + threadIdx.x: coalesced, {S} loads in flight",
        f"    const long long k = k0 + s * {T} + threadIdx.x;",
        "    long long t = -1;",
        f"    if (k < {N}LL) t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, k);",
        "    tk_[s] = t;",
        "  }",
        "#pragma unroll",
        f"  for (int s = 0; s < {S}; ++s) {{",
        f"    const long long k = k0 + s * {T} + threadIdx.x;",
        "    long long t = tk_[s];",
        f"    if (k < {N}LL) {{",
        f"      if (t < 0 || t >= {n}LL) {{ latch_report(latch::ERR_INDEX_RANGE, t, {n}LL); t = -1; }}",
        f"      else if (t < r0_ || t >= r1_ || t == {pad}LL) t = -1;",
        "    }",
        "    tk_[s] = t;",
        "    bal_[s] = __ballot_sync(0xffffffffu, t >= 0);",
        f"    if (lane_ == 0) cnt_[s * {NW} + warp_] = __popc(bal_[s]);",
        "  }",
        "  latch::block_sync();",
        f"  int base_[{S}];",
        "  int m_ = 0;",
        f"  for (int j = 0; j < {S * NW}; ++j) {{  // prefix over the counts in (sub-round, warp) = k order",
        "#pragma unroll",
        f"    for (int s = 0; s < {S}; ++s) if (j == s * {NW} + warp_) base_[s] = m_;",
        "    m_ += cnt_[j];",
        "  }",
        "#pragma unroll",
        f"  for (int s = 0; s < {S}; ++s)",
        "    if (tk_[s] >= 0)",
        "      hit_[base_[s] + __popc(bal_[s] & ((1u << lane_) - 1u))] = "
        f"make_int2(s * {T} + (int)threadIdx.x, (int)(tk_[s] - r0_));",
        "  latch::block_sync();",
        f"  for (int j0 = 0; j0 < m_; j0 += {H}) {{",
        f"    const int hn_ = (m_ - j0) < {H} ? (m_ - j0) : {H};",
        "    for (long long d = c0_ + threadIdx.x; d < c1_; d += LATCH_THREADS) {",
        f"      {acc} gv_[{H}];",
        "#pragma unroll",
        f"      for (int h = 0; h < {H}; ++h)",
        f"        if (h < hn_) gv_[h] = latch::ld<{g.ctype}>({g.ptr}, (k0 + hit_[j0 + h].x) * {D}LL + d);",
        "#pragma unroll",
        f"      for (int h = 0; h < {H}; ++h)",
        "        if (h < hn_) {  // in k order: a row hit twice gets its terms in order",
        f"          const long long o_ = (r0_ + hit_[j0 + h].y) * {D}LL + d;",
        f"          latch::st<{dw.ctype}>({dw.ptr}, o_, latch::ld<{dw.ctype}>({dw.ptr}, o_) + gv_[h]);",
        "        }",
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def _select_along(ctx: BodyContext, index_offset) -> list[str]:
    """out[y] = x[y with y[dim] replaced by idx[index_offset(ys)]]: gather and index_select differ
    only in where the index of an output element lives. One element per thread (the general case)."""
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
    return lines


def _gather(ctx: BodyContext) -> str:
    # idx has the output's shape: an index per element, so no row path (each element its own source)
    return "\n".join(_select_along(ctx, lambda ys, dim, idx: cgen.dot(ys, cgen.strides(idx.shape))))


def _index_select(ctx: BodyContext) -> str:
    # idx is 1-D, indexed by the output's coordinate along dim
    x, idx = ctx.inputs
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    scalar = _select_along(ctx, lambda ys, dim, idx: f"y{dim}")
    if not row_path_taken(ctx.op, x.shape, out.shape, dim):
        return "\n".join(scalar)
    r = out.rank
    xst, ost = cgen.strides(x.shape), cgen.strides(out.shape)
    row = _row_gather(
        x=x, out=out, idx=idx, k=dim, bound=x.shape[dim],
        index_off=lambda ys: ys[dim],
        x_row=lambda ys: cgen.dot(ys[:dim] + ["t"], xst[:dim + 1]),
        o_row=lambda ys: cgen.dot(ys, ost[:dim + 1]))
    # the row path needs one contiguous run per row: the tile spans every dim after dim + 1 whole
    full = " && ".join(f"c.t->lo[{d}] == 0 && c.t->hi[{d}] == {out.shape[d]}" for d in range(dim + 2, r)) or "true"
    return "\n".join([f"if ({full}) {{"] + ["  " + ln for ln in row] + ["} else {"]
                      + ["  " + ln for ln in scalar] + ["}"])


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
        Lowering("latch::embedding", body=_embedding, headers=h,
                 doc="row gather: a warp per row, the index once, 16-byte vectors (runs of ROW_MIN elements and more)"),
        Lowering("latch::embedding_backward", body=_embedding_backward, headers=h, smem=emb_backward_smem,
                 doc="each thread owns tile columns: zero the tile (16-byte stores; with base, copy base's rows), "
                     "compact the indices hitting "
                     "the tile in order (ballots), add the hits' grad rows in order (no atomics)"),
        Lowering("latch::gather", body=_gather, headers=h),
        Lowering("latch::index_select", body=_index_select, headers=h,
                 doc="row gather along dim (runs of ROW_MIN elements and more), else one element per thread"),
        Lowering("latch::scatter", body=_scatter(False), headers=h),
        Lowering("latch::scatter_add", body=_scatter(True), headers=h),
        Lowering("latch::index_add", body=_index_add, headers=h),
    ]
