"""``latch::gather_sum``: each output row the sum of k gathered rows, in slot order.

    gather_sum(src[R, *D], index[N*k], base[N, *D]?) {k} -> out[N, *D]
        out[n] = base[n] + src[index[n*k]] + src[index[n*k + 1]] + ... + src[index[n*k + k - 1]]

summed from zero (or from base's row) in slot order, in the accumulator ``latch::sum`` uses for the dtype (double for
float32 and narrower floats), then rounded once: the same bits as
``sum(reshape(index_select(src, 0, index), [N, k, *D]), dims=[1])``, which it replaces in
``moe.fixed_order_scatters`` (the gradient of the MoE dispatch back to tokens). The fused form never
writes the N*k gathered rows: at TinyMoE-200M's 32 x 1024 tokens that is 201 MB written and read back
per layer (FP32 rows of 768), and one phase. With ``base`` (``latch_ops.fold.fold_adds``: the residual stream's
gradient added to the dispatch's) the add and its phase go too; the sum then starts from base's
row, one rounding instead of two. No torch at import; the reference imports it lazily.
"""

from __future__ import annotations

from typing import Any, Sequence

from latch_core.ir import INT_DTYPES, TensorType
from latch_core.registry import INDEXING, OpSpec, ShapeError

from . import specs

GATHER_SUM = "latch::gather_sum"


def infer_gather_sum(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    src, index, *rest = inputs
    if src is None or len(src.shape) < 1:
        raise ShapeError(f"{GATHER_SUM}: src must be a tensor of rows [R, ...], got {src}")
    index = specs._need(GATHER_SUM, "index", index, 1, INT_DTYPES, "[N*k] row indices")
    k = specs._int_attr(GATHER_SUM, attrs, "k", 1)
    if index.shape[0] % k:
        raise ShapeError(f"{GATHER_SUM}: index has {index.shape[0]} entries, not a multiple of k={k}")
    out = TensorType((index.shape[0] // k,) + tuple(src.shape[1:]), src.dtype)
    base = rest[0] if rest else None
    if base is not None and base != out:
        raise ShapeError(f"{GATHER_SUM}: base must be {out} (the result's type), got {base}")
    return [out]


def cost_gather_sum(inputs, outputs, attrs):
    src, index, *rest = inputs
    row = src.nbytes // max(1, src.shape[0])  # each index reads one row of src
    base = sum(t.nbytes for t in rest if t is not None)
    return outputs[0].numel * int(attrs["k"]), index.shape[0] * row + index.nbytes + base + outputs[0].nbytes


def tiling_gather_sum(in_types, out_types, attrs):
    from latch_core.tiling import Tiling

    src, index, *base = in_types
    k = int(attrs["k"])

    def footprint(box):  # the rows a tile reads are data: every row of src
        (r0, r1), *_ = box
        return [tuple((0, d) for d in src.shape), ((r0 * k, r1 * k),)] + [box for b in base if b is not None], [box]

    return Tiling((0,), footprint, granule=(0,), kind="gather_sum")


def _ref(inputs, attrs):
    import torch

    src, index, *rest = inputs
    base = rest[0] if rest else None
    k = int(attrs["k"])
    idx = index.reshape(-1).long()
    bad = (idx < 0) | (idx >= src.shape[0])
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{GATHER_SUM}: index[{i}] = {int(idx[i])} is not a row of src (it has {src.shape[0]})")
    rows = src.index_select(0, idx).reshape((idx.shape[0] // k, k) + tuple(src.shape[1:]))
    wide = rows.is_floating_point() and rows.dtype in (torch.float32, torch.bfloat16, torch.float16)
    acc = rows.double() if wide else rows
    total = torch.zeros_like(acc[:, 0]) if base is None else (base.double() if wide else base).clone()
    for s in range(k):  # from zero (or base) in slot order, as the body adds
        total = total + acc[:, s]
    return [total.to(src.dtype)]


SPECS = [
    OpSpec(
        name=GATHER_SUM,
        signature="gather_sum(src[R,*D], index[N*k], base[N,*D]?) {k: int} -> out[N,*D]",
        infer=infer_gather_sum, tags={INDEXING}, num_inputs=(2, 3), cost=cost_gather_sum,
        doc="out[n] = base[n] (or zero) plus src's rows index[n*k .. n*k+k-1], in that order (a gather and a "
            "fixed-order sum)",
        extra={"reference": _ref, "tiling": tiling_gather_sum},
    ),
]
