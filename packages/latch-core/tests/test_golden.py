"""Golden files: the format is frozen per schema version, and old files load forever."""

import json
import re

import pytest

import core_golden
from core_ops import CoreTestOps
from latch_core import plugins
from latch_core.document import SCHEMA_VERSION, DocumentError, load
from latch_core.lint import lint_section

GOLDEN = core_golden.GOLDEN
VERSIONED = sorted(GOLDEN.glob("*.v*_*.latch.json"))
CORRUPT = sorted(GOLDEN.glob("corrupt_*.latch.json"))
NAME_RE = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<major>\d+)_(?P<minor>\d+)\.latch\.json$")


def _parse(path):
    m = NAME_RE.match(path.name)
    assert m, f"{path.name}: golden files are named NAME.vMAJOR_MINOR.latch.json (or corrupt_*.latch.json)"
    return m["name"], (int(m["major"]), int(m["minor"]))


def test_every_golden_file_is_versioned_or_deliberately_corrupt():
    for p in GOLDEN.glob("*.latch.json"):
        if not p.name.startswith("corrupt_"):
            _parse(p)
    assert VERSIONED and CORRUPT


@pytest.mark.parametrize("name", sorted(core_golden.BUILDERS))
def test_current_version_file_exists_and_matches_the_encoder_byte_for_byte(name):
    # A change to the encoding without a schema bump fails here. After a deliberate bump, run
    # core_golden.py --write: it adds files for the new version and keeps the old ones.
    path = core_golden.golden_path(name)
    assert path.exists(), (
        f"{path.name} missing: schema is {SCHEMA_VERSION}; run `python {core_golden.__file__} --write` "
        "to add golden files for this version"
    )
    assert path.read_text() == core_golden.encoded(name)
    assert load(path) == core_golden.BUILDERS[name]()


@pytest.mark.parametrize("path", VERSIONED, ids=lambda p: p.name)
def test_every_golden_file_of_a_supported_major_version_still_loads(path):
    name, version = _parse(path)
    stored = json.loads(path.read_text())
    assert stored["schema_version"] == f"{version[0]}.{version[1]}", f"{path.name}: file name and content disagree"
    if version[0] != SCHEMA_VERSION[0]:
        pytest.fail(f"{path.name}: major version {version[0]} no longer loads; add a migration, never delete goldens")
    doc = load(path)
    assert doc.graph is not None


@pytest.mark.parametrize("path", VERSIONED, ids=lambda p: p.name)
def test_golden_graphs_lint_clean_against_their_ops(path):
    regs = plugins.load_with(("core-test-ops", CoreTestOps()), entry_points=False)
    assert lint_section(load(path).graph, regs.ops) == []


@pytest.mark.parametrize("name", core_golden.SHOWN)
def test_text_form_matches_its_golden(name):
    assert core_golden.shown(name) == (GOLDEN / f"{name}.show.txt").read_text()


@pytest.mark.parametrize("path,field", [
    ("corrupt_node_op.latch.json", "field graph.programs[0].nodes[1].op: expected a string, got 42"),
    ("corrupt_dtype.latch.json", "field graph.programs[0].values[2].dtype: Value.dtype: unknown dtype 'float99'"),
    ("corrupt_major_version.latch.json", "field schema_version: major version 2 is not supported"),
])
def test_corrupt_golden_files_fail_naming_file_and_field(path, field):
    with pytest.raises(DocumentError) as e:
        load(GOLDEN / path)
    msg = str(e.value)
    assert msg.startswith(str(GOLDEN / path) + ": ")
    assert field in msg
