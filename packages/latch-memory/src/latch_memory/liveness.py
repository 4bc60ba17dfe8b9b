"""Liveness of values over a program schedule.

A value is written by the tasks of its producing fusion group and read by the tasks of its
consumers (the footprints in the schedule say which). Its *interval* is measured in one linear
order of the tasks that respects happens-before (:func:`linear_order`): from the position of its
first writer to the position of its last user (reader or writer). Values live on entry (program inputs, constants)
start at -1; values live on exit (program outputs) end at ``END`` (the number of tasks).

Two values whose intervals overlap in that one legal execution can never share bytes. Disjoint
intervals are necessary but not sufficient: under the dataflow strategy the tasks of A and B may
still be unordered, so :meth:`Liveness.compatible` asks the happens-before order whether every user of the
earlier value happens before every writer of the later one (``latch_core.order``: the users'
frontier must precede the writers' meet; both are computed once per value and cached).
"""

from __future__ import annotations

import bisect

import attrs

from latch_core.ir import Graph
from latch_core.order import Order
from latch_core.registry import COPY, ELEMENTWISE, Registry
from latch_core.sections import Box, ProgramSchedule
from latch_core.errors import UserError


class LivenessError(UserError, ValueError):
    """The schedule and the graph disagree about a value; the message names value, task and group."""


@attrs.define
class Life:
    """What the planner knows about one value of one program."""

    value: str
    nbytes: int
    writers: list[int] = attrs.field(factory=list)  # task ids, in execution order
    readers: list[int] = attrs.field(factory=list)
    start: int = -1  # execution position of the first writer; -1: live on entry
    end: int = -1  # execution position of the last user; END: live on exit
    live_in: bool = False
    live_out: bool = False
    _frontier: dict | None = attrs.field(default=None, repr=False)  # cached order.frontier(users)
    _meet: list | None = attrs.field(default=None, repr=False)  # cached order.meet(writers)

    @property
    def users(self) -> list[int]:
        return self.readers + self.writers


def task_accesses(ps: ProgramSchedule) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """value -> writer task ids, value -> reader task ids (each task listed once per value)."""
    writers: dict[str, list[int]] = {}
    readers: dict[str, list[int]] = {}
    for t in ps.tasks:
        for a in {a.value for a in t.writes}:
            writers.setdefault(a, []).append(t.id)
        for a in {a.value for a in t.reads}:
            readers.setdefault(a, []).append(t.id)
    return writers, readers


def linear_order(order: Order, n_tasks: int) -> list[int]:
    """The tasks in the order the abstract execution that built ``order`` ran them
    (:meth:`Order.sequence`): a linear extension of happens-before, at no cost.

    Which linear extension is used does not change which values may share bytes: if every user
    of A happens before every writer of B, A's interval ends before B's starts in *every* legal
    order, so :meth:`Liveness.compatible` answers the same; only the greedy placement's tie
    order and the one-order peak statistic depend on it."""
    seq = order.sequence()
    if len(seq) != n_tasks:
        raise LivenessError(f"program {order.program!r}: the order covers {len(seq)} tasks, the schedule has "
                            f"{n_tasks}; rebuild the order from this schedule")
    return seq


