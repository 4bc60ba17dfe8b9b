#!/usr/bin/env python
"""Where a barrier schedule's waiting comes from: a profiled run's trace against its planned document.

    .venv/bin/python tools/trace_phases.py TRACE.json[.gz] PLANNED.latch.json [--program update]
        [--top 20] [--gap-us G] [--barrier-us B] [--grab-us 0,0.5,1,2] [--json OUT]

TRACE: the Chrome trace that latch-codegen-h100's timeline writes (one track per SM, named "SM k";
'X' events with args.task are tasks, cat 'wait' events with args.barrier are barrier waits).
PLANNED: the document the run was built from (its schedule section: SM lists, each task's phase and
modelled cost). Task ids are the plan's; the tool checks that every task ran on its planned SM.

An *interval* is what lies between two grid barriers (interval k ends at barrier k); it holds one
or more of the scheduler's phases (several when the chains between them stay on one SM). Printed:
1. per interval: tasks, scheduler phases, measured max / mean SM busy time (us), the wait it causes
   (sum over SMs of max - busy, SM-us), its longest task, the best a static assignment of ITS OWN
   measured times could do (LPT on the measured durations: the "oracle"), and its ops; the top N by
   wait caused, then the total;
2. where the wait comes from: intervals with fewer tasks than SMs, single-phase intervals with
   enough tasks (split into what the assignment could recover and what the task granularity
   leaves), multi-phase intervals; per SM, which SMs wait;
3. per body: measured / modelled time;
4. replays of the update time under other assignments (:func:`replay`), with the trace's own
   per-task gap and barrier cost fitted so that the plan's assignment reproduces the kernel time.

Replays assume a task's duration does not depend on where or when it runs (no L2 sharing effects):
they rank assignments, the GPU decides.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence


@dataclass
class Trace:
    dur: dict[int, float]  # task -> measured duration (us)
    sm: dict[int, int]  # task -> SM it ran on
    start: dict[int, float]  # task -> begin (us)
    kernel_us: float  # the launch's span (first entry to last exit)
    waits: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)  # SM -> (barrier, ts, dur)


@dataclass
class Plan:
    cost: dict[int, float]  # task -> modelled cost (us)
    phase: dict[int, int]  # task -> the scheduler's phase
    body: dict[int, str]  # task -> body key
    ops: dict[int, str]  # task -> the group's op names joined by '+'
    interval: dict[int, int]  # task -> barrier interval (barriers before it in its list)
    sm: dict[int, int]  # task -> planned SM
    num_sms: int
    num_barriers: int


def _open(path: str):
    return gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)


def read_trace(path_or_events) -> Trace:
    """The tasks and barrier waits of a timeline trace (a path, or the decoded trace object)."""
    if isinstance(path_or_events, (str, bytes)) or hasattr(path_or_events, "__fspath__"):
        with _open(path_or_events) as f:
            data = json.load(f)
    else:
        data = path_or_events
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {(e.get("pid"), e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tr = Trace({}, {}, {}, 0.0, defaultdict(list))
    lo, hi = float("inf"), float("-inf")
    for e in events:
        if e.get("ph") != "X":
            continue
        name = names.get((e.get("pid"), e.get("tid")), "")
        if not name.startswith("SM "):
            continue
        sm = int(name.split()[1])
        lo, hi = min(lo, e["ts"]), max(hi, e["ts"] + e["dur"])
        args = e.get("args", {})
        if e.get("cat") == "wait" and "barrier" in args:
            tr.waits[sm].append((int(args["barrier"]), e["ts"], e["dur"]))
        elif "task" in args:
            t = int(args["task"])
            if t in tr.dur:
                raise SystemExit(f"trace_phases: task {t} appears twice in the trace (on SM {tr.sm[t]} and "
                                 f"SM {sm}); give the trace of ONE launch")
            tr.dur[t], tr.sm[t], tr.start[t] = float(e["dur"]), sm, float(e["ts"])
    if not tr.dur:
        raise SystemExit("trace_phases: no task events on tracks named 'SM k' in the trace")
    tr.kernel_us = hi - lo
    tr.waits = dict(tr.waits)
    return tr


def read_plan(path_or_doc, program: str | None = None) -> Plan:
    """The schedule of ``program`` (default: the first) from a planned document (path or dict)."""
    if isinstance(path_or_doc, dict):
        doc = path_or_doc
    else:
        with _open(path_or_doc) as f:
            doc = json.load(f)
    sched = doc.get("schedule")
    if not sched:
        raise SystemExit("trace_phases: the document has no schedule section; give the planned document")
    progs = {p["program"]: p for p in sched["programs"]}
    if program is None:
        program = sched["programs"][0]["program"]
    if program not in progs:
        raise SystemExit(f"trace_phases: no program {program!r} in the schedule (it has {sorted(progs)}); "
                         f"pick one with --program")
    p = progs[program]
    nodes = {}
    if doc.get("graph"):
        for g in doc["graph"].get("programs", []):
            if g.get("name") == program:
                nodes = {n["name"]: n.get("op", "") for n in g.get("nodes", [])}
    groups = {g["id"]: g for g in p["groups"]}
    pl = Plan({}, {}, {}, {}, {}, {}, num_sms=int(sched.get("num_sms", len(p["sms"]))), num_barriers=int(p["num_barriers"]))
    for t in p["tasks"]:
        g = groups[t["group"]]
        i = int(t["id"])
        pl.cost[i] = float(t["cost"]) * 1e6
        pl.phase[i] = int(t.get("phase", 0))
        pl.body[i] = g.get("body", str(g["id"]))
        ops = [nodes.get(n, n).split("::")[-1] for n in g.get("nodes", [])]
        pl.ops[i] = "+".join(ops) if nodes else pl.body[i].split("/")[0]
    for s, lst in enumerate(p["sms"]):
        k = 0
        for kind, i in lst:
            if kind == "barrier":
                k += 1
            elif kind == "task":
                pl.interval[int(i)], pl.sm[int(i)] = k, s
    return pl


def check(plan: Plan, tr: Trace) -> None:
    missing = [t for t in plan.cost if t not in tr.dur]
    extra = [t for t in tr.dur if t not in plan.cost]
    moved = [t for t in tr.dur if t in plan.sm and plan.sm[t] != tr.sm[t]]
    if missing or extra:
        raise SystemExit(f"trace_phases: the trace and the plan disagree: {len(missing)} planned tasks not in the "
                         f"trace (e.g. {missing[:3]}), {len(extra)} traced tasks not planned (e.g. {extra[:3]}); "
                         f"give the planned document the run was built from")
    if moved:
        print(f"note: {len(moved)} tasks ran on another SM than planned (a ticketed or dataflow run?); "
              f"the per-interval numbers use the SMs they ran on", file=sys.stderr)


def intervals(plan: Plan) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for t, k in plan.interval.items():
        out[k].append(t)
    return {k: sorted(v) for k, v in sorted(out.items())}


def lpt(tasks: Sequence[int], est: Callable[[int], float], num_sms: int) -> dict[int, int]:
    """latch_schedule.assign.lpt's rule (largest estimate first to the least-loaded SM, ties to the
    lower SM and the lower task id), written out so the tool needs no installed package."""
    heap = [(0.0, s) for s in range(num_sms)]
    where = {}
    for t in sorted(tasks, key=lambda t: (-est(t), t)):
        load, s = heapq.heappop(heap)
        where[t] = s
        heapq.heappush(heap, (load + est(t), s))
    return where


def queue_makespan(tasks: Sequence[int], order_key: Callable[[int], float], dur: dict[int, float],
                   num_sms: int, grab: float, gap: float) -> float:
    """A shared queue (the tickets scheduler): tasks in ``order_key`` order, longest first; each SM takes
    the next one when it frees up, paying ``grab`` us for the ticket on top of the usual ``gap``."""
    heap = [(0.0, s) for s in range(num_sms)]
    heapq.heapify(heap)
    end = 0.0
    for t in sorted(tasks, key=lambda t: (-order_key(t), t)):
        free, s = heapq.heappop(heap)
        done = free + grab + gap + dur[t]
        end = max(end, done)
        heapq.heappush(heap, (done, s))
    return end


def busy_by_sm(tasks: Iterable[int], where: dict[int, int], dur: dict[int, float]) -> tuple[dict, dict]:
    busy: dict[int, float] = defaultdict(float)
    count: Counter = Counter()
    for t in tasks:
        busy[where[t]] += dur[t]
        count[where[t]] += 1
    return busy, count


def span(tasks, where, dur, gap) -> float:
    busy, count = busy_by_sm(tasks, where, dur)
    return max((busy[s] + gap * count[s] for s in busy), default=0.0)


def phase_rows(plan: Plan, tr: Trace) -> list[dict]:
    rows = []
    S = plan.num_sms
    for k, ts in intervals(plan).items():
        busy, _ = busy_by_sm(ts, tr.sm, tr.dur)
        m = max(busy.values())
        total = sum(busy.values())
        model_busy, _ = busy_by_sm(ts, tr.sm, plan.cost)
        oracle = span(ts, lpt(ts, tr.dur.__getitem__, S), tr.dur, 0.0)
        ops = Counter(plan.ops[t] for t in ts)
        rows.append(dict(
            interval=k, tasks=len(ts), phases=sorted({plan.phase[t] for t in ts}),
            max_us=m, mean_us=total / S, wait_sm_us=S * m - total, longest_us=max(tr.dur[t] for t in ts),
            oracle_us=oracle, model_max_us=max(model_busy.values()),
            ops=[f"{n} x{c}" for n, c in ops.most_common(3)]))
    return rows


def breakdown(rows: list[dict], num_sms: int) -> dict[str, dict]:
    """The wait caused (SM-us), by kind of interval; for single-phase ones, the part an assignment of
    the measured times recovers (max - oracle) and the part the granularity leaves (oracle - mean)."""
    out: dict[str, dict] = {}
    for r in rows:
        if len(r["phases"]) > 1:
            kind = "several phases (same-SM chains)"
        elif r["tasks"] < num_sms:
            kind = f"fewer tasks than SMs (< {num_sms})"
        else:
            kind = f"one phase, >= {num_sms} tasks"
        b = out.setdefault(kind, Counter())
        b["intervals"] += 1
        b["tasks"] += r["tasks"]
        b["wait_sm_us"] += r["wait_sm_us"]
        b["sum_max_us"] += r["max_us"]
        if len(r["phases"]) == 1:
            b["assignment_sm_us"] += num_sms * (r["max_us"] - r["oracle_us"])
            b["granularity_sm_us"] += num_sms * (r["oracle_us"] - r["mean_us"])
            b["longest_task_sm_us"] += num_sms * max(0.0, r["longest_us"] - r["mean_us"])
    return {k: dict(v) for k, v in out.items()}


def body_rows(plan: Plan, tr: Trace) -> list[dict]:
    acc: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, []])
    for t, d in tr.dur.items():
        a = acc[plan.body[t]]
        a[0] += 1
        a[1] += d
        a[2] += plan.cost[t]
        a[3].append(d)
    rows = [dict(body=b, ops=b.split("/")[0],
                 tasks=n, measured_ms=m / 1e3, model_ms=c / 1e3, factor=(m / c if c > 0 else float("inf")),
                 cv=(statistics.pstdev(ds) / (m / n) if n > 1 and m > 0 else 0.0))
            for b, (n, m, c, ds) in acc.items()]
    return sorted(rows, key=lambda r: -r["measured_ms"])


def fit_overheads(plan: Plan, tr: Trace) -> tuple[float, float]:
    """(gap, barrier) in us: the median gap between consecutive tasks of an SM within an interval, and
    the barrier cost that makes the plan's own replay equal the traced kernel time."""
    per_sm: dict[int, list[int]] = defaultdict(list)
    for t in tr.dur:
        per_sm[tr.sm[t]].append(t)
    gaps = []
    for ts in per_sm.values():
        ts.sort(key=tr.start.__getitem__)
        for a, b in zip(ts, ts[1:]):
            if plan.interval[a] == plan.interval[b]:
                gaps.append(tr.start[b] - tr.start[a] - tr.dur[a])
    gap = statistics.median(gaps) if gaps else 0.0
    iv = intervals(plan)
    body = sum(span(ts, tr.sm, tr.dur, gap) for ts in iv.values())
    barrier = max(0.0, (tr.kernel_us - body) / max(1, plan.num_barriers))
    return gap, barrier


