"""Elementwise ops: unary math, binary arithmetic with broadcasting and scalar forms, comparisons,
logical ops, where, clamp, cast, tril/triu, full/arange, and the activation backward ops.

Dtype discipline (the capture lowering inserts ``latch::cast`` to satisfy it, following torch's type
promotion): the tensor operands of one op share one dtype; arithmetic keeps it, comparisons and
logical ops give ``bool``. A binary op with ONE operand takes the other side from attribute
``scalar`` (a number); ``scalar_first=True`` puts the scalar on the left (``scalar - x``,
``scalar / x``, ``scalar ** x``). A float scalar with an integer operand is rejected: torch would
compute in float, so the operand must be cast first.

Every op here is tagged ``elementwise``: output element i depends only on the broadcast operand
elements at i (tril/triu, full and arange also read their own index).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from latch_core.ir import FLOAT_DTYPES, TensorType
from latch_core.registry import COPY, ELEMENTWISE, OpSpec, ShapeError

from .common import (
    BOOL, attr, broadcast, dtype_attr, int_tuple, kind, need, per_element, ref_dtype, same_dtype, spec,
)

_NUM = (int, float)


def _scalar(op: str, attrs: dict[str, Any], key: str = "scalar") -> int | float | bool:
    v = attrs.get(key)
    if v is None or not isinstance(v, (int, float, bool)):
        raise ShapeError(f"{op}: attribute {key!r} must be a number, got {v!r}")
    return v


def _check_scalar_kind(op: str, t: TensorType, s: Any) -> None:
    if isinstance(s, float) and kind(t.dtype) != "float":
        raise ShapeError(f"{op}: float scalar {s!r} with a {t.dtype} operand; cast the operand to a float dtype first")


# ------------------------------------------------------------------------------------------
# Unary

# name -> (torch expression, accepted operand kinds, flops per element, doc)
_UNARY: dict[str, tuple[Callable, frozenset[str], int, str]] = {}


def _unary(name, fn, kinds, flops, doc):
    _UNARY[name] = (fn, frozenset(kinds), flops, doc)


def _t():
    import torch

    return torch


_FLOAT = ("float",)
_NUMERIC = ("float", "int")
_unary("neg", lambda x, a: _t().neg(x), _NUMERIC, 1, "-x")
_unary("abs", lambda x, a: _t().abs(x), _NUMERIC, 1, "|x|")
_unary("sign", lambda x, a: _t().sign(x), _NUMERIC, 1, "sign(x) in {-1, 0, 1}")
_unary("relu", lambda x, a: _t().relu(x), _NUMERIC, 1, "max(x, 0)")
_unary("exp", lambda x, a: _t().exp(x), _FLOAT, 4, "e^x")
_unary("log", lambda x, a: _t().log(x), _FLOAT, 4, "natural log")
_unary("log1p", lambda x, a: _t().log1p(x), _FLOAT, 4, "log(1 + x)")
_unary("expm1", lambda x, a: _t().expm1(x), _FLOAT, 4, "e^x - 1")
_unary("sqrt", lambda x, a: _t().sqrt(x), _FLOAT, 2, "square root")
_unary("rsqrt", lambda x, a: _t().rsqrt(x), _FLOAT, 2, "1 / sqrt(x)")
_unary("reciprocal", lambda x, a: _t().reciprocal(x), _FLOAT, 1, "1 / x")
_unary("sin", lambda x, a: _t().sin(x), _FLOAT, 4, "sine")
_unary("cos", lambda x, a: _t().cos(x), _FLOAT, 4, "cosine")
_unary("tanh", lambda x, a: _t().tanh(x), _FLOAT, 4, "hyperbolic tangent")
_unary("erf", lambda x, a: _t().erf(x), _FLOAT, 6, "error function")
_unary("sigmoid", lambda x, a: _t().sigmoid(x), _FLOAT, 4, "1 / (1 + e^-x)")
_unary("silu", lambda x, a: _t().nn.functional.silu(x), _FLOAT, 5, "x * sigmoid(x)")
_unary("gelu", lambda x, a: _t().nn.functional.gelu(x, approximate=a.get("approximate", "none")), _FLOAT, 8,
       "GELU; attribute approximate: 'none' (erf form) or 'tanh'")


def _gelu_attr(op, attrs):
    a = attrs.get("approximate", "none")
    if a not in ("none", "tanh"):
        raise ShapeError(f"{op}: attribute 'approximate' must be 'none' or 'tanh', got {a!r}")


def _make_unary(name: str) -> OpSpec:
    fn, kinds, flops, doc = _UNARY[name]
    op = f"latch::{name}"

    def infer(inputs, attrs):
        x = need(op, inputs, 0, "x")
        if kind(x.dtype) not in kinds:
            raise ShapeError(f"{op}: takes {' or '.join(sorted(kinds))} operands, got {x}; cast it first")
        if name == "gelu":
            _gelu_attr(op, attrs)
        return [x]

    def ref(inputs, attrs):
        return [fn(inputs[0], attrs)]

    return spec(name, f"{name}(x) -> out", infer, ref, tags={ELEMENTWISE}, num_inputs=(1, 1),
                cost=per_element(flops), doc=doc, torch_ops=(f"aten.{name}",))


def _logical_not_infer(inputs, attrs):
    need("latch::logical_not", inputs, 0, "x")
    return [TensorType(inputs[0].shape, BOOL)]


LOGICAL_NOT = spec("logical_not", "logical_not(x) -> bool out", _logical_not_infer,
                   lambda i, a: [_t().logical_not(i[0])], tags={ELEMENTWISE}, num_inputs=(1, 1),
                   cost=per_element(1), doc="not x (x != 0 for numbers)",
                   torch_ops=("aten.logical_not", "aten.bitwise_not (bool)"))


# ------------------------------------------------------------------------------------------
# Binary arithmetic, comparisons, logical ops

def _binary_types(op: str, inputs, attrs) -> tuple[tuple[int, ...], str]:
    """(shape, operand dtype) of a binary op in its two-operand or scalar form."""
    if len(inputs) == 2:
        a, b = need(op, inputs, 0, "a"), need(op, inputs, 1, "b")
        if "scalar" in attrs:
            raise ShapeError(f"{op}: attribute 'scalar' is only for the one-operand form")
        return broadcast(op, a, b), same_dtype(op, a, b)
    x = need(op, inputs, 0, "x")
    s = _scalar(op, attrs)
    _check_scalar_kind(op, x, s)
    sf = attrs.get("scalar_first", False)
    if not isinstance(sf, bool):
        raise ShapeError(f"{op}: attribute 'scalar_first' must be a bool, got {sf!r}")
    return tuple(x.shape), x.dtype


def _operands(inputs, attrs):
    """(left, right) for the reference: tensors, or the scalar as a 0-dim tensor of the operand's dtype
    (so float64 operands meet the full double scalar and integer operands stay integer)."""
    torch = _t()
    if len(inputs) == 2:
        return inputs[0], inputs[1]
    x = inputs[0]
    s = torch.tensor(attrs["scalar"], dtype=x.dtype)
    return (s, x) if attrs.get("scalar_first", False) else (x, s)


_ARITH: dict[str, tuple[Callable, int, str, frozenset[str]]] = {
    "add": (lambda a, b, at: a + b, 1, "a + b", frozenset(_NUMERIC)),
    "sub": (lambda a, b, at: a - b, 1, "a - b", frozenset(_NUMERIC)),
    "mul": (lambda a, b, at: a * b, 1, "a * b", frozenset(_NUMERIC)),
    "div": (lambda a, b, at: _t().div(a, b, rounding_mode=at.get("rounding_mode")), 1,
            "a / b; attribute rounding_mode: absent (true division, floats only), 'trunc' or 'floor'",
            frozenset(_NUMERIC)),
    "pow": (lambda a, b, at: _t().pow(a, b), 8, "a ** b", frozenset(_NUMERIC)),
    "remainder": (lambda a, b, at: _t().remainder(a, b), 2, "a - floor(a / b) * b (the sign of b, Python's %)",
                  frozenset(_NUMERIC)),
    "maximum": (lambda a, b, at: _t().maximum(a, b), 1, "max(a, b), NaN-propagating", frozenset(_NUMERIC)),
    "minimum": (lambda a, b, at: _t().minimum(a, b), 1, "min(a, b), NaN-propagating", frozenset(_NUMERIC)),
}
_COMPARE = {
    "eq": (lambda a, b: a == b, "a == b"), "ne": (lambda a, b: a != b, "a != b"),
    "lt": (lambda a, b: a < b, "a < b"), "le": (lambda a, b: a <= b, "a <= b"),
    "gt": (lambda a, b: a > b, "a > b"), "ge": (lambda a, b: a >= b, "a >= b"),
}
_LOGICAL = {
    "logical_and": (lambda a, b: _t().logical_and(a, b), "a and b"),
    "logical_or": (lambda a, b: _t().logical_or(a, b), "a or b"),
    "logical_xor": (lambda a, b: _t().logical_xor(a, b), "a xor b"),
}
_BIN_SIG = "{n}(a, b) -> out | {n}(x) {{scalar, scalar_first=false}} -> out"


def _make_arith(name: str) -> OpSpec:
    fn, flops, doc, kinds = _ARITH[name]
    op = f"latch::{name}"

    def infer(inputs, attrs):
        shape, dtype = _binary_types(op, inputs, attrs)
        if kind(dtype) not in kinds:
            raise ShapeError(f"{op}: takes {' or '.join(sorted(kinds))} operands, got {dtype}; cast first")
        if name == "div":
            rm = attrs.get("rounding_mode")
            if rm not in (None, "trunc", "floor"):
                raise ShapeError(f"{op}: rounding_mode must be absent, 'trunc' or 'floor', got {rm!r}")
            if rm is None and dtype not in FLOAT_DTYPES:
                raise ShapeError(f"{op}: true division of {dtype} operands; cast them to a float dtype first")
        return [TensorType(shape, dtype)]

    def ref(inputs, attrs):
        a, b = _operands(inputs, attrs)
        return [fn(a, b, attrs)]

    return spec(name, _BIN_SIG.format(n=name), infer, ref, tags={ELEMENTWISE}, num_inputs=(1, 2),
                cost=per_element(flops), doc=doc, torch_ops=(f"aten.{name}",))


def _make_predicate(name: str, fn: Callable, doc: str, logical: bool) -> OpSpec:
    op = f"latch::{name}"

    def infer(inputs, attrs):
        shape, _dtype = _binary_types(op, inputs, attrs)
        return [TensorType(shape, BOOL)]

    def ref(inputs, attrs):
        a, b = _operands(inputs, attrs)
        return [fn(a, b)]

    return spec(name, _BIN_SIG.format(n=name) + " (bool)", infer, ref, tags={ELEMENTWISE}, num_inputs=(1, 2),
                cost=per_element(1), doc=doc + (" (operands: any one dtype)" if logical else ""),
                torch_ops=(f"aten.{name}",))


# ------------------------------------------------------------------------------------------
# where, clamp, cast, tril/triu

def _where_infer(inputs, attrs):
    op = "latch::where"
    if len(inputs) != 3:
        raise ShapeError(f"{op}: takes (cond, a, b) with a/b possibly absent, got {len(inputs)} operands")
    cond = need(op, inputs, 0, "cond")
    if cond.dtype != BOOL:
        raise ShapeError(f"{op}: cond must be bool, got {cond}")
    present = [t for t in inputs[1:] if t is not None]
    for slot, key in ((1, "scalar_a"), (2, "scalar_b")):
        if inputs[slot] is None:
            s = _scalar(op, attrs, key)
            for t in present:
                _check_scalar_kind(op, t, s)
        elif key in attrs:
            raise ShapeError(f"{op}: attribute {key!r} given but operand {slot} is present")
    if present:
        dtype = same_dtype(op, *present)
    else:
        dtype = dtype_attr(op, attrs)
    return [TensorType(broadcast(op, cond, *present), dtype)]


def _where_ref(inputs, attrs):
    torch = _t()
    cond, a, b = inputs
    like = a if a is not None else b
    dt = like.dtype if like is not None else ref_dtype(attrs["dtype"])
    if a is None:
        a = torch.tensor(attrs["scalar_a"], dtype=dt)
    if b is None:
        b = torch.tensor(attrs["scalar_b"], dtype=dt)
    return [torch.where(cond, a, b)]


WHERE = spec("where", "where(cond, a | None, b | None) {scalar_a?, scalar_b?, dtype?} -> out", _where_infer,
             _where_ref, tags={ELEMENTWISE}, num_inputs=(3, 3), cost=per_element(1),
             doc="cond ? a : b; an absent a/b is the scalar attribute scalar_a/scalar_b; dtype only when both are absent",
             torch_ops=("aten.where.self", "aten.masked_fill"))


def _clamp_infer(inputs, attrs):
    op = "latch::clamp"
    x = need(op, inputs, 0, "x")
    lo, hi = attrs.get("min"), attrs.get("max")
    if lo is None and hi is None:
        raise ShapeError(f"{op}: at least one of the attributes 'min' and 'max' is required")
    for k, v in (("min", lo), ("max", hi)):
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, _NUM):
                raise ShapeError(f"{op}: attribute {k!r} must be a number, got {v!r}")
            _check_scalar_kind(op, x, v)
    if kind(x.dtype) == "bool":
        raise ShapeError(f"{op}: takes float or int operands, got {x}")
    return [x]


CLAMP = spec("clamp", "clamp(x) {min?, max?} -> out", _clamp_infer,
             lambda i, a: [_t().clamp(i[0], min=a.get("min"), max=a.get("max"))], tags={ELEMENTWISE},
             num_inputs=(1, 1), cost=per_element(2), doc="min(max(x, min), max) with absent bounds ignored",
             torch_ops=("aten.clamp", "aten.clamp_min", "aten.clamp_max"))


def _cast_infer(inputs, attrs):
    x = need("latch::cast", inputs, 0, "x")
    return [TensorType(x.shape, dtype_attr("latch::cast", attrs))]


def _cast_ref(inputs, attrs):
    x = inputs[0]
    target = attrs["dtype"]
    if target in FLOAT_DTYPES and x.is_floating_point():
        return [x]  # the reference never rounds to a narrower float (module docstring of common.py)
    return [x.to(ref_dtype(target))]


CAST = spec("cast", "cast(x) {dtype} -> out", _cast_infer, _cast_ref, tags={ELEMENTWISE, COPY}, num_inputs=(1, 1),
            cost=per_element(0), doc="convert to dtype (float->int truncates toward zero, like torch)",
            torch_ops=("aten._to_copy", "aten.to"))


def _make_tri(name: str) -> OpSpec:
    op = f"latch::{name}"

    def infer(inputs, attrs):
        x = need(op, inputs, 0, "x")
        if len(x.shape) < 2:
            raise ShapeError(f"{op}: operand must have rank >= 2, got {x}")
        attr(op, attrs, "diagonal", int, 0)
        return [x]

    def ref(inputs, attrs):
        return [getattr(_t(), name)(inputs[0], attrs.get("diagonal", 0))]

    keep = "j <= i + diagonal" if name == "tril" else "j >= i + diagonal"
    return spec(name, f"{name}(x) {{diagonal=0}} -> out", infer, ref, tags={ELEMENTWISE}, num_inputs=(1, 1),
                cost=per_element(1), doc=f"keep x[..., i, j] where {keep}, else 0", torch_ops=(f"aten.{name}",))


# ------------------------------------------------------------------------------------------
# Creation: full, arange

def _full_infer(inputs, attrs):
    op = "latch::full"
    shape = int_tuple(op, attrs, "shape")
    dtype = dtype_attr(op, attrs)
    v = attrs.get("value")
    if not isinstance(v, (int, float, bool)):
        raise ShapeError(f"{op}: attribute 'value' must be a number, got {v!r}")
    if isinstance(v, float) and kind(dtype) != "float" and not (math.isfinite(v) and v == int(v)):
        raise ShapeError(f"{op}: value {v!r} is not representable in {dtype}")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op}: negative dimension in shape {shape}")
    return [TensorType(shape, dtype)]


FULL = spec("full", "full() {shape, value, dtype} -> out", _full_infer,
            lambda i, a: [_t().full(tuple(a["shape"]), a["value"], dtype=ref_dtype(a["dtype"]))],
            tags={ELEMENTWISE}, num_inputs=(0, 0), cost=per_element(0), doc="a tensor filled with value",
            torch_ops=("aten.full", "aten.zeros", "aten.ones", "aten.*_like", "aten.scalar_tensor", "aten.new_*"))


def _arange_infer(inputs, attrs):
    op = "latch::arange"
    size = attr(op, attrs, "size", int)
    for k in ("start", "step"):
        v = attrs.get(k)
        if isinstance(v, bool) or not isinstance(v, _NUM):
            raise ShapeError(f"{op}: attribute {k!r} must be a number, got {v!r}")
    dtype = dtype_attr(op, attrs)
    if size < 0:
        raise ShapeError(f"{op}: size must be >= 0, got {size}")
    if kind(dtype) == "int" and not all(isinstance(attrs[k], int) for k in ("start", "step")):
        raise ShapeError(f"{op}: integer dtype {dtype} needs integer start and step, got {attrs['start']!r}, {attrs['step']!r}")
    if kind(dtype) == "bool":
        raise ShapeError(f"{op}: dtype must be a number type, got bool")
    return [TensorType((size,), dtype)]


def _arange_ref(inputs, attrs):
    torch = _t()
    dt = ref_dtype(attrs["dtype"])
    n = attrs["size"]
    if dt.is_floating_point:
        # start + i * step, evaluated at the reference width (torch's arange computes it the same way)
        return [attrs["start"] + torch.arange(n, dtype=dt) * attrs["step"]]
    return [torch.arange(attrs["start"], attrs["start"] + n * attrs["step"], attrs["step"], dtype=dt)[:n]]


ARANGE = spec("arange", "arange() {start, step, size, dtype} -> out[size]", _arange_infer, _arange_ref,
              tags={ELEMENTWISE}, num_inputs=(0, 0), cost=per_element(1),
              doc="out[i] = start + i * step for i < size", torch_ops=("aten.arange",))


# ------------------------------------------------------------------------------------------
# Activation backward ops (what torch's autograd emits for gelu, silu, sigmoid, tanh, relu)

def _make_backward(name: str, operand: str, fn: Callable, doc: str, flops: int, extra_attr=None) -> OpSpec:
    op = f"latch::{name}"

    def infer(inputs, attrs):
        g, x = need(op, inputs, 0, "grad"), need(op, inputs, 1, operand)
        dtype = same_dtype(op, g, x)
        if dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: takes float operands, got {g}, {x}")
        if extra_attr is not None:
            extra_attr(op, attrs)
        return [TensorType(broadcast(op, g, x), dtype)]

    def ref(inputs, attrs):
        return [fn(inputs[0], inputs[1], attrs)]

    return spec(name, f"{name}(grad, {operand}) -> grad_in", infer, ref, tags={ELEMENTWISE}, num_inputs=(2, 2),
                cost=per_element(flops), doc=doc, torch_ops=(f"aten.{name}",))


def _threshold_attr(op, attrs):
    v = attrs.get("threshold")
    if isinstance(v, bool) or not isinstance(v, _NUM):
        raise ShapeError(f"{op}: attribute 'threshold' must be a number, got {v!r}")


def _aten(name):
    return getattr(_t().ops.aten, name).default


BACKWARDS = [
    _make_backward("gelu_backward", "x", lambda g, x, a: _aten("gelu_backward")(g, x, approximate=a.get("approximate", "none")),
                   "grad * gelu'(x); attribute approximate as for latch::gelu", 12, _gelu_attr),
    _make_backward("silu_backward", "x", lambda g, x, a: _aten("silu_backward")(g, x),
                   "grad * s(x) (1 + x (1 - s(x))), s = sigmoid", 8),
    _make_backward("sigmoid_backward", "y", lambda g, y, a: _aten("sigmoid_backward")(g, y),
                   "grad * y (1 - y), y = sigmoid(x) (the forward's output)", 3),
    _make_backward("tanh_backward", "y", lambda g, y, a: _aten("tanh_backward")(g, y),
                   "grad * (1 - y^2), y = tanh(x) (the forward's output)", 3),
    _make_backward("threshold_backward", "x",
                   lambda g, x, a: _t().where(x <= a["threshold"], _t().zeros((), dtype=g.dtype), g),
                   "grad where x > threshold else 0 (relu's backward with threshold 0)", 1, _threshold_attr),
]


SPECS: list[OpSpec] = (
    [_make_unary(n) for n in _UNARY]
    + [LOGICAL_NOT]
    + [_make_arith(n) for n in _ARITH]
    + [_make_predicate(n, fn, doc, False) for n, (fn, doc) in _COMPARE.items()]
    + [_make_predicate(n, fn, doc, True) for n, (fn, doc) in _LOGICAL.items()]
    + [WHERE, CLAMP, CAST, _make_tri("tril"), _make_tri("triu"), FULL, ARANGE]
    + BACKWARDS
)
