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
    assert abs(float(loss) - float(want.detach())) <= 2e-2 * abs(float(want))  # BF16 products in the control
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
