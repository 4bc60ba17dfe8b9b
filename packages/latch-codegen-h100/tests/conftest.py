"""Test helpers of latch-codegen-h100 live next to the tests (h100_handmade, h100_catalogue)."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh build cache (LATCH_CACHE_DIR) for one test."""
    d = tmp_path / "cache"
    monkeypatch.setenv("LATCH_CACHE_DIR", str(d))
    return d
