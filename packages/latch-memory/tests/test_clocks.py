"""Happens-before by vector clocks: barriers, counters, deadlocks, malformed lists."""

import pytest

from latch_core.sections import Counter, FusionGroup, ProgramSchedule, Task
from latch_memory.clocks import Clocks, ScheduleError
from latch_memory.testing import mlp_graph, naive_schedule, test_registry, two_weight_graph


def _ps(sms, n_tasks, counters=()):
    g = FusionGroup(0, ("n",), (), ("v",), "v", "test::relu")
    tasks = [Task(i, 0, ((0, 1),), (), ()) for i in range(n_tasks)]
    return ProgramSchedule("p", [g], tasks, sms, counters)


def test_program_order_and_barriers():
    ps = _ps([[("task", 0), ("barrier", 0), ("task", 2)], [("task", 1), ("barrier", 0), ("task", 3)]], 4)
    c = Clocks(ps)
    assert c.before(0, 2) and c.before(1, 2) and c.before(0, 3) and c.before(1, 3)
    assert not c.before(0, 1) and not c.before(1, 0) and not c.before(2, 3) and not c.before(2, 0)
    assert not c.before(0, 0)


def test_full_wait_orders_every_signaller():
    sms = [[("task", 0), ("signal", 7)], [("task", 1), ("signal", 7)], [("wait", 7, 2), ("task", 2)]]
    c = Clocks(_ps(sms, 3, [Counter(7, 2)]))
    assert c.before(0, 2) and c.before(1, 2) and not c.before(0, 1)


def test_partial_wait_is_conservative():
    # one of two signals from different SMs: neither signaller is guaranteed before task 2
    sms = [[("task", 0), ("signal", 7)], [("task", 1), ("signal", 7)], [("wait", 7, 1), ("task", 2)]]
    c = Clocks(_ps(sms, 3, [Counter(7, 2)]))
    assert not c.before(0, 2) and not c.before(1, 2)
    # two signals in program order on one SM: waiting for one orders the first task only
    sms = [[("task", 0), ("signal", 7), ("task", 1), ("signal", 7)], [("wait", 7, 1), ("task", 2)]]
    c = Clocks(_ps(sms, 3, [Counter(7, 2)]))
    assert c.before(0, 2) and not c.before(1, 2)


def test_deadlock_names_every_blocked_sm():
    sms = [[("wait", 1, 1), ("task", 0), ("signal", 2)], [("wait", 2, 1), ("task", 1), ("signal", 1)]]
    with pytest.raises(ScheduleError, match=r"deadlock.*SM 0: wait\(counter 1 >= 1\).*SM 1: wait\(counter 2 >= 1\)"):
        Clocks(_ps(sms, 2, [Counter(1, 1), Counter(2, 1)]))
    sms = [[("barrier", 0), ("task", 0)], [("task", 1)]]
    with pytest.raises(ScheduleError, match=r"SM 0: barrier 0; SM 1: finished"):
        Clocks(_ps(sms, 2))


def test_malformed_lists():
    with pytest.raises(ScheduleError, match="task 0 is listed twice"):
        Clocks(_ps([[("task", 0)], [("task", 0)]], 1))
    with pytest.raises(ScheduleError, match=r"tasks \[1\] are on no SM"):
        Clocks(_ps([[("task", 0)]], 2))
    with pytest.raises(ScheduleError, match="undeclared counter"):
        Clocks(_ps([[("task", 0), ("signal", 3)]], 1))


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clocks_agree_with_data_dependencies(strategy, seed):
    reg = test_registry()
    for g in (two_weight_graph(), mlp_graph(layers=2)):
        ps = naive_schedule(g, reg, strategy=strategy, num_sms=3, tiles=3, seed=seed)
        c = Clocks(ps)
        producer = {o: t.id for t in ps.tasks for a in t.writes for o in [a.value]}
        writers = {}
        for t in ps.tasks:
            for a in t.writes:
                writers.setdefault(a.value, []).append(t.id)
        for t in ps.tasks:
            for a in t.reads:
                for w in writers.get(a.value, ()):
                    assert c.before(w, t.id), (strategy, a.value, w, t.id)
                    assert c.position[w] < c.position[t.id]
        assert sorted(c.order) == list(range(len(ps.tasks)))
        assert producer  # the graph has tasks
