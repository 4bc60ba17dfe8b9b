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


def _embedding_grad_sum(doc, **options):
    from .embedding_grad import embedding_grad_sum_pass

    return embedding_grad_sum_pass(doc, **options)


@hookimpl
def latch_register_passes(register):
    from latch_core.passes import Pass

    register(Pass("ops.embedding_grad_sum", _embedding_grad_sum, requires={"graph"}, ensures={"graph"},
                  doc="graph rewrite: a tied embedding's two gradients summed by the embedding backward itself"))
