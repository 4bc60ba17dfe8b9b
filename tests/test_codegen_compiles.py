"""CI without a GPU: every example goes capture -> schedule (both strategies) -> memory plan ->
code generation -> nvcc (sm_90a, -rdc, device link, shared library). Nothing runs; a codegen or
lowering regression fails here instead of on the H200.

Both strategies lower to the same op-body signatures, so the second build must reuse the first
library (same content key): the schedule lives in the binary tables, not in the sources.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from latch_codegen_h100 import BuildError, build
from latch_codegen_h100.builder import find_nvcc
from latch_core.passes import run_pipeline
from latch_core.plugins import registries

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _have_nvcc() -> bool:
    try:
        find_nvcc()
        return True
    except BuildError:
        return False


pytestmark = pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("latch-cache")


# TinyMoE at a small size (the op-body signatures change with shapes, the code paths do not).
SMALL_MOE = {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "experts": 4, "expert_hidden": 32, "seq": 32,
             "device": "cpu"}


def _planned(name: str, scheduler: str, policy: bool, overrides=None):
    from latch_capture.examples import load_example

    doc = load_example(EXAMPLES / f"{name}.py", **(overrides or {})).capture(grads=True)
    passes = registries().passes
    seq = ([passes.get("memory.policy")] if policy else []) + [
        passes.get(n) for n in ("schedule.split_reductions", "schedule", "memory.plan")]
    return run_pipeline(seq, doc, {"schedule.split_reductions": {"num_sms": 132},
                                   "schedule": {"scheduler": scheduler, "num_sms": 132}})


def _compile_both(name: str, policy: bool, tmp_path: Path, cache_dir: Path, monkeypatch, overrides=None):
    monkeypatch.setenv("LATCH_CACHE_DIR", str(cache_dir))
    first = build(_planned(name, "barrier", policy, overrides), tmp_path / "barrier", jobs=2)
    assert (tmp_path / "barrier" / "program.so").exists()
    second = build(_planned(name, "dataflow", policy, overrides), tmp_path / "dataflow", jobs=2)
    assert second.build.key == first.build.key
    assert dict(second.build.stats)["cached"] in ("cache", "dir")
    assert (tmp_path / "dataflow" / "tables" / "update.instrs.bin").read_bytes() != \
        (tmp_path / "barrier" / "tables" / "update.instrs.bin").read_bytes()


def test_two_weight_compiles(tmp_path, cache_dir, monkeypatch):
    _compile_both("two_weight", False, tmp_path, cache_dir, monkeypatch)


@pytest.mark.slow
def test_mlp_compiles(tmp_path, cache_dir, monkeypatch):
    _compile_both("mlp", False, tmp_path, cache_dir, monkeypatch)


@pytest.mark.slow
def test_transformer_with_bf16_policy_compiles(tmp_path, cache_dir, monkeypatch):
    _compile_both("transformer", True, tmp_path, cache_dir, monkeypatch)


@pytest.mark.slow
def test_tinymoe_small_with_bf16_policy_compiles(tmp_path, cache_dir, monkeypatch):
    _compile_both("tinymoe", True, tmp_path, cache_dir, monkeypatch, SMALL_MOE)
