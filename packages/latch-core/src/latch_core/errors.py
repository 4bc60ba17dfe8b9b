"""Errors a user can cause, and how the CLI shows them.

``UserError`` is the base of every exception whose message is meant for the person running Latch
(a bad input file, an unsupported op, a hazard in a schedule, a failed build): the message names
the culprit and says what to do, so ``latch-pipeline`` prints it as one ``error: ...`` paragraph
with no Python traceback. ``latch-pipeline --debug ...`` (or ``LATCH_DEBUG=1``) shows the traceback
too, also for errors a command reported itself before exiting. Anything that is not a UserError
is a bug in Latch and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

_debug = False


class UserError(Exception):
    """An error the user can fix; its message says what is wrong and what to do."""


def set_debug(on: bool) -> None:
    global _debug
    _debug = bool(on)


def debugging() -> bool:
    return _debug or os.environ.get("LATCH_DEBUG", "") not in ("", "0")


def report(exc: BaseException) -> int:
    """Print ``exc`` for the user (with its traceback when debugging); the exit status to use."""
    if debugging():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"error: {exc}", file=sys.stderr)
    if not debugging():
        print("(run with latch-pipeline --debug to see where it came from)", file=sys.stderr)
    return 2


def show_context(exc: SystemExit) -> None:
    """A command that reported an error itself and exited: with --debug, the traceback of the
    exception it was handling (its ``__context__``)."""
    ctx = exc.__context__
    if debugging() and ctx is not None and not isinstance(ctx, SystemExit):
        traceback.print_exception(type(ctx), ctx, ctx.__traceback__, file=sys.stderr)
