"""Hook specifications: the only contract between Latch and its plugins.

Every hook receives a ``register`` callback; a plugin calls it once per thing it provides. The host
validates what arrives and rejects duplicates naming both registrants. Built-in packages register
through exactly these hooks, found through the ``latch.plugins`` entry-point group.

There is no hook for derivative rules: an op's derivative is the autograd formula registered with
its torch custom op (``torch.library.register_autograd``), and capture traces the backward through
torch's autograd, so the formula torch runs eagerly is the one Latch captures.

Plugin modules are imported whenever any registry is used (``latch-pipeline --help`` included):
they must not import torch, or anything slow, at module level; import heavy code inside the hook
functions or inside the registered objects' bodies.
"""

import pluggy

hookspec = pluggy.HookspecMarker("latch")
hookimpl = pluggy.HookimplMarker("latch")


@hookspec
def latch_register_ops(register):
    """Register op specs: ``register(spec: latch_core.registry.OpSpec)``."""


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
