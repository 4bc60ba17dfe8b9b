"""Row groups: a row reduction, the chain on its per-row statistic, and their broadcast consumer in ONE group.

RMSNorm's forward is ``x * rsqrt(mean(x * x, -1, keepdim) + eps) * w``: the plain fusion rules
(:mod:`latch_schedule.fusion`) end a group at the reduction's ``(T, 1)`` output, so the mean reads
x, the ``(T, 1)`` chain is a phase of a few tasks of its own, and the scale reads x again. Its
backward (``dx = r * (dy * w) - x * r^3 * mean(dy * w * x)``) has the same shape with a product
inside the reduction. The rule here merges, after the plain rules:

- a *row reduction* B (``latch::sum`` / ``latch::mean`` over the innermost dim only, ``keepdim``,
  a float input of row length ``R`` with ``R % 4 == 0`` and ``R <= ROW_GROUP_MAX_ROW``), with the
  prologue fusion already gave it;
- the *statistic groups* on the path from B's output to the consumer: groups of pointwise nodes
  whose every output has B's output shape ``S = x.shape[:-1] + (1,)`` (``add eps``, ``rsqrt``,
  ``r ** 3 * s * -0.5``);
- the *consumer* G: the earliest group (by its sink) that reads a statistic through a broadcast
  along the innermost dim and whose primary output has x's row count and row length (the
  ``x * r * w`` scale and what fusion already chained after it: reshapes, the BF16 cast);
- then, repeatedly, pointwise groups all of whose readers are in the row group (the backward's
  ``dy * w``, read by both the reduction's prologue and the consumer), so dy is read once.

The merged group runs at G's sink. It is legal when every reader of a moved value outside the
merged group belongs to a group whose sink comes after G's (groups run in the order of their
sinks): then nothing needs a moved value before it exists, and no path leaves the group and comes
back (such a path passes through a group between, which would read a moved value earlier). A
statistic that is read outside (RMSNorm's ``r``, saved for the backward) stays a group output of
shape ``S``, written once per row; the other statistics never reach memory.

Every value of a row group is one of four classes (``latch_core.rowclass.value_class``), which is all the row
body needs (latch-codegen-h100 ``lower_rowgroup.py``): FULL (x's element count and row length:
element ``(row, j)`` at ``row * R + j``), ROWVEC (``R`` elements along the innermost dim: the
weight), STAT (one element per row: ``S``'s count, innermost extent 1) and SCALAR. Nodes allowed:
the reductions above (FULL -> STAT), pointwise ops (FULL from FULL, ROWVEC, STAT, SCALAR operands,
with STAT operands broadcast along the innermost dim only; STAT from STAT and SCALAR), contiguous
reshapes that keep the class, and ``latch::expand`` of a STAT value along the innermost dim.
Anything else leaves the reduction's groups as they were (:func:`row_group_ok` says why).

A task of a row group covers whole rows (the scheduler's tiling splits every dim but the
innermost: ``GroupPlan.row``); its body reads every FULL input once, holds the row in registers,
computes each statistic in a fixed order (the same bits on every run) and writes the consumer's
outputs in the same pass. Costed by bytes: each merge removes at least one read of x (and the
statistic's write and reads); ``ROW_GROUP_MAX_ROW`` bounds the registers a row takes
(2048 FP32 elements: 16 groups of four per lane and FULL input).
"""

from __future__ import annotations

import math

from latch_core.ir import Graph, Node
from latch_core.rowclass import FULL, ROWVEC, SCALAR, STAT, value_class  # noqa: F401 (re-exported)

ROW_REDUCTIONS = frozenset({"latch::sum", "latch::mean"})
ROW_GROUP_MAX_ROW = 2048  # elements of one row (the body holds a row per warp in registers)
FLOAT_DTYPES = frozenset({"f32", "bf16", "f16"})
STAT_VIEWS = frozenset({"latch::reshape", "latch::expand"})


def _dims(n: Node, rank: int) -> tuple[int, ...]:
    d = n.attr_dict.get("dims")
    if d is None:
        return tuple(range(rank))
    d = d if isinstance(d, (tuple, list)) else (d,)
    return tuple(sorted({int(k) % rank for k in d}))


def is_row_reduction(graph: Graph, n: Node, reductions=ROW_REDUCTIONS) -> bool:
    """A reduction the row body computes: sum/mean over the innermost dim only, keepdim, a float
    input whose rows are a multiple of four and at most ROW_GROUP_MAX_ROW long."""
    if n.op not in reductions or len(n.outputs) != 1 or len([v for v in n.inputs if v is not None]) != 1:
        return False
    x = graph.value(n.inputs[0])
    rank = len(x.shape)
    if rank < 2 or x.dtype not in FLOAT_DTYPES or not bool(n.attr_dict.get("keepdim", False)):
        return False
    R = x.shape[-1]
    if _dims(n, rank) != (rank - 1,) or R % 4 or R > ROW_GROUP_MAX_ROW or math.prod(x.shape) < R:
        return False
    return tuple(graph.value(n.outputs[0]).shape) == tuple(x.shape[:-1]) + (1,)


