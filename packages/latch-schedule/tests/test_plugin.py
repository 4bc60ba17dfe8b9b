"""Schedulers as plugins: a third strategy from a separately installed package (found through its
``latch.plugins`` entry point, no change to Latch), choice by option / LATCH_SCHEDULER / default,
and the ``schedule`` and ``validate`` commands of ``latch-pipeline``."""

from __future__ import annotations

import importlib
import random
import textwrap

import pytest
from click.testing import CliRunner

from latch_core import document
from latch_core.cli import main
from latch_core.registry import RegistryError
from latch_schedule import testing

THIRD_PARTY = '''
"""A third-party scheduling strategy: ASAP levels, round-robin over SMs, a barrier after every
level. Built only from latch-schedule's public building blocks and latch-core's records."""

from latch_core.hookspecs import hookimpl
from latch_core.sections import BARRIER, TASK, ProgramSchedule, ScheduleSection, Task
from latch_schedule import testing
from latch_schedule.barrier import phases
from latch_schedule.schedulers import task_graphs


def round_robin(doc, options):
    num_sms = int(options.get("num_sms", 132))
    programs = []
    for tg in task_graphs(doc, options):
        level = phases(tg)
        order = sorted(range(len(tg)), key=lambda t: (level[t], t))
        new = {old: i for i, old in enumerate(order)}
        sms = [[] for _ in range(num_sms)]
        nb = 0
        for k, old in enumerate(order):
            sms[k % num_sms].append((TASK, new[old]))
            if k + 1 == len(order) or level[order[k + 1]] != level[old]:
                for lst in sms:
                    lst.append((BARRIER, nb))
                nb += 1
        tasks = [Task(new[o], tg.group_of[o], tg.tiles[o], tg.reads[o], tg.writes[o], tg.cost[o], level[o])
                 for o in order]
        programs.append(ProgramSchedule(tg.program, tg.groups, tasks, sms, (), nb))
    return ScheduleSection("round_robin", num_sms, programs)


@hookimpl
def latch_register_schedulers(register):
    register("round_robin", round_robin)


@hookimpl
def latch_register_ops(register):
    for spec in testing.SPECS:  # the ops the test programs use
        register(spec)
'''


@pytest.fixture
def third_party(tmp_path, monkeypatch, fresh_registries):
    """Install a plugin package the way pip would leave it: a module plus a dist-info with an
    entry point in ``latch.plugins``, on sys.path."""
    (tmp_path / "latch_rr_sched.py").write_text(textwrap.dedent(THIRD_PARTY))
    info = tmp_path / "latch_rr_sched-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: latch-rr-sched\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[latch.plugins]\nround_robin = latch_rr_sched\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setenv("LATCH_PLUGINS", "schedule,round_robin")
    fresh_registries.reset()
    return fresh_registries


def _doc_file(tmp_path, ops):
    path = tmp_path / "in.latch.json"
    document.save(testing.two_layer(ops), path)
    return path


def test_a_third_party_strategy_is_found_through_its_entry_point(third_party, tmp_path):
    from latch_schedule import schedule, validate

    regs = third_party.registries()
    assert "round_robin" in regs.schedulers and regs.schedulers.owner("round_robin") == "round_robin"
    assert {"barrier", "dataflow"} <= set(regs.schedulers)
    doc = schedule(testing.two_layer(regs.ops), scheduler="round_robin", num_sms=8)
    assert doc.schedule.strategy == "round_robin"
    assert validate(testing.distinct_placements(doc)) == []
    # and from the command line, by name
    src = _doc_file(tmp_path, regs.ops)
    out = tmp_path / "out.latch.json"
    r = CliRunner().invoke(main, ["schedule", "-i", str(src), "-o", str(out), "--scheduler", "round_robin",
                                  "--num-sms", "8"])
    assert r.exit_code == 0, r.output
    assert document.load(out).schedule.strategy == "round_robin"


def test_scheduler_choice_option_env_default(third_party, monkeypatch):
    from latch_schedule import schedule

    ops = third_party.registries().ops
    doc = testing.two_layer(ops)
    assert schedule(doc, num_sms=4).schedule.strategy == "barrier"
    monkeypatch.setenv("LATCH_SCHEDULER", "dataflow")
    assert schedule(doc, num_sms=4).schedule.strategy == "dataflow"
    assert schedule(doc, scheduler="round_robin", num_sms=4).schedule.strategy == "round_robin"
    with pytest.raises(RegistryError, match=r"no scheduler named 'nope'; registered: barrier, dataflow, round_robin"):
        schedule(doc, scheduler="nope")


def test_schedule_pass_drops_stale_memory_and_records_provenance(third_party):
    from latch_schedule import schedule

    ops = third_party.registries().ops
    doc = testing.distinct_placements(schedule(testing.two_layer(ops), num_sms=4))
    again = schedule(doc, scheduler="dataflow", num_sms=4)
    assert again.memory is None and again.schedule.strategy == "dataflow"
    assert [p.name for p in again.provenance] == ["schedule.split_reductions", "schedule"] * 2


def test_schedule_and_validate_commands(third_party, tmp_path):
    ops = third_party.registries().ops
    src = _doc_file(tmp_path, ops)
    out = tmp_path / "s.latch.json"
    r = CliRunner().invoke(main, ["schedule", "-i", str(src), "-o", str(out), "--scheduler", "dataflow",
                                  "--num-sms", "8", "show", str(out)])
    assert r.exit_code == 0, r.output
    assert "strategy dataflow" in r.output and "counters" in r.output
    # validate: the order-only validator runs on a scheduled document...
    r = CliRunner().invoke(main, ["validate", str(out)])
    assert r.exit_code == 0, r.output
    # ...and the full one once there is a memory plan; a mutant is reported with its culprits
    planned = testing.distinct_placements(document.load(out))
    bad = next(m for m in testing.mutants(planned, random.Random(0)) if m.kind == "shift_offset")
    good_path, bad_path = tmp_path / "good.latch.json", tmp_path / "bad.latch.json"
    document.save(planned, good_path)
    document.save(bad.doc, bad_path)
    r = CliRunner().invoke(main, ["validate", str(good_path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["validate", str(bad_path)])
    assert r.exit_code == 1
    assert "schedule.validate" in r.output and "bytes reused while live" in r.output


def test_schedule_command_errors_name_the_input(third_party, tmp_path):
    src = _doc_file(tmp_path, third_party.registries().ops)
    r = CliRunner().invoke(main, ["schedule", "-i", str(src), "-o", str(tmp_path / "o.json"), "--scheduler", "nope"])
    assert r.exit_code == 1 and str(src) in r.output and "no scheduler named 'nope'" in r.output
