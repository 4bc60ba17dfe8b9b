"""Matrix products: ``latch::matmul``.

    matmul(a, b) {trans_a?, trans_b?, out_dtype?, split_k?, operand_dtype?, accum_dtype?, config?,
                  epilogue_slots?} -> out

Operands as stored (``*B`` the batch dims, the same for both):

- ``a``: ``[*B, M, K]``, or ``[*B, K, M]`` with ``trans_a`` (the product uses a^T);
- ``b``: ``[*B, K, N]``, or ``[*B, N, K]`` with ``trans_b`` (the product uses b^T);
- ``out``: ``[*B, M, N]``; with ``split_k = S`` (>= 2) it gets a LEADING split dim, ``[S, *B, M, N]``,
  where partial ``s`` sums only ``k`` in ``[s*c, min(K, (s+1)*c))``, ``c = ceil(K / S)`` (summing the
  partials over dim 0 gives the product; the schedule's split-K rewrite does exactly that).

Both operands have the same rank (>= 2), the same batch dims (no broadcasting: the capture lowering
materialises expansions explicitly) and one float dtype. The output's dtype is ``out_dtype``
(default: the operands'). ``aten.mm``/``aten.bmm`` map here directly; ``aten.addmm`` becomes a
matmul plus a broadcast ``latch::add``. Captured transposes arrive as ``latch::permute`` views; the
schedule's layout pass (``schedule.matmul_layouts``) folds those into ``trans_a``/``trans_b``.

Attributes set by later stages: the numerical policy's ``operand_dtype`` (e.g. "bf16") and
``accum_dtype`` ("f32"), and the scheduler's ``config`` (the chosen body configuration's name,
``latch_core.configs``). The FP64 reference ignores all three and computes at whatever float width
it is given (the output at :func:`latch_ops.common.ref_dtype` of ``out_dtype``).
``epilogue_slots`` (1..8, default 2; the tensor-core body only) is how many 1 KiB boxes of output
each consumer warp stages in shared memory before it must wait for the copy engine to read one
(latch_gemm.cuh ``GemmStoreTma``): more slots, more shared memory, fewer stages in the ring.
"""

from __future__ import annotations

import math

from latch_core.ir import FLOAT_DTYPES, TensorType
from latch_core.registry import MATMUL, OpSpec, ShapeError

from .common import nbytes, need, ref_dtype, spec

OP = "latch::matmul"


def _flag(attrs, key: str) -> bool:
    v = attrs.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ShapeError(f"{OP}: attribute {key!r} must be true or false, got {v!r}")
    return v


def split_k(attrs) -> int:
    """The ``split_k`` attribute (1 when absent)."""
    v = attrs.get("split_k")
    if v is None:
        return 1
    if not isinstance(v, int) or isinstance(v, bool) or v < 2:
        raise ShapeError(f"{OP}: attribute 'split_k' must be an int >= 2 (absent: no split), got {v!r}")
    return v


def dims(a: TensorType, b: TensorType, attrs) -> tuple[tuple[int, ...], int, int, int]:
    """(batch dims, M, K, N) of a matmul's operands as stored, honouring ``trans_a``/``trans_b``."""
    ta, tb = _flag(attrs, "trans_a"), _flag(attrs, "trans_b")
    m, ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    if ka != kb:
        la = "a[*B, K, M] (trans_a)" if ta else "a[*B, M, K]"
        lb = "b[*B, N, K] (trans_b)" if tb else "b[*B, K, N]"
        raise ShapeError(f"{OP}: contraction dims differ: {la} is {a} with K={ka}, {lb} is {b} with K={kb}")
    return tuple(a.shape[:-2]), m, ka, n


def k_range(s: int, k: int, splits: int) -> tuple[int, int]:
    """The contraction range ``[lo, hi)`` partial ``s`` of ``splits`` sums (may be empty)."""
    c = math.ceil(k / splits)
    return min(k, s * c), min(k, (s + 1) * c)


def _infer(inputs, attrs):
    a, b = need(OP, inputs, 0, "a"), need(OP, inputs, 1, "b")
    if len(a.shape) < 2 or len(a.shape) != len(b.shape):
        raise ShapeError(f"{OP}: operands must have the same rank >= 2, got a {a}, b {b}")
    if a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"{OP}: batch dims differ: a {a}, b {b}; expand them explicitly")
    batch, m, k, n = dims(a, b, attrs)
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{OP}: operands must share one float dtype, got a {a}, b {b}; insert latch::cast")
    for key in ("operand_dtype", "accum_dtype", "out_dtype"):
        v = attrs.get(key)
        if v is not None and v not in FLOAT_DTYPES:
            raise ShapeError(f"{OP}: attribute {key!r} must be a float dtype {sorted(FLOAT_DTYPES)}, got {v!r}")
    slots = attrs.get("epilogue_slots")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 8):
        raise ShapeError(f"{OP}: attribute 'epilogue_slots' must be an int in 1..8, got {slots!r}")
    cfg = attrs.get("config")
    if cfg is not None and not isinstance(cfg, str):
        raise ShapeError(f"{OP}: attribute 'config' must be a body configuration's name, got {cfg!r}")
    s = split_k(attrs)
    if s > 1 and s > k:
        raise ShapeError(f"{OP}: split_k={s} exceeds the contraction length K={k} of a {a}, b {b}")
    out = (s,) if s > 1 else ()
    return [TensorType(out + batch + (m, n), attrs.get("out_dtype") or a.dtype)]


def _cost(inputs, outputs, attrs):
    a, b = inputs
    batch, m, k, n = dims(a, b, attrs)
    return 2 * math.prod(batch) * m * n * k, nbytes(list(inputs) + list(outputs))


def _ref(inputs, attrs):
    import torch

    a, b = inputs
    if _flag(attrs, "trans_a"):
        a = a.transpose(-1, -2)
    if _flag(attrs, "trans_b"):
        b = b.transpose(-1, -2)
    dt = ref_dtype(attrs.get("out_dtype") or "f32") if a.is_floating_point() else a.dtype
    s = split_k(attrs)
    if s == 1:
        return [torch.matmul(a, b).to(dt)]
    k = a.shape[-1]
    parts = []
    for i in range(s):
        lo, hi = k_range(i, k, s)
        parts.append(torch.matmul(a[..., lo:hi], b[..., lo:hi, :]))
    return [torch.stack(parts).to(dt)]


MATMUL_SPEC = spec(
    "matmul",
    "matmul(a[*B,M,K] | a[*B,K,M] (trans_a), b[*B,K,N] | b[*B,N,K] (trans_b)) {trans_a?, trans_b?, out_dtype?, "
    "split_k?, operand_dtype?, accum_dtype?, config?, epilogue_slots?} -> out[*B,M,N] | out[S,*B,M,N] (split_k=S)",
    _infer, _ref, tags={MATMUL}, num_inputs=(2, 2), cost=_cost,
    doc="batched matrix product over equal batch dims; operands optionally stored transposed, split-K partials",
    torch_ops=("aten.mm", "aten.bmm", "aten.addmm (with latch::add)"))

SPECS: list[OpSpec] = [MATMUL_SPEC]
