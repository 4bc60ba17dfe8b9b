"""``latch-pipeline`` through click's CliRunner: plugins, show, validate, passes, chaining, and
commands that plugins add. The registries are the test's own (core + a tiny op set + test passes),
so the expected output does not depend on which other Latch packages happen to be installed."""

import json
from importlib import metadata

import attrs
import click
import pytest
from click.testing import CliRunner

import core_golden
from core_ops import CoreTestOps
from latch_core import cli, plugins
from latch_core import plugin as core_plugin
from latch_core.document import load, save
from latch_core.hookspecs import hookimpl
from latch_core.passes import Pass
from latch_core.sections import BuildSection

GOLDEN = core_golden.GOLDEN


def _build(doc, **_):
    return attrs.evolve(doc, build=BuildSection("out", "k", [], []))


def _needs_schedule(doc, **_):
    return doc


def _no_build_allowed(doc, **_):
    if doc.build is not None:
        raise ValueError("a build section is present; this check refuses built documents")
    return doc


@click.command("hello")
@click.argument("who")
def hello(who):
    """Say hello (a command a plugin adds)."""
    click.echo(f"hello {who}")


class TestPlugin:
    @hookimpl
    def latch_register_passes(self, register):
        register(Pass("test.build", _build, requires={"graph"}, ensures={"build"}))
        register(Pass("test.needs_schedule", _needs_schedule, requires={"schedule"}))
        register(Pass("test.liar", lambda d: d, ensures={"memory"}))
        register(Pass("test.unbuilt", _no_build_allowed, validator=True))

    @hookimpl
    def latch_register_commands(self, register):
        register(hello)


@pytest.fixture
def regs(monkeypatch, fresh_registries):
    r = plugins.load_with(("core", core_plugin), ("core-test-ops", CoreTestOps()), ("test-plugin", TestPlugin()),
                          entry_points=False)
    monkeypatch.setattr(plugins, "_CACHE", r)
    return r


def run(*args):
    return CliRunner().invoke(cli.main, list(map(str, args)))


def test_plugins_lists_each_plugin_and_what_it_registers(regs):
    r = run("plugins")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "core  (-)",
        "    passes [1]: core.lint",
        "core-test-ops  (-)",
        "    ops [8]: latch::add, latch::clamp, latch::matmul, latch::mean, latch::mul, latch::relu, latch::sub, "
        "latch::sum",
        "test-plugin  (-)",
        "    commands [1]: hello",
        "    passes [4]: test.build, test.liar, test.needs_schedule, test.unbuilt",
    ]


def test_plugins_with_the_installed_entry_points_lists_core(fresh_registries, monkeypatch):
    # Only core: other installed packages are tested by their own suites and by the root tests.
    monkeypatch.setenv("LATCH_PLUGINS", "core")
    r = run("plugins")
    assert r.exit_code == 0, r.output
    passes = sorted(plugins.load_with(("core", core_plugin), entry_points=False).passes)
    assert r.output.splitlines() == [f"core  (latch-core {metadata.version('latch-core')})",
                                     f"    passes [{len(passes)}]: {', '.join(passes)}"]


@pytest.mark.parametrize("args", [["plugins"], ["--help"], ["validate", core_golden.golden_path("small_graph")]])
def test_a_broken_plugin_ends_every_command_with_its_message(monkeypatch, fresh_registries, args):
    def broken():
        raise plugins.PluginError("plugin 'boom' (boom 1.0, boom.plugin) failed to import: no driver")

    monkeypatch.setattr(plugins, "registries", broken)
    r = run(*args)
    assert r.exit_code == 2
    assert "latch-pipeline: error loading plugins: plugin 'boom' (boom 1.0, boom.plugin) failed to import" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)  # a message, not a traceback


def test_show_prints_the_golden_text(regs):
    path = core_golden.golden_path("small_graph")
    r = run("show", path)
    assert r.exit_code == 0, r.output
    expected = (GOLDEN / "small_graph.show.txt").read_text().replace("<golden>", str(path), 1)
    assert r.output == expected


def test_validate_accepts_a_good_document(regs):
    r = run("validate", core_golden.golden_path("small_graph"))
    assert r.exit_code == 0, r.output
    assert r.output.strip().endswith("small_graph.v1_0.latch.json: ok (graph)")


def test_validate_on_a_corrupted_file_names_the_field(regs):
    r = run("validate", GOLDEN / "corrupt_node_op.latch.json")
    assert r.exit_code != 0
    assert "corrupt_node_op.latch.json: field graph.programs[0].nodes[1].op: expected a string, got 42" in r.output


def test_validate_on_a_missing_file(regs, tmp_path):
    r = run("validate", tmp_path / "absent.latch.json")
    assert r.exit_code == 2 and "absent.latch.json: cannot read" in r.output


