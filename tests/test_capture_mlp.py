"""The MLP example (AdamW + global-norm clipping): the captured update, run by the FP64 reference
interpreter, matches PyTorch's eager FP64 update (loss, every gradient, new params, the param
update, new optimizer state, metrics) to 1e-10 relative over several steps, for one and several
microbatches and for random shapes; the check command prints the gate table; a planted error in a
document fails its gate."""

from pathlib import Path

import attrs
import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from latch_capture import load_example  # noqa: E402
from latch_check.compare import compare  # noqa: E402
from latch_core import document  # noqa: E402
from latch_core.cli import main  # noqa: E402
from latch_core.ir import Node  # noqa: E402

MLP = Path(__file__).resolve().parents[1] / "examples" / "mlp.py"


@pytest.mark.parametrize("microbatches", [1, 2])
def test_mlp_matches_eager_fp64_over_steps(microbatches):
    ex = load_example(MLP, microbatches=microbatches)
    result = compare(ex, steps=3)
    assert result.passed, result.format()
    groups = {g.group for t in result.tables for g in t.gates}
    assert {"loss", "new_params", "param_update", "new_state", "metric grad_norm", "metric accuracy"} <= groups
    assert {f"grad layers.{i}.weight" for i in range(3)} <= groups
    assert len(result.tables) == 3


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 6), d_in=st.integers(1, 7), hidden=st.integers(1, 9), classes=st.integers(2, 6),
       layers=st.integers(1, 3), microbatches=st.integers(1, 2), seed=st.integers(0, 1000))
def test_random_mlp_shapes_match_eager(batch, d_in, hidden, classes, layers, microbatches, seed):
    ex = load_example(MLP, batch=batch, d_in=d_in, hidden=hidden, classes=classes, layers=layers,
                      microbatches=microbatches, seed=seed)
    result = compare(ex, steps=2)
    assert result.passed, result.format()


def test_check_command_prints_the_gate_table(tmp_path):
    doc = tmp_path / "mlp.latch.json"
    r = CliRunner().invoke(main, ["capture", str(MLP), "-o", str(doc), "--set", "batch=8", "--grads", "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["check", str(MLP), "-d", str(doc), "--set", "batch=8", "--steps", "2"])
    assert r.exit_code == 0, r.output
    assert "grad layers.0.weight" in r.output and "param_update" in r.output
    assert "check: 2 step(s) passed" in r.output


def test_check_command_rejects_a_microbatch_mismatch(tmp_path):
    doc = tmp_path / "mlp.latch.json"
    r = CliRunner().invoke(main, ["capture", str(MLP), "-o", str(doc), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["check", str(MLP), "-d", str(doc), "--microbatches", "2"])
    assert r.exit_code == 2 and "captured with 1 microbatches" in r.output


def test_a_planted_error_fails_its_gate():
    """Change the AdamW epsilon in the captured graph: the param-update gate must fail."""
    ex = load_example(MLP)
    doc = ex.capture(grads=True)
    g = doc.graph.program("update")
    nodes = list(g.nodes)
    i = next(i for i, n in enumerate(nodes) if n.op == "latch::add" and n.attr("scalar") == 1e-8)
    attrs_ = dict(nodes[i].attrs)
    attrs_["scalar"] = 1e-3
    nodes[i] = Node(nodes[i].name, nodes[i].op, nodes[i].inputs, nodes[i].outputs, attrs_, nodes[i].source)
    bad = attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=(attrs.evolve(g, nodes=tuple(nodes)),)))
    result = compare(ex, document.loads(document.dumps(bad)), steps=1)
    assert not result.passed
    failed = {f.group for t in result.tables for f in t.failures()}
    assert "param_update" in failed and "loss" not in failed
    assert "FAIL" in result.format()
