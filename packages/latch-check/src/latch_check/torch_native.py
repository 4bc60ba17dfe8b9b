"""PyTorch's own fastest form of the ops a Latch example calls, for the controls and for PyTorch's
own BF16 update (``latch_check.qualify``).

An example's model calls Latch's custom ops (``latch_ops.attention.sdpa``, ``latch_ops.moe``'s
``token_topk``, ``route_order``, ``ragged_mm``) so that capture sees one node each. Their eager
forms are reference formulas: ``sdpa`` is a plain softmax formula, and ``ragged_mm`` reads the
expert offsets on the host (``offsets.tolist()``), a synchronisation no CUDA graph can hold, and
computes in the operands' dtype whatever autocast says (a custom op is not autocast). Inside
:func:`torch_native` those names resolve to:

- ``sdpa`` -> ``F.scaled_dot_product_attention`` (flash on the GPU), its operands cast to the
  autocast dtype when autocast is on (what CUDA autocast does to SDPA; done explicitly so the CPU
  computes the same);
- ``route_order`` -> the same sort by expert, with the per-expert counts by an integer
  ``scatter_add`` instead of ``bincount`` (whose CUDA form reads the maximum on the host);
- ``ragged_mm`` -> :func:`grouped_ragged_mm`, TARGETS.md's graph-safe MoE product: the rows of
  each expert's segment copied into one static buffer of ``rows + 16 * experts`` rows at offsets
  padded to multiples of 16 (computed on the device), ``torch._grouped_mm`` over it (the last
  group absorbs the tail), the rows gathered back. Both gradients are grouped products too
  (``_GroupedMM``): the input gradient over the same groups, the weight gradient K-grouped.
  Under autocast the operands are BF16 (the output BF16, as autocast's ``mm`` gives); without
  autocast it computes in the operands' dtype with a per-expert loop (CPU reference use only).
``token_topk`` keeps its own eager form (a stable sort: no host synchronisation); inside
:func:`recording` every call's chosen experts are kept, in call order, so a check can replay
PyTorch's own routing in the FP64 reference. A model that routes with its own code instead
(transformers' Mixtral: ``torch.topk`` over the router's probabilities, which capture turns into
the program's routing decision) has its ``torch.topk`` calls recorded the same way, in call order,
while inside :func:`torch_native`; a check compares their count with the program's decisions.

Static shapes throughout, no host synchronisation, no float atomics (every scatter is a
permutation or an integer sum): the whole update can be captured in one CUDA graph.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

ALIGN = 16  # rows per group are padded to this (torch._grouped_mm's BF16 alignment)


def native_sdpa(q, k, v, *, causal: bool = True, scale: float | None = None):
    dev = q.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def native_route_order(indices: torch.Tensor, num_experts: int):
    n, k = indices.shape
    flat = indices.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    token = torch.div(order, k, rounding_mode="floor")
    position = torch.empty_like(order).scatter(0, order, torch.arange(n * k, dtype=order.dtype, device=order.device))
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return token, position, offsets


def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


class _GroupedMM(torch.autograd.Function):
    """out = grouped (a [R, d] @ w[g] [d, h]) over row groups ending at ``offs`` (int32, device)."""

    @staticmethod
    def forward(ctx, a, w, offs):
        ctx.save_for_backward(a, w, offs)
        return _grouped(a, w, offs)

    @staticmethod
    def backward(ctx, dy):
        a, w, offs = ctx.saved_tensors
        dy = dy.to(a.dtype).contiguous()
        da = _grouped(dy, w.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
        dw = _grouped(a.t(), dy, offs) if ctx.needs_input_grad[1] else None  # K-grouped: [G, d, h]
        return da, dw, None


def _padded_layout(offsets: torch.Tensor, rows: int, experts: int):
    """(destination row of every input row in the padded buffer, group ends as int32, buffer rows)."""
    offsets = offsets.long()
    counts = offsets[1:] - offsets[:-1]
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    total = rows + ALIGN * experts  # static: every segment padded by < ALIGN rows
    r = torch.arange(rows, device=offsets.device)
    expert = torch.searchsorted(offsets[1:], r, right=True).clamp_(max=experts - 1)
    dest = r - offsets[expert] + starts[expert]
    ends = torch.cat([ends[:-1], ends.new_full((1,), total)]).to(torch.int32)  # the last group absorbs the tail
    return dest, ends, total


def grouped_ragged_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``latch::ragged_mm``'s meaning (rows ``offsets[e]:offsets[e+1]`` of ``x`` times ``w[e]``),
    graph-safe: see the module docstring."""
    rows, experts = x.shape[0], w.shape[0]
    dev = x.device.type
    if not torch.is_autocast_enabled(dev):
        from latch_ops.moe.reference import ragged_mm_math

        return ragged_mm_math(x, w, offsets)  # not on a timed path: the FP32 form needs no graph safety
    dt = torch.get_autocast_dtype(dev)
    with torch.autocast(dev, enabled=False):
        dest, ends, total = _padded_layout(offsets, rows, experts)
        buf = x.new_zeros((total, x.shape[1]), dtype=dt).index_copy(0, dest, x.to(dt))
        out = _GroupedMM.apply(buf, w.to(dt), ends)
        return out.index_select(0, dest)


