"""latch-ops tests: modules next to the tests import each other (the attention emulators' build
helper, test_attention_emulated.build_emulator)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
