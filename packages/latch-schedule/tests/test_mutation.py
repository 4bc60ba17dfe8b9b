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


# ---------------------------------------------------------------------------------------------
# The generator over every field (latch_schedule.mutation) against the brute-force oracle

MUTANTS = {"two_weight": 150, "mlp": 120, "transformer": 80, "tinymoe": 80}  # ~40 s in all on 2 cores


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("example", sorted(MUTANTS))
def test_generated_mutants_every_field_no_hazard_accepted_no_false_alarm(registries, captured, example, strategy):
    """Every field of the schedule and memory sections is mutated (one site per mutant); the
    brute-force oracle (latch_schedule.oracle: explicit happens-before graph, cell-by-cell data
    checks, byte-pair memory checks) says whether the mutant breaks a contract. The validator must
    reject exactly the ones that do: zero hazards accepted, zero false alarms on benign mutants
    (cost, phase, stats, body keys, peak bytes, a reordered read list, a free byte range, ...)."""
    from latch_schedule import mutation, oracle
    from latch_schedule.validate import validate

    ops = registries.ops
    doc = _planned(registries, captured[example], strategy, True, num_sms=8)
    assert oracle.violations(doc, ops) == [] and validate(doc, ops=ops) == []
    rng = random.Random(zlib.crc32(f"generated/{example}/{strategy}".encode()))
    seen, stats, wrong = set(), Counter(), []
    for m in mutation.mutants(doc, rng, MUTANTS[example]):
        hazard = oracle.violations(m.doc, ops)
        rejected = validate(m.doc, ops=ops)
        stats["hazard" if hazard else "benign"] += 1
        seen.add(m.kind)
        if hazard and not rejected:
            wrong.append(f"HAZARD ACCEPTED: {m.path} {m.op}: {hazard[:2]}")
        elif rejected and not hazard:
            wrong.append(f"FALSE ALARM: {m.path} {m.op}: {rejected[:2]}")
    print(f"\nmutation generator {example}/{strategy}: {sum(stats.values())} mutants, {stats['hazard']} hazards, "
          f"{stats['benign']} benign, {len(seen)} field kinds; disagreements: {len(wrong)}")
    assert not wrong, "\n".join(wrong[:10])
    assert stats["hazard"] and stats["benign"]
    # every kind of site that has an operator was mutated at least once
    mutable = {k for k, items in mutation.sites(doc).items()
               if any(mutation._candidates(v, k, {}, ["x"], 256, random.Random(0)) for _, v in items)}
    assert mutable <= seen, sorted(mutable - seen)