def row_group_ok(graph: Graph, nodes, pointwise: set[str], rows: int, R: int,
                 reductions=ROW_REDUCTIONS) -> str | None:
    """None when the row body can compute ``nodes`` (module docstring), else the reason."""
    for n in nodes:
        if len(n.outputs) != 1:
            return f"{n.name} has {len(n.outputs)} outputs"
        out = graph.value(n.outputs[0])
        oc = value_class(out.shape, rows, R)
        ins = [graph.value(v) for v in n.inputs if v is not None]
        ics = [value_class(v.shape, rows, R) for v in ins]
        if n.op in reductions:
            if not is_row_reduction(graph, n, reductions) or ics != [FULL] or oc != STAT:
                return f"{n.name}: not a row reduction of the group's rows"
            continue
        if n.op == "latch::reshape":
            if oc not in (FULL, STAT) or ics != [oc] or (oc == FULL and ins[0].shape[-1] != R):
                return f"{n.name}: a reshape that does not keep the rows"
            continue
        if n.op == "latch::expand":
            if ics != [STAT] or oc != FULL or tuple(out.shape[:-1]) != tuple(ins[0].shape[:-1]):
                return f"{n.name}: an expand other than a statistic along the row"
            continue
        if n.name not in pointwise:
            return f"{n.name} ({n.op}) is neither pointwise nor a row reduction"
        if oc == FULL:
            for v, c in zip(ins, ics):
                if c == FULL and math.prod(v.shape) == math.prod(out.shape) and len(v.shape) <= len(out.shape) \
                        and tuple(v.shape) == tuple(out.shape[len(out.shape) - len(v.shape):]):
                    continue
                if c == ROWVEC and all(e == 1 for e in v.shape[:-1]) and len(v.shape) <= len(out.shape):
                    continue
                if c == STAT and tuple(v.shape) == tuple(out.shape[:-1]) + (1,):
                    continue
                if c == SCALAR and len(v.shape) <= len(out.shape):
                    continue
                return f"{n.name}: operand {tuple(v.shape)} does not broadcast row by row to {tuple(out.shape)}"
        elif oc == STAT:
            for v, c in zip(ins, ics):
                if not (c == STAT and tuple(v.shape) == tuple(out.shape)) and not (c == SCALAR and len(v.shape) <= len(out.shape)):
                    return f"{n.name}: a statistic computed from {tuple(v.shape)}"
        else:
            return f"{n.name}: output {tuple(out.shape)} is neither a row nor a statistic"
    return None


