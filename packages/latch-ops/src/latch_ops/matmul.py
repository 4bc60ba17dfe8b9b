"""Matrix products: ``latch::matmul``.

    matmul(a[*B, M, K], b[*B, K, N]) -> out[*B, M, N]

Both operands have the same rank (>= 2), the same batch dims ``*B`` (no broadcasting: the capture
lowering materialises expansions explicitly), and one float dtype. ``aten.mm``, ``aten.bmm`` map
here directly; ``aten.addmm`` becomes a matmul plus a broadcast ``latch::add``. Transposed operands
arrive as explicit ``latch::permute`` views (a code generator may fold them into the operand load).

Numerical policy is an attribute set later: ``operand_dtype`` (e.g. "bf16") and ``accum_dtype``
("f32"); the FP64 reference ignores both.
"""

from __future__ import annotations

import math

from latch_core.ir import FLOAT_DTYPES, TensorType
from latch_core.registry import MATMUL, OpSpec, ShapeError

from .common import nbytes, need, spec


def mkn(a_shape, b_shape, attrs) -> tuple[int, int, int]:
    """(M, K, N) of a product with the node's trans flags."""
    ta, tb = bool(attrs.get("trans_a", False)), bool(attrs.get("trans_b", False))
    m, ka = (a_shape[-1], a_shape[-2]) if ta else (a_shape[-2], a_shape[-1])
    kb, n = (b_shape[-1], b_shape[-2]) if tb else (b_shape[-2], b_shape[-1])
    return m, (ka if ka == kb else -1), n


def _infer(inputs, attrs):
    op = "latch::matmul"
    a, b = need(op, inputs, 0, "a"), need(op, inputs, 1, "b")
    if len(a.shape) < 2 or len(a.shape) != len(b.shape):
        raise ShapeError(f"{op}: operands must have the same rank >= 2, got a {a}, b {b}")
    if a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"{op}: batch dims differ: a {a}, b {b}; expand them explicitly")
    m, k, n = mkn(a.shape, b.shape, attrs)
    if k < 0:
        raise ShapeError(f"{op}: contraction dims differ: a {a}, b {b} (trans_a={attrs.get('trans_a', False)}, "
                         f"trans_b={attrs.get('trans_b', False)})")
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: operands must share one float dtype, got a {a}, b {b}")
    for key in ("operand_dtype", "accum_dtype", "out_dtype"):
        v = attrs.get(key)
        if v is not None and v not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: attribute {key!r} must be a float dtype, got {v!r}")
    split = attrs.get("split_k")
    lead = ()
    if split is not None:
        if not isinstance(split, int) or isinstance(split, bool) or split < 2:
            raise ShapeError(f"{op}: attribute 'split_k' must be an int >= 2, got {split!r}")
        lead = (split,)
    return [TensorType(lead + tuple(a.shape[:-2]) + (m, n), attrs.get("out_dtype") or a.dtype)]


def _cost(inputs, outputs, attrs):
    a, b = inputs
    batch = math.prod(a.shape[:-2])
    m, k, n = mkn(a.shape, b.shape, attrs)
    return 2 * batch * m * n * k, nbytes(list(inputs) + list(outputs))


def split_chunk(k: int, attrs) -> int:
    """The K extent of one split-K partial."""
    s = attrs.get("split_k")
    return int(attrs.get("split_chunk") or math.ceil(k / s))


def _ref(inputs, attrs):
    import torch

    a, b = inputs
    if attrs.get("trans_a", False):
        a = a.transpose(-1, -2)
    if attrs.get("trans_b", False):
        b = b.transpose(-1, -2)
    if attrs.get("split_k") is None:
        return [torch.matmul(a, b)]
    k = a.shape[-1]
    c = split_chunk(k, attrs)
    parts = [torch.matmul(a[..., s * c:min(k, (s + 1) * c)], b[..., s * c:min(k, (s + 1) * c), :])
             for s in range(attrs["split_k"])]
    return [torch.stack(parts)]


MATMUL_SPEC = spec("matmul", "matmul(a[*B,M,K], b[*B,K,N]) {operand_dtype?, accum_dtype?} -> out[*B,M,N]",
                   _infer, _ref, tags={MATMUL}, num_inputs=(2, 2), cost=_cost,
                   doc="batched matrix product over equal batch dims",
                   torch_ops=("aten.mm", "aten.bmm", "aten.addmm (with latch::add)"))

SPECS: list[OpSpec] = [MATMUL_SPEC]
