"""The validator's model of execution (latch_core.order) against the kernel's own arithmetic.

``KernelExplorer`` below is an independent interpreter of ``latch_kernel_main.cuh``: it shares no
code with latch_core.order and follows the kernel line by line:

- one block per SM list plus spare blocks (the grid is the device's SM count, which may exceed
  the lists); a spare block runs barriers 0..num_barriers-1 and nothing else;
- a task is two steps (its start, its end), so overlap of tasks is visible;
- a signal adds 1 to its counter; a wait on (c, n) spins until ``counter - epoch * expected[c] >=
  n`` (the kernel's unsigned, wrap-safe compare: counters are never reset between launches);
- a barrier instruction with id k adds 1 to the one arrival word, then spins until it reaches
  ``(epoch * num_barriers + k + 1) * grid``;
- launch 0 and launch 1 run back to back on the same counters and arrival word.

It explores every interleaving (all reachable states), and reports whether some execution
deadlocks (no block can move, some block unfinished) and the happens-before relation the kernel
really gives: ``a`` before ``b`` iff in no execution does ``b`` start while ``a`` has not ended.

On random schedules, valid ones and broken ones (ids repeated, swapped, counts off by one, an
instruction dropped, duplicated or moved):
- whatever the validator's model accepts runs on the kernel with no deadlock in either launch, the
  same order in both, and every pair the model orders is ordered by the kernel (exactly the same
  pairs when every wait counts all of its counter's signals, as Latch's schedulers' waits do);
- whatever the model refuses either deadlocks or misorders on the kernel, or breaks the code
  generator's own preconditions (checked with codegen's ``_check_sync`` where it is installed):
  no false alarms;
- whatever codegen refuses, the model refuses too.
"""

from __future__ import annotations

import random

import pytest

from latch_core.order import Order, ScheduleOrderError
from latch_core.sections import Counter, FusionGroup, ProgramSchedule, Task

try:  # a cross-package test: codegen's own sync rules, where codegen is installed
    from latch_codegen_h100.bodies import CodegenError
    from latch_codegen_h100.codegen import _check_sync
except ImportError:
    _check_sync = None


class Malformed(Exception):
    """The lists name something the kernel's tables cannot encode (an unknown task or counter)."""


