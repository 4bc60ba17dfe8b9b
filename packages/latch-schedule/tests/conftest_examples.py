"""Captured examples for the validator's tests on real documents (needs torch and latch-capture).

``registries`` and ``captured`` are fixtures (re-exported by conftest.py); captures are cached for
the session (they are deterministic for one set of plugins), so several test modules share them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
CONFIGS = {
    "two_weight": {},
    "mlp": {},
    "transformer": dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8),
    "tinymoe": dict(vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32, batch=2, seq=16),
}
PLUGINS = "ops,moe,capture,schedule,memory"
_CAPTURED: dict[str, object] = {}


@pytest.fixture(scope="module")
def registries():
    from importlib import metadata

    from latch_core import plugins

    pytest.importorskip("torch")
    pytest.importorskip("latch_capture")
    pytest.importorskip("latch_ops")
    installed = {e.name for e in metadata.entry_points(group=plugins.GROUP)}
    old = os.environ.get("LATCH_PLUGINS")
    os.environ["LATCH_PLUGINS"] = ",".join(n for n in PLUGINS.split(",") if n in installed)
    plugins.reset()
    try:
        yield plugins.registries()
    finally:
        if old is None:
            os.environ.pop("LATCH_PLUGINS", None)
        else:
            os.environ["LATCH_PLUGINS"] = old
        plugins.reset()


@pytest.fixture(scope="module")
def captured(registries):
    latch_capture = pytest.importorskip("latch_capture")
    for name, cfg in CONFIGS.items():
        if name not in _CAPTURED:
            path = EXAMPLES / f"{name}.py"
            if not path.exists():
                pytest.skip(f"example {path} is missing")
            _CAPTURED[name] = latch_capture.load_example(path, **cfg).capture()
    return dict(_CAPTURED)


def planned(registries, doc, strategy, real_plan: bool = True, num_sms: int = 16):
    from latch_schedule import testing
    from latch_schedule.passes import SCHEDULE

    d = SCHEDULE.run(doc, scheduler=strategy, num_sms=num_sms)
    if real_plan:
        if "memory.plan" not in registries.passes:
            pytest.skip("latch-memory's memory.plan pass is not installed")
        return registries.passes.get("memory.plan").run(d)
    return testing.distinct_placements(d)
