"""Passes: pure Document -> Document with name, requires, ensures; the runner checks both sides of
the contract and records provenance."""

import datetime as dt

import attrs
import pytest

import core_golden
from core_ops import CoreTestOps
from latch_core import plugin as core_plugin
from latch_core import plugins
from latch_core.document import Document, dumps, loads
from latch_core.lint import LintError
from latch_core.passes import Pass, PassError, resolve, run_pass, run_pipeline
from latch_core.registry import RegistryError
from latch_core.sections import BuildSection


def add_build(doc, *, directory="out", **_):
    return attrs.evolve(doc, build=BuildSection(directory, "k", [], []))


BUILD = Pass("test.build", add_build, requires={"graph"}, ensures={"build"})


def test_a_pass_adds_its_section_and_provenance_without_touching_its_input():
    doc = core_golden.small_graph()
    before = dumps(doc)
    out = run_pass(BUILD, doc, detail="dir=x", directory="x")
    assert dumps(doc) == before and doc.build is None  # the input is unchanged
    assert out.build.directory == "x"
    assert out.provenance[:-1] == doc.provenance
    last = out.provenance[-1]
    assert (last.name, last.detail) == ("test.build", "dir=x")
    assert last.seconds >= 0
    started = dt.datetime.fromisoformat(last.started)
    assert started.tzinfo is not None and abs(dt.datetime.now(dt.timezone.utc) - started).total_seconds() < 60
    assert loads(dumps(out)) == out  # provenance is part of the document


def test_calling_a_pass_runs_it_through_the_runner():
    out = BUILD(core_golden.small_graph(), directory="y")
    assert out.build.directory == "y" and out.provenance[-1].name == "test.build"


def test_a_missing_required_section_is_refused_before_the_pass_runs():
    ran = []
    needs = Pass("memory.arena", lambda d: ran.append(1) or d, requires={"graph", "schedule"}, ensures={"memory"})
    with pytest.raises(PassError) as e:
        run_pass(needs, core_golden.small_graph())
    assert str(e.value) == ("pass 'memory.arena' requires section(s) ['schedule'], which the document lacks "
                            "(it has ['graph']); run the stage that produces them first")
    assert ran == []
    with pytest.raises(PassError, match=r"\(it has none\)"):
        run_pass(needs, Document())


def test_an_ensured_section_the_result_lacks_is_a_contract_violation():
    liar = Pass("test.liar", lambda d: d, requires={"graph"}, ensures={"schedule"})
    with pytest.raises(PassError, match=r"pass 'test.liar' ensures section\(s\) \['schedule'\] but its result lacks them"):
        run_pass(liar, core_golden.small_graph())


def test_a_pass_must_return_a_document():
    bad = Pass("test.bad", lambda d: {"graph": d.graph})
    with pytest.raises(PassError, match="pass 'test.bad' returned dict, not a Document"):
        run_pass(bad, core_golden.small_graph())


def test_sections_named_in_a_contract_must_exist():
    with pytest.raises(ValueError, match=r"pass 'x': requires names unknown sections \['graphs'\]"):
        Pass("x", add_build, requires={"graphs"})
    with pytest.raises(ValueError, match=r"pass 'x': ensures names unknown sections \['sched'\]"):
        Pass("x", add_build, ensures={"sched"})


def test_pipeline_runs_in_order_with_per_pass_options_and_a_callback():
    seen = []
    tag = Pass("test.tag", lambda d, label="": attrs.evolve(
        d, graph=attrs.evolve(d.graph, metadata=dict(d.graph.metadata) | {"label": label})), requires={"graph"})
    out = run_pipeline([tag, BUILD], core_golden.small_graph(),
                       {"test.tag": {"label": "L"}, "test.build": {"directory": "d"}},
                       on_pass=lambda p, d: seen.append((p.name, d.provenance[-1].name)))
    assert seen == [("test.tag", "test.tag"), ("test.build", "test.build")]
    assert [p.name for p in out.provenance] == ["capture", "test.tag", "test.build"]
    assert out.graph.meta("label") == "L" and out.build.directory == "d"


def test_pipeline_stops_at_the_first_broken_contract():
    needs_memory = Pass("test.codegen", add_build, requires={"memory"}, ensures={"build"})
    with pytest.raises(PassError, match="pass 'test.codegen' requires"):
        run_pipeline([BUILD, needs_memory], core_golden.small_graph())


def test_resolve_names_through_a_registry():
    regs = plugins.load_with(("core", core_plugin), entry_points=False)
    assert resolve(["core.lint"], regs.passes) == [core_plugin.LINT]
    with pytest.raises(RegistryError, match="no pass named 'nope'; registered: core.lint"):
        resolve(["nope"], regs.passes)


@pytest.fixture
def test_registries(monkeypatch, fresh_registries):
    regs = plugins.load_with(("core", core_plugin), ("core-test-ops", CoreTestOps()), entry_points=False)
    monkeypatch.setattr(plugins, "_CACHE", regs)
    return regs


def test_core_lint_pass_is_a_validator_that_passes_clean_graphs(test_registries):
    lint = test_registries.passes.get("core.lint")
    assert lint.validator and lint.requires == {"graph"}
    doc = core_golden.small_graph()
    out = lint(doc)
    assert attrs.evolve(out, provenance=doc.provenance) == doc
    assert out.provenance[-1].name == "core.lint"


def test_core_lint_pass_raises_on_a_broken_graph(test_registries):
    doc = core_golden.small_graph()
    g = doc.graph.programs[0]
    bad = attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=[attrs.evolve(g, nodes=g.nodes[1:])]))
    with pytest.raises(LintError, match="node 'n1' \\(latch::add\\) .*reads 'mm' before it is defined"):
        test_registries.passes.get("core.lint")(bad)
