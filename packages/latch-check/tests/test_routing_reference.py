"""``reference.run(..., force=..., keep=...)``: forced node results replace computed ones (checked
and named), token_topk keeps its gate values consistent with forced expert indices, and a partial
force without such a rule is refused."""

import pytest

torch = pytest.importorskip("torch")

from latch_check.reference import ReferenceError, run  # noqa: E402
from latch_core.ir import Graph, Group, Node, Value  # noqa: E402
from latch_core.plugins import registries  # noqa: E402


@pytest.fixture(scope="module")
def ops():
    return registries().ops  # the core ops and the MoE ops, through their entry points


def _graph():
    """probs = softmax(logits); (vals, idx) = token_topk(probs, 2); loss = sum(vals * 3); grad of
    the probs through token_topk_backward; idx also an output."""
    N, E = 5, 4
    values = [Value("logits", (N, E), "f32", "batch"), Value("probs", (N, E), "f32"), Value("vals", (N, 2), "f32"),
              Value("idx", (N, 2), "i64"), Value("v3", (N, 2), "f32"), Value("loss", (), "f32"),
              Value("g", (N, E), "f32")]
    nodes = [
        Node("sm", "latch::softmax", ("logits",), ("probs",)),
        Node("topk", "latch::token_topk", ("probs",), ("vals", "idx"), {"k": 2}, source="moe.py:7 in forward"),
        Node("m", "latch::mul", ("vals",), ("v3",), {"scalar": 3.0}),
        Node("s", "latch::sum", ("v3",), ("loss",), {"dims": (0, 1), "keepdim": False}),
        Node("bw", "latch::token_topk_backward", ("v3", "idx"), ("g",), {"num_experts": E}),
    ]
    return Graph("update", values, nodes, [Group("batch", ["logits"])],
                 [Group("loss", ["loss"]), Group("routing", ["idx"]), Group("metrics", ["g"])])


def _logits():
    torch.manual_seed(0)
    return torch.randn(5, 4)


def test_forced_indices_replace_the_choice_and_regather_the_gate_values(ops):
    x = _logits()
    free = run(_graph(), None, {"logits": x}, ops=ops, keep=["probs", "vals"])
    probs = free["probs"]
    assert probs.dtype == torch.float64 and torch.allclose(probs, torch.softmax(x.double(), -1), atol=1e-15)
    forced_idx = free["idx"].clone()
    forced_idx[2] = torch.tensor([forced_idx[2, 0].item(), 3 - forced_idx[2, 0].item()])  # another second choice
    forced_idx[4] = forced_idx[4].flip(0)  # same set, other slot order
    out = run(_graph(), None, {"logits": x}, ops=ops, force={"idx": forced_idx.int()}, keep=["vals"])
    assert out["idx"].dtype == torch.int64 and torch.equal(out["idx"], forced_idx)
    assert torch.equal(out["vals"], probs.gather(1, forced_idx))  # values follow the forced slots
    assert out["loss"].item() == pytest.approx(3 * probs.gather(1, forced_idx).sum().item(), rel=1e-14)
    expect_g = torch.zeros(5, 4, dtype=torch.float64).scatter(1, forced_idx, 3 * probs.gather(1, forced_idx))
    assert torch.equal(out["g"], expect_g)  # downstream nodes read the forced choice
    assert out["loss"].item() != pytest.approx(free["loss"].item(), rel=1e-6)  # row 2 changed the loss


def test_forcing_every_output_needs_no_rule_and_a_single_output_node_can_be_forced(ops):
    x = _logits()
    idx = torch.tensor([[0, 1]] * 5)
    vals = torch.full((5, 2), 0.25, dtype=torch.float64)
    out = run(_graph(), None, {"logits": x}, ops=ops, force={"idx": idx, "vals": vals})
    assert out["loss"].item() == pytest.approx(7.5) and torch.equal(out["idx"], idx)
    uniform = torch.full((5, 4), 0.25)
    out = run(_graph(), None, {"logits": x}, ops=ops, force={"probs": uniform}, keep=["vals"])
    assert torch.equal(out["idx"], torch.tensor([[0, 1]] * 5))  # ties go to the lower expert
    assert torch.equal(out["vals"], torch.full((5, 2), 0.25, dtype=torch.float64))


@pytest.mark.parametrize("force, message", [
    ({"nope": torch.zeros(1)}, "force names 'nope', which is no value of program 'update'"),
    ({"logits": torch.zeros(5, 4)}, "force names 'logits', a batch value of program 'update' that no node computes"),
    ({"idx": torch.zeros(5, 3, dtype=torch.int64)},
     "forced value 'idx' has shape [5, 3], the program declares i64[5,2]"),
    ({"idx": torch.zeros(5, 2)}, "forced value 'idx' is torch.float32, the program declares i64 (int)"),
    ({"idx": [[0, 1]] * 5}, "forced value 'idx' is a list, not a tensor"),
    ({"idx": torch.tensor([[0, 1]] * 4 + [[0, 4]])},
     "forced value 'idx' of node 'topk' (latch::token_topk) (from moe.py:7 in forward): [4, 1] = 4 is not an expert "
     "index in [0, 4)"),
    ({"idx": torch.tensor([[0, 1]] * 4 + [[2, 2]])},
     "forced value 'idx' of node 'topk' (latch::token_topk) (from moe.py:7 in forward): row 4 chooses an expert "
     "twice ([2, 2])"),
    ({"vals": torch.zeros(5, 2)}, "node 'topk' (latch::token_topk) (from moe.py:7 in forward): forcing ['vals'] would "
                                  "leave its other outputs ['idx'] computed from its own results"),
])
def test_force_errors_name_the_value(ops, force, message):
    with pytest.raises(ReferenceError) as e:
        run(_graph(), None, {"logits": _logits()}, ops=ops, force=force)
    assert message in str(e.value)


def test_keep_returns_intermediates_and_names_unknown_ones(ops):
    out = run(_graph(), None, {"logits": _logits()}, ops=ops, keep=["probs", "logits"])
    assert set(out) == {"loss", "idx", "g", "probs", "logits"}
    with pytest.raises(ReferenceError, match="keep names 'nope', which is no value of program 'update'"):
        run(_graph(), None, {"logits": _logits()}, ops=ops, keep=["nope"])
