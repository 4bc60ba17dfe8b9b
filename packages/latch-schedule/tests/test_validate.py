"""The static validator on hand-made hazards: each check fires, names what is at fault, and a legal
variant of the same document passes (so the check is not just rejecting everything)."""

from __future__ import annotations

import attrs
import pytest

from latch_core.sections import Access
from latch_schedule import testing
from latch_schedule.schedulers import barrier_scheduler, dataflow_scheduler
from latch_schedule.validate import ValidationError, check, validate


@pytest.fixture(scope="module")
def barrier_doc(ops):
    doc = testing.two_layer(ops)
    return testing.distinct_placements(attrs.evolve(doc, schedule=barrier_scheduler(doc, {"ops": ops, "num_sms": 4})))


@pytest.fixture(scope="module")
def dataflow_doc(ops):
    doc = testing.two_layer(ops)
    return testing.distinct_placements(attrs.evolve(doc, schedule=dataflow_scheduler(doc, {"ops": ops, "num_sms": 4})))


def _ps(doc):
    return doc.schedule.programs[0]


def _pm(doc):
    return doc.memory.programs[0]


def _set_task(doc, t, **changes):
    ps = _ps(doc)
    tasks = list(ps.tasks)
    tasks[t] = attrs.evolve(tasks[t], **changes)
    return testing._with_program(doc, attrs.evolve(ps, tasks=tasks))


def _place(doc, **moves):
    """Move values: ``name=offset`` (arena) or ``name=(buffer, offset)``; or edit fields with a dict."""
    pm = _pm(doc)
    out = []
    for p in pm.placements:
        if p.value in moves:
            m = moves[p.value]
            if isinstance(m, dict):
                p = attrs.evolve(p, **m)
            elif isinstance(m, tuple):
                p = attrs.evolve(p, buffer=m[0], offset=m[1])
            else:
                p = attrs.evolve(p, offset=m)
        out.append(p)
    return testing._with_program(doc, pm=attrs.evolve(pm, placements=out))


def _offset(doc, v):
    return next(p.offset for p in _pm(doc).placements if p.value == v)


def _writer(doc, v):
    return next(t.id for t in _ps(doc).tasks if any(a.value == v for a in t.writes))


def test_valid_documents_pass(ops, barrier_doc, dataflow_doc):
    assert validate(barrier_doc, ops=ops) == []
    assert validate(dataflow_doc, ops=ops) == []
    check(barrier_doc, ops=ops)


# ---------------------------------------------------------------------------------------------
# structure and footprints

def test_a_node_in_no_group_is_named(ops, barrier_doc):
    ps = _ps(barrier_doc)
    groups = list(ps.groups)
    g0 = groups[0]
    groups[0] = attrs.evolve(g0, nodes=())
    bad = testing._with_program(barrier_doc, attrs.evolve(ps, groups=groups))
    problems = validate(bad, ops=ops)
    assert any(f"node {g0.nodes[0]!r}" in p and "no fusion group" in p for p in problems)


def test_access_outside_the_group_or_the_shape_is_named(ops, barrier_doc):
    t = _ps(barrier_doc).tasks[0]
    bad = _set_task(barrier_doc, 0, writes=t.writes + (Access("x", ((0, 1), (0, 1))),))
    assert any("writes %x, which is not among its group's outputs" in p for p in validate(bad, ops=ops))
    a = t.reads[0]
    huge = tuple((lo, hi + 1000) for lo, hi in a.box)
    bad = _set_task(barrier_doc, 0, reads=(Access(a.value, huge),) + t.reads[1:])
    assert any("outside its shape" in p for p in validate(bad, ops=ops))


def test_a_footprint_smaller_than_the_body_is_rejected(ops, barrier_doc):
    ps = _ps(barrier_doc)
    t = next(t for t in ps.tasks if ps.groups[t.group].nodes == ("n2_matmul",))
    shrunk = tuple(Access(a.value, tuple((lo, max(lo, hi - 1)) for lo, hi in a.box)) for a in t.reads)
    problems = validate(_set_task(barrier_doc, t.id, reads=shrunk), ops=ops)
    assert any(f"task {t.id} " in p and "footprints must be supersets" in p for p in problems)


def test_an_unwritten_part_of_an_output_is_rejected(ops, barrier_doc):
    ps = _ps(barrier_doc)
    t = next(t for t in ps.tasks if ps.groups[t.group].nodes == ("n1_relu",))
    shrunk = tuple(Access(a.value, ((a.box[0][0], a.box[0][0]),) + a.box[1:]) for a in t.writes)
    problems = validate(_set_task(barrier_doc, t.id, writes=shrunk), ops=ops, check_footprints=False)
    assert any("leave part of output %n1_relu" in p for p in problems)


# ---------------------------------------------------------------------------------------------
# ordering

def test_read_before_write_names_both_tasks_and_the_source_line(ops, dataflow_doc):
    m = next(m for m in testing.mutants(dataflow_doc, __import__("random").Random(1)) if m.kind == "hoist_consumer")
    problems = validate(m.doc, ops=ops)
    hit = [p for p in problems if p.startswith("read before write")]
    assert hit and "from test.py:" in hit[0] and "SM " in hit[0]


def test_two_unordered_writers_of_one_box_race(ops, barrier_doc):
    ps = _ps(barrier_doc)
    tiles = [t for t in ps.tasks if ps.groups[t.group].nodes == ("n1_relu",)]
    a, b = tiles[0], tiles[1]  # same phase, different SMs
    bad = _set_task(barrier_doc, b.id, tile=a.tile, reads=a.reads, writes=a.writes)
    problems = validate(bad, ops=ops)
    assert any(p.startswith("write race") and f"task {a.id} " in p and f"task {b.id} " in p for p in problems)


