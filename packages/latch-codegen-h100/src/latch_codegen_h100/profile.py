"""Where a megakernel launch spends its time: aggregation of a profiling build's records.

A profiling build (``build(doc, out_dir, profile=True)``, compiled with ``-DLATCH_PROFILE=1``)
records, for every instruction an SM executes, a (begin, end) pair of ``%globaltimer`` values, in
nanoseconds, taken by thread 0 of the block (cuda/latch_kernel_main.cuh says exactly where), and
every block's entry and exit. ``%globaltimer`` is one clock for the whole GPU, so records of
different SMs compare directly (``clock64`` would not: it counts each SM's own cycles). Its update
granularity is the device's (nanoseconds on some drivers, up to about a microsecond on others): the
report prints the smallest step it saw as ``timer step``; per-op sums over many tasks average the
rounding out, a single short task does not.

The runtime (``Program.profile()``) returns one :class:`LaunchRecords` per launch; :func:`report`
groups them by program and maps each instruction back to the schedule through the document (the
build directory's ``program.latch.json``): task -> fusion group -> nodes, ops and body.

Accounting for one launch (window K = max exit - min entry over the blocks), per SM list:
  busy         task instructions (loading the task record and operand pointers, the body, the
               block's closing __syncthreads)
  barrier      grid barriers, from arrival to release
  counter      dataflow counter waits
  signal       counter releases (a fence and an atomic add)
  idle start   from the kernel's first block entry to this SM's first instruction
  idle end     from this SM's last instruction to the kernel's last block exit
  other        the rest: gaps between consecutive instructions (fetch and dispatch)
Blocks past the schedule's lists only join the grid barriers: their whole window is ``spare``.
The waiting fraction of the update is sum over SMs of (barrier + counter) / (grid SMs x K).

No torch here: records are plain integers, so the aggregation is tested on the CPU.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import attrs

from latch_core.document import Document

CATEGORIES = ("busy", "barrier", "counter", "signal", "idle_start", "idle_end", "other", "spare")
LABELS = {"busy": "busy", "barrier": "barrier wait", "counter": "counter wait", "signal": "signal",
          "idle_start": "idle at start", "idle_end": "idle at end", "other": "other", "spare": "spare SMs"}
WAIT_TARGET = 0.05  # TARGETS.md: SMs wait at synchronisation for < 5% of the update


class ProfileError(RuntimeError):
    """Records that cannot be what the kernel wrote for this program (missing, out of order)."""


@attrs.frozen(eq=False)
class LaunchRecords:
    """One launch of a profiling build, as read back by the runtime.

    ``instrs[i]``: (begin, end) ns of instruction i of the program's tables (SM lists back to
    back, in the schedule's order); ``blocks[b]``: block b's (entry, exit). (0, 0): not written.
    ``event_ms``: the CUDA-event time of the same launch, where the runtime measured it."""

    program: str
    instrs: Sequence[tuple[int, int]]
    blocks: Sequence[tuple[int, int]]
    event_ms: float | None = None
    # A ticketed phase's queue tasks (tickets.py), in queue order: (begin, duration | block << 40).
    queue: Sequence[tuple[int, int]] = ()


@attrs.frozen
class GroupInfo:
    op: str      # the group's ops joined by '+', in node order, each once
    body: str    # the body signature key (groups with equal keys share one instantiation)
    nodes: tuple[str, ...]
    source: str | None


@attrs.frozen
class ProgramLayout:
    """What the aggregation needs of one scheduled program: its SM lists, in table order, as
    (kind, argument) pairs, the group of every task, and the groups' names."""

    program: str
    sms: tuple[tuple[tuple[str, int], ...], ...]
    task_group: tuple[int, ...]
    groups: dict[int, GroupInfo] = attrs.field(eq=False)
    # The scheduler's cost-model estimate of every task, in seconds (the schedule's ``cost``; empty
    # where unknown): the report sets each op's measured time beside what the model expected.
    task_cost: tuple[float, ...] = ()
    # Ticketed phases (tickets.py): the task ids of each queue, in the order the tables hold them;
    # ``sms`` then holds ("ticket", k) where a phase's tasks were.
    queues: tuple[tuple[int, ...], ...] = ()

    @property
    def num_instrs(self) -> int:
        return sum(len(s) for s in self.sms)

    @property
    def queued(self) -> tuple[int, ...]:
        return tuple(t for q in self.queues for t in q)


