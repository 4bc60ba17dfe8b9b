"""Repository-wide test setup (stdlib and pytest only: it is loaded in every isolation venv too).

Every test session gets its own empty capture cache (latch_capture.cache), so a test that captures
really captures, and nothing a session writes outlives it; subprocesses inherit it."""

import os
import shutil
import tempfile

_made = []


def pytest_configure(config):
    d = tempfile.mkdtemp(prefix="latch-test-capture-cache-")
    _made.append(d)
    os.environ["LATCH_CAPTURE_CACHE"] = d


def pytest_unconfigure(config):
    for d in _made:
        shutil.rmtree(d, ignore_errors=True)
