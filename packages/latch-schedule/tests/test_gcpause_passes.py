"""The schedule passes pause the cyclic collector (latch_core.gcpause) and leave it as they found it."""

import gc

import pytest


@pytest.fixture
def restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_passes_leave_the_collector_as_they_found_it(restore_gc):
    from latch_core.document import Document
    from latch_schedule.validate import validate

    gc.enable()
    assert validate(Document()) == ["the document needs graph and schedule sections to be validated"]
    assert gc.isenabled()