class Liveness:
    """Intervals and happens-before summaries of every value a program's schedule touches."""

    def __init__(self, graph: Graph, ps: ProgramSchedule, order: Order | None = None):
        self.graph = graph
        self.schedule = ps
        self.order = order if order is not None else Order.from_schedule(ps)
        self.END = len(ps.tasks)
        self.position = pos = [0] * len(ps.tasks)
        for p, t in enumerate(linear_order(self.order, len(ps.tasks))):
            pos[t] = p
        writers, readers = task_accesses(ps)
        inputs = set(graph.input_names())
        outputs = set(graph.output_names())
        groups_of_task = {t.id: t.group for t in ps.tasks}

        touched = set(writers) | set(readers) | outputs | inputs
        for g in ps.groups:
            touched.update(g.inputs)
            touched.update(g.outputs)
        self.lives: dict[str, Life] = {}
        for name in sorted(touched):
            if not graph.has_value(name):
                who = (writers.get(name) or readers.get(name) or [None])[0]
                raise LivenessError(
                    f"program {graph.name!r}: the schedule names value {name!r}"
                    + (f" (task {who}, group {groups_of_task[who]})" if who is not None else "")
                    + ", which the graph does not declare; reschedule the current graph")
            v = graph.value(name)
            w = sorted(writers.get(name, ()), key=pos.__getitem__)
            r = sorted(readers.get(name, ()), key=pos.__getitem__)
            live_in = name in inputs or v.role == "const"
            if live_in and w:
                raise LivenessError(
                    f"program {graph.name!r}: task {w[0]} (group {groups_of_task[w[0]]}) writes {name!r}, "
                    f"which is a program input ({v.role}); inputs are read-only, new values are separate outputs")
            if not live_in and not w:
                who = r[0] if r else None
                raise LivenessError(
                    f"program {graph.name!r}: value {name!r} is "
                    + (f"read by task {who} (group {groups_of_task[who]})" if who is not None else "a program output")
                    + " but no task writes it; the schedule is missing its producer's group")
            live_out = name in outputs
            start = -1 if live_in else pos[w[0]]
            users = [pos[t] for t in w + r]
            end = self.END if live_out else (max(users) if users else -1)
            self.lives[name] = Life(name, v.nbytes, w, r, start, end, live_in, live_out)

    def __getitem__(self, name: str) -> Life:
        return self.lives[name]

    def __iter__(self):
        return iter(self.lives.values())

    def first_task(self, life: Life) -> int:
        """The task id recorded as ``Placement.first``: the first writer, -1 when live on entry."""
        return -1 if life.live_in or not life.writers else life.writers[0]

    def last_task(self, life: Life) -> int:
        """The task id recorded as ``Placement.last``: the last user, -1 when live on exit."""
        if life.live_out:
            return -1
        users = life.users
        if not users:
            return -1
        return max(users, key=self.position.__getitem__)

    def overlap(self, a: Life, b: Life) -> bool:
        return a.start <= b.end and b.start <= a.end

    def compatible(self, a: Life, b: Life) -> bool:
        """A and B may share bytes: every user of one happens before every writer of the other."""
        if self.overlap(a, b):
            return False
        early, late = (a, b) if a.end < b.start else (b, a)
        if early.live_out or late.live_in:
            return False
        if early._frontier is None:
            early._frontier = self.order.frontier(early.users)
        if late._meet is None:
            late._meet = self.order.meet(late.writers)
        return Order.precedes(early._frontier, late._meet)


def boxes_overlap(a: Box, b: Box) -> bool:
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


POINTWISE_TAGS = frozenset({ELEMENTWISE, COPY})  # output element i needs operand elements at i only


def self_update_ok(grp, nodes: dict, graph: Graph, ops: Registry, old: str, new: str) -> bool:
    """May one task of fusion group ``grp`` read ``old`` and write ``new`` over the same bytes?
    Yes when everything the group computes from ``old`` is pointwise (elementwise/copy ops, per
    the op tags, or an op accumulating into ``old``'s elements: ``extra["accumulates_into"]``) at
    ``new``'s shape: element i of ``new`` then needs element i of ``old`` only,
    which the body reads before it writes element i. A view, broadcast or reduction on the path
    from ``old`` disqualifies the group; nodes on other operands do not matter. (The schedulers
    apply the same rule, latch_schedule.fusion.GroupPlan.inplace_safe; this is the planner's own.)
    ``nodes``: the graph's nodes by name."""
    if graph.value(old).type != graph.value(new).type:
        return False
    shape = graph.value(new).shape
    tainted, reached = {old}, False
    for name in grp.nodes:  # graph order: producers before consumers
        n = nodes.get(name)
        if n is None:
            raise LivenessError(f"program {graph.name!r}: group {grp.id} of the schedule names node {name!r}, "
                                "which the graph lacks; reschedule the current graph")
        if not any(v in tainted for v in n.inputs if v is not None):
            continue
        spec = ops.get(n.op) if n.op in ops else None
        pointwise = spec is not None and bool(spec.tags & POINTWISE_TAGS)
        # an op that starts each output element from the same element of one input and adds to it
        # (OpSpec.extra["accumulates_into"]: that input's index; embedding_backward onto its base)
        # takes that input's bytes too, when nothing else it reads comes from ``old``
        into = spec.extra.get("accumulates_into") if spec is not None else None
        onto = into is not None and into < len(n.inputs) and n.inputs[into] in tainted and \
            not any(v in tainted for j, v in enumerate(n.inputs) if j != into and v is not None)
        if not (pointwise or onto) or any(graph.value(o).shape != shape for o in n.outputs):
            return False
        tainted.update(n.outputs)
        reached = reached or new in n.outputs
    return reached


