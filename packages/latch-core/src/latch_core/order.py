"""Happens-before between the tasks of a :class:`~latch_core.sections.ProgramSchedule`.

The only source of ordering on the GPU is what the SM instruction lists say:

- program order: instructions of one SM run one after another (one persistent block per SM);
- barriers: ``("barrier", b)`` is grid-wide; everything an SM did before it happens-before
  everything any SM does after it. The kernel's arithmetic fixes the form (``latch_kernel_main.cuh``:
  one arrival word, barrier ``k`` of launch ``e`` waits for ``(e * num_barriers + k + 1) * grid``
  arrivals, and blocks without a list run barriers ``0..num_barriers-1``): every list must run
  exactly the barriers ``0, 1, ..., num_barriers - 1``, in that order. Any other form is refused
  (a repeated id is a barrier that orders nothing, swapped ids deadlock, a missing or extra one
  shifts the next launch's targets); :func:`kernel_barrier_problems` names the culprit;
- counters: ``("signal", c)`` is a release increment issued after the SM's previous instructions;
  ``("wait", c, n)`` spins until ``c`` has received ``n`` signals in this launch (acquire).

Representation: vector clocks. For a task ``t`` at index ``i`` of SM ``s``, ``clock(t)[k]`` is the
largest instruction index on SM ``k`` known to happen-before ``t`` (``-1``: none), with
``clock(t)[s] = i - 1``. Then ``a`` happens-before ``b`` iff ``index(a) <= clock(b)[sm(a)]``: an O(1)
query. An SM's clock only changes at waits and barriers, so tasks between two synchronisation
points share one clock (memory is one clock per synchronisation point, not per task).

Arithmetic: during the abstract execution a clock is one Python int packing one 32-bit field per
SM, holding ``clock[k] + 1`` (a count of SM ``k``'s instructions known done, so never negative).
A join (component-wise max) of two clocks is then a handful of big-int operations (a SWAR max:
each field's guard bit, bit 31, says which side is larger) instead of one Python call per SM;
at 132 SMs this is ~8x faster than ``map(max, ...)`` and is what makes ~150,000 waits and signals
affordable. Tasks keep the unpacked counts (an int array per synchronisation point) for O(1) queries.
Fields never carry: counts stay below 2**31 (``_structure`` refuses longer lists).

A wait on ``(c, n)`` is guaranteed to follow only the signals that *must* be among the first ``n``:
with ``n`` equal to the counter's ``expected`` count it follows all of them (the join of their
clocks); with ``n < expected`` each clock component takes the ``n``-th smallest value over the
signals that may precede the wait, signals not yet delivered in the simulation counting as ``-1``
(sound, conservative). Latch's own schedulers always wait for ``expected``.

Deadlock: the clocks come from an abstract execution of the lists (any SM that can make progress
does). Progress is monotone (a signal or a barrier release never disables another SM), so if this
execution gets stuck, every execution does: a wait whose count can never be reached, a cycle of
waits across SMs, a barrier some SM never reaches or reaches in another order.
:class:`DeadlockError` names the stuck SMs, their instructions and what each waits for.

API::

    order = Order.from_schedule(ps)        # raises ScheduleOrderError / DeadlockError
    order.before(a, b)                     # task a happens-before task b
    order.ordered(a, b)                    # before(a, b) or before(b, a)
    order.all_before(tasks_a, b)           # every task of tasks_a happens-before b
    order.all_before_all(tasks_a, tasks_b) # every a before every b (memory reuse: readers of the
                                           #   old value before writers of the new one)
    f = order.frontier(tasks_a); m = order.meet(tasks_b); Order.precedes(f, m)
                                           # the same, with both sides computed once and reused
    order.position(t) -> (sm, index); order.clock(t) -> tuple
    order.sequence() -> list[int]          # the tasks in one legal execution order
    legal_order(ps, seed) -> list[int]     # the tasks in a random order the GPU could run them in
    find_deadlock(ps) -> str | None

Cost: building is O(instructions + (waits + signals + barriers) x SMs); ``all_before_all`` is
O(SMs touched x SMs). This module is torch-free and depends only on the section records.
"""

from __future__ import annotations

import random
import sys
import weakref
from array import array
from collections import deque
from typing import Iterable, Sequence

from .sections import BARRIER, SIGNAL, TASK, WAIT, ProgramSchedule
from .errors import UserError

Frontier = dict  # sm -> largest instruction index among some tasks on that SM