def merge_row_groups(graph: Graph, nodes, pointwise: list[bool], find, parent, consumers,
                     internal: set[str], blocked: set[int], reductions=ROW_REDUCTIONS) -> dict[int, int]:
    """Apply the rule (module docstring) to the union-find of :func:`latch_schedule.fusion.fuse`
    after its plain rules. ``blocked``: nodes that may not move (alias prefixes); ``reductions``:
    the row reductions' op names (those of ROW_REDUCTIONS that take a prologue). Returns
    {root of each row group: its row length R}."""
    outputs = set(graph.output_names())
    pw_names = {nodes[i].name for i in range(len(nodes)) if pointwise[i]}
    row_roots: dict[int, int] = {}

    def members() -> dict[int, list[int]]:
        m: dict[int, list[int]] = {}
        for i in range(len(nodes)):
            m.setdefault(find(i), []).append(i)
        return m

    groups = members()
    for b in range(len(nodes)):
        n = nodes[b]
        if find(b) != b or not is_row_reduction(graph, n, reductions) or b in row_roots:
            continue
        x = graph.value(n.inputs[0])
        R, S = x.shape[-1], tuple(graph.value(n.outputs[0]).shape)
        rows = math.prod(x.shape) // R
        if any(i in blocked for i in groups[b]):
            continue
        # statistic groups reachable from B's output, and the groups reading statistics otherwise
        stat: set[int] = set()
        full_readers: set[int] = set()
        frontier = [b]
        while frontier:
            r = frontier.pop()
            for i in groups[r]:
                for c in consumers.get(nodes[i].outputs[0], []) if nodes[i].outputs else []:
                    rc = find(c)
                    if rc == b or rc in stat or rc in full_readers:
                        continue
                    m = groups[rc]
                    if all(pointwise[k] and len(nodes[k].outputs) == 1
                           and tuple(graph.value(nodes[k].outputs[0]).shape) == S for k in m):
                        stat.add(rc)
                        frontier.append(rc)
                    else:
                        full_readers.add(rc)
        cands = sorted(r for r in full_readers
                       if value_class(graph.value(nodes[r].outputs[0]).shape, rows, R) == FULL
                       and tuple(graph.value(nodes[r].outputs[0]).shape)[-1] == R)
        if not cands:
            continue
        G = cands[0]
        # keep the statistic groups on a path from B to G
        keep: set[int] = set()
        changed = True
        while changed:
            changed = False
            for r in stat - keep:
                if any(find(c) in keep | {G} for i in groups[r] for c in consumers.get(nodes[i].outputs[0], [])):
                    keep.add(r)
                    changed = True
        moved = [b] + sorted(keep)
        if G < max(moved) or any(i in blocked for r in moved + [G] for i in groups[r]):
            continue
        unit = set(moved) | {G}
        all_nodes = sorted(i for r in unit for i in groups[r])
        if row_group_ok(graph, [nodes[i] for i in all_nodes], pw_names, rows, R, reductions) is not None:
            continue
        # legality: every reader outside of a moved value runs after G's sink
        if not all(find(c) in unit or find(c) > G
                   for r in moved for i in groups[r] for c in consumers.get(nodes[i].outputs[0], [])):
            continue
        for r in moved:
            parent[r] = G
        groups = members()
        # producers all of whose readers are in the row group join it (dy * w of the backward)
        while True:
            joined = False
            mine = set(groups[G])
            for r in sorted(groups):
                if r >= G or r == b or any(i in blocked for i in groups[r]):
                    continue
                m = groups[r]
                if not all(pointwise[i] or nodes[i].op == "latch::reshape" for i in m):
                    continue
                outs = [nodes[i].outputs[0] for i in m]
                if any(o in outputs for o in outs):
                    continue
                if not all(c in mine or find(c) == r for o in outs for c in consumers.get(o, [])):
                    continue
                if row_group_ok(graph, [nodes[i] for i in sorted(mine | set(m))], pw_names, rows, R,
                                reductions) is not None:
                    continue
                parent[r] = G
                groups = members()
                joined = True
                break
            if not joined:
                break
        _absorb_consumers(graph, nodes, pointwise, find, parent, consumers, G, groups, blocked, pw_names, rows, R,
                          reductions)
        groups = members()
        mine = set(groups[G])
        for i in mine:
            o = nodes[i].outputs[0]
            if o not in outputs and all(c in mine for c in consumers.get(o, [])):
                internal.add(o)
            elif o in internal and not all(c in mine for c in consumers.get(o, [])):
                internal.discard(o)
        row_roots[G] = R
    return row_roots


def _absorb_consumers(graph: Graph, nodes, pointwise, find, parent, consumers, G: int, groups, blocked,
                      pw_names, rows: int, R: int, reductions) -> None:
    """Later pointwise groups that read the row group's values at its rows join it, so their input
    is computed in registers instead of written and read back (RMSNorm's ``(x * r) * w`` and its
    BF16 copy when ``x * r`` is also saved for the backward; the backward's reshape + cast of dx).
    A joining group X (pointwise nodes and reshapes only, no in-place output) moves from its own
    sink to G's: legal when every input of X is computed in the row group or by a group that runs
    before G (its readers run after X's sink, later still). Its sink becomes the group's last node
    and primary; every other output of the merged group must be read inside it or have the
    primary's shape (the tiler propagates footprints from those)."""
    inplace_new = {new for new, _ in graph.inplace}
    outputs = set(graph.output_names())
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    mine = set(groups[G])
    made = {o for i in mine for o in nodes[i].outputs}
    for r in sorted(groups):
        if r <= G or r not in groups:
            continue
        m = groups[r]
        if any(i in blocked for i in m) or not all(pointwise[i] or nodes[i].op == "latch::reshape" for i in m):
            continue
        ins = {v for i in m for v in nodes[i].inputs if v is not None} - {o for i in m for o in nodes[i].outputs}
        if not ins & made:
            continue
        if any(o in inplace_new for i in m for o in nodes[i].outputs):
            continue
        if not all(v in made or v not in producer or find(producer[v]) < G for v in ins):
            continue
        merged = sorted(mine | set(m))
        if row_group_ok(graph, [nodes[i] for i in merged], pw_names, rows, R, reductions) is not None:
            continue
        primary = nodes[merged[-1]].outputs[0]
        pshape = tuple(graph.value(primary).shape)
        if value_class(pshape, rows, R) != FULL:
            continue  # the row body writes its primary row by row (a statistic's reader stays out)
        read_inside = {v for i in merged for v in nodes[i].inputs if v is not None}
        ok = True
        for i in merged:
            o = nodes[i].outputs[0]
            leaves = o in outputs or any(c not in mine and c not in m for c in consumers.get(o, []))
            if leaves and o != primary and o not in read_inside and tuple(graph.value(o).shape) != pshape:
                ok = False
        if not ok:
            continue
        parent[r] = G
        mine |= set(m)
        made |= {o for i in m for o in nodes[i].outputs}