class _WriteIndex:
    """The write boxes of one value, for "which boxes overlap this one" queries: sorted by the
    start of dimension 0 with a running maximum of its end, so a query scans back only over boxes
    that can reach it (disjoint row tiles: one or two)."""

    def __init__(self, writes: list[tuple[int, Box]]):
        self.items = sorted(writes, key=lambda tw: tw[1][0][0] if tw[1] else 0)
        self.lo = [b[0][0] if b else 0 for _, b in self.items]
        self.reach = []
        m = -1
        for _, b in self.items:
            m = max(m, b[0][1] if b else 1)
            self.reach.append(m)

    def overlapping(self, box: Box):
        if not box:  # a scalar: every write overlaps
            yield from self.items
            return
        j = bisect.bisect_left(self.lo, box[0][1]) - 1
        while j >= 0 and self.reach[j] > box[0][0]:
            t, b = self.items[j]
            if boxes_overlap(box, b):
                yield t, b
            j -= 1


def inplace_hazards(live: Liveness, new: str, old: str, self_update: set[int], limit: int = 5) -> list[str]:
    """Why ``new`` may not take over ``old``'s buffer: reads of ``old`` not ordered before an
    overlapping write of ``new`` (empty when the in-place update is safe).

    Every reader of ``old[R]`` must happen before every writer of ``new[W]`` with ``R`` and ``W``
    overlapping, except the writer itself when its group is in ``self_update``
    (:func:`self_update_ok`: it reads element i of ``old`` before it writes element i of
    ``new`` and needs no other element of ``old``). Boxes compare directly: in-place pairs
    have one type. The schedulers enforce the same rule (latch_schedule.tasks); this is the
    planner's own check, so a schedule from elsewhere cannot make it unsafe.
    """
    ps = live.schedule
    order = live.order
    old_life, new_life = live.lives.get(old), live.lives.get(new)
    if old_life is None or new_life is None:
        return []
    if old_life.live_out:
        return [f"{old!r} is itself a program output, so it must survive the program"]
    writer_set = set(new_life.writers)
    # readers that do not also write new: one summary test usually settles them all
    others = [t for t in old_life.readers if t not in writer_set]
    meet = order.meet(new_life.writers)
    candidates = [] if Order.precedes(order.frontier(others), meet) else others
    candidates += [t for t in old_life.readers if t in writer_set]
    index = _WriteIndex([(t, a.box) for t in new_life.writers for a in ps.tasks[t].writes if a.value == new])
    problems = []
    for r in candidates:
        for rbox in (a.box for a in ps.tasks[r].reads if a.value == old):
            for w, wbox in index.overlapping(rbox):
                if r == w:
                    if ps.tasks[r].group in self_update:
                        continue
                    problems.append(f"task {r} reads {old!r}{list(rbox)} and writes {new!r}{list(wbox)}, and its "
                                    f"group {ps.tasks[r].group} computes it through more than elementwise ops (it may store before it has read "
                                    "everything)")
                elif not order.before(r, w):
                    problems.append(f"task {r} reads {old!r}{list(rbox)} unordered with task {w} writing {new!r}{list(wbox)}")
                else:
                    continue
                if len(problems) >= limit:
                    return problems
    return problems
