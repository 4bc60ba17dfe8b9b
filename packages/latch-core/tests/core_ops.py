"""A tiny op set for latch-core's own tests (a stand-in for latch-ops, which core must not need).

The golden graphs use these ops; tests register them through a plugin object, the same path an
installed plugin takes. Shape rules are real: lint checks the golden graphs against them.
"""

from __future__ import annotations

from latch_core.hookspecs import hookimpl
from latch_core.ir import TensorType
from latch_core.registry import ELEMENTWISE, MATMUL, REDUCTION, OpSpec, ShapeError


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y) if 1 in (x, y) else x)
    return tuple(reversed(out))


def _binary(inputs, attrs):
    a, b = inputs
    if a.dtype != b.dtype:
        raise ShapeError(f"dtypes differ: {a} and {b}")
    return [TensorType(_broadcast(a.shape, b.shape), a.dtype)]


def _unary(inputs, attrs):
    return [inputs[0]]


def _matmul(inputs, attrs):
    a, b = inputs
    if a.dtype != b.dtype or len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError(f"matmul needs two 2-d tensors of one dtype, got {a} and {b}")
    m, k = reversed(a.shape) if attrs.get("transpose_a") else a.shape
    k2, n = b.shape
    if k != k2:
        raise ShapeError(f"inner dimensions differ: {a} @ {b}")
    return [TensorType((m, n), a.dtype)]


def _reduce(inputs, attrs):
    (x,) = inputs
    dims = attrs.get("dims")
    if dims is None or any(not 0 <= d < len(x.shape) for d in dims):
        raise ShapeError(f"bad dims {dims!r} for {x}")
    keep = attrs.get("keepdim", False)
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keep or i not in dims)
    return [TensorType(shape, x.dtype)]


OPS = [
    OpSpec("latch::add", "add(a, b) -> out", _binary, {ELEMENTWISE}, (2, 2)),
    OpSpec("latch::sub", "sub(a, b) -> out", _binary, {ELEMENTWISE}, (2, 2)),
    OpSpec("latch::mul", "mul(a, b) -> out", _binary, {ELEMENTWISE}, (2, 2)),
    OpSpec("latch::clamp", "clamp(x) -> out {min, max}", _unary, {ELEMENTWISE}, (1, 1)),
    OpSpec("latch::relu", "relu(x) -> out", _unary, {ELEMENTWISE}, (1, 1)),
    OpSpec("latch::matmul", "matmul(a, b) -> out {transpose_a}", _matmul, {MATMUL}, (2, 2)),
    OpSpec("latch::sum", "sum(x) -> out {dims, keepdim}", _reduce, {REDUCTION}, (1, 1)),
    OpSpec("latch::mean", "mean(x) -> out {dims, keepdim}", _reduce, {REDUCTION}, (1, 1)),
]


class CoreTestOps:
    """Plugin object registering OPS (register with ``plugins.load_with(("core-test-ops", CoreTestOps()))``)."""

    @hookimpl
    def latch_register_ops(self, register):
        for spec in OPS:
            register(spec)
