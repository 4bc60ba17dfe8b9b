"""Latch's attention op: ``latch::sdpa`` and its backward ``latch::sdpa_backward``.

Semantics (the FP64 reference is the ground truth; a GPU body must match it):

    sdpa(q[B,H,Tq,D], k[B,H,Tk,D], v[B,H,Tk,Dv]; causal, scale) -> (out[B,H,Tq,Dv], lse[B,H,Tq])
        s[b,h,i,j] = scale * sum_d q[b,h,i,d] k[b,h,j,d]     (j > i masked out when ``causal``:
                                                              top-left aligned, as torch's is_causal)
        lse[b,h,i] = log sum_j exp s[b,h,i,j]
        out[b,h,i] = sum_j exp(s[b,h,i,j] - lse[b,h,i]) v[b,h,j]

    sdpa_backward(grad_out, grad_lse?, q, k, v, out, lse; causal, scale) -> (dq, dk, dv)

Grouped-query attention: k and v may have fewer heads than q (``Hkv`` dividing ``H``); query head
h reads key/value head ``h // (H / Hkv)`` (torch's ``enable_gqa``), and dk/dv of a key/value head
are the sums over the ``H / Hkv`` query heads of its group.

``lse`` is what the backward needs (it rebuilds the probabilities from it, as flash attention
does) and it is differentiable: ``grad_lse`` is an optional operand, absent (None) when nothing
used ``lse``, which is the normal case. Both ops appear as ONE node each in a captured graph.

Dtypes: out has q's dtype; lse is f32 for bf16/f16 operands and q's dtype otherwise, so the FP64
reference runs entirely in f64. "BF16 attention" is a numerical-policy attribute (``operand_dtype``)
set later on the node, not a different op.

This module imports without torch: torch is imported inside the math functions and by
:func:`torch_ops`, which registers the torch.library custom ops on first use. Model code calls
:func:`sdpa`; capture then sees ``torch.ops.latch.sdpa`` and lowers it generically to
``latch::sdpa`` (tensor arguments -> operands, ``causal``/``scale`` -> attributes).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from latch_core.ir import FLOAT_DTYPES, TensorType
from latch_core.registry import ATTENTION, OpSpec, ShapeError

from .common import from_torch_dtype, torch_dtype

SDPA = "latch::sdpa"
SDPA_BACKWARD = "latch::sdpa_backward"
LOW_PRECISION = frozenset({"bf16", "f16"})


def stat_dtype(dtype: str) -> str:
    """dtype of the per-row statistic ``lse``: f32 for half-precision operands, else the operands'."""
    return "f32" if dtype in LOW_PRECISION else dtype


# --------------------------------------------------------------------------------------------
# Shape/dtype rules