QUEUE_BLOCK_SHIFT = 40  # a queue task's record: (begin, duration | block << 40), cuda/latch_kernel_main.cuh


def queue_events(layout: "ProgramLayout", rec: "LaunchRecords") -> list[tuple[int, int, int, int]]:
    """(sm, task, begin, end) of every queue task of one launch."""
    queued = layout.queued
    if len(rec.queue) != len(queued):
        raise ProfileError(f"program {layout.program!r}: {len(rec.queue)} queue-task records, the tables queue "
                           f"{len(queued)} tasks: the build and the document disagree")
    out = []
    mask = (1 << QUEUE_BLOCK_SHIFT) - 1
    for t, (b, d) in zip(queued, rec.queue):
        if not b:
            raise ProfileError(f"program {layout.program!r}: queue task {t} has no record: it did not run "
                               "(aborted launch?) or the records belong to another build")
        out.append((int(d) >> QUEUE_BLOCK_SHIFT, t, int(b), int(b) + (int(d) & mask)))
    return out


def layout_from_document(doc: Document, program: str) -> ProgramLayout:
    if doc.schedule is None or doc.graph is None:
        raise ProfileError("profiling needs a document with graph and schedule sections (the build directory's "
                           "program.latch.json)")
    ps = next((p for p in doc.schedule.programs if p.program == program), None)
    if ps is None:
        raise ProfileError(f"the document schedules no program {program!r}; it has "
                           f"{[p.program for p in doc.schedule.programs]}: is it the build's program.latch.json?")
    g = doc.graph.program(program)
    nodes = {n.name: n for n in g.nodes}
    groups = {}
    for grp in ps.groups:
        ops = []
        for n in grp.nodes:
            op = nodes[n].op if n in nodes else "?"
            if op not in ops:
                ops.append(op)
        src = next((nodes[n].source for n in grp.nodes if n in nodes and nodes[n].source), None)
        groups[grp.id] = GroupInfo("+".join(ops), grp.body, tuple(grp.nodes), src)
    from .tickets import table_lists, tickets_on

    queues: tuple = ()
    lists = ps.sms
    if tickets_on(doc):
        if doc.memory is None:
            raise ProfileError("the document's schedule takes ticketed phases, whose lists depend on the memory plan; "
                               "give the build's program.latch.json (it has the memory section)")
        tp = table_lists(ps, doc.memory.program(program), tickets_on(doc), g)
        lists, queues = tp.sms, tuple(q.tasks for q in tp.queues)
    sms = tuple(tuple((str(ins[0]), int(ins[1])) for ins in sm) for sm in lists)
    return ProgramLayout(program, sms, tuple(t.group for t in ps.tasks), groups,
                         tuple(float(t.cost) for t in ps.tasks), queues)


@attrs.frozen
class SmTime:
    """Nanoseconds of one SM (or one spare block), summed over the launches of a report."""
    sm: int
    tasks: int
    times: dict[str, int] = attrs.field(eq=False)  # CATEGORIES -> ns

    def waiting(self) -> int:
        return self.times["barrier"] + self.times["counter"]


@attrs.frozen
class Row:
    name: str
    tasks: int
    total_ns: int
    share: float  # of the SM-time (grid SMs x kernel time)
    model_ns: float = 0.0  # the cost model's estimate of the same tasks (0: unknown)

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.tasks if self.tasks else 0.0

    @property
    def vs_model(self) -> float | None:
        """Measured / modelled time: 3.0 means the body ran at a third of the model's speed."""
        return self.total_ns / self.model_ns if self.model_ns > 0 else None