def replay(plan: Plan, dur: dict[int, float], *, gap: float, barrier: float,
           assign: Callable[[list[int]], dict[int, int]] | None = None,
           queue_grab: float | None = None, queue_order: Callable[[int], float] | None = None,
           queued: set[int] | None = None) -> float:
    """Predicted update time (us): the sum over intervals of the slowest SM's (busy + gap per task), plus
    ``barrier`` per barrier. Single-phase intervals are re-assigned by ``assign`` (None: the plan's
    SMs); intervals of several phases keep the plan's SMs (their same-SM chains are what spares their
    barriers). With ``queue_grab``, the intervals in ``queued`` (default: every single-phase interval)
    run as a shared queue in ``queue_order`` (default: the modelled cost) instead."""
    total = 0.0
    for k, ts in intervals(plan).items():
        single = len({plan.phase[t] for t in ts}) == 1
        if queue_grab is not None and (k in queued if queued is not None else single):
            total += queue_makespan(ts, queue_order or plan.cost.__getitem__, dur, plan.num_sms, queue_grab, gap)
        elif assign is not None and single:
            total += span(ts, assign(ts), dur, gap)
        else:
            total += span(ts, plan.sm, dur, gap)
    return total + barrier * plan.num_barriers


def body_factors(plan: Plan, tr: Trace) -> dict[str, float]:
    rows = body_rows(plan, tr)
    return {r["body"]: r["factor"] for r in rows}


