"""latch-codegen-h100's registrations with Latch (entry point group latch.plugins): the H100
lowerings of the core vocabulary, the body configurations of ``latch::matmul``
(:mod:`latch_codegen_h100.matmul_configs`), the ``build`` pass (the last stage of
latch_core.pipeline), and the ``build``, ``run`` and ``sass`` commands of ``latch-pipeline``. Importing this module imports neither
torch nor the lowerings: each hook imports what it registers."""

from __future__ import annotations

import sys
import time

import click

from latch_core.hookspecs import hookimpl
from latch_core.passes import Pass


def all_lowerings():
    from . import (
        lower_attention, lower_elementwise, lower_indexing, lower_matmul, lower_moe, lower_nn, lower_reduce,
        lower_views, lower_xent,
    )

    return (lower_elementwise.lowerings() + lower_reduce.lowerings() + lower_matmul.lowerings()
            + lower_views.lowerings() + lower_indexing.lowerings() + lower_nn.lowerings()
            + lower_attention.lowerings() + lower_moe.lowerings() + lower_xent.lowerings())


@hookimpl
def latch_register_lowerings(register):
    for low in all_lowerings():
        register(low.op, low)


def _build_pass(doc, directory=None, jobs=None, use_cache=True, profile=False, progress=None):
    """Lower every node to CUDA and compile (``builder.build``) into ``directory`` (default
    ``build/<example>-<strategy>``); nvcc missing is an error saying what to do."""
    from pathlib import Path

    from .builder import BuildError, build, find_nvcc

    try:
        find_nvcc()
    except BuildError as e:
        raise BuildError(f"{e}; or stop before the build pass (latch-pipeline compile --no-build)") from None
    if directory is None:
        name = doc.graph.meta("example", "") or "program"
        directory = Path("build") / f"{name}-{doc.schedule.strategy}"
    out = build(doc, directory, jobs=jobs, use_cache=use_cache, profile=profile)
    st = dict(out.build.stats)
    return out, (f"{directory} ({st.get('bodies', '?')} bodies, {len(out.build.units)} units, "
                 f"cached: {st.get('cached') or 'no'})")


BUILD = Pass("build", _build_pass, requires={"graph", "schedule", "memory"}, ensures={"build"},
             doc="lower every node to CUDA and compile with ninja/nvcc (options directory, jobs, use_cache, profile); "
                 "cached by request and by content")


@hookimpl
def latch_register_passes(register):
    register(BUILD)


@hookimpl
def latch_register_configs(register):
    from . import matmul_configs

    register("latch::matmul", matmul_configs.configs)


class _Interspersed(click.Command):
    """Options may follow the positional argument inside the chained ``latch-pipeline`` group
    (``run DIR --steps 3``); parsing stops at the next token naming a latch-pipeline command, so
    chaining keeps working."""

    def parse_args(self, ctx, args):
        parent = ctx.parent
        names = set(parent.command.list_commands(parent)) if parent is not None and isinstance(
            parent.command, click.Group) else set()
        cut = next((i for i, a in enumerate(args) if i > 0 and a in names), len(args))
        ctx.allow_interspersed_args = True
        rest = super().parse_args(ctx, list(args[:cut]))
        ctx.args = [*ctx.args, *args[cut:]]
        return rest


@click.command("build", cls=_Interspersed)
@click.option("-i", "--input", "inp", required=True, type=click.Path(dir_okay=False),
              help="planned document (graph + schedule + memory)")
@click.option("-d", "--dir", "out_dir", required=True, type=click.Path(file_okay=False), help="build directory")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False),
              help="also write the document with its build section here")
@click.option("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
@click.option("--no-cache", is_flag=True, help="compile even when a cached library matches")
@click.option("--no-validate", is_flag=True,
              help="build without the static hazard proof (debugging only; says so when it does)")
@click.option("--check-cuda", is_flag=True,
              help="only check that the generated CUDA is valid (nvcc -ptx: no ptxas, no program.so; "
                   "several times faster)")
def build_cmd(inp, out_dir, out, jobs, no_cache, no_validate, check_cuda):
    """Validate a planned document, generate its CUDA and compile it into DIR/program.so."""
    from latch_core.cli import load_or_exit
    from latch_core.document import save

    from .bodies import CodegenError
    from .builder import BuildError, build, check_compiles

    doc = load_or_exit(inp)
    t0 = time.perf_counter()
    if check_cuda:
        try:
            ptx = check_compiles(doc, out_dir, validate=not no_validate)
        except (CodegenError, BuildError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        click.echo(f"the generated CUDA compiles: {ptx} in {time.perf_counter() - t0:.2f} s (nvcc -ptx; ptxas not run, "
                   "no program.so)")
        return
    try:
        doc = build(doc, out_dir, jobs=jobs, use_cache=not no_cache, validate=not no_validate)
    except (CodegenError, BuildError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    b = doc.build
    stats = dict(b.stats)
    click.echo(f"built {out_dir}/program.so in {time.perf_counter() - t0:.2f} s (cached: {stats.get('cached')}; "
               f"{stats.get('bodies')} bodies in {len(b.units) - 1} units; key {b.key[:12]})")
    if out:
        save(doc, out)
        click.echo(f"wrote {out}")


@click.command("run", cls=_Interspersed)
@click.argument("build_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--inputs", type=click.Path(dir_okay=False, exists=True),
              help="torch.save'd dict {'params':{}, 'state':{}, 'batch':{} or [..], 'hyper':{}} (default: random)")
@click.option("--steps", type=int, default=1, show_default=True, help="updates to run")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save", "save_path", type=click.Path(dir_okay=False), help="torch.save the tensors after the run")
def run_cmd(build_dir, inputs, steps, seed, save_path):
    """Load BUILD_DIR/program.so and run updates on the GPU, printing the loss and time of each."""
    import torch

    from .runtime import LaunchError, Program, ProgramError, random_inputs

    try:
        prog = Program.load(build_dir)
        if inputs:
            data = torch.load(inputs, map_location=prog.device)
            made = {c: t for c, t in prog.initial_copies(data["params"]).items() if c not in data["state"]}
            if made:  # a saved state from before memory.weight_copies: each copy starts as cast(p)
                data["state"].update(made)
                click.echo(f"created {len(made)} BF16 weight copies as cast(param) (memory.weight_copies)")
        else:
            data = random_inputs(prog, seed=seed)
        for step in range(steps):
            t0 = time.perf_counter()
            loss = prog(data["params"], data["state"], data["batch"], data.get("hyper"))
            torch.cuda.synchronize(prog.device)
            dt = time.perf_counter() - t0
            shown = f"{loss.item():.6g}" if loss is not None and loss.numel() == 1 else "-"
            click.echo(f"step {step}: loss {shown}  ({dt * 1e3:.3f} ms, {prog.launches} launches so far)")
    except (ProgramError, LaunchError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if save_path:
        torch.save(data, save_path)
        click.echo(f"wrote {save_path}")


@click.command("sass", cls=_Interspersed)
@click.argument("build_dir", type=click.Path(file_okay=False, exists=True))
def sass_cmd(build_dir):
    """Report what BUILD_DIR/program.so's machine code holds: HGMMA (tensor cores), UTMALDG (TMA),
    USETMAXREG (the register split), local memory; runs without a GPU."""
    from pathlib import Path

    from .sass import SassError, sass_report

    try:
        r = sass_report(Path(build_dir) / "program.so")
    except SassError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    for line in r.lines():
        click.echo(line)


@hookimpl
def latch_register_commands(register):
    register(build_cmd)
    register(run_cmd)
    register(sass_cmd)
