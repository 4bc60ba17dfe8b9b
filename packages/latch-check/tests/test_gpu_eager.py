"""The CPU-testable parts of latch_check.gpu: the eager control update, policy detection."""

from __future__ import annotations

from pathlib import Path

import torch

from latch_capture.examples import load_example
from latch_check import gpu
from latch_check.compare import eager_update
from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_eager_control_reproduces_the_two_weight_update():
    ex = load_example(EXAMPLES / "two_weight.py")
    step, tensors = gpu.eager_step_fn(ex, "cpu")
    loss = step()
    assert abs(loss.item() - 0.125) < 1e-7
    assert abs(tensors["params"]["w1"].item() - 0.35) < 1e-6
    assert abs(tensors["params"]["w2"].item() - 1.45) < 1e-6


def test_eager_control_matches_the_fp64_eager_update_with_optimizer_state():
    ex = load_example(EXAMPLES / "mlp.py")
    step, tensors = gpu.eager_step_fn(ex, "cpu")
    step()
    params = {n: p.detach().double() for n, p in ex.params().items()}
    state = {k: v for k, v in ex.initial_state().items()}
    state = {"step": state["step"].double(), "exp_avg": {n: t.double() for n, t in state["exp_avg"].items()},
             "exp_avg_sq": {n: t.double() for n, t in state["exp_avg_sq"].items()}}
    _, new_params, new_state = eager_update(ex, params, state, [ex.microbatch(0)], ex.hyper)
    for n, p in new_params.items():
        err = (tensors["params"][n].double() - p).norm() / p.norm()
        assert err < 1e-5, n
    assert tensors["state"]["step"].item() == 1.0 == new_state["step"].item()


def test_policy_picks_the_gate_table():
    v = [Value("a", (2, 2), "f32", "batch"), Value("b", (2, 2), "f32")]
    plain = Graph("update", v, [Node("m", "latch::matmul", ("a", "a"), ("b",))], [Group("batch", ["a"])],
                  [Group("metrics", ["b"])])
    bf16 = Graph("update", v, [Node("m", "latch::matmul", ("a", "a"), ("b",), {"operand_dtype": "bf16"})],
                 [Group("batch", ["a"])], [Group("metrics", ["b"])])
    assert gpu.thresholds_for(Document(graph=GraphSection([plain]))) == gpu.GATES_F32
    assert gpu.thresholds_for(Document(graph=GraphSection([bf16]))) == gpu.GATES_BF16
    assert all(gpu.GATES_F32[k] <= gpu.GATES_BF16[k] for k in gpu.GATES_F32)


def test_policy_faithful_references_round_bf16_operands_only_where_the_node_says_so():
    ops = gpu.policy_faithful_ops()
    mm = ops.get("latch::matmul").extra["reference"]
    a = torch.tensor([[1.0 + 2 ** -10]], dtype=torch.float64)  # not representable in bf16
    b = torch.tensor([[1.0]], dtype=torch.float64)
    assert mm([a, b], {})[0].item() == 1.0 + 2 ** -10
    assert mm([a, b], {"operand_dtype": "bf16"})[0].item() == 1.0
    assert ops.get("latch::add").extra["reference"]([a, b], {})[0].item() == 2.0 + 2 ** -10
