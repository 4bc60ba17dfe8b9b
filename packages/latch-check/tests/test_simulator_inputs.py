"""The simulator checks its inputs as the GPU runtime does (latch_core.inputs): an int tensor for a
float input, float targets for integer labels (3.7 used to be read as 3), extra and missing inputs
are refused naming the input; the opt-in finiteness check names the first non-finite tensor.
The GPU side of the same rules: packages/latch-codegen-h100/tests/test_gpu_safe.py."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("latch_capture")

from latch_check.simulator import SimulationError, prepare, simulate  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mlp():
    from latch_capture import bind_inputs, load_example, program_inputs

    ex = load_example(ROOT / "examples" / "mlp.py")
    doc = prepare(ex.capture(grads=True), num_sms=8)
    g = doc.graph.program("update")
    from latch_check.compare import _f64

    flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state=_f64(ex.initial_state()),
                       inputs=ex.inputs, targets=ex.targets, hyper=dict(doc.graph.meta("hyper", ()) or ()))
    return doc, g, program_inputs(g, flat)


def _batch(g, kind):
    return next(n for grp in g.inputs if grp.name == "batch" for n in grp.values if (g.value(n).dtype == "i64") == kind)


def test_valid_inputs_run(mlp):
    doc, g, ins = mlp
    out = simulate(doc, "update", ins)
    assert torch.isfinite(out[next(grp.values[0] for grp in g.outputs if grp.name == "loss")]).all()


def test_an_int_tensor_for_a_float_input_is_refused(mlp):
    doc, g, ins = mlp
    x = _batch(g, kind=False)
    bad = dict(ins, **{x: ins[x].long()})
    with pytest.raises(SimulationError, match=rf"'{x}': dtype torch.int64, .* a int tensor cannot stand for a float"):
        simulate(doc, "update", bad)


def test_float_targets_for_integer_labels_are_refused(mlp):
    doc, g, ins = mlp
    t = _batch(g, kind=True)
    bad = dict(ins, **{t: ins[t].double() + 0.7})
    with pytest.raises(SimulationError, match=rf"'{t}': dtype torch.float64, the program was built for i64"):
        simulate(doc, "update", bad)


def test_extra_and_missing_inputs_are_refused(mlp):
    doc, g, ins = mlp
    with pytest.raises(SimulationError, match=r"program 'update' takes no input named 'nosuch'"):
        simulate(doc, "update", dict(ins, nosuch=torch.zeros(3)))
    name = g.input_names()[0]
    with pytest.raises(SimulationError, match=rf"{g.value(name).role} '{name}' \(.*\) is missing"):
        simulate(doc, "update", {k: v for k, v in ins.items() if k != name})


def test_the_finiteness_check_names_the_first_non_finite_input(mlp, monkeypatch):
    doc, g, ins = mlp
    x = _batch(g, kind=False)
    bad = dict(ins, **{x: ins[x].clone()})
    bad[x][1, 2] = float("nan")
    bad[x][3, 0] = float("inf")
    simulate(doc, "update", bad)  # opt-in: off by default
    with pytest.raises(SimulationError, match=rf"batch '{x}' holds 2 non-finite element\(s\) \(the first at index \[1, 2\]: nan\)"):
        simulate(doc, "update", bad, check_finite=True)
    monkeypatch.setenv("LATCH_CHECK_FINITE", "1")
    with pytest.raises(SimulationError, match="non-finite"):
        simulate(doc, "update", bad)
