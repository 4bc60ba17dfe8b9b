"""Op specs of the MoE ops: shape/dtype rules, tags, costs and the torch references.

All shapes are static: routing decisions are DATA (indices, offsets), never shapes. With N tokens,
top-k routing and E experts:

    token_topk(probs[N,E]) {k} -> (values[N,k], indices[N,k] i64)
        per row, the k largest probabilities in descending order; ties go to the lower expert index
    token_topk_backward(grad_values[N,k], indices[N,k]) {num_experts} -> grad_probs[N,E]
        grad_values scattered into a zero row at indices
    route_order(indices[N,k]) {num_experts} -> (token[N*k] i64, position[N*k] i64, offsets[E+1] i64)
        sorts the N*k (token, slot) pairs by expert (stably: ties keep (token, slot) order);
        token[r] = the token of sorted row r; position[n*k + s] = the sorted row of pair (n, s)
        (the inverse permutation); offsets[e]..offsets[e+1] are expert e's rows, offsets[0] = 0,
        offsets[E] = N*k
    ragged_mm(x[R,Din], w[E,Din,Dout], offsets[E+1]) {out_dtype?} -> out[R,Dout]
        out[r] = x[r] @ w[e] for offsets[e] <= r < offsets[e+1]; rows in no segment are zero
    ragged_mm_grad_x(grad[R,Dout], w[E,Din,Dout], offsets[E+1]) -> dx[R,Din]
        dx[r] = grad[r] @ w[e]^T in expert e's segment; rows in no segment are zero
    ragged_mm_grad_w(x[R,Din], grad[R,Dout], offsets[E+1]) -> dw[E,Din,Dout]
        dw[e] = x[seg e]^T @ grad[seg e]; zero for an expert without rows

ragged_mm's derivative is two ops, not one, so that each tiles on its own: dx by rows and columns
like ragged_mm itself, dw by (expert, Din, Dout) boxes; one op producing both could only run as a
single task, since every dw tile needs every row of the segment that dx splits.

The three ragged products take an optional ``out_dtype`` (the result's dtype, default the
operands'): ``moe.store_operands`` (``latch_ops.moe.policy``) stores BF16 operands for the tensor
cores and keeps FP32 results, as ``memory.policy`` does for latch::matmul.

Tags: ragged_mm and its gradients are ``matmul`` (tensor-core work: the numerical policy gives them
BF16 operands) and ``routing``; their ``extra["tiling"]`` (``tilings``) tells the scheduler how they
split, since the matmul tag's rule assumes ``a[*B,M,K] @ b[*B,K,N]``.

An MoE layer dispatches with ``index_select(x, 0, token)`` and combines with
``index_select(y, 0, position)`` reshaped to [N, k, D] and weighted by the gates (core ops).

This module imports without torch; the references import it lazily (``latch_ops.moe.reference``).
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from latch_core.ir import FLOAT_DTYPES, INT_DTYPES, TensorType
from latch_core.registry import INDEXING, MATMUL, ROUTING, OpSpec, ShapeError

from . import tilings

TOKEN_TOPK = "latch::token_topk"
TOKEN_TOPK_BACKWARD = "latch::token_topk_backward"
ROUTE_ORDER = "latch::route_order"
RAGGED_MM = "latch::ragged_mm"
RAGGED_MM_GRAD_X = "latch::ragged_mm_grad_x"
RAGGED_MM_GRAD_W = "latch::ragged_mm_grad_w"


def _int_attr(op: str, attrs: dict[str, Any], key: str, lo: int) -> int:
    v = attrs.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ShapeError(f"{op}: attribute {key!r} must be an int, got {v!r}")
    if v < lo:
        raise ShapeError(f"{op}: attribute {key!r} must be >= {lo}, got {v}")
    return v


def _need(op: str, name: str, t: TensorType | None, rank: int, kinds: frozenset[str], what: str) -> TensorType:
    if t is None:
        raise ShapeError(f"{op}: operand {name} is required")
    if len(t.shape) != rank:
        raise ShapeError(f"{op}: {name} must be {what}, got {t}")
    if t.dtype not in kinds:
        kind = "a float" if kinds is FLOAT_DTYPES else "an integer"
        raise ShapeError(f"{op}: {name} must be {kind} tensor ({what}), got {t}")
    return t


# --------------------------------------------------------------------------------------------
# Shape/dtype rules

def infer_token_topk(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    (probs,) = inputs
    probs = _need(TOKEN_TOPK, "probs", probs, 2, FLOAT_DTYPES, "[N, E]")
    k = _int_attr(TOKEN_TOPK, attrs, "k", 1)
    N, E = probs.shape
    if k > E:
        raise ShapeError(f"{TOKEN_TOPK}: k={k} exceeds the number of experts E={E} (probs {probs})")
    return [TensorType((N, k), probs.dtype), TensorType((N, k), "i64")]


def infer_token_topk_backward(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    grad, idx = inputs
    grad = _need(TOKEN_TOPK_BACKWARD, "grad_values", grad, 2, FLOAT_DTYPES, "[N, k]")
    idx = _need(TOKEN_TOPK_BACKWARD, "indices", idx, 2, INT_DTYPES, "[N, k]")
    E = _int_attr(TOKEN_TOPK_BACKWARD, attrs, "num_experts", 1)
    if grad.shape != idx.shape:
        raise ShapeError(f"{TOKEN_TOPK_BACKWARD}: grad_values {grad} and indices {idx} must have one shape")
    if grad.shape[1] > E:
        raise ShapeError(f"{TOKEN_TOPK_BACKWARD}: k={grad.shape[1]} exceeds num_experts={E}")
    return [TensorType((grad.shape[0], E), grad.dtype)]


def infer_route_order(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    (idx,) = inputs
    idx = _need(ROUTE_ORDER, "indices", idx, 2, INT_DTYPES, "[N, k] expert indices")
    E = _int_attr(ROUTE_ORDER, attrs, "num_experts", 1)
    rows = idx.shape[0] * idx.shape[1]
    return [TensorType((rows,), "i64"), TensorType((rows,), "i64"), TensorType((E + 1,), "i64")]


def _out_dtype(op: str, attrs: dict[str, Any], default: str) -> str:
    """The output dtype: attribute ``out_dtype`` (set by ``moe.store_operands`` when the operands
    are stored in BF16 but the result stays FP32), else the operands' dtype."""
    v = attrs.get("out_dtype")
    if v is None:
        return default
    if v not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: attribute 'out_dtype' must be a float dtype {sorted(FLOAT_DTYPES)}, got {v!r}")
    return v


