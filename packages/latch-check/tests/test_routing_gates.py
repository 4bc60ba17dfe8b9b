"""Routing gates: a program's top-k choice against FP64's, flips judged as near-ties by the fixed
BF16 margin, invalid choices and non-finite probabilities failing, and the printed table."""

import math

import pytest

torch = pytest.importorskip("torch")

from latch_check.gates import (  # noqa: E402
    BF16_SPACING, ROUTING_FACTOR, Gate, GateTable, RoutingGate, routing_gate,
)

# one token, four experts; FP64 picks {0, 1}
P = torch.tensor([[0.40, 0.30, 0.299, 0.001]], dtype=torch.float64)
REF = torch.tensor([[0, 1]])


def test_the_margin_is_four_bf16_spacings_of_the_larger_probability():
    assert BF16_SPACING == 2.0 ** -7 and ROUTING_FACTOR == 4.0
    g = routing_gate("routing r", P, torch.tensor([[0, 2]]), REF)
    (f,) = g.flips
    assert (f.token, f.chosen, f.instead) == (0, (2,), (1,))
    assert f.gap == pytest.approx(0.001) and f.margin == pytest.approx(4 * 2 ** -7 * 0.30)
    assert g.flipped == 1 and g.numel == 2 and g.passed


def test_same_set_in_another_slot_order_is_no_flip():
    g = routing_gate("routing r", P, torch.tensor([[1, 0]]), REF)
    assert g.flipped == 0 and g.flips == () and g.passed and g.worst is None


def test_a_flip_at_a_clear_margin_fails():
    g = routing_gate("routing r", P, torch.tensor([[0, 3]]), REF)
    assert not g.passed and g.worst.gap == pytest.approx(0.299)
    both = routing_gate("routing r", P, torch.tensor([[2, 3]]), REF)  # both choices replaced
    (f,) = both.flips
    assert both.flipped == 2 and f.chosen == (2, 3) and f.instead == (0, 1)
    assert f.gap == pytest.approx(0.40 - 0.001) and not both.passed


def test_the_boundary_sits_exactly_at_the_margin():
    p_hi = 0.5
    margin = ROUTING_FACTOR * BF16_SPACING * p_hi
    for gap, ok in ((margin * (1 - 1e-9), True), (margin * (1 + 1e-6), False)):
        probs = torch.tensor([[p_hi, p_hi - gap, 1 - 2 * p_hi + gap]], dtype=torch.float64)
        g = routing_gate("routing r", probs, torch.tensor([[1]]), torch.tensor([[0]]))
        assert g.passed is ok, (gap, margin)


@pytest.mark.parametrize("chosen", [[[0, 0]], [[0, 4]], [[-1, 1]]])
def test_choices_a_program_cannot_make_fail(chosen):
    g = routing_gate("routing r", P, torch.tensor(chosen), REF)
    assert not g.passed and g.flipped >= 1 and math.isinf(g.worst.gap)


def test_non_finite_probabilities_fail_and_negative_scores_are_refused():
    g = routing_gate("routing r", torch.tensor([[float("nan"), 0.5, 0.5, 0.0]]), REF, REF)
    assert not g.passed and g.note == "non-finite FP64 probabilities"
    with pytest.raises(ValueError, match="routing gate 'routing r': the ranked scores have negative entries"):
        routing_gate("routing r", torch.tensor([[1.0, -1.0, 0.5, 0.2]]), REF, REF)
    with pytest.raises(ValueError, match=r"do not fit \[N, E\], \[N, k\], \[N, k\]"):
        routing_gate("routing r", P, torch.tensor([0, 1]), REF)


def test_table_prints_flips_gap_and_margin_after_the_l2_rows():
    ok = routing_gate("routing topk", P.repeat(3, 1), torch.tensor([[0, 1], [0, 2], [1, 0]]), REF.repeat(3, 1), step=7)
    bad = routing_gate("routing topk_1", P, torch.tensor([[0, 3]]), REF, step=7)
    table = GateTable("demo", [Gate("loss", 1e-6, 1e-2, 1, step=7), ok, bad])
    text = table.format()
    lines = text.splitlines()
    assert lines[1].split() == ["step", "group", "elements", "rel", "L2", "gate", "result"]
    assert "margin = 4 x 2^-7 x the larger probability" in text
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["step", "group", "choices"])
    assert lines[head].split() == ["step", "group", "choices", "flips", "worst", "gap", "margin", "result"]
    assert lines[head + 2].split() == ["7", "routing", "topk", "6", "1", "1.00e-03", "9.4e-03", "ok"]
    assert lines[head + 3].split() == ["7", "routing", "topk_1", "2", "1", "2.99e-01", "9.4e-03", "FAIL"]
    assert "routing topk: token 1 chose [2] where FP64 chose [1]: gap 1.00e-03, margin 9.4e-03, near-tie" in text
    assert "NOT a near-tie" in text
    assert [g.group for g in table.failures()] == ["routing topk_1"] and text.endswith("3 gates, 1 FAILED")
    assert isinstance(table.failures()[0], RoutingGate)
