"""Views and layout ops: reshape, permute, expand, slice, select (tag ``view``); concat,
slice_scatter, select_scatter (tag ``structural``); copy (tags ``copy``, ``elementwise``).

The IR has no strides: every value is a logical, row-major tensor, and a view op defines its output
by index arithmetic on its operand. A code generator may fold a view into its consumer's operand
addressing or materialise it; either way the index maps below are the semantics:

    reshape(x) {shape}                 row-major re-indexing; numel(shape) == numel(x)
    permute(x) {perm}                  out[i_0..i_n] = x[j] with j[perm[k]] = i_k
    expand(x) {shape}                  x aligned to the right of shape; size-1 dims repeat
    slice(x) {dim, start, end, step}   out[.., i, ..] = x[.., start + i*step, ..]; 0 <= start <= end <= size
    select(x) {dim, index}             out = x[.., index, ..] with that dim removed
    concat(x_0, .., x_k) {dim}         operands stacked along dim (other dims equal)
    slice_scatter(x, src) {dim, start, end, step}   x with slice(x) replaced by src
    select_scatter(x, src) {dim, index}             x with select(x) replaced by src
    copy(x)                            a fresh value equal to x

All dims and bounds are normalised by the capture lowering (non-negative, clamped); the shape rules
reject anything else. References may return views of their operands (they never mutate them).
"""

from __future__ import annotations

from latch_core.ir import TensorType
from latch_core.registry import COPY, ELEMENTWISE, STRUCTURAL, VIEW, OpSpec, ShapeError

from .common import attr, check_dim, int_tuple, need, numel, per_element, same_dtype, spec, view_cost


def _t():
    import torch

    return torch


def _reshape_infer(inputs, attrs):
    op = "latch::reshape"
    x = need(op, inputs, 0, "x")
    shape = int_tuple(op, attrs, "shape")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op}: shape {list(shape)} has a negative dim; the lowering resolves -1")
    if numel(shape) != x.numel:
        raise ShapeError(f"{op}: cannot reshape {x} ({x.numel} elements) to {list(shape)} ({numel(shape)})")
    return [TensorType(shape, x.dtype)]


def _permute_infer(inputs, attrs):
    op = "latch::permute"
    x = need(op, inputs, 0, "x")
    perm = int_tuple(op, attrs, "perm")
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"{op}: perm {list(perm)} is not a permutation of the {len(x.shape)} dims of {x}")
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


def _expand_infer(inputs, attrs):
    op = "latch::expand"
    x = need(op, inputs, 0, "x")
    shape = int_tuple(op, attrs, "shape")
    lead = len(shape) - len(x.shape)
    if lead < 0:
        raise ShapeError(f"{op}: target {list(shape)} has fewer dims than {x}")
    for i, d in enumerate(x.shape):
        if d != 1 and d != shape[lead + i]:
            raise ShapeError(f"{op}: dim {i} of {x} is {d}; only size-1 dims expand (target {list(shape)})")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op}: negative dim in target {list(shape)}")
    return [TensorType(shape, x.dtype)]


def slice_bounds(op: str, x: TensorType, attrs: dict) -> tuple[int, int, int, int]:
    """(dim, start, end, step) checked against x; the lowering normalised them."""
    dim = check_dim(op, attr(op, attrs, "dim", int), len(x.shape))
    start, end, step = (attr(op, attrs, k, int) for k in ("start", "end", "step"))
    size = x.shape[dim]
    if not (0 <= start <= end <= size) or step < 1:
        raise ShapeError(f"{op}: slice [{start}:{end}:{step}] of dim {dim} (size {size}) of {x} is not normalised")
    return dim, start, end, step


def _slice_len(start, end, step):
    return (end - start + step - 1) // step


def _slice_infer(inputs, attrs):
    op = "latch::slice"
    x = need(op, inputs, 0, "x")
    dim, start, end, step = slice_bounds(op, x, attrs)
    shape = list(x.shape)
    shape[dim] = _slice_len(start, end, step)
    return [TensorType(shape, x.dtype)]


def _select_index(op, x, attrs):
    dim = check_dim(op, attr(op, attrs, "dim", int), len(x.shape))
    index = attr(op, attrs, "index", int)
    if not 0 <= index < x.shape[dim]:
        raise ShapeError(f"{op}: index {index} out of range for dim {dim} of {x}")
    return dim, index


def _select_infer(inputs, attrs):
    op = "latch::select"
    x = need(op, inputs, 0, "x")
    dim, _ = _select_index(op, x, attrs)
    return [TensorType(x.shape[:dim] + x.shape[dim + 1:], x.dtype)]


def _concat_infer(inputs, attrs):
    op = "latch::concat"
    if not inputs or any(t is None for t in inputs):
        raise ShapeError(f"{op}: needs one or more operands, none absent")
    first = inputs[0]
    dim = check_dim(op, attr(op, attrs, "dim", int), len(first.shape))
    same_dtype(op, *inputs)
    total = 0
    for t in inputs:
        if len(t.shape) != len(first.shape) or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != dim
        ):
            raise ShapeError(f"{op}: operands differ outside dim {dim}: {first} vs {t}")
        total += t.shape[dim]
    shape = list(first.shape)
    shape[dim] = total
    return [TensorType(shape, first.dtype)]


