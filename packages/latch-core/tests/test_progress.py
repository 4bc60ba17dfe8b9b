"""Progress bars (latch_core.progress) are drawn only on a terminal, never with -q / set_quiet or
LATCH_PROGRESS=0; when off, every call is a no-op."""

import io
import sys

from latch_core import progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_bars_only_on_a_terminal_and_never_when_quiet(monkeypatch):
    monkeypatch.delenv("LATCH_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.enabled()  # a pipe, a log, CI
    monkeypatch.setattr(sys, "stderr", Tty())
    assert progress.enabled()
    progress.set_quiet(True)
    try:
        assert not progress.enabled()
    finally:
        progress.set_quiet(False)
    monkeypatch.setenv("LATCH_PROGRESS", "0")
    assert not progress.enabled()


def test_an_off_bar_does_nothing(monkeypatch):
    monkeypatch.setenv("LATCH_PROGRESS", "0")
    with progress.task("work", total=3) as t:
        assert not t.drawn
        t.update(completed=1, total=3, note="x")
        t.advance()


def test_a_drawn_bar_counts(monkeypatch):
    import pytest

    pytest.importorskip("rich")
    monkeypatch.setenv("LATCH_PROGRESS", "1")
    monkeypatch.setattr(sys, "stderr", Tty())
    with progress.task("work", total=4) as t:
        assert t.drawn
        t.update(completed=2, note="half")
        t.advance()
        task = t._bar.tasks[0]
        assert task.completed == 3 and task.total == 4 and task.fields["note"] == "half"
