"""The `moe` entry point (group ``latch.plugins``): registers the MoE op specs exactly as a third-party
package would, through the ``latch_register_ops`` hook. Importing it never imports torch."""

from latch_core.hookspecs import hookimpl

from .specs import SPECS


@hookimpl
def latch_register_ops(register):
    for spec in SPECS:
        register(spec)
