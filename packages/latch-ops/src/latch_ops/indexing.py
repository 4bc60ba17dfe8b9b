"""Indexing ops (tag ``indexing``): embedding and its backward, gather/scatter, index_select/index_add.

    embedding(weight[V, D], idx[*I]) -> out[*I, D]                      out[i] = weight[idx[i]]
    embedding_backward(grad[*I, D], idx[*I], [base[num_weights, D]]) {num_weights, padding_idx} -> dW[num_weights, D]
        dW[v] = base[v] (0 without base) + the grad[i] with idx[i] == v, in index order; the row
        padding_idx (if >= 0) is base's (0); base: a tied embedding's other gradient, summed in by
        the op itself (pass ops.embedding_grad_sum) instead of by an add over the whole table
    gather(x, idx) {dim} -> out[idx.shape]          out[..i..] = x[.. idx[..i..] at dim ..]
    scatter(x, idx, src) {dim} -> out[x.shape]      x with x[.. idx[i] at dim ..] = src[i] (i over idx)
    scatter_add(x, idx, src) {dim} -> out[x.shape]  x with src[i] added at x[.. idx[i] at dim ..]
    index_select(x, idx[n]) {dim} -> out            x's dim replaced by n rows x[.., idx[k], ..]
    index_add(x, idx[n], src) {dim} -> out[x.shape] x with src[.., k, ..] added at x[.., idx[k], ..]

Indices are integer tensors and must be in range (the reference raises otherwise). ``scatter``
with repeated indices is order-dependent in torch and here; the accumulating forms are not.
Each op is one whole-tensor task for the scheduler unless a tiling is given later.
"""

from __future__ import annotations

from latch_core.ir import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType
from latch_core.registry import INDEXING, OpSpec, ShapeError

from .common import attr, check_dim, nbytes, need, spec


def _t():
    import torch

    return torch


def _index(op: str, t: TensorType, what: str = "idx") -> TensorType:
    if t.dtype not in INT_DTYPES:
        raise ShapeError(f"{op}: {what} must be an integer tensor, got {t}")
    return t


def _cost(inputs, outputs, attrs):
    return sum(o.numel for o in outputs), nbytes(list(inputs) + list(outputs))


def _gather_cost(inputs, outputs, attrs):
    """A gather (embedding, gather, index_select) reads one source element per output element, not
    its whole source: out.numel elements of the source, the indices, the output. (Counting the
    whole table made an embedding task of 16 rows of a 49,152-row table cost ~50 us in the
    scheduler's model against ~11 measured on the H200: results/wt.md, interval 0.)"""
    src, idx = inputs[0], inputs[1]
    out = outputs[0]
    read = out.numel * DTYPES[src.dtype] if src is not None else 0
    return out.numel, read + (nbytes([idx]) if idx is not None else 0) + nbytes([out])


def _embedding_infer(inputs, attrs):
    op = "latch::embedding"
    w, idx = need(op, inputs, 0, "weight"), _index(op, need(op, inputs, 1, "idx"))
    if len(w.shape) != 2:
        raise ShapeError(f"{op}: weight must be [V, D], got {w}")
    return [TensorType(tuple(idx.shape) + (w.shape[1],), w.dtype)]


def _embedding_backward_infer(inputs, attrs):
    op = "latch::embedding_backward"
    g, idx = need(op, inputs, 0, "grad"), _index(op, need(op, inputs, 1, "idx"))
    n = attr(op, attrs, "num_weights", int)
    attr(op, attrs, "padding_idx", int, -1)
    if g.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: grad must be float, got {g}")
    if tuple(g.shape[:-1]) != tuple(idx.shape) or not g.shape:
        raise ShapeError(f"{op}: grad {g} must be idx's shape {list(idx.shape)} plus one trailing dim")
    out = TensorType((n, g.shape[-1]), g.dtype)
    if len(inputs) > 2 and inputs[2] is not None and (tuple(inputs[2].shape) != out.shape or inputs[2].dtype != g.dtype):
        raise ShapeError(f"{op}: base {inputs[2]} must be dW's type {out}")
    return [out]


def _embedding_backward_ref(inputs, attrs):
    torch = _t()
    g, idx = inputs[0], inputs[1]
    base = inputs[2] if len(inputs) > 2 else None
    n, pad = attrs["num_weights"], attrs.get("padding_idx", -1)
    out = torch.zeros((n, g.shape[-1]), dtype=g.dtype)
    out = out.index_add(0, idx.reshape(-1), g.reshape(-1, g.shape[-1]))
    if pad is not None and pad >= 0:
        out[pad] = 0
    return [out if base is None else base + out]


def _gather_infer(inputs, attrs):
    op = "latch::gather"
    x, idx = need(op, inputs, 0, "x"), _index(op, need(op, inputs, 1, "idx"))
    dim = check_dim(op, attr(op, attrs, "dim", int), len(x.shape))
    if len(idx.shape) != len(x.shape) or any(i > s for d, (i, s) in enumerate(zip(idx.shape, x.shape)) if d != dim):
        raise ShapeError(f"{op}: idx {idx} must have x's rank and no larger dims than x {x} outside dim {dim}")
    return [TensorType(idx.shape, x.dtype)]


