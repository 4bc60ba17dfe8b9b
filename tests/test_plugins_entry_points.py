"""Plugins arrive through the entry-point group latch.plugins: the built-in packages and the
demonstration third-party package tests/demo_plugin (installed by tools/setup.sh) take one path.

These run in the development venv, where every package and the demo plugin are installed.
tests/test_plugins_fresh_install.py shows the same in a fresh venv: install, and the op is there.
"""

import math
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from latch_core import plugins
from latch_core.ir import TensorType
from latch_core.registry import ShapeError

ROOT = Path(__file__).resolve().parent.parent
DEMO = "latch-demo-plugin"


def builtin_entry_points() -> dict[str, str]:
    """entry-point name -> distribution, from every packages/*/pyproject.toml."""
    out = {}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        proj = tomllib.loads(pyproject.read_text())["project"]
        for name in proj.get("entry-points", {}).get("latch.plugins", {}):
            out[name] = proj["name"]
    return out


def cli(*args, env_extra=None):
    """Run the installed console script of this venv (not an import of latch_core.cli)."""
    exe = Path(sys.executable).parent / "latch-pipeline"
    env = {k: v for k, v in os.environ.items() if k != "LATCH_PLUGINS"} | (env_extra or {})
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def only(monkeypatch, fresh_registries_root):
    def set_(value):
        monkeypatch.setenv("LATCH_PLUGINS", value)
        plugins.reset()
        return plugins.registries()
    return set_


@pytest.fixture
def fresh_registries_root():
    plugins.reset()
    yield
    plugins.reset()


def test_demo_plugin_is_a_separate_installed_distribution():
    try:
        dist = metadata.distribution(DEMO)
    except metadata.PackageNotFoundError:
        pytest.fail(f"{DEMO} is not installed: run tools/setup.sh (it installs tests/demo_plugin)")
    eps = [e for e in dist.entry_points if e.group == "latch.plugins"]
    assert [(e.name, e.value) for e in eps] == [("demo", "latch_demo_plugin.plugin")]
    assert [r.split()[0] for r in dist.requires] == ["latch-core"]
    # Nothing in Latch names the demo plugin: it is found only through its entry point.
    for src in ROOT.glob("packages/*/src/**/*.py"):
        assert "latch_demo_plugin" not in src.read_text(), f"{src} names the demo plugin"


def test_demo_op_arrives_through_its_entry_point(only):
    regs = only("demo")
    assert [n for n, _ in regs.plugins] == ["core", "demo"]
    assert dict(regs.plugins)["demo"] == f"{DEMO} {metadata.version(DEMO)}"
    assert regs.ops.owner("demo::swish") == "demo"
    spec = regs.ops.get("demo::swish")
    t = TensorType((3, 5), "bf16")
    assert spec.check([t], {"beta": 2.0}) == [t]
    with pytest.raises(ShapeError, match="demo::swish: x must be a float tensor"):
        spec.check([TensorType((3,), "i32")], {})
    assert spec.cost([t], [t], {}) == (75, 60)


def test_demo_op_reference_matches_its_definition_in_fp64(only):
    torch = pytest.importorskip("torch")
    ref = only("demo").ops.get("demo::swish").extra["reference"]
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    (y,) = ref([x], {"beta": 1.5})
    expected = [v * (1 / (1 + math.exp(-1.5 * v))) for v in x.tolist()]
    assert y.dtype == torch.float64
    assert max(abs(a - b) for a, b in zip(y.tolist(), expected)) < 1e-15


def test_latch_plugins_can_exclude_the_demo_plugin(only):
    regs = only("core")
    assert "demo::swish" not in regs.ops and [n for n, _ in regs.plugins] == ["core"]


def test_cli_lists_every_builtin_package_and_the_demo_plugin():
    r = cli("plugins")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    listed = {ln.split()[0]: ln.split("(", 1)[1].split()[0] for ln in lines if not ln.startswith(" ")}
    expected = builtin_entry_points() | {"demo": DEMO}
    assert listed == expected
    i = lines.index(f"demo  ({DEMO} {metadata.version(DEMO)})")
    assert lines[i + 1] == "    ops [1]: demo::swish"


def test_cli_honours_latch_plugins():
    core = cli("plugins", env_extra={"LATCH_PLUGINS": "core"})
    assert core.returncode == 0, core.stderr
    core_block = core.stdout.splitlines()
    assert core_block[0] == f"core  (latch-core {metadata.version('latch-core')})"
    assert all(ln.startswith("    ") for ln in core_block[1:])  # core alone: demo left out
    r = cli("plugins", env_extra={"LATCH_PLUGINS": "demo"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == core_block + [f"demo  ({DEMO} {metadata.version(DEMO)})",
                                                  "    ops [1]: demo::swish"]
    r = cli("plugins", env_extra={"LATCH_PLUGINS": "demo,nosuch"})
    assert r.returncode == 2
    assert "LATCH_PLUGINS names plugins that are not installed: ['nosuch']" in r.stderr
