"""The MoE ops in plain torch: the custom ops' real implementation and the FP64 reference.

Semantics are documented in ``latch_ops.moe.specs``. Every function is pure (fresh outputs, inputs
untouched) and works at any float dtype; half-precision products accumulate in f32. Routing data
that breaks an op's contract (an expert index out of range, offsets that are not a partition of the
rows) raises ValueError naming the op, the operand and the first bad entry.
"""

from __future__ import annotations

import torch


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def token_topk_math(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # A stable descending sort fixes the tie order (lower expert index first); topk does not.
    values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
    return values[:, :k].contiguous(), indices[:, :k].contiguous()


def token_topk_backward_math(grad_values: torch.Tensor, indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    zeros = grad_values.new_zeros((grad_values.shape[0], num_experts))
    # Indices within a row are distinct, so scatter (not scatter-add) is exact.
    return zeros.scatter(1, indices.long(), grad_values)


def _check_experts(indices: torch.Tensor, num_experts: int) -> None:
    bad = (indices < 0) | (indices >= num_experts)
    if bool(bad.any()):
        pos = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"latch::route_order: indices{list(pos)} = {int(indices[pos])} is not an expert index in "
            f"[0, {num_experts}); check the router's num_experts"
        )


def route_order_math(indices: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_experts(indices, num_experts)
    n, k = indices.shape
    flat = indices.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices  # sorted row r holds pair order[r] = n*k + s
    token = torch.div(order, k, rounding_mode="floor")
    position = torch.empty_like(order).scatter(0, order, torch.arange(n * k, dtype=order.dtype, device=order.device))
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return token.contiguous(), position.contiguous(), offsets.contiguous()


def _segments(op: str, offsets: torch.Tensor, rows: int) -> list[tuple[int, int, int]]:
    """(expert, lo, hi) of the non-empty segments, after checking offsets partition [o0, oE] in [0, rows]."""
    off = [int(v) for v in offsets.tolist()]
    for e in range(len(off) - 1):
        if off[e] > off[e + 1]:
            raise ValueError(f"{op}: offsets must be non-decreasing, but offsets[{e}] = {off[e]} > "
                             f"offsets[{e + 1}] = {off[e + 1]}")
    if off and (off[0] < 0 or off[-1] > rows):
        raise ValueError(f"{op}: offsets must lie in [0, {rows}] (the rows of x), got first {off[0]}, last {off[-1]}")
    return [(e, off[e], off[e + 1]) for e in range(len(off) - 1) if off[e + 1] > off[e]]


def ragged_mm_math(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    cd = _compute_dtype(x)
    out = torch.zeros((x.shape[0], w.shape[2]), dtype=cd, device=x.device)
    for e, lo, hi in _segments("latch::ragged_mm", offsets, x.shape[0]):
        out[lo:hi] = x[lo:hi].to(cd) @ w[e].to(cd)
    return out.to(x.dtype)


def ragged_mm_grad_x_math(grad: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    cd = _compute_dtype(grad)
    dx = torch.zeros((grad.shape[0], w.shape[1]), dtype=cd, device=grad.device)
    for e, lo, hi in _segments("latch::ragged_mm_grad_x", offsets, grad.shape[0]):
        dx[lo:hi] = grad[lo:hi].to(cd) @ w[e].to(cd).transpose(0, 1)
    return dx.to(grad.dtype)


def ragged_mm_grad_w_math(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    cd = _compute_dtype(x)
    dw = torch.zeros((offsets.shape[0] - 1, x.shape[1], grad.shape[1]), dtype=cd, device=x.device)
    for e, lo, hi in _segments("latch::ragged_mm_grad_w", offsets, x.shape[0]):
        dw[e] = x[lo:hi].to(cd).transpose(0, 1) @ grad[lo:hi].to(cd)
    return dw.to(x.dtype)


# ---- route_order over many SMs (route_split): the same sort from per-chunk counts

def _chunks(n_pairs: int, chunk: int) -> int:
    return -(-n_pairs // chunk)


def route_count_math(indices: torch.Tensor, num_experts: int, chunk: int) -> torch.Tensor:
    """counts[c, e]: the pairs of expert e among the flat pairs [c * chunk, (c + 1) * chunk), int32."""
    _check_experts(indices, num_experts)
    flat = indices.reshape(-1).long()
    c = torch.div(torch.arange(flat.numel(), device=flat.device), chunk, rounding_mode="floor")
    C = _chunks(flat.numel(), chunk)
    counts = torch.zeros(C * num_experts, dtype=torch.int64, device=flat.device)
    counts.index_add_(0, c * num_experts + flat, torch.ones_like(flat))
    return counts.view(C, num_experts).to(torch.int32)


def _bases(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets[E + 1], before[C, E]): expert e's first sorted row, and its pairs in the chunks before c."""
    counts = counts.long()
    tot = counts.sum(0)
    offsets = torch.cat([tot.new_zeros(1), torch.cumsum(tot, 0)])
    before = torch.cumsum(counts, 0) - counts
    return offsets, before


def route_place_math(indices: torch.Tensor, counts: torch.Tensor, num_experts: int, chunk: int) -> torch.Tensor:
    """position[p]: the sorted row of pair p, from its chunk's own pairs and the counts only (what
    one task of route_place reads): offsets[e] + the pairs of e in earlier chunks + its rank in
    its chunk among the pairs of e."""
    _check_experts(indices, num_experts)
    flat = indices.reshape(-1).long()
    P = flat.numel()
    c = torch.div(torch.arange(P, device=flat.device), chunk, rounding_mode="floor")
    key = c * num_experts + flat
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    start = torch.searchsorted(sorted_key, sorted_key, right=False)  # first slot of each key group
    rank = torch.empty_like(order)
    rank[order] = torch.arange(P, device=flat.device) - start
    offsets, before = _bases(counts)
    return offsets[flat] + before[c, flat] + rank


def route_rows_math(indices: torch.Tensor, counts: torch.Tensor, num_experts: int, chunk: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token[r], pairs[r]): the source token and the pair of sorted row r (pairs is position's inverse)."""
    _check_experts(indices, num_experts)
    k = indices.shape[1]
    pairs = torch.sort(indices.reshape(-1).long(), stable=True).indices
    return torch.div(pairs, k, rounding_mode="floor").contiguous(), pairs.contiguous()


def route_offsets_math(counts: torch.Tensor) -> torch.Tensor:
    return _bases(counts)[0]