@attrs.frozen
class ProgramReport:
    program: str
    launches: int
    kernel_ns: int                 # sum over launches of (max exit - min entry)
    event_ms: float | None         # sum over launches of the CUDA-event times (None: not measured)
    grid: int                      # blocks per launch (SMs)
    lists: int                     # SM lists of the schedule
    sms: tuple[SmTime, ...]        # grid entries (lists first, then spare blocks)
    totals: dict[str, int] = attrs.field(eq=False)   # CATEGORIES -> ns over every SM
    by_op: tuple[Row, ...] = ()
    by_body: tuple[Row, ...] = ()
    by_group: tuple[Row, ...] = ()
    timer_step_ns: int | None = None
    # Per-task overhead: the gaps between one task's end and the next task's start on the same SM,
    # over every pair of consecutive tasks (queue hand-over, operand pointers, dispatch).
    task_gaps_ns: tuple[int, ...] = ()

    @property
    def sm_time_ns(self) -> int:
        return self.grid * self.kernel_ns

    def fraction(self, *cats: str) -> float:
        return sum(self.totals[c] for c in cats) / self.sm_time_ns if self.sm_time_ns else 0.0

    @property
    def waiting_fraction(self) -> float:
        """Sum over SMs of time waiting at barriers and counters / (grid SMs x kernel time)."""
        return self.fraction("barrier", "counter")


def _window(rec: LaunchRecords) -> tuple[int, int]:
    starts = [b for b, e in rec.blocks if b]
    ends = [e for b, e in rec.blocks if e]
    if len(starts) != len(rec.blocks) or len(ends) != len(rec.blocks):
        bad = next(i for i, (b, e) in enumerate(rec.blocks) if not (b and e))
        raise ProfileError(f"program {rec.program!r}: block {bad} has no entry/exit record: the launch did not "
                           "finish cleanly (check Program.check()) or the records are not this build's")
    return min(starts), max(ends)


def _step(values: Iterable[int]) -> int | None:
    vs = sorted(set(values))
    diffs = [b - a for a, b in zip(vs, vs[1:]) if b > a]
    return min(diffs) if diffs else None


def aggregate(layout: ProgramLayout, launches: Sequence[LaunchRecords]) -> ProgramReport:
    """Aggregate the launches of one program (all of ``layout.program``) into a report."""
    if not launches:
        raise ProfileError(f"program {layout.program!r}: no launches to aggregate")
    n = layout.num_instrs
    lists = len(layout.sms)
    grid = len(launches[0].blocks)
    per_sm = [defaultdict(int) for _ in range(max(grid, lists))]
    tasks_on = [0] * len(per_sm)
    by_op: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])  # tasks, measured ns, modelled ns
    by_body: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    by_group: dict[int, list] = defaultdict(lambda: [0, 0, 0.0])
    cost = layout.task_cost
    kernel_ns, step = 0, None
    gaps: list[int] = []
    for rec in launches:
        if rec.program != layout.program:
            raise ProfileError(f"records of program {rec.program!r} given with the layout of {layout.program!r}")
        if len(rec.instrs) != n:
            raise ProfileError(f"program {layout.program!r}: {len(rec.instrs)} instruction records, the schedule "
                               f"has {n} instructions: the build and the document disagree")
        if len(rec.blocks) != grid or grid < lists:
            raise ProfileError(f"program {layout.program!r}: {len(rec.blocks)} block records for {lists} SM lists "
                               f"(first launch: {grid})")
        k0, k1 = _window(rec)
        win = k1 - k0
        kernel_ns += win
        pc = 0
        stamps = [k0, k1]
        queued: dict[int, list] = defaultdict(list)  # sm -> (begin, end, "task", task, -1) of its queue tasks
        for qsm, t, b, e in queue_events(layout, rec) if layout.queues else ():
            if qsm >= len(layout.sms):
                raise ProfileError(f"program {layout.program!r}: queue task {t} ran on block {qsm}, which has no list")
            queued[qsm].append((b, e, "task", t, -1))
        for sm, instrs in enumerate(layout.sms):
            acc = per_sm[sm]
            prev_end, first, busy, prev_task = None, None, 0, False
            events = []
            for kind, arg in instrs:
                if kind != "ticket":  # (a ticket hands its queue's tasks over; it has no record of its own)
                    b, e = rec.instrs[pc]
                    events.append((b, e, kind, arg, pc))
                pc += 1
            if queued.get(sm):
                events = sorted(events + queued[sm], key=lambda x: x[0])
            for b, e, kind, arg, at in events:
                if not b or not e or e < b or b < k0 or e > k1 or (prev_end is not None and b < prev_end):
                    where = f"instruction {at}" if at >= 0 else "queue task"
                    raise ProfileError(
                        f"program {layout.program!r}: SM {sm} {where} ({kind} {arg}) has record ({b}, {e}), "
                        f"not an interval inside the launch [{k0}, {k1}] after the previous one: the instruction "
                        "did not run (aborted launch?) or the records belong to another build")
                d = e - b
                stamps += (b, e)
                if kind == "task":
                    if prev_task:
                        gaps.append(b - prev_end)
                    acc["busy"] += d
                    tasks_on[sm] += 1
                    gid = layout.task_group[arg]
                    info = layout.groups[gid]
                    model = cost[arg] * 1e9 if arg < len(cost) else 0.0
                    for table, key in ((by_op, info.op), (by_body, info.body), (by_group, gid)):
                        table[key][0] += 1
                        table[key][1] += d
                        table[key][2] += model
                elif kind in ("barrier", "wait", "signal"):
                    acc["counter" if kind == "wait" else kind] += d
                else:
                    raise ProfileError(f"program {layout.program!r}: SM {sm} instruction {at} has unknown kind {kind!r}")
                first = b if first is None else first
                prev_end = e
                prev_task = kind == "task"
            if first is None:  # an empty list: the block only passed the barriers
                acc["spare"] += win
                continue
            acc["idle_start"] += first - k0
            acc["idle_end"] += k1 - prev_end
        for sm in range(lists, grid):
            per_sm[sm]["spare"] += win
        s = _step(stamps)
        step = s if step is None else (min(step, s) if s is not None else step)
    # ``other`` per SM over all launches: the summed windows minus every accounted category.
    sms = []
    for sm in range(grid):
        acc = per_sm[sm]
        times = {c: int(acc.get(c, 0)) for c in CATEGORIES}
        times["other"] = kernel_ns - sum(v for c, v in times.items() if c != "other")
        sms.append(SmTime(sm, tasks_on[sm], times))
    totals = {c: sum(s.times[c] for s in sms) for c in CATEGORIES}
    denom = grid * kernel_ns or 1

    def rows(table, name) -> tuple[Row, ...]:
        out = [Row(name(k), v[0], v[1], v[1] / denom, v[2]) for k, v in table.items()]
        return tuple(sorted(out, key=lambda r: (-r.total_ns, r.name)))

    def group_name(gid: int) -> str:
        info = layout.groups[gid]
        nodes = ",".join(info.nodes[:3]) + (",..." if len(info.nodes) > 3 else "")
        src = f" ({info.source})" if info.source else ""
        return f"g{gid} {nodes}{src}"

    return ProgramReport(
        program=layout.program, launches=len(launches), kernel_ns=kernel_ns,
        event_ms=sum(r.event_ms for r in launches) if all(r.event_ms is not None for r in launches) else None,
        grid=grid, lists=lists, sms=tuple(sms), totals=totals,
        by_op=rows(by_op, str), by_body=rows(by_body, str), by_group=rows(by_group, group_name), timer_step_ns=step,
        task_gaps_ns=tuple(gaps),
    )


