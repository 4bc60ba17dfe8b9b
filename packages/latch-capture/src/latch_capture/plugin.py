"""latch-capture's registrations with Latch (entry point group latch.plugins): the ``capture``
pass (the first stage of latch_core.pipeline) and the ``capture`` command. Importing this module
imports no torch: the pass and the command import it when they run."""

from latch_core.hookspecs import hookimpl


@hookimpl
def latch_register_passes(register):
    from .passes import CAPTURE

    register(CAPTURE)


@hookimpl
def latch_register_commands(register):
    from .cli import capture_cmd

    register(capture_cmd)
