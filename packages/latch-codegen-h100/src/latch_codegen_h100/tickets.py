"""Ticketed phases: the tasks of a barrier phase taken from one shared queue, not from fixed SM lists.

Why: the barrier scheduler assigns every task to an SM from the cost model's estimate, and a phase
lasts as long as its slowest SM. Where the estimate is off, or the work depends on the data (the
ragged expert products: how many rows each expert gets is known only at run time), SMs wait at the
barrier while one finishes. H200 run 29 (TinyMoE-200M, 2 x 1024): 23.7% of the update's SM-time
waiting at barriers; replaying its per-task times through a greedy queue (each SM takes the next task
when it is free) saves 0.5-1.0 ms of the 13.2 ms (results/lead8.md). DESIGN.md (execution model v2):
"an atomic tile ticket per phase balances load".

What the tables hold (the scheduler ``tickets``: the barrier schedule with the schedule option
``tickets``): each SM list keeps its barriers; the queued tasks of a ticketed phase leave the lists,
EVERY list gets one ``("ticket", k)`` instruction at the end of that phase, and the queued tasks go,
in queue order, into a region of task instructions after the lists (``Queue``). The
kernel's producer (cuda/latch_kernel_main.cuh, I_TICKET) takes ticket t = atomicAdd(counter k) and
runs queue task t until the queue is drained, then goes on to the barrier. The counter is one of the
program's dataflow counters, never reset: each launch adds exactly ``len(tasks) + lists`` (every list
takes one ticket past the end), which is its ``expected`` count, so launch e's tickets start at
``e * expected`` as the other counters' signals do.

When a phase may be ticketed (:func:`ticket_plan`): a queue task may then run on any SM, before or
after any other task of the phase. Two tasks on DIFFERENT SMs of one phase are already unordered in
the static schedule, which the validator proved safe; two tasks on the SAME SM are ordered by the
list, which the proof may have relied on (the barrier scheduler chains a small op after its producer
on one SM: softmax then top-k). So the tasks of a list that conflict with another task of the same
list and phase keep their SM and their order (they run first, then the list's ticket); every other
task of the phase goes to the queue. Two tasks conflict when
- they touch the same value, boxes intersecting, at least one of the two a write;
- they touch two values with one placement and one layout (an in-place update), boxes intersecting,
  one a write (box by box, as the validator compares such pairs);
- they touch two other values whose placements share bytes (arena reuse inside the phase, a view
  sharing its base's bytes), at least one a write.
Phases holding waits or signals (the dataflow strategy) are never ticketed, nor phases where no SM has
two tasks or fewer than two tasks are free. Queue order: the scheduler's cost estimate, longest first
(a greedy queue in that order is within 4/3 of the best makespan), ties by task id (the tiler's raster
order).
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from latch_core.sections import BARRIER, SIGNAL, TASK, WAIT, ProgramMemory, ProgramSchedule

TICKET = "ticket"


@attrs.frozen
class Queue:
    phase: int  # the barrier phase (instructions before barrier ``phase`` in every list)
    tasks: tuple[int, ...]  # task ids in queue order


@attrs.frozen
class TicketPlan:
    """The SM lists as the tables hold them (``("ticket", k)`` for queue k) and the queues."""

    sms: tuple[tuple[tuple, ...], ...]
    queues: tuple[Queue, ...]
    refused: dict = attrs.field(factory=dict, eq=False)  # phase -> why it stays static (for reports)


def _phases(sm) -> list[list[int]]:
    """Task ids of one SM list per barrier phase (phase k: before barrier k; the last: after the last)."""
    out: list[list[int]] = [[]]
    for ins in sm:
        if ins[0] == TASK:
            out[-1].append(ins[1])
        elif ins[0] == BARRIER:
            out.append([])
    return out


def _intersects(a, b) -> bool:
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b)) and all(
        lo < hi for lo, hi in a) and all(lo < hi for lo, hi in b)


def _sm_conflicts(tasks, ps: ProgramSchedule, overlaps: dict[str, dict[str, bool]]) -> tuple[set[int], str | None]:
    """The tasks among ``tasks`` (one SM's tasks of one phase) that conflict with another of them,
    and the first conflict in words (None: none)."""
    by_value: dict[str, list[tuple[int, tuple, bool]]] = defaultdict(list)
    for tid in tasks:
        t = ps.tasks[tid]
        for acc in t.reads:
            by_value[acc.value].append((tid, acc.box, False))
        for acc in t.writes:
            by_value[acc.value].append((tid, acc.box, True))
    bad: set[int] = set()
    first = None

    def pair(accs, others, what, boxes=True):
        """Mark every two tasks of ``accs`` x ``others`` where one writes (and, ``boxes``, the boxes meet)."""
        nonlocal first
        for x in accs:
            for y in others:
                if x[0] != y[0] and (x[2] or y[2]) and (not boxes or _intersects(x[1], y[1])):
                    if x[0] not in bad or y[0] not in bad:
                        bad.update((x[0], y[0]))
                        if first is None:
                            first = f"tasks {min(x[0], y[0])} and {max(x[0], y[0])} of one SM {what}"

    for value, accs in by_value.items():
        if any(a[2] for a in accs):
            pair(accs, accs, f"both touch {value!r} (a write)")
    for value, accs in by_value.items():
        for other, same_layout in overlaps.get(value, {}).items():
            if other in by_value and value < other:
                if same_layout:  # one placement and one layout (an in-place update): box by box, as the validator does
                    pair(accs, by_value[other], f"touch {value!r} and {other!r}, one placement (a write)")
                else:
                    pair(accs, by_value[other], f"share bytes ({value!r}, {other!r}, a write)", boxes=False)
    return bad, first


def _overlapping_values(mem: ProgramMemory, layouts: dict[str, tuple]) -> dict[str, dict[str, bool]]:
    """value -> {other value sharing a byte with it (same buffer): True where both have one placement
    and one layout (``layouts``: value -> (shape, dtype)), so boxes compare; False: bytes only}."""
    out: dict[str, dict[str, bool]] = defaultdict(dict)
    by_buf: dict[str, list] = defaultdict(list)
    for p in mem.placements:
        if p.nbytes > 0:
            by_buf[p.buffer].append((p.offset, p.offset + p.nbytes, p.value))
    for spans in by_buf.values():
        spans.sort()
        active: list[tuple[int, int, str]] = []  # (end, start, value) of spans still open
        for lo, hi, v in spans:
            active = [x for x in active if x[0] > lo]
            for e, s0, w in active:
                if w != v:
                    same = (s0, e) == (lo, hi) and layouts.get(v) is not None and layouts.get(v) == layouts.get(w)
                    out[v][w] = out[w][v] = same
            active.append((hi, lo, v))
    return out


# Bodies whose cost depends on the data (schedule option tickets="data" queues only their phases).
DATA_BODIES = ("ragged_mm",)


def data_groups(ps: ProgramSchedule) -> frozenset[int]:
    """The fusion groups whose body is data-dependent (DATA_BODIES: the body key's op)."""
    return frozenset(g.id for g in ps.groups if g.body.split("/")[0].startswith(DATA_BODIES))


def ticket_plan(ps: ProgramSchedule, mem: ProgramMemory, layouts: dict[str, tuple] | None = None,
                only_data: bool = False) -> TicketPlan:
    """The ticketed form of ``ps``'s SM lists (see the module docstring); lists unchanged where no
    phase qualifies. ``layouts``: value -> (shape, dtype), for in-place pairs (box by box).
    ``only_data``: only phases holding at least two tasks of data-dependent bodies (:func:`data_groups`)
    qualify."""
    if any(ins[0] in (WAIT, SIGNAL) for sm in ps.sms for ins in sm):
        return TicketPlan(tuple(tuple(sm) for sm in ps.sms), (), {-1: "the lists hold dataflow waits or signals"})
    per_sm = [_phases(sm) for sm in ps.sms]
    nphases = ps.num_barriers + 1
    if any(len(p) != nphases for p in per_sm):
        raise ValueError(f"program {ps.program!r}: every SM list must run all {ps.num_barriers} barriers")
    overlaps = _overlapping_values(mem, layouts or {})
    data = data_groups(ps) if only_data else frozenset()
    ticketed: dict[int, int] = {}  # phase -> queue index
    static: dict[int, set[int]] = {}  # phase -> tasks that keep their SM and place (a same-SM conflict)
    queues: list[Queue] = []
    refused: dict[int, str] = {}
    for k in range(nphases):
        lists = [p[k] for p in per_sm]
        if max((len(x) for x in lists), default=0) < 2:
            continue
        if only_data and sum(ps.tasks[t].group in data for x in lists for t in x) < 2:
            refused[k] = "no data-dependent body (tickets=data)"
            continue
        keep: set[int] = set()
        why = None
        for x in lists:
            if len(x) > 1:
                bad, w = _sm_conflicts(x, ps, overlaps)
                keep |= bad
                why = why or w
        free = [t for x in lists for t in x if t not in keep]
        if len(free) < 2:
            refused[k] = why or "fewer than two tasks to share"
            continue
        if why:
            refused[k] = f"partly: {len(keep)} tasks keep their SM ({why})"
        ticketed[k] = len(queues)
        static[k] = keep
        queues.append(Queue(k, tuple(sorted(free, key=lambda t: (-ps.tasks[t].cost, t)))))
    if not queues:
        return TicketPlan(tuple(tuple(sm) for sm in ps.sms), (), refused)
    sms = []
    for sm in ps.sms:
        out, k = [], 0
        for ins in sm:
            if ins[0] == BARRIER:
                if k in ticketed:
                    out.append((TICKET, ticketed[k]))  # after the phase's static tasks of this list
                out.append(ins)
                k += 1
            elif ins[0] == TASK and k in ticketed and ins[1] not in static[k]:
                continue
            else:
                out.append(ins)
        if k in ticketed:
            out.append((TICKET, ticketed[k]))
        sms.append(tuple(out))
    return TicketPlan(tuple(sms), tuple(queues), refused)


def tickets_on(doc) -> bool | str:
    """Whether the document's schedule asks for ticketed phases (schedule option ``tickets``): False,
    True (every phase that qualifies) or ``"data"`` (only the phases of data-dependent bodies)."""
    if doc.schedule is None:
        return False
    v = dict(doc.schedule.stats).get("tickets", False)
    return "data" if v == "data" else bool(v)


def table_lists(ps: ProgramSchedule, mem: ProgramMemory, on: bool | str, graph=None) -> TicketPlan:
    """The SM lists the tables hold: ``ps.sms`` as they are (``on`` False) or :func:`ticket_plan`'s
    (``graph``: the program's graph, for the values' layouts; ``on == "data"``: only data-dependent
    phases)."""
    if not on:
        return TicketPlan(tuple(tuple(sm) for sm in ps.sms), ())
    layouts = {} if graph is None else {v.name: (tuple(v.shape), v.dtype) for v in graph.values}
    return ticket_plan(ps, mem, layouts, only_data=on == "data")
