"""compare(): the eager FP64 update it gates against, and its bookkeeping over steps and microbatches."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from latch_capture import Example, load_example, tensor_update  # noqa: E402
from latch_check.compare import compare, eager_update  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_eager_update_of_the_two_weight_example():
    ex = load_example(EXAMPLES / "two_weight.py")
    params = {n: p.detach().double() for n, p in ex.params().items()}
    out, new_params, _ = eager_update(ex, params, {}, [(ex.inputs, ex.targets)], {"lr": 0.1})
    assert out["loss"].item() == 0.125 and out["grad.w1"].item() == 1.5 and out["grad.w2"].item() == 0.5
    assert new_params["w1"].item() == pytest.approx(0.35, abs=1e-15)
    assert out["new.w2"].dtype == torch.float64


def test_eager_microbatches_average_gradients_and_losses():
    ex = load_example(EXAMPLES / "mlp.py", batch=4)
    params = {n: p.detach().double() for n, p in ex.params().items()}
    state = ex.initial_state()
    b0, b1 = ex.microbatch(0), ex.microbatch(1)
    one0, _, _ = eager_update(ex, params, state, [b0], {"lr": 1e-3})
    one1, _, _ = eager_update(ex, params, state, [b1], {"lr": 1e-3})
    two, _, _ = eager_update(ex, params, state, [b0, b1], {"lr": 1e-3})
    assert torch.allclose(two["loss"], (one0["loss"] + one1["loss"]) / 2, rtol=1e-14)
    for n in params:
        assert torch.allclose(two[f"grad.{n}"], (one0[f"grad.{n}"] + one1[f"grad.{n}"]) / 2, rtol=1e-12, atol=1e-15)
        assert torch.count_nonzero(two[f"new.grad_acc.{n}"]) == 0


def test_compare_runs_each_program_and_reports_progress():
    messages = []
    ex = load_example(EXAMPLES / "mlp.py", batch=4, hidden=8, microbatches=3)
    result = compare(ex, steps=2, progress=messages.append)
    assert result.passed, result.format()
    assert [t.title.split(":")[1].strip() for t in result.tables] == [
        "step 0 (accumulate_and_update, K=3) FP64 interpreter vs eager FP64",
        "step 1 (accumulate_and_update, K=3) FP64 interpreter vs eager FP64"]
    assert any("capture:" in m for m in messages) and any("check: step 1: ok" in m for m in messages)


def test_compare_refuses_meta_tensors():
    from latch_capture import CaptureError

    model = torch.nn.Linear(3, 3, device="meta")
    opt = tensor_update(lambda p, g, s, h: ({n: v - 0.1 * g[n] for n, v in p.items()}, s))
    ex = Example(model=model, objective=lambda o, t: o.sum(), inputs=torch.randn(2, 3), targets=None, optimizer=opt)
    with pytest.raises(CaptureError, match="meta device"):
        compare(ex, steps=1)
