"""Alias prefixes (issue 11): contiguous views fold into the group that reads them.

On the captured transformer (small): with ``schedule.alias_views`` and the scheduler option
``alias_views`` the schedule has fewer tasks and barriers, no contiguous view is a copy task of its
own any more, the documents pass the hazard proof, and a value moved onto the bytes an alias
prefix reads while its reader is still to run is rejected (the reader's read of the storage value
is what keeps those bytes live). Needs torch and latch-capture.
"""

from __future__ import annotations

import attrs
import pytest

pytest.importorskip("torch")

from conftest_examples import planned  # noqa: E402

from latch_core.aliasing import alias_byte_offset, alias_prefixes  # noqa: E402
from latch_core.registry import COPY, ELEMENTWISE, STRUCTURAL, VIEW  # noqa: E402

STRATEGIES = ("barrier", "dataflow")


def _fusable(ops):
    from latch_schedule.fusion import FUSABLE_VIEWS

    def f(n):
        tags = ops.get(n.op).tags
        return bool(tags & {ELEMENTWISE, COPY}) or (VIEW in tags and n.op in FUSABLE_VIEWS)
    return f


def _plan(registries, doc, strategy, alias):
    from latch_core.passes import run_pass
    from latch_schedule.passes import ALIAS_VIEWS, SCHEDULE

    if alias:
        doc = run_pass(ALIAS_VIEWS, doc)
    d = SCHEDULE.run(doc, scheduler=strategy, num_sms=16, alias_views=alias)
    return registries.passes.get("memory.plan").run(d)


@pytest.fixture(scope="module")
def docs(registries, captured):
    return {(s, a): _plan(registries, captured["transformer"], s, a) for s in STRATEGIES for a in (False, True)}


def _contiguous_copy_groups(doc, ops):
    ps = doc.schedule.programs[0]
    g = doc.graph.program(ps.program)
    nodes = {n.name: n for n in g.nodes}
    outputs = set(g.output_names())
    out = []
    for grp in ps.groups:
        gn = [nodes[x] for x in grp.nodes]
        if all(ops.get(n.op).tags & {VIEW, STRUCTURAL} for n in gn) and not set(grp.outputs) & outputs and all(
                alias_byte_offset(n, g) is not None for n in gn):
            out.append(grp.id)
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fewer_tasks_and_no_contiguous_view_copies(registries, docs, strategy):
    ops = registries.ops
    off, on = docs[(strategy, False)], docs[(strategy, True)]
    p_off, p_on = off.schedule.programs[0], on.schedule.programs[0]
    copies = _contiguous_copy_groups(off, ops)
    assert len(copies) >= 10  # the reshapes after products, the q/k/v selects, the cross-entropy's targets
    assert _contiguous_copy_groups(on, ops) == []
    assert len(p_on.tasks) <= len(p_off.tasks) - len(copies)
    if strategy == "barrier":
        assert p_on.num_barriers < p_off.num_barriers
        assert len({t.phase for t in p_on.tasks}) < len({t.phase for t in p_off.tasks})
    # the views are addresses: groups with an alias prefix read its storage value, not the view
    g = on.graph.program(p_on.program)
    prefixed = 0
    for grp in p_on.groups:
        pre = alias_prefixes(g, grp.nodes, _fusable(ops), grp.outputs)
        if not pre:
            continue
        prefixed += 1
        assert not set(pre) & set(grp.inputs) and not set(pre) & set(grp.outputs)
        assert {base for base, _ in pre.values()} <= set(grp.inputs)
        reads = {a.value for t in p_on.tasks if t.group == grp.id for a in t.reads}
        assert {base for base, _ in pre.values()} <= reads
    assert prefixed >= len(copies) // 2
    placed = {p.value for p in on.memory.programs[0].placements}
    for grp in p_on.groups:
        for v in alias_prefixes(g, grp.nodes, _fusable(ops), grp.outputs):
            assert v not in placed  # no bytes of its own


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_aliased_documents_pass_the_hazard_proof(registries, docs, strategy):
    from latch_schedule.validate import validate

    assert validate(docs[(strategy, True)], ops=registries.ops) == []


def _alias_hazard(doc, ops):
    """A mutant: an arena value W moved onto the bytes of the storage value X of an alias prefix,
    where every task touching X outside alias-prefix groups is done before W is written, but an
    alias reader is not: only the alias reader's read keeps those bytes live. None if no such W."""
    from latch_core.order import Order

    ps = doc.schedule.programs[0]
    pm = doc.memory.programs[0]
    g = doc.graph.program(ps.program)
    order = Order.from_schedule(ps)
    place = {p.value: p for p in pm.placements}
    nodes = {n.name: n for n in g.nodes}
    alias_groups: dict[str, set[int]] = {}
    for grp in ps.groups:
        for base, _ in alias_prefixes(g, grp.nodes, _fusable(ops), grp.outputs).values():
            alias_groups.setdefault(base, set()).add(grp.id)
    users: dict[str, list] = {}
    writers: dict[str, list] = {}
    for t in ps.tasks:
        for a in t.reads:
            users.setdefault(a.value, []).append(t)
        for a in t.writes:
            users.setdefault(a.value, []).append(t)
            writers.setdefault(a.value, []).append(t.id)
    outputs = set(g.output_names())
    for x, gids in sorted(alias_groups.items()):
        px = place.get(x)
        if px is None or px.buffer != "arena" or x in outputs:
            continue
        plain = [t.id for t in users[x] if t.group not in gids]
        alias = [t.id for t in users[x] if t.group in gids]
        for w, p in sorted(place.items()):
            if w == x or p.buffer != "arena" or w in outputs or g.value(w).role != "intermediate" \
                    or p.nbytes > px.nbytes or w not in writers:
                continue
            ws = writers[w]
            if all(order.before(u, t) for u in plain for t in ws) and \
                    any(not order.before(a, t) for a in alias for t in ws) and \
                    all(order.before(t, a) or not order.before(a, t) for a in alias for t in ws):
                moved = [attrs.evolve(q, offset=px.offset) if q.value == w else q for q in pm.placements]
                return x, w, attrs.evolve(pm, placements=moved)
    return None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_write_over_aliased_storage_while_its_reader_is_live_is_rejected(registries, docs, strategy):
    from latch_schedule.testing import _with_program
    from latch_schedule.validate import validate

    doc = docs[(strategy, True)]
    found = _alias_hazard(doc, registries.ops)
    assert found is not None, "no value could be moved under an alias reader"
    x, w, pm = found
    mutant = _with_program(doc, None, pm)
    problems = validate(mutant, ops=registries.ops)
    assert any("bytes reused while live" in p and f"%{x}" in p and f"%{w}" in p for p in problems), problems[:3]
    if strategy == "barrier":  # the brute-force oracle agrees (latch_schedule.oracle; slow, so once)
        from latch_schedule.oracle import violations

        assert any(f"{x} and {w} share bytes while live" in v or f"{w} and {x} share bytes while live" in v
                   for v in violations(mutant, registries.ops))
