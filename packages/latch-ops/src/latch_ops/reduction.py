"""Reductions over dims: sum, mean, amax, amin, prod, argmax, argmin.

Attributes (CONTRACTS.md section 1, tag ``reduction``): ``dims`` (sorted, distinct, non-negative;
a full reduction names every dim; ``()`` only for a rank-0 operand, where the op is the identity)
and ``keepdim`` (bool). Sums and products of int/bool operands are i64 (as in torch); mean takes
floats; arg-reductions reduce exactly one dim and give i64 indices (first occurrence on ties).
"""

from __future__ import annotations

from latch_core.ir import FLOAT_DTYPES, TensorType
from latch_core.registry import REDUCTION, OpSpec, ShapeError

from .common import attr, int_tuple, kind, nbytes, need, spec


def reduced_shape(op: str, x: TensorType, attrs: dict) -> tuple[int, ...]:
    dims = int_tuple(op, attrs, "dims")
    keepdim = attr(op, attrs, "keepdim", bool)
    nd = len(x.shape)
    if list(dims) != sorted(set(dims)) or any(not 0 <= d < nd for d in dims):
        raise ShapeError(f"{op}: dims {list(dims)} must be sorted, distinct and in [0, {nd}) for operand {x}")
    if not dims and nd:
        raise ShapeError(f"{op}: dims is empty for operand {x}; a full reduction names every dim")
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in dims)


def _cost(inputs, outputs, attrs):
    return inputs[0].numel, nbytes(list(inputs) + list(outputs))


def _t():
    import torch

    return torch


def _make(name: str, out_kind: str, doc: str) -> OpSpec:
    op = f"latch::{name}"

    def infer(inputs, attrs):
        x = need(op, inputs, 0, "x")
        shape = reduced_shape(op, x, attrs)
        k = kind(x.dtype)
        if out_kind == "float":
            if x.dtype not in FLOAT_DTYPES:
                raise ShapeError(f"{op}: takes a float operand, got {x}; cast it first")
            dtype = x.dtype
        elif out_kind == "widen":
            dtype = x.dtype if k == "float" else "i64"
        elif out_kind == "index":
            if len(attrs["dims"]) != 1:
                raise ShapeError(f"{op}: reduces exactly one dim, got dims {list(attrs['dims'])}")
            if k == "bool":
                raise ShapeError(f"{op}: takes a number operand, got {x}")
            dtype = "i64"
        else:  # same
            if k == "bool":
                raise ShapeError(f"{op}: takes a number operand, got {x}")
            dtype = x.dtype
        return [TensorType(shape, dtype)]

    def ref(inputs, attrs):
        torch = _t()
        x = inputs[0]
        dims, keepdim = list(attrs["dims"]), attrs["keepdim"]
        if not dims:
            return [x.clone()]
        if name == "sum":
            return [torch.sum(x, dim=dims, keepdim=keepdim)]
        if name == "mean":
            return [torch.mean(x, dim=dims, keepdim=keepdim)]
        if name == "amax":
            return [torch.amax(x, dim=dims, keepdim=keepdim)]
        if name == "amin":
            return [torch.amin(x, dim=dims, keepdim=keepdim)]
        if name == "prod":
            out = x
            for d in reversed(dims):
                out = torch.prod(out, dim=d, keepdim=keepdim)
            return [out]
        fn = torch.argmax if name == "argmax" else torch.argmin
        return [fn(x, dim=dims[0], keepdim=keepdim)]

    return spec(name, f"{name}(x) {{dims, keepdim}} -> out", infer, ref, tags={REDUCTION}, num_inputs=(1, 1),
                cost=_cost, doc=doc, torch_ops=(f"aten.{name}",))


SPECS: list[OpSpec] = [
    _make("sum", "widen", "sum over dims (int/bool operands sum to i64)"),
    _make("mean", "float", "arithmetic mean over dims"),
    _make("amax", "same", "maximum over dims (NaN-propagating)"),
    _make("amin", "same", "minimum over dims (NaN-propagating)"),
    _make("prod", "widen", "product over dims (int/bool operands multiply to i64)"),
    _make("argmax", "index", "index of the maximum along the one dim in dims (first on ties)"),
    _make("argmin", "index", "index of the minimum along the one dim in dims (first on ties)"),
]
