"""Hook specifications: the only contract between Latch and its plugins.

Every hook receives a ``register`` callback; a plugin calls it once per thing it provides. The host
validates what arrives and rejects duplicates naming both registrants. Built-in packages register
through exactly these hooks, found through the ``latch.plugins`` entry-point group.
"""

import pluggy

hookspec = pluggy.HookspecMarker("latch")
hookimpl = pluggy.HookimplMarker("latch")


@hookspec
def latch_register_ops(register):
    """Register op specs: ``register(spec: latch_core.registry.OpSpec)``."""


@hookspec
def latch_register_derivatives(register):
    """Register derivative rules for ops Latch owns: ``register(op_name: str, rule)``.

    ``rule`` is the object the capture stage uses to build the op's backward (for ops captured
    through torch.library, the autograd formula registered with the op)."""


@hookspec
def latch_register_lowerings(register):
    """Register op bodies for a backend: ``register(op_name: str, lowering)``.

    ``lowering`` is the backend's lowering object (for latch-codegen-h100: a
    ``latch_codegen_h100.lowering.Lowering``)."""


@hookspec
def latch_register_schedulers(register):
    """Register scheduling strategies: ``register(name: str, scheduler)``.

    ``scheduler(document, options) -> ScheduleSection``; chosen by ``--scheduler NAME`` or
    ``LATCH_SCHEDULER``."""


@hookspec
def latch_register_passes(register):
    """Register passes: ``register(pass_: latch_core.passes.Pass)``."""


@hookspec
def latch_register_commands(register):
    """Register ``latch-pipeline`` subcommands: ``register(command: click.Command)``."""


@hookspec
def latch_register_configs(register):
    """Register body configurations: ``register(op_name: str, fn)``, one function per op.

    ``fn(in_types, out_types, attrs) -> list[latch_core.configs.BodyConfig]`` lists the ways the
    backend's body for ``op_name`` can run one node (tile, K step, stage bytes, kind); the scheduler
    picks one with its cost model and records its name as the node's ``config`` attribute."""
