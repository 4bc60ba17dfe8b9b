"""The demo plugin's registrations, found through the entry point ``demo`` in ``latch.plugins``.

``demo::swish(x) -> y``, ``y = x * sigmoid(beta * x)`` elementwise, attribute ``beta`` (float,
default 1.0). It is a complete op spec in the sense of docs/CONTRACTS.md section 1: a shape/dtype
rule, tags, a cost model and a torch reference (which needs no torch import: it only calls tensor
methods, so this module imports without torch).
"""

from latch_core.hookspecs import hookimpl
from latch_core.ir import FLOAT_DTYPES
from latch_core.registry import ELEMENTWISE, OpSpec, ShapeError

NAME = "demo::swish"


def _infer(inputs, attrs):
    (x,) = inputs
    if x is None:
        raise ShapeError(f"{NAME}: operand x is required")
    if x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{NAME}: x must be a float tensor, got {x}")
    beta = attrs.get("beta", 1.0)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise ShapeError(f"{NAME}: attribute beta must be a number, got {beta!r}")
    return [x]


def _cost(in_types, out_types, attrs):
    (x,) = in_types
    # exp, add, divide, two multiplies per element; one read and one write.
    return 5 * x.numel, 2 * x.nbytes


def _reference(inputs, attrs):
    (x,) = inputs
    beta = float(attrs.get("beta", 1.0))
    return [x * (x * beta).sigmoid()]


SWISH = OpSpec(
    name=NAME,
    signature="swish(x) -> y   {beta: float = 1.0}",
    infer=_infer,
    tags={ELEMENTWISE},
    num_inputs=(1, 1),
    cost=_cost,
    doc="x * sigmoid(beta * x), elementwise",
    extra={"reference": _reference},
)


@hookimpl
def latch_register_ops(register):
    register(SWISH)