def report(doc: Document, launches: Sequence[LaunchRecords]) -> list[ProgramReport]:
    """One report per program, in the order the programs first appear in ``launches``."""
    order: list[str] = []
    by_prog: dict[str, list[LaunchRecords]] = defaultdict(list)
    for rec in launches:
        if rec.program not in by_prog:
            order.append(rec.program)
        by_prog[rec.program].append(rec)
    return [aggregate(layout_from_document(doc, p), by_prog[p]) for p in order]


# ------------------------------------------------------------------------------------------
# Printing

def _ms(ns: float) -> str:
    return f"{ns / 1e6:.4f}"


def _short(name: str, width: int) -> str:
    name = name.replace("latch::", "")
    return name if len(name) <= width else name[:width - 3] + "..."


def _table(title: str, rows: Sequence[Row], top: int, width: int = 56) -> list[str]:
    out = [f"  {title} (top {min(top, len(rows))} of {len(rows)} by time):",
           f"    {'name':<{width}s} {'tasks':>7s} {'total ms':>10s} {'share':>7s} {'mean us':>9s} "
           f"{'model us':>9s} {'x model':>8s}"]
    for r in rows[:top]:
        vs = r.vs_model
        model = f"{r.model_ns / r.tasks / 1e3:9.2f}" if r.model_ns > 0 and r.tasks else f"{'-':>9s}"
        out.append(f"    {_short(r.name, width):<{width}s} {r.tasks:7d} {_ms(r.total_ns):>10s} "
                   f"{100 * r.share:6.2f}% {r.mean_ns / 1e3:9.2f} {model} "
                   + (f"{vs:7.2f}x" if vs is not None else f"{'-':>8s}"))
    return out


