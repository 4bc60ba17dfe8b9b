"""Lowerings of ``latch::sdpa`` and ``latch::sdpa_backward`` (latch_ops/attention.py).

Bodies at (batch, head, block) granularity (latch_ops.attention's tilings). BF16 operands (BF16
storage, or FP32 under the BF16 policy) with head dims 64/128 run the tensor-core bodies of latch_attention_mma.cuh (mma.sync m16n8k16, FP32
accumulation: a flash forward with online softmax, and a backward that rebuilds P from lse; see
:func:`tensor_cores`); everything else runs the SIMT bodies of latch_attention.cuh. The SIMT forward walks
the task's box of query rows (dims B, H, Tq of ``out``), one warp per row; a backward task (a box of
dq: batch, a group of query heads, a block of rows) computes dq for its query rows and dk, dv for
the key rows of the same block (``latch_ops.attention.key_block``), one warp per row, dk/dv summed
over each key/value head's query heads in head order. Grouped-query attention: query head h reads
key/value head h / G. Head dims up to 256 (8 chunks of 32 per lane). ``operand_dtype="bf16"``
rounds q, k, v (and P) to bf16.

The forward of BF16 storage with head dims 64/128 runs on the worker's ring by default
(latch_attention_wgmma.cuh, :func:`wgmma_forward`): the producer warp TMA-loads Q and the key/value
blocks through the kernel's ring of stages, the consumers run S = Q K^T and O += P V on wgmma with
the online softmax in registers (measured on the H200: results/fa.md). ``attention_body`` on a node
chooses: ``"wgmma"`` (an error naming the node's shapes where it cannot run), ``"mma"``, ``"simt"``.
The backward of BF16 storage with head dims 64/128 runs on the ring too by default
(latch_attention_wgmma_bwd.cuh, :func:`wgmma_backward`); ``attention_body`` on the
``latch::sdpa_backward`` node chooses as on the forward. The producer warp TMA-loads every block (Q, dO,
O and the 64 lse / glse values of a query block; K and V of a key block) through the ring; the
consumers run dQ per block of 64 query rows and dK/dV per block of 64 keys, the two warpgroups
splitting each loop and adding their FP32 partials in a fixed order (no atomics).
"""

from __future__ import annotations

import struct

from . import cgen
from .lowering import BodyContext, Lowering, LoweringError, OnlyWhen, TensorMap

HEADER = "latch_attention.cuh"
MMA_HEADER = "latch_attention_mma.cuh"
WGMMA_HEADER = "latch_attention_wgmma.cuh"
WGMMA_BWD_HEADER = "latch_attention_wgmma_bwd.cuh"
WGMMA_BWD_BLOCK = 64  # rows of every block of the wgmma backward (latch::awg::BwdShape::B)
# floats of its 1-D lse / glse boxes (latch::awg::BwdShape::LSE_BOX): a block's 64 rows from a start
# rounded down to 16 bytes (the H200 faults on an unaligned 1-D box start: results/lead13.md)
WGMMA_BWD_LSE_BOX = WGMMA_BWD_BLOCK + 4
WGMMA_BWD_LSE_ROOM = (4 * WGMMA_BWD_LSE_BOX + 127) // 128 * 128  # BwdShape::LSE_ROOM
BODIES = ("simt", "mma", "wgmma", "wgmma2")  # values of the ``attention_body`` attribute
# the wgmma backward's variants (latch::awg::bwd_consume's V): "wgmma2" overlaps the elementwise work
# of a warpgroup with its own products (the same sums, the same bits); the backward node only
BWD_VARIANTS = {"wgmma": 1, "wgmma2": 2}
WGMMA_ROWS = 128  # query rows per tile of the wgmma forward (latch::awg::FwdShape::BM)
MAX_HEAD = 256
MMA_HEADS = (64, 128)
MMA_BLOCK = 64  # keys (and backward query rows) per staged block of the mma bodies
MMA_ROWS = 128  # query rows one forward call covers (8 warps x 16)