class KernelExplorer:
    def __init__(self, ps: ProgramSchedule, grid: int):
        self.ntasks = len(ps.tasks)
        self.nb = ps.num_barriers
        self.expected = {c.id: c.expected for c in ps.counters}
        self.grid = grid
        lists = [list(sm) for sm in ps.sms] + [[("barrier", k) for k in range(self.nb)]
                                               for _ in range(grid - len(ps.sms))]
        self.steps: list[list[tuple]] = []  # per block: micro-steps
        self.end_at: dict[int, tuple[int, int]] = {}  # task -> (block, index of its end step)
        for b, sm in enumerate(lists):
            out = []
            for ins in sm:
                kind = ins[0]
                if kind == "task":
                    if not 0 <= ins[1] < self.ntasks or ins[1] in self.end_at:
                        raise Malformed(f"task {ins[1]}")
                    out.append(("start", ins[1]))
                    self.end_at[ins[1]] = (b, len(out))
                    out.append(("end", ins[1]))
                elif kind == "signal":
                    if ins[1] not in self.expected:
                        raise Malformed(f"counter {ins[1]}")
                    out.append(("add", ins[1]))
                elif kind == "wait":
                    if ins[1] not in self.expected:
                        raise Malformed(f"counter {ins[1]}")
                    out.append(("spin", ins[1], ins[2]))
                else:
                    out.append(("arrive",))
                    out.append(("bar", ins[1]))
            self.steps.append(out)
        if len(self.end_at) != self.ntasks:
            raise Malformed("a task on no list")

    def _values(self, pcs, base_counters, base_word):
        counters = dict(base_counters)
        word = base_word
        for b, pc in enumerate(pcs):
            for st in self.steps[b][:pc]:
                if st[0] == "add":
                    counters[st[1]] += 1
                elif st[0] == "arrive":
                    word += 1
        return counters, word

    def _enabled(self, st, epoch, counters, word) -> bool:
        if st[0] == "spin":
            return (counters[st[1]] - epoch * self.expected[st[1]] - st[2]) % 2**32 < 2**31
        if st[0] == "bar":
            return (word - (epoch * self.nb + st[1] + 1) * self.grid) % 2**32 < 2**31
        return True

    def run(self, epoch: int, counters: dict, word: int):
        """Explore launch ``epoch`` from the given counters; returns (deadlock, not_before, final)
        where ``not_before[b]`` is a bitmask of the tasks that some execution has not ended when
        task ``b`` starts, and ``final`` the counters and arrival word at the end."""
        nblocks = len(self.steps)
        start = (0,) * nblocks
        seen = {start}
        stack = [start]
        not_before = [0] * self.ntasks
        full = (1 << self.ntasks) - 1
        deadlock = False
        while stack:
            pcs = stack.pop()
            cs, w = self._values(pcs, counters, word)
            ended = 0
            for t, (b, k) in self.end_at.items():
                if pcs[b] > k:
                    ended |= 1 << t
            moved = False
            for b in range(nblocks):
                pc = pcs[b]
                if pc >= len(self.steps[b]):
                    continue
                st = self.steps[b][pc]
                if not self._enabled(st, epoch, cs, w):
                    continue
                moved = True
                if st[0] == "start":
                    not_before[st[1]] |= full & ~ended
                nxt = pcs[:b] + (pc + 1,) + pcs[b + 1:]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
            if not moved and any(pcs[b] < len(self.steps[b]) for b in range(nblocks)):
                deadlock = True
        final = self._values(tuple(len(s) for s in self.steps), counters, word)
        return deadlock, not_before, final

    def verdict(self):
        """(ok, hb0): ok when neither launch can deadlock and both give the same order."""
        counters = {c: 0 for c in self.expected}
        d0, nb0, (c1, w1) = self.run(0, counters, 0)
        if d0:
            return False, None
        d1, nb1, _ = self.run(1, c1, w1)
        return (not d1 and nb1 == nb0), nb0


def _random_schedule(rng: random.Random) -> ProgramSchedule:
    S = rng.randint(1, 3)
    ntasks = rng.randint(1, 5)
    lists: list[list[tuple]] = [[] for _ in range(S)]
    for t in range(ntasks):
        lists[rng.randrange(S)].append(("task", t))
    nb = 0
    if rng.random() < 0.5:  # barriers at random points, canonical ids, on every SM
        nb = rng.randint(1, 2)
        for s in range(S):
            for k in range(nb):
                lists[s].insert(rng.randint(0, len(lists[s])), ("barrier", -1))
            k = 0
            for i, ins in enumerate(lists[s]):
                if ins[0] == "barrier":
                    lists[s][i] = ("barrier", k)
                    k += 1
    counters = []
    for c in range(rng.randint(0, 2)):
        nsig = rng.randint(1, 2)
        for _ in range(nsig):
            s = rng.randrange(S)
            lists[s].insert(rng.randint(0, len(lists[s])), ("signal", c))
        n = nsig if rng.random() < 0.8 else rng.randint(0, nsig)
        s = rng.randrange(S)
        lists[s].insert(rng.randint(0, len(lists[s])), ("wait", c, n))
        counters.append(Counter(c, nsig))
    ps = ProgramSchedule("p", [FusionGroup(0, (), (), ("v",), "v", "b")],
                         [Task(t, 0, ((0, 1),), (), ()) for t in range(ntasks)], lists, counters, nb)
    if rng.random() < 0.6:
        ps = _perturb(rng, ps)
    return ps


