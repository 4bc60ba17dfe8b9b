"""The ``barrier`` strategy: phases of independent tasks separated by grid barriers.

1. Phases: a task's phase is one more than the latest phase among the tasks it depends on (ASAP
   levels), so the tasks of a phase are independent of each other.
2. Each phase's tasks go to SMs by LPT (:mod:`latch_schedule.assign`); an SM runs its tasks phase
   by phase, in task order.
3. Barriers: a dependency between tasks on different SMs needs a barrier somewhere between the
   producer's phase and the consumer's; one on the same SM is ordered by program order already.
   The fewest barriers that serve every such dependency are found exactly by interval stabbing
   (greedy on the right end), so no barrier is ever redundant: removing any one of them leaves
   some consumer unordered after its producer (the mutation tests rely on this).

Task ids are renumbered phase by phase, so every SM's list runs in increasing id order.
"""

from __future__ import annotations

from typing import Any

from latch_core.sections import BARRIER, TASK, ProgramSchedule, Task

from .assign import lpt
from .tasks import TaskGraph


def phases(tg: TaskGraph) -> list[int]:
    level = [0] * len(tg)
    dlevel: list[int | None] = [None] * len(tg.depsets)
    for t in tg.topo:
        best = -1
        for d in tg.task_deps[t]:
            lv = dlevel[d]
            if lv is None:  # every member precedes t in the topological order: all levelled
                lv = dlevel[d] = max(level[p] for p in tg.depsets[d])
            if lv > best:
                best = lv
        level[t] = best + 1
    return level


def stab(intervals: list[tuple[int, int]]) -> list[int]:
    """Fewest points hitting every closed interval [l, r] (greedy by right end; optimal)."""
    points: list[int] = []
    last = None
    for l, r in sorted(intervals, key=lambda iv: (iv[1], iv[0])):
        if last is None or l > last:
            points.append(r)
            last = r
    return points


def schedule_program(tg: TaskGraph, num_sms: int, barrier_seconds: float = 1.0e-6) -> tuple[ProgramSchedule, dict[str, Any]]:
    level = phases(tg)
    nphases = max(level, default=-1) + 1
    by_phase: list[list[int]] = [[] for _ in range(nphases)]
    for t in range(len(tg)):
        by_phase[level[t]].append(t)
    sm_of = [0] * len(tg)
    for tasks in by_phase:
        where, _ = lpt(tasks, tg.cost, num_sms)
        for t, s in where.items():
            sm_of[t] = s

    # A consumer needs a barrier after the latest phase among its producers on other SMs; per
    # dependency set keep the two latest (level, SM) on distinct SMs to answer that in O(1).
    top: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for members in tg.depsets:
        a = b = (-1, -1)
        for p in members:
            cand = (level[p], sm_of[p])
            if cand[0] > a[0]:
                if cand[1] != a[1]:
                    b = a
                a = cand
            elif cand[0] > b[0] and cand[1] != a[1]:
                b = cand
        top.append((a, b))
    intervals = set()
    for t in range(len(tg)):
        s = sm_of[t]
        for d in tg.task_deps[t]:
            a, b = top[d]
            lv = a[0] if a[1] != s else b[0]
            if lv >= 0:
                intervals.add((lv, level[t] - 1))
    after_phase = set(stab(sorted(intervals)))

    order = sorted(range(len(tg)), key=lambda t: (level[t], t))
    new_id = {old: new for new, old in enumerate(order)}
    tasks = [Task(id=new_id[old], group=tg.group_of[old], tile=tg.tiles[old], reads=tg.reads[old],
                  writes=tg.writes[old], cost=tg.cost[old], phase=level[old]) for old in order]
    sms: list[list[tuple]] = [[] for _ in range(num_sms)]
    nb = 0
    makespan = 0.0
    segment = [0.0] * num_sms
    for ph in range(nphases):
        for old in by_phase[ph]:
            sms[sm_of[old]].append((TASK, new_id[old]))
            segment[sm_of[old]] += tg.cost[old]
        if ph in after_phase:
            for lst in sms:
                lst.append((BARRIER, nb))
            nb += 1
            makespan += max(segment) + barrier_seconds
            segment = [0.0] * num_sms
    makespan += max(segment, default=0.0)
    sms = [_sorted_runs(lst) for lst in sms]  # each SM runs its tasks in increasing id
    ps = ProgramSchedule(program=tg.program, groups=tg.groups, tasks=tasks, sms=sms, counters=(), num_barriers=nb)
    busy = sum(tg.cost)
    stats = {
        "tasks": len(tg), "groups": len(tg.groups), "phases": nphases, "barriers": nb,
        "bodies": len({g.body for g in tg.groups}),
        "est_seconds": round(makespan, 9),
        "est_idle_fraction": round(1.0 - busy / (num_sms * makespan), 4) if makespan > 0 else 0.0,
    }
    return ps, stats


def _sorted_runs(lst: list[tuple]) -> list[tuple]:
    """Sort each maximal run of task instructions by id (barriers stay where they are)."""
    out: list[tuple] = []
    run: list[tuple] = []
    for ins in lst:
        if ins[0] == TASK:
            run.append(ins)
        else:
            out.extend(sorted(run, key=lambda i: i[1]))
            run = []
            out.append(ins)
    out.extend(sorted(run, key=lambda i: i[1]))
    return out