def replays(plan: Plan, tr: Trace, grabs: Sequence[float]) -> list[tuple[str, float]]:
    gap, bar = fit_overheads(plan, tr)
    S = plan.num_sms
    fac = body_factors(plan, tr)
    out = [
        ("the plan's assignment (reproduces the trace)", replay(plan, tr.dur, gap=gap, barrier=bar)),
        ("LPT on the model's costs (the scheduler's rule)",
         replay(plan, tr.dur, gap=gap, barrier=bar, assign=lambda ts: lpt(ts, plan.cost.__getitem__, S))),
        ("LPT on the model x measured per-body factor",
         replay(plan, tr.dur, gap=gap, barrier=bar,
                assign=lambda ts: lpt(ts, lambda t: plan.cost[t] * fac[plan.body[t]], S))),
        ("LPT on the measured per-task times (oracle)",
         replay(plan, tr.dur, gap=gap, barrier=bar, assign=lambda ts: lpt(ts, tr.dur.__getitem__, S))),
        ("no imbalance at all (mean SM busy + gaps)", sum(
            sum(tr.dur[t] for t in ts) / S + gap * len(ts) / S for ts in intervals(plan).values()) + bar * plan.num_barriers),
    ]
    for g in grabs:
        out.append((f"shared queue in every single-phase interval, {g:g} us a ticket",
                    replay(plan, tr.dur, gap=gap, barrier=bar, queue_grab=g)))
    data = data_intervals(plan)
    for g in grabs:
        out.append((f"shared queue only in the {len(data)} intervals of data-dependent bodies ({'/'.join(DATA_BODIES)}), "
                    f"{g:g} us a ticket", replay(plan, tr.dur, gap=gap, barrier=bar, queue_grab=g, queued=data)))
    return out


