"""The mutations issue 14 found accepted, on real documents (the MLP and the transformer, barrier and
dataflow, the memory stage's own plan): each one is now rejected by the validator, with a message
naming the culprit.

Needs torch and latch-capture (the examples are captured small).
"""

from __future__ import annotations

import attrs
import pytest

pytest.importorskip("torch")

from conftest_examples import planned  # noqa: E402

EXAMPLES = ("mlp", "transformer")
STRATEGIES = ("barrier", "dataflow")


@pytest.fixture(scope="module")
def docs(registries, captured):
    return {(e, s): planned(registries, captured[e], s) for e in EXAMPLES for s in STRATEGIES}


def _ps(doc):
    return doc.schedule.programs[0]


def _pm(doc):
    return doc.memory.programs[0]


def _with(doc, ps=None, pm=None, memory=None, graph=None):
    from latch_schedule.testing import _with_program

    out = _with_program(doc, ps, pm)
    if memory is not None:
        out = attrs.evolve(out, memory=memory)
    if graph is not None:
        out = attrs.evolve(out, graph=graph)
    return out


def _validate(registries, doc):
    from latch_schedule.validate import validate

    return validate(doc, ops=registries.ops)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("example", EXAMPLES)
def test_the_documents_themselves_pass(registries, docs, example, strategy):
    assert _validate(registries, docs[(example, strategy)]) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("example", EXAMPLES)
def test_a_tile_shrunk_under_its_declared_writes_is_rejected(registries, docs, example, strategy):
    doc = docs[(example, strategy)]
    ps = _ps(doc)
    shrunk = 0
    for t in ps.tasks:
        d = next((k for k, (lo, hi) in enumerate(t.tile) if hi - lo >= 2), None)
        if d is None:
            continue
        tile = list(t.tile)
        tile[d] = (tile[d][0], tile[d][1] - 1)
        tasks = list(ps.tasks)
        tasks[t.id] = attrs.evolve(t, tile=tuple(tile))
        problems = _validate(registries, _with(doc, attrs.evolve(ps, tasks=tasks)))
        assert any(f"task {t.id} " in p and "write footprints must be exactly what the body stores" in p
                   for p in problems), problems[:3]
        shrunk += 1
        if shrunk == 3:
            break
    assert shrunk


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("example", EXAMPLES)
def test_a_parameter_moved_into_the_arena_is_rejected(registries, docs, example, strategy):
    doc = docs[(example, strategy)]
    g = doc.graph.program(_ps(doc).program)
    param = next(v for v in g.input_names() if g.value(v).role == "param")
    pm = _pm(doc)
    moved = [attrs.evolve(p, buffer="arena", offset=0) if p.value == param else p for p in pm.placements]
    problems = _validate(registries, _with(doc, pm=attrs.evolve(pm, placements=moved)))
    assert any(f"%{param} is a program input (param) but the plan puts it in the arena" in p for p in problems)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("example", EXAMPLES)
def test_a_zero_arena_is_rejected(registries, docs, example, strategy):
    doc = docs[(example, strategy)]
    problems = _validate(registries, _with(doc, memory=attrs.evolve(doc.memory, arena_bytes=0)))
    assert any("the section's arena (what the runtime allocates) is 0 bytes" in p for p in problems)
    pm = _pm(doc)
    both = attrs.evolve(doc.memory, arena_bytes=0, programs=[attrs.evolve(pm, arena_bytes=0)])
    problems = _validate(registries, _with(doc, memory=both))
    assert any("overruns the arena (0 bytes)" in p for p in problems)


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_loss_in_a_buffer_nothing_binds_is_rejected(registries, docs, example):
    doc = docs[(example, "barrier")]
    g = doc.graph.program(_ps(doc).program)
    loss = next(grp.values[0] for grp in g.outputs if grp.name == "loss")
    pm = _pm(doc)
    moved = [attrs.evolve(p, buffer=loss, offset=0) if p.value == loss else p for p in pm.placements]
    problems = _validate(registries, _with(doc, pm=attrs.evolve(pm, placements=moved)))
    assert any(f"%{loss} is placed in buffer {loss!r}, which nothing binds at run time" in p for p in problems)


def _barrier_mutants(ps):
    """(name, schedule) for the barrier mutations issue 14 lists."""
    nb = ps.num_barriers
    yield "num_barriers + 1", attrs.evolve(ps, num_barriers=nb + 1)

    def relabel(fn):
        return attrs.evolve(ps, sms=[[(("barrier", fn(i[1])) if i[0] == "barrier" else i) for i in sm] for sm in ps.sms])

    yield "a barrier id repeated", relabel(lambda b: b - 1 if b == 1 else b)
    yield "barrier ids swapped", relabel(lambda b: {0: 1, 1: 0}.get(b, b))
    # on one SM only: that SM's barriers swapped
    sms = [list(sm) for sm in ps.sms]
    sms[0] = [(("barrier", {0: 1, 1: 0}.get(i[1], i[1])) if i[0] == "barrier" else i) for i in sms[0]]
    yield "barrier ids swapped on one SM", attrs.evolve(ps, sms=sms)


@pytest.mark.parametrize("example", EXAMPLES)
def test_barrier_mutations_are_rejected(registries, docs, example):
    """(That the validator refuses whatever codegen's own sync check refuses, and that what it
    refuses breaks on the kernel: tests/test_kernel_model.py.)"""
    doc = docs[(example, "barrier")]
    ps = _ps(doc)
    assert ps.num_barriers >= 2
    for name, mps in _barrier_mutants(ps):
        problems = _validate(registries, _with(doc, mps))
        assert any("barrier" in p and ("SM " in p) for p in problems), (name, problems[:3])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_unknown_op_is_rejected(registries, docs, strategy):
    doc = docs[("mlp", strategy)]
    g = doc.graph.programs[0]
    n = g.nodes[3]
    bad = attrs.evolve(g, nodes=[attrs.evolve(x, op="latch::nosuch") if x is n else x for x in g.nodes])
    problems = _validate(registries, _with(doc, graph=attrs.evolve(doc.graph, programs=[bad])))
    assert any(f"node {n.name!r}" in p and "latch::nosuch, which no installed plugin registers" in p
               for p in problems), problems[:3]


def test_validate_command_rejects_the_unknown_op(registries, docs, tmp_path):
    from click.testing import CliRunner

    from latch_core.cli import main
    from latch_core.document import save

    doc = docs[("mlp", "barrier")]
    g = doc.graph.programs[0]
    bad = attrs.evolve(g, nodes=[attrs.evolve(x, op="latch::nosuch") if i == 3 else x for i, x in enumerate(g.nodes)])
    path = tmp_path / "bad.latch.json"
    save(_with(doc, graph=attrs.evolve(doc.graph, programs=[bad])), path)
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 1 and "latch::nosuch" in r.output and "INVALID" in r.output
