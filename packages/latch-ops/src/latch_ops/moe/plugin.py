"""The `moe` entry point (group ``latch.plugins``): registers the MoE op specs exactly as a
third-party package would, through the ``latch_register_ops`` hook, and the pass
``moe.store_operands`` (BF16 operands of the ragged products, ``policy``) through
``latch_register_passes``. Each differentiable op's derivative is the autograd formula registered
with its torch custom op (``torch_ops``), which capture traces through. Importing this module
never imports torch."""

from latch_core.hookspecs import hookimpl
from latch_core.passes import Pass


def _store_operands(doc, **options):
    from .policy import store_operands_pass

    return store_operands_pass(doc, **options)


STORE_OPERANDS = Pass(
    "moe.store_operands", _store_operands, requires={"graph"}, ensures={"graph"},
    doc="graph rewrite: BF16/F16 operands of the ragged products stored (casts), FP32 results (out_dtype)",
)


@hookimpl
def latch_register_ops(register):
    from .specs import SPECS

    for spec in SPECS:
        register(spec)


@hookimpl
def latch_register_passes(register):
    register(STORE_OPERANDS)
