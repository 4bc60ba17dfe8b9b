"""latch-schedule tests: shared fixtures.

Unit tests run on hand-built graphs over the test ops of ``latch_schedule.testing`` (loaded
without entry points, so other packages' plugins cannot disturb them). Tests on captured examples
use the installed plugins and skip where torch or the capture stage is missing.
"""

from __future__ import annotations

import pytest

from latch_core.plugins import load_with
from latch_schedule import plugin as schedule_plugin
from latch_schedule import testing


@pytest.fixture(scope="session")
def regs():
    """Registries with the test ops and latch-schedule itself, no entry points."""
    return load_with(("sched_test_ops", testing.TestOps()), ("schedule", schedule_plugin), entry_points=False)


@pytest.fixture(scope="session")
def ops(regs):
    return regs.ops


@pytest.fixture
def fresh_registries():
    """Forget the process-wide registries before and after a test that changes what loads."""
    from latch_core import plugins

    plugins.reset()
    yield plugins
    plugins.reset()


import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test helpers beside the tests (conftest_examples)
from conftest_examples import captured, registries  # noqa: E402,F401