def tensor_cores(ctx: BodyContext) -> bool:
    """The tensor-core (mma.sync) bodies serve BF16 operands with equal head dims 64 or 128: BF16
    storage, or FP32 storage under ``operand_dtype="bf16"`` (the numerical policy's BF16
    attention; the body rounds as it stages). Everything else (FP32 without the policy, f64, other
    head dims) runs the SIMT bodies, which compute in the storage's precision (the FP64 tests'
    exact path). ``attention_body="simt"`` on the node forces the SIMT bodies (tests compare them)."""
    q, k, v = ctx.inputs[2:5] if ctx.op.endswith("backward") else ctx.inputs[:3]
    body = _chosen(ctx)
    if body == "simt":
        return False
    if wgmma_forward(ctx) or wgmma_backward(ctx):
        return False
    op = ctx.attr("operand_dtype")
    dtype_ok = (q.dtype == "bf16" and op in (None, "bf16")) or (q.dtype == "f32" and op == "bf16")
    return dtype_ok and q.dtype == k.dtype == v.dtype and q.shape[3] == v.shape[3] and q.shape[3] in MMA_HEADS


def _chosen(ctx: BodyContext) -> str | None:
    """The node's ``attention_body`` attribute, checked (None: the default choice)."""
    body = ctx.attr("attention_body")
    if body is not None and body not in BODIES:
        raise LoweringError(f"{ctx.op}: attention_body={body!r} is not one of {BODIES}; drop it for the default")
    return body


def _qkv(ctx: BodyContext):
    return ctx.inputs[2:5] if ctx.op.endswith("backward") else ctx.inputs[:3]


def _wgmma_legal(ctx: BodyContext) -> str | None:
    """None when the wgmma forward (or backward) can run the node, else why not."""
    q, k, v = _qkv(ctx)
    op = ctx.attr("operand_dtype")
    if not (q.dtype == k.dtype == v.dtype == "bf16" and op in (None, "bf16") and q.shape[3] == k.shape[3] == v.shape[3]
            and q.shape[3] in MMA_HEADS):
        return (f"needs BF16 q/k/v with equal head dims 64 or 128; got q {q.dtype}{list(q.shape)}, "
                f"k {k.dtype}{list(k.shape)}, v {v.dtype}{list(v.shape)}, operand_dtype {op!r}")
    if ctx.op.endswith("backward"):
        go, glse, _, _, _, o, lse = ctx.inputs
        if not (go.dtype == o.dtype == "bf16" and lse.dtype == "f32" and (glse is None or glse.dtype == "f32")):
            return (f"needs BF16 grad_out and out and FP32 lse/grad_lse; got grad_out {go.dtype}, out {o.dtype}, "
                    f"lse {lse.dtype}, grad_lse {None if glse is None else glse.dtype}")
    if max(q.shape[0] * q.shape[1], q.shape[2], k.shape[2]) >= 2 ** 31 or (
            ctx.op.endswith("backward") and q.shape[0] * q.shape[1] * q.shape[2] >= 2 ** 31):
        return f"takes 32-bit TMA coordinates (lse as one flat tensor in the backward); q {list(q.shape)} is too large"
    return None


def wgmma_backward(ctx: BodyContext) -> bool:
    """Whether the backward node runs the wgmma body: the default wherever it can (BF16 storage, equal
    head dims 64 or 128, FP32 lse); ``attention_body="wgmma"`` insists (an error where it cannot),
    ``"mma"`` / ``"simt"`` choose the others."""
    body = _chosen(ctx)
    if not ctx.op.endswith("backward") or body in ("mma", "simt"):
        return False
    why = _wgmma_legal(ctx)
    if why and body in BWD_VARIANTS:
        raise LoweringError(f"{ctx.op}: attention_body={body!r} {why}: use attention_body='mma' (or leave it unset)")
    if why:
        return False
    dq, dk, dv = ctx.outputs
    if not (dq.present and dk.present and dv.present):
        raise LoweringError(f"{ctx.op}: every output (dq, dk, dv) must reach memory")
    return True


