"""``latch::gather_sum``: each output row the sum of k gathered rows, in slot order.

    gather_sum(src[R, *D], index[N*k]) {k} -> out[N, *D]
        out[n] = src[index[n*k]] + src[index[n*k + 1]] + ... + src[index[n*k + k - 1]]

summed from zero in slot order, in the accumulator ``latch::sum`` uses for the dtype (double for
float32 and narrower floats), then rounded once: the same bits as
``sum(reshape(index_select(src, 0, index), [N, k, *D]), dims=[1])``, which it replaces in
``moe.fixed_order_scatters`` (the gradient of the MoE dispatch back to tokens). The fused form never
writes the N*k gathered rows: at TinyMoE-200M's 32 x 1024 tokens that is 201 MB written and read back
per layer (FP32 rows of 768), and one phase. No torch at import; the reference imports it lazily.
"""

from __future__ import annotations

from typing import Any, Sequence

from latch_core.ir import INT_DTYPES, TensorType
from latch_core.registry import INDEXING, OpSpec, ShapeError

from . import specs

GATHER_SUM = "latch::gather_sum"


def infer_gather_sum(inputs: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType]:
    src, index = inputs
    if src is None or len(src.shape) < 1:
        raise ShapeError(f"{GATHER_SUM}: src must be a tensor of rows [R, ...], got {src}")
    index = specs._need(GATHER_SUM, "index", index, 1, INT_DTYPES, "[N*k] row indices")
    k = specs._int_attr(GATHER_SUM, attrs, "k", 1)
    if index.shape[0] % k:
        raise ShapeError(f"{GATHER_SUM}: index has {index.shape[0]} entries, not a multiple of k={k}")
    return [TensorType((index.shape[0] // k,) + tuple(src.shape[1:]), src.dtype)]


def cost_gather_sum(inputs, outputs, attrs):
    src, index = inputs
    row = src.nbytes // max(1, src.shape[0])  # each index reads one row of src
    return outputs[0].numel * int(attrs["k"]), index.shape[0] * row + index.nbytes + outputs[0].nbytes


def tiling_gather_sum(in_types, out_types, attrs):
    from latch_core.tiling import Tiling

    src, index = in_types
    k = int(attrs["k"])

    def footprint(box):  # the rows a tile reads are data: every row of src
        (r0, r1), *rest = box
        return [tuple((0, d) for d in src.shape), ((r0 * k, r1 * k),)], [box]

    return Tiling((0,), footprint, granule=(0,), kind="gather_sum")


def _ref(inputs, attrs):
    import torch

    src, index = inputs
    k = int(attrs["k"])
    idx = index.reshape(-1).long()
    bad = (idx < 0) | (idx >= src.shape[0])
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{GATHER_SUM}: index[{i}] = {int(idx[i])} is not a row of src (it has {src.shape[0]})")
    rows = src.index_select(0, idx).reshape((idx.shape[0] // k, k) + tuple(src.shape[1:]))
    if rows.is_floating_point() and rows.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return [rows.double().sum(1).to(src.dtype)]
    return [rows.sum(1)]


SPECS = [
    OpSpec(
        name=GATHER_SUM,
        signature="gather_sum(src[R,*D], index[N*k]) {k: int} -> out[N,*D]",
        infer=infer_gather_sum, tags={INDEXING}, num_inputs=(2, 2), cost=cost_gather_sum,
        doc="out[n] = the sum of src's rows index[n*k .. n*k+k-1], in that order (a gather and a fixed-order sum)",
        extra={"reference": _ref, "tiling": tiling_gather_sum},
    ),
]
