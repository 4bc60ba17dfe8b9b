"""latch_core.order: happens-before from SM instruction lists, deadlock detection (white-box: it tests
the private _Packed clock arithmetic too, so it lives beside latch_core).

The vector-clock answers are compared against a brute-force oracle (explicit instruction graph,
transitive closure as bitsets) over random deadlock-free schedules.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latch_core.order import DeadlockError, Order, ScheduleOrderError, find_deadlock, legal_order
from latch_core.sections import Counter, ProgramSchedule, Task


def _ps(sms, ntasks=None, counters=(), num_barriers=0):
    if ntasks is None:
        ntasks = sum(1 for sm in sms for i in sm if i[0] == "task")
    tasks = [Task(id=i, group=0, tile=(), reads=(), writes=()) for i in range(ntasks)]
    return ProgramSchedule(program="p", groups=(), tasks=tasks, sms=sms,
                           counters=[Counter(c, e) for c, e in counters], num_barriers=num_barriers)


def T(t):
    return ("task", t)


def B(b):
    return ("barrier", b)


def W(c, n):
    return ("wait", c, n)


def S(c):
    return ("signal", c)


# ---------------------------------------------------------------------------------------------
# Hand-made cases

def test_program_order_and_barrier():
    ps = _ps([[T(0), B(0), T(2)], [T(1), B(0), T(3)]], num_barriers=1)
    o = Order.from_schedule(ps)
    assert o.before(0, 2) and o.before(1, 2) and o.before(0, 3) and o.before(1, 3)
    assert not o.ordered(0, 1) and not o.ordered(2, 3)
    assert not o.before(2, 0)
    assert o.all_before([0, 1], 2) and o.all_before_all([0, 1], [2, 3])
    assert not o.all_before_all([0, 2], [3])
    assert o.position(3) == (1, 2)
    assert o.clock(2) == (1, 1)


def test_counter_orders_only_its_consumer():
    # SM0: t0, signal c0, t1 ; SM1: t2, wait(c0>=1), t3 ; t2 is not after t0.
    ps = _ps([[T(0), S(0), T(1)], [T(2), W(0, 1), T(3)]], counters=[(0, 1)])
    o = Order.from_schedule(ps)
    assert o.before(0, 3)
    assert not o.before(1, 3)  # t1 runs after the signal: not published
    assert not o.ordered(0, 2)
    assert o.before(2, 3)


def test_transitive_chain_across_three_sms():
    ps = _ps([[T(0), S(0)], [W(0, 1), T(1), S(1)], [W(1, 1), T(2)]], counters=[(0, 1), (1, 1)])
    o = Order.from_schedule(ps)
    assert o.before(0, 2) and o.before(1, 2) and o.before(0, 1)


def test_wait_for_fewer_than_expected_is_conservative():
    # c0 gets two signals (from t0 on SM0 and t1 on SM1); a wait for 1 cannot know which came first.
    ps = _ps([[T(0), S(0)], [T(1), S(0)], [W(0, 1), T(2), W(0, 2), T(3)]], counters=[(0, 2)])
    o = Order.from_schedule(ps)
    assert not o.before(0, 2) and not o.before(1, 2)
    assert o.before(0, 3) and o.before(1, 3)


def test_wait_for_fewer_than_expected_with_common_predecessor():
    # Both signals follow t0 (through a barrier): a wait for any one of them follows t0.
    ps = _ps([[T(0), B(0), T(1), S(0)], [B(0), T(2), S(0)], [B(0), W(0, 1), T(3)]],
             counters=[(0, 2)], num_barriers=1)
    o = Order.from_schedule(ps)
    assert o.before(0, 3)
    assert not o.before(1, 3) and not o.before(2, 3)


def test_missing_signal_is_a_deadlock_naming_the_wait():
    ps = _ps([[T(0)], [W(0, 1), T(1)]], counters=[(0, 1)])
    with pytest.raises(DeadlockError) as e:
        Order.from_schedule(ps)
    msg = str(e.value)
    assert "SM 1 instruction 0" in msg and "wait(c0 >= 1)" in msg and "0 signal" in msg


def test_cycle_of_waits_is_a_deadlock():
    ps = _ps([[W(1, 1), T(0), S(0)], [W(0, 1), T(1), S(1)]], counters=[(0, 1), (1, 1)])
    msg = find_deadlock(ps)
    assert msg is not None and "cycle" in msg and "SM 0" in msg and "SM 1" in msg


def test_barrier_missing_on_one_sm_is_a_deadlock():
    ps = _ps([[T(0), B(0), T(1)], [T(2)]], num_barriers=1)
    msg = find_deadlock(ps)
    assert msg is not None and "barrier 0" in msg and "end their list" in msg


def test_barriers_in_different_order_are_rejected():
    ps = _ps([[B(0), B(1), T(0)], [B(1), B(0), T(1)]], num_barriers=2)
    with pytest.raises(DeadlockError, match="same order"):
        Order.from_schedule(ps)


def test_structural_problems_are_named():
    ps = _ps([[T(0), T(0)], [("nop", 1)]], ntasks=2)
    with pytest.raises(ScheduleOrderError) as e:
        Order.from_schedule(ps)
    msg = str(e.value)
    assert "listed twice" in msg and "unknown instruction" in msg and "on no SM's list" in msg
    ps = _ps([[T(0), S(3)]], ntasks=1)
    with pytest.raises(ScheduleOrderError, match="undeclared counter c3"):
        Order.from_schedule(ps)


def test_legal_order_respects_happens_before():
    ps, _ = _random_schedule(random.Random(3), sms=4, steps=60)
    o = Order.from_schedule(ps)
    for seed in range(5):
        seq = legal_order(ps, seed)
        assert sorted(seq) == list(range(len(ps.tasks)))
        where = {t: i for i, t in enumerate(seq)}
        for a in range(len(ps.tasks)):
            for b in range(len(ps.tasks)):
                if o.before(a, b):
                    assert where[a] < where[b]


# ---------------------------------------------------------------------------------------------
# Random schedules against a brute-force oracle

def _random_schedule(rng: random.Random, sms: int, steps: int):
    """A deadlock-free schedule built as one global interleaving: a wait is only emitted for a
    counter that is closed (gets no more signals), so every wait waits for ``expected``."""
    lists = [[] for _ in range(sms)]
    ntasks = 0
    open_counters: dict[int, int] = {}
    closed: dict[int, int] = {}
    nb = 0
    nc = 0
    for _ in range(steps):
        r = rng.random()
        s = rng.randrange(sms)
        if r < 0.45:
            lists[s].append(T(ntasks))
            ntasks += 1
        elif r < 0.65:
            if not open_counters or rng.random() < 0.3:
                open_counters[nc] = 0
                nc += 1
            c = rng.choice(list(open_counters))
            lists[s].append(S(c))
            open_counters[c] += 1
        elif r < 0.75 and open_counters:
            c = rng.choice(list(open_counters))
            closed[c] = open_counters.pop(c)
        elif r < 0.92 and closed:
            c = rng.choice(list(closed))
            lists[s].append(W(c, closed[c]))
        elif r < 0.96:
            for sm in lists:
                sm.append(B(nb))
            nb += 1
    closed.update(open_counters)
    counters = sorted(closed.items())
    return _ps(lists, ntasks=ntasks, counters=counters, num_barriers=nb), counters


def _oracle_before(ps: ProgramSchedule) -> dict[tuple[int, int], bool]:
    """Explicit graph over instructions; a wait on c follows every signal of c (n == expected)."""
    nodes = []
    index = {}
    for s, sm in enumerate(ps.sms):
        for i, ins in enumerate(sm):
            index[(s, i)] = len(nodes)
            nodes.append((s, i, ins))
    preds = [0] * len(nodes)
    barrier_nodes: dict[int, list[int]] = {}
    signals: dict[int, list[int]] = {}
    for n, (s, i, ins) in enumerate(nodes):
        if ins[0] == "barrier":
            barrier_nodes.setdefault(ins[1], []).append(n)
        if ins[0] == "signal":
            signals.setdefault(ins[1], []).append(n)
    direct: list[set[int]] = [set() for _ in nodes]
    for n, (s, i, ins) in enumerate(nodes):
        if i > 0:
            direct[n].add(index[(s, i - 1)])
        if ins[0] == "wait" and ins[2] > 0:
            direct[n].update(signals.get(ins[1], ()))
    # barrier: the instruction after a barrier on any SM follows everything before it on every SM
    for b, bn in barrier_nodes.items():
        for n in bn:
            for m in bn:
                s, i, _ = nodes[m]
                if i > 0:
                    direct[n].add(index[(s, i - 1)])
    # closure in a topological order (the schedule is deadlock-free, so one exists)
    order, state = [], [0] * len(nodes)
    for root in range(len(nodes)):
        stack = [(root, iter(direct[root]))]
        if state[root]:
            continue
        state[root] = 1
        while stack:
            n, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[n] = 2
                order.append(n)
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(direct[nxt])))
            else:
                assert state[nxt] == 2, "cycle in a schedule built deadlock-free"
    for n in order:
        acc = 0
        for p in direct[n]:
            acc |= preds[p] | (1 << p)
        preds[n] = acc
    task_node = {ins[1]: n for n, (s, i, ins) in enumerate(nodes) if ins[0] == "task"}
    out = {}
    for a, na in task_node.items():
        for b, nb in task_node.items():
            out[(a, b)] = bool(preds[nb] >> na & 1)
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(5, 70))
def test_vector_clocks_match_oracle(seed, sms, steps):
    ps, _ = _random_schedule(random.Random(seed), sms, steps)
    o = Order.from_schedule(ps)
    truth = _oracle_before(ps)
    n = len(ps.tasks)
    for (a, b), want in truth.items():
        assert o.before(a, b) == want, (a, b, ps.sms)
    rng = random.Random(seed)
    for _ in range(20):
        A = rng.sample(range(n), min(n, rng.randint(0, 3)))
        Bs = rng.sample(range(n), min(n, rng.randint(1, 3))) if n else []
        want = all(truth[(a, b)] for a in A for b in Bs)
        assert o.all_before_all(A, Bs) == want
        if Bs:
            assert o.all_before(A, Bs[0]) == all(truth[(a, Bs[0])] for a in A)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_dropping_a_signal_or_a_barrier_is_detected(seed):
    rng = random.Random(seed)
    ps, _ = _random_schedule(rng, 3, 60)
    sig = [(s, i) for s, sm in enumerate(ps.sms) for i, ins in enumerate(sm) if ins[0] == "signal"]
    waited = {ins[1] for sm in ps.sms for ins in sm if ins[0] == "wait" and ins[2] > 0}
    sig = [(s, i) for s, i in sig if ps.sms[s][i][1] in waited]
    if sig:
        s, i = rng.choice(sig)
        sms = [list(x) for x in ps.sms]
        del sms[s][i]
        bad = ProgramSchedule(ps.program, ps.groups, ps.tasks, sms, ps.counters, ps.num_barriers)
        with pytest.raises(DeadlockError, match="can never be satisfied"):
            Order.from_schedule(bad)
    bar = [(s, i) for s, sm in enumerate(ps.sms) for i, ins in enumerate(sm) if ins[0] == "barrier"]
    if bar and len(ps.sms) > 1:
        s, i = rng.choice(bar)
        sms = [list(x) for x in ps.sms]
        del sms[s][i]
        bad = ProgramSchedule(ps.program, ps.groups, ps.tasks, sms, ps.counters, ps.num_barriers)
        assert find_deadlock(bad) is not None


def test_scales_to_forty_thousand_tasks():
    import time

    S_, per = 132, 300
    sms = []
    tid = 0
    nb = 40
    for s in range(S_):
        lst = []
        for b in range(nb):
            for _ in range(per // nb):
                lst.append(T(tid))
                tid += 1
            lst.append(B(b))
        sms.append(lst)
    ps = _ps(sms, ntasks=tid, num_barriers=nb)
    t0 = time.perf_counter()
    o = Order.from_schedule(ps)
    assert time.perf_counter() - t0 < 5
    first_on_sm1 = (per // nb) * nb
    assert o.before(0, tid - 1) and not o.ordered(0, first_on_sm1) and o.before(0, first_on_sm1 + per // nb)


def test_sequence_is_a_linear_extension():
    ps, _ = _random_schedule(random.Random(7), sms=4, steps=80)
    o = Order.from_schedule(ps)
    seq = o.sequence()
    assert sorted(seq) == list(range(len(ps.tasks)))
    where = {t: i for i, t in enumerate(seq)}
    n = len(ps.tasks)
    assert all(where[a] < where[b] for a in range(n) for b in range(n) if o.before(a, b))


def test_from_schedule_shares_one_order_per_schedule_object():
    ps, _ = _random_schedule(random.Random(8), sms=3, steps=30)
    assert Order.from_schedule(ps) is Order.from_schedule(ps)


# ---------------------------------------------------------------------------------------------
# Packed clocks: the SWAR join/meet must equal the plain component-wise max/min on every count,
# including the extremes (0: knows nothing; the largest count a field may hold).

_counts = st.integers(min_value=0, max_value=(1 << 31) - 1)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=140).flatmap(
    lambda n: st.tuples(st.lists(_counts, min_size=n, max_size=n), st.lists(_counts, min_size=n, max_size=n),
                        st.integers(min_value=0, max_value=n - 1), _counts)))
def test_packed_clock_arithmetic_matches_lists(case):
    from latch_core.order import _Packed

    x, y, k, v = case
    pk = _Packed(len(x))
    px, py = pk.pack(x), pk.pack(y)
    assert list(pk.unpack(px)) == x
    assert list(pk.unpack(pk.join(px, py))) == [max(a, b) for a, b in zip(x, y)]
    assert list(pk.unpack(pk.meet(px, py))) == [min(a, b) for a, b in zip(x, y)]
    want = list(x)
    want[k] = v
    assert list(pk.unpack(pk.put(px, k, v))) == want


def test_too_long_an_sm_list_is_refused_by_name():
    from latch_core import order as order_mod

    ps = _ps([[T(0), T(1), T(2)], [T(3)]])
    old = order_mod._MAX_COUNT
    order_mod._MAX_COUNT = 3  # stand-in for 2**31 - 1: a field could not count SM 0's list
    try:
        with pytest.raises(ScheduleOrderError, match="SM 0: 3 instructions"):
            Order.from_schedule(ps)
    finally:
        order_mod._MAX_COUNT = old
