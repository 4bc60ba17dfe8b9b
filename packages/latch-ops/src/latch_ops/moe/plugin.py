"""The `moe` entry point (group ``latch.plugins``): registers the MoE op specs exactly as a
third-party package would, through the ``latch_register_ops`` hook, and the passes
``moe.store_operands`` (BF16 operands of the ragged products, ``policy``), ``moe.route_split``
(``route_split``) and ``moe.fixed_order_scatters`` (``scatter``) through ``latch_register_passes``. Each differentiable op's derivative is the autograd formula registered
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


def _fixed_order_scatters(doc, **options):
    from .scatter import fixed_order_scatters_pass

    return fixed_order_scatters_pass(doc, **options)


def _route_split(doc, **options):
    from .route_split import route_split_pass

    return route_split_pass(doc, **options)


ROUTE_SPLIT = Pass(
    "moe.route_split", _route_split, requires={"graph"}, ensures={"graph"},
    doc="graph rewrite: route_order over many SMs (per-chunk counts, then place, rows and offsets side by side)",
)


FIXED_ORDER_SCATTERS = Pass(
    "moe.fixed_order_scatters", _fixed_order_scatters, requires={"graph"}, ensures={"graph"},
    doc="graph rewrite: index_add back to tokens by route_order's outputs as gathers summed in a fixed order",
)


@hookimpl
def latch_register_ops(register):
    from .gather_sum import SPECS as GATHER_SPECS
    from .route_split import SPECS as SPLIT_SPECS
    from .specs import SPECS

    for spec in SPECS + SPLIT_SPECS + GATHER_SPECS:
        register(spec)


@hookimpl
def latch_register_passes(register):
    register(STORE_OPERANDS)
    register(ROUTE_SPLIT)
    register(FIXED_ORDER_SCATTERS)