# ---- packed clocks (see "Arithmetic" in the module docstring) ---------------------------------
_W = 32  # bits per SM field; bit 31 is the guard bit of the SWAR comparison
_FIELD = (1 << _W) - 1
_LOW = (1 << (_W - 1)) - 1  # a field's value bits
_MAX_COUNT = _LOW  # counts (instruction index + 1) must stay <= this
_TC = next(t for t in "ilh" if array(t).itemsize == 4)  # a 4-byte C int array type


class _Packed:
    """Masks for packed clocks of ``S`` SMs."""

    def __init__(self, S: int):
        self.S = S
        self.nbytes = 4 * S
        ones = int.from_bytes(b"\x01\x00\x00\x00" * S, "little")  # 1 in every field
        self.guard = ones << (_W - 1)
        self.low = ones * _LOW
        everything = (1 << (_W * S)) - 1
        self.clear = [everything ^ (_FIELD << (_W * k)) for k in range(S)]  # all but field k

    def pack(self, counts: Sequence[int]) -> int:
        return int.from_bytes(array(_TC, counts).tobytes(), sys.byteorder)

    def unpack(self, x: int) -> Sequence[int]:
        """The counts as a compact int array (indexing it is as fast as a list's; building a
        list of 132 ints per synchronisation point would cost more than the joins)."""
        a = array(_TC)
        a.frombytes(x.to_bytes(self.nbytes, sys.byteorder))
        return a

    def join(self, x: int, y: int) -> int:
        """Component-wise max. ``(x | guard) - y`` keeps a field's guard bit iff x >= y there
        (no borrow crosses fields: every value is below the guard bit)."""
        keep_x = (((x | self.guard) - y) & self.guard) >> (_W - 1)
        m = keep_x * _LOW  # _LOW in the fields where x >= y (no carries: one bit per field)
        return (x & m) | (y & (m ^ self.low))

    def meet(self, x: int, y: int) -> int:
        """Component-wise min."""
        keep_x = (((x | self.guard) - y) & self.guard) >> (_W - 1)
        m = keep_x * _LOW
        return (y & m) | (x & (m ^ self.low))

    def put(self, x: int, k: int, count: int) -> int:
        """``x`` with field ``k`` set to ``count``."""
        return (x & self.clear[k]) | (count << (_W * k))


