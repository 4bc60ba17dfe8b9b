"""Lowerings of the LM head's cross-entropy pair (latch_ops/cross_entropy.py, bodies in
latch_xent.cuh): ``cross_entropy`` a warp per row of its tile, ``cross_entropy_backward`` every
consumer thread over chunks of 8 elements of its (rows x columns) tile (results/ce.md: why run 26's
body ran at 4.2x its model).

The backward has two bodies, chosen per node here (:func:`ring_taken`, results/xb.md):
- the ring body (16-bit logits, V a multiple of 8): a producer half streams the tile's rows through
  the kernel's ring of shared-memory stages by TMA, the whole ring ahead of the consumers, who read
  their chunks from the stages (``cross_entropy_grad_produce`` / ``cross_entropy_grad_ring``). A
  tile whose columns do not start at a multiple of the map's row piece W, or are not whole chunks of
  8, takes the register body at run time (both halves test the same tile);
- the register body (everything else: FP32 or FP64 logits, V not a multiple of 8): each consumer
  thread loads its chunks itself, 8 x 16 bytes in flight, or the scalar path
  (``cross_entropy_grad_tile``)."""

from __future__ import annotations

from .lowering import BodyContext, Lowering, OnlyWhen, TensorMap

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


# Off only in tests that compare the two bodies' bits (test_xent_gpu.py); a build reads it when it
# renders the backward (serial rendering: test documents are far below codegen.PARALLEL_MIN_BODIES).
RING = True
RING_LOGITS = ("bf16", "f16")  # TMA copies bytes: the consumers unpack 16-bit words as the register body does
RING_DLOGITS = ("bf16", "f16", "f32")
# What the body asks of the ring: a 16 KiB stage (one box of 8192 BF16, or two or four smaller ones).
# It uses as many whole boxes as the kernel's stage holds (up to 48 KiB: a matmul's 48 KiB stages in
# TinyMoE-200M's kernel give 3 boxes a stage), and never asks for more than the products do.
STAGE_BYTES = 16384
RING_MIN_V = 8192  # a row at least one box long (a shorter row would take a whole stage for itself)


def ring_taken(ctx: BodyContext) -> bool:
    """Whether the backward node takes the ring body: 16-bit logits, 16-bit or FP32 dlogits in memory,
    V a multiple of 8 (the map's row pieces are whole 16-byte words) and at least RING_MIN_V (a box
    never longer than a row: the register body packs several short rows into one pass instead), rows
    countable in 32 bits (TMA coordinates). Everything else takes the register body, as before."""
    if not RING:
        return False
    x, dx = ctx.inputs[1], ctx.outputs[0]
    if x is None or x.rank != 2 or not dx.present:
        return False
    N, V = x.shape
    return (x.dtype in RING_LOGITS and dx.dtype in RING_DLOGITS and V % 8 == 0 and V >= RING_MIN_V
            and 0 < N < 2**31)


def ring_geometry(V: int) -> tuple[int, int]:
    """(W, BOXK): a row is viewed as (W, V / W), W the largest power of two dividing V up to 256; a box
    is BOXK rows of that view, 8192 elements (16 KiB of BF16; 4096 where W = 16 and 2048 where W = 8:
    BOXK at most 256), never more than a row (V >= RING_MIN_V)."""
    W = min(256, V & -V)
    return W, min(256, 8192 // W)


def _ring_template(ctx: BodyContext) -> str:
    W, boxk = ring_geometry(ctx.inputs[1].shape[1])
    return f"{W}, {boxk}, LATCH_STAGE_BYTES"


def _tile() -> str:
    return "c.t->lo[0], c.t->hi[0], c.t->lo[1], c.t->hi[1]"


def _backward_body(ctx: BodyContext) -> str:
    if not ring_taken(ctx):
        return _cross_entropy_backward(ctx)
    g, x, t, lse, total = ctx.inputs
    dx = ctx.outputs[0]
    V = x.shape[1]
    mean = "true" if ctx.attr("reduction") == "mean" else "false"
    return "\n".join([
        "latch::Pipe p = c.pipe;",
        f"if (!latch::cross_entropy_grad_ring<{x.ctype}, {t.ctype}, {lse.ctype}, {dx.ctype}, {_ring_template(ctx)}>("
        f"p, {g.ptr}, {x.ptr}, {t.ptr}, {lse.ptr}, {total.ptr}, {dx.ptr}, {V}LL, {_tile()}, "
        f"{int(ctx.attr('ignore_index'))}LL, {mean})) return;",
    ])


def _backward_producer(ctx: BodyContext) -> str:
    _, x, t, _, _ = ctx.inputs
    dx = ctx.outputs[0]
    return (f"if (!latch::cross_entropy_grad_produce<{x.ctype}, {t.ctype}, {_ring_template(ctx)}>(p, {ctx.tmap(0)}, "
            f"{t.ptr}, {dx.ptr}, {x.shape[1]}LL, {_tile()}, {int(ctx.attr('ignore_index'))}LL)) return false;")


def _backward_maps(ctx: BodyContext) -> list[TensorMap]:
    N, V = ctx.inputs[1].shape
    W, boxk = ring_geometry(V)
    return [TensorMap(1, (W, V // W, N), (W, boxk, 1), swizzle=0)]


def _backward_stage_bytes(ctx: BodyContext) -> int:
    return STAGE_BYTES


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::cross_entropy", body=_cross_entropy, headers=h,
                 doc="warp per row: online max/sum-exp over the stored logits, lse and the target's nll"),
        Lowering("latch::cross_entropy_backward", body=_backward_body, headers=h,
                 producer=OnlyWhen(ring_taken, _backward_producer), tensor_maps=OnlyWhen(ring_taken, _backward_maps),
                 stage_bytes=OnlyWhen(ring_taken, _backward_stage_bytes),
                 doc="softmax - onehot, scaled, in chunks of 8: 16-bit logits streamed through the ring by TMA, "
                     "else 16-byte loads from the consumer threads"),
    ]
