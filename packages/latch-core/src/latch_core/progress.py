"""Progress for long work (capture, the nvcc build, simulation, multi-step runs): rich bars on a
terminal, nothing otherwise.

    with progress.task("build", total=None) as t:   # total None: a spinner until the first total
        t.update(completed=3, total=12, note="nvcc unit_2.cu")
        t.note("linking")

Bars are drawn on stderr only when it is a terminal and progress is not switched off
(``latch-pipeline -q``, :func:`set_quiet`, or ``LATCH_PROGRESS=0``); in a pipe, a log or CI nothing
is drawn, and the commands' own one-line summaries are the record. rich is imported only when a bar
is drawn; without rich installed the bars are silently absent (the work is the same).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

_QUIET = False


def set_quiet(quiet: bool = True) -> None:
    global _QUIET
    _QUIET = bool(quiet)


def quiet() -> bool:
    return _QUIET


def enabled() -> bool:
    if _QUIET or os.environ.get("LATCH_PROGRESS", "").strip() in ("0", "false", "no"):
        return False
    if os.environ.get("LATCH_PROGRESS", "").strip() in ("1", "true", "yes"):
        return True
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


class Task:
    """One line of progress; every method is a no-op when bars are off."""

    def __init__(self, bar=None, task_id=None):
        self._bar, self._id = bar, task_id

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def update(self, *, completed: float | None = None, total: float | None = None, advance: float | None = None,
               note: str | None = None) -> None:
        if self._bar is None:
            return
        kw = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if advance is not None:
            kw["advance"] = advance
        if note is not None:
            kw["note"] = note
        self._bar.update(self._id, **kw)

    def note(self, text: str) -> None:
        self.update(note=text)

    def advance(self, n: float = 1) -> None:
        self.update(advance=n)


@contextlib.contextmanager
def task(description: str, total: float | None = None) -> Iterator[Task]:
    """A progress line for the duration of the block (see the module docstring)."""
    if not enabled():
        yield Task()
        return
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    except ImportError:  # rich is a declared dependency; a broken install only loses the bars
        yield Task()
        return
    bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                   console=Console(stderr=True), transient=True)
    with bar:
        yield Task(bar, bar.add_task(description, total=total, note=""))
