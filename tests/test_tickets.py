"""Ticketed phases (latch_codegen_h100.tickets, the scheduler ``tickets``): which tasks leave the SM
lists for a shared queue, the tables the kernel reads, and a model of the kernel's ticket protocol
over several launches. CPU only; the GPU gates and the timing are tools/gpu_check.sh's (the bench
with LATCH_SCHEDULER=tickets beside barrier)."""

from __future__ import annotations

import random
import struct
from collections import Counter
from pathlib import Path

import pytest

from latch_check.pipeline import compile_example
from latch_codegen_h100 import tables as T
from latch_codegen_h100.codegen import generate, local_deps
from latch_codegen_h100.tickets import TICKET, _phases, table_lists, ticket_plan, tickets_on
from latch_core.sections import BARRIER, TASK, Access, Placement, ProgramMemory, ProgramSchedule, Task

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SMALL_MOE = {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "experts": 4, "expert_hidden": 32, "seq": 64}


@pytest.fixture(scope="module")
def planned():
    """TinyMoE small on 8 SMs: several tasks per SM in a phase, as at full size on 132."""
    c = compile_example(EXAMPLES / "tinymoe.py", overrides=SMALL_MOE, scheduler="tickets", num_sms=8, build=False)
    return c.doc


def test_the_tickets_scheduler_is_the_barrier_schedule_with_queues(planned):
    doc = planned
    assert doc.schedule.strategy == "tickets" and tickets_on(doc)
    ps = doc.schedule.programs[0]
    tp = table_lists(ps, doc.memory.program(ps.program), True, doc.graph.program(ps.program))
    assert tp.queues, "no phase ticketed"
    listed = [ins[1] for sm in tp.sms for ins in sm if ins[0] == TASK]
    queued = [t for q in tp.queues for t in q.tasks]
    # every task once: in its list or in one queue
    assert sorted(listed + queued) == list(range(len(ps.tasks)))
    for sm, orig in zip(tp.sms, ps.sms):
        # the barriers as scheduled, one ticket per ticketed phase at its end, the static tasks in order
        assert [i for i in sm if i[0] == BARRIER] == [i for i in orig if i[0] == BARRIER]
        tickets = [i[1] for i in sm if i[0] == TICKET]
        assert tickets == list(range(len(tp.queues)))
        kept = [i for i in sm if i[0] == TASK]
        assert kept == [i for i in orig if i[0] == TASK and i[1] in set(listed)]
        for q, k in zip(tp.queues, tickets):
            phases = _phases([i for i in sm if i[0] != TICKET])
            pos = [j for j, i in enumerate(sm) if i[0] == TICKET and i[1] == k][0]
            after = sm[pos + 1:pos + 2]
            assert not after or after[0][0] == BARRIER, "a ticket ends its phase"
            assert all(ps.tasks[t].phase == ps.tasks[q.tasks[0]].phase for t in q.tasks)
            assert phases is not None
    # longest first (the scheduler's estimate), ties in task order
    for q in tp.queues:
        keys = [(-ps.tasks[t].cost, t) for t in q.tasks]
        assert keys == sorted(keys)


def test_no_two_queued_tasks_of_a_phase_conflict_where_a_list_ordered_them(planned):
    """The legality the queue needs, checked independently of tickets.py's sweep: for every pair of
    tasks that one SM list ordered in a phase where one of them is queued, no value both touch with a
    write on intersecting boxes."""
    doc = planned
    ps = doc.schedule.programs[0]
    tp = table_lists(ps, doc.memory.program(ps.program), True, doc.graph.program(ps.program))
    queued = {t for q in tp.queues for t in q.tasks}

    def touches(t):
        return [(a.value, a.box, False) for a in ps.tasks[t].reads] + [(a.value, a.box, True) for a in ps.tasks[t].writes]

    def meet(b1, b2):
        return all(l1 < h2 and l2 < h1 for (l1, h1), (l2, h2) in zip(b1, b2))

    for sm in ps.sms:
        for phase in _phases(sm):
            for i, a in enumerate(phase):
                for b in phase[i + 1:]:
                    if a not in queued and b not in queued:
                        continue
                    for va, ba, wa in touches(a):
                        for vb, bb, wb in touches(b):
                            assert not (va == vb and (wa or wb) and meet(ba, bb)), (a, b, va)


