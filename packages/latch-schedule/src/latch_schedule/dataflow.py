"""The ``dataflow`` strategy: every task waits only for the tasks that produce what it reads.

1. Placement: list scheduling over the estimated costs. Tasks are ranked by their critical path to
   the end of the program (bottom level); whenever an SM becomes free it takes the highest-ranked
   task whose producers have finished (a cross-SM dependency adds ``sync_seconds``). Each SM runs
   its tasks in start order, and task ids are renumbered by start time, so ids are a topological
   order and every SM's list runs in increasing id: waits only ever target lower ids, which makes
   the lists deadlock-free whatever the real durations (induction on the id).
2. Synchronisation: for each task and each value it needs ordered (a value it reads, or the old
   value it overwrites in place), the producers on other SMs are summarised by a *frontier*: per
   SM, the last producer in that SM's list (program order covers the earlier ones). A frontier
   the consumer's SM already knows about entirely (through its earlier waits, or program order)
   needs no wait. Any other frontier is a counter, keyed by the whole frontier: one ``signal`` after each frontier task, and
   a ``wait`` for all of them before the consumer. Consumers with the same frontier share one
   counter. A task whose frontiers are used by no other task waits on their union instead (one
   counter, one wait). No barriers: a counter is a barrier that only its consumers wait at.
"""

from __future__ import annotations

import heapq
from typing import Any

from latch_core.sections import SIGNAL, TASK, WAIT, Counter, ProgramSchedule, Task

from .tasks import TaskGraph


def _place(tg: TaskGraph, num_sms: int, sync_seconds: float) -> tuple[list[int], list[float], float]:
    n = len(tg)
    member_of, consumers = tg.member_of, tg.consumers
    rank = [0.0] * n
    drank: list[float | None] = [None] * len(tg.depsets)
    for t in reversed(tg.topo):
        best = 0.0
        for d in member_of[t]:
            r = drank[d]
            if r is None:  # every consumer of d comes later in topological order: ranked
                r = drank[d] = max(rank[c] for c in consumers[d])
            if r > best:
                best = r
        rank[t] = tg.cost[t] + best
    npred = [len(ds) for ds in tg.task_deps]
    left = [len(m) for m in tg.depsets]
    dready = [0.0] * len(tg.depsets)
    ready = [0.0] * n
    pending = [(0.0, -rank[t], t) for t in range(n) if npred[t] == 0]
    heapq.heapify(pending)
    released: list[tuple[float, int]] = []
    sms = [(0.0, s) for s in range(num_sms)]
    sm_of = [0] * n
    start = [0.0] * n
    makespan = 0.0
    done = 0
    while done < n:
        free, s = heapq.heappop(sms)
        while pending and pending[0][0] <= free:
            _, r, t = heapq.heappop(pending)
            heapq.heappush(released, (r, t))
        if not released:
            at = pending[0][0]
            while pending and pending[0][0] <= at:
                _, r, t = heapq.heappop(pending)
                heapq.heappush(released, (r, t))
            free = max(free, at)
        _, t = heapq.heappop(released)
        st = max(free, ready[t])
        fin = st + tg.cost[t]
        sm_of[t], start[t] = s, st
        makespan = max(makespan, fin)
        heapq.heappush(sms, (fin, s))
        done += 1
        for d in member_of[t]:
            if fin + sync_seconds > dready[d]:
                dready[d] = fin + sync_seconds
            left[d] -= 1
            if left[d] == 0:
                for x in consumers[d]:
                    if dready[d] > ready[x]:
                        ready[x] = dready[d]
                    npred[x] -= 1
                    if npred[x] == 0:
                        heapq.heappush(pending, (ready[x], -rank[x], x))
    return sm_of, start, makespan