def _scatter_infer_named(op):
    def infer(inputs, attrs):
        x, idx, src = need(op, inputs, 0, "x"), _index(op, need(op, inputs, 1, "idx")), need(op, inputs, 2, "src")
        dim = check_dim(op, attr(op, attrs, "dim", int), len(x.shape))
        if src.dtype != x.dtype:
            raise ShapeError(f"{op}: src {src} must have x's dtype {x.dtype}")
        if not (len(idx.shape) == len(x.shape) == len(src.shape)):
            raise ShapeError(f"{op}: x {x}, idx {idx}, src {src} must have one rank")
        for d in range(len(x.shape)):
            if idx.shape[d] > src.shape[d] or (d != dim and idx.shape[d] > x.shape[d]):
                raise ShapeError(f"{op}: idx {idx} larger than src {src} or x {x} at dim {d}")
        return [x]

    return infer


def _index_select_infer(inputs, attrs):
    op = "latch::index_select"
    x, idx = need(op, inputs, 0, "x"), _index(op, need(op, inputs, 1, "idx"))
    dim = check_dim(op, attr(op, attrs, "dim", int), len(x.shape))
    if len(idx.shape) != 1:
        raise ShapeError(f"{op}: idx must be 1-D, got {idx}")
    shape = list(x.shape)
    shape[dim] = idx.shape[0]
    return [TensorType(shape, x.dtype)]


def _index_add_infer(inputs, attrs):
    op = "latch::index_add"
    x, idx, src = need(op, inputs, 0, "x"), _index(op, need(op, inputs, 1, "idx")), need(op, inputs, 2, "src")
    dim = check_dim(op, attr(op, attrs, "dim", int), len(x.shape))
    if len(idx.shape) != 1:
        raise ShapeError(f"{op}: idx must be 1-D, got {idx}")
    expect = list(x.shape)
    expect[dim] = idx.shape[0]
    if list(src.shape) != expect or src.dtype != x.dtype:
        raise ShapeError(f"{op}: src must be {x.dtype}{expect} (x {x} with dim {dim} of idx's length), got {src}")
    return [x]


def tiling_embedding_backward(in_types, out_types, attrs):
    """dW's rows and columns split; a tile reads every index and, for its columns, every grad row
    (which rows land in the tile is data)."""
    from latch_core.tiling import Tiling

    g = in_types[0]
    lead = tuple((0, s) for s in g.shape[:-1])
    idx = tuple((0, s) for s in in_types[1].shape)

    def footprint(box):
        return [lead + (box[1],), idx] + [box] * (len(in_types) - 2), [box]  # (base: the tile's own box)

    return Tiling((0, 1), footprint, kind="embedding_backward")


SPECS: list[OpSpec] = [
    spec("embedding", "embedding(weight[V,D], idx[*I]) -> out[*I,D]", _embedding_infer,
         lambda i, a: [_t().nn.functional.embedding(i[1], i[0])], tags={INDEXING}, num_inputs=(2, 2), cost=_gather_cost,
         doc="rows of weight picked by idx", torch_ops=("aten.embedding",)),
    spec("embedding_backward",
         "embedding_backward(grad[*I,D], idx[*I], [base[num_weights,D]]) {num_weights, padding_idx=-1} -> dW",
         _embedding_backward_infer, _embedding_backward_ref, tags={INDEXING}, num_inputs=(2, 3), cost=_cost,
         doc="grad rows summed into the rows idx names (onto base, when given)",
         torch_ops=("aten.embedding_dense_backward",)),
    # (its extra["tiling"] is set below the list: dW's rows and columns split)
    spec("gather", "gather(x, idx) {dim} -> out", _gather_infer,
         lambda i, a: [_t().gather(i[0], a["dim"], i[1])], tags={INDEXING}, num_inputs=(2, 2), cost=_gather_cost,
         doc="torch.gather", torch_ops=("aten.gather",)),
    spec("scatter", "scatter(x, idx, src) {dim} -> out", _scatter_infer_named("latch::scatter"),
         lambda i, a: [_t().scatter(i[0], a["dim"], i[1], i[2])], tags={INDEXING}, num_inputs=(3, 3), cost=_cost,
         doc="torch.scatter (src form)", torch_ops=("aten.scatter.src", "aten.scatter.value")),
    spec("scatter_add", "scatter_add(x, idx, src) {dim} -> out", _scatter_infer_named("latch::scatter_add"),
         lambda i, a: [_t().scatter_add(i[0], a["dim"], i[1], i[2])], tags={INDEXING}, num_inputs=(3, 3), cost=_cost,
         doc="torch.scatter_add", torch_ops=("aten.scatter_add",)),
    spec("index_select", "index_select(x, idx[n]) {dim} -> out", _index_select_infer,
         lambda i, a: [_t().index_select(i[0], a["dim"], i[1])], tags={INDEXING}, num_inputs=(2, 2), cost=_gather_cost,
         doc="torch.index_select", torch_ops=("aten.index_select", "aten.index.Tensor (one index)")),
    spec("index_add", "index_add(x, idx[n], src) {dim} -> out", _index_add_infer,
         lambda i, a: [_t().index_add(i[0], a["dim"], i[1], i[2])], tags={INDEXING}, num_inputs=(3, 3), cost=_cost,
         doc="torch.index_add (alpha 1)", torch_ops=("aten.index_add", "aten.index_put (accumulate, one index)")),
]

for _s in SPECS:
    if _s.name == "latch::embedding_backward":
        _s.extra["tiling"] = tiling_embedding_backward
        # dW[v] starts as base[v] (input 2) and only adds to it: the planner may write dW over base's
        # bytes (latch_memory.liveness.self_update_ok); the body then copies nothing
        _s.extra["accumulates_into"] = 2
