"""Test helpers of latch-codegen-h100 live next to the tests (h100_handmade, h100_catalogue)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
