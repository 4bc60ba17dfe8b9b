"""The `moe` entry point (group ``latch.plugins``): registers the MoE op specs and their derivative
rules exactly as a third-party package would, through the ``latch_register_ops`` and
``latch_register_derivatives`` hooks. Importing it never imports torch."""

from latch_core.hookspecs import hookimpl

from .specs import DERIVATIVES, SPECS


@hookimpl
def latch_register_ops(register):
    for spec in SPECS:
        register(spec)


@hookimpl
def latch_register_derivatives(register):
    for rule in DERIVATIVES:
        register(rule.op, rule)
