"""latch-memory's registrations with Latch (entry point group latch.plugins): the passes
``memory.policy``, ``memory.weight_copies``, ``memory.remat``, ``memory.plan`` and the ``plan`` command."""

from __future__ import annotations


import click

from latch_core.hookspecs import hookimpl
from latch_core.passes import Pass

DEFAULT_ALIGNMENT = 256  # = latch_memory.plan.DEFAULT_ALIGNMENT (a test keeps them equal)


def plan(doc, **options):
    from .plan import plan as _plan

    return _plan(doc, **options)


def policy_pass(doc, **options):
    from .policy import policy_pass as _policy

    return _policy(doc, **options)


def fuse_cross_entropy_pass(doc, **options):
    from .cross_entropy import fuse_pass

    return fuse_pass(doc, **options)


def weight_copies_pass(doc, **options):
    from .weight_copies import weight_copies_pass as _copies

    return _copies(doc, **options)


def remat_pass(doc, **options):
    from .remat import remat_pass as _remat

    return _remat(doc, **options)


POLICY = Pass(
    "memory.policy", policy_pass, requires={"graph"}, ensures={"graph"},
    doc="numerical policy: operand_dtype/accum_dtype per op class (options: table, ops, nodes, master)",
)
FUSE_CROSS_ENTROPY = Pass(
    "memory.fuse_cross_entropy", fuse_cross_entropy_pass, requires={"graph"}, ensures={"graph"},
    doc="LM head: log_softmax/nll_loss and their backward become cross_entropy(_backward) over logits stored BF16",
)
WEIGHT_COPIES = Pass(
    "memory.weight_copies", weight_copies_pass, requires={"graph"}, ensures={"graph"},
    doc="each weight's BF16 copy as optimizer state: the forward's casts of parameters read it, the update writes it",
)
REMAT = Pass(
    "memory.remat", remat_pass, requires={"graph"}, ensures={"graph"},
    doc="recompute cheap forward values in the backward under budget_bytes; peaks in graph metadata",
)
PLAN = Pass(
    "memory.plan", plan, requires={"graph", "schedule"}, ensures={"memory"},
    doc="liveness over the schedule, in-place updates, best-fit arena offsets (option: alignment)",
)


@hookimpl
def latch_register_passes(register):
    register(POLICY)
    register(FUSE_CROSS_ENTROPY)
    register(WEIGHT_COPIES)
    register(REMAT)
    register(PLAN)


def _summary(doc) -> list[str]:
    m = doc.memory
    lines = [f"memory plan: arena {m.arena_bytes} bytes (alignment {m.alignment}), "
             f"constants {dict(m.stats).get('constant_bytes', 0)} bytes"]
    per = dict(dict(m.stats).get("programs", ()))
    for pm in m.programs:
        st = dict(per.get(pm.program, ()))
        ratio = pm.arena_bytes / pm.peak_live_bytes if pm.peak_live_bytes else 1.0
        lines.append(f"  {pm.program}: arena {pm.arena_bytes} bytes vs. peak live {pm.peak_live_bytes} bytes "
                     f"({ratio:.3f}x), {st.get('arena_values', 0)} arena values, in place {len(st.get('inplace', ()))}, "
                     f"copy back {len(st.get('copy_back', ()))}")
        for new, reason in st.get("copy_back_reasons", ()):
            lines.append(f"    {new}: copied back after the launch: {reason}")
    return lines


@click.command("plan")
@click.option("-i", "--input", "inp", required=True, type=click.Path(dir_okay=False), help="document with graph + schedule")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="document to write (adds memory)")
@click.option("--alignment", default=DEFAULT_ALIGNMENT, show_default=True, help="arena offset alignment in bytes")
def plan_cmd(inp, out, alignment):
    """Plan memory: liveness over the schedule, in-place updates, arena offsets."""
    from latch_core.cli import transform_file

    transform_file(inp, out, [(PLAN, {"alignment": alignment})], _summary)


@hookimpl
def latch_register_commands(register):
    register(plan_cmd)
