"""The ``plan`` command through latch-pipeline, with the installed entry point."""

import attrs
from click.testing import CliRunner

from latch_core import plugins
from latch_core.cli import main
from latch_core.document import load, program_doc, save
from latch_memory.testing import naive_schedule_section, test_registry, two_weight_graph


def test_plan_command(tmp_path, monkeypatch):
    monkeypatch.setenv("LATCH_PLUGINS", "memory")
    plugins.reset()
    try:
        doc = program_doc(two_weight_graph())
        doc = attrs.evolve(doc, schedule=naive_schedule_section(doc, test_registry(), strategy="dataflow"))
        src, dst = tmp_path / "in.latch.json", tmp_path / "out.latch.json"
        save(doc, src)
        res = CliRunner().invoke(main, ["plan", "-i", str(src), "-o", str(dst)])
        assert res.exit_code == 0, res.output
        assert "update: arena" in res.output and "peak live" in res.output
        out = load(dst)
        assert out.memory is not None and out.provenance[-1].name == "memory.plan"
        res = CliRunner().invoke(main, ["plan", "-i", str(tmp_path / "missing.json"), "-o", str(dst)])
        assert res.exit_code != 0 and "missing.json" in res.output
        save(program_doc(two_weight_graph()), src)  # no schedule section
        res = CliRunner().invoke(main, ["plan", "-i", str(src), "-o", str(dst)])
        assert res.exit_code == 1 and "requires section(s) ['schedule']" in res.output
    finally:
        plugins.reset()
