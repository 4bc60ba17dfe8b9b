"""Package lanes (tools/check_imports.py, run by tools/check_isolation.sh): the repository is clean,
and a planted undeclared import, private module import or private name import makes it fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_imports.py"

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="check_imports.py needs tomllib")


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), str(root)], capture_output=True, text=True, timeout=120)


def test_the_repository_keeps_its_lanes():
    out = run(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture
def copy(tmp_path):
    """A copy of the packages (pyprojects, sources, tests) and the examples, without builds or caches."""
    for pkg in (ROOT / "packages").iterdir():
        if (pkg / "pyproject.toml").exists():
            shutil.copytree(pkg, tmp_path / "packages" / pkg.name,
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.cuh", "*.cu"))
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    out = run(tmp_path)
    assert out.returncode == 0, out.stdout  # the copy starts clean
    return tmp_path


def plant(root: Path, package: str, text: str, where: str = "src") -> Path:
    folder = root / "packages" / package / where
    if where == "src":
        folder = next(folder.iterdir())
    f = folder / "planted.py"
    f.write_text(text)
    return f


def test_an_undeclared_cross_package_import_fails(copy):
    plant(copy, "latch-ops", "def tiling():\n    from latch_schedule.tiling import CostModel\n    return CostModel\n")
    out = run(copy)
    assert out.returncode == 1
    assert ("packages/latch-ops/src/latch_ops/planted.py:2: imports latch_schedule.tiling (distribution "
            "latch-schedule), which latch-ops/pyproject.toml does not declare") in out.stdout


def test_an_undeclared_third_party_import_fails(copy):
    plant(copy, "latch-core", "import torch\n")
    out = run(copy)
    assert out.returncode == 1 and "imports torch (distribution torch), which latch-core/pyproject.toml" in out.stdout


def test_a_test_only_dependency_does_not_count_for_the_source(copy):
    # latch-codegen-h100 declaring latch-check in its test group only: its tests may import it, its code not
    pp = copy / "packages" / "latch-codegen-h100" / "pyproject.toml"
    pp.write_text(pp.read_text().replace('test = ["torch"', 'test = ["latch-check", "torch"'))
    plant(copy, "latch-codegen-h100", "import latch_check.gates\n", where="tests")
    assert run(copy).returncode == 0
    plant(copy, "latch-codegen-h100", "import latch_check.gates\n")
    out = run(copy)
    assert out.returncode == 1 and "latch_codegen_h100/planted.py:1: imports latch_check.gates" in out.stdout


def test_private_modules_and_names_fail(copy):
    plant(copy, "latch-check", "from latch_codegen_h100.runtime import Program\n"
                               "from latch_core.document import _encode\n"
                               "import latch_ops._hidden\n")
    out = run(copy)
    assert out.returncode == 1
    assert "imports latch_codegen_h100.runtime, which latch-codegen-h100 does not make public" in out.stdout
    assert "imports the private name _encode from latch_core.document (latch-core)" in out.stdout
    assert "imports latch_ops._hidden, a private module of latch-ops" in out.stdout