def test_a_chain_on_one_sm_keeps_its_place_and_the_rest_is_queued():
    """Hand-made: on SM 0, task 1 reads what task 0 writes (the chain stays), task 2 is free; SM 1's
    tasks 3 and 4 are free. Two values sharing bytes in the arena on one SM: not reordered either."""
    box = ((0, 4),)
    tasks = [Task(0, 0, box, [Access("x", box)], [Access("a", box)], 1.0, 0),
             Task(1, 1, box, [Access("a", box)], [Access("b", box)], 1.0, 0),
             Task(2, 2, box, [Access("x", box)], [Access("c", box)], 3.0, 0),
             Task(3, 3, box, [Access("x", box)], [Access("d", box)], 2.0, 0),
             Task(4, 4, box, [Access("x", box)], [Access("e", box)], 2.0, 0)]
    sms = [((TASK, 0), (TASK, 1), (TASK, 2), (BARRIER, 0)), ((TASK, 3), (TASK, 4), (BARRIER, 0))]
    ps = ProgramSchedule("update", [], tasks, sms, [], 1)
    places = [Placement(v, "arena", 256 * i, 16) for i, v in enumerate("abcde")]
    tp = ticket_plan(ps, ProgramMemory("update", places, 2048, 2048))
    assert [q.tasks for q in tp.queues] == [(2, 3, 4)]  # cost 3, then 2, 2 by id
    assert tp.sms[0] == ((TASK, 0), (TASK, 1), (TICKET, 0), (BARRIER, 0))
    assert tp.sms[1] == ((TICKET, 0), (BARRIER, 0))
    # e shares d's bytes: tasks 3 and 4 (one SM) stay; with task 2 alone free there is no queue
    places[4] = Placement("e", "arena", 256 * 3, 16)
    tp = ticket_plan(ps, ProgramMemory("update", places, 2048, 2048))
    assert not tp.queues and tp.sms == tuple(sms)
    from latch_codegen_h100.tickets import _overlapping_values, _sm_conflicts

    bad, why = _sm_conflicts([3, 4], ps, _overlapping_values(ProgramMemory("update", places, 2048, 2048), {}))
    assert bad == {3, 4} and "share bytes" in why


def test_task_dependencies_count_from_the_last_barrier():
    box = ((0, 4),)
    tasks = [Task(0, 0, box, [], [Access("a", box)]), Task(1, 1, box, [Access("a", box)], [Access("b", box)]),
             Task(2, 2, box, [Access("b", box)], [Access("c", box)]), Task(3, 3, box, [Access("c", box)], [Access("d", box)])]
    sms = [((TASK, 0), (TASK, 1), (BARRIER, 0), (TASK, 2), (TASK, 3))]
    deps = local_deps(ProgramSchedule("update", [], tasks, sms, [], 1), since_barrier=True)
    # task 1 waits for position 0 (task 0); task 2's writer is behind the barrier: none; task 3 waits
    # for position 0 after the barrier (task 2), not position 2 of the whole list
    assert deps == {0: -1, 1: 0, 2: -1, 3: 0}
    # the barrier kernel's producer counts from the list's start (its code is unchanged by tickets)
    assert local_deps(ProgramSchedule("update", [], tasks, sms, [], 1)) == {0: -1, 1: 0, 2: 1, 3: 2}


def test_a_ticketed_build_compiles_the_ticket_producer_and_a_barrier_build_does_not(planned, tmp_path):
    import re

    from latch_codegen_h100.sass import _run, find_cuobjdump
    import attrs

    gen = generate(planned, jobs=1)
    kernel = next(u for u in gen.units if u.name == "kernel.cu").source
    assert "#define LATCH_TICKETS 1" in kernel
    barrier = attrs.evolve(planned, schedule=attrs.evolve(planned.schedule, stats=tuple(
        (k, False if k == "tickets" else v) for k, v in planned.schedule.stats)))
    assert "#define LATCH_TICKETS 0" in next(u for u in generate(barrier, jobs=1).units if u.name == "kernel.cu").source
    try:
        find_cuobjdump()
        from latch_codegen_h100.builder import find_nvcc

        find_nvcc()
    except Exception:
        pytest.skip("needs nvcc and cuobjdump for the machine code")
    from latch_codegen_h100 import build

    doc = build(planned, tmp_path / "b", jobs=2)
    text = _run([find_cuobjdump(), "-sass", str(tmp_path / "b" / "program.so")])
    # the producer's ticket: one atomic add on the counter, its result used (ATOMG, not RED)
    assert re.search(r"\bATOMG\.E\.ADD", text), "no ticket atomic in the kernel"
    print("ticketed TinyMoE small build:", {k: dict(doc.build.stats).get(k) for k in ("registers", "spill_stores", "spill_loads")})