def format_report(rep: ProgramReport, *, top: int = 15, per_sm: bool = False) -> str:
    per = rep.launches
    ev = f"; CUDA events {rep.event_ms / per:.4f} ms" if rep.event_ms is not None else ""
    step = f"{rep.timer_step_ns} ns" if rep.timer_step_ns is not None else "unknown"
    tasks = sum(s.tasks for s in rep.sms)
    lines = [
        f"PROFILE program {rep.program}: {per} launch(es); kernel {_ms(rep.kernel_ns / per)} ms per launch "
        f"(globaltimer, last exit - first entry{ev}); {rep.grid} SMs ({rep.lists} with a list), "
        f"{tasks // per} tasks per launch; timer step {step}",
        "  SM-time: " + ", ".join(f"{LABELS[c]} {100 * rep.fraction(c):.1f}%" for c in CATEGORIES
                                  if rep.totals[c] or c in ("busy", "barrier", "counter")),
        f"  WAITING at synchronisation: {100 * rep.waiting_fraction:.2f}% of the update's SM-time "
        f"(barriers {100 * rep.fraction('barrier'):.2f}%, counters {100 * rep.fraction('counter'):.2f}%; "
        f"target < {100 * WAIT_TARGET:.0f}%: {'met' if rep.waiting_fraction < WAIT_TARGET else 'NOT met'})",
    ]
    if rep.task_gaps_ns:
        g = sorted(rep.task_gaps_ns)
        lines.append(f"  per-task overhead (gap between consecutive tasks on an SM): median {g[len(g) // 2] / 1e3:.3f} us, "
                     f"mean {sum(g) / len(g) / 1e3:.3f} us, 90th percentile {g[int(0.9 * (len(g) - 1))] / 1e3:.3f} us "
                     f"over {len(g)} pairs")
    listed = [s for s in rep.sms if s.sm < rep.lists]
    if listed:
        lines.append("  per SM, ms per launch (min / median / max over the SMs with a list):")
        for c in ("busy", "barrier", "counter", "idle_start", "idle_end", "other"):
            vs = sorted(s.times[c] / per for s in listed)
            if not any(vs) and c not in ("busy", "barrier"):
                continue
            lines.append(f"    {LABELS[c]:<14s} {_ms(vs[0])} / {_ms(vs[len(vs) // 2])} / {_ms(vs[-1])}")
        worst = sorted(listed, key=lambda s: (-s.waiting(), s.sm))[:5]
        lines.append("  most waiting SMs: " + ", ".join(
            f"SM {s.sm} {_ms(s.waiting() / per)} ms ({100 * s.waiting() / rep.kernel_ns:.0f}%)" for s in worst))
    if per_sm:
        lines.append(f"    {'SM':>4s} {'tasks':>6s} " + " ".join(f"{LABELS[c]:>13s}" for c in CATEGORIES))
        for s in rep.sms:
            lines.append(f"    {s.sm:4d} {s.tasks // per:6d} " + " ".join(f"{_ms(s.times[c] / per):>13s}"
                                                                         for c in CATEGORIES))
    model = sum(r.model_ns for r in rep.by_op)
    if model > 0:
        busy = rep.totals["busy"]
        lines.append(f"  busy SM-time {_ms(busy / per)} ms per launch against the cost model's {_ms(model / per)} ms "
                     f"for the same tasks ({busy / model:.2f}x); below, 'model us' is its estimate per task and "
                     "'x model' measured / modelled (> 1: slower than the model)")
    lines += _table("per op", rep.by_op, top)
    lines += _table("per body", rep.by_body, top)
    lines += _table("per fusion group", rep.by_group, top)
    return "\n".join(lines)


def format_reports(reps: Sequence[ProgramReport], *, top: int = 15, per_sm: bool = False) -> str:
    return "\n".join(format_report(r, top=top, per_sm=per_sm) for r in reps)


__all__ = ["LaunchRecords", "ProgramLayout", "GroupInfo", "SmTime", "Row", "ProgramReport", "ProfileError",
           "layout_from_document", "aggregate", "report", "format_report", "format_reports", "CATEGORIES",
           "WAIT_TARGET"]
