"""torch.library registration of the MoE custom ops (importing this module needs torch).

Model code imports the wrappers here (:func:`token_topk`, :func:`route_order`, :func:`ragged_mm`);
each call is ONE ``torch.ops.latch.*`` node when traced, which capture lowers generically to the
Latch op of the same name (tensor arguments -> operands, the rest -> attributes by argument name).
Derivatives are the ops' own: token_topk's backward is the custom op ``token_topk_backward``,
ragged_mm's the two custom ops ``ragged_mm_grad_x`` and ``ragged_mm_grad_w`` (each only when its
input needs a gradient); route_order's outputs are integer and carry
no gradient.

Fake implementations are built from the Latch shape rules in ``specs`` so that tracing, the rules
and the lint cannot disagree, and every output is contiguous, as the real math returns.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from latch_core.ir import TensorType
from latch_core.registry import ShapeError

from . import specs
from .reference import (
    ragged_mm_grad_w_math, ragged_mm_grad_x_math, ragged_mm_math, route_order_math, token_topk_backward_math,
    token_topk_math,
)

_DTYPES = {
    torch.float64: "f64", torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "bool",
}
_TORCH = {v: k for k, v in _DTYPES.items()}


def _latch_type(t: torch.Tensor) -> TensorType:
    if t.dtype not in _DTYPES:
        raise ShapeError(f"tensor dtype {t.dtype} has no Latch dtype")
    return TensorType(tuple(int(d) for d in t.shape), _DTYPES[t.dtype])


def _fake(infer, tensors, attrs, like: torch.Tensor):
    types = infer([None if t is None else _latch_type(t) for t in tensors], attrs)
    outs = tuple(like.new_empty(t.shape, dtype=_TORCH[t.dtype]) for t in types)
    return outs if len(outs) > 1 else outs[0]


# --------------------------------------------------------------------------------------------
# token_topk

@custom_op(specs.TOKEN_TOPK, mutates_args=())
def _token_topk(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return token_topk_math(probs, k)


@_token_topk.register_fake
def _(probs, k):
    return _fake(specs.infer_token_topk, [probs], {"k": k}, probs)


@custom_op(specs.TOKEN_TOPK_BACKWARD, mutates_args=())
def _token_topk_backward(grad_values: torch.Tensor, indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    return token_topk_backward_math(grad_values, indices, num_experts)


@_token_topk_backward.register_fake
def _(grad_values, indices, num_experts):
    return _fake(specs.infer_token_topk_backward, [grad_values, indices], {"num_experts": num_experts}, grad_values)


def _token_topk_setup(ctx, inputs, output):
    probs, _k = inputs
    _values, indices = output
    ctx.save_for_backward(indices)
    ctx.num_experts = probs.shape[1]
    ctx.set_materialize_grads(False)


def _token_topk_grad(ctx, grad_values, _grad_indices):
    if grad_values is None:
        return None, None
    (indices,) = ctx.saved_tensors
    return _token_topk_backward(grad_values, indices, ctx.num_experts), None


_token_topk.register_autograd(_token_topk_grad, setup_context=_token_topk_setup)


# --------------------------------------------------------------------------------------------
# route_order (integer in, integer out: no autograd)

@custom_op(specs.ROUTE_ORDER, mutates_args=())
def _route_order(indices: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return route_order_math(indices, num_experts)


@_route_order.register_fake
def _(indices, num_experts):
    return _fake(specs.infer_route_order, [indices], {"num_experts": num_experts}, indices)


# --------------------------------------------------------------------------------------------
# ragged_mm

@custom_op(specs.RAGGED_MM, mutates_args=())
def _ragged_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return ragged_mm_math(x, w, offsets)


@_ragged_mm.register_fake
def _(x, w, offsets):
    return _fake(specs.infer_ragged_mm, [x, w, offsets], {}, x)


@custom_op(specs.RAGGED_MM_GRAD_X, mutates_args=())
def _ragged_mm_grad_x(grad: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return ragged_mm_grad_x_math(grad, w, offsets)


@_ragged_mm_grad_x.register_fake
def _(grad, w, offsets):
    return _fake(specs.infer_ragged_mm_grad_x, [grad, w, offsets], {}, grad)


@custom_op(specs.RAGGED_MM_GRAD_W, mutates_args=())
def _ragged_mm_grad_w(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return ragged_mm_grad_w_math(x, grad, offsets)


@_ragged_mm_grad_w.register_fake
def _(x, grad, offsets):
    return _fake(specs.infer_ragged_mm_grad_w, [x, grad, offsets], {}, x)


def _ragged_mm_setup(ctx, inputs, output):
    x, w, offsets = inputs
    ctx.save_for_backward(x, w, offsets)
    ctx.set_materialize_grads(False)


def _ragged_mm_grad(ctx, grad):
    if grad is None:
        return None, None, None
    x, w, offsets = ctx.saved_tensors
    dx = _ragged_mm_grad_x(grad, w, offsets) if ctx.needs_input_grad[0] else None
    dw = _ragged_mm_grad_w(x, grad, offsets) if ctx.needs_input_grad[1] else None
    return dx, dw, None


_ragged_mm.register_autograd(_ragged_mm_grad, setup_context=_ragged_mm_setup)


# --------------------------------------------------------------------------------------------
# What model code calls

def token_topk(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values[N,k], indices[N,k]) of the k largest entries per row of probs[N,E]."""
    return torch.ops.latch.token_topk(probs, int(k))


def route_order(indices: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token[N*k], position[N*k], offsets[E+1]) for expert indices[N,k]; see ``specs``."""
    return torch.ops.latch.route_order(indices, int(num_experts))


def ragged_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of x sorted by expert times their expert's weight: x[R,Din], w[E,Din,Dout] -> [R,Dout]."""
    return torch.ops.latch.ragged_mm(x, w, offsets)
