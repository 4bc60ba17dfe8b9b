"""latch_core.gcpause: the collector is paused inside, and its previous state comes back after
(also after an exception, and when it was already off)."""

from __future__ import annotations

import gc

import pytest

from latch_core.gcpause import gc_paused, paused_gc


@pytest.fixture
def restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_restored_after(restore_gc):
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested: stays off, and the inner exit does not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_exception_and_left_off_when_it_was_off(restore_gc):
    gc.enable()

    @gc_paused
    def boom():
        assert not gc.isenabled()
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        boom()
    assert gc.isenabled()
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()