class ScheduleOrderError(UserError, ValueError):
    """The instruction lists are malformed (unknown ids, a task listed twice or never, ...)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        head = f"{len(problems)} problem(s) in the schedule's instruction lists:\n  " + "\n  ".join(problems[:20])
        if len(problems) > 20:
            head += f"\n  ... and {len(problems) - 20} more"
        super().__init__(head)


class DeadlockError(ScheduleOrderError):
    """Some SM can never finish its list: the message names each stuck SM and why."""


def _fmt(ins: tuple) -> str:
    if ins[0] == WAIT:
        return f"wait(c{ins[1]} >= {ins[2]})"
    if ins[0] == SIGNAL:
        return f"signal(c{ins[1]})"
    if ins[0] == BARRIER:
        return f"barrier {ins[1]}"
    return f"task {ins[1]}"


def _structure(ps: ProgramSchedule) -> tuple[list[str], list[str], dict[int, int]]:
    """Check ids and shapes of instructions.

    Returns (fatal, soft, counter id -> expected): ``fatal`` problems make the lists meaningless
    (unknown ids, a task listed twice or never); ``soft`` ones (a counter whose signal count differs
    from ``expected``) still allow the abstract execution, which then names the stuck waits."""
    problems: list[str] = []
    soft: list[str] = []
    expected: dict[int, int] = {}
    for c in ps.counters:
        if c.id in expected:
            problems.append(f"program {ps.program!r}: counter id {c.id} is declared twice")
        expected[c.id] = c.expected
    ntasks = len(ps.tasks)
    for i, t in enumerate(ps.tasks):
        if t.id != i:
            problems.append(f"program {ps.program!r}: tasks[{i}] has id {t.id}; task ids must equal their index")
    seen: dict[int, tuple[int, int]] = {}
    signals: dict[int, int] = {c: 0 for c in expected}
    kinds = (TASK, BARRIER, WAIT, SIGNAL)
    for s, sm in enumerate(ps.sms):
        if len(sm) >= _MAX_COUNT:
            problems.append(f"program {ps.program!r} SM {s}: {len(sm)} instructions; at most {_MAX_COUNT - 1} "
                            "per SM are supported (split the program)")
            continue
        for i, ins in enumerate(sm):
            kind = ins[0] if ins else None
            if kind not in kinds:
                problems.append(f"program {ps.program!r} SM {s} instruction {i}: unknown instruction {ins!r}")
                continue
            if len(ins) != (3 if kind == WAIT else 2) or type(ins[1]) is not int or (
                    kind == WAIT and type(ins[2]) is not int):
                problems.append(f"program {ps.program!r} SM {s} instruction {i}: malformed {kind} instruction {ins!r}")
                continue
            if kind == TASK:
                t = ins[1]
                if t in seen or not 0 <= t < ntasks:
                    if t in seen:
                        problems.append(f"program {ps.program!r} SM {s} instruction {i}: task {t} is listed twice "
                                        f"(also SM {seen[t][0]} instruction {seen[t][1]})")
                    else:
                        problems.append(f"program {ps.program!r} SM {s} instruction {i}: task {t} does not exist "
                                        f"({ntasks} tasks)")
                else:
                    seen[t] = (s, i)
                continue
            where = f"program {ps.program!r} SM {s} instruction {i}"
            if kind == BARRIER:
                if not 0 <= ins[1] < ps.num_barriers:
                    problems.append(f"{where}: barrier id {ins[1]} outside 0..{ps.num_barriers - 1}")
            else:
                c = ins[1]
                if c not in expected:
                    problems.append(f"{where}: {_fmt(ins)} names an undeclared counter c{c}")
                elif kind == SIGNAL:
                    signals[c] += 1
                elif ins[2] > expected[c]:
                    soft.append(
                        f"{where}: {_fmt(ins)} waits for more signals than counter c{c} expects ({expected[c]})")
                elif ins[2] < 0:
                    problems.append(f"{where}: {_fmt(ins)} has a negative count")
    soft += kernel_barrier_problems(ps)
    missing = [t for t in range(ntasks) if t not in seen]
    if missing:
        problems.append(f"program {ps.program!r}: {len(missing)} task(s) are on no SM's list, e.g. {missing[:8]}")
    for c, n in signals.items():
        if n != expected[c]:
            soft.append(
                f"program {ps.program!r}: counter c{c} expects {expected[c]} signals but {n} signal "
                f"instruction(s) address it")
    return problems, soft, expected


def kernel_barrier_problems(ps: ProgramSchedule) -> list[str]:
    """Where the lists break the kernel's barrier arithmetic (see the module docstring): on every
    SM the k-th barrier instruction must be barrier k, and there must be exactly ``num_barriers``.
    Also codegen's rule (latch_codegen_h100.codegen._check_sync); a test checks the two agree."""
    out: list[str] = []
    if type(ps.num_barriers) is not int or ps.num_barriers < 0:
        return [f"program {ps.program!r}: num_barriers = {ps.num_barriers!r}; it must be a count (>= 0)"]
    for s, sm in enumerate(ps.sms):
        k = 0
        for i, ins in enumerate(sm):
            if not ins or ins[0] != BARRIER or len(ins) != 2:
                continue
            if ins[1] != k:
                what = ("a barrier id repeated: the kernel counts arrivals, so this barrier would wait for "
                        "arrivals that already happened and order nothing" if type(ins[1]) is int and ins[1] < k
                        else "a later barrier's id: the kernel would wait for more arrivals than the grid makes "
                        "before its next barrier, a deadlock")
                out.append(f"program {ps.program!r} SM {s} instruction {i}: barrier {ins[1]!r} is this SM's barrier "
                           f"#{k}, so it must be barrier {k} (barriers run 0..num_barriers-1 in order on every SM); "
                           f"it is {what}")
                break
            k += 1
        else:
            if k != ps.num_barriers:
                out.append(f"program {ps.program!r} SM {s}: runs {k} barrier(s) but the program declares "
                           f"num_barriers = {ps.num_barriers}; every SM must run every barrier (the kernel's grid "
                           f"barrier needs every block, and the next launch's arrival targets assume all "
                           f"{ps.num_barriers})")
    return out


