"""Contiguous views: view ops whose output IS a contiguous byte range of their operand.

Every value of the IR is a row-major tensor of its own (no strides), so a view op defines its
output by index arithmetic. For some views that arithmetic is the identity on flat indices plus a
constant: output element ``i`` (row-major) is operand element ``offset + i``. Such a view needs no
code and no bytes: its output can be read at the operand's storage plus ``offset`` elements. That
is what :func:`contiguous_offset` decides, from the op, its attributes and the two shapes:

- ``latch::reshape`` (view, flatten, squeeze, unsqueeze): always, offset 0;
- ``latch::select {dim, index}``: when every dim before ``dim`` has size 1 (a leading-dims
  select), offset ``index * prod(shape[dim+1:])``; a select of a size-1 dim is a squeeze;
- ``latch::slice {dim, start, end, step}``: when every dim before ``dim`` has size 1 and the slice
  is a run (step 1, or one element), offset ``start * prod(shape[dim+1:])``; a full slice is the
  identity wherever it is;
- ``latch::permute {perm}``: when it only moves size-1 dims (the other dims keep their order);
- ``latch::expand {shape}``: when it adds or keeps only size-1 dims (no element repeats).

Anything else (a transposing permute, a slice along an inner dim, a broadcasting expand) is not a
contiguous range and returns ``None``. latch-schedule's fusion folds contiguous views into the
operand addressing of the group that reads them (``latch_schedule.fusion``: *alias prefixes*), and
latch-codegen-h100 points that group's operand at the operand's placement plus the byte offset.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

ALIAS_OPS = frozenset({"latch::reshape", "latch::select", "latch::slice", "latch::permute", "latch::expand"})


def contiguous_offset(op: str, attrs: Mapping[str, Any], in_shape: Sequence[int],
                      out_shape: Sequence[int]) -> int | None:
    """The element offset at which ``op``'s output is a contiguous run of its operand, else None."""
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    if op not in ALIAS_OPS or math.prod(in_shape) < math.prod(out_shape):
        return None
    n_out = math.prod(out_shape)
    if op == "latch::reshape":
        return 0 if math.prod(in_shape) == n_out else None
    if op in ("latch::permute", "latch::expand"):
        if math.prod(in_shape) != n_out:
            return None
        if op == "latch::permute":
            perm = attrs.get("perm")
            if not isinstance(perm, (tuple, list)) or sorted(perm) != list(range(len(in_shape))):
                return None
            moved = [p for p in perm if in_shape[p] != 1]
            return 0 if moved == sorted(moved) else None
        return 0  # same element count: only size-1 dims were added or kept
    dim = attrs.get("dim")
    if not isinstance(dim, int) or not 0 <= dim < len(in_shape):
        return None
    inner = math.prod(in_shape[dim + 1:])
    lead = math.prod(in_shape[:dim])
    if op == "latch::select":
        index = attrs.get("index")
        if not isinstance(index, int) or not 0 <= index < in_shape[dim]:
            return None
        if in_shape[dim] == 1:
            return 0  # a squeeze
        return index * inner if lead == 1 else None
    start, end, step = attrs.get("start"), attrs.get("end"), attrs.get("step")
    if not all(isinstance(x, int) for x in (start, end, step)) or step < 1:
        return None
    length = (end - start + step - 1) // step if end > start else 0
    if start == 0 and length == in_shape[dim]:
        return 0  # the whole dim (a step beyond it takes one element): the identity
    if lead != 1 or (step != 1 and length > 1):
        return None
    return start * inner


ALIAS_ALIGNMENT = 256  # bytes: an alias starts where an arena value could (bodies load 16-byte vectors, TMA)


def alias_byte_offset(node, graph) -> int | None:
    """The byte offset of ``node``'s output inside its operand's storage when ``node`` is a
    contiguous view usable as an alias (a single operand, the offset a multiple of
    :data:`ALIAS_ALIGNMENT`), else None."""
    ins = [v for v in node.inputs if v is not None]
    if len(ins) != 1 or len(node.outputs) != 1:
        return None
    x, out = graph.value(ins[0]), graph.value(node.outputs[0])
    if x.dtype != out.dtype:
        return None
    off = contiguous_offset(node.op, node.attr_dict, x.shape, out.shape)
    if off is None:
        return None
    nbytes = off * (x.nbytes // max(1, x.numel)) if x.numel else 0
    return nbytes if nbytes % ALIAS_ALIGNMENT == 0 else None


def alias_prefixes(graph, node_names, fusable, leaving=()) -> dict[str, tuple[str, int]]:
    """The *alias prefix* of a fusion group: ``{view output: (storage value, byte offset)}``.

    A node of the group is in its alias prefix when it is a contiguous view
    (:func:`alias_byte_offset`), its output is not a program output, its operand comes from
    outside the group or from another prefix node, and every node of the group reading its output
    is a prefix node too or is not ``fusable`` (pointwise or a fusable view: the fused generator
    inlines those views itself, so they stay as they are). The group's body reads a prefix output
    directly at the storage value's placement plus the byte offset; prefix nodes compute nothing.
    One rule for the scheduler's fusion (latch_schedule.fusion) and the code generator (which
    strips the prefix), so both agree on which views are addresses. ``fusable(node) -> bool``;
    ``node_names``: the group's node names, or its nodes themselves in graph order (cheaper);
    ``leaving``: the group's outputs (values other groups read: never prefixes)."""
    leaving = set(leaving)
    node_names = list(node_names)
    if node_names and not isinstance(node_names[0], str):
        nodes = node_names
    else:
        names = set(node_names)
        nodes = [n for n in graph.nodes if n.name in names]  # graph order
    produced = {o for n in nodes for o in n.outputs}
    readers: dict[str, list] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None:
                readers.setdefault(v, []).append(n)
    outputs = set(graph.output_names())
    cand: dict[str, tuple[str, int]] = {}  # view output -> (its operand, own byte offset)
    for n in nodes:
        off = alias_byte_offset(n, graph)
        # a prefix is read inside the group and nowhere else: a view no node of the group reads
        # (a group of views alone, whose output other groups read) is a copy, not an address
        if off is not None and n.outputs[0] not in outputs and n.outputs[0] not in leaving and readers.get(n.outputs[0]):
            cand[n.outputs[0]] = (next(v for v in n.inputs if v is not None), off)
    changed = True
    while changed:  # drop candidates until the rule holds for every one left
        changed = False
        for v in list(cand):
            x = cand[v][0]
            if (x in produced and x not in cand) or any(
                    r.outputs[0] not in cand and fusable(r) for r in readers.get(v, ())):
                del cand[v]
                changed = True
    out: dict[str, tuple[str, int]] = {}
    for n in nodes:  # graph order: an operand's entry exists before its readers'
        v = n.outputs[0] if n.outputs else None
        if v in cand:
            x, off = cand[v]
            base, base_off = out.get(x, (x, 0))
            out[v] = (base, base_off + off)
    return out
