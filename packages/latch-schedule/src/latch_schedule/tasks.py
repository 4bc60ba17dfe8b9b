"""From a program to tasks and their dependencies (shared by every strategy).

``build(graph, ops, options) -> TaskGraph``: fusion groups, one task per tile of each group with
its footprint (the boxes it reads and writes of every value) and estimated cost, and the
dependencies derived from footprints alone:

- read-after-write: a task depends on every task that writes a box of a value it reads
  overlapping the box it reads (an overlap index per value, not all pairs);
- write-after-read for in-place pairs (``Graph.inplace``: ``new`` overwrites ``old``'s buffer):
  a task writing a box of ``new`` depends on every other task reading an overlapping box of
  ``old``. The task itself may read ``old`` where it writes ``new`` only when everything its body
  computes from ``old`` is pointwise (element i read before element i is written).

Tasks are numbered group by group (graph order); strategies renumber them so ids follow the order
they run in. A cycle (possible only through in-place pairs) is an error naming the nodes.
"""

from __future__ import annotations

import math

from collections import deque
from typing import Any

import attrs

from latch_core.ir import Graph
from latch_core.registry import NORM, Registry
from latch_core.sections import Access, FusionGroup

from .boxes import Box, BoxIndex, MultiIndex, full_box, hull, volume
from .fusion import GroupPlan, fuse, _spec
from .tiling import CostModel, Tiling, node_cost, split, target_tiles, tiling_for
from latch_core.errors import UserError

REPEAT_OP = "latch::repeat"


class ScheduleError(UserError, ValueError):
    """A program the scheduler cannot schedule; the message names the node and what to do."""


@attrs.define
class TaskGraph:
    """Tasks and their dependencies. A dependency set (``depsets[d]``) is the producer tasks one
    read needs ordered before it; consumers whose reads hit the same producers share one set (a
    whole-value read by 100 tiles of 100 producer tiles is one set of 100, not 10,000 edges).
    ``task_deps[t]`` lists the sets task ``t`` waits for."""

    program: str
    groups: list[FusionGroup]
    plans: list[GroupPlan]
    group_of: list[int]  # task -> group
    tiles: list[Box]
    reads: list[tuple[Access, ...]]
    writes: list[tuple[Access, ...]]
    cost: list[float]
    depsets: list[tuple[int, ...]]  # producer task ids, sorted
    depset_value: list[str]  # the value whose ordering each set is for
    task_deps: list[tuple[int, ...]]  # task -> dependency set ids
    topo: list[int]  # a topological order of the tasks
    _member_of: list[list[int]] | None = None
    _consumers: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.tiles)

    def preds(self, t: int) -> set[int]:
        """Every task ``t`` depends on (a union of its sets; for tests and small programs)."""
        return {p for d in self.task_deps[t] for p in self.depsets[d]}

    @property
    def member_of(self) -> list[list[int]]:
        """task -> ids of the dependency sets it is a producer in."""
        if self._member_of is None:
            out: list[list[int]] = [[] for _ in self.tiles]
            for d, members in enumerate(self.depsets):
                for p in members:
                    out[p].append(d)
            self._member_of = out
        return self._member_of

    @property
    def consumers(self) -> list[list[int]]:
        """dependency set -> the tasks waiting for it."""
        if self._consumers is None:
            out: list[list[int]] = [[] for _ in self.depsets]
            for t, ds in enumerate(self.task_deps):
                for d in ds:
                    out[d].append(t)
            self._consumers = out
        return self._consumers


def _where(node) -> str:
    src = f" (from {node.source})" if node.source else ""
    return f"node {node.name!r} ({node.op}){src}"