class _Sim:
    """The abstract execution shared by :class:`Order` and :func:`legal_order`.

    Clocks here are packed ints of counts (``clock + 1`` per SM, see the module docstring);
    ``0`` knows nothing. ``known[t]`` is task ``t``'s clock unpacked (an array of counts, shared by
    the tasks between two synchronisation points of one SM) and ``packed[t]`` the same packed."""

    def __init__(self, ps: ProgramSchedule, expected: dict[int, int], rng: random.Random | None):
        self.ps = ps
        self.expected = expected
        self.rng = rng
        S = len(ps.sms)
        self.S = S
        self.pk = _Packed(S)
        self.ptr = [0] * S
        self.clock: list[int] = [0] * S  # packed
        self.counts: list[Sequence[int] | None] = [None] * S  # clock[s] unpacked, made when a task needs it
        self.count = {c: 0 for c in expected}
        self.cclock = {c: 0 for c in expected}  # packed join of the delivered signals' clocks
        self.partial = {c: [] for c in expected}  # signal clocks (count arrays), for waits with n < expected
        self.waiters: dict[int, list[int]] = {c: [] for c in expected}
        self.barrier_seq: list[int] = []  # the k-th barrier id, as first reached
        self.barrier_k = [0] * S
        self.arrived: dict[int, list[int]] = {}
        self.pos_sm = [-1] * len(ps.tasks)
        self.pos_idx = [-1] * len(ps.tasks)
        self.known: list[Sequence[int] | None] = [None] * len(ps.tasks)
        self.packed: list[int] = [0] * len(ps.tasks)
        self.trace: list[int] = []
        self.problems: list[str] = []
        self._need_partial = {ins[1] for sm in ps.sms for ins in sm
                              if ins and ins[0] == WAIT and ins[1] in expected and ins[2] < expected[ins[1]]}

    def run(self) -> None:
        ps, S = self.ps, self.S
        runnable = list(range(S))
        if self.rng is not None:
            self.rng.shuffle(runnable)
        queue = deque(runnable)
        while queue:
            if self.rng is not None and len(queue) > 1:
                k = self.rng.randrange(len(queue))
                queue.rotate(-k)
            s = queue.popleft()
            self._advance(s, queue)

    def _advance(self, s: int, queue: deque) -> None:
        ps = self.ps
        sm = ps.sms[s]
        i = self.ptr[s]
        rng = self.rng
        pk = self.pk
        join = pk.join
        pos_sm, pos_idx, known, packed, trace = self.pos_sm, self.pos_idx, self.known, self.packed, self.trace
        clock, counts, count, cclock = self.clock, self.counts, self.count, self.cclock
        partial_needed, waiters = self._need_partial, self.waiters
        n_ins = len(sm)
        while i < n_ins:
            ins = sm[i]
            kind = ins[0]
            if kind == TASK:
                t = ins[1]
                pos_sm[t] = s
                pos_idx[t] = i
                mine = counts[s]
                if mine is None:
                    mine = counts[s] = pk.unpack(clock[s])
                known[t] = mine
                packed[t] = clock[s]
                trace.append(t)
                i += 1
                if rng is not None and rng.random() < 0.3:  # interleave SMs at task granularity
                    self.ptr[s] = i
                    queue.append(s)
                    return
            elif kind == SIGNAL:
                c = ins[1]
                count[c] += 1
                # The signal publishes everything SM s did before it: its clock with its own
                # field at instruction i - 1 (count i). Setting, not maxing, is exact: nothing
                # can know of an SM s instruction at or after i before SM s has run it.
                own = pk.put(clock[s], s, i)
                cc = cclock[c]
                cclock[c] = own if cc == 0 else join(cc, own)
                if c in partial_needed:
                    self.partial[c].append(pk.unpack(own))
                ws = waiters[c]
                if ws:
                    still = []
                    for w in ws:
                        if count[c] >= ps.sms[w][self.ptr[w]][2]:
                            queue.append(w)
                        else:
                            still.append(w)
                    waiters[c] = still
                i += 1
            elif kind == WAIT:
                c, n = ins[1], ins[2]
                if count[c] < n:
                    self.ptr[s] = i
                    waiters[c].append(s)
                    return
                if n > 0:
                    if n >= self.expected[c]:
                        src = cclock[c]
                        cur = clock[s]
                        new = src if cur == 0 else join(cur, src)
                        if new != cur:
                            clock[s] = new
                            counts[s] = None
                    else:
                        self._acquire(s, c, n)
                i += 1
            else:  # barrier
                k = self.barrier_k[s]
                b = ins[1]
                if k == len(self.barrier_seq):
                    self.barrier_seq.append(b)
                elif self.barrier_seq[k] != b:
                    self.problems.append(
                        f"program {ps.program!r}: SM {s} reaches barrier {b} as its barrier #{k}, but another "
                        f"SM's barrier #{k} is {self.barrier_seq[k]}: barriers must come in the same order on every SM")
                    self.ptr[s] = i
                    return
                self.ptr[s] = i
                group = self.arrived.setdefault(k, [])
                group.append(s)
                if len(group) == self.S:
                    # Everything any SM did before the barrier (index ptr[x] on SM x, the barrier
                    # itself counting as done) happens-before what follows it; this dominates
                    # every SM's previous clock, so it replaces it.
                    vec = pk.pack([self.ptr[x] + 1 for x in range(self.S)])
                    for x in group:
                        self.clock[x] = vec
                        self.counts[x] = None
                        self.ptr[x] += 1
                        self.barrier_k[x] += 1
                        if x != s:
                            queue.append(x)
                    del self.arrived[k]
                    i = self.ptr[s]
                    continue
                return
        self.ptr[s] = i

    def _acquire(self, s: int, c: int, n: int) -> None:
        if n <= 0:
            return
        if n >= self.expected[c]:
            src = self.cclock[c]
        else:
            # The n-th smallest per component over the delivered signals, with the undelivered
            # ones counted as knowing nothing (count 0).
            got = self.partial[c]
            missing = self.expected[c] - len(got)
            if n <= missing:
                return
            r = n - missing - 1
            src = self.pk.pack([sorted(col)[r] for col in zip(*got)])
        cur = self.clock[s]
        new = src if cur == 0 else self.pk.join(cur, src)
        if new != cur:
            self.clock[s] = new
            self.counts[s] = None

    def stuck(self) -> list[str]:
        """Describe every SM that did not finish (empty when all did)."""
        ps = self.ps
        out = []
        remaining_signals: dict[int, list[int]] = {}
        for s, sm in enumerate(ps.sms):
            for ins in sm[self.ptr[s]:]:
                if ins[0] == SIGNAL:
                    remaining_signals.setdefault(ins[1], []).append(s)
        for s, sm in enumerate(ps.sms):
            i = self.ptr[s]
            if i >= len(sm):
                continue
            ins = sm[i]
            where = f"program {ps.program!r} SM {s} instruction {i}"
            if ins[0] == WAIT:
                c, n = ins[1], ins[2]
                pending = sorted(set(remaining_signals.get(c, ())))
                if self.count[c] + len(remaining_signals.get(c, ())) < n:
                    why = (f"only {self.count[c] + len(remaining_signals.get(c, ()))} signal(s) to c{c} exist "
                           f"in the whole program, it waits for {n}")
                else:
                    why = (f"c{c} has {self.count[c]} of {n} signals; the rest come from SM(s) {pending[:8]}, "
                           f"which are themselves stuck (a cycle of waits)")
                out.append(f"deadlock: {where}: {_fmt(ins)} can never be satisfied: {why}")
            elif ins[0] == BARRIER:
                k = self.barrier_k[s]
                here = set(self.arrived.get(k, ()))
                absent = [x for x in range(self.S) if x not in here]
                done = [x for x in absent if self.ptr[x] >= len(ps.sms[x])]
                why = f"{len(absent)} SM(s) never reach it (e.g. {absent[:8]})"
                if done:
                    why += f"; SM(s) {done[:8]} end their list without this barrier"
                out.append(f"deadlock: {where}: {_fmt(ins)} (barrier #{k}) never completes: {why}")
        return out


