"""ATen -> Latch: the bookkeeping of MoE dispatch as libraries write it (sort, histc, cumsum).

transformers' default experts implementation (``grouped_mm``) routes like this::

    expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))        # rows in expert order
    tokens_per_expert = torch.histc(expert_ids_g.float(), bins=E, min=0, max=E - 1)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    ... grouped_mm(x[perm // k], w, offs=offsets) ...               # substitute.py: latch::ragged_mm

- **sort** of expert indices, i.e. of a flattened top-k ``indices`` output (through views and
  copies only), is ``latch::route_order`` (a stable sort of the (token, slot) pairs by expert): the
  permutation is the inverse of its ``position`` (one scatter), the sorted ids one gather. A sort of
  anything else is refused: Latch has no general sort.
- **histc** is a comparison against the bin edges and a sum: ``count[b] = sum_i [lo_b <= x_i < hi_b]``
  (the last bin closed), elementwise ops and a reduction, exact for counts.
- **cumsum** along a dim of size n is ``out[.., j] = sum_i x[.., i] [i <= j]``: exact for integers,
  O(n^2) work, meant for the short dims of bookkeeping (experts, not sequence positions).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .lower import Lowerer
from .lower_elementwise import apply_binary

_VIEWS = frozenset({
    "aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.clone", "aten.alias", "aten.detach",
    "aten._to_copy", "aten.contiguous", "aten.lift_fresh_copy",
})
_SORT_HINT = ("Latch sorts only expert indices (a top-k's indices, flattened), as MoE dispatch does; "
              "for other orderings use latch_ops.moe's route_order, or keep the order static")


def _packet(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return str(target)


def _topk_source(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(topk node, its indices getitem) when ``node`` is a view/copy chain of a top-k's indices."""
    import operator

    seen = 0
    while node is not None and seen < 16:
        seen += 1
        if node.op != "call_function":
            return None
        if node.target is operator.getitem:
            src, idx = node.args
            if idx == 1 and isinstance(src, fx.Node) and _packet(src.target) == "aten.topk":
                return src, node
            return None
        if _packet(node.target) not in _VIEWS:
            return None
        node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    return None


def sort(lw: Lowerer, a: dict) -> tuple[str, str]:
    x = a["self"]
    t = lw.type(x)
    if len(t.shape) != 1 or a.get("descending"):
        raise lw.fail(f"sorting a {t}" + (" in descending order" if a.get("descending") else ""), _SORT_HINT)
    found = _topk_source(lw.fx_node.args[0])
    if found is None:
        raise lw.fail("sorting values that are not expert indices", _SORT_HINT)
    topk_node, idx_node = found
    topk_in = topk_node.args[0].meta["val"]
    nd = topk_in.dim()
    dim = (topk_node.args[2] if len(topk_node.args) > 2 else topk_node.kwargs.get("dim", -1)) % nd
    if dim != nd - 1 or idx_node.meta["val"].dim() != 2:
        raise lw.fail("sorting the indices of a top-k that is not over the last dim of a [tokens, experts] tensor",
                      _SORT_HINT)
    experts = int(topk_in.shape[-1])
    indices = lw.env[idx_node]
    _token, position, _offsets = lw.emit("latch::route_order", [indices], {"num_experts": experts})
    S = t.shape[0]
    ar = lw.emit1("latch::arange", [], {"start": 0, "step": 1, "size": S, "dtype": "i64"})
    perm = lw.emit1("latch::scatter", [lw.full((S,), 0, "i64"), position, ar], {"dim": 0})
    flat = lw.cast(lw.reshape(indices, (S,)), t.dtype)
    values = lw.emit1("latch::index_select", [flat, perm], {"dim": 0})
    return values, lw.cast(perm, lw.out_type(1).dtype)


def histc(lw: Lowerer, a: dict) -> str:
    x = a["self"]
    t = lw.type(x)
    bins = int(a.get("bins", 100))
    lo, hi = float(a.get("min", 0) or 0), float(a.get("max", 0) or 0)
    if lo == hi:
        raise lw.fail("histc with min == max (the range taken from the data)",
                      "give histc an explicit range (min < max): a range read from the data is data-dependent")
    n = t.numel
    xf = lw.reshape(x, (n, 1))
    width = (hi - lo) / bins
    edges = torch.tensor([lo + b * width for b in range(bins)], dtype=torch.float64)
    ends = torch.tensor([lo + (b + 1) * width for b in range(bins)], dtype=torch.float64)
    dt = t.dtype
    lo_c = lw.reshape(lw.cast(lw.const("histc_lo", edges.to(_torch_dtype(dt))), dt), (1, bins))
    hi_c = lw.reshape(lw.cast(lw.const("histc_hi", ends.to(_torch_dtype(dt))), dt), (1, bins))
    ge = lw.emit1("latch::ge", [xf, lo_c])
    lt = lw.emit1("latch::lt", [xf, hi_c])
    inside = lw.emit1("latch::logical_and", [ge, lt])
    # the last bin is closed: x == max counts in it
    last = apply_binary(lw, "eq", xf, hi, dt)
    is_last = lw.reshape(lw.const("histc_last", torch.tensor([b == bins - 1 for b in range(bins)])), (1, bins))
    inside = lw.emit1("latch::logical_or", [inside, lw.emit1("latch::logical_and", [last, is_last])])
    counts = lw.emit1("latch::sum", [lw.cast(inside, dt)], {"dims": (0,), "keepdim": False})
    return lw.cast(counts, lw.out_type().dtype)


def _torch_dtype(dt: str):
    from latch_ops.common import torch_dtype

    return torch_dtype(dt)


def cumsum(lw: Lowerer, a: dict) -> str:
    x = a["self"]
    out = lw.out_type()
    t = lw.type(x)
    if not t.shape:
        return lw.cast(x, out.dtype)
    nd = len(t.shape)
    d = int(a["dim"]) % nd
    x = lw.cast(x, out.dtype)
    perm = [i for i in range(nd) if i != d] + [d]
    inv = [perm.index(i) for i in range(nd)]
    xp = lw.permute(x, perm)
    n = t.shape[d]
    lead = tuple(t.shape[i] for i in perm[:-1])
    tri = lw.const("cumsum_upto", torch.ones(n, n, dtype=torch.bool).triu())  # [i, j]: i <= j
    terms = lw.emit1("latch::mul", [lw.reshape(xp, lead + (n, 1)), lw.cast(tri, out.dtype)])
    s = lw.emit1("latch::sum", [terms], {"dims": (len(lead),), "keepdim": False})
    return lw.permute(lw.cast(s, out.dtype), inv)


def TABLE() -> dict:
    return {
        "aten.sort.default": sort,
        "aten.sort.stable": sort,
        "aten.histc": histc,
        "aten.cumsum": cumsum,
    }