def wgmma_forward(ctx: BodyContext) -> bool:
    """Whether the forward node runs the wgmma body: the default wherever it can (BF16 storage, equal
    head dims 64 or 128: TMA copies the bytes as they are, so FP32 values under the BF16 policy keep
    the mma.sync body, which rounds as it stages); ``attention_body="wgmma"`` insists (an error where
    it cannot), ``"mma"`` / ``"simt"`` choose the others."""
    body = _chosen(ctx)
    if body == "wgmma2" and not ctx.op.endswith("backward"):
        raise LoweringError(f"{ctx.op}: attention_body='wgmma2' is a backward body (latch::sdpa_backward); "
                            "use 'wgmma' on the forward")
    if ctx.op.endswith("backward") or body in ("mma", "simt"):
        return False
    why = _wgmma_legal(ctx)
    if why and body == "wgmma":
        raise LoweringError(f"{ctx.op}: attention_body='wgmma' {why}: use attention_body='mma' (or leave it unset)")
    return why is None


# head dims whose wgmma forward accumulates each key block's P V apart from O (latch::awg::FwdOwnPv)
OWN_PV_HEADS = (64,)


def kernel_defaults(doc):
    """The document with the forward's default body chosen for the whole kernel: where any program
    runs the wgmma backward (BF16 storage, equal head dims 64 or 128, no ``attention_body`` asking
    otherwise), every forward of head dim 128 left at the default takes the mma.sync body
    (``attention_body="mma"``); head dim 64 keeps the wgmma forward.

    Why: ptxas serialises every wgmma of the kernel (C7511, "insufficient register resources for the
    wgmma pipeline in the function 'latch_kernel'": each HGMMA then waits for the one before, the
    products' too) when a model's kernel inlines both wgmma attention bodies beside its other
    bodies: found on the CPU (nvcc 13.0) for TinyMoE-200M and for the dense transformer at head
    dim 64 once memory.policy stored attention in BF16; either wgmma body alone beside the same
    bodies compiles pipelined (results/lead7.md). Bisected on the dense transformer's kernel
    (results/sa.md): the two wgmma attention bodies and one 128 x 64 product suffice, and the
    forward's O += P V is what tips it; accumulating each block's P V apart and adding it into O
    (latch::awg::FwdOwnPv, head dim 64) in blocks of 64 keys compiles both kernels pipelined (TinyMoE-200M:
    0 of 164 HGMMA serialised, 126 / 100 bytes of spill stores / loads), so head dim 64 keeps the
    wgmma forward (run 32: the mma.sync forward took 39.3 us a task in TinyMoE-200M, where the
    microbenchmark's wgmma forward takes ~15). Head dim 128 (O's 64 registers, no room for a second
    accumulator) keeps the mma.sync default beside a wgmma backward. The backward is the larger
    (run 26: 3,072 tasks of 92 us on the mma.sync body), so it keeps the ring in any case. A forward
    that asks for ``"wgmma"`` keeps it."""
    import attrs as _attrs

    def wgmma_bwd(g, n) -> bool:
        if n.op != "latch::sdpa_backward" or n.attr("attention_body") in ("mma", "simt"):
            return False
        go, _glse, q, k, v, o, lse = (None if x is None else g.value(x) for x in n.inputs)
        if any(t is None for t in (go, q, k, v, o, lse)):
            return False
        return (all(t.dtype == "bf16" for t in (go, q, k, v, o)) and lse.dtype == "f32"
                and q.shape[3] == k.shape[3] == v.shape[3] and q.shape[3] in MMA_HEADS)

    progs = list(doc.graph.programs)
    if not any(wgmma_bwd(g, n) for g in progs for n in g.nodes):
        return doc
    def to_mma(g, n) -> bool:
        if n.op != "latch::sdpa" or n.attr("attention_body") is not None:
            return False
        q = g.value(n.inputs[0])
        return q is None or q.shape[3] not in OWN_PV_HEADS

    if not any(to_mma(g, n) for g in progs for n in g.nodes):
        return doc
    out = []
    for g in progs:
        nodes = [_attrs.evolve(n, attrs=dict(n.attr_dict, attention_body="mma")) if to_mma(g, n) else n
                 for n in g.nodes]
        out.append(_attrs.evolve(g, nodes=nodes))
    return _attrs.evolve(doc, graph=_attrs.evolve(doc.graph, programs=out))


