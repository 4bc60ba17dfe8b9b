"""Library calls capture replaces while it traces, because their own autograd cannot be traced.

A substitute computes the same function through Latch's ops, so the trace records Latch's forward
and Latch's derivative. The eager FP64 check runs the library's own code, so a substitute is
checked against the original on every ``latch-pipeline check``.

- grouped matrix products: transformers' MoE ``grouped_mm`` dispatch calls
  ``torch.nn.functional.grouped_mm`` / ``torch._grouped_mm`` (whose fake kernels take BF16 only)
  or, for other dtypes under export-style tracing, its custom op ``transformers::grouped_mm_fallback``,
  whose backward loops over ``offs.tolist()``. All three compute ``out[r] = x[r] @ w[e]`` for the
  rows ``offs[e-1] <= r < offs[e]`` (cumulative group ends, first start 0; rows past the last end
  are zero): exactly ``latch::ragged_mm`` with ``offsets = [0, *offs]``.
"""

from __future__ import annotations

from typing import Callable

import torch


def _grouped_mm(input, weight, offs=None, *args, **kwargs):
    from latch_ops.moe.torch_ops import ragged_mm

    bias = kwargs.pop("bias", None) if kwargs else None
    out_dtype = kwargs.pop("out_dtype", None) if kwargs else None
    if args or kwargs or bias is not None or input.dim() != 2 or weight.dim() != 3 or offs is None:
        return None  # a form ragged_mm does not cover: let torch trace it (and say what fails)
    offsets = torch.cat([offs.new_zeros(1), offs]).to(torch.int64)
    out = ragged_mm(input.to(weight.dtype), weight, offsets)
    return out if out_dtype is None else out.to(out_dtype)


def _grouped_mm_loop(input, weight, offs=None, *args, **kwargs):
    """The grouped product as a plain loop over the groups, at any float width: what the eager FP64
    check runs where torch's grouped_mm kernel takes no float64 (it is independent of ragged_mm)."""
    if args or kwargs.get("bias") is not None or input.dim() != 2 or weight.dim() != 3 or offs is None:
        return None
    out = input.new_zeros((input.shape[0], weight.shape[2]), dtype=weight.dtype)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = input[start:end].to(weight.dtype) @ weight[e]
        start = end
    dt = kwargs.get("out_dtype")
    return out if dt is None else out.to(dt)


def _table(fn: Callable) -> dict[Callable, Callable]:
    table: dict[Callable, Callable] = {}
    for f in (getattr(torch.nn.functional, "grouped_mm", None), getattr(torch, "_grouped_mm", None),
              getattr(torch.ops.aten, "_grouped_mm", None)):
        if f is not None:
            table[f] = fn
            if getattr(f, "default", None) is not None:
                table[f.default] = fn
    return table


def eager_substitutes() -> dict[Callable, Callable]:
    """Replacements for the eager FP64 check: torch kernels without a float64 form."""
    return _table(_grouped_mm_loop)


def substitutes() -> dict[Callable, Callable]:
    """{torch callable as a TorchFunctionMode sees it: replacement}; a replacement returning None
    declines (the original call runs)."""
    table = _table(_grouped_mm)
    ns = getattr(torch.ops, "transformers", None)
    try:
        fallback = ns.grouped_mm_fallback if ns is not None else None
    except AttributeError:
        fallback = None
    if fallback is not None:
        table[fallback] = _grouped_mm
        table[fallback.default] = _grouped_mm
    return table
