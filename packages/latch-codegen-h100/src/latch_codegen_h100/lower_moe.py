"""Lowerings of the MoE ops (latch_ops/moe): token_topk (+ backward), route_order, ragged_mm and its
two gradients. Registered here, by latch-codegen-h100's plugin; a third-party op package would
register its lowerings through its own ``latch_register_lowerings`` the same way.

Routing decisions are data: the ragged bodies read ``offsets`` at run time and walk the expert
segments inside their tile (``latch_moe.cuh``). Two bodies per ragged product:
- **grouped wgmma** (``ragged_produce``/``ragged_consume``, ``ragged_w_produce``/``ragged_w_consume``):
  BF16/F16 operands (stored so by ``moe.store_operands``) whose rows are 16-byte aligned, an
  FP32/BF16/F16 result: TMA loads through the worker's ring, wgmma into FP32 accumulators, the
  store in the epilogue. The forward and grad_x tile by output rows x columns (a 128-row box meets
  one or two experts: one 128 x BN sub-tile per expert it meets); grad_w by (expert, Din, Dout)
  boxes, the K loop over the expert's own rows (grouped along K, one fixed-order sum per element:
  deterministic, no split, no atomics).
- **SIMT** (the matmul tile loop, ``operand_dtype`` rounding like latch::matmul): everything else.
  Which one a node gets is decided by :func:`ragged_wgmma` from its operand types alone.
"""

from __future__ import annotations

import math

from latch_ops.moe import tilings

from . import cgen
from .lowering import BodyContext, Lowering, LoweringError, OnlyWhen, TensorMap, compute_type

