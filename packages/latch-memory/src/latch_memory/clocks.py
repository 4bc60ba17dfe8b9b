"""Happens-before between the tasks of one program schedule, as vector clocks.

The memory planner asks one question many times: "does every task that uses value A happen before
every task that writes value B?" (then B may reuse A's bytes). Pairwise ``before(a, b)`` queries
over tiles would be quadratic, so this module computes, once per schedule, a vector clock per task:
``clock[t][s]`` = how many instructions of SM ``s`` are guaranteed to have completed before task
``t`` starts. Then ``a`` happens before ``b`` iff ``clock[b][sm(a)] > index(a)``, and the set
question reduces to comparing two per-SM vectors (see :meth:`Clocks.all_before`).

Semantics (latch_core.sections): program order on an SM; a grid barrier joins every SM's knowledge;
``("signal", c)`` publishes everything before it on its SM; ``("wait", c, n)`` passes once ``c`` has
received ``n`` signals. Which ``n`` signals is not fixed when ``n`` is below the counter's
``expected``, so a wait learns, per SM component, only the ``n``-th smallest clock among the
counter's signals (whichever ``n`` arrived, their maximum is at least that). Signals not yet seen
when the wait passes count as zero: the result is never stronger than the truth (conservative),
which for memory planning only costs reuse, never correctness.

The clocks are computed along one legal execution (SMs stepped round-robin), whose task order is
also the linear order the liveness intervals are measured in (:attr:`Clocks.order`).
"""

from __future__ import annotations

from latch_core.sections import BARRIER, SIGNAL, TASK, WAIT, ProgramSchedule


class ScheduleError(ValueError):
    """The schedule cannot be executed as written (deadlock, a task listed twice or never)."""


def _describe(ins: tuple) -> str:
    if ins[0] == TASK:
        return f"task {ins[1]}"
    if ins[0] == BARRIER:
        return f"barrier {ins[1]}"
    if ins[0] == WAIT:
        return f"wait(counter {ins[1]} >= {ins[2]})"
    if ins[0] == SIGNAL:
        return f"signal(counter {ins[1]})"
    return repr(ins)


