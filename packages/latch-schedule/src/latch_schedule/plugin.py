"""latch-schedule's registrations with Latch (entry point group latch.plugins)."""

from latch_core.hookspecs import hookimpl  # noqa: F401