def _wgmma_dims(ctx: BodyContext):
    q, k, _ = _qkv(ctx)
    B, H, Tq, D = q.shape
    return B, H, k.shape[1], Tq, k.shape[2], D, ("true" if ctx.attr("causal") else "false")


def _wgmma_args(ctx: BodyContext) -> tuple[int, ...]:
    """The wgmma bodies' run-time constants (``c.args``): H, Hkv, Tq, Tk and the scale's FP32 bits,
    so that every node of one (head dim, causal) shares one inlined body."""
    if not (wgmma_forward(ctx) or wgmma_backward(ctx)):
        return ()
    B, H, Hkv, Tq, Tk, D, _ = _wgmma_dims(ctx)
    bits = struct.unpack("<i", struct.pack("<f", float(ctx.attr("scale"))))[0]
    return (H, Hkv, Tq, Tk, bits)


def _wgmma_body(ctx: BodyContext) -> str:
    out, lse = ctx.outputs
    D, causal = _wgmma_dims(ctx)[5:]
    lse_arg = lse.ptr if lse.present else "(float*)nullptr"
    return "\n".join([
        "latch::Pipe p = c.pipe;",
        f"if (!latch::awg::fwd_consume<{D}, {causal}>(p, c.t, {out.ptr}, {lse_arg}, (int)c.args[0], (int)c.args[2], "
        f"(int)c.args[3], __int_as_float((int)c.args[4]), {ctx.smem})) return;",
    ])


def _wgmma_producer(ctx: BodyContext) -> str:
    D, causal = _wgmma_dims(ctx)[5:]
    return (f"if (!latch::awg::fwd_produce<{D}, {causal}>(p, c.t, {ctx.tmap(0)}, {ctx.tmap(1)}, {ctx.tmap(2)}, "
            "(int)c.args[0], (int)c.args[1], (int)c.args[2], (int)c.args[3])) return false;")


def _wgmma_keys(D: int) -> int:
    return 64  # latch::awg::FwdShape::BN (both head dims)


def _wgmma_tensor_maps(ctx: BodyContext) -> list[TensorMap]:
    B, H, Hkv, Tq, Tk, D, _ = _wgmma_dims(ctx)
    bn = _wgmma_keys(D)
    # [B*H][T][D] as 3-D boxes of (64 columns, rows, one head): rows past T read as zeros
    return [TensorMap(0, (D, Tq, B * H), (64, WGMMA_ROWS, 1)), TensorMap(1, (D, Tk, B * Hkv), (64, bn, 1)),
            TensorMap(2, (D, Tk, B * Hkv), (64, bn, 1))]


def _wgmma_stage_bytes(ctx: BodyContext) -> int:
    D = ctx.inputs[0].shape[3]
    return 2 * _wgmma_keys(D) * D * 2  # K and V of one key block