class Clocks:
    """Vector clocks and one legal execution order of a :class:`ProgramSchedule`'s tasks."""

    def __init__(self, ps: ProgramSchedule):
        self.program = ps.program
        self.num_sms = n_sms = len(ps.sms)
        n_tasks = len(ps.tasks)
        for i, t in enumerate(ps.tasks):
            if t.id != i:
                raise ScheduleError(f"program {ps.program!r}: tasks[{i}] has id {t.id}; task ids must equal their index")
        self.sm_of = [-1] * n_tasks
        self.index_of = [-1] * n_tasks  # instruction index on its SM
        for s, sm in enumerate(ps.sms):
            for i, ins in enumerate(sm):
                if ins[0] not in (TASK, BARRIER, WAIT, SIGNAL):
                    raise ScheduleError(f"program {ps.program!r}: SM {s} instruction {i} {ins!r} has an unknown kind")
                if ins[0] == TASK:
                    t = ins[1]
                    if not 0 <= t < n_tasks:
                        raise ScheduleError(f"program {ps.program!r}: SM {s} instruction {i} names task {t}, which does not exist")
                    if self.sm_of[t] >= 0:
                        raise ScheduleError(
                            f"program {ps.program!r}: task {t} is listed twice (SM {self.sm_of[t]} and SM {s}); "
                            "each task must run exactly once")
                    self.sm_of[t], self.index_of[t] = s, i
        missing = [t for t in range(n_tasks) if self.sm_of[t] < 0]
        if missing:
            raise ScheduleError(f"program {ps.program!r}: tasks {missing[:10]} are on no SM's instruction list")
        expected = {c.id: c.expected for c in ps.counters}
        for s, sm in enumerate(ps.sms):
            for i, ins in enumerate(sm):
                if ins[0] in (WAIT, SIGNAL) and ins[1] not in expected:
                    raise ScheduleError(f"program {ps.program!r}: SM {s} instruction {i} {_describe(ins)} names an undeclared counter")

        self.clock: list[tuple[int, ...]] = [()] * n_tasks
        self.order: list[int] = []
        vc = [[0] * n_sms for _ in range(n_sms)]
        cursor = [0] * n_sms
        signals: dict[int, list[tuple[int, ...]]] = {c: [] for c in expected}
        lists = ps.sms
        done = 0
        total = sum(len(sm) for sm in lists)
        while done < total:
            progressed = False
            for s in range(n_sms):
                sm, v = lists[s], vc[s]
                while cursor[s] < len(sm):
                    i = cursor[s]
                    ins = sm[i]
                    kind = ins[0]
                    if kind == TASK:
                        self.clock[ins[1]] = tuple(v)
                        self.order.append(ins[1])
                    elif kind == SIGNAL:
                        v[s] = i + 1
                        signals[ins[1]].append(tuple(v))
                    elif kind == WAIT:
                        got = signals[ins[1]]
                        need = ins[2]
                        if len(got) < need:
                            break
                        if need > 0:
                            v[:] = map(max, v, _nth_smallest(got, need, expected[ins[1]], n_sms))
                    elif kind == BARRIER:
                        if not self._barrier_ready(lists, cursor, ins[1]):
                            break
                        joined = list(map(max, *vc)) if n_sms > 1 else list(vc[0])
                        for s2 in range(n_sms):
                            vc[s2][:] = joined
                            vc[s2][s2] = cursor[s2] + 1
                            cursor[s2] += 1
                        done += n_sms
                        progressed = True
                        v = vc[s]
                        continue
                    v[s] = i + 1
                    cursor[s] += 1
                    done += 1
                    progressed = True
            if not progressed:
                blocked = [f"SM {s}: {_describe(lists[s][cursor[s]])}" if cursor[s] < len(lists[s]) else f"SM {s}: finished"
                           for s in range(n_sms)]
                raise ScheduleError(f"program {ps.program!r}: deadlock, no SM can proceed; " + "; ".join(blocked))
        self.position = [0] * n_tasks
        for p, t in enumerate(self.order):
            self.position[t] = p

    @staticmethod
    def _barrier_ready(lists, cursor, bid) -> bool:
        for s, sm in enumerate(lists):
            c = cursor[s]
            if c >= len(sm) or sm[c][0] != BARRIER or sm[c][1] != bid:
                return False
        return True

    def before(self, a: int, b: int) -> bool:
        """Task ``a`` completes before task ``b`` starts, in every legal execution."""
        return a != b and self.clock[b][self.sm_of[a]] > self.index_of[a]

    def done_vector(self, tasks) -> dict[int, int]:
        """Per SM, the instruction count that covers every task in ``tasks`` (sparse)."""
        out: dict[int, int] = {}
        for t in tasks:
            s, i = self.sm_of[t], self.index_of[t] + 1
            if out.get(s, 0) < i:
                out[s] = i
        return out

    def start_vector(self, tasks) -> tuple[int, ...]:
        """Per SM, what is guaranteed complete before every task in ``tasks`` starts."""
        clocks = [self.clock[t] for t in tasks]
        if not clocks:
            return (1 << 62,) * self.num_sms  # no task: nothing to order against
        return tuple(map(min, *clocks)) if len(clocks) > 1 else clocks[0]

    @staticmethod
    def all_before(done: dict[int, int], start: tuple[int, ...]) -> bool:
        """Every task summarised by ``done`` happens before every task summarised by ``start``."""
        return all(start[s] >= i for s, i in done.items())


def _nth_smallest(clocks: list[tuple[int, ...]], n: int, expected: int, width: int) -> list[int]:
    """Per component, the n-th smallest over ``expected`` signal clocks; unseen ones count as 0."""
    if n >= expected and len(clocks) >= expected:
        return list(map(max, *clocks)) if len(clocks) > 1 else list(clocks[0])
    pad = expected - len(clocks)
    out = []
    for k in range(width):
        col = sorted([0] * pad + [c[k] for c in clocks])
        out.append(col[n - 1])
    return out
