"""bench-lmhead without a GPU: its table and LMHEAD line from a result record, and a clean error
naming the missing device."""

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from latch_check.bench_lmhead import bench_lmhead_command, format_rows  # noqa: E402


def _record(**kw):
    r = {"tokens": 2048, "d_model": 768, "vocab": 49152, "device": "NVIDIA H200", "date": "2026-12-01 11:00 UTC",
         "tasks": 4700, "phases": 6, "arena_bytes": 481e6, "logit_sized_values": [("mm", "bf16"), ("d", "bf16")],
         "f32_logit_sized": [], "latch_gates": [("loss", 1e-4, 1e-2, True), ("grad hidden (dX)", 3e-3, 5e-2, True),
                                                ("grad weight (dW)", 4e-3, 5e-2, True)],
         "control_gates": [("loss", 1e-4, 1e-2, True), ("grad hidden (dX)", 3e-3, 5e-2, True),
                           ("grad weight (dW)", 4e-3, 5e-2, True)],
         "latch_ms": 1.1, "control_ms": 1.21, "latch_peak_bytes": 8e8, "control_peak_bytes": 9e8, "speedup": 1.1}
    r.update(kw)
    return r


def test_rows_end_with_the_lmhead_line():
    lines = format_rows(_record())
    assert lines[-1].startswith("LMHEAD PASS: latch 1.100 ms vs torch.compile 1.210 ms (1.10x), peak 800 MB vs 900 MB")
    assert any(line.startswith("latch     grad weight (dW)") and line.endswith("ok") for line in lines)


def test_a_failed_gate_or_an_f32_logit_tensor_fails_the_line():
    bad = _record(latch_gates=[("loss", 0.5, 1e-2, False)])
    assert format_rows(bad)[-1].startswith("LMHEAD FAIL")
    assert any(line.endswith("FAIL") for line in format_rows(bad))
    assert format_rows(_record(f32_logit_sized=["mm"]))[-1].startswith("LMHEAD FAIL")


def test_without_cuda_the_command_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = CliRunner().invoke(bench_lmhead_command, [])
    assert res.exit_code != 0 and "bench-lmhead runs on the GPU; torch sees no CUDA device" in res.output


def test_fp64_head_and_gates_on_cpu_tensors():
    import torch

    from latch_check.bench_lmhead import _fp64_head, _gates

    g = torch.Generator().manual_seed(0)
    h, x, w = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g), torch.randn(10, 4, generator=g)
    t = torch.randint(0, 10, (6,), generator=g)
    loss, dx, dw = _fp64_head(h, x, w, t)
    assert loss.dtype == torch.float64 and dx.shape == (6, 4) and dw.shape == (10, 4)
    rows = _gates(loss.float(), dx.float(), dw.float(), (loss, dx, dw), {"loss": 1e-2, "grad": 5e-2})
    assert [r[0] for r in rows] == ["loss", "grad hidden (dX)", "grad weight (dW)"]
    assert all(r[3] and r[1] < 1e-6 for r in rows)
    assert not _gates(loss * 2, dx, dw, (loss, dx, dw), {"loss": 1e-2, "grad": 5e-2})[0][3]
