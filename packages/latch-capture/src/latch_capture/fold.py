"""Folding: traced ops whose operands are all known at capture time are computed now, not captured.

Library code builds positions, masks and bookkeeping from ``torch.arange`` and friends:
transformers makes ``cache_position``/``position_ids`` with arange, the causal mask from index
comparisons, and under export-style tracing its packed-sequence ids with ``diff`` and ``cumsum``.
None of that depends on the batch, and some of it (cumsum, several-index gathers) has no Latch
lowering. So a traced op is folded (run on real CPU tensors during lowering, its result a known
value of the Lowerer) when every tensor operand is known and the result is exact whatever float
width later runs the program:

- every result is an integer or bool tensor (positions, ids, masks), or
- the op only selects, moves or broadcasts elements, or fills literals that the result's dtype
  holds exactly (``where(mask, 0.0, -inf)``, expand, cat, views), so the FP64 reference and an
  FP32 program would compute the same numbers.

Float arithmetic on known values (``arange(..).float() * inv_freq``) is NOT folded: done here in
FP32 it would round where the FP64 reference does not. Random ops are never folded. A known value
reaches the graph only when a node reads it (``Lowerer.resolve``); a lowering may inspect it first
(``Lowerer.known_value``), e.g. attention recognises a causal mask and drops it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from .lower import Lowerer, packet_key

# Ops whose float results are exact given exact operands: selection, movement, broadcast, literals.
EXACT = frozenset({
    "aten.where", "aten.masked_fill", "aten.expand", "aten.view", "aten._unsafe_view", "aten.reshape",
    "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.transpose", "aten.t", "aten.slice", "aten.select",
    "aten.alias", "aten.clone", "aten.detach", "aten.lift_fresh_copy", "aten.lift_fresh", "aten.cat", "aten.stack",
    "aten.index", "aten.index_select", "aten.gather", "aten.full", "aten.full_like", "aten.zeros", "aten.zeros_like",
    "aten.ones", "aten.ones_like", "aten.new_zeros", "aten.new_ones", "aten.new_full", "aten.scalar_tensor",
    "aten.fill", "aten.constant_pad_nd", "aten.copy", "aten.flatten", "aten.split", "aten.split_with_sizes",
    "aten.unbind", "aten.empty", "aten.empty_like", "aten.new_empty", "aten.empty_strided", "aten.neg",
    "aten.maximum", "aten.minimum", "aten.clamp", "aten.clamp_min", "aten.clamp_max",
})
# Creations whose data torch leaves uninitialised: the lowering treats them as zeros, so does folding.
_EMPTY = frozenset({"aten.empty", "aten.empty_like", "aten.new_empty", "aten.empty_strided"})


def _tensor_nodes(a: Any, out: list) -> None:
    if isinstance(a, fx.Node):
        out.append(a)
    elif isinstance(a, (list, tuple)):
        for x in a:
            _tensor_nodes(x, out)
    elif isinstance(a, dict):
        for x in a.values():
            _tensor_nodes(x, out)


def _results(val: Any) -> list | None:
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    return vals


def _float_scalars_exact(args: Any, dtypes: set) -> bool:
    """Every Python float among ``args`` is held exactly by every float result dtype."""
    todo = [args]
    while todo:
        a = todo.pop()
        if isinstance(a, (list, tuple)):
            todo.extend(a)
        elif isinstance(a, dict):
            todo.extend(a.values())
        elif isinstance(a, float):
            for dt in dtypes:
                if float(torch.tensor(a, dtype=dt).item()) != a and a == a:
                    return False
    return True


def try_fold(lw: Lowerer, node: fx.Node) -> Any:
    """The folded result(s) of ``node`` as known values, or None when it is not foldable."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    if torch.Tag.nondeterministic_seeded in target.tags:
        return None
    vals = _results(node.meta.get("val"))
    if not vals:
        return None
    deps: list[fx.Node] = []
    _tensor_nodes((node.args, node.kwargs), deps)
    names = []
    for d in deps:
        v = lw.env.get(d)
        if not isinstance(v, str) or lw.known_value(v) is None:
            return None
        names.append(v)
    packet = packet_key(target)
    float_dtypes = {v.dtype for v in vals if v.is_floating_point() or v.is_complex()}
    if float_dtypes and (packet not in EXACT or not _float_scalars_exact((node.args, node.kwargs), float_dtypes)):
        return None
    data = {d: lw.known_value(n) for d, n in zip(deps, names)}

    def sub(a):
        if isinstance(a, fx.Node):
            return data[a]
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        if isinstance(a, dict):
            return {k: sub(x) for k, x in a.items()}
        return a

    try:
        with torch.no_grad():
            out = target(*sub(node.args), **sub(node.kwargs))
    except Exception:  # not computable here (an op needing another device, ...): lower it instead
        return None
    outs = _results(out)
    if outs is None or len(outs) != len(vals) or any(o.device.type == "meta" for o in outs):
        return None
    if packet in _EMPTY:
        outs = [torch.zeros_like(o) for o in outs]
    refs = [lw.fold(node.name, o.detach()) for o in outs]
    return tuple(refs) if isinstance(node.meta.get("val"), (list, tuple)) else refs[0]
