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

import random
import zlib
from collections import Counter

import pytest

pytest.importorskip("torch")

from conftest_examples import CONFIGS, planned as _planned  # noqa: E402


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