def test_validate_reports_lint_problems_and_failing_validator_passes(regs, tmp_path):
    doc = core_golden.small_graph()
    g = doc.graph.programs[0]
    bad = attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=[attrs.evolve(g, nodes=g.nodes[::-1])]),
                       build=BuildSection("out", "k", [], []))
    save(bad, tmp_path / "bad.latch.json")
    r = run("validate", tmp_path / "bad.latch.json")
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0].endswith("bad.latch.json: INVALID")
    assert any("node 'n0' (latch::matmul) (from examples/linreg.py:14 in forward): reads 'x'" not in ln
               and "reads 'uw' before it is defined" in ln for ln in lines)
    assert "  test.unbuilt: a build section is present; this check refuses built documents" in lines
    assert any(ln.startswith("  core.lint: ") for ln in lines)  # the lint pass, as a validator, too


def test_passes_runs_a_named_sequence_and_records_provenance(regs, tmp_path):
    src = core_golden.golden_path("small_graph")
    out = tmp_path / "out.latch.json"
    r = run("passes", "-i", src, "-o", out, "core.lint,test.build")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith("  core.lint: ") and r.output.splitlines()[1].startswith("  test.build: ")
    assert r.output.splitlines()[-1] == f"wrote {out}"
    doc = load(out)
    assert [p.name for p in doc.provenance] == ["capture", "core.lint", "test.build"]
    assert doc.build.directory == "out"
    assert load(src) == core_golden.small_graph()  # the input file is untouched


@pytest.mark.parametrize("sequence,message", [
    ("test.needs_schedule", "error: pass 'test.needs_schedule' requires section(s) ['schedule'], which the document "
                            "lacks (it has ['graph']); run the stage that produces them first"),
    ("core.lint,test.liar", "error: pass 'test.liar' ensures section(s) ['memory'] but its result lacks them"),
    ("core.lint,nope", "error: no pass named 'nope'; registered: core.lint, test.build, test.liar"),
])
def test_passes_reports_contract_violations_and_writes_nothing(regs, tmp_path, sequence, message):
    out = tmp_path / "out.latch.json"
    r = run("passes", "-i", core_golden.golden_path("small_graph"), "-o", out, sequence)
    assert r.exit_code == 1
    assert message in r.output
    assert not out.exists()


def test_passes_list_and_usage_errors(regs):
    r = run("passes", "--list")
    assert r.exit_code == 0
    assert "core.lint: requires ['graph'] ensures ['graph']  [core]" in r.output.splitlines()
    assert "test.build: requires ['graph'] ensures ['build']  [test-plugin]" in r.output.splitlines()
    r = run("passes", "-i", "x.latch.json")
    assert r.exit_code == 2 and "passes: missing -o/--output, SEQUENCE" in r.output


def test_commands_chain_and_a_later_one_reads_what_an_earlier_one_wrote(regs, tmp_path):
    out = tmp_path / "b.latch.json"
    r = run("passes", "-i", core_golden.golden_path("scheduled"), "-o", out, "core.lint",
            "show", out, "validate", core_golden.golden_path("small_graph"), "hello", "chain")
    assert r.exit_code == 0, r.output
    text = r.output
    assert text.index("wrote ") < text.index("# latch document") < text.index(": ok (graph)") < text.index("hello chain")
    assert "# pass core.lint: started " in text
    assert "  %h: f32[4,8] = latch::relu(%x)  # examples/tiny.py:3 in forward" in text


def test_a_command_a_plugin_registers_is_listed_and_runs(regs):
    r = run("--help")
    assert r.exit_code == 0
    listed = [ln.split()[0] for ln in r.output.split("Commands:")[1].splitlines() if ln.strip()]
    assert listed == ["hello", "passes", "plugins", "show", "validate"]
    assert run("hello", "world").output == "hello world\n"


def test_core_alone_gives_the_four_core_commands(monkeypatch, fresh_registries):
    monkeypatch.setattr(plugins, "_CACHE", plugins.load_with(("core", core_plugin), entry_points=False))
    r = run("--help")
    listed = [ln.split()[0] for ln in r.output.split("Commands:")[1].splitlines() if ln.strip()]
    assert listed == ["passes", "plugins", "show", "validate"]


def test_show_renders_every_section(regs):
    r = run("show", core_golden.golden_path("scheduled"))
    assert r.exit_code == 0
    assert r.output == (GOLDEN / "scheduled.show.txt").read_text().replace(
        "<golden>", str(core_golden.golden_path("scheduled")), 1)
    doc = json.loads(core_golden.golden_path("scheduled").read_text())
    assert doc["schedule"]["strategy"] == "barrier"
