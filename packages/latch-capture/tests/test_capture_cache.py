"""The capture pass and its cache (latch_capture.cache): an unchanged example is read back, and
any change to what capture reads (the example, a local file it imports, the overrides, the
options) captures again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from latch_core.document import Document
from latch_core.passes import run_pass
from latch_capture.errors import CaptureError
from latch_capture.passes import CAPTURE

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def example(tmp_path, monkeypatch):
    monkeypatch.setenv("LATCH_CAPTURE_CACHE", str(tmp_path / "cache"))
    # each test's copy of the helper must be the one imported (a module stays in sys.modules)
    import sys

    monkeypatch.delitem(sys.modules, "_optim", raising=False)
    d = tmp_path / "ex"
    d.mkdir()
    shutil.copy(ROOT / "examples" / "mlp.py", d / "mlp.py")
    shutil.copy(ROOT / "examples" / "_optim.py", d / "_optim.py")
    return d / "mlp.py"


def capture(path, **options):
    doc = run_pass(CAPTURE, Document(), example=str(path), **options)
    return doc, doc.provenance[-1].detail


def test_an_unchanged_example_is_read_back_and_equal(example):
    first, d1 = capture(example)
    again, d2 = capture(example)
    assert not d1.startswith("cached") and d2.startswith("cached")
    assert again.graph == first.graph
    assert [p.name for p in again.provenance] == ["capture"]


def test_changes_to_what_capture_reads_capture_again(example):
    capture(example)
    assert not capture(example, overrides={"hidden": 32})[1].startswith("cached")  # another override
    assert capture(example, overrides={"hidden": 32})[1].startswith("cached")
    assert not capture(example, grads=False)[1].startswith("cached")  # another option
    helper = example.parent / "_optim.py"
    helper.write_text(helper.read_text() + "\n# an edit\n")  # a local file the example imports
    assert not capture(example)[1].startswith("cached")
    example.write_text(example.read_text() + "\n# an edit\n")  # the example itself
    assert not capture(example)[1].startswith("cached")
    assert not capture(example, cache=False)[1].startswith("cached")


def test_the_pass_names_what_is_wrong(example, tmp_path):
    with pytest.raises(CaptureError, match="does not exist"):
        capture(tmp_path / "nope.py")
    doc, _ = capture(example)
    with pytest.raises(CaptureError, match="already has a graph section"):
        run_pass(CAPTURE, doc, example=str(example))
    with pytest.raises(CaptureError, match="needs the option example=PATH"):
        run_pass(CAPTURE, Document())