def _common(ctx: BodyContext, q, k, v):
    B, H, Tq, D = q.shape
    Tk, Dv, Hkv = k.shape[2], v.shape[3], k.shape[1]
    if max(D, Dv) > MAX_HEAD:
        raise LoweringError(f"{ctx.op}: head dims {D}/{Dv} exceed {MAX_HEAD}, the most this body handles")
    acc = "double" if q.dtype == "f64" else "float"
    nc = -(-max(D, Dv) // 32)
    rnd = 1 if ctx.attr("operand_dtype") == "bf16" else (2 if ctx.attr("operand_dtype") == "f16" else 0)
    causal = "true" if ctx.attr("causal") else "false"
    scale = f"({acc}){float(ctx.attr('scale'))!r}"
    return B, H, Hkv, Tq, Tk, D, Dv, acc, nc, rnd, causal, scale


def _forward(ctx: BodyContext) -> str:
    q, k, v = ctx.inputs
    out, lse = ctx.outputs
    B, H, Hkv, Tq, Tk, D, Dv, acc, nc, rnd, causal, scale = _common(ctx, q, k, v)
    G = H // Hkv
    if wgmma_forward(ctx):
        return _wgmma_body(ctx)
    if tensor_cores(ctx):
        lse_arg = f"{lse.ptr} + bh * {Tq}LL" if lse.present else "(float*)nullptr"
        return "\n".join([
            "for (long long b_ = c.t->lo[0]; b_ < c.t->hi[0]; ++b_)",
            "for (long long h_ = c.t->lo[1]; h_ < c.t->hi[1]; ++h_)",
            f"for (long long r_ = c.t->lo[2]; r_ < c.t->hi[2]; r_ += {MMA_ROWS}) {{",
            f"  const long long bh = b_ * {H}LL + h_, bkv = b_ * {Hkv}LL + h_ / {G};",
            f"  const long long re_ = r_ + {MMA_ROWS} < c.t->hi[2] ? r_ + {MMA_ROWS} : c.t->hi[2];",
            f"  latch::amma::sdpa_forward<{D}, {causal}>({q.ptr} + bh * {Tq * D}LL, {k.ptr} + bkv * {Tk * D}LL, "
            f"{v.ptr} + bkv * {Tk * D}LL, {out.ptr} + bh * {Tq * D}LL, {lse_arg}, r_, re_, {Tq}LL, {Tk}LL, "
            f"{float(ctx.attr('scale'))!r}f, {ctx.smem});",
            "}",
        ])
    lse_arg = f"{lse.ptr} + bh * {Tq}LL" if lse.present else f"({lse.ctype}*)nullptr"
    lse_t = lse.ctype
    lines = ["const int warp_ = threadIdx.x >> 5, nwarps_ = LATCH_THREADS >> 5;",
             f"{acc}* wsm = ({acc}*){ctx.smem} + warp_ * 64;",
             f"const long long n_rows = {cgen.tile_count(3)};",
             "for (long long r = warp_; r < n_rows; r += nwarps_) {"]
    lines += cgen.tile_decode("r", 3, "y", "  ")
    lines += [f"  const long long bh = y0 * {H}LL + y1, bkv = y0 * {Hkv}LL + y1 / {G};",
              f"  latch::sdpa_forward_row<{q.ctype}, {lse_t}, {acc}, {nc}, {causal}, {rnd}>("
              f"{q.ptr} + bh * {Tq * D}LL, {k.ptr} + bkv * {Tk * D}LL, {v.ptr} + bkv * {Tk * Dv}LL, "
              f"{out.ptr} + bh * {Tq * Dv}LL, {lse_arg}, y2, {Tk}LL, {D}, {Dv}, "
              f"{scale}, wsm);",
              "}"]
    return "\n".join(lines)


def _backward(ctx: BodyContext) -> str:
    go, glse, q, k, v, o, lse = ctx.inputs
    dq, dk, dv = ctx.outputs
    if not (dq.present and dk.present and dv.present):
        raise LoweringError(f"{ctx.op}: every output (dq, dk, dv) must reach memory")
    B, H, Hkv, Tq, Tk, D, Dv, acc, nc, rnd, causal, scale = _common(ctx, q, k, v)
    G = H // Hkv
    lt = lse.ctype
    if wgmma_backward(ctx):
        return _wgmma_bwd_body(ctx)
    if tensor_cores(ctx):
        return _backward_mma(ctx, B, H, Hkv, Tq, Tk, D, causal)
    tp = f"{q.ctype}, {lt}, {acc}, {nc}, {causal}, {rnd}"
    gl = f"{glse.ptr} + bh * {Tq}LL" if glse is not None else f"(const {lt}*)nullptr"
    gl_g = f"{glse.ptr} + bg * {Tq}LL" if glse is not None else f"(const {lt}*)nullptr"
    return "\n".join([
        "const long long r0_ = c.t->lo[2], r1_ = c.t->hi[2];",
        # key rows of this task: latch_ops.attention.key_block
        f"const long long k0_ = r0_ < {Tk}LL ? r0_ : {Tk}LL;",
        f"const long long k1_ = r1_ >= {Tq}LL ? {Tk}LL : (r1_ < {Tk}LL ? r1_ : {Tk}LL);",
        "for (long long b_ = c.t->lo[0]; b_ < c.t->hi[0]; ++b_) {",
        "  for (long long h_ = c.t->lo[1]; h_ < c.t->hi[1]; ++h_) {",
        f"    const long long bh = b_ * {H}LL + h_, bkv = b_ * {Hkv}LL + h_ / {G};",
        f"    latch::sdpa_dq_rows<{tp}>("
        f"{go.ptr} + bh * {Tq * Dv}LL, {gl}, {q.ptr} + bh * {Tq * D}LL, {k.ptr} + bkv * {Tk * D}LL, "
        f"{v.ptr} + bkv * {Tk * Dv}LL, {o.ptr} + bh * {Tq * Dv}LL, {lse.ptr} + bh * {Tq}LL, "
        f"{dq.ptr} + bh * {Tq * D}LL, r0_, r1_, {Tk}LL, {D}, {Dv}, {scale}, ({acc}*){ctx.smem});",
        "  }",
        f"  for (long long g_ = c.t->lo[1] / {G}; g_ < (c.t->hi[1] + {G - 1}) / {G}; ++g_) {{",
        f"    const long long bkv = b_ * {Hkv}LL + g_, bg = b_ * {H}LL + g_ * {G};",
        f"    latch::sdpa_dkdv_rows<{tp}>("
        f"{go.ptr} + bg * {Tq * Dv}LL, {gl_g}, {q.ptr} + bg * {Tq * D}LL, {k.ptr} + bkv * {Tk * D}LL, "
        f"{v.ptr} + bkv * {Tk * Dv}LL, {o.ptr} + bg * {Tq * Dv}LL, {lse.ptr} + bg * {Tq}LL, "
        f"{dk.ptr} + bkv * {Tk * D}LL, {dv.ptr} + bkv * {Tk * Dv}LL, k0_, k1_, {G}, {Tq}LL, {D}, {Dv}, {scale}, "
        f"({acc}*){ctx.smem});",
        "  }",
        "}",
    ])


def _backward_mma(ctx: BodyContext, B, H, Hkv, Tq, Tk, D, causal) -> str:
    go, glse, q, k, v, o, lse = ctx.inputs
    dq, dk, dv = ctx.outputs
    G = H // Hkv
    sc = f"{float(ctx.attr('scale'))!r}f"
    gl = f"{glse.ptr} + bh * {Tq}LL" if glse is not None else "(const float*)nullptr"
    gl_g = f"{glse.ptr} + bg * {Tq}LL" if glse is not None else "(const float*)nullptr"
    return "\n".join([
        "const long long r0_ = c.t->lo[2], r1_ = c.t->hi[2];",
        f"const long long k0_ = r0_ < {Tk}LL ? r0_ : {Tk}LL;",
        f"const long long k1_ = r1_ >= {Tq}LL ? {Tk}LL : (r1_ < {Tk}LL ? r1_ : {Tk}LL);",
        "for (long long b_ = c.t->lo[0]; b_ < c.t->hi[0]; ++b_) {",
        "  for (long long h_ = c.t->lo[1]; h_ < c.t->hi[1]; ++h_)",
        f"    for (long long r_ = r0_; r_ < r1_; r_ += {MMA_BLOCK}) {{",
        f"      const long long bh = b_ * {H}LL + h_, bkv = b_ * {Hkv}LL + h_ / {G};",
        f"      const long long re_ = r_ + {MMA_BLOCK} < r1_ ? r_ + {MMA_BLOCK} : r1_;",
        f"      latch::amma::sdpa_dq<{D}, {causal}>({go.ptr} + bh * {Tq * D}LL, {gl}, {q.ptr} + bh * {Tq * D}LL, "
        f"{k.ptr} + bkv * {Tk * D}LL, {v.ptr} + bkv * {Tk * D}LL, {o.ptr} + bh * {Tq * D}LL, "
        f"{lse.ptr} + bh * {Tq}LL, {dq.ptr} + bh * {Tq * D}LL, r_, re_, {Tq}LL, {Tk}LL, {sc}, {ctx.smem});",
        "    }",
        f"  for (long long g_ = c.t->lo[1] / {G}; g_ < (c.t->hi[1] + {G - 1}) / {G}; ++g_) {{",
        f"    const long long bkv = b_ * {Hkv}LL + g_, bg = b_ * {H}LL + g_ * {G};",
        f"    latch::amma::sdpa_dkdv<{D}, {causal}>({go.ptr} + bg * {Tq * D}LL, {gl_g}, {q.ptr} + bg * {Tq * D}LL, "
        f"{k.ptr} + bkv * {Tk * D}LL, {v.ptr} + bkv * {Tk * D}LL, {o.ptr} + bg * {Tq * D}LL, "
        f"{lse.ptr} + bg * {Tq}LL, {dk.ptr} + bkv * {Tk * D}LL, {dv.ptr} + bkv * {Tk * D}LL, k0_, k1_, {G}, "
        f"{Tq}LL, {Tk}LL, {sc}, {ctx.smem});",
        "  }",
        "}",
    ])


def bwd_variant(ctx: BodyContext) -> int:
    """latch::awg::bwd_consume's V for a backward node on the wgmma body: 2 under
    ``attention_body="wgmma2"``, else 1 (the default until the H200 shows 2 faster)."""
    return BWD_VARIANTS.get(_chosen(ctx) or "wgmma", 1)


def _wgmma_bwd_body(ctx: BodyContext) -> str:
    dq, dk, dv = ctx.outputs
    D, causal = _wgmma_dims(ctx)[5:]
    causal = f"{causal}, {bwd_variant(ctx)}"
    glse = "true" if ctx.inputs[1] is not None else "false"
    return "\n".join([
        "latch::Pipe p = c.pipe;",
        f"if (!latch::awg::bwd_consume<{D}, {causal}>(p, c.t, {dq.ptr}, {dk.ptr}, {dv.ptr}, {glse}, (int)c.args[0], "
        f"(int)c.args[1], (int)c.args[2], (int)c.args[3], __int_as_float((int)c.args[4]), {ctx.smem})) return;",
    ])


def _wgmma_bwd_producer(ctx: BodyContext) -> str:
    D, causal = _wgmma_dims(ctx)[5:]
    causal = f"{causal}, {bwd_variant(ctx)}"
    m = [ctx.tmap(j) for j in range(6)] + ([ctx.tmap(6)] if ctx.inputs[1] is not None else ["nullptr"])
    return "\n".join([
        f"const latch::awg::BwdMaps maps_{{{m[0]}, {m[1]}, {m[2]}, {m[3]}, {m[4]}, {m[5]}, {m[6]}}};",
        f"if (!latch::awg::bwd_produce<{D}, {causal}>(p, c.t, maps_, (int)c.args[0], (int)c.args[1], (int)c.args[2], "
        "(int)c.args[3])) return false;",
    ])


def _wgmma_bwd_tensor_maps(ctx: BodyContext) -> list[TensorMap]:
    B, H, Hkv, Tq, Tk, D, _ = _wgmma_dims(ctx)
    r = WGMMA_BWD_BLOCK
    # inputs: 0 grad_out, 1 grad_lse (or None), 2 q, 3 k, 4 v, 5 out, 6 lse; the group's operands are the
    # inputs that are present, in order; maps in BwdMaps' order
    present = [i for i, x in enumerate(ctx.inputs) if x is not None]
    op = present.index
    maps = [TensorMap(op(2), (D, Tq, B * H), (64, r, 1)), TensorMap(op(3), (D, Tk, B * Hkv), (64, r, 1)),
            TensorMap(op(4), (D, Tk, B * Hkv), (64, r, 1)), TensorMap(op(0), (D, Tq, B * H), (64, r, 1)),
            TensorMap(op(5), (D, Tq, B * H), (64, r, 1)),
            TensorMap(op(6), (B * H * Tq,), (WGMMA_BWD_LSE_BOX,), swizzle=0)]
    if ctx.inputs[1] is not None:
        maps.append(TensorMap(op(1), (B * H * Tq,), (WGMMA_BWD_LSE_BOX,), swizzle=0))
    return maps


def _wgmma_bwd_stage_bytes(ctx: BodyContext) -> int:
    D = ctx.inputs[2].shape[3]
    tile = WGMMA_BWD_BLOCK * D * 2
    return (2 if D == 128 else 3) * tile + 2 * WGMMA_BWD_LSE_ROOM  # BwdShape::STAGE: Q | dO (| O) | lse | glse


def _wgmma_bwd_smem(D: int) -> int:
    return 2 * WGMMA_BWD_BLOCK * D * 2 + 2 * 2 * 2 * 64 * 4  # latch::awg::BwdShape::SCRATCH


def _smem(ctx: BodyContext) -> int:
    if wgmma_backward(ctx):
        return _wgmma_bwd_smem(ctx.inputs[2].shape[3])
    if wgmma_forward(ctx):
        return WGMMA_ROWS * ctx.inputs[0].shape[3] * 2  # the Q tile (K and V stay in the ring's stages)
    if tensor_cores(ctx):
        D = ctx.inputs[2 if ctx.op.endswith("backward") else 0].shape[3]
        if ctx.op.endswith("backward"):
            return 6 * MMA_BLOCK * (D + 8) * 2 + 4 * MMA_BLOCK * 4  # latch::amma::backward_smem
        return 4 * MMA_BLOCK * (D + 8) * 2  # two buffers of (K, V) blocks
    size = 8 if ctx.inputs[2 if ctx.op.endswith("backward") else 0].dtype == "f64" else 4
    return (ctx.threads // 32) * 64 * size


def lowerings() -> list[Lowering]:
    return [
        Lowering("latch::sdpa", body=_forward, headers=(HEADER, MMA_HEADER, WGMMA_HEADER), smem=_smem,
                 producer=OnlyWhen(wgmma_forward, _wgmma_producer),
                 tensor_maps=OnlyWhen(wgmma_forward, _wgmma_tensor_maps),
                 stage_bytes=OnlyWhen(wgmma_forward, _wgmma_stage_bytes), args=_wgmma_args,
                 doc="bf16, head dim 64/128: flash forward on mma.sync (16 query rows per warp, 64-key blocks, online "
                     "softmax, lse saved), or with attention_body='wgmma' on wgmma fed by TMA through the ring; "
                     "else warp per query row"),
        Lowering("latch::sdpa_backward", body=_backward, headers=(HEADER, MMA_HEADER, WGMMA_HEADER, WGMMA_BWD_HEADER),
                 smem=_smem, producer=OnlyWhen(wgmma_backward, _wgmma_bwd_producer),
                 tensor_maps=OnlyWhen(wgmma_backward, _wgmma_bwd_tensor_maps),
                 stage_bytes=OnlyWhen(wgmma_backward, _wgmma_bwd_stage_bytes), args=_wgmma_args,
                 doc="per (batch, head group, block): dq of the query rows, dk/dv of the block's key rows summed "
                     "over the group in order, P rebuilt from lse; bf16 64/128 on mma.sync, or with "
                     "attention_body='wgmma' on wgmma fed by TMA through the ring; else warp per row"),
    ]
