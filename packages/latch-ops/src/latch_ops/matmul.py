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


def _infer(inputs, attrs):
    op = "latch::matmul"
    a, b = need(op, inputs, 0, "a"), need(op, inputs, 1, "b")
    if len(a.shape) < 2 or len(a.shape) != len(b.shape):
        raise ShapeError(f"{op}: operands must have the same rank >= 2, got a {a}, b {b}")
    if a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"{op}: batch dims differ: a {a}, b {b}; expand them explicitly")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"{op}: contraction dims differ: a {a} has K={a.shape[-1]}, b {b} has K={b.shape[-2]}")
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: operands must share one float dtype, got a {a}, b {b}")
    for k in ("operand_dtype", "accum_dtype"):
        v = attrs.get(k)
        if v is not None and v not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: attribute {k!r} must be a float dtype, got {v!r}")
    return [TensorType(tuple(a.shape[:-1]) + (b.shape[-1],), a.dtype)]


def _cost(inputs, outputs, attrs):
    a, b = inputs
    batch = math.prod(a.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return 2 * batch * m * n * k, nbytes(list(inputs) + list(outputs))


def _ref(inputs, attrs):
    import torch

    return [torch.matmul(inputs[0], inputs[1])]


MATMUL_SPEC = spec("matmul", "matmul(a[*B,M,K], b[*B,K,N]) {operand_dtype?, accum_dtype?} -> out[*B,M,N]",
                   _infer, _ref, tags={MATMUL}, num_inputs=(2, 2), cost=_cost,
                   doc="batched matrix product over equal batch dims",
                   torch_ops=("aten.mm", "aten.bmm", "aten.addmm (with latch::add)"))

SPECS: list[OpSpec] = [MATMUL_SPEC]