HEADER = "latch_moe.cuh"
MAX_EXPERTS = 8192  # route_order keeps one counter per expert in shared memory
FAST_EXPERTS = 256  # = latch::ROUTE_FAST_EXPERTS: route_order_warps scans the counts one thread per expert
SPLIT_EXPERTS = 64  # = latch::ROUTE_SPLIT_EXPERTS = latch_ops.moe.route_split.MAX_EXPERTS


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
    return (f"latch::token_topk_warps<{probs.ctype}, {indices.ctype}>({probs.ptr}, {values.ptr}, {indices.ptr}, "
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
    fn = "route_order_warps" if E <= FAST_EXPERTS else "route_order_all"
    return (f"latch::{fn}<{idx.ctype}, {token.ctype}>({idx.ptr}, {token.ptr}, {position.ptr}, "
            f"{offsets.ptr}, {N}LL, {k}, {E}LL, (int*){ctx.smem});")


def _route_smem(ctx: BodyContext) -> int:
    E = int(ctx.attr("num_experts"))
    return 4 * (ctx.threads // 32) * (E + 1) if E <= FAST_EXPERTS else 4 * (E + ctx.threads)


# route_order over many SMs (latch_ops.moe.route_split; the bodies in latch_route.cuh)

def _split_geometry(ctx: BodyContext) -> tuple[int, int, int, int, int]:
    """(N, k, E, chunk, C) of a route_split node, checked against what the bodies take."""
    idx = ctx.inputs[0]
    N, k = idx.shape
    E, chunk = int(ctx.attr("num_experts")), int(ctx.attr("chunk"))
    if E > SPLIT_EXPERTS:
        raise LoweringError(f"{ctx.op}: {E} experts exceed {SPLIT_EXPERTS}, the most the split route_order bodies "
                            "take (moe.route_split leaves such a route_order whole)")
    return N, k, E, chunk, -(-N * k // chunk)


def _route_count(ctx: BodyContext) -> str:
    idx = ctx.inputs[0]
    counts = ctx.outputs[0]
    N, k, E, chunk, _C = _split_geometry(ctx)
    P = N * k
    return "\n".join([
        "for (long long q = c.t->lo[0]; q < c.t->hi[0]; ++q) {  // chunk q's row of counts",
        f"  latch::route_count<{idx.ctype}, {counts.ctype}>({idx.ptr}, {counts.ptr} + q * {E}LL, q * {chunk}LL, "
        f"min({P}LL, (q + 1) * {chunk}LL), {E}LL, (int*){ctx.smem});",
        "  latch::block_sync();  // the counters are free for the next chunk",
        "}"])


def _route_place(ctx: BodyContext) -> str:
    idx, counts = ctx.inputs
    position = ctx.outputs[0]
    N, k, E, chunk, C = _split_geometry(ctx)
    return (f"latch::route_place<{idx.ctype}, {counts.ctype}, {position.ctype}>({idx.ptr}, {counts.ptr}, "
            f"{position.ptr}, {N * k}LL, {chunk}LL, {C}LL, {E}LL, c.t->lo[0] / {chunk}LL, "
            f"(c.t->hi[0] + {chunk - 1}LL) / {chunk}LL, (int*){ctx.smem});")


def _route_rows(ctx: BodyContext) -> str:
    idx, counts = ctx.inputs
    token, pairs = ctx.outputs
    if not (token.present and pairs.present):
        raise LoweringError(f"{ctx.op}: both outputs (token, pairs) must reach memory")
    N, k, E, chunk, C = _split_geometry(ctx)
    return (f"latch::route_rows<{idx.ctype}, {counts.ctype}, {token.ctype}>({idx.ptr}, {counts.ptr}, {token.ptr}, "
            f"{pairs.ptr}, {N * k}LL, {k}, {chunk}LL, {C}LL, {E}LL, c.t->lo[0], c.t->hi[0], (int*){ctx.smem});")


def _route_offsets(ctx: BodyContext) -> str:
    (counts,) = ctx.inputs
    offsets = ctx.outputs[0]
    C, E = counts.shape
    if E > SPLIT_EXPERTS:
        raise LoweringError(f"{ctx.op}: {E} experts exceed {SPLIT_EXPERTS}, the most the split route_order bodies take")
    return (f"latch::route_offsets<{counts.ctype}, {offsets.ctype}>({counts.ptr}, {offsets.ptr}, {C}LL, {E}LL, "
            f"(int*){ctx.smem});")


def _split_smem(which: str):
    """Scratch of a split body: route_prefix's (cum, off, seg), and route_place's warp counts."""
    def smem(ctx: BodyContext) -> int:
        if which == "count":
            return 4 * int(ctx.attr("num_experts"))
        if which == "offsets":
            C, E = ctx.inputs[0].shape
        else:
            _N, _k, E, _chunk, C = _split_geometry(ctx)
        ints = (C + 1) * E + E + 1 + ctx.threads + (ctx.threads // 32 * E if which == "place" else 0)
        return 4 * ints
    return smem


GATHER_U = 4  # groups of four elements per thread per step: U * k 16-byte loads in flight


def _gather_sum(ctx: BodyContext) -> str:
    """latch::gather_sum (latch_ops.moe.gather_sum): thread t takes groups of four consecutive output
    elements of the tile (rows r0..r1, every column), U groups a step: the k source rows' vectors
    of all U groups are loaded (the index of each output row once per group, an L1 broadcast)
    before any is summed, from zero in slot order in latch::sum's accumulator (double for floats of
    32 bits and fewer), then rounded once and stored with one 16-byte store. Rows whose length is
    not a multiple of four, or operands not 16-byte aligned, take one element a thread."""
    src, index, *rest = ctx.inputs
    base = rest[0] if rest and rest[0] is not None and rest[0].present else None
    out = ctx.outputs[0]
    k = int(ctx.attr("k"))
    R = src.shape[0]
    D = math.prod(src.shape[1:])
    ct, oct_ = compute_type(src.dtype), compute_type(out.dtype)
    acc = "double" if ct == "float" else ct
    U = GATHER_U
    check = (f"if (t_ < 0 || t_ >= {R}LL) {{ latch_report(latch::ERR_INDEX_RANGE, t_, {R}LL); t_ = 0; bad_ = true; }}")
    L = [f"const long long first_ = (long long)c.t->lo[0] * {D}LL, n_ = ((long long)c.t->hi[0] - c.t->lo[0]) * {D}LL;"]
    if D % 4 == 0:
        al = f" && latch::aligned4({base.ptr}, 0)" if base is not None else ""
        L += [f"if (latch::aligned4({src.ptr}, 0) && latch::aligned4({out.ptr}, 0){al}) {{",
              "  const long long n4_ = n_ / 4;",
              f"  for (long long g0_ = threadIdx.x; g0_ < n4_; g0_ += {U}LL * LATCH_THREADS) {{",
              f"    {ct} v_[{U}][{k}][4];",
              *([f"    {compute_type(base.dtype)} b_[{U}][4];"] if base is not None else []),
              f"    bool bad_ = false;",
              "    #pragma unroll",
              f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
              "      const long long g_ = min(g0_ + u_ * LATCH_THREADS, n4_ - 1);  // past the tile: a valid group, unused",
              f"      const long long e_ = first_ + 4 * g_, n = e_ / {D}LL, j = e_ - n * {D}LL;",
              *([f"      latch::gld4({base.ptr}, e_, b_[u_]);"] if base is not None else []),
              "      #pragma unroll",
              f"      for (int s_ = 0; s_ < {k}; ++s_) {{",
              f"        long long t_ = (long long){index.ptr}[n * {k}LL + s_];",
              f"        {check}",
              f"        latch::gld4({src.ptr}, t_ * {D}LL + j, v_[u_][s_]);",
              "      }",
              "    }",
              "    if (bad_) continue;",
              "    #pragma unroll",
              f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
              "      const long long g_ = g0_ + u_ * LATCH_THREADS;",
              "      if (g_ >= n4_) break;",
              f"      {oct_} o_[4];",
              "      #pragma unroll",
              "      for (int q_ = 0; q_ < 4; ++q_) {",
              f"        {acc} a_ = " + (f"({acc})b_[u_][q_];" if base is not None else f"({acc})0;"),
              "        #pragma unroll",
              f"        for (int s_ = 0; s_ < {k}; ++s_) a_ += ({acc})v_[u_][s_][q_];",
              f"        o_[q_] = ({oct_})a_;",
              "      }",
              f"      latch::gst4({out.ptr}, first_ + 4 * g_, o_);",
              "    }",
              "  }",
              "} else {"]
    L += ["  for (long long i_ = threadIdx.x; i_ < n_; i_ += LATCH_THREADS) {",
          f"    const long long e_ = first_ + i_, n = e_ / {D}LL, j = e_ - n * {D}LL;",
          f"    {acc} a_ = " + (f"({acc})latch::ld<{base.ctype}>({base.ptr}, e_);" if base is not None else f"({acc})0;"),
          "    bool bad_ = false;",
          f"    for (int s_ = 0; s_ < {k}; ++s_) {{",
          f"      long long t_ = (long long){index.ptr}[n * {k}LL + s_];",
          f"      {check}",
          f"      a_ += ({acc})latch::ld<{src.ctype}>({src.ptr}, t_ * {D}LL + j);",
          "    }",
          f"    if (!bad_) latch::st<{out.ctype}>({out.ptr}, e_, ({oct_})a_);",
          "  }"]
    if D % 4 == 0:
        L.append("}")
    return "\n".join(L)


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


# --------------------------------------------------------------------------------------------
# Grouped wgmma bodies

BK = 64
LOW = ("bf16", "f16")
OUT = ("f32", "bf16", "f16")  # what the fused epilogue stores


def ragged_wgmma(op: str, in_types, out_dtype: str) -> int | None:
    """BN of the wgmma body for a ragged node with operand types ``in_types`` ((shape, dtype) of
    the two float operands) and result dtype ``out_dtype``, or None when the SIMT body computes it.
    The forward and grad_x take the tile width of ``latch_ops.moe.tilings.cols`` (256 for wide
    outputs), so a task is one sub-tile per expert its rows meet."""
    (a_shape, a_dt), (b_shape, b_dt) = in_types
    if a_dt not in LOW or b_dt != a_dt or out_dtype not in OUT:
        return None
    if any(d % 8 for d in (a_shape[-1], b_shape[-1])):  # TMA: 16-byte row strides
        return None
    if max(*a_shape, *b_shape) >= 2 ** 31:
        return None
    if op == "latch::ragged_mm":  # w[e] [K, N] N-major: whole 64-column blocks
        n = b_shape[2]
        return tilings.cols(n, a_dt) if n > 64 else 64
    if op == "latch::ragged_mm_grad_x":  # w[e] [N, K] K-major: N = Din, any multiple of 16
        n = b_shape[1]
        wide = tilings.cols(n, a_dt)
        return wide if wide > 128 else next(x for x in (16, 32, 64, 96, 128) if x >= min(n, 128))
    n = b_shape[1]  # grad_w: g [R, Dout] N-major
    return 128 if n > 64 else 64


def _bn(ctx: BodyContext) -> int | None:
    a, b = ctx.inputs[0], ctx.inputs[1]
    return ragged_wgmma(ctx.op, ((a.shape, a.dtype), (b.shape, b.dtype)), ctx.outputs[0].dtype)


def _w_args(ctx: BodyContext) -> tuple[int, ...]:
    if _bn(ctx) is None:
        return ()
    if ctx.op == "latch::ragged_mm_grad_w":
        _, din, dout = ctx.outputs[0].shape
        return (din, dout)
    x, w, _ = ctx.inputs
    E = w.shape[0]
    K = x.shape[1]
    N = ctx.outputs[0].shape[1]
    return (E, K, N)


def _rows_box() -> str:
    return "const int r_lo = c.t->lo[0], r_hi = c.t->hi[0], n_lo = c.t->lo[1], n_hi = c.t->hi[1];"


def _w_box() -> str:
    return ("const int e_lo = c.t->lo[0], e_hi = c.t->hi[0], i_lo = c.t->lo[1], i_hi = c.t->hi[1], "
            "j_lo = c.t->lo[2], j_hi = c.t->hi[2];")


def _wgmma_body(ctx: BodyContext) -> str:
    bn = _bn(ctx)
    a, _, offsets = ctx.inputs
    out = ctx.outputs[0]
    if ctx.op == "latch::ragged_mm_grad_w":
        return "\n".join([_w_box(), "latch::Pipe p = c.pipe;",
                          f"if (!latch::ragged_w_consume<{a.ctype}, {bn}>(p, {out.ptr}, {offsets.ptr}, (int)c.args[0], "
                          "(int)c.args[1], e_lo, e_hi, i_lo, i_hi, j_lo, j_hi)) return;"])
    bk = "true" if ctx.op == "latch::ragged_mm_grad_x" else "false"
    return "\n".join([_rows_box(), "latch::Pipe p = c.pipe;",
                      f"if (!latch::ragged_consume<{a.ctype}, {bn}, {bk}>(p, {out.ptr}, {offsets.ptr}, (int)c.args[0], "
                      "(int)c.args[1], (int)c.args[2], r_lo, r_hi, n_lo, n_hi)) return;"])


def _wgmma_producer(ctx: BodyContext) -> str:
    bn = _bn(ctx)
    offsets = ctx.inputs[2]
    if ctx.op == "latch::ragged_mm_grad_w":
        return "\n".join([_w_box(),
                          f"if (!latch::ragged_w_produce<{bn}>(p, {ctx.tmap(0)}, {ctx.tmap(1)}, {offsets.ptr}, e_lo, e_hi, "
                          "i_lo, i_hi, j_lo, j_hi)) return false;"])
    bk = "true" if ctx.op == "latch::ragged_mm_grad_x" else "false"
    return "\n".join([_rows_box(),
                      f"if (!latch::ragged_produce<{bn}, {bk}>(p, {ctx.tmap(0)}, {ctx.tmap(1)}, {offsets.ptr}, "
                      "(int)c.args[0], (int)c.args[1], r_lo, r_hi, n_lo, n_hi)) return false;"])


def _tensor_maps(ctx: BodyContext) -> list[TensorMap]:
    bn = _bn(ctx)
    a, b, _ = ctx.inputs
    if ctx.op == "latch::ragged_mm_grad_w":
        (R, din), (_, dout) = a.shape, b.shape
        return [TensorMap(0, (din, R), (64, 64)), TensorMap(1, (dout, R), (64, 64))]
    R, K = a.shape
    E, d1, d2 = b.shape
    amap = TensorMap(0, (K, R), (64, 128))
    if ctx.op == "latch::ragged_mm":  # w [E, K, N]
        return [amap, TensorMap(1, (d2, d1, E), (64, 64, 1))]
    return [amap, TensorMap(1, (d2, d1, E), (64, bn, 1))]  # grad_x: w [E, N, K]


def _stage_bytes(ctx: BodyContext) -> int:
    return (128 + _bn(ctx)) * BK * 2


def _is_wgmma(ctx: BodyContext) -> bool:
    return _bn(ctx) is not None


def _either(simt):
    def body(ctx: BodyContext) -> str:
        return _wgmma_body(ctx) if _is_wgmma(ctx) else simt(ctx)
    body.__qualname__ = f"ragged_body_{getattr(simt, '__qualname__', 'simt')}"
    return body


def _smem(ctx: BodyContext) -> int:
    return 0 if _is_wgmma(ctx) else _mm_smem(ctx)


def _ragged_lowering(op: str, simt) -> Lowering:
    return Lowering(op, body=_either(simt), headers=(HEADER,), smem=_smem,
                    producer=OnlyWhen(_is_wgmma, _wgmma_producer), tensor_maps=OnlyWhen(_is_wgmma, _tensor_maps),
                    stage_bytes=OnlyWhen(_is_wgmma, _stage_bytes), args=_w_args,
                    doc="grouped wgmma + TMA over the expert segments read from offsets (BF16/F16 operands, FP32 "
                        "accumulation, fused store); tiled SIMT otherwise")


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::token_topk", body=_token_topk, headers=h,
                 doc="warp per row: k rounds of a per-lane pick and a shuffle arg-max"),
        Lowering("latch::token_topk_backward", body=_token_topk_backward, headers=h),
        Lowering("latch::route_order", body=_route_order, headers=h, smem=_route_smem, whole=True,
                 doc="one block: up to 256 experts, each warp counts its contiguous pairs (warp match), a "
                     "block scan gives the offsets and each warp's first rows, a second pass ranks; beyond "
                     "256 experts, 256 pairs at a time with a scan of the chunk"),
        Lowering("latch::gather_sum", body=_gather_sum, headers=h,
                 doc="groups of four elements a thread, U groups a step: the k rows' 16-byte loads in flight "
                     "together, summed from zero in slot order, one rounding, one 16-byte store"),
        Lowering("latch::route_count", body=_route_count, headers=h, smem=_split_smem("count"),
                 doc="a chunk of pairs per task: warp match groups add to per-expert shared counters"),
        Lowering("latch::route_place", body=_route_place, headers=h, smem=_split_smem("place"),
                 doc="a chunk per task: the counts give each expert's first row in the chunk; each warp "
                     "counts, a scan over the warps, a second pass ranks"),
        Lowering("latch::route_rows", body=_route_rows, headers=h, smem=_split_smem("rows"),
                 doc="sorted rows per task: the counts' column sums say which chunks hold the rows' ranks; "
                     "a warp walks one (expert, chunk) with a ballot"),
        Lowering("latch::route_offsets", body=_route_offsets, headers=h, smem=_split_smem("offsets"), whole=True,
                 doc="one task: column sums of the counts and their scan"),
        _ragged_lowering("latch::ragged_mm", _ragged(0)),
        _ragged_lowering("latch::ragged_mm_grad_x", _ragged(1)),
        _ragged_lowering("latch::ragged_mm_grad_w", _ragged_grad_w),
    ]