def _ragged_operands(op: str, x, w, offsets) -> tuple[int, int, int, int]:
    x = _need(op, "x", x, 2, FLOAT_DTYPES, "[R, Din] rows sorted by expert")
    w = _need(op, "w", w, 3, FLOAT_DTYPES, "[E, Din, Dout] stacked expert weights")
    offsets = _need(op, "offsets", offsets, 1, INT_DTYPES, "[E+1] per-expert row offsets")
    R, Din = x.shape
    E, wDin, Dout = w.shape
    if x.dtype != w.dtype:
        raise ShapeError(f"{op}: x {x} and w {w} must share one dtype; cast one of them")
    if wDin != Din:
        raise ShapeError(f"{op}: x {x} has Din={Din} but w {w} has Din={wDin}")
    if offsets.shape != (E + 1,):
        raise ShapeError(f"{op}: offsets must be [E+1] = [{E + 1}] for w {w}, got {offsets}")
    return R, Din, E, Dout


def infer_ragged_mm(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    x, w, offsets = inputs
    R, _Din, _E, Dout = _ragged_operands(RAGGED_MM, x, w, offsets)
    return [TensorType((R, Dout), _out_dtype(RAGGED_MM, attrs, x.dtype))]


def infer_ragged_mm_grad_x(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    op = RAGGED_MM_GRAD_X
    grad, w, offsets = inputs
    grad = _need(op, "grad", grad, 2, FLOAT_DTYPES, "[R, Dout]")
    w = _need(op, "w", w, 3, FLOAT_DTYPES, "[E, Din, Dout] stacked expert weights")
    offsets = _need(op, "offsets", offsets, 1, INT_DTYPES, "[E+1] per-expert row offsets")
    E, Din, Dout = w.shape
    if grad.dtype != w.dtype:
        raise ShapeError(f"{op}: grad {grad} and w {w} must share one dtype; cast one of them")
    if grad.shape[1] != Dout:
        raise ShapeError(f"{op}: grad {grad} has Dout={grad.shape[1]} but w {w} has Dout={Dout}")
    if offsets.shape != (E + 1,):
        raise ShapeError(f"{op}: offsets must be [E+1] = [{E + 1}] for w {w}, got {offsets}")
    return [TensorType((grad.shape[0], Din), _out_dtype(op, attrs, grad.dtype))]


def infer_ragged_mm_grad_w(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    x, grad, offsets = inputs
    x = _need(RAGGED_MM_GRAD_W, "x", x, 2, FLOAT_DTYPES, "[R, Din] rows sorted by expert")
    grad = _need(RAGGED_MM_GRAD_W, "grad", grad, 2, FLOAT_DTYPES, "[R, Dout]")
    offsets = _need(RAGGED_MM_GRAD_W, "offsets", offsets, 1, INT_DTYPES, "[E+1] per-expert row offsets")
    if x.dtype != grad.dtype or x.shape[0] != grad.shape[0]:
        raise ShapeError(f"{RAGGED_MM_GRAD_W}: x {x} and grad {grad} must share the row count and dtype")
    if offsets.shape[0] < 1:
        raise ShapeError(f"{RAGGED_MM_GRAD_W}: offsets must be [E+1] with E >= 0, got {offsets}")
    out = _out_dtype(RAGGED_MM_GRAD_W, attrs, x.dtype)
    return [TensorType((offsets.shape[0] - 1, x.shape[1], grad.shape[1]), out)]


# --------------------------------------------------------------------------------------------
# Costs: (flops, bytes). A dense bound: every row meets one expert, every expert's weights are read.

def _nbytes(types) -> int:
    return sum(t.nbytes for t in types if t is not None)


def cost_token_topk(inputs, outputs, attrs):
    (probs,) = inputs
    return probs.numel * int(attrs.get("k", 1)), _nbytes(list(inputs) + list(outputs))


def cost_route_order(inputs, outputs, attrs):
    (idx,) = inputs
    return idx.numel * max(1, int(attrs.get("num_experts", 1)).bit_length()), _nbytes(list(inputs) + list(outputs))


def cost_ragged_mm(inputs, outputs, attrs):
    x, w, _off = inputs
    R, Din = x.shape
    return 2 * R * Din * w.shape[2], _nbytes(list(inputs) + list(outputs))


def cost_ragged_mm_grad_x(inputs, outputs, attrs):
    grad, w, _off = inputs
    return 2 * grad.shape[0] * grad.shape[1] * w.shape[1], _nbytes(list(inputs) + list(outputs))


def cost_ragged_mm_grad_w(inputs, outputs, attrs):
    x, grad, _off = inputs
    return 2 * x.shape[0] * x.shape[1] * grad.shape[1], _nbytes(list(inputs) + list(outputs))


# --------------------------------------------------------------------------------------------
# References (torch, imported lazily)

def _ref_token_topk(inputs, attrs):
    from .reference import token_topk_math

    return list(token_topk_math(inputs[0], int(attrs["k"])))


def _ref_token_topk_backward(inputs, attrs):
    from .reference import token_topk_backward_math

    return [token_topk_backward_math(inputs[0], inputs[1], int(attrs["num_experts"]))]


def _ref_route_order(inputs, attrs):
    from .reference import route_order_math

    return list(route_order_math(inputs[0], int(attrs["num_experts"])))


def _as_out(t, attrs):
    """A reference result at the reference width of ``out_dtype`` (FP64 in the interpreter)."""
    if attrs.get("out_dtype") is None:
        return t
    from latch_ops.common import ref_dtype

    return t.to(ref_dtype(attrs["out_dtype"]))


def _ref_ragged_mm(inputs, attrs):
    from .reference import ragged_mm_math

    return [_as_out(ragged_mm_math(*inputs), attrs)]


def _ref_ragged_mm_grad_x(inputs, attrs):
    from .reference import ragged_mm_grad_x_math

    return [_as_out(ragged_mm_grad_x_math(*inputs), attrs)]


def _ref_ragged_mm_grad_w(inputs, attrs):
    from .reference import ragged_mm_grad_w_math

    return [_as_out(ragged_mm_grad_w_math(*inputs), attrs)]


SPECS = [
    OpSpec(
        name=TOKEN_TOPK,
        signature="token_topk(probs[N,E]) {k: int} -> (values[N,k], indices[N,k] i64)",
        infer=infer_token_topk,
        tags={ROUTING},
        num_inputs=(1, 1),
        cost=cost_token_topk,
        doc="per-row top-k in descending order, ties to the lower index",
        extra={"reference": _ref_token_topk, "torch_ops": ["latch::token_topk"], "tiling": tilings.token_topk},
    ),
    OpSpec(
        name=TOKEN_TOPK_BACKWARD,
        signature="token_topk_backward(grad_values[N,k], indices[N,k]) {num_experts: int} -> grad_probs[N,E]",
        infer=infer_token_topk_backward,
        tags={ROUTING, INDEXING},
        num_inputs=(2, 2),
        doc="gradient of token_topk: grad_values scattered into zero rows at indices",
        extra={"reference": _ref_token_topk_backward, "torch_ops": ["latch::token_topk_backward"],
               "tiling": tilings.token_topk_backward},
    ),
    OpSpec(
        name=ROUTE_ORDER,
        signature="route_order(indices[N,k]) {num_experts: int} "
                  "-> (token[N*k] i64, position[N*k] i64, offsets[E+1] i64)",
        infer=infer_route_order,
        tags={ROUTING},
        num_inputs=(1, 1),
        cost=cost_route_order,
        doc="stable sort of the (token, slot) pairs by expert: source token per sorted row, sorted row "
            "per pair, per-expert row offsets",
        extra={"reference": _ref_route_order, "torch_ops": ["latch::route_order"]},
    ),
    OpSpec(
        name=RAGGED_MM,
        signature="ragged_mm(x[R,Din], w[E,Din,Dout], offsets[E+1]) -> out[R,Dout]",
        infer=infer_ragged_mm,
        tags={MATMUL, ROUTING},
        num_inputs=(3, 3),
        cost=cost_ragged_mm,
        doc="grouped matmul: rows offsets[e]..offsets[e+1] of x times w[e]; rows in no segment give zero",
        extra={"reference": _ref_ragged_mm, "torch_ops": ["latch::ragged_mm"], "tiling": tilings.ragged_mm},
    ),
    OpSpec(
        name=RAGGED_MM_GRAD_X,
        signature="ragged_mm_grad_x(grad[R,Dout], w[E,Din,Dout], offsets[E+1]) -> dx[R,Din]",
        infer=infer_ragged_mm_grad_x,
        tags={MATMUL, ROUTING},
        num_inputs=(3, 3),
        cost=cost_ragged_mm_grad_x,
        doc="gradient of ragged_mm for x: grad @ w[e]^T per segment; rows in no segment give zero",
        extra={"reference": _ref_ragged_mm_grad_x, "torch_ops": ["latch::ragged_mm_grad_x"],
               "tiling": tilings.ragged_grad_x},
    ),
    OpSpec(
        name=RAGGED_MM_GRAD_W,
        signature="ragged_mm_grad_w(x[R,Din], grad[R,Dout], offsets[E+1]) -> dw[E,Din,Dout]",
        infer=infer_ragged_mm_grad_w,
        tags={MATMUL, ROUTING},
        num_inputs=(3, 3),
        cost=cost_ragged_mm_grad_w,
        doc="gradient of ragged_mm for w: dw[e] = x_e^T grad_e over expert e's rows (zero without rows)",
        extra={"reference": _ref_ragged_mm_grad_w, "torch_ops": ["latch::ragged_mm_grad_w"],
               "tiling": tilings.ragged_grad_w},
    ),
]
