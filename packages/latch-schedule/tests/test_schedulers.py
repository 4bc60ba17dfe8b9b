"""The barrier and dataflow strategies on hand-built programs: validity, the properties each
strategy promises, and the errors a user can cause."""

from __future__ import annotations

import attrs
import pytest

from latch_core.document import Document
from latch_core.ir import GraphSection, Node
from latch_core.order import Order
from latch_core.sections import BARRIER, SIGNAL, TASK, WAIT
from latch_schedule import testing
from latch_schedule.schedulers import barrier_scheduler, dataflow_scheduler, task_graphs
from latch_schedule.tasks import ScheduleError
from latch_schedule.validate import validate

STRATEGIES = {"barrier": barrier_scheduler, "dataflow": dataflow_scheduler}


def _scheduled(ops, doc, name, **opts):
    s = STRATEGIES[name](doc, {"ops": ops, **opts})
    return attrs.evolve(doc, schedule=s)


@pytest.fixture(scope="module")
def stack(ops):
    return testing.residual_stack(ops, layers=3, rows=512, d=256, h=512)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("num_sms", [1, 8, 132])
def test_schedules_validate(ops, stack, name, num_sms):
    for doc in (testing.two_layer(ops), stack):
        d = testing.distinct_placements(_scheduled(ops, doc, name, num_sms=num_sms))
        assert validate(d, ops=ops) == []
        ps = d.schedule.programs[0]
        assert len(ps.sms) == num_sms
        for sm in ps.sms:  # every SM runs its tasks in increasing id (ids follow the run order)
            ids = [i[1] for i in sm if i[0] == TASK]
            assert ids == sorted(ids)
        if num_sms == 1:
            assert ps.num_barriers == 0 and not ps.counters  # program order is enough


def test_barrier_phases_are_independent_and_every_barrier_is_needed(ops, stack):
    d = _scheduled(ops, stack, "barrier", num_sms=16)
    ps = d.schedule.programs[0]
    tg = task_graphs(stack, {"ops": ops, "num_sms": 16})[0]
    assert ps.num_barriers >= 1 and not ps.counters
    assert all(t.phase >= 0 for t in ps.tasks)
    # dependencies only ever point to an earlier phase
    writers = {}
    for t in ps.tasks:
        for a in t.writes:
            writers.setdefault(a.value, []).append(t)
    from latch_schedule.boxes import overlaps

    for t in ps.tasks:
        for a in t.reads:
            for w in writers.get(a.value, ()):
                if any(b.value == a.value and overlaps(b.box, a.box) for b in w.writes):
                    assert w.phase < t.phase
    # every SM executes every barrier, in order
    for sm in ps.sms:
        assert [i[1] for i in sm if i[0] == BARRIER] == list(range(ps.num_barriers))
    # no barrier is redundant: dropping any one leaves a read unordered after its write
    placed = testing.distinct_placements(d)
    for b in range(ps.num_barriers):
        sms = [[(BARRIER, i[1] - (i[1] > b)) if i[0] == BARRIER else i for i in sm
                if not (i[0] == BARRIER and i[1] == b)] for sm in ps.sms]
        bad = attrs.evolve(ps, sms=sms, num_barriers=ps.num_barriers - 1)
        problems = validate(testing._with_program(placed, bad), ops=ops)
        assert any("read before write" in p for p in problems), b
    assert len(tg) == len(ps.tasks)


def test_dataflow_counters(ops, stack):
    d = _scheduled(ops, stack, "dataflow", num_sms=16)
    ps = d.schedule.programs[0]
    assert ps.num_barriers == 0
    signals = {}
    for s, sm in enumerate(ps.sms):
        last_task = None
        for ins in sm:
            if ins[0] == TASK:
                last_task = ins[1]
            elif ins[0] == SIGNAL:
                assert last_task is not None  # a signal follows the task it publishes
                signals.setdefault(ins[1], []).append(last_task)
    waits = 0
    for sm in ps.sms:
        pending = []
        for ins in sm:
            if ins[0] == WAIT:
                pending.append(ins)
                waits += 1
            elif ins[0] == TASK:
                for _, c, n in pending:
                    assert n == ps.counters[c].expected
                    assert all(p < ins[1] for p in signals[c])  # waits only target earlier ids
                pending = []
    for c in ps.counters:
        assert len(signals.get(c.id, ())) == c.expected
    assert len(ps.counters) < waits  # consumers with the same producers share counters
    Order.from_schedule(ps)  # deadlock-free