_SUBSTITUTES = None
_RECORD: list | None = None


@contextlib.contextmanager
def recording():
    """Inside: every substituted ``token_topk`` call appends its expert indices to the yielded list."""
    global _RECORD
    old, _RECORD = _RECORD, []
    try:
        yield _RECORD
    finally:
        _RECORD = old


def _recording_topk(original):
    def token_topk(probs, k):
        values, indices = original(probs, k)
        if _RECORD is not None:
            _RECORD.append(indices.detach())
        return values, indices

    return token_topk


def _substitutes() -> dict:
    global _SUBSTITUTES
    if _SUBSTITUTES is None:
        from latch_ops.attention import sdpa

        subs = {sdpa: native_sdpa}
        try:
            from latch_ops.moe import torch_ops
        except ImportError:  # latch-ops without its MoE ops: nothing to substitute
            torch_ops = None
        if torch_ops is not None:
            subs[torch_ops.route_order] = native_route_order
            subs[torch_ops.ragged_mm] = grouped_ragged_mm
            subs[torch_ops.token_topk] = _recording_topk(torch_ops.token_topk)
        _SUBSTITUTES = subs
    return _SUBSTITUTES


@contextlib.contextmanager
def torch_native(model: torch.nn.Module):
    """While inside: the model's modules that call Latch's ops call PyTorch's own (module docstring).
    Resolved through the globals of each module class's ``forward``, restored on exit."""
    subs = _substitutes()
    patched = []
    for m in model.modules():
        g = getattr(type(m).forward, "__globals__", None)
        if g is None:
            continue
        for name, v in list(g.items()):
            try:
                new = subs.get(v)
            except TypeError:  # unhashable global
                continue
            if new is not None:
                patched.append((g, name, v))
                g[name] = new
    latch_topk = next((k for k, new in subs.items() if new.__name__ == "token_topk"), None)
    own_topk = not any(v is latch_topk for _, _, v in patched)
    topk = torch.topk
    if own_topk:   # the model routes with torch.topk itself: record its choices (module docstring)
        torch.topk = _recording_torch_topk(topk)
    try:
        yield [name for _, name, _ in patched]
    finally:
        torch.topk = topk
        for g, name, v in reversed(patched):
            g[name] = v


def _recording_torch_topk(original):
    def topk(input, k, *args, **kwargs):
        out = original(input, k, *args, **kwargs)
        if _RECORD is not None:
            _RECORD.append(out.indices.detach())
        return out

    return topk


__all__ = ["torch_native", "recording", "grouped_ragged_mm", "native_route_order", "native_sdpa"]