_MEMO: dict[int, tuple] = {}  # id(schedule) -> (weak reference to it, its Order)


class Order:
    """Happens-before between tasks; see the module docstring."""

    def __init__(self, ps: ProgramSchedule, sim: _Sim):
        self.program = ps.program
        self.num_sms = sim.S
        self._sm = sim.pos_sm
        self._idx = sim.pos_idx
        self._known = sim.known  # per task: clock + 1 per SM (counts), own SM's field not yet set
        self._packed = sim.packed  # the same, packed (for meets)
        self._pk = sim.pk
        self._trace = sim.trace
        self._meets: dict[tuple, list[int]] = {}  # first task per SM -> meet (callers must not mutate it)

    def sequence(self) -> list[int]:
        """The task ids in one order the lists can run in (the abstract execution's): a linear
        extension of happens-before, free to ask for (no clock arithmetic)."""
        return list(self._trace)

    @classmethod
    def from_schedule(cls, ps: ProgramSchedule) -> "Order":
        # Memo by identity: the memory planner and the validator ask for the same (immutable)
        # schedule in one pipeline; an Order is read-only, so they can share it.
        hit = _MEMO.get(id(ps))
        if hit is not None and hit[0]() is ps:
            return hit[1]
        order = cls._build(ps)
        key = id(ps)
        _MEMO[key] = (weakref.ref(ps, lambda _r, k=key: _MEMO.pop(k, None)), order)
        return order

    @classmethod
    def _build(cls, ps: ProgramSchedule) -> "Order":
        fatal, soft, expected = _structure(ps)
        if fatal:
            raise ScheduleOrderError(fatal + soft)
        sim = _Sim(ps, expected, None)
        sim.run()
        stuck = sim.problems + sim.stuck()
        if stuck:
            raise DeadlockError(soft + stuck)
        if soft:
            raise ScheduleOrderError(soft)
        return cls(ps, sim)

    # ---- queries -----------------------------------------------------------------------------
    def position(self, t: int) -> tuple[int, int]:
        return self._sm[t], self._idx[t]

    def clock(self, t: int) -> tuple[int, ...]:
        c = [k - 1 for k in self._known[t]]
        c[self._sm[t]] = self._idx[t] - 1
        return tuple(c)

    def before(self, a: int, b: int) -> bool:
        sa, sb = self._sm[a], self._sm[b]
        if sa == sb:
            return self._idx[a] < self._idx[b]
        return self._idx[a] < self._known[b][sa]  # index <= clock  <=>  index < clock + 1

    def ordered(self, a: int, b: int) -> bool:
        return self.before(a, b) or self.before(b, a)

    def frontier(self, tasks: Iterable[int]) -> Frontier:
        f: dict[int, int] = {}
        sm, idx = self._sm, self._idx
        for t in tasks:
            s = sm[t]
            i = idx[t]
            if f.get(s, -1) < i:
                f[s] = i
        return f

    def meet(self, tasks: Iterable[int]) -> list[int]:
        """Per SM, the largest instruction index known to happen-before EVERY one of ``tasks``
        (``[inf] * S`` for no tasks). An SM's clock only grows along its list, so the earliest
        of the tasks on each SM decides that SM's contribution. The result is shared between
        callers asking about the same tasks: read it, do not modify it."""
        first: dict[int, int] = {}
        sm, idx = self._sm, self._idx
        for t in tasks:
            s = sm[t]
            if s not in first or idx[t] < idx[first[s]]:
                first[s] = t
        key = tuple(sorted(first.values()))
        m = self._meets.get(key)  # the planner and the validator ask for the same sets
        if m is not None:
            return m
        pk, packed = self._pk, self._packed
        p = None
        for s, t in first.items():
            c = pk.put(packed[t], s, idx[t])  # own field: instruction idx - 1, count idx
            p = c if p is None else pk.meet(p, c)
        m = [1 << 62] * self.num_sms if p is None else [k - 1 for k in pk.unpack(p)]
        self._meets[key] = m
        return m

    @staticmethod
    def precedes(frontier: Frontier, meet: Sequence[int]) -> bool:
        """Everything summarised by ``frontier`` happens-before everything summarised by ``meet``."""
        for s, i in frontier.items():
            if i > meet[s]:
                return False
        return True

    def all_before(self, tasks_a: Iterable[int], b: int) -> bool:
        sb, ib, kb = self._sm[b], self._idx[b], self._known[b]
        sm, idx = self._sm, self._idx
        for a in tasks_a:
            sa = sm[a]
            if sa == sb:
                if idx[a] >= ib:
                    return False
            elif idx[a] >= kb[sa]:
                return False
        return True

    def all_before_all(self, tasks_a: Iterable[int], tasks_b: Iterable[int]) -> bool:
        return self.precedes(self.frontier(tasks_a), self.meet(tasks_b))


def find_deadlock(ps: ProgramSchedule) -> str | None:
    """A description of why the lists cannot all finish, or None when they can."""
    try:
        Order.from_schedule(ps)
    except DeadlockError as e:
        return str(e)
    return None


def legal_order(ps: ProgramSchedule, seed: int = 0) -> list[int]:
    """The task ids in an order the GPU could execute them (a random interleaving of the SM lists
    that respects barriers and counter waits). Used by the arena simulator to shuffle execution."""
    fatal, soft, expected = _structure(ps)
    if fatal or soft:
        raise ScheduleOrderError(fatal + soft)
    sim = _Sim(ps, expected, random.Random(seed))
    sim.run()
    stuck = sim.problems + sim.stuck()
    if stuck:
        raise DeadlockError(stuck)
    return sim.trace
