"""The `moe` entry point (group ``latch.plugins``): registers the MoE op specs exactly as a
third-party package would, through the ``latch_register_ops`` hook. Each differentiable op's
derivative is the autograd formula registered with its torch custom op (``torch_ops``), which
capture traces through. Importing this module never imports torch."""

from latch_core.hookspecs import hookimpl


@hookimpl
def latch_register_ops(register):
    from .specs import SPECS

    for spec in SPECS:
        register(spec)
