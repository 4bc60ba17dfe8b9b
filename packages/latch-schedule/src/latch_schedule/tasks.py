"""From a program to tasks and their dependencies (shared by every strategy).

``build(graph, ops, options) -> TaskGraph``: fusion groups, one task per tile of each group with
its footprint (the boxes it reads and writes of every value) and estimated cost, and the
dependencies derived from footprints alone:

- read-after-write: a task depends on every task that writes a box of a value it reads
  overlapping the box it reads (an overlap index per value, not all pairs);
- write-after-read for in-place pairs (``Graph.inplace``: ``new`` overwrites ``old``'s buffer):
  a task writing a box of ``new`` depends on every other task reading an overlapping box of
  ``old``. The task itself may read ``old`` where it writes ``new`` only when its body is
  pointwise (element i read before element i is written, nothing else touched).

Tasks are numbered group by group (graph order); strategies renumber them so ids follow the order
they run in. A cycle (possible only through in-place pairs) is an error naming the nodes.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import attrs

from latch_core.ir import Graph
from latch_core.registry import Registry
from latch_core.sections import Access, FusionGroup

from .boxes import Box, BoxIndex, MultiIndex, full_box, hull, volume
from .fusion import GroupPlan, fuse, _spec
from .tiling import CostModel, Tiling, node_cost, split, target_tiles, tiling_for

REPEAT_OP = "latch::repeat"


class ScheduleError(ValueError):
    """A program the scheduler cannot schedule; the message names the node and what to do."""


@attrs.define
class TaskGraph:
    program: str
    groups: list[FusionGroup]
    plans: list[GroupPlan]
    group_of: list[int]  # task -> group
    tiles: list[Box]
    reads: list[tuple[Access, ...]]
    writes: list[tuple[Access, ...]]
    cost: list[float]
    deps: list[list[tuple[str, list[int]]]]  # task -> [(value that needs ordering, producer tasks)]
    topo: list[int]  # a topological order of the tasks
    pred: list[tuple[int, ...]] = attrs.field(factory=list)  # task -> distinct producer tasks

    def __attrs_post_init__(self):
        if not self.pred:
            self.pred = [tuple({p for _, ps in d for p in ps}) for d in self.deps]

    def __len__(self) -> int:
        return len(self.tiles)

    def preds(self, t: int) -> tuple[int, ...]:
        return self.pred[t]


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
        self.shape = graph.value(plan.primary).shape

    @property
    def tiling(self) -> Tiling:
        return self.tilings[-1]

    def footprint(self, box: Box) -> tuple[dict[str, Box], dict[str, Box]]:
        plan = self.plan
        need: dict[str, Box] = {plan.primary: box}
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
                if v in plan.internal:
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
        flops += f
        mma += m
        nbytes += b
    internal = sum(graph.value(v).nbytes for v in plan.internal)
    boundary = sum(graph.value(v).nbytes for v in plan.inputs) + sum(graph.value(v).nbytes for v in plan.outputs)
    nbytes = max(nbytes - 2 * internal, min(nbytes, boundary))
    return cost.seconds(flops, mma, nbytes)


def build(graph: Graph, ops: Registry | None, *, fuse_ops: bool = True, num_sms: int = 132,
          cost: CostModel | None = None) -> TaskGraph:
    cost = cost or CostModel()
    for n in graph.nodes:
        if n.op == REPEAT_OP:
            raise ScheduleError(
                f"program {graph.name!r} {_where(n)}: repeated regions are not supported by the scheduler yet; "
                "unroll the region before scheduling")
        if not n.outputs:
            raise ScheduleError(f"program {graph.name!r} {_where(n)}: a node without outputs cannot be scheduled")
    plans = fuse(graph, ops, fuse_ops)
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
        boxes = split(tiler.shape, tiler.tiling, target_tiles(seconds, cost, num_sms))
        total = max(1, volume(full_box(tiler.shape)))
        for box in boxes:
            r, w = tiler.footprint(box)
            group_of.append(gi)
            tiles.append(box)
            reads.append(tuple(Access(v, b) for v, b in r.items()))
            writes.append(tuple(Access(v, b) for v, b in w.items()))
            costs.append(seconds * volume(box) / total + cost.task_overhead)
    deps = _dependencies(graph, plans, group_of, reads, writes)
    pred = [tuple({p for _, ps in d for p in ps}) for d in deps]
    topo = _toposort(graph, plans, group_of, pred)
    return TaskGraph(graph.name, groups, plans, group_of, tiles, reads, writes, costs, deps, topo, pred)


def _dependencies(graph: Graph, plans: list[GroupPlan], group_of: list[int], reads, writes) -> list:
    writers: dict[str, list[tuple[Box, int]]] = {}
    for t, ws in enumerate(writes):
        for a in ws:
            writers.setdefault(a.value, []).append((a.box, t))
    w_index = {v: BoxIndex(items) for v, items in writers.items()}
    deps: list[list[tuple[str, list[int]]]] = [[] for _ in reads]
    for t, rs in enumerate(reads):
        for a in rs:
            idx = w_index.get(a.value)
            if idx is None:
                continue
            ps = [p for p in idx.query(a.box) if p != t]
            if ps:
                deps[t].append((a.value, ps))
    inplace = dict(graph.inplace)  # new -> old
    if inplace:
        olds = set(inplace.values())
        readers: dict[str, list[tuple[Box, int, int]]] = {}
        for t, rs in enumerate(reads):
            for a in rs:
                if a.value in olds:
                    readers.setdefault(a.value, []).append((a.box, t, group_of[t]))
        r_index = {v: MultiIndex(items) for v, items in readers.items()}
        for t, ws in enumerate(writes):
            for a in ws:
                old = inplace.get(a.value)
                if old is None or old not in r_index:
                    continue
                hits = r_index[old].query(a.box)
                if t in hits and not plans[group_of[t]].pointwise:
                    node = plans[group_of[t]].nodes[-1]
                    raise ScheduleError(
                        f"program {graph.name!r} {_where(node)}: writes %{a.value} in place of %{old} while "
                        f"reading %{old}, and its body is not elementwise, so it could overwrite elements it has "
                        "yet to read; compute the update elementwise or give the op the elementwise tag")
                ps = [p for p in hits if p != t]
                if ps:
                    deps[t].append((old, ps))
    return deps


def _toposort(graph: Graph, plans, group_of, pred) -> list[int]:
    n = len(pred)
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for t in range(n):
        ps = pred[t]
        indeg[t] = len(ps)
        for p in ps:
            succ[p].append(t)
    queue = deque(t for t in range(n) if indeg[t] == 0)
    order = []
    while queue:
        t = queue.popleft()
        order.append(t)
        for s in succ[t]:
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    if len(order) != n:
        stuck = [t for t in range(n) if indeg[t] > 0]
        names = sorted({plans[group_of[t]].nodes[-1].name for t in stuck})
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
        key = "matmul_tile" if f.name == "matmul_tile" else f"cost_{f.name}"
        if key in options:
            v = options[key]
            kw[f.name] = tuple(int(x) for x in v) if f.name == "matmul_tile" else type(f.default)(v)
    return CostModel(**kw)