class GroupTiler:
    """Tiling of one fusion group: the tail node's tiling picks the split dims; footprints come
    from propagating the tile's box backwards through the group's nodes."""

    def __init__(self, graph: Graph, plan: GroupPlan, ops: Registry | None, cost: CostModel):
        self.plan = plan
        self.tilings: list[Tiling] = []
        for n in plan.nodes:
            spec = _spec(ops, n.op)
            in_types = [None if v is None else graph.value(v).type for v in n.inputs]
            out_types = [graph.value(o).type for o in n.outputs]
            try:
                self.tilings.append(tiling_for(spec, in_types, out_types, n.attr_dict, cost))
            except Exception as e:
                raise ScheduleError(f"program {graph.name!r} {_where(n)}: cannot tile it: {e}") from e
        self.outputs = set(plan.outputs)
        self.produced = {o for n in plan.nodes for o in n.outputs}
        self.shape = graph.value(plan.primary).shape
        # Outputs no node of the group reads, besides the primary: sibling-fused nodes
        # (latch_schedule.fusion). Like every output of a fused group they are written at the
        # tile's index (they have the primary's shape), so their footprint starts from the tile.
        read_inside = {v for n in plan.nodes for v in n.inputs if v is not None}
        self.seeds = tuple(o for o in plan.outputs if o != plan.primary and o not in read_inside
                           and graph.value(o).shape == self.shape)

    @property
    def tiling(self) -> Tiling:
        t = self.tilings[-1]
        if self.plan.row and self.shape:  # a row group's task covers whole rows (latch_schedule.rowgroups)
            last = len(self.shape) - 1
            keep = [k for k, d in enumerate(t.split_dims) if d != last]
            t = attrs.evolve(t, split_dims=tuple(t.split_dims[k] for k in keep),
                             granule=tuple(t.granule[k] for k in keep) if t.granule else ())
        return t

    def row_aligned(self, graph: Graph, target: int, num_sms: int) -> Tiling:
        """The tiling, with a row group's row block fixed so that every tile is a box of every value.

        A row group's values of the rows' shape need not share the primary's dims: RMSNorm's
        ``x * r`` of shape ``(B, T, D)`` is saved for the backward while the primary is its BF16
        copy reshaped to ``(B * T, D)``. A block of the flat rows that straddles a multiple of
        ``T`` maps onto ``(B, T, D)`` as the hull of two batches' rows, so neighbouring tasks'
        writes overlap and the hazard proof refuses the schedule (TinyMoE-200M at 32 x 1024: 249-row
        blocks). A block ``b`` is exact for a value when, for each of its row dims' sub-block row
        counts ``p`` (``T`` for ``(B, T, D)``), ``b`` divides ``p`` or ``p`` divides ``b``; the
        compatible block of at least half the split's own choice (no more than twice its tasks) that
        makes the shortest phase (``ceil(tiles / SMs) * b`` rows on the busiest SM) is taken, ties
        to the fewer tasks."""
        t = self.tiling
        if not (self.plan.row and self.shape and t.split_dims) or t.granule:
            return t
        lead = [k for k in t.split_dims if self.shape[k] > 1]
        if len(lead) != 1:
            return t  # a row split over several primary dims is row-major exact already (split())
        k = lead[0]
        rows = self.shape[k]
        periods = set()
        names = set(self.plan.inputs) | set(self.plan.outputs) | set(self.plan.internal)
        for v in names:
            shape = graph.value(v).shape
            if math.prod(shape) != math.prod(self.shape) or not shape or shape[-1] != self.shape[-1]:
                continue
            dims = [d for d in shape[:-1] if d > 1]
            for j in range(1, len(dims)):
                periods.add(math.prod(dims[j:]))
        periods.discard(rows)
        if not periods:
            return t
        want = math.ceil(rows / max(1, min(rows, target)))

        def ok(b: int) -> bool:
            return all(b % p == 0 or p % b == 0 for p in periods)

        cands = [b for b in range(max(1, want // 2), rows + 1) if ok(b)] or [rows]
        best = min(cands, key=lambda b: (math.ceil(math.ceil(rows / b) / num_sms) * b, -b))
        granule = tuple(best if d == k else self.shape[d] for d in t.split_dims)
        return attrs.evolve(t, granule=granule)

    def footprint(self, box: Box) -> tuple[dict[str, Box], dict[str, Box]]:
        plan = self.plan
        if len(plan.nodes) == 1:  # the common case: no propagation, no hulls unless repeated
            node = plan.nodes[0]
            ins, outs = self.tilings[0].footprint(box)
            reads: dict[str, Box] = {}
            for v, b in zip(node.inputs, ins):
                if v is not None and b is not None:
                    reads[v] = hull(reads[v], b) if v in reads else b
            return reads, {o: b for o, b in zip(node.outputs, outs) if o in self.outputs}
        need: dict[str, Box] = {plan.primary: box}
        for o in self.seeds:
            need[o] = box
        reads: dict[str, Box] = {}
        writes: dict[str, Box] = {}
        for node, tiling in zip(reversed(plan.nodes), reversed(self.tilings)):
            ob = need.get(node.outputs[0])
            if ob is None:
                continue
            ins, outs = tiling.footprint(ob)
            for o, b in zip(node.outputs, outs):
                if o in self.outputs:
                    writes[o] = hull(writes.get(o), b)
            for v, b in zip(node.inputs, ins):
                if v is None or b is None:
                    continue
                if v in self.produced:  # computed inside the group (internal or not)
                    need[v] = hull(need.get(v), b)
                else:
                    reads[v] = hull(reads.get(v), b)
        return reads, writes


def group_cost(graph: Graph, plan: GroupPlan, ops: Registry | None, cost: CostModel) -> float:
    flops = mma = nbytes = 0.0
    for n in plan.nodes:
        spec = _spec(ops, n.op)
        f, m, b = node_cost(spec, [None if v is None else graph.value(v).type for v in n.inputs],
                            [graph.value(o).type for o in n.outputs], n.attr_dict)
        m /= cost.op_efficiency(n.op)
        flops += f
        mma += m
        nbytes += b
    # Values computed inside the group are read from registers, whether or not they are also written
    # out (an optimizer's new weight, read again by its BF16 copy's cast): every in-group read of
    # them, and the write of the internal ones, moves no bytes.
    produced = {o for n in plan.nodes for o in n.outputs}
    inner_reads = sum(graph.value(v).nbytes for n in plan.nodes for v in n.inputs if v is not None and v in produced)
    internal = sum(graph.value(v).nbytes for v in plan.internal)
    boundary = sum(graph.value(v).nbytes for v in plan.inputs) + sum(graph.value(v).nbytes for v in plan.outputs)
    nbytes = max(nbytes - inner_reads - internal, min(nbytes, boundary))
    return max(cost.seconds(flops, mma, nbytes), row_latency(graph, plan, ops, cost))


# bodies without the norm tag whose rows are latency-bound: token_topk (a warp per row) and its
# backward (an element per thread, two dependent loads each: run 29, 133 us as one task)
ROW_BODIES = frozenset({"latch::token_topk", "latch::token_topk_backward"})


def row_latency(graph: Graph, plan: GroupPlan, ops: Registry | None, cost: CostModel) -> float:
    """The latency floor of a group holding a row body (a warp per row, ``CostModel.row_latency``
    per row, ``rows_in_flight`` rows at a time per SM): its rows, the primary output's elements over
    its last dim, are the work, so a short-rowed op spreads over the SMs instead of sitting on a few
    while the others wait at the barrier (run 26: the router's softmax and top-k)."""
    rows = 0
    for n in plan.nodes:
        spec = _spec(ops, n.op)
        if n.op in ROW_BODIES or (spec is not None and NORM in spec.tags):
            shape = graph.value(n.outputs[0]).shape
            rows = max(rows, math.prod(shape[:-1]) if len(shape) > 1 else 1)
    return rows * cost.row_latency / cost.rows_in_flight


def build(graph: Graph, ops: Registry | None, *, fuse_ops: bool = True, num_sms: int = 132,
          cost: CostModel | None = None, alias_views: bool = False, row_groups: bool = False,
          fuse_concat: bool = True) -> TaskGraph:
    cost = attrs.evolve(cost or CostModel(), num_sms=num_sms)
    for n in graph.nodes:
        if n.op == REPEAT_OP:
            raise ScheduleError(
                f"program {graph.name!r} {_where(n)}: repeated regions are not supported by the scheduler yet; "
                "unroll the region before scheduling")
        if not n.outputs:
            raise ScheduleError(f"program {graph.name!r} {_where(n)}: a node without outputs cannot be scheduled")
    plans = fuse(graph, ops, fuse_ops, alias_views=alias_views, row_groups=row_groups, concat=fuse_concat)
    interned: dict[tuple, Access] = {}  # equal accesses share one record (whole-value reads)

    def access(v: str, b: Box) -> Access:
        a = interned.get((v, b))
        if a is None:
            a = interned[(v, b)] = Access(v, b)
        return a

    groups: list[FusionGroup] = []
    group_of: list[int] = []
    tiles: list[Box] = []
    reads: list[tuple[Access, ...]] = []
    writes: list[tuple[Access, ...]] = []
    costs: list[float] = []
    for gi, plan in enumerate(plans):
        groups.append(FusionGroup(id=gi, nodes=[n.name for n in plan.nodes], inputs=plan.inputs,
                                  outputs=plan.outputs, primary=plan.primary, body=plan.body))
        tiler = GroupTiler(graph, plan, ops, cost)
        seconds = group_cost(graph, plan, ops, cost)
        target = target_tiles(seconds, cost, num_sms)
        tiling = tiler.row_aligned(graph, target, num_sms)
        boxes = split(tiler.shape, tiling, target)
        # each tile's share of the group's cost: its volume, or the tiling's weight where tiles of
        # one op differ (causal attention), so the assignment balances what the SMs really do
        share = [float(volume(b)) for b in boxes] if tiling.weight is None else [tiling.weight(b) for b in boxes]
        total = sum(share) or 1.0
        # what every task of the group reads whatever its box (a scatter node's walk of its index)
        walk = sum(t.task_bytes for t in tiler.tilings) / cost.sm_bytes
        for box, part in zip(boxes, share):
            r, w = tiler.footprint(box)
            group_of.append(gi)
            tiles.append(box)
            reads.append(tuple(access(v, b) for v, b in r.items()))
            writes.append(tuple(access(v, b) for v, b in w.items()))
            costs.append(seconds * part / total + cost.task_overhead + walk)
    depsets, depset_value, task_deps = _dependencies(graph, plans, group_of, reads, writes)
    tg = TaskGraph(graph.name, groups, plans, group_of, tiles, reads, writes, costs, depsets, depset_value,
                   task_deps, [])
    tg.topo = _toposort(graph, tg)
    return tg


class _Sets:
    """Interning of dependency sets: one id per distinct producer tuple."""

    def __init__(self):
        self.ids: dict[tuple[int, ...], int] = {}
        self.sets: list[tuple[int, ...]] = []
        self.value: list[str] = []

    def add(self, members: tuple[int, ...], value: str) -> int:
        d = self.ids.get(members)
        if d is None:
            d = self.ids[members] = len(self.sets)
            self.sets.append(members)
            self.value.append(value)
        return d


def _dependencies(graph: Graph, plans: list[GroupPlan], group_of: list[int], reads, writes):
    writers: dict[str, list[tuple[Box, int]]] = {}
    for t, ws in enumerate(writes):
        for a in ws:
            writers.setdefault(a.value, []).append((a.box, t))
    w_index = {v: BoxIndex(items) for v, items in writers.items()}
    sets = _Sets()
    task_deps: list[list[int]] = [[] for _ in reads]
    cache: dict[int, int] = {}  # access -> set id (-1: no producers)
    for t, rs in enumerate(reads):
        for a in rs:
            idx = w_index.get(a.value)
            if idx is None:
                continue
            key = id(a)  # accesses are interned by build(): equal accesses are one object
            d = cache.get(key)
            if d is None:
                # a group never reads its own outputs, so t is not among the producers
                hits = tuple(sorted(idx.query(a.box)))
                d = cache[key] = sets.add(hits, a.value) if hits else -1
            if d >= 0 and d not in task_deps[t]:
                task_deps[t].append(d)
    inplace = dict(graph.inplace)  # new -> old
    if inplace:
        olds = set(inplace.values())
        readers: dict[str, list[tuple[Box, int, int]]] = {}
        for t, rs in enumerate(reads):
            for a in rs:
                if a.value in olds:
                    readers.setdefault(a.value, []).append((a.box, t, group_of[t]))
        r_index = {v: MultiIndex(items) for v, items in readers.items()}
        wcache: dict[tuple, tuple] = {}
        safe: dict[tuple, bool] = {}  # (group, old, new) -> may a task update in place
        for t, ws in enumerate(writes):
            g = group_of[t]
            for a in ws:
                old = inplace.get(a.value)
                if old is None or old not in r_index:
                    continue
                key = (old, a.box)
                hit = wcache.get(key)
                if hit is None:
                    hits = r_index[old].query(a.box)
                    hit = wcache[key] = (tuple(sorted(p for p in hits if group_of[p] != g)),
                                         tuple(p for p in hits if group_of[p] == g))
                others, own = hit
                if own:
                    node = plans[g].nodes[-1]
                    if any(p != t for p in own):
                        raise ScheduleError(
                            f"program {graph.name!r} {_where(node)}: its tiles overwrite elements of %{old} (in place, "
                            f"as %{a.value}) that other tiles of the same node still read; an in-place update "
                            "must be elementwise")
                    ok = safe.get((g, old, a.value))
                    if ok is None:
                        ok = safe[(g, old, a.value)] = plans[g].inplace_safe(graph, old, a.value)
                    if not ok:
                        raise ScheduleError(
                            f"program {graph.name!r} {_where(node)}: writes %{a.value} in place of %{old} while "
                            f"reading %{old}, and what it computes from %{old} is not elementwise, so it could "
                            "overwrite elements it has yet to read; compute the update elementwise or give the op "
                            "the elementwise tag")
                if others:
                    d = sets.add(others, old)
                    if d not in task_deps[t]:
                        task_deps[t].append(d)
    return sets.sets, sets.value, [tuple(d) for d in task_deps]


def _toposort(graph: Graph, tg: TaskGraph) -> list[int]:
    """Kahn's algorithm over tasks and dependency sets (a set is done when its members are)."""
    n = len(tg)
    indeg = [len(ds) for ds in tg.task_deps]
    left = [len(m) for m in tg.depsets]
    member_of, consumers = tg.member_of, tg.consumers
    queue = deque(t for t in range(n) if indeg[t] == 0)
    order = []
    while queue:
        t = queue.popleft()
        order.append(t)
        for d in member_of[t]:
            left[d] -= 1
            if left[d] == 0:
                for c in consumers[d]:
                    indeg[c] -= 1
                    if indeg[c] == 0:
                        queue.append(c)
    if len(order) != n:
        stuck = [t for t in range(n) if indeg[t] > 0]
        names = sorted({tg.plans[tg.group_of[t]].nodes[-1].name for t in stuck})
        inplace = ", ".join(f"%{new} -> %{old}" for new, old in graph.inplace)
        raise ScheduleError(
            f"program {graph.name!r}: the tasks of nodes {names[:8]} depend on each other in a cycle; this "
            f"happens when a value is read after the in-place update that overwrites it ({inplace}); "
            "make the reader use the new value or drop the in-place pair")
    return order


def options_cost(options: dict[str, Any]) -> CostModel:
    """A CostModel with overrides from scheduler options (``cost_<field>=...``, ``matmul_tile``)."""
    kw = {}
    for f in attrs.fields(CostModel):
        key = f"cost_{f.name}"
        if key in options:
            v = options[key]
            if f.name == "matmul_tiles":
                kw[f.name] = tuple((int(m), int(n)) for m, n in v)
            elif f.name == "mma_eff":
                kw[f.name] = tuple((int(w), float(e)) for w, e in v)
            elif f.name == "mma_op_eff":
                kw[f.name] = tuple((str(op), float(e)) for op, e in v)
            elif f.name == "split_k_choices":
                kw[f.name] = tuple(int(x) for x in v)
            else:
                kw[f.name] = type(f.default)(v)
    if "matmul_tile" in options:  # one fixed (M, N) tile for every matmul
        m, n = options["matmul_tile"]
        kw["matmul_tiles"] = ((int(m), int(n)),)
    return CostModel(**kw)
