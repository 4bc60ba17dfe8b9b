"""The serialized document: versioned JSON with one section per stage.

    {"format": "latch", "schema_version": "1.0",
     "graph": {...}, "schedule": {...} | null, "memory": {...} | null, "build": {...} | null,
     "provenance": [{"name": ..., "started": ..., "seconds": ...}, ...]}

Versioning: bump the MINOR version for additive, backward-compatible changes (a new optional field
with a default); bump the MAJOR version for anything an older reader would misread, and keep the old
golden files under ``tests/golden/`` loading (migrate them in ``_MIGRATIONS``). A reader refuses an
unknown major version.

The codec is driven by the attrs records' type hints, so every record in ``ir`` and ``sections``
round-trips without hand-written code, and a malformed file is reported with the JSON path of the
field at fault (``graph.programs[0].nodes[3].op``) and the file's name.
"""

from __future__ import annotations

import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Union

import attrs

from .ir import Graph, GraphSection, IRError, canonical_float
from .sections import BuildSection, MemorySection, ScheduleSection
from .errors import UserError

SCHEMA_VERSION = (1, 0)  # (major, minor); see the module docstring for when to bump which
FORMAT = "latch"


class DocumentError(UserError, ValueError):
    """A document that cannot be read: names the file and the field at fault."""


@attrs.frozen
class Provenance:
    name: str
    started: str  # ISO-8601 UTC
    seconds: float
    detail: str = ""


@attrs.frozen
class Document:
    graph: GraphSection | None = None
    schedule: ScheduleSection | None = None
    memory: MemorySection | None = None
    build: BuildSection | None = None
    provenance: tuple[Provenance, ...] = attrs.field(factory=tuple, converter=tuple)

    def sections(self) -> set[str]:
        return {s for s in ("graph", "schedule", "memory", "build") if getattr(self, s) is not None}


# --------------------------------------------------------------------------------------------
# Generic encode / decode over attrs records

_FIELDS: dict[type, tuple[str, ...] | None] = {}  # per class: its init fields, None for non-records


def _record_fields(cls: type) -> tuple[str, ...] | None:
    try:
        return _FIELDS[cls]
    except KeyError:
        names = tuple(f.name for f in attrs.fields(cls) if f.init) if attrs.has(cls) else None
        _FIELDS[cls] = names
        return names


def encode(obj: Any) -> Any:
    """The JSON-ready form of any document record (what :func:`dumps` writes for it)."""
    return _encode(obj)


def _encode(obj: Any) -> Any:
    # Hot path (a TinyMoE-200M schedule has millions of small records and tuples): scalars first,
    # then tuples, then records, with the per-class field list looked up once.
    cls = type(obj)
    if cls is int or cls is str or cls is bool or obj is None:
        return obj
    if cls is tuple:
        return [_encode(x) for x in obj]
    if cls is float:
        return obj if math.isfinite(obj) else {"$float": repr(obj)}  # JSON has no inf/nan: keep them exact
    names = _record_fields(cls)
    if names is not None:
        return {n: _encode(getattr(obj, n)) for n in names}
    if isinstance(obj, tuple):
        return [_encode(x) for x in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"$float": repr(obj)}
    return obj


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _fail(path: str, msg: str):
    raise DocumentError(f"field {path}: {msg}")


