"""``latch-pipeline compile``: the README's main command, end to end on the CPU; it runs exactly
latch_core.pipeline's list of passes."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from latch_check import pipeline
from latch_core.cli import main

ROOT = Path(__file__).resolve().parents[3]
TWO = str(ROOT / "examples" / "two_weight.py")


def _cpu_only(monkeypatch):
    monkeypatch.setattr(pipeline, "device_sms", lambda: None)


def test_compile_runs_exactly_the_pipeline_list(monkeypatch, tmp_path):
    """The document's provenance is latch_core.pipeline.PIPELINE in order (less the switched-off
    stages); the Python API and the command run the same list."""
    from latch_core.document import load
    from latch_core.pipeline import NAMES, Request

    _cpu_only(monkeypatch)
    out = tmp_path / "two.latch.json"
    r = CliRunner().invoke(main, ["compile", TWO, "--no-build", "--steps", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    ran = [p.name for p in load(out).provenance]
    assert ran == Request(TWO, build=False).passes() == [n for n in NAMES if n not in ("memory.remat", "build")]
    c = pipeline.compile_example(TWO, build=False, remat_budget=1 << 20, policy=False)
    off = ("memory.policy", "moe.store_operands", "build")  # the policy switch turns both off
    assert [p.name for p in c.doc.provenance] == [n for n in NAMES if n not in off]
    assert list(c.times) == [n for n in NAMES if n not in off]


def test_a_second_compile_reads_capture_and_check_back(monkeypatch):
    _cpu_only(monkeypatch)
    first = CliRunner().invoke(main, ["compile", TWO, "--no-build", "--steps", "1", "--set", "lr=0.05"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["compile", TWO, "--no-build", "--steps", "1", "--set", "lr=0.05"])
    assert again.exit_code == 0, again.output
    assert "capture                       " in again.output and "cached (update" in again.output
    assert "cached result of an identical run" in again.output
    assert again.output.split("two_weight: step 0")[1] == first.output.split("two_weight: step 0")[1]
    fresh = CliRunner().invoke(main, ["compile", TWO, "--no-build", "--steps", "1", "--set", "lr=0.05", "--no-cache"])
    assert fresh.exit_code == 0 and "cached" not in fresh.output


def test_compile_on_the_simulator_without_build(monkeypatch):
    _cpu_only(monkeypatch)
    r = CliRunner().invoke(main, ["compile", TWO, "--no-build", "--steps", "2"])
    assert r.exit_code == 0, r.output
    assert "no CUDA device seen by torch: checking on the CPU arena simulator" in r.output
    assert "latch compile two_weight.py: PASS: 2 run(s) on CPU arena simulator" in r.output
    for stage in ("capture", "memory.policy", "schedule.split_reductions", "schedule", "memory.plan",
                  "schedule.validate"):
        assert stage in r.output
    assert "GATES two_weight barrier policy=f32: PASS over 2 updates" in r.output
    assert "NOT simulated" not in r.output  # two_weight has no matrix product: the policy changes nothing


def test_the_output_says_the_bf16_policy_is_not_simulated(monkeypatch):
    _cpu_only(monkeypatch)
    mlp = str(ROOT / "examples" / "mlp.py")
    r = CliRunner().invoke(main, ["compile", mlp, "--no-build", "--steps", "1"])
    assert r.exit_code == 0, r.output
    assert "the BF16 policy is NOT simulated" in r.output and "(BF16 policy not simulated)" in r.output
    assert "GATES mlp barrier policy=bf16: PASS over 1 updates" in r.output
    r = CliRunner().invoke(main, ["compile", mlp, "--no-build", "--steps", "1", "--no-policy"])
    assert r.exit_code == 0 and "NOT simulated" not in r.output and "policy=f32" in r.output


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_compile_builds_with_nvcc_and_writes_the_document(monkeypatch, tmp_path):
    _cpu_only(monkeypatch)
    out = tmp_path / "two.latch.json"
    r = CliRunner().invoke(main, ["compile", TWO, "--scheduler", "dataflow", "--build-dir", str(tmp_path / "b"),
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "b" / "program.so").exists() or any((tmp_path / "b").glob("*.so"))
    from latch_core.document import load

    doc = load(out)
    assert doc.sections() == {"graph", "schedule", "memory", "build"}
    assert doc.schedule.strategy == "dataflow"
    assert "PASS" in r.output


def test_gpu_target_without_a_gpu_is_an_error_not_a_fallback(monkeypatch):
    _cpu_only(monkeypatch)
    r = CliRunner().invoke(main, ["compile", TWO, "--target", "gpu", "--no-build"])
    assert r.exit_code == 2
    assert "--target gpu was asked for, but torch sees no CUDA device" in r.output
    assert "PASS" not in r.output


def test_missing_nvcc_is_named(monkeypatch, tmp_path):
    _cpu_only(monkeypatch)
    from latch_codegen_h100 import builder

    monkeypatch.setenv("LATCH_NVCC", str(tmp_path / "no-nvcc"))
    r = CliRunner().invoke(main, ["compile", TWO, "--build-dir", str(tmp_path / "b")])
    assert r.exit_code == 2
    assert "is not an executable file" in r.output and "--no-build" in r.output
    assert builder  # the build pass reports the toolchain's own message, then what to do


def _no_nvcc_anywhere(monkeypatch):
    from latch_codegen_h100 import builder

    monkeypatch.setattr(builder.shutil, "which", lambda name: None)
    monkeypatch.setattr(builder, "FALLBACK_NVCC", ())
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("LATCH_NVCC", raising=False)


def test_compile_finds_nvcc_the_way_build_does(monkeypatch, tmp_path):
    """Not on PATH, but named by LATCH_NVCC (or under CUDA_HOME): compile builds, as build does."""
    from latch_codegen_h100 import builder

    try:
        real = builder.find_nvcc()
    except builder.BuildError:
        pytest.skip("nvcc not installed")
    _cpu_only(monkeypatch)
    _no_nvcc_anywhere(monkeypatch)
    monkeypatch.setenv("LATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LATCH_NVCC", real)
    r = CliRunner().invoke(main, ["compile", TWO, "--build-dir", str(tmp_path / "b"), "--steps", "1"])
    assert r.exit_code == 0 and "PASS" in r.output, r.output[-2000:]
    monkeypatch.delenv("LATCH_NVCC")
    monkeypatch.setenv("CUDA_HOME", str(Path(real).parent.parent))
    r = CliRunner().invoke(main, ["compile", TWO, "--build-dir", str(tmp_path / "b"), "--steps", "1"])
    assert r.exit_code == 0 and "PASS" in r.output, r.output[-2000:]


def test_a_failing_gate_fails_the_command(monkeypatch):
    """A wrong result on the target must show as FAIL with a non-zero exit (the gate is not loosened)."""
    _cpu_only(monkeypatch)
    from latch_check import simulator

    real = simulator.simulate

    def corrupt(doc, program, inputs, seed=0, **kw):
        out = real(doc, program, inputs, seed, **kw)
        return {k: (v * 1.001 if v.is_floating_point() else v) for k, v in out.items()}

    monkeypatch.setattr(simulator, "simulate", corrupt)
    # --no-cache: an earlier test's verdict for the same document is cached, and a monkeypatch is
    # no change to any file the cache key reads
    r = CliRunner().invoke(main, ["compile", TWO, "--no-build", "--steps", "1", "--no-cache"])
    assert r.exit_code == 1
    assert "FAIL" in r.output
