"""latch-core tests: make the helper modules beside this file importable.

The helpers (``core_golden``, ``core_strategies``, ``core_ops``) have names unique across the
monorepo so that one pytest session over every package cannot confuse them with another package's.
pytest runs with ``--import-mode=importlib`` (root pyproject.toml), which does not put test
directories on sys.path by itself.
"""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def fresh_registries(monkeypatch):
    """Forget the process-wide registries before and after a test that changes what loads."""
    from latch_core import plugins

    plugins.reset()
    yield plugins
    plugins.reset()
