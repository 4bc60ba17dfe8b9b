"""The two-weight example: y = w2 * (w1 * x), loss 1/2 (y - t)^2, SGD lr 0.1 -> the exact numbers."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from latch_capture import advance, bind_inputs, load_example, program_inputs
from latch_check.reference import run
from latch_core import document
from latch_core.cli import main
from latch_core.lint import lint_section
from latch_core.plugins import registries

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def examples_dir():
    return EXAMPLES


@pytest.fixture(scope="module")
def ops():
    return registries().ops


@pytest.fixture(scope="module")
def example(examples_dir):
    return load_example(examples_dir / "two_weight.py")


@pytest.fixture(scope="module")
def doc(example):
    return example.capture(grads=True)


def _steps(doc, example, n):
    g = doc.graph.program("update")
    flat = bind_inputs(doc, params=example.params(), state=example.initial_state(),
                       inputs=example.inputs, targets=example.targets)
    outs = []
    for _ in range(n):
        out = run(doc, "update", program_inputs(g, flat))
        outs.append({k: v.item() for k, v in out.items()})
        flat = advance(g, flat, out)
    return outs


def test_exact_numbers(doc, example):
    first, second = _steps(doc, example, 2)
    assert first["loss"] == 0.125
    assert first["grad.w1"] == 1.5 and first["grad.w2"] == 0.5
    assert first["new.w1"] == pytest.approx(0.35, abs=1e-15)
    assert first["new.w2"] == pytest.approx(1.45, abs=1e-15)
    # next step: y = 1.45 * 0.35 * 2 = 1.015, loss = 0.5 * 0.015^2
    assert second["loss"] == pytest.approx(0.0001125, abs=1e-15)


def test_float64_capture_gives_the_same_numbers(examples_dir):
    ex = load_example(examples_dir / "two_weight.py", dtype="float64")
    doc = ex.capture()
    first, second = _steps(doc, ex, 2)
    assert first["new.w1"] == pytest.approx(0.35, abs=1e-15)
    assert second["loss"] == pytest.approx(0.0001125, abs=1e-15)


def test_graph_is_clean_and_attributed(doc, ops):
    assert lint_section(doc.graph, ops, require_known_ops=True) == []
    g = doc.graph.program("update")
    assert [grp.name for grp in g.inputs] == ["params", "batch", "hyper"]
    assert [grp.name for grp in g.outputs] == ["new_params", "loss", "grads"]
    assert dict(g.inplace) == {"new.w1": "w1", "new.w2": "w2"}
    assert {v.name: v.role for v in doc.graph.layout} == {"w1": "param", "w2": "param"}
    # no detach/alias nodes survive: forward 2 muls, loss 3 ops, backward, SGD 4 ops
    assert all(n.op.startswith("latch::") for n in g.nodes)
    assert len(g.nodes) <= 18
    sources = {n.source for n in g.nodes}
    assert any(s and "two_weight.py" in s and "in forward" in s for s in sources)
    assert any(s and "two_weight.py" in s and "in objective" in s for s in sources)
    assert any(s and "_optim.py" in s for s in sources)
    assert dict(doc.graph.metadata)["hyper"] == (("lr", 0.1),)


def test_document_round_trips(doc):
    assert document.loads(document.dumps(doc)) == doc


def test_capture_command(examples_dir, tmp_path):
    out = tmp_path / "tw.latch.json"
    r = CliRunner().invoke(main, ["capture", str(examples_dir / "two_weight.py"), "-o", str(out), "-q",
                                  "show", str(out)])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "latch::mul" in r.output
    doc = document.load(out)
    assert doc.graph.program("update").output_names()[:2] == ["new.w1", "new.w2"]


def test_capture_command_reports_errors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def nothing():\n    pass\n")
    r = CliRunner().invoke(main, ["capture", str(bad), "-o", str(tmp_path / "x.json"), "-q"])
    assert r.exit_code == 1
    assert "has no build() function" in r.output
