"""latch-check's registrations with Latch (entry point group latch.plugins).

Commands: ``check`` (captured program vs eager PyTorch, FP64; latch_check.compare).
"""

from latch_core.hookspecs import hookimpl

from .compare import check_command


@hookimpl
def latch_register_commands(register):
    register(check_command)
