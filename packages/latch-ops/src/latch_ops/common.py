"""Shared helpers of the core vocabulary: dtype classes, broadcasting, dim checks, costs, spec builder.

Torch-free at import: ``torch_dtype``/``from_torch_dtype`` and the reference helpers import torch
inside the function, so ``import latch_ops`` works on a machine without torch.

Reference convention (CONTRACTS.md section 1): a reference computes at whatever float width it is
given; integer and bool tensors stay integer and bool. An op that creates floats from nothing
(``full``, ``arange``, a cast from int/bool to a float dtype) produces :func:`reference_float`
(float64 unless a caller selects another width with :func:`reference_float_dtype`), and a cast
between two float dtypes keeps the operand's width: the reference never rounds to f32/bf16.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable, Iterable, Sequence

from latch_core.ir import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType
from latch_core.registry import OpSpec, ShapeError

BOOL = "bool"

_TORCH_NAMES = {
    "f64": "float64", "f32": "float32", "bf16": "bfloat16", "f16": "float16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "bool": "bool",
}


def kind(dtype: str) -> str:
    """'float', 'int' or 'bool'."""
    if dtype in FLOAT_DTYPES:
        return "float"
    if dtype in INT_DTYPES:
        return "int"
    if dtype == BOOL:
        return "bool"
    raise ShapeError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES)}")


def torch_dtype(dtype: str):
    """The torch dtype of a Latch dtype name."""
    import torch

    try:
        return getattr(torch, _TORCH_NAMES[dtype])
    except KeyError:
        raise ShapeError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES)}") from None


def from_torch_dtype(dt) -> str:
    """The Latch dtype name of a torch dtype; ValueError naming it when Latch has no such dtype."""
    name = str(dt).removeprefix("torch.")
    for k, v in _TORCH_NAMES.items():
        if v == name:
            return k
    raise ValueError(f"torch dtype {dt} has no Latch equivalent; Latch dtypes: {sorted(_TORCH_NAMES)}")


# ------------------------------------------------------------------------------------------
# The float width references produce when they create floats from nothing.

_REF_FLOAT: contextvars.ContextVar[str] = contextvars.ContextVar("latch_reference_float", default="f64")


def reference_float():
    """The torch float dtype references use for floats they create (float64 by default)."""
    return torch_dtype(_REF_FLOAT.get())


@contextlib.contextmanager
def reference_float_dtype(dtype: str):
    """Run references with another creation width, e.g. ``with reference_float_dtype("f32"):``."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"reference float dtype must be one of {sorted(FLOAT_DTYPES)}, got {dtype!r}")
    token = _REF_FLOAT.set(dtype)
    try:
        yield
    finally:
        _REF_FLOAT.reset(token)


def ref_dtype(dtype: str):
    """The torch dtype a reference uses for a value declared ``dtype``: floats at the reference width."""
    return reference_float() if dtype in FLOAT_DTYPES else torch_dtype(dtype)


# ------------------------------------------------------------------------------------------
# Shape helpers (each raises ShapeError naming the op and the operands)

def need(op: str, inputs: Sequence[TensorType | None], i: int, what: str) -> TensorType:
    if i >= len(inputs) or inputs[i] is None:
        raise ShapeError(f"{op}: operand {i} ({what}) is required")
    return inputs[i]


def attr(op: str, attrs: dict[str, Any], key: str, types: type | tuple, default: Any = ...) -> Any:
    """Fetch a required (no default) or optional attribute and check its Python type."""
    if key not in attrs or attrs[key] is None:
        if default is ...:
            raise ShapeError(f"{op}: attribute {key!r} is required (got attributes {sorted(attrs)})")
        return default
    v = attrs[key]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ShapeError(f"{op}: attribute {key!r} must be {_tname(types)}, got {v!r}")
    if not isinstance(v, types):
        raise ShapeError(f"{op}: attribute {key!r} must be {_tname(types)}, got {v!r}")
    return v


def _tname(types) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in ts)


def int_tuple(op: str, attrs: dict[str, Any], key: str, default: Any = ...) -> tuple[int, ...]:
    v = attr(op, attrs, key, (tuple, list), default)
    if v is default and default is not ...:
        return v
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ShapeError(f"{op}: attribute {key!r} must be a list of ints, got {v!r}")
    return tuple(v)


def dtype_attr(op: str, attrs: dict[str, Any], key: str = "dtype") -> str:
    d = attr(op, attrs, key, str)
    if d not in DTYPES:
        raise ShapeError(f"{op}: attribute {key!r} is {d!r}, not a Latch dtype; known: {sorted(DTYPES)}")
    return d


def check_dim(op: str, dim: int, ndim: int, what: str = "dim") -> int:
    """A dim must already be normalised: 0 <= dim < ndim (lowering resolves negative dims)."""
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < ndim:
        raise ShapeError(f"{op}: {what} {dim!r} is not in [0, {ndim}) for a rank-{ndim} operand")
    return dim


def broadcast(op: str, *types: TensorType) -> tuple[int, ...]:
    """NumPy/torch broadcasting of the operands' shapes."""
    ndim = max((len(t.shape) for t in types), default=0)
    out = [1] * ndim
    for t in types:
        pad = (1,) * (ndim - len(t.shape)) + tuple(t.shape)
        for i, d in enumerate(pad):
            if d == out[i] or d == 1:
                continue
            if out[i] == 1:
                out[i] = d
                continue
            shapes = ", ".join(str(x) for x in types)
            raise ShapeError(f"{op}: operands do not broadcast ({shapes}): dim {i} is {out[i]} vs {d}")
    return tuple(out)


def same_dtype(op: str, *types: TensorType) -> str:
    ds = {t.dtype for t in types}
    if len(ds) != 1:
        raise ShapeError(
            f"{op}: operands must share one dtype, got {', '.join(str(t) for t in types)}; insert latch::cast"
        )
    return ds.pop()


def numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


# ------------------------------------------------------------------------------------------
# Costs: (flops, bytes moved). ``bytes`` counts every operand read once and every result
# written once; views move nothing when folded into their consumer, so they count 0.

def nbytes(types: Iterable[TensorType | None]) -> int:
    return sum(t.nbytes for t in types if t is not None)


def per_element(flops_per_elem: float) -> Callable:
    def cost(inputs, outputs, attrs):
        return int(flops_per_elem * sum(o.numel for o in outputs)), nbytes(list(inputs) + list(outputs))

    return cost


def per_input_element(flops_per_elem: float) -> Callable:
    def cost(inputs, outputs, attrs):
        return int(flops_per_elem * sum(i.numel for i in inputs if i is not None)), nbytes(list(inputs) + list(outputs))

    return cost


def view_cost(inputs, outputs, attrs):
    return 0, 0


# ------------------------------------------------------------------------------------------

def spec(name: str, signature: str, infer: Callable, reference: Callable, *, tags: Iterable[str],
         num_inputs: tuple[int, int], cost: Callable, doc: str, torch_ops: Sequence[str] = ()) -> OpSpec:
    """An OpSpec of the core vocabulary; ``name`` without the ``latch::`` prefix."""
    return OpSpec(
        name=f"latch::{name}",
        signature=signature,
        infer=infer,
        tags=frozenset(tags),
        num_inputs=num_inputs,
        cost=cost,
        doc=doc,
        extra={"reference": reference, "torch_ops": tuple(torch_ops)},
    )
