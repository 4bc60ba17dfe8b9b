"""Relative-L2 gates: the measure, NaN handling, per-group gates of a program, the printed table."""

import math

import pytest

torch = pytest.importorskip("torch")

from latch_check.gates import FP64_THRESHOLD, Gate, GateTable, program_gates, rel_l2  # noqa: E402
from latch_core.ir import Graph, Group, Node, Value  # noqa: E402


def test_rel_l2_measure():
    ref = torch.tensor([3.0, 4.0])
    assert rel_l2(ref, ref) == 0.0
    assert rel_l2(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert rel_l2([torch.tensor([3.0]), torch.tensor([4.5])], [torch.tensor([3.0]), torch.tensor([4.0])]) == pytest.approx(0.1)
    assert rel_l2(torch.zeros(3), torch.zeros(3)) == 0.0
    assert rel_l2(torch.ones(3), torch.zeros(3)) == math.inf
    assert math.isnan(rel_l2(torch.tensor([float("nan"), 1.0]), torch.ones(2)))
    assert math.isnan(rel_l2(torch.ones(2), torch.tensor([1.0, float("inf")])))
    with pytest.raises(ValueError, match="shapes differ"):
        rel_l2(torch.ones(2), torch.ones(3))


def test_nan_and_inf_fail_a_gate():
    assert Gate("loss", 0.0, 1e-10, 1).passed
    assert not Gate("loss", math.nan, 1e-10, 1).passed
    assert not Gate("loss", math.inf, 1e-10, 1).passed
    assert not Gate("loss", 2e-10, 1e-10, 1).passed


def _graph():
    vals = [Value(n, (2,), "f32", r) for n, r in (("w", "param"), ("m", "state"))]
    vals += [Value(n, (2,), "f32") for n in ("new.w", "new.m", "grad.w")] + [Value("loss", (), "f32")]
    nodes = [Node("a", "latch::add", ("w",), ("new.w",), {"scalar": 1.0}), Node("b", "latch::copy", ("m",), ("new.m",)),
             Node("c", "latch::copy", ("w",), ("grad.w",)), Node("d", "latch::sum", ("w",), ("loss",), {"dims": (0,), "keepdim": False})]
    return Graph("update", vals, nodes, [Group("params", ["w"]), Group("state", ["m"])],
                 [Group("new_params", ["new.w"]), Group("new_state", ["new.m"]), Group("loss", ["loss"]),
                  Group("grads", ["grad.w"])], inplace=[("new.w", "w"), ("new.m", "m")])


def test_program_gates_cover_every_group():
    g = _graph()
    prev = {"w": torch.tensor([1.0, 2.0]), "m": torch.zeros(2)}
    ref = {"new.w": torch.tensor([2.0, 3.0]), "new.m": torch.zeros(2), "loss": torch.tensor(3.0), "grad.w": prev["w"]}
    out = dict(ref)
    out["new.w"] = torch.tensor([2.0, 3.0 + 1e-6], dtype=torch.float64)
    gates = {x.group: x for x in program_gates(g, out, ref, previous=prev, thresholds={"param_update": 1e-3})}
    assert set(gates) == {"loss", "grad w", "new_params", "param_update", "new_state"}
    assert gates["loss"].rel_l2 == 0.0 and gates["loss"].threshold == FP64_THRESHOLD
    assert not gates["new_params"].passed  # 2.8e-7 relative > 1e-10
    assert gates["param_update"].passed and gates["param_update"].threshold == 1e-3
    assert gates["param_update"].rel_l2 == pytest.approx(1e-6 / math.sqrt(2), rel=1e-6)


def test_table_shows_failures():
    table = GateTable("demo", [Gate("loss", 0.0, 1e-10, 1, step=0), Gate("grad w", math.nan, 1e-10, 2, step=0)])
    text = table.format()
    assert not table.passed and [f.group for f in table.failures()] == ["grad w"]
    lines = text.splitlines()
    assert lines[0] == "demo" and lines[1].split() == ["step", "group", "elements", "rel", "L2", "gate", "result"]
    assert "nan" in text and "FAIL" in text and text.endswith("2 gates, 1 FAILED")


def _two_grad_graph():
    vals = [Value(n, (2,), "f32", "param") for n in ("w", "b")]
    vals += [Value(n, (2,), "f32") for n in ("grad.w", "grad.b")]
    nodes = [Node("c", "latch::copy", ("w",), ("grad.w",)), Node("d", "latch::copy", ("b",), ("grad.b",))]
    return Graph("update", vals, nodes, [Group("params", ["w", "b"])], [Group("grads", ["grad.w", "grad.b"])])


def test_a_gradient_zero_by_construction_is_gated_against_all_the_gradients():
    """OPT's k_proj.bias: exactly zero in exact arithmetic, rounding noise on both sides (results/hf.md)."""
    g = _two_grad_graph()
    ref = {"grad.w": torch.tensor([3.0, 4.0], dtype=torch.float64), "grad.b": torch.tensor([1e-17, 0.0], dtype=torch.float64)}
    noise = dict(ref, **{"grad.b": torch.tensor([-2e-17, 1e-17], dtype=torch.float64)})
    gates = {x.group: x for x in program_gates(g, noise, ref)}
    assert rel_l2(noise["grad.b"], ref["grad.b"]) > 1.0          # noise against noise, relative to itself
    b = gates["grad b"]
    assert b.vs_all and b.passed and b.rel_l2 == pytest.approx(math.hypot(3e-17, 1e-17) / 5.0)
    assert b.result_text == "ok (zero by construction: vs all grads)"
    assert not gates["grad w"].vs_all and gates["grad w"].result_text == "ok"
    wrong = dict(ref, **{"grad.b": torch.tensor([1e-3, 0.0], dtype=torch.float64)})   # a real value where 0 is exact
    bad = {x.group: x for x in program_gates(g, wrong, ref)}["grad b"]
    assert not bad.passed and bad.result_text == "FAIL (zero by construction: vs all grads)"
    nan = dict(ref, **{"grad.b": torch.tensor([math.nan, 0.0], dtype=torch.float64)})
    assert not {x.group: x for x in program_gates(g, nan, ref)}["grad b"].passed
    small = dict(ref, **{"grad.b": torch.tensor([1e-6, 0.0], dtype=torch.float64)})   # small but real: relative as ever
    sg = {x.group: x for x in program_gates(g, small, {**ref, "grad.b": torch.tensor([1e-6, 0.0], dtype=torch.float64)})}
    assert not sg["grad b"].vs_all