def _perturb(rng: random.Random, ps: ProgramSchedule) -> ProgramSchedule:
    import attrs

    sms = [list(sm) for sm in ps.sms]
    where = [(s, i) for s, sm in enumerate(sms) for i in range(len(sm))]
    kind = rng.choice(["drop", "dup", "swap", "barrier_id", "num_barriers", "expected", "wait_n", "move"])
    if kind in ("drop", "dup", "swap", "barrier_id", "wait_n", "move") and not where:
        kind = "num_barriers"
    if kind == "drop":
        s, i = rng.choice(where)
        del sms[s][i]
    elif kind == "dup":
        s, i = rng.choice(where)
        if sms[s][i][0] != "task":
            sms[s].insert(i, sms[s][i])
    elif kind == "swap":
        s, i = rng.choice(where)
        if i + 1 < len(sms[s]):
            sms[s][i], sms[s][i + 1] = sms[s][i + 1], sms[s][i]
    elif kind == "move":
        s, i = rng.choice(where)
        ins = sms[s].pop(i)
        t = rng.randrange(len(sms))
        sms[t].insert(rng.randint(0, len(sms[t])), ins)
    elif kind == "barrier_id":
        bars = [(s, i) for s, i in where if sms[s][i][0] == "barrier"]
        if bars:
            s, i = rng.choice(bars)
            sms[s][i] = ("barrier", max(0, sms[s][i][1] + rng.choice([-1, 1])))
    elif kind == "num_barriers":
        return attrs.evolve(ps, sms=sms, num_barriers=max(0, ps.num_barriers + rng.choice([-1, 1])))
    elif kind == "expected" and ps.counters:
        cs = list(ps.counters)
        k = rng.randrange(len(cs))
        cs[k] = attrs.evolve(cs[k], expected=max(0, cs[k].expected + rng.choice([-1, 1])))
        return attrs.evolve(ps, sms=sms, counters=cs)
    elif kind == "wait_n":
        ws = [(s, i) for s, i in where if sms[s][i][0] == "wait"]
        if ws:
            s, i = rng.choice(ws)
            c, n = sms[s][i][1], sms[s][i][2]
            sms[s][i] = ("wait", c, max(0, n + rng.choice([-1, 1])))
    return attrs.evolve(ps, sms=sms)


def _codegen_refuses(ps) -> bool | None:
    if _check_sync is None:
        return None
    try:
        _check_sync(ps)
    except CodegenError:
        return True
    return False


@pytest.mark.parametrize("chunk", range(4))
def test_the_validators_model_is_the_kernels(chunk):
    counts = {"accepted": 0, "refused": 0, "kernel_broken": 0, "exact": 0}
    for seed in range(chunk * 150, (chunk + 1) * 150):
        rng = random.Random(seed)
        ps = _random_schedule(rng)
        grid = len(ps.sms) + rng.randint(0, 1)  # sometimes a spare block (more SMs than lists)
        try:
            kernel = KernelExplorer(ps, grid)
        except Malformed:
            with pytest.raises(ScheduleOrderError):
                Order.from_schedule(ps)
            continue
        ok, not_before = kernel.verdict()
        counts["kernel_broken"] += not ok
        try:
            order = Order.from_schedule(ps)
        except ScheduleOrderError as e:
            counts["refused"] += 1
            # no false alarm: the kernel really misbehaves, or codegen refuses the lists too
            assert not ok or _codegen_refuses(ps) in (True, None), (seed, ps.sms, str(e))
            continue
        counts["accepted"] += 1
        assert ok, (seed, ps.sms, ps.num_barriers, ps.counters)
        assert _codegen_refuses(ps) in (False, None), (seed, ps.sms)
        exact = all(ins[2] in (0, ps.counters[ins[1]].expected) for sm in ps.sms for ins in sm if ins[0] == "wait")
        for a in range(len(ps.tasks)):
            for b in range(len(ps.tasks)):
                if a == b:
                    continue
                kernel_before = not (not_before[b] >> a) & 1
                if order.before(a, b):
                    assert kernel_before, (seed, a, b, ps.sms)  # sound
                elif exact:
                    assert not kernel_before, (seed, a, b, ps.sms)  # and exact
        counts["exact"] += exact
    # the generator exercised both sides
    assert counts["accepted"] > 20 and counts["refused"] > 20 and counts["kernel_broken"] > 10, counts
