"""Old major versions load through ``document._MIGRATIONS``; without a migration they are refused."""

import json

import pytest

from latch_core import document
from latch_core.document import SCHEMA_VERSION, Document, DocumentError, dumps, loads


def _as_old_major(doc: Document) -> str:
    obj = json.loads(dumps(doc))
    obj["schema_version"] = f"{SCHEMA_VERSION[0] - 1}.7"
    obj["legacy_section"] = {"renamed": True}  # something the current reader would refuse
    return json.dumps(obj)


def test_an_old_major_version_without_a_migration_is_refused():
    with pytest.raises(DocumentError, match=r"old\.json: field schema_version: major version"):
        loads(_as_old_major(Document()), source="old.json")


def test_an_old_major_version_loads_through_its_migration(monkeypatch):
    def upgrade(obj):
        obj = {k: v for k, v in obj.items() if k != "legacy_section"}
        obj["schema_version"] = f"{SCHEMA_VERSION[0]}.0"
        return obj

    monkeypatch.setitem(document._MIGRATIONS, SCHEMA_VERSION[0] - 1, upgrade)
    assert loads(_as_old_major(Document()), source="old.json") == Document()
