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


# ------------------------------------------------------------------------------------------------
# The schema itself, as data (torch.export's habit: a checker classifies schema changes).

SCHEMAS = sorted(GOLDEN.glob("schema.v*_*.json"))


def _schema_version(path):
    m = re.match(r"^schema\.v(\d+)_(\d+)\.json$", path.name)
    assert m, f"{path.name}: schema files are named schema.vMAJOR_MINOR.json"
    return int(m[1]), int(m[2])


def test_schema_of_the_current_version_is_frozen():
    path = core_golden.schema_path()
    assert path.exists(), f"{path.name} missing: run `python {core_golden.__file__} --write` after a version bump"
    stored = json.loads(path.read_text())
    current = core_golden.schema()
    changed = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
    assert not changed, (
        f"the document schema changed ({', '.join(changed)}) but SCHEMA_VERSION is still {SCHEMA_VERSION}: "
        "bump the minor version for added fields with defaults, the major version for anything else, "
        "then run core_golden.py --write"
    )


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.name)
def test_changes_within_a_major_version_are_additive(path):
    version = _schema_version(path)
    if version[0] != SCHEMA_VERSION[0]:
        return  # an older major: its documents load through a migration, not by compatibility
    old, new = json.loads(path.read_text()), core_golden.schema()
    problems = []
    for record, fields in old.items():
        if record not in new:
            problems.append(f"{record}: removed")
            continue
        now = {f[0]: f for f in new[record]}
        for name, tp, required in fields:
            if name not in now:
                problems.append(f"{record}.{name}: removed")
            elif now[name][1] != tp:
                problems.append(f"{record}.{name}: type {tp} -> {now[name][1]}")
        was = {f[0] for f in fields}
        problems += [f"{record}.{f[0]}: added without a default" for f in new[record] if f[0] not in was and f[2]]
    assert not problems, f"breaking changes since {path.name} need a MAJOR version bump: " + "; ".join(problems)
