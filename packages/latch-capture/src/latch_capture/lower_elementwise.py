"""ATen -> Latch: elementwise ops, creation ops, casts and aliases.

Each entry is ``fn(lw, a) -> value | tuple``: ``a`` holds the op's arguments by schema name, tensor
arguments as :class:`~latch_capture.lower.Ref` value names, everything else as traced. Type
promotion follows torch: the result dtype torch computed (``lw.out_type()``) decides the dtype the
operands are cast to, so every Latch elementwise op sees operands of one dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from latch_ops.common import from_torch_dtype, torch_dtype

from .lower import Lowerer, Ref

ARITH = {"add", "sub", "mul", "div", "pow", "remainder", "maximum", "minimum"}


def is_t(x: Any) -> bool:
    return isinstance(x, Ref)


def _meta(lw: Lowerer, x: Any):
    if is_t(x):
        t = lw.type(x)
        return torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="meta")
    return x


def result_dtype(lw: Lowerer, x: Any, y: Any) -> str:
    """torch's promoted dtype of two operands (tensors by value name, or Python scalars)."""
    return from_torch_dtype(torch.result_type(_meta(lw, x), _meta(lw, y)))


def scalar_for(value: Any, dtype: str) -> Any:
    """A Python scalar in the form a Latch attribute holds for an operand of ``dtype``."""
    if dtype == "bool":
        return bool(value)
    if dtype in ("f64", "f32", "bf16", "f16"):
        return float(value)
    if isinstance(value, bool):
        return int(value)
    return value


def apply_binary(lw: Lowerer, op: str, x: Any, y: Any, dtype: str, attrs: dict | None = None) -> str:
    """``op(x, y)`` computed in ``dtype``: tensors cast to it, a scalar side becomes an attribute."""
    attrs = dict(attrs or {})
    if is_t(x):
        x = lw.cast(x, dtype)
    if is_t(y):
        y = lw.cast(y, dtype)
    if is_t(x) and is_t(y):
        return lw.emit1(f"latch::{op}", [x, y], attrs)
    if is_t(x) and op in ("mul", "div") and not attrs and y == 1 and not isinstance(y, bool):
        return x  # x * 1 and x / 1 are x exactly
    if is_t(y) and op == "mul" and x == 1 and not isinstance(x, bool):
        return y
    if is_t(x):
        return lw.emit1(f"latch::{op}", [x], {**attrs, "scalar": scalar_for(y, dtype)})
    if is_t(y):
        return lw.emit1(f"latch::{op}", [y], {**attrs, "scalar": scalar_for(x, dtype), "scalar_first": True})
    raise lw.fail("an elementwise op on two Python numbers", "compute it in Python instead")


def binary(op: str, *, swap: bool = False, has_alpha: bool = False):
    def low(lw: Lowerer, a: dict) -> str:
        vals = list(a.values())
        x, y = vals[0], vals[1]
        if swap:  # rsub(self, other, alpha) = other - alpha * self
            x, y = y, x
        out = lw.out_type()
        dtype = out.dtype if op in ARITH else result_dtype(lw, x, y)
        alpha = a.get("alpha", 1) if has_alpha else 1
        if alpha is not None and alpha != 1:
            y = apply_binary(lw, "mul", y, alpha, dtype) if is_t(y) else y * alpha
        attrs = {}
        if op == "div" and a.get("rounding_mode") is not None:
            attrs["rounding_mode"] = a["rounding_mode"]
        return apply_binary(lw, op, x, y, dtype, attrs)

    return low


def floor_divide(lw: Lowerer, a: dict) -> str:
    """``a // b``: div with rounding_mode="floor" (torch's floor_divide rounds toward -inf)."""
    return apply_binary(lw, "div", a["self"], a["other"], lw.out_type().dtype, {"rounding_mode": "floor"})


def logical(op: str):
    """logical_and/or/xor, and the bitwise forms on bool tensors."""

    def low(lw: Lowerer, a: dict) -> str:
        x, y = list(a.values())[:2]
        if op.startswith("bitwise"):
            if lw.out_type().dtype != "bool":
                raise lw.fail("bitwise ops on integers are not supported", "use them on bool masks only")
        name = "logical_" + op.split("_")[-1]
        return apply_binary(lw, name, x, y, result_dtype(lw, x, y))

    return low


def unary(op: str, *, attr_names: tuple[str, ...] = ()):
    def low(lw: Lowerer, a: dict) -> str:
        x = a["self"]
        out = lw.out_type()
        x = lw.cast(x, out.dtype)
        attrs = {k: a[k] for k in attr_names if a.get(k) is not None}
        return lw.emit1(f"latch::{op}", [x], attrs)

    return low


def logical_not(lw: Lowerer, a: dict) -> str:
    if lw.type(a["self"]).dtype != "bool" and lw.fx_node.target is torch.ops.aten.bitwise_not.default:
        raise lw.fail("bitwise_not on integers is not supported", "use ~ on bool masks only")
    return lw.emit1("latch::logical_not", [a["self"]])