# Bodies whose time depends on the data (how many rows each expert gets is known only at run time):
# the cost model cannot balance them, a shared queue can (results/wt.md: their cv within one body 0.34-0.58).
# The rule of the scheduler tickets_data (latch_codegen_h100.tickets.DATA_BODIES / data_groups: the body
# key's op), repeated here because this tool reads the planned document's JSON without the packages.
DATA_BODIES = ("ragged_mm",)


def data_intervals(plan: Plan, ops: tuple[str, ...] = DATA_BODIES) -> set[int]:
    """Single-phase intervals holding at least two tasks of a data-dependent body (its key's op starts with
    an ``ops`` entry): the intervals tickets_data queues."""
    out = set()
    for k, ts in intervals(plan).items():
        if len({plan.phase[t] for t in ts}) == 1 and sum(plan.body[t].split("/")[0].startswith(ops) for t in ts) >= 2:
            out.add(k)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("planned")
    ap.add_argument("--program", default=None)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--grab-us", default="0,0.5,1,2", help="ticket costs (us) for the shared-queue replays")
    ap.add_argument("--json", default=None, help="write every table to this file")
    a = ap.parse_args(argv)
    tr = read_trace(a.trace)
    plan = read_plan(a.planned, a.program)
    check(plan, tr)
    S = plan.num_sms
    rows = phase_rows(plan, tr)
    tot_wait = sum(r["wait_sm_us"] for r in rows)
    print(f"{len(tr.dur)} tasks, {plan.num_barriers} barriers, {S} SMs; kernel {tr.kernel_us / 1e3:.3f} ms in the trace")
    print(f"\nintervals by wait caused (top {a.top} of {len(rows)}); times in us, wait in SM-us")
    print(f"{'k':>4} {'tasks':>5} {'phases':>9} {'max':>8} {'mean':>8} {'wait':>8} {'longest':>8} {'oracle':>8} {'model':>8}  ops")
    for r in sorted(rows, key=lambda r: -r["wait_sm_us"])[: a.top]:
        ph = r["phases"]
        phs = str(ph[0]) if len(ph) == 1 else f"{ph[0]}-{ph[-1]}"
        print(f"{r['interval']:>4} {r['tasks']:>5} {phs:>9} {r['max_us']:>8.1f} {r['mean_us']:>8.1f} {r['wait_sm_us']:>8.0f} "
              f"{r['longest_us']:>8.1f} {r['oracle_us']:>8.1f} {r['model_max_us']:>8.1f}  {', '.join(r['ops'])[:70]}")
    print(f"total wait caused: {tot_wait / 1e3:.1f} SM-ms = {tot_wait / S / 1e3:.3f} ms per SM; "
          f"sum over intervals of the slowest SM's busy time {sum(r['max_us'] for r in rows) / 1e3:.3f} ms, "
          f"of the mean {sum(r['mean_us'] for r in rows) / 1e3:.3f} ms")
    print("\nwhere the wait comes from (SM-ms; per SM = / %d)" % S)
    bd = breakdown(rows, S)
    for kind, b in bd.items():
        extra = ""
        if "assignment_sm_us" in b:
            extra = (f"; assignment {b['assignment_sm_us'] / 1e3:.1f}, granularity {b['granularity_sm_us'] / 1e3:.1f}"
                     f" (of which a task longer than the mean {b['longest_task_sm_us'] / 1e3:.1f})")
        print(f"  {kind}: {b['intervals']} intervals, {b['tasks']} tasks, wait {b['wait_sm_us'] / 1e3:.1f} "
              f"({b['wait_sm_us'] / tot_wait:.0%}){extra}")
    per_sm = [0.0] * S
    for k, ts in intervals(plan).items():
        busy, _ = busy_by_sm(ts, tr.sm, tr.dur)
        m = max(busy.values())
        for s in range(S):
            per_sm[s] += m - busy.get(s, 0.0)
    order = sorted(range(S), key=lambda s: -per_sm[s])
    print("  per SM (ms, max - busy summed over intervals): most " +
          ", ".join(f"SM {s} {per_sm[s] / 1e3:.2f}" for s in order[:6]) + "; least " +
          ", ".join(f"SM {s} {per_sm[s] / 1e3:.2f}" for s in order[-3:]))
    print("\nper body (top 15 by measured time): measured / modelled")
    brows = body_rows(plan, tr)
    for r in brows[:15]:
        print(f"  {r['body'][:60]:<60} {r['tasks']:>6} {r['measured_ms']:>9.3f} ms  x{r['factor']:.2f}  cv {r['cv']:.2f}")
    m = sum(r["measured_ms"] for r in brows)
    c = sum(r["model_ms"] for r in brows)
    print(f"  all: {m:.3f} ms busy SM-time against the model's {c:.3f} ms ({m / c:.2f}x)")
    gap, bar = fit_overheads(plan, tr)
    print(f"\nreplays (predicted update time, ms; gap {gap:.3f} us a task, barrier {bar:.3f} us fitted to the trace)")
    reps = replays(plan, tr, [float(x) for x in a.grab_us.split(",") if x.strip()])
    for name, us in reps:
        print(f"  {name:<66} {us / 1e3:8.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(intervals=rows, breakdown=bd, bodies=brows, gap_us=gap, barrier_us=bar,
                           replays=[dict(name=n, ms=us / 1e3) for n, us in reps]), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
