"""latch-ops's registrations with Latch (entry point ``ops`` of group latch.plugins).

Registers the core vocabulary and, when the module exists, the attention ops. The MoE ops have
their own entry point (``moe``), registered the way a third-party package would.
"""

from latch_core.hookspecs import hookimpl


@hookimpl
def latch_register_ops(register):
    from .vocabulary import SPECS

    for spec in SPECS:
        register(spec)
    try:
        from . import attention
    except ModuleNotFoundError as e:
        if e.name != "latch_ops.attention":  # a missing dependency of attention.py is a real error
            raise
    else:
        for spec in attention.SPECS:
            register(spec)
