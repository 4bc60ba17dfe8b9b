"""The done-criterion of the schedule stage on captured examples (two-weight, MLP, dense
transformer, small TinyMoE), under both strategies:

- the validator passes on the schedule with the memory stage's real plan (``memory.plan``) and with
  a plan that gives every value its own bytes;
- every mutant (drop a barrier, drop a wait, remove a signal, swap or hoist dependent tasks, shift
  an offset onto a live value, shorten a lifetime so bytes are reused too early) is rejected, each
  with a message naming the tasks or values at fault.

Needs torch and latch-capture (the examples are captured here, small configurations).
"""

from __future__ import annotations

import os
import random
import zlib
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
CONFIGS = {
    "two_weight": {},
    "mlp": {},
    "transformer": dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8),
    "tinymoe": dict(vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32, batch=2, seq=16),
}
PLUGINS = "ops,moe,capture,schedule,memory"


@pytest.fixture(scope="module")
def registries():
    from importlib import metadata

    from latch_core import plugins

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
    out = {}
    for name, cfg in CONFIGS.items():
        path = EXAMPLES / f"{name}.py"
        if not path.exists():
            pytest.skip(f"example {path} is missing")
        out[name] = latch_capture.load_example(path, **cfg).capture()
    return out


def _planned(registries, doc, strategy, real_plan: bool):
    from latch_schedule import testing
    from latch_schedule.passes import SCHEDULE

    d = SCHEDULE.run(doc, scheduler=strategy, num_sms=16)
    if real_plan:
        if "memory.plan" not in registries.passes:
            pytest.skip("latch-memory's memory.plan pass is not installed")
        return registries.passes.get("memory.plan").run(d)
    return testing.distinct_placements(d)


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("example", sorted(CONFIGS))
def test_validator_passes_and_rejects_every_mutant(registries, captured, example, strategy):
    from latch_schedule import testing
    from latch_schedule.validate import validate

    ops = registries.ops
    kinds = Counter()
    for real_plan in (False, True):
        doc = _planned(registries, captured[example], strategy, real_plan)
        assert validate(doc, ops=ops) == [], f"{example}/{strategy}: a valid schedule was rejected"
        for m in testing.mutants(doc, random.Random(zlib.crc32(f"{example}/{strategy}/{real_plan}".encode())), per_kind=2):
            problems = validate(m.doc, ops=ops)
            assert problems, f"{example}/{strategy}: mutant {m.kind} ({m.detail}) was accepted"
            assert any(("task " in p) or ("%" in p) or ("SM " in p) for p in problems), problems[:3]
            kinds[m.kind] += 1
    # each family of mutation was exercised on this example
    assert kinds["hoist_consumer"] and kinds["shift_offset"] + kinds["shorten_lifetime"]
    if strategy == "barrier":
        assert kinds["drop_barrier"] or example == "two_weight"  # two_weight: too small to need one
    else:
        assert kinds["drop_wait"] and kinds["remove_signal"]
