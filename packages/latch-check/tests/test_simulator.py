"""The arena simulator on hand-built schedules (latch_memory.testing's naive scheduler): it
matches FP64, and planted bugs (lifetimes, footprints, dependencies, in-place updates) fail it."""

import attrs
import pytest
import torch

pytest.importorskip("latch_memory")  # its test ops, naive scheduler and planner (not a dependency of latch-check)

from latch_core.document import program_doc  # noqa: E402
from latch_core.order import Order  # noqa: E402
from latch_core.sections import Access  # noqa: E402
from latch_check.simulator import ArenaSimulator, SimulationError, simulate  # noqa: E402
from latch_memory.plan import plan as _plan  # noqa: E402
from latch_memory.testing import (  # noqa: E402
    evaluate, mlp_graph, naive_schedule_section, random_inputs, test_registry, two_weight_graph,
)

REG = test_registry()


def plan(doc, **kw):
    return _plan(doc, registry=REG, **kw)


def _planned(graph, **kw):
    doc = program_doc(graph)
    doc = attrs.evolve(doc, schedule=naive_schedule_section(doc, REG, **kw))
    return plan(doc)


def _max_err(out, ref):
    assert out.keys() == ref.keys()
    return max(float((out[k] - ref[k]).abs().max()) if out[k].numel() else 0.0 for k in ref)


def _replace_placement(doc, value, **changes):
    pm = doc.memory.program("update")
    pls = [attrs.evolve(p, **changes) if p.value == value else p for p in pm.placements]
    return attrs.evolve(doc, memory=attrs.evolve(doc.memory, programs=[attrs.evolve(pm, placements=pls)]))


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("graph", [two_weight_graph(), mlp_graph(layers=3)], ids=["two_weight", "mlp"])
def test_matches_fp64_over_random_interleavings(strategy, graph):
    doc = _planned(graph, strategy=strategy, num_sms=3, tiles=3)
    ins = random_inputs(graph, seed=1)
    ref = evaluate(graph, ins, REG)
    for seed in range(4):
        out = simulate(doc, "update", ins, seed, ops=REG)
        assert _max_err(out, ref) <= 1e-12
        assert all(v.dtype == torch.float64 for v in out.values())


def _lifetime_victim(doc):
    """(A, B): arena values where a writer of B runs, in every legal order, before a reader of A,
    while their bytes are disjoint in the plan; moving B onto A is a planted lifetime bug."""
    pm = doc.memory.program("update")
    ps = doc.schedule.program("update")
    order = Order.from_schedule(ps)
    arena = [p for p in pm.placements if p.buffer == "arena" and p.first >= 0]
    writers, readers = {}, {}
    for t in ps.tasks:
        for a in t.writes:
            writers.setdefault(a.value, set()).add(t.id)
        for a in t.reads:
            readers.setdefault(a.value, set()).add(t.id)
    for a in arena:
        for b in arena:
            if a.value == b.value or b.nbytes < a.nbytes or not readers.get(a.value):
                continue
            if any(order.before(wa, wb) for wa in writers[a.value] for wb in writers[b.value]) and \
                    any(order.before(wb, r) for wb in writers[b.value] for r in readers[a.value]):
                return a, b
    raise AssertionError("no victim pair")


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
def test_planted_lifetime_bug_is_caught(strategy):
    graph = mlp_graph(layers=3)
    doc = _planned(graph, strategy=strategy, num_sms=3, tiles=2)
    a, b = _lifetime_victim(doc)
    bad = _replace_placement(doc, b.value, offset=a.offset)
    ins = random_inputs(graph, seed=2)
    with pytest.raises(SimulationError, match=rf"writes '{b.value}'.* over live bytes of '{a.value}'"):
        simulate(bad, "update", ins, 0, ops=REG)
    # without the byte-ownership checks the numbers alone fail: NaN or a mismatch
    ref = evaluate(graph, ins, REG)
    out = simulate(bad, "update", ins, 0, ops=REG, checks=False)
    err = _max_err(out, ref)
    assert not err <= 1e-6  # also true for NaN