def _scatter_like_check(op, x, src, expect):
    if src.dtype != x.dtype:
        raise ShapeError(f"{op}: src {src} must have x's dtype {x.dtype}")
    if tuple(src.shape) != tuple(expect):
        raise ShapeError(f"{op}: src {src} must have shape {list(expect)} (the region it replaces in {x})")


def _slice_scatter_infer(inputs, attrs):
    op = "latch::slice_scatter"
    x, src = need(op, inputs, 0, "x"), need(op, inputs, 1, "src")
    dim, start, end, step = slice_bounds(op, x, attrs)
    expect = list(x.shape)
    expect[dim] = _slice_len(start, end, step)
    _scatter_like_check(op, x, src, expect)
    return [x]


def _select_scatter_infer(inputs, attrs):
    op = "latch::select_scatter"
    x, src = need(op, inputs, 0, "x"), need(op, inputs, 1, "src")
    dim, _ = _select_index(op, x, attrs)
    _scatter_like_check(op, x, src, x.shape[:dim] + x.shape[dim + 1:])
    return [x]


def _slice_ref(inputs, attrs):
    return [inputs[0][(slice(None),) * attrs["dim"] + (slice(attrs["start"], attrs["end"], attrs["step"]),)]]


def _slice_scatter_ref(inputs, attrs):
    return [_t().slice_scatter(inputs[0], inputs[1], attrs["dim"], attrs["start"], attrs["end"], attrs["step"])]


def _select_scatter_ref(inputs, attrs):
    return [_t().select_scatter(inputs[0], inputs[1], attrs["dim"], attrs["index"])]


def _copy_cost(inputs, outputs, attrs):
    return 0, sum(t.nbytes for t in list(inputs) + list(outputs) if t is not None)


SPECS: list[OpSpec] = [
    spec("reshape", "reshape(x) {shape} -> out", _reshape_infer, lambda i, a: [i[0].reshape(tuple(a["shape"]))],
         tags={VIEW}, num_inputs=(1, 1), cost=view_cost, doc="row-major re-indexing to shape",
         torch_ops=("aten.view", "aten._unsafe_view", "aten.reshape", "aten.squeeze", "aten.unsqueeze", "aten.flatten")),
    spec("permute", "permute(x) {perm} -> out", _permute_infer, lambda i, a: [i[0].permute(tuple(a["perm"]))],
         tags={VIEW}, num_inputs=(1, 1), cost=view_cost, doc="out.shape[k] = x.shape[perm[k]]",
         torch_ops=("aten.permute", "aten.t", "aten.transpose")),
    spec("expand", "expand(x) {shape} -> out", _expand_infer, lambda i, a: [i[0].expand(tuple(a["shape"]))],
         tags={VIEW}, num_inputs=(1, 1), cost=view_cost, doc="broadcast x to shape (x aligned right)",
         torch_ops=("aten.expand",)),
    spec("slice", "slice(x) {dim, start, end, step} -> out", _slice_infer, _slice_ref,
         tags={VIEW}, num_inputs=(1, 1), cost=view_cost, doc="strided range along dim",
         torch_ops=("aten.slice", "aten.split", "aten.split_with_sizes", "aten.chunk", "aten.narrow")),
    spec("select", "select(x) {dim, index} -> out", _select_infer, lambda i, a: [i[0].select(a["dim"], a["index"])],
         tags={VIEW}, num_inputs=(1, 1), cost=view_cost, doc="one index along dim, dim removed",
         torch_ops=("aten.select", "aten.unbind")),
    spec("concat", "concat(x_0, ..., x_k) {dim} -> out", _concat_infer, lambda i, a: [_t().cat(list(i), a["dim"])],
         tags={STRUCTURAL}, num_inputs=(1, 1 << 30), cost=_copy_cost, doc="operands joined along dim",
         torch_ops=("aten.cat", "aten.stack")),
    spec("slice_scatter", "slice_scatter(x, src) {dim, start, end, step} -> out", _slice_scatter_infer,
         _slice_scatter_ref, tags={STRUCTURAL}, num_inputs=(2, 2), cost=_copy_cost,
         doc="x with the slice [start:end:step] of dim replaced by src",
         torch_ops=("aten.slice_scatter", "aten.slice_backward")),
    spec("select_scatter", "select_scatter(x, src) {dim, index} -> out", _select_scatter_infer, _select_scatter_ref,
         tags={STRUCTURAL}, num_inputs=(2, 2), cost=_copy_cost, doc="x with x.select(dim, index) replaced by src",
         torch_ops=("aten.select_scatter", "aten.select_backward")),
    spec("copy", "copy(x) -> out", lambda i, a: [need("latch::copy", i, 0, "x")], lambda i, a: [i[0].clone()],
         tags={COPY, ELEMENTWISE}, num_inputs=(1, 1), cost=per_element(0),
         doc="a fresh value equal to x (used where an output would otherwise alias an input or another output)",
         torch_ops=("aten.clone", "aten.copy")),
]