def test_deadlocks_surface_in_the_report(ops, dataflow_doc):
    m = next(m for m in testing.mutants(dataflow_doc, __import__("random").Random(0)) if m.kind == "remove_signal")
    problems = validate(m.doc, ops=ops)
    assert any("deadlock" in p and "can never be satisfied" in p for p in problems)


# ---------------------------------------------------------------------------------------------
# memory

def test_reusing_dead_bytes_is_legal_and_live_bytes_are_not(ops, barrier_doc):
    a = _offset(barrier_doc, "n0_matmul")
    # n2_matmul is written two barrier phases after the last read of n0_matmul: legal reuse
    assert validate(_place(barrier_doc, n2_matmul=a), ops=ops) == []
    # n8_matmul reads n1_relu, which is still live while n8_matmul's tiles write: illegal
    r = _offset(barrier_doc, "n1_relu")
    problems = validate(_place(barrier_doc, n8_matmul=r), ops=ops)
    assert any(p.startswith("bytes reused while live") and "%n1_relu" in p and "%n8_matmul" in p for p in problems)


def test_elementwise_in_place_is_legal_box_by_box(ops, dataflow_doc):
    # relu's output over its own input: each task reads and writes the same elements
    a = _offset(dataflow_doc, "n0_matmul")
    assert validate(_place(dataflow_doc, n1_relu=a), ops=ops) == []
    # a matmul output over its input is not: other tiles still read the rows it overwrites
    r = _offset(dataflow_doc, "n1_relu")
    problems = validate(_place(dataflow_doc, n2_matmul=r), ops=ops)
    assert any("bytes reused while live" in p for p in problems)


def test_in_place_parameter_update_is_checked_against_every_reader(ops, dataflow_doc):
    assert any(p.buffer == "w1" and p.value == "n11_sgd" for p in _pm(dataflow_doc).placements)
    # the same bytes given to an intermediate of another type: not a legal owner of w1's buffer
    problems = validate(_place(dataflow_doc, n0_matmul=("w1", 0)), ops=ops)
    assert any("external buffer 'w1'" in p for p in problems)


def test_outputs_must_survive(ops, barrier_doc):
    loss = _offset(barrier_doc, "n6_sum")
    # a value dead before the loss is written may have used its bytes earlier...
    early = validate(_place(barrier_doc, n0_matmul=loss), ops=ops)
    assert not any("%n6_sum" in p for p in early)
    # ...but the loss's own operand, read by the task that writes the loss, may not
    problems = validate(_place(barrier_doc, n5_sum=loss), ops=ops)
    assert any(p.startswith("bytes reused while live") and "%n6_sum is a program output" in p for p in problems)


def test_placement_bookkeeping_errors(ops, barrier_doc):
    pm = _pm(barrier_doc)
    dropped = testing._with_program(barrier_doc, pm=attrs.evolve(pm, placements=[p for p in pm.placements
                                                                                 if p.value != "n1_relu"]))
    assert any("%n1_relu is read or written by tasks but has no placement" in p for p in validate(dropped, ops=ops))
    assert any("not a multiple of the alignment" in p
               for p in validate(_place(barrier_doc, n1_relu=_offset(barrier_doc, "n1_relu") + 4), ops=ops))
    assert any("needs" in p and "bytes but its placement has" in p
               for p in validate(_place(barrier_doc, n1_relu={"nbytes": 4}), ops=ops))
    far = barrier_doc.memory.arena_bytes
    assert any("overruns the arena" in p for p in validate(_place(barrier_doc, n1_relu=far), ops=ops))


def test_declared_lifetimes_must_cover_every_use(ops, barrier_doc):
    w = _writer(barrier_doc, "n1_relu")
    problems = validate(_place(barrier_doc, n1_relu={"first": w, "last": w}), ops=ops)
    assert any(p.startswith("lifetime too short") and "%n1_relu" in p for p in problems)
    problems = validate(_place(barrier_doc, n1_relu={"first": 0 if w != 0 else 1}), ops=ops)
    assert any("declares first" in p for p in problems)


def test_validation_error_lists_problems(ops, dataflow_doc):
    m = next(m for m in testing.mutants(dataflow_doc, __import__("random").Random(0)) if m.kind == "shift_offset")
    with pytest.raises(ValidationError) as e:
        check(m.doc, ops=ops)
    assert "hazard(s) found" in str(e.value) and e.value.problems


def test_constants_never_share_their_bytes(ops):
    from latch_core.document import Document
    from latch_core.ir import GraphSection, Value

    b = testing.Builder(ops)
    x = b.input("batch", "x", (64, 8), role="batch")
    b.values.append(Value("c", (64, 8), "f32", "const", data=[0.5] * 512))
    b._types["c"] = b._types[x]
    (a,) = b.node("mul", [x, "c"], name="a")
    (r,) = b.node("matmul", [a, b.input("params", "w", (8, 8))], name="r")
    doc = Document(graph=GraphSection([b.graph({"loss": [r]})]))
    doc = testing.distinct_placements(attrs.evolve(doc, schedule=barrier_scheduler(doc, {"ops": ops, "num_sms": 4})))
    assert validate(doc, ops=ops) == []
    problems = validate(_place(doc, r=_offset(doc, "c")), ops=ops)
    assert any("constants are written once at load" in p and "%c" in p for p in problems)
