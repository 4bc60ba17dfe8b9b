"""The arena simulator on the real examples (captured, scheduled by latch-schedule, planned by
latch-memory) under both strategies: every program run matches the FP64 interpreter, the static
validator accepts the plan, and a planted lifetime bug in a real plan is caught."""

from pathlib import Path

import attrs
import pytest
import torch

pytest.importorskip("latch_memory")
pytest.importorskip("latch_schedule")
pytest.importorskip("latch_capture")

from latch_capture.examples import load_example  # noqa: E402
from latch_core.order import Order  # noqa: E402
from latch_core.passes import run_pass  # noqa: E402
from latch_core.plugins import registries  # noqa: E402
from latch_check.simulator import SIM_THRESHOLD, SimulationError, check_example, prepare, simulate  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TRANSFORMER_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)
TINYMOE_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, experts=4, expert_hidden=16, batch=2, seq=8)

CASES = {
    "two_weight": ("two_weight.py", {}),
    "mlp": ("mlp.py", {}),
    "mlp_k2": ("mlp.py", {"microbatches": 2}),
    "transformer": ("transformer.py", TRANSFORMER_SMALL),
    "tinymoe": ("tinymoe.py", TINYMOE_SMALL),
}
_captured: dict = {}


def _captured_example(case):
    if case not in _captured:
        path, kw = CASES[case]
        ex = load_example(EXAMPLES / path, **kw)
        _captured[case] = (ex, ex.capture(grads=True))
    return _captured[case]


def _run(case, strategy, **kw):
    ex, doc = _captured_example(case)
    doc = run_pass(registries().passes.get("memory.policy"), doc)
    doc = prepare(doc, scheduler=strategy, num_sms=4, **kw)
    run_pass(registries().passes.get("schedule.validate"), doc)  # the static validator agrees
    return ex, doc


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("case", ["two_weight", "mlp", "transformer", "tinymoe"])
def test_example_matches_fp64(case, strategy):
    ex, doc = _run(case, strategy)
    result = check_example(ex, doc, steps=1, seed=3)
    assert result.passed, result.format()
    for pm in doc.memory.programs:
        assert pm.arena_bytes >= pm.peak_live_bytes
    gates = [g for t in result.tables for g in t.gates]
    assert gates and all(g.threshold == SIM_THRESHOLD for g in gates)


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
def test_microbatch_programs_accumulate_in_place(strategy):
    ex, doc = _run("mlp_k2", strategy)
    stats = dict(dict(doc.memory.stats)["programs"])
    acc = dict(stats["accumulate"])
    pairs = doc.graph.program("accumulate").inplace
    assert pairs and any("grad_acc" in old for _, old in pairs)
    assert acc["copy_back"] == () and set(acc["inplace"]) == {new for new, _ in pairs}
    result = check_example(ex, doc, steps=2, seed=1)
    assert result.passed, result.format()
    assert [t.title.split(" ")[3] for t in result.tables] == ["accumulate", "accumulate_and_update"] * 2


def test_planted_lifetime_bug_in_a_real_plan():
    ex, doc = _run("transformer", "dataflow")
    ps, pm = doc.schedule.program("update"), doc.memory.program("update")
    order = Order.from_schedule(ps)
    writers, readers = {}, {}
    for t in ps.tasks:
        for a in t.writes:
            writers.setdefault(a.value, []).append(t.id)
        for a in t.reads:
            readers.setdefault(a.value, []).append(t.id)
    arena = sorted((p for p in pm.placements if p.buffer == "arena" and p.first >= 0), key=lambda p: -p.nbytes)
    # A is still to be read after B's first write, in every legal order: B on A's bytes is a bug
    victim = next((a, b) for a in arena for b in arena
                  if a.value != b.value and readers.get(a.value) and b.nbytes >= a.nbytes
                  and order.before(writers[a.value][0], writers[b.value][0])
                  and any(order.before(w, r) for w in writers[b.value] for r in readers[a.value]))
    a, b = victim
    pls = [attrs.evolve(p, offset=a.offset) if p.value == b.value else p for p in pm.placements]
    bad = attrs.evolve(doc, memory=attrs.evolve(doc.memory, programs=[attrs.evolve(pm, placements=pls)]))
    from latch_capture import batch_inputs, bind_inputs, program_inputs
    from latch_check.compare import _f64

    flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state=_f64(ex.initial_state()),
                       inputs=ex.inputs, targets=ex.targets, hyper=dict(doc.graph.meta("hyper", ()) or ()))
    flat.update(batch_inputs(ex.inputs, ex.targets))
    ins = program_inputs(doc.graph.program("update"), flat)
    with pytest.raises(SimulationError, match=rf"over live bytes of '{a.value}'"):
        simulate(bad, "update", ins, 0)
    result = check_example(ex, bad, steps=1, checks=False)  # the numbers alone fail too
    assert not result.passed


def test_recomputation_keeps_results_on_tinymoe():
    from latch_capture import batch_inputs, bind_inputs, program_inputs
    from latch_check import reference
    from latch_check.compare import _f64

    from latch_memory.remat import estimate

    ex, doc = _captured_example("tinymoe")
    passes = registries().passes
    peak = estimate(doc.graph.program("update")).peak
    rem = run_pass(passes.get("memory.remat"), doc, budget_bytes=int(0.7 * peak))
    rep = dict(dict(dict(rem.graph.metadata)["memory.remat"])["update"])
    assert rep["recomputed"] > 0 and rep["peak_after"] < rep["peak_before"] == peak
    flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state=_f64(ex.initial_state()),
                       inputs=ex.inputs, targets=ex.targets, hyper=dict(doc.graph.meta("hyper", ()) or ()))
    flat.update(batch_inputs(ex.inputs, ex.targets))
    ins = program_inputs(doc.graph.program("update"), flat)
    before = reference.run(doc, "update", ins)
    after = reference.run(rem, "update", ins)
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k
    # and the recomputing graph, scheduled and planned, runs on the simulator to FP64
    sched = prepare(rem, scheduler="dataflow", num_sms=4)
    result = check_example(ex, sched, steps=1, seed=5)
    assert result.passed, result.format()
