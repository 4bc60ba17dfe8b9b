"""Cross-package tests: make the helper module beside this file (``cross_helpers``) importable.

pytest runs with ``--import-mode=importlib`` (root pyproject.toml), which does not put test
directories on sys.path by itself; the packages' tests do the same in their own conftest.py. The
helper's name is unique across the monorepo so that one pytest session over every package cannot
confuse it with another package's helper."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