def test_too_small_read_footprint_shows_as_nan():
    graph = two_weight_graph()
    doc = _planned(graph, strategy="barrier", num_sms=2, tiles=2)
    ps = doc.schedule.program("update")
    # the matmul y = h @ w2 needs all rows of w2; claim it reads only the first two
    tasks = []
    for t in ps.tasks:
        if ps.groups[t.group].nodes == ("n_y",):
            t = attrs.evolve(t, reads=[Access(a.value, ((0, 2), a.box[1])) if a.value == "w2" else a for a in t.reads])
        tasks.append(t)
    bad = attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, tasks=tasks)]))
    out = simulate(bad, "update", random_inputs(graph), 0, ops=REG)
    assert torch.isnan(out["loss"]).all() and torch.isnan(out["g1"]).all()


def test_missing_dependency_is_caught():
    graph = two_weight_graph()
    doc = _planned(graph, strategy="dataflow", num_sms=3, tiles=2)
    ps = doc.schedule.program("update")
    # drop every wait: consumers may now run before their producers
    sms = [[i for i in sm if i[0] != "wait"] for sm in ps.sms]
    bad = attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, sms=sms)]))
    ins = random_inputs(graph)
    failures = 0
    for seed in range(6):
        try:
            simulate(bad, "update", ins, seed, ops=REG)
        except SimulationError as e:
            assert "not ordered after its producer" in str(e) or "does not order those reads" in str(e)
            failures += 1
    assert failures >= 1


def test_deadlock_names_the_stuck_sms():
    graph = two_weight_graph()
    doc = _planned(graph, strategy="dataflow", num_sms=2, tiles=1)
    ps = doc.schedule.program("update")
    sms = [[("wait", 0, 99)] + list(ps.sms[0])] + [list(sm) for sm in ps.sms[1:]]
    bad = attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, sms=sms)]))
    with pytest.raises(Exception, match=r"SM 0 instruction 0: wait\(c0 >= 99\)"):
        simulate(bad, "update", random_inputs(graph), 0, ops=REG)


def _widen_update_reads(doc, old):
    ps = doc.schedule.program("update")
    shape = next(v.shape for v in doc.graph.program("update").values if v.name == old)
    tasks = []
    for t in ps.tasks:
        if ps.groups[t.group].nodes == (f"n_{old}_new",):
            t = attrs.evolve(t, reads=[Access(a.value, tuple((0, d) for d in shape)) if a.value == old else a for a in t.reads])
        tasks.append(t)
    return attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, tasks=tasks)]))


def test_inplace_updates_and_copy_back():
    graph = two_weight_graph()
    base = _planned(graph, strategy="barrier", num_sms=2, tiles=2)
    wide = plan(_widen_update_reads(base, "w1"))  # w1_new cannot overwrite w1: arena + copy back
    where = {p.value: p for p in wide.memory.program("update").placements}
    assert where["w1_new"].buffer == "arena" and where["w2_new"].buffer == "w2"
    ins = random_inputs(graph, seed=4)
    ref = evaluate(graph, ins, REG)
    sim = ArenaSimulator(wide, "update", ops=REG)
    out = sim.run(ins, seed=1)
    assert _max_err(out, ref) <= 1e-12
    w1_buf = sim.buffers["w1"].data.reshape(-1, 4)[:, 0].reshape(ref["w1_new"].shape)
    assert torch.equal(w1_buf, ref["w1_new"])  # the copy back landed in the old buffer
    # forcing the unsafe in-place update is a planted bug: a tile overwrites w1 the other still reads
    forced = _replace_placement(wide, "w1_new", buffer="w1", offset=0)
    with pytest.raises(SimulationError, match="writes 'w1_new'.* over live bytes of 'w1'"):
        for seed in range(6):
            simulate(forced, "update", ins, seed, ops=REG)


def test_user_errors():
    graph = two_weight_graph()
    doc = _planned(graph, strategy="barrier")
    with pytest.raises(SimulationError, match=r"hyper 'lr' \(f32\[\]\) is missing"):
        simulate(doc, "update", {k: v for k, v in random_inputs(graph).items() if k != "lr"}, ops=REG)
    with pytest.raises(SimulationError, match="lacks section"):
        simulate(program_doc(graph), "update", random_inputs(graph), ops=REG)
    pm = doc.memory.program("update")
    short = attrs.evolve(doc, memory=attrs.evolve(doc.memory, programs=[attrs.evolve(pm, placements=[p for p in pm.placements if p.value != "h"])]))
    with pytest.raises(SimulationError, match=r"no placement for \['h'\]"):
        simulate(short, "update", random_inputs(graph), ops=REG)