def test_fuse_option_changes_groups_not_validity(ops):
    bld = testing.Builder(ops)
    x = bld.input("batch", "x", (256, 64), role="batch")
    w = bld.input("params", "w", (64, 64))
    (a,) = bld.node("add", [x, x])
    (r,) = bld.node("relu", [a])
    (m,) = bld.node("matmul", [r, w])
    doc = Document(graph=GraphSection([bld.graph({"loss": [m]})]))
    a = _scheduled(ops, doc, "barrier", num_sms=8)
    b = _scheduled(ops, doc, "barrier", num_sms=8, fuse=False)
    n_nodes = len(doc.graph.programs[0].nodes)
    assert len(b.schedule.programs[0].groups) == n_nodes
    assert len(a.schedule.programs[0].groups) < n_nodes
    assert validate(testing.distinct_placements(b), ops=ops) == []


def test_stats_are_recorded(ops, stack):
    for name in STRATEGIES:
        s = _scheduled(ops, stack, name).schedule
        st = dict(dict(s.stats)[f"program.update"])
        assert st["tasks"] == len(s.programs[0].tasks)
        assert st["est_seconds"] > 0
        assert ("barriers" in st) == (name == "barrier") and ("counters" in st) == (name == "dataflow")


# ---------------------------------------------------------------------------------------------
# Errors a user can cause


def test_repeat_regions_are_refused_naming_the_node(ops):
    doc = testing.two_layer(ops)
    g = doc.graph.programs[0]
    node = Node("loop", "latch::repeat", [g.nodes[0].outputs[0]], ["rep_out"], {"times": 4}, source="m.py:7 in fwd")
    from latch_core.ir import Value

    g2 = attrs.evolve(g, nodes=g.nodes + (node,), values=g.values + (Value("rep_out", g.value(g.nodes[0].outputs[0]).shape, "f32"),))
    doc2 = attrs.evolve(doc, graph=GraphSection([g2]))
    with pytest.raises(ScheduleError, match=r"node 'loop' \(latch::repeat\) \(from m.py:7 in fwd\).*repeated regions"):
        barrier_scheduler(doc2, {"ops": ops})


def test_reading_the_old_value_after_an_in_place_update_is_a_cycle_error(ops):
    b = testing.Builder(ops)
    w = b.input("params", "w", (8, 4))
    g_ = b.input("batch", "g", (8, 4), role="batch")
    lr = b.input("hyper", "lr", (), role="hyper")
    (w2,) = b.node("sgd", [w, g_, lr], name="w_new")
    (t,) = b.node("transpose", [w2], name="t")  # reads the new value...
    (late,) = b.node("matmul", [t, w], name="late")  # ...and this reads the old one after it
    doc = Document(graph=GraphSection([b.graph({"new_params": [w2], "loss": [late]}, inplace=[(w2, w)])]))
    with pytest.raises(ScheduleError, match=r"cycle.*%w_new -> %w"):
        dataflow_scheduler(doc, {"ops": ops, "num_sms": 4})


def test_in_place_update_by_a_non_elementwise_body_is_refused(ops):
    b = testing.Builder(ops)
    w = b.input("params", "w", (8, 8))
    (w2,) = b.node("matmul", [w, w], name="w_sq")
    doc = Document(graph=GraphSection([b.graph({"new_params": [w2]}, inplace=[(w2, w)])]))
    with pytest.raises(ScheduleError, match=r"node 'w_sq'.*in place of %w"):
        barrier_scheduler(doc, {"ops": ops, "num_sms": 4, "matmul_tile": (8, 8)})


def test_bad_num_sms_is_refused(ops):
    with pytest.raises(ScheduleError, match="num_sms"):
        barrier_scheduler(testing.two_layer(ops), {"ops": ops, "num_sms": 0})
