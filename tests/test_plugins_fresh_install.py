"""The third-party story end to end, in a fresh venv: a venv with only latch-core has the core
plugin alone; `pip install` of the demo plugin's wheel makes `demo::swish` appear in
`latch-pipeline plugins` with no change to Latch; LATCH_PLUGINS leaves it out; uninstalling removes it.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def sh(*cmd, env=None, check=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=400)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def test_installing_the_demo_wheel_is_all_it_takes(tmp_path):
    wheels = tmp_path / "wheels"
    # Wheels of latch-core and the demo plugin, built from copies of this checkout's sources (pip
    # builds in the source tree, and a build/ left in the checkout can leak stale files into later
    # wheels); no build isolation: the development venv has setuptools.
    junk = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    srcs = [shutil.copytree(ROOT / rel, tmp_path / "src" / Path(rel).name, ignore=junk)
            for rel in ("packages/latch-core", "tests/demo_plugin")]
    sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, *srcs)
    (core_whl,) = wheels.glob("latch_core-*.whl")
    (demo_whl,) = wheels.glob("latch_demo_plugin-*.whl")

    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)
    pip = [venv / "bin/python", "-m", "pip", "--disable-pip-version-check", "-q"]
    env = {k: v for k, v in os.environ.items() if k not in ("LATCH_PLUGINS", "PYTHONPATH", "VIRTUAL_ENV")}
    sh(*pip, "install", core_whl, env=env)
    exe = venv / "bin/latch-pipeline"

    core_block = sh(exe, "plugins", env=env).stdout.splitlines()
    assert core_block[0].startswith("core  (latch-core ")
    assert all(ln.startswith("    ") for ln in core_block[1:])  # only core's own registrations

    sh(*pip, "install", "--no-deps", demo_whl, env=env)
    demo_version = demo_whl.name.split("-")[1]
    assert sh(exe, "plugins", env=env).stdout.splitlines() == core_block + [
        f"demo  (latch-demo-plugin {demo_version})", "    ops [1]: demo::swish",
    ]
    assert "demo" not in sh(exe, "plugins", env=env | {"LATCH_PLUGINS": "core"}).stdout

    sh(*pip, "uninstall", "-y", "latch-demo-plugin", env=env)
    assert "demo" not in sh(exe, "plugins", env=env).stdout
