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
    ragged_mm(x[R,Din], w[E,Din,Dout], offsets[E+1]) -> out[R,Dout]
        out[r] = x[r] @ w[e] for offsets[e] <= r < offsets[e+1]; rows in no segment are zero
    ragged_mm_backward(grad[R,Dout], x, w, offsets) -> (dx[R,Din], dw[E,Din,Dout])

An MoE layer dispatches with ``index_select(x, 0, token)`` and combines with
``index_select(y, 0, position)`` reshaped to [N, k, D] and weighted by the gates (core ops).

This module imports without torch; the references import it lazily (``latch_ops.moe.reference``).
"""

from __future__ import annotations

from typing import Any, Sequence

from latch_core.ir import FLOAT_DTYPES, INT_DTYPES, TensorType
from latch_core.registry import INDEXING, ROUTING, OpSpec, ShapeError

TOKEN_TOPK = "latch::token_topk"
TOKEN_TOPK_BACKWARD = "latch::token_topk_backward"
ROUTE_ORDER = "latch::route_order"
RAGGED_MM = "latch::ragged_mm"
RAGGED_MM_BACKWARD = "latch::ragged_mm_backward"


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
    return [TensorType((R, Dout), x.dtype)]


def infer_ragged_mm_backward(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    grad, x, w, offsets = inputs
    R, _Din, _E, Dout = _ragged_operands(RAGGED_MM_BACKWARD, x, w, offsets)
    want = TensorType((R, Dout), x.dtype)
    if grad is None or grad != want:
        raise ShapeError(f"{RAGGED_MM_BACKWARD}: grad must be {want} (from x {x}, w {w}), got {grad}")
    return [x, w]


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


def cost_ragged_mm_backward(inputs, outputs, attrs):
    _g, x, w, _off = inputs
    R, Din = x.shape
    return 4 * R * Din * w.shape[2], _nbytes(list(inputs) + list(outputs))


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


def _ref_ragged_mm(inputs, attrs):
    from .reference import ragged_mm_math

    return [ragged_mm_math(*inputs)]


def _ref_ragged_mm_backward(inputs, attrs):
    from .reference import ragged_mm_backward_math

    return list(ragged_mm_backward_math(*inputs))


SPECS = [
    OpSpec(
        name=TOKEN_TOPK,
        signature="token_topk(probs[N,E]) {k: int} -> (values[N,k], indices[N,k] i64)",
        infer=infer_token_topk,
        tags={ROUTING},
        num_inputs=(1, 1),
        cost=cost_token_topk,
        doc="per-row top-k in descending order, ties to the lower index",
        extra={"reference": _ref_token_topk, "torch_ops": ["latch::token_topk"]},
    ),
    OpSpec(
        name=TOKEN_TOPK_BACKWARD,
        signature="token_topk_backward(grad_values[N,k], indices[N,k]) {num_experts: int} -> grad_probs[N,E]",
        infer=infer_token_topk_backward,
        tags={ROUTING, INDEXING},
        num_inputs=(2, 2),
        doc="gradient of token_topk: grad_values scattered into zero rows at indices",
        extra={"reference": _ref_token_topk_backward, "torch_ops": ["latch::token_topk_backward"]},
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
        tags={ROUTING},
        num_inputs=(3, 3),
        cost=cost_ragged_mm,
        doc="grouped matmul: rows offsets[e]..offsets[e+1] of x times w[e]; rows in no segment give zero",
        extra={"reference": _ref_ragged_mm, "torch_ops": ["latch::ragged_mm"]},
    ),
    OpSpec(
        name=RAGGED_MM_BACKWARD,
        signature="ragged_mm_backward(grad[R,Dout], x[R,Din], w[E,Din,Dout], offsets[E+1]) "
                  "-> (dx[R,Din], dw[E,Din,Dout])",
        infer=infer_ragged_mm_backward,
        tags={ROUTING},
        num_inputs=(4, 4),
        cost=cost_ragged_mm_backward,
        doc="gradient of ragged_mm: dx = grad @ w[e]^T per segment, dw[e] = x_e^T grad_e (zero for empty experts)",
        extra={"reference": _ref_ragged_mm_backward, "torch_ops": ["latch::ragged_mm_backward"]},
    ),
]