def isnan(lw: Lowerer, a: dict) -> str:
    """x != x: true exactly for NaN."""
    x = a["self"]
    if lw.type(x).dtype not in ("f64", "f32", "bf16", "f16"):
        return lw.full(lw.type(x).shape, False, "bool")
    return lw.emit1("latch::ne", [x, x])


def activation_backward(op: str, operand: str, attr_names: tuple[str, ...] = ()):
    def low(lw: Lowerer, a: dict) -> str:
        dtype = lw.out_type().dtype
        g, x = lw.cast(a["grad_output"], dtype), lw.cast(a[operand], dtype)
        return lw.emit1(f"latch::{op}", [g, x], {k: a[k] for k in attr_names})

    return low


def clamp(lw: Lowerer, a: dict) -> str:
    out = lw.out_type()
    x = lw.cast(a["self"], out.dtype)
    lo, hi = a.get("min"), a.get("max")
    if is_t(lo) or is_t(hi):  # tensor bounds: maximum / minimum
        if lo is not None:
            x = apply_binary(lw, "maximum", x, lo, out.dtype)
        if hi is not None:
            x = apply_binary(lw, "minimum", x, hi, out.dtype)
        return x
    attrs = {}
    if lo is not None:
        attrs["min"] = scalar_for(lo, out.dtype)
    if hi is not None:
        attrs["max"] = scalar_for(hi, out.dtype)
    return lw.emit1("latch::clamp", [x], attrs)


def where(lw: Lowerer, a: dict) -> str:
    cond, x, y = a["condition"], a["self"], a["other"]
    out = lw.out_type()
    cond = lw.cast(cond, "bool")
    ins: list = [cond, None, None]
    attrs = {}
    for slot, v, key in ((1, x, "scalar_a"), (2, y, "scalar_b")):
        if is_t(v):
            ins[slot] = lw.cast(v, out.dtype)
        else:
            attrs[key] = scalar_for(v, out.dtype)
    if ins[1] is None and ins[2] is None:
        ins[2] = lw.full((), attrs.pop("scalar_b"), out.dtype)
    res = lw.emit1("latch::where", ins, attrs)
    return lw.expand(res, out.shape)


def masked_fill(lw: Lowerer, a: dict) -> str:
    out = lw.out_type()
    x, mask, value = lw.cast(a["self"], out.dtype), lw.cast(a["mask"], "bool"), a["value"]
    if is_t(value):
        res = lw.emit1("latch::where", [mask, lw.cast(value, out.dtype), x])
    else:
        res = lw.emit1("latch::where", [mask, None, x], {"scalar_a": scalar_for(value, out.dtype)})
    return lw.expand(res, out.shape)


def lerp(lw: Lowerer, a: dict) -> str:
    """self + weight * (end - self), in torch's operand order."""
    dtype = lw.out_type().dtype
    x, end, w = lw.cast(a["self"], dtype), lw.cast(a["end"], dtype), a["weight"]
    diff = apply_binary(lw, "sub", end, x, dtype)
    return apply_binary(lw, "add", x, apply_binary(lw, "mul", diff, w, dtype), dtype)


def addc(op: str):
    """addcmul / addcdiv: self + value * (t1 op t2)."""

    def low(lw: Lowerer, a: dict) -> str:
        dtype = lw.out_type().dtype
        prod = apply_binary(lw, op, a["tensor1"], a["tensor2"], dtype)
        if a.get("value", 1) != 1:
            prod = apply_binary(lw, "mul", prod, a["value"], dtype)
        return apply_binary(lw, "add", a["self"], prod, dtype)

    return low


def tri(op: str):
    def low(lw: Lowerer, a: dict) -> str:
        return lw.emit1(f"latch::{op}", [a["self"]], {"diagonal": int(a.get("diagonal") or 0)})

    return low


# ------------------------------------------------------------------------------------------
# Aliases, casts, copies

def alias(lw: Lowerer, a: dict) -> str:
    """detach, clone, alias, lift_fresh: the same value (the IR has no identity or layout)."""
    return next(v for v in a.values() if is_t(v))


def to_copy(lw: Lowerer, a: dict) -> str:
    return lw.cast(a["self"], lw.out_type().dtype)


def copy(lw: Lowerer, a: dict) -> str:
    """Functional ``copy(self, src)``: src broadcast to self's shape in self's dtype."""
    out = lw.out_type()
    return lw.expand(lw.cast(a["src"], out.dtype), out.shape)


def fill(lw: Lowerer, a: dict) -> str:
    out = lw.out_type()
    v = a["value"]
    if is_t(v):
        return lw.expand(lw.cast(v, out.dtype), out.shape)
    return lw.full(out.shape, scalar_for(v, out.dtype), out.dtype)


def softplus(lw: Lowerer, a: dict) -> str:
    """softplus(x, beta, threshold) as torch's kernel computes it: x where beta * x > threshold,
    else log1p(exp(beta * x)) / beta (apertus' xIELU activation)."""
    dtype = lw.out_type().dtype
    x = lw.cast(a["self"], dtype)
    bx = apply_binary(lw, "mul", x, a["beta"], dtype)
    soft = apply_binary(lw, "div", lw.emit1("latch::log1p", [lw.emit1("latch::exp", [bx])]), a["beta"], dtype)
    big = apply_binary(lw, "gt", bx, a["threshold"], dtype)
    return lw.emit1("latch::where", [big, x, soft])


