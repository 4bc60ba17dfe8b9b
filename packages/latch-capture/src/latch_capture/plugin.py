"""latch-capture's registrations with Latch (entry point group latch.plugins): the ``capture`` command."""

from latch_core.hookspecs import hookimpl

from .cli import capture_cmd


@hookimpl
def latch_register_commands(register):
    register(capture_cmd)