def _attrs(op: str, attrs: dict[str, Any]) -> tuple[bool, float]:
    if "causal" not in attrs or "scale" not in attrs:
        raise ShapeError(f"{op}: attributes 'causal' (bool) and 'scale' (float) are required, got {sorted(attrs)}")
    causal, scale = attrs["causal"], attrs["scale"]
    if not isinstance(causal, bool):
        raise ShapeError(f"{op}: attribute 'causal' must be a bool, got {causal!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ShapeError(f"{op}: attribute 'scale' must be a finite number, got {scale!r}")
    return causal, float(scale)


def _qkv(op: str, q: TensorType | None, k: TensorType | None, v: TensorType | None):
    """Check q/k/v against each other; returns (B, H, Tq, Tk, D, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is None:
            raise ShapeError(f"{op}: operand {name} is required")
        if len(t.shape) != 4:
            raise ShapeError(f"{op}: {name} must be [B, H, T, D], got {t}; reshape/transpose to heads-first first")
        if t.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: {name} must be a float tensor, got {t}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ShapeError(f"{op}: q, k, v must share one dtype, got q {q}, k {k}, v {v}; cast them first")
    B, H, Tq, D = q.shape
    Hkv = k.shape[1]
    if k.shape[0] != B or v.shape[:2] != (B, Hkv) or Hkv < 1 or H % Hkv:
        raise ShapeError(f"{op}: batch and head dims must agree: q {q}, k {k}, v {v}; k and v need q's batch and "
                         "one head count that divides q's (grouped-query attention)")
    if k.shape[3] != D:
        raise ShapeError(f"{op}: q and k head dims differ: q {q}, k {k}")
    if k.shape[2] != v.shape[2]:
        raise ShapeError(f"{op}: k and v sequence lengths differ: k {k}, v {v}")
    return B, H, Tq, k.shape[2], D, v.shape[3]


def infer_sdpa(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    _attrs(SDPA, attrs)
    q, k, v = inputs
    B, H, Tq, _Tk, _D, Dv = _qkv(SDPA, q, k, v)
    return [TensorType((B, H, Tq, Dv), q.dtype), TensorType((B, H, Tq), stat_dtype(q.dtype))]


def infer_sdpa_backward(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    _attrs(SDPA_BACKWARD, attrs)
    grad_out, grad_lse, q, k, v, out, lse = inputs
    B, H, Tq, _Tk, _D, Dv = _qkv(SDPA_BACKWARD, q, k, v)
    want_out = TensorType((B, H, Tq, Dv), q.dtype)
    want_lse = TensorType((B, H, Tq), stat_dtype(q.dtype))
    for name, t, want in (("grad_out", grad_out, want_out), ("out", out, want_out), ("lse", lse, want_lse)):
        if t is None:
            raise ShapeError(f"{SDPA_BACKWARD}: operand {name} is required")
        if t != want:
            raise ShapeError(f"{SDPA_BACKWARD}: {name} must be {want} (from q {q}, v {v}), got {t}")
    if grad_lse is not None and grad_lse != want_lse:
        raise ShapeError(f"{SDPA_BACKWARD}: grad_lse must be {want_lse} or absent, got {grad_lse}")
    return [q, k, v]


# --------------------------------------------------------------------------------------------
# Costs: (flops, bytes). Causal attention visits about half of the score matrix.

def _score_elems(q: TensorType, k: TensorType, causal: bool) -> float:
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    if not causal:
        return B * H * Tq * Tk
    # rows i see keys 0..min(i, Tk-1): sum_i min(i+1, Tk)
    full = min(Tq, Tk)
    seen = full * (full + 1) // 2 + max(0, Tq - Tk) * Tk
    return B * H * seen


def _nbytes(types) -> int:
    return sum(t.nbytes for t in types if t is not None)


def cost_sdpa(inputs, outputs, attrs) -> tuple[int, int]:
    q, k, v = inputs
    n = _score_elems(q, k, bool(attrs.get("causal")))
    flops = 2 * n * (q.shape[3] + v.shape[3]) + 5 * n  # QK^T, PV, plus exp/max/sum per score
    return int(flops), _nbytes(list(inputs) + list(outputs))


def cost_sdpa_backward(inputs, outputs, attrs) -> tuple[int, int]:
    _go, _gl, q, k, v, _o, _l = inputs
    n = _score_elems(q, k, bool(attrs.get("causal")))
    D, Dv = q.shape[3], v.shape[3]
    # recompute S (D), dV = P^T dO (Dv), dP = dO V^T (Dv), dQ = dS K (D), dK = dS^T Q (D)
    flops = 2 * n * (3 * D + 2 * Dv) + 6 * n
    return int(flops), _nbytes(list(inputs) + list(outputs))


# --------------------------------------------------------------------------------------------
# Tilings (OpSpec.extra["tiling"], CONTRACTS.md section 3): the record is latch_core.tiling's, so
# latch-ops needs no scheduler. (batch, head) pairs are independent in both ops.

QUERY_TILE = 128  # query rows per forward task
BLOCK = 64  # query rows (dq) and key rows (dk, dv) per backward task


def group(q: TensorType, k: TensorType) -> int:
    """Query heads per key/value head (1 without grouped-query attention)."""
    return q.shape[1] // k.shape[1]


def _tiling(split_dims, footprint, granule, kind, weight=None):
    from latch_core.tiling import Tiling

    return Tiling(split_dims, footprint, granule=granule, kind=kind, weight=weight)


def kv_heads(h0: int, h1: int, g: int) -> tuple[int, int]:
    """Key/value heads read (and, in the backward, written) by query heads [h0, h1)."""
    return h0 // g, -(-h1 // g)


def key_block(r0: int, r1: int, tq: int, tk: int) -> tuple[int, int]:
    """Key rows whose dk/dv the backward task of query rows [r0, r1) computes: the same block
    index, keys past the last query block going to the last task (Tk > Tq), none past the last
    key (Tq > Tk). Every key row belongs to exactly one task of the tiling."""
    k0 = min(r0, tk)
    k1 = tk if r1 >= tq else min(r1, tk)
    return k0, k1


# Relative cost of one step (one BLOCK x BLOCK block of scores) of each half of a backward task, as
# every backward body does it (SIMT, mma.sync, wgmma): the dq half's step recomputes S, dP and adds
# dS K (3 products) streaming a key block's K and V (2 blocks); the dk/dv half's step recomputes
# S^T, dP^T and adds P^T dO and dS^T Q (4 products) streaming a query block's Q, dO and O (3 blocks;
# O for dO . O). Products and streamed blocks counted alike: 5 and 7. Run 32 (TinyMoE-200M on the
# H200, 2 x 12 heads x 1024, head dim 64, results/sa.md) measured 39.3 us for block 0 of 16 (1 dq
# step, 16 dk/dv steps) and 26.6 us for block 15 (16 and 1): a dk/dv step ~0.85 us dearer.
DQ_STEP, DKDV_STEP = 5, 7


def backward_steps(r0: int, r1: int, tq: int, tk: int, causal: bool) -> tuple[int, int]:
    """(dq steps per query head, dk/dv steps per query head of the group) of the backward task of
    query rows [r0, r1): key blocks its query blocks visit (causal: up to each block's last row),
    query blocks its key rows' blocks (:func:`key_block`) visit (causal: from the block's first key)."""
    dq = sum(-(-(min(min(r + BLOCK, r1), tk) if causal else tk) // BLOCK) for r in range(r0, r1, BLOCK))
    k0, k1 = key_block(r0, r1, tq, tk)
    kv = sum(-(-max(tq - (kb if causal else 0), 0) // BLOCK) for kb in range(k0, k1, BLOCK))
    return dq, kv


def tiling_sdpa(in_types, out_types, attrs):
    """Forward tiles: (batch, head, block of query rows); a tile reads its q rows and every key and
    value of its heads' key/value heads. Under ``causal`` a body reads keys 0..r1-1 only, but the
    reference computes P @ V over all keys (0 * v at masked ones), so the footprint stays whole
    along keys: a footprint must cover what the reference, too, reads."""
    q, k, v = in_types
    Tk, g = k.shape[2], group(q, k)

    def footprint(box):
        b, (h0, h1), (r0, r1), _ = box
        kh = kv_heads(h0, h1, g)
        keys = (0, Tk)
        ins = [(b, (h0, h1), (r0, r1), (0, q.shape[3])), (b, kh, keys, (0, k.shape[3])), (b, kh, keys, (0, v.shape[3]))]
        return ins, [box, (b, (h0, h1), (r0, r1))]

    causal = bool(attrs.get("causal"))

    def weight(box):
        # keys a tile's rows visit: 0..r1-1 under causal (its last row's), all of them otherwise
        b, (h0, h1), (r0, r1) = box[0], box[1], box[2]
        keys = min(r1, Tk) if causal else Tk
        return float((b[1] - b[0]) * (h1 - h0) * (r1 - r0) * max(keys, 1))

    return _tiling((0, 1, 2), footprint, (1, 1, QUERY_TILE), "sdpa", weight)


def tiling_sdpa_backward(in_types, out_types, attrs):
    """Backward tiles: (batch, group of query heads, block of ``BLOCK`` rows), over dq's dims. A
    task computes dq for its query rows and dk, dv for the key rows of the same block index
    (:func:`key_block`) of its key/value heads, summed over the group's query heads in order, so
    no two tasks write one element and nothing is accumulated across tasks (no atomics). Under
    ``causal`` the two halves cost (n + 1) and (N - n) blocks of scores for block n of N, but a
    block of the dk/dv half costs more than one of the dq half (:func:`backward_steps`), so the
    tiling's weight says what each task does and the scheduler balances by it. A task reads its
    heads' operands whole along the sequence (dq rows need every key, dk/dv rows every query)."""
    _go, _gl, q, k, v, _o, _l = in_types
    Tq, Tk, g = q.shape[2], k.shape[2], group(q, k)
    causal = bool(attrs.get("causal"))

    def weight(box):
        b, (h0, h1), (r0, r1) = box[0], box[1], box[2]
        kh = kv_heads(h0, h1, g)
        dq, kv = backward_steps(r0, r1, Tq, Tk, causal)
        # (+ 1: a task of no step, e.g. rows past the keys' end under causal, still costs its start)
        return float((b[1] - b[0]) * ((h1 - h0) * DQ_STEP * dq + (kh[1] - kh[0]) * g * DKDV_STEP * kv) + 1)

    def footprint(box):
        b, (h0, h1), (r0, r1) = box[0], box[1], box[2]
        kh = kv_heads(h0, h1, g)
        # The dk/dv half of a task sums over its kv heads' whole groups: read all of them.
        qh = (kh[0] * g, kh[1] * g)
        ins = [None if t is None else (b, kh if i in (3, 4) else qh) + tuple((0, d) for d in t.shape[2:])
               for i, t in enumerate(in_types)]
        kb = key_block(r0, r1, Tq, Tk)
        outs = [box, (b, kh, kb, (0, k.shape[3])), (b, kh, kb, (0, v.shape[3]))]
        return ins, outs

    return _tiling((0, 1, 2), footprint, (1, g, BLOCK), "sdpa_backward", weight)


# --------------------------------------------------------------------------------------------
# The math: plain torch, any float dtype (half precision computes in f32). This is both the
# custom op's real implementation and the FP64 reference.

def _compute_dtype(t):
    import torch

    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def _scores(q, k, causal: bool, scale: float):
    """scale * q k^T in the compute dtype, masked entries at -inf."""
    import torch

    cd = _compute_dtype(q)
    s = torch.matmul(q.to(cd), k.to(cd).transpose(-2, -1)) * scale
    if causal:
        Tq, Tk = s.shape[-2], s.shape[-1]
        masked = torch.ones(Tq, Tk, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(masked, float("-inf"))
    return s


def _repeat_heads(x, heads: int):
    """k or v [B, Hkv, T, D] as [B, heads, T, D]: kv head j serves query heads j*G .. j*G+G-1."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _group_sum(dx, kv_heads: int):
    """[B, H, T, D] gradients of repeated heads summed back to [B, kv_heads, T, D]."""
    B, H, T, D = dx.shape
    return dx if H == kv_heads else dx.reshape(B, kv_heads, H // kv_heads, T, D).sum(dim=2)


def sdpa_forward_math(q, k, v, causal: bool, scale: float):
    """(out, lse) of scaled dot-product attention; see the module docstring."""
    import torch

    cd = _compute_dtype(q)
    k, v = _repeat_heads(k, q.shape[1]), _repeat_heads(v, q.shape[1])
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = torch.matmul(p, v.to(cd))
    return out.to(q.dtype).contiguous(), lse.contiguous()


def sdpa_backward_math(grad_out, grad_lse, q, k, v, out, lse, causal: bool, scale: float):
    """(dq, dk, dv) for :func:`sdpa_forward_math`, rebuilding P from lse.

    With dP = dO V^T and delta_i = sum_j P_ij dP_ij = sum_d dO_id O_id, the score gradient is
    dS = P * (dP - delta + grad_lse); dq = scale dS K, dk = scale dS^T Q, dv = P^T dO.
    """
    import torch

    cd = _compute_dtype(q)
    hkv = k.shape[1]
    k, v = _repeat_heads(k, q.shape[1]), _repeat_heads(v, q.shape[1])
    s = _scores(q, k, causal, scale)
    p = torch.exp(s - lse.to(cd).unsqueeze(-1))
    go = grad_out.to(cd)
    dv = torch.matmul(p.transpose(-2, -1), go)
    dp = torch.matmul(go, v.to(cd).transpose(-2, -1))
    delta = (go * out.to(cd)).sum(dim=-1, keepdim=True)
    ds = dp - delta
    if grad_lse is not None:
        ds = ds + grad_lse.to(cd).unsqueeze(-1)
    ds = p * ds
    dq = torch.matmul(ds, k.to(cd)) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.to(cd)) * scale
    dk, dv = _group_sum(dk, hkv), _group_sum(dv, hkv)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


def _ref_sdpa(inputs, attrs):
    q, k, v = inputs
    return list(sdpa_forward_math(q, k, v, bool(attrs["causal"]), float(attrs["scale"])))


def _ref_sdpa_backward(inputs, attrs):
    return list(sdpa_backward_math(*inputs, bool(attrs["causal"]), float(attrs["scale"])))


SPECS = [
    OpSpec(
        name=SDPA,
        signature="sdpa(q[B,H,Tq,D], k[B,Hkv,Tk,D], v[B,Hkv,Tk,Dv]) {causal: bool, scale: float} "
                  "-> (out[B,H,Tq,Dv], lse[B,H,Tq])",
        infer=infer_sdpa,
        tags={ATTENTION},
        num_inputs=(3, 3),
        cost=cost_sdpa,
        doc="scaled dot-product attention returning the per-row log-sum-exp for the backward; "
            "causal masking is top-left aligned (key j visible to query i iff j <= i)",
        extra={"reference": _ref_sdpa, "torch_ops": ["latch::sdpa"], "tiling": tiling_sdpa},
    ),
    OpSpec(
        name=SDPA_BACKWARD,
        signature="sdpa_backward(grad_out[B,H,Tq,Dv], grad_lse[B,H,Tq]?, q, k, v, out, lse) "
                  "{causal: bool, scale: float} -> (dq, dk, dv)",
        infer=infer_sdpa_backward,
        tags={ATTENTION},
        num_inputs=(7, 7),
        cost=cost_sdpa_backward,
        doc="gradient of latch::sdpa; grad_lse is absent (None) when lse was not used",
        extra={"reference": _ref_sdpa_backward, "torch_ops": ["latch::sdpa_backward"],
               "tiling": tiling_sdpa_backward},
    ),
]


# --------------------------------------------------------------------------------------------
# torch.library registration (lazy: importing this module never imports torch)

_OPS: Any = None


def torch_ops():
    """Register ``torch.ops.latch.sdpa`` / ``sdpa_backward`` (once) and return ``torch.ops.latch``."""
    global _OPS
    if _OPS is not None:
        return _OPS
    import torch
    from torch.library import custom_op

    # Explicit schemas: this module uses postponed annotations, which infer_schema cannot read here.
    @custom_op(SDPA, mutates_args=(), schema="(Tensor q, Tensor k, Tensor v, bool causal, float scale) -> (Tensor, Tensor)")
    def _sdpa(q, k, v, causal, scale):
        return sdpa_forward_math(q, k, v, causal, scale)

    @_sdpa.register_fake
    def _sdpa_fake(q, k, v, causal, scale):
        return _fake_outputs(infer_sdpa, [q, k, v], {"causal": causal, "scale": scale}, q)

    @custom_op(SDPA_BACKWARD, mutates_args=(),
               schema="(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                      "bool causal, float scale) -> (Tensor, Tensor, Tensor)")
    def _sdpa_backward(grad_out, grad_lse, q, k, v, out, lse, causal, scale):
        return sdpa_backward_math(grad_out, grad_lse, q, k, v, out, lse, causal, scale)

    @_sdpa_backward.register_fake
    def _sdpa_backward_fake(grad_out, grad_lse, q, k, v, out, lse, causal, scale):
        return _fake_outputs(infer_sdpa_backward, [grad_out, grad_lse, q, k, v, out, lse],
                             {"causal": causal, "scale": scale}, q)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        # Unused outputs give None (not a materialised zeros tensor): grad_lse stays absent.
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None and grad_lse is None:
            return None, None, None, None, None
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv = _sdpa_backward(grad_out, grad_lse, q, k, v, out, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None

    _sdpa.register_autograd(backward, setup_context=setup_context)
    _OPS = torch.ops.latch
    return _OPS


def latch_type(t) -> TensorType:
    """The Latch TensorType of a torch tensor (fake or real)."""
    try:
        return TensorType(tuple(int(d) for d in t.shape), from_torch_dtype(t.dtype))
    except ValueError as e:
        raise ShapeError(f"attention operand: {e}") from None


def _fake_outputs(infer, tensors, attrs, like):
    """Outputs of a fake (meta) implementation built from the op's Latch shape rule, so tracing
    and the rule cannot disagree, and a bad call fails at the user's line with the rule's message.
    Every output is contiguous, as the real math returns."""
    types = infer([None if t is None else latch_type(t) for t in tensors], attrs)
    return tuple(like.new_empty(t.shape, dtype=torch_dtype(t.dtype)) for t in types)


def sdpa(q, k, v, *, causal: bool = True, scale: float | None = None):
    """Attention output for model code: ``latch::sdpa(q, k, v)[0]``, q/k/v as [B, H, T, D].

    ``scale`` defaults to 1/sqrt(D) and is recorded in the graph as a concrete number.
    """
    ops = torch_ops()
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out, _lse = ops.sdpa(q, k, v, bool(causal), float(scale))
    return out
