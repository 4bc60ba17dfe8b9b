"""latch-core never imports torch, not even indirectly (DESIGN.md: core, schedule, memory)."""

import subprocess
import sys

CORE_MODULES = ["latch_core", "latch_core.cli", "latch_core.document", "latch_core.hookspecs", "latch_core.ir",
                "latch_core.lint", "latch_core.passes", "latch_core.plugin", "latch_core.plugins",
                "latch_core.registry", "latch_core.sections", "latch_core.text", "latch_core.pipeline",
                "latch_core.progress", "latch_core.tiling"]

# A meta-path finder that makes any torch import fail loudly, so the check holds even in a venv where
# torch is installed (the isolation check additionally runs these tests where it is absent).
PROBE = f"""
import importlib, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("latch-core imported " + name)
sys.meta_path.insert(0, NoTorch())
for m in {CORE_MODULES!r}:
    importlib.import_module(m)
from latch_core import plugin, plugins
regs = plugins.load_with(("core", plugin), entry_points=False)
assert "core.lint" in regs.passes
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print("ok")
"""


def test_core_imports_and_runs_without_torch():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
