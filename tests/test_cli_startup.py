"""``latch-pipeline`` starts without torch: --help, show, validate, schedule, plan and passes over
core, schedule and memory passes never import it (each run in a fresh interpreter, which then
checks ``sys.modules``). Plugin modules import nothing heavy at module level; commands import
their work when they run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
from latch_core.cli import main
try:
    main({args!r}, standalone_mode=False)
finally:
    heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "numpy")
    print("IMPORTED:", ",".join(heavy) or "-")
"""


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(args=args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    """A real captured document (the capture itself may import torch: it runs in this process)."""
    from latch_core.document import save
    from latch_core.pipeline import run

    d = tmp_path_factory.mktemp("startup")
    doc = run(["capture"], options={"capture": {"example": str(ROOT / "examples" / "two_weight.py")}})
    save(doc, d / "two.latch.json")
    return d


@pytest.mark.parametrize("args", [
    ["--help"],
    ["show", "two.latch.json"],
    ["validate", "two.latch.json"],
    ["schedule", "-i", "two.latch.json", "-o", "s.latch.json"],
    ["schedule", "-i", "two.latch.json", "-o", "s.latch.json", "plan", "-i", "s.latch.json", "-o", "p.latch.json",
     "validate", "p.latch.json", "show", "p.latch.json"],
    ["passes", "-i", "two.latch.json", "-o", "q.latch.json", "memory.policy,schedule.split_reductions..schedule.validate"],
    ["passes", "--list"],
], ids=lambda a: " ".join(a[:1] + a[-1:]))
def test_commands_that_never_need_torch_do_not_import_it(captured, args):
    out = run_cli(args, captured)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "IMPORTED: -" in out.stdout, out.stdout


def test_the_probe_sees_torch_when_a_command_imports_it(captured):
    """The check can fail: ``check`` runs the FP64 interpreter and eager PyTorch, so it imports torch."""
    out = run_cli(["check", str(ROOT / "examples" / "two_weight.py"), "--steps", "1"], captured)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "IMPORTED: " in out.stdout and "torch" in out.stdout.split("IMPORTED: ")[1]


def test_show_prints_the_passes_a_document_went_through(captured):
    out = run_cli(["passes", "-i", "two.latch.json", "-o", "r.latch.json", "schedule.split_reductions..memory.plan",
                   "show", "r.latch.json"], captured)
    assert out.returncode == 0, out.stderr
    assert ("# passes: capture -> schedule.split_reductions -> schedule.matmul_configs -> schedule.fuse_views -> "
            "schedule.alias_views -> "
            "schedule -> memory.plan"
            in out.stdout)
    doc = json.loads((captured / "r.latch.json").read_text())
    assert [p["name"] for p in doc["provenance"]] == ["capture", "schedule.split_reductions", "schedule.matmul_configs",
                                                       "schedule.fuse_views", "schedule.alias_views", "schedule",
                                                       "memory.plan"]