def softplus_backward(lw: Lowerer, a: dict) -> str:
    """d softplus: grad where beta * x > threshold, else grad * sigmoid(beta * x)."""
    dtype = lw.out_type().dtype
    g, x = lw.cast(a["grad_output"], dtype), lw.cast(a["self"], dtype)
    bx = apply_binary(lw, "mul", x, a["beta"], dtype)
    soft = lw.emit1("latch::mul", [g, lw.emit1("latch::sigmoid", [bx])])
    big = apply_binary(lw, "gt", bx, a["threshold"], dtype)
    return lw.emit1("latch::where", [big, g, soft])


def creation(value_arg: str | None, default: Any):
    """zeros/ones/full/empty and their _like/new_ forms: a latch::full of torch's result type.
    ``empty`` is filled with 0 (any content is a valid value of uninitialised memory)."""

    def low(lw: Lowerer, a: dict) -> str:
        out = lw.out_type()
        v = a.get(value_arg, default) if value_arg else default
        if is_t(v):
            raise lw.fail("a fill value that is a tensor", "use a Python number, or torch.where")
        return lw.full(out.shape, scalar_for(v, out.dtype), out.dtype)

    return low


def arange(lw: Lowerer, a: dict) -> str:
    out = lw.out_type()
    start = a.get("start") if "start" in a and a.get("start") is not None else 0
    step = a.get("step") if a.get("step") is not None else 1
    if out.dtype in ("f64", "f32", "bf16", "f16"):
        start, step = float(start), float(step)
    return lw.emit1("latch::arange", [], {"start": start, "step": step, "size": out.shape[0], "dtype": out.dtype})


def TABLE() -> dict:
    t = {}
    for n in ("add", "sub", "mul", "div", "pow", "remainder", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"):
        t[f"aten.{n}"] = binary(n, has_alpha=n in ("add", "sub"))
    t["aten.rsub"] = binary("sub", swap=True, has_alpha=True)
    t["aten.true_divide"] = binary("div")
    t["aten.floor_divide"] = floor_divide
    for n in ("logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor"):
        t[f"aten.{n}"] = logical(n)
    for n in ("neg", "abs", "sign", "relu", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal",
              "sin", "cos", "tanh", "erf", "sigmoid", "silu"):
        t[f"aten.{n}"] = unary(n)
    t["aten.sgn"] = unary("sign")
    t["aten.isnan"] = isnan
    t["aten.gelu"] = unary("gelu", attr_names=("approximate",))
    t["aten.logical_not"] = logical_not
    t["aten.bitwise_not"] = logical_not
    t["aten.gelu_backward"] = activation_backward("gelu_backward", "self", ("approximate",))
    t["aten.silu_backward"] = activation_backward("silu_backward", "self")
    t["aten.sigmoid_backward"] = activation_backward("sigmoid_backward", "output")
    t["aten.tanh_backward"] = activation_backward("tanh_backward", "output")
    t["aten.softplus"] = softplus
    t["aten.softplus_backward"] = softplus_backward
    t["aten.threshold_backward"] = activation_backward("threshold_backward", "self", ("threshold",))
    for n in ("clamp", "clamp_min", "clamp_max"):
        t[f"aten.{n}"] = clamp
    t["aten.where.self"] = where
    t["aten.where.ScalarSelf"] = where
    t["aten.where.ScalarOther"] = where
    t["aten.where.Scalar"] = where
    t["aten.masked_fill"] = masked_fill
    t["aten.lerp"] = lerp
    t["aten.addcmul"] = addc("mul")
    t["aten.addcdiv"] = addc("div")
    t["aten.tril"] = tri("tril")
    t["aten.triu"] = tri("triu")
    for n in ("detach", "clone", "alias", "lift_fresh", "lift_fresh_copy", "contiguous"):
        t[f"aten.{n}"] = alias
    t["aten._to_copy"] = to_copy
    t["aten.copy"] = copy
    t["aten.fill"] = fill
    t["aten.zeros"] = creation(None, 0)
    t["aten.ones"] = creation(None, 1)
    t["aten.empty"] = creation(None, 0)
    t["aten.empty_strided"] = creation(None, 0)
    t["aten.zeros_like"] = creation(None, 0)
    t["aten.ones_like"] = creation(None, 1)
    t["aten.empty_like"] = creation(None, 0)
    t["aten.new_zeros"] = creation(None, 0)
    t["aten.new_ones"] = creation(None, 1)
    t["aten.new_empty"] = creation(None, 0)
    t["aten.new_empty_strided"] = creation(None, 0)
    t["aten.full"] = creation("fill_value", None)
    t["aten.full_like"] = creation("fill_value", None)
    t["aten.new_full"] = creation("fill_value", None)
    t["aten.scalar_tensor"] = creation("s", None)
    t["aten.arange"] = arange
    return t