def schedule_program(tg: TaskGraph, num_sms: int, sync_seconds: float = 1.0e-6) -> tuple[ProgramSchedule, dict[str, Any]]:
    n = len(tg)
    sm_of, start, makespan = _place(tg, num_sms, sync_seconds)
    topo_pos = {t: i for i, t in enumerate(tg.topo)}
    order = sorted(range(n), key=lambda t: (start[t], topo_pos[t]))
    new_id = {old: new for new, old in enumerate(order)}
    S = num_sms

    pos = [0] * n  # position of the (old) task among its SM's tasks
    count = [0] * S
    for old in order:
        s = sm_of[old]
        pos[old] = count[s]
        count[s] += 1
    at: list[list[int]] = [[0] * count[s] for s in range(S)]  # (sm, pos) -> old task
    for old in range(n):
        at[sm_of[old]][pos[old]] = old

    # Pass 1: for each task (in run order), the frontiers its SM does not know to be done yet.
    # ``known[s][x]``: the latest position on SM x that SM s has waited for (directly; what those
    # producers themselves waited for is not propagated, which costs a few redundant waits but
    # keeps this pass O(frontier) per wait instead of O(SMs)). Knowledge only grows, so a
    # dependency set once known to an SM stays known (``done``).
    known = [[-1] * S for _ in range(S)]
    done: list[set[int]] = [set() for _ in range(S)]
    needs: list[list[tuple]] = [[] for _ in range(n)]
    uses: dict[tuple, int] = {}
    frontier: list[tuple | None] = [None] * len(tg.depsets)
    for old in order:
        s = sm_of[old]
        mine = known[s]
        mine[s] = pos[old] - 1  # program order
        seen = done[s]
        keys = []
        for d in tg.task_deps[old]:
            if d in seen:
                continue
            key = frontier[d]
            if key is None:
                f: dict[int, int] = {}
                for p in tg.depsets[d]:
                    x = sm_of[p]
                    if pos[p] > f.get(x, -1):
                        f[x] = pos[p]
                key = frontier[d] = tuple(sorted(f.items()))
            seen.add(d)
            # Producers on the consumer's own SM are ordered by program order. The key keeps
            # them anyway (their signal is already delivered when the wait runs), and a partly
            # known frontier is waited for as a whole: so every consumer of the same producers,
            # on whatever SM, shares one counter.
            for x, q in key:
                if q > mine[x]:
                    break
            else:
                continue
            if key not in keys:
                keys.append(key)
        for key in keys:
            uses[key] = uses.get(key, 0) + 1
            for x, q in key:
                if q > mine[x]:
                    mine[x] = q
        needs[old] = keys

    # Pass 2: merge a task's private frontiers into one; number the counters.
    counter_id: dict[tuple, int] = {}
    waits_of: list[list[int]] = [[] for _ in range(n)]
    signals_at: dict[tuple[int, int], list[int]] = {}
    for old in order:
        keys = needs[old]
        if len(keys) > 1 and all(uses[k] == 1 for k in keys):
            merged: dict[int, int] = {}
            for k in keys:
                for x, q in k:
                    merged[x] = max(merged.get(x, -1), q)
            keys = [tuple(sorted(merged.items()))]
        for key in keys:
            c = counter_id.get(key)
            if c is None:
                c = counter_id[key] = len(counter_id)
                for x, q in key:
                    signals_at.setdefault((x, q), []).append(c)
            waits_of[old].append(c)

    counters = [Counter(id=c, expected=len(key)) for key, c in sorted(counter_id.items(), key=lambda kv: kv[1])]
    sms: list[list[tuple]] = [[] for _ in range(S)]
    nwaits = nsignals = 0
    for old in order:
        s = sm_of[old]
        for c in waits_of[old]:
            sms[s].append((WAIT, c, counters[c].expected))
            nwaits += 1
        sms[s].append((TASK, new_id[old]))
        for c in signals_at.get((s, pos[old]), ()):
            sms[s].append((SIGNAL, c))
            nsignals += 1
    tasks = [Task(id=new_id[old], group=tg.group_of[old], tile=tg.tiles[old], reads=tg.reads[old],
                  writes=tg.writes[old], cost=tg.cost[old], phase=-1) for old in order]
    ps = ProgramSchedule(program=tg.program, groups=tg.groups, tasks=tasks, sms=sms, counters=counters,
                         num_barriers=0)
    busy = sum(tg.cost)
    stats = {
        "tasks": n, "groups": len(tg.groups), "counters": len(counters), "waits": nwaits,
        "signals": nsignals, "bodies": len({g.body for g in tg.groups}),
        "counters_spanning_all_sms": sum(1 for k in counter_id if len(k) >= S - 1),
        "est_seconds": round(makespan, 9),
        "est_idle_fraction": round(1.0 - busy / (S * makespan), 4) if makespan > 0 else 0.0,
    }
    return ps, stats
