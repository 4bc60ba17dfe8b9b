"""bench-moe's torch control computes the example's own update (CPU: torch._grouped_mm runs there)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from latch_check.bench_moe import format_table, grouped_control

ROOT = Path(__file__).resolve().parents[3]


def test_the_grouped_mm_control_is_the_layers_update():
    sys.path.insert(0, str(ROOT / "examples"))
    from latch_capture.examples import load_example

    ex = load_example(str(ROOT / "examples" / "moe_layer.py"), tokens=64, d_model=32, expert_hidden=16, experts=4)
    step, p = grouped_control(ex, "cpu")
    before = {n: t.clone() for n, t in p.items()}
    loss = step()
    # the same update in eager torch through the example's own model (FP32 reference ops)
    params = {n: t.detach().clone().requires_grad_() for n, t in ex.params().items()}
    x, target = ex.microbatch(0)
    y = torch.func.functional_call(ex.model, params, (x,))
    want, _ = ex.objective(y, target)
    grads = torch.autograd.grad(want, list(params.values()))
    assert abs(float(loss) - float(want.detach())) <= 2e-2 * abs(float(want.detach()))  # BF16 products in the control
    lr = float(ex.hyper["lr"])
    for (n, g) in zip(params, grads):
        got = (before[n] - p[n]) / lr
        err = ((got - g).norm() / g.norm()).item()
        assert err <= 3e-2, f"{n}: control's gradient rel-L2 {err:.3g} from eager"


def test_the_table_says_what_failed():
    r = {"gates_passed": True, "bit_identical": False, "differing_outputs": ["grad.w1"], "latch_ms": 0.5,
         "torch_grouped_graph_ms": 1.0, "ratio_torch_over_latch": 2.0}
    t = format_table(r)
    assert "NO: grad.w1" in t and "2.00x" in t and "PASS" in t


def test_the_glue_of_a_run_on_the_cpu(monkeypatch, tmp_path):
    """run()'s own code (what it reads from each stage's result) with the GPU-only parts replaced by
    stand-ins that check their calls against the real signatures: the H200 is not the place to
    find a misspelt attribute."""
    import inspect

    from latch_check import bench_moe, gpu, pipeline, timing
    from latch_check.compare import CompareResult
    from latch_check.gates import GateTable

    def checked(real, result):
        def stand_in(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)
            return result(*args, **kwargs) if callable(result) else result
        return stand_in

    doc_dir = tmp_path / "b"
    from latch_core.pipeline import Request

    compiled = pipeline.Compiled(Request("examples/moe_layer.py"), None, doc_dir, {"capture": 1.0})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pipeline, "compile_example", checked(pipeline.compile_example, compiled))
    monkeypatch.setattr(gpu, "gpu_compare", checked(gpu.gpu_compare, CompareResult((GateTable("t", ()),))))
    monkeypatch.setattr(gpu, "bench", checked(gpu.bench, {"latch_ms": 0.5, "launches_per_update": 1}))
    monkeypatch.setattr(timing, "events_ms", checked(timing.events_ms, [1.0, 1.0]))

    class Run:
        def __init__(self, example, build_dir):
            inspect.signature(gpu.GpuRun.__init__).bind(self, example, build_dir)
            self.layout = {"w1": torch.ones(2)}
            self.device = "cpu"

        def batches(self, step):
            return [(None, None)]

        def update(self, batches):
            self.layout["w1"].sub_(1.0)
            return {"grad.w1": torch.full((2,), 3.0), "loss": torch.tensor(1.0)}

    for name in ("batches", "update", "layout", "device"):
        assert name in dir(gpu.GpuRun) or name in inspect.getsource(gpu.GpuRun.__init__), name
    monkeypatch.setattr(gpu, "GpuRun", Run)
    monkeypatch.setattr(bench_moe, "capture_graph", lambda step: type("G", (), {"replay": staticmethod(step)})())
    ex_path = ROOT / "examples" / "moe_layer.py"
    r = bench_moe.run(ex_path, overrides=dict(tokens=64, d_model=32, expert_hidden=16, experts=4), iters=2)
    assert r["gates_passed"] and r["bit_identical"] and r["expert_grads_compared"] == ["grad.w1"]
    assert r["ratio_torch_over_latch"] == 2.0
    assert "bench-moe" in bench_moe.format_table(r)
