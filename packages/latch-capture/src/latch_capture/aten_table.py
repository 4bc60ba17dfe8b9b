"""The ATen -> Latch lowering table and its dispatch, plus the generic lowering of custom ops.

Lookup order for an fx node's target: the exact overload (``aten.where.self``), then the packet
(``aten.where``). A target in the ``latch`` torch namespace lowers generically (see
:func:`lower_latch`). Anything else is a capture error naming the op and the user's line, with a
hint from :data:`HINTS` when there is a known alternative.

Adding an ATen op: write ``fn(lw, a)`` in the module of its family (``lower_elementwise``,
``lower_shape``, ``lower_nn``) using ``lw.emit`` with Latch ops, add it to that module's TABLE,
and capture a small model using it in a test (the lowering checks its result type against torch's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from latch_ops.common import from_torch_dtype

from . import lower_attention, lower_elementwise, lower_nn, lower_routing, lower_shape
from .fold import try_fold
from .lower import Lowerer, bind_args, op_key, packet_key

TABLE: dict = {**lower_elementwise.TABLE(), **lower_shape.TABLE(), **lower_nn.TABLE(), **lower_attention.TABLE(),
                **lower_routing.TABLE()}

_RANDOM = ("random ops hide their RNG state; put the model in eval() mode (dropout off) or use a Latch "
           "random op with explicit seed/offset inputs")
HINTS: dict[str, str] = {
    "aten.argsort": "use latch_ops.moe's route_order to order tokens by expert",
    "aten.as_strided": "an as_strided view cannot be expressed without strides; use reshape/permute/slice",
    "aten.view.dtype": "reinterpreting a tensor's bits as another dtype is not supported; use .to(dtype)",
    "aten.nll_loss2d_forward": "reshape logits to [N, C] and targets to [N] before cross_entropy",
    "aten.var": "write the variance as mean((x - mean(x))**2) (times n/(n-1) if unbiased)",
    "aten.std": "write the standard deviation with mean/sqrt",
    "aten.bernoulli": _RANDOM, "aten.native_dropout": _RANDOM, "aten.rand": _RANDOM, "aten.randn": _RANDOM,
    "aten.randint": _RANDOM, "aten.rand_like": _RANDOM, "aten.randn_like": _RANDOM, "aten.normal": _RANDOM,
    "aten.uniform": _RANDOM, "aten.randperm": _RANDOM, "aten.multinomial": _RANDOM,
    "aten.exponential": _RANDOM, "aten.geometric": _RANDOM, "aten.cauchy": _RANDOM, "aten.log_normal": _RANDOM,
}


def lower_node(lw: Lowerer, node: fx.Node) -> Any:
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target.namespace == "latch":
        return lower_latch(lw, node)
    folded = try_fold(lw, node)
    if folded is not None:
        return folded
    key = op_key(target)
    fn = TABLE.get(key)
    if fn is None:
        fn = TABLE.get(packet_key(target))
    if fn is None:
        raise unsupported(lw, key)
    if not isinstance(target, torch._ops.OpOverload):
        raise unsupported(lw, key)
    bound = bind_args(target, node.args, node.kwargs)
    a = {k: lw.arg(v) for k, v in bound.items()}
    return fn(lw, a)


def unsupported(lw: Lowerer, key: str):
    from .errors import CaptureError

    packet = key.rsplit(".", 1)[0]
    hint = HINTS.get(key) or HINTS.get(packet) or (
        "Latch has no lowering for it; rewrite this line with supported ops (the op vocabulary is listed in "
        "packages/latch-ops/README.md) or add a lowering (packages/latch-capture/README.md, 'Adding an op')")
    return CaptureError("unsupported op", op=packet if key.endswith(".default") else key, source=lw.source, hint=hint)


# ------------------------------------------------------------------------------------------
# Generic lowering of torch.ops.latch.NAME -> latch::NAME

def _is_tensor_type(t) -> bool:
    return isinstance(t, torch._C.TensorType)


def _is_optional_tensor(t) -> bool:
    return isinstance(t, torch._C.OptionalType) and _is_tensor_type(t.getElementType())


def _is_tensor_list(t) -> bool:
    inner = t.getElementType() if isinstance(t, torch._C.OptionalType) else t
    return isinstance(inner, torch._C.ListType) and (
        _is_tensor_type(inner.getElementType()) or _is_optional_tensor(inner.getElementType()))


def attr_value(lw: Lowerer, name: str, v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return from_torch_dtype(v)
    if isinstance(v, torch.device):
        return str(v)
    if isinstance(v, (list, tuple)):
        return tuple(attr_value(lw, name, x) for x in v)
    raise lw.fail(f"argument {name!r} of type {type(v).__name__}",
                  "custom ops may take tensors, numbers, bools, strings, dtypes and lists of them")


def lower_latch(lw: Lowerer, node: fx.Node) -> Any:
    """``torch.ops.latch.NAME`` -> node ``latch::NAME``: tensor arguments in schema order become the
    operands (None for an absent optional tensor), the other arguments attributes by schema name,
    every result an output."""
    target = node.target
    schema = target._schema
    name = "latch::" + schema.name.split("::")[-1]
    bound = bind_args(target, node.args, node.kwargs)
    inputs: list = []
    attrs: dict = {}
    for arg in schema.arguments:
        v = bound[arg.name]
        if _is_tensor_list(arg.type):
            raise lw.fail(f"custom op argument {arg.name!r} is a list of tensors",
                          "give each tensor its own argument in the op's schema")
        if _is_tensor_type(arg.type) or _is_optional_tensor(arg.type):
            inputs.append(None if v is None else lw.arg(v))
        else:
            attrs[arg.name] = attr_value(lw, arg.name, v)
    attrs = {k: v for k, v in attrs.items() if v is not None}
    outs = lw.emit(name, inputs, attrs)
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return tuple(outs)
    if len(outs) != 1:
        from .lower import LoweringBug

        raise LoweringBug(f"{name}: the OpSpec gives {len(outs)} outputs but torch's op returns one tensor")
    return outs[0]