def _decode(tp: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return _decode_any(data, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _decode(non_none[0], data, path)
        errors = []
        for a in non_none:
            try:
                return _decode(a, data, path)
            except DocumentError as e:
                errors.append(str(e))
        _fail(path, "; ".join(errors) if errors else f"expected one of {args}, got {data!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            _fail(path, f"expected a list, got {type(data).__name__} {_short(data)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], x, f"{path}[{i}]") for i, x in enumerate(data))
        if len(args) != len(data):
            _fail(path, f"expected {len(args)} items, got {len(data)}")
        return tuple(_decode(a, x, f"{path}[{i}]") for i, (a, x) in enumerate(zip(args, data)))
    if origin is dict:
        if not isinstance(data, dict):
            _fail(path, f"expected an object, got {type(data).__name__}")
        return data
    if isinstance(tp, type) and attrs.has(tp):
        return _decode_record(tp, data, path)
    if tp is float:
        if isinstance(data, dict) and set(data) == {"$float"}:
            return _special_float(data["$float"], path)
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            _fail(path, f"expected a number, got {_short(data)}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            _fail(path, f"expected an integer, got {_short(data)}")
        return data
    if tp is str:
        if not isinstance(data, str):
            _fail(path, f"expected a string, got {_short(data)}")
        return data
    if tp is bool:
        if not isinstance(data, bool):
            _fail(path, f"expected true/false, got {_short(data)}")
        return data
    if tp is tuple:  # bare tuple: free-form JSON data
        return _decode_any(data, path)
    raise TypeError(f"codec has no rule for type {tp!r} at {path}")


def _decode_any(data: Any, path: str) -> Any:
    if isinstance(data, list):
        return tuple(_decode_any(x, f"{path}[{i}]") for i, x in enumerate(data))
    if isinstance(data, dict):
        if set(data) == {"$float"}:
            return _special_float(data["$float"], path)
        return tuple(sorted((k, _decode_any(v, f"{path}.{k}")) for k, v in data.items()))
    return data


_SPECIAL_FLOATS = ("inf", "-inf", "nan")


def _special_float(text: Any, path: str) -> float:
    """``{"$float": "inf"}``: the encoding of the floats JSON cannot hold."""
    if text not in _SPECIAL_FLOATS:
        _fail(path, f"{{'$float': ...}} holds one of {list(_SPECIAL_FLOATS)}, got {_short(text)}")
    return canonical_float(float(text))


def _decode_record(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        _fail(path, f"expected an object for {cls.__name__}, got {type(data).__name__} {_short(data)}")
    hints = _hints(cls)
    kwargs = {}
    known = set()
    for f in attrs.fields(cls):
        if not f.init:
            continue
        known.add(f.name)
        sub = f"{path}.{f.name}" if path else f.name
        if f.name not in data:
            if f.default is attrs.NOTHING:
                _fail(sub, f"missing (required by {cls.__name__})")
            continue
        kwargs[f.name] = _decode(hints[f.name], data[f.name], sub)
    extra = set(data) - known
    if extra:
        _fail(f"{path}.{sorted(extra)[0]}" if path else sorted(extra)[0], f"unknown field for {cls.__name__}")
    try:
        return cls(**kwargs)
    except (IRError, ValueError, TypeError) as e:
        field = getattr(e, "field", None)  # IRError names the attribute at fault
        where = path or cls.__name__
        _fail(f"{where}.{field}" if field else where, str(e))


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) < 60 else s[:57] + "..."


# --------------------------------------------------------------------------------------------
# Public API

def to_json_obj(doc: Document) -> dict:
    obj = {"format": FORMAT, "schema_version": f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}"}
    obj.update(_encode(doc))
    return obj


def dumps(doc: Document, *, indent: int | None = None) -> str:
    return json.dumps(to_json_obj(doc), indent=indent, allow_nan=False, separators=(",", ":") if indent is None else None)


def from_json_obj(obj: Any, *, source: str = "<document>") -> Document:
    try:
        if not isinstance(obj, dict):
            _fail("(top)", f"a Latch document is a JSON object, got {type(obj).__name__}")
        if obj.get("format") != FORMAT:
            _fail("format", f"expected {FORMAT!r}, got {obj.get('format')!r}: not a Latch document")
        version = obj.get("schema_version")
        if not isinstance(version, str) or not _parse_version(version):
            _fail("schema_version", f"expected 'MAJOR.MINOR', got {version!r}")
        major, minor = _parse_version(version)
        while major < SCHEMA_VERSION[0] and major in _MIGRATIONS:
            obj = _MIGRATIONS[major](obj)  # JSON of major version ``major`` -> JSON of ``major + 1``
            major += 1
        if major != SCHEMA_VERSION[0]:
            _fail(
                "schema_version",
                f"major version {major} is not supported by this Latch (reads {SCHEMA_VERSION[0]}.x); "
                "regenerate the document with this Latch or install the Latch that wrote it",
            )
        body = {k: v for k, v in obj.items() if k not in ("format", "schema_version")}
        return _decode_record(Document, body, "")
    except DocumentError as e:
        raise DocumentError(f"{source}: {e}") from None


def loads(text: str, *, source: str = "<string>") -> Document:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DocumentError(f"{source}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return from_json_obj(obj, source=source)


def load(path: str | Path) -> Document:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise DocumentError(f"{p}: cannot read: {e.strerror}") from None
    return loads(text, source=str(p))


def save(doc: Document, path: str | Path, *, indent: int | None = None) -> None:
    Path(path).write_text(dumps(doc, indent=indent))


# Old major version -> a function turning a JSON object of that version into one of the next major
# version. Empty while there has been only one major version; a major bump adds its entry here in
# the same commit, so the old golden files keep loading.
_MIGRATIONS: dict[int, Any] = {}


def _parse_version(v: str) -> tuple[int, int] | None:
    parts = v.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def program_doc(*graphs: Graph, layout=(), metadata=None) -> Document:
    """A document holding only a graph section (convenience for tests and capture)."""
    return Document(graph=GraphSection(programs=graphs, layout=layout, metadata=metadata or {}))
