"""The document codec: versioning rules and error messages that name the file and the field."""

import json

import pytest

import core_golden
from latch_core.document import SCHEMA_VERSION, Document, DocumentError, dumps, load, loads, program_doc, save


def _small_obj():
    return json.loads(dumps(core_golden.small_graph()))


def _load_obj(obj, source="t.latch.json"):
    return loads(json.dumps(obj), source=source)


def _error(obj) -> str:
    with pytest.raises(DocumentError) as e:
        _load_obj(obj)
    return str(e.value)


def test_header_carries_format_and_version():
    obj = _small_obj()
    assert obj["format"] == "latch"
    assert obj["schema_version"] == f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}"
    assert set(obj) == {"format", "schema_version", "graph", "schedule", "memory", "build", "provenance"}


def test_a_newer_minor_version_loads_an_unknown_major_does_not():
    obj = _small_obj()
    obj["schema_version"] = f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1] + 7}"
    assert _load_obj(obj) == core_golden.small_graph()
    obj["schema_version"] = f"{SCHEMA_VERSION[0] + 1}.0"
    msg = _error(obj)
    assert msg.startswith("t.latch.json: field schema_version: major version")
    assert "regenerate" in msg


@pytest.mark.parametrize("version", [None, 1, "1", "1.0.0", "v1.0", "a.b"])
def test_malformed_versions_name_the_field(version):
    obj = _small_obj()
    obj["schema_version"] = version
    assert "field schema_version: expected 'MAJOR.MINOR'" in _error(obj)


def test_not_a_latch_document():
    assert "field format: expected 'latch'" in _error({"format": "onnx", "schema_version": "1.0"})
    assert "a Latch document is a JSON object" in _error([1, 2])


def test_invalid_json_names_file_line_and_column():
    with pytest.raises(DocumentError, match=r"^x\.latch\.json: not valid JSON at line 2 column"):
        loads('{"format": "latch",\n  oops}', source="x.latch.json")


def test_unreadable_file_names_it(tmp_path):
    with pytest.raises(DocumentError, match="nope.latch.json: cannot read"):
        load(tmp_path / "nope.latch.json")


@pytest.mark.parametrize("mutate,expected", [
    (lambda o: o["graph"]["programs"][0]["nodes"][1].pop("op"),
     "field graph.programs[0].nodes[1].op: missing (required by Node)"),
    (lambda o: o["graph"]["programs"][0]["nodes"][3].__setitem__("colour", "red"),
     "field graph.programs[0].nodes[3].colour: unknown field for Node"),
    (lambda o: o["graph"]["programs"][0]["nodes"][1].__setitem__("op", "add"),
     "field graph.programs[0].nodes[1].op: node 'n1': op name 'add' must be namespaced"),
    (lambda o: o["graph"]["programs"][0]["values"][0].__setitem__("shape", [4, -1]),
     "field graph.programs[0].values[0].shape: Value.shape: shape (4, -1) has a non-static or negative"),
    (lambda o: o["graph"]["programs"][0]["values"][0].__setitem__("shape", [4, 2.5]),
     "field graph.programs[0].values[0].shape[1]: expected an integer, got 2.5"),
    (lambda o: o["graph"]["programs"][0]["values"][0].__setitem__("shape", [True]),
     "field graph.programs[0].values[0].shape[0]: expected an integer, got True"),
    (lambda o: o["graph"]["programs"][0]["values"][1].__setitem__("role", "weights"),
     "field graph.programs[0].values[1].role: value 'b': unknown role 'weights'"),
    (lambda o: o["graph"]["programs"][0].__setitem__("inplace", [["new_w"]]),
     "field graph.programs[0].inplace[0]: expected 2 items, got 1"),
    (lambda o: o["graph"].__setitem__("programs", {"update": 1}),
     "field graph.programs: expected a list, got dict"),
    (lambda o: o["provenance"][0].__setitem__("seconds", "fast"),
     "field provenance[0].seconds: expected a number, got 'fast'"),
    (lambda o: o["graph"]["programs"][0]["nodes"][6]["attrs"][0].__setitem__(1, {"$float": "huge"}),
     "field graph.programs[0].nodes[6].attrs[0][1]: {'$float': ...} holds one of ['inf', '-inf', 'nan']"),
    (lambda o: o.__setitem__("graph", 3),
     "field graph: expected an object for GraphSection, got int 3"),
    (lambda o: o.__setitem__("extra_section", {}),
     "field extra_section: unknown field for Document"),
])
def test_malformed_fields_are_reported_with_their_json_path(mutate, expected):
    obj = _small_obj()
    mutate(obj)
    msg = _error(obj)
    assert msg.startswith("t.latch.json: ")
    assert expected in msg


def test_sections_and_defaults():
    assert Document().sections() == set()
    doc = core_golden.scheduled()
    assert doc.sections() == {"graph", "schedule", "memory", "build"}
    # omitted optional fields take their defaults (how minor versions stay readable)
    obj = json.loads(dumps(program_doc(core_golden.small_graph().graph.programs[0])))
    for key in ("schedule", "memory", "build", "provenance"):
        del obj[key]
    del obj["graph"]["layout"], obj["graph"]["metadata"]
    assert _load_obj(obj) == program_doc(core_golden.small_graph().graph.programs[0])


def test_save_and_load(tmp_path):
    doc = core_golden.scheduled()
    save(doc, tmp_path / "a.latch.json")
    save(doc, tmp_path / "b.latch.json", indent=2)
    assert load(tmp_path / "a.latch.json") == doc == load(tmp_path / "b.latch.json")
    assert "\n" not in (tmp_path / "a.latch.json").read_text()