def _emulate(instrs, begins, expected, epochs, rng):
    """The kernel's producers (cuda/latch_kernel_main.cuh) over the tables, lists interleaved at
    random: every ticket is an atomicAdd on its counter, launch e's tickets start at e * expected.
    Returns, per launch, the tasks each list ran."""
    counters = [0] * len(expected)
    runs = []
    for e in range(epochs):
        pcs = [begins[s] for s in range(len(begins) - 1)]
        ran = [[] for _ in pcs]
        live = list(range(len(pcs)))
        while live:
            s = rng.choice(live)
            pc = pcs[s]
            if pc >= begins[s + 1]:
                live.remove(s)
                continue
            kind, a, b, c = instrs[pc]
            if kind == T.I_TICKET:
                t = counters[a] - e * expected[a]
                counters[a] += 1
                if t < c:
                    k2, task = instrs[b + t][:2]
                    assert k2 == T.I_TASK
                    ran[s].append(task)
                    continue  # stays on the ticket
            elif kind == T.I_TASK:
                ran[s].append(a)
            pcs[s] += 1
        runs.append(ran)
    for c, x in enumerate(counters):
        assert x == epochs * expected[c], "a counter's count per launch is its expected"
    return runs


def test_the_tables_run_every_task_once_per_launch_under_the_ticket_protocol(planned):
    gen = generate(planned, jobs=1)
    ps = planned.schedule.programs[0]
    tabs = gen.tables[ps.program]
    instrs = T.unpack_instrs(tabs.instrs)
    begins = list(struct.unpack(f"<{len(tabs.sm_begin) // 4}i", tabs.sm_begin))
    expected = list(struct.unpack(f"<{len(tabs.expected) // 4}I", tabs.expected))
    info = gen.manifest["programs"][ps.program]
    assert sum(t["tasks"] for t in info["tickets"]) == len(instrs) - begins[-1] > 0
    assert info["num_counters"] == len(expected) == len(ps.counters) + len(info["tickets"])
    recs = T.unpack_tasks(tabs.tasks)
    queued = {ins[1] for ins in instrs[begins[-1]:]}
    assert all(recs[t][7] == -1 for t in queued), "a queued task waits for no task of its list"
    for run in _emulate(instrs, begins, expected, 3, random.Random(0)):
        assert Counter(t for r in run for t in r) == Counter(range(len(ps.tasks)))


def test_the_profile_decodes_queue_tasks_to_the_block_that_ran_them(planned):
    from latch_codegen_h100.profile import LaunchRecords, aggregate, layout_from_document

    lay = layout_from_document(planned, "update")
    assert lay.queues and lay.num_instrs == sum(len(s) for s in lay.sms)
    # a launch: every list instruction 10 ns after the previous on its SM; queue tasks on block 1
    t, instrs = 1000, []
    for sm in lay.sms:
        for kind, _ in sm:
            instrs.append((0, 0) if kind == "ticket" else (t, t + 10))
            t += 20
    queue = []
    for _ in lay.queued:
        queue.append((t, 10 | (1 << 40)))
        t += 20
    blocks = [(500, t + 100)] * len(lay.sms)
    rep = aggregate(lay, [LaunchRecords("update", instrs, blocks, None, queue)])
    assert sum(r.tasks for r in rep.by_op) == len(planned.schedule.programs[0].tasks)
    assert rep.sms[1].tasks >= len(lay.queued)


def test_tickets_data_queues_only_the_phases_of_the_ragged_products():
    """The scheduler ``tickets_data``: the same barrier lists, queues only where a phase holds the
    data-dependent ragged expert products; every other phase keeps the cost model's lists."""
    c = compile_example(EXAMPLES / "tinymoe.py", overrides=SMALL_MOE, scheduler="tickets_data", num_sms=8, build=False)
    doc = c.doc
    assert doc.schedule.strategy == "tickets_data" and tickets_on(doc) == "data"
    ps = doc.schedule.programs[0]
    tp = table_lists(ps, doc.memory.program(ps.program), tickets_on(doc), doc.graph.program(ps.program))
    bodies = {g.id: g.body.split("/")[0] for g in ps.groups}
    assert tp.queues, "no ragged phase ticketed"
    for q in tp.queues:
        assert any(bodies[ps.tasks[t].group].startswith("ragged_mm") for t in q.tasks), q
    every = table_lists(ps, doc.memory.program(ps.program), True, doc.graph.program(ps.program))
    assert len(every.queues) > len(tp.queues)  # the full tickets plan also queues other phases
    assert {q.phase for q in tp.queues} < {q.phase for q in every.queues}
    assert any("tickets=data" in why for why in tp.refused.values())
    # the kernel holds the ticket producer
    kernel = next(u for u in generate(doc, jobs=1).units if u.name == "kernel.cu").source
    assert "#define LATCH_TICKETS 1" in kernel
