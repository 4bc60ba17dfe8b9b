"""The whole pipeline on one example: ``latch-pipeline compile EXAMPLE.py``.

    capture (with gradients) -> memory.policy -> [memory.remat] -> schedule -> memory.plan
      -> schedule.validate -> build (nvcc) -> run + check

The run happens where the user says (``--target``): ``gpu`` runs the built kernel on the CUDA device
and gates it against the FP64 reference (``latch_check.gpu``); ``sim`` runs the exact schedule and
memory plan on the CPU arena simulator and gates it the same way (``latch_check.simulator``);
``auto`` (the default) picks ``gpu`` when torch sees a CUDA device and ``sim`` otherwise, and says
which it picked. Asking for ``gpu`` without a device is an error, never a quiet switch to the CPU.

The build needs nvcc; without it the command fails and says so, unless ``--no-build`` is given.
Every stage's time is printed; the gate tables are printed last, with a one-line verdict.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs
import click

from latch_core.cli import InterspersedCommand
from latch_core.document import Document, save
from latch_core.passes import run_pass

TARGETS = ("auto", "gpu", "sim")



class PipelineError(RuntimeError):
    pass


@attrs.define
class Compiled:
    example: Any
    doc: Document
    build_dir: Path | None
    times: dict[str, float]


def _device_sms() -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # torch missing or broken: the schedule uses the default SM count
        return None
    return None


def compile_example(example_path: str | Path, *, overrides: Mapping[str, Any] | None = None,
                    scheduler: str | None = None, num_sms: int | None = None, policy: bool = True,
                    remat_budget: int | None = None, build_dir: str | Path | None = None, build: bool = True,
                    routing: bool | None = None, say: Callable[[str], None] = lambda m: None) -> Compiled:
    """Capture, plan, validate and (unless ``build=False``) build one example.

    ``routing``: expose routing decisions as outputs (``None``: exactly when the update routes tokens).
    """
    from latch_capture.examples import load_example
    from latch_core.plugins import registries

    passes = registries().passes
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    ex = load_example(str(example_path), **dict(overrides or {}))
    # Routing decisions are discrete: a BF16 near-tie may pick another expert than FP64 does.
    # Exposed as outputs, the check replays them (latch_check.gpu.reference_gates).
    doc = ex.capture(grads=True, routing="auto" if routing is None else routing)
    times["capture"] = time.perf_counter() - t0
    progs = ", ".join(f"{g.name} {len(g.nodes)} nodes" for g in doc.graph.programs)
    say(f"capture   {times['capture']:7.2f} s  {progs}")

    sms = num_sms or _device_sms() or 132
    steps: list[tuple[str, dict]] = []
    if policy:
        steps.append(("memory.policy", {}))
    if remat_budget is not None:
        steps.append(("memory.remat", {"budget_bytes": int(remat_budget)}))
    sched_opts: dict[str, Any] = {"num_sms": sms}
    if scheduler:
        sched_opts["scheduler"] = scheduler
    steps += [("schedule", sched_opts), ("memory.plan", {}), ("schedule.validate", {})]
    for name, opts in steps:
        t0 = time.perf_counter()
        doc = run_pass(passes.get(name), doc, **opts)
        times[name] = time.perf_counter() - t0
        say(f"{name:<17s} {times[name]:7.2f} s{_summary(name, doc)}")

    out_dir = None
    if build:
        try:
            from latch_codegen_h100 import build as _build
            from latch_codegen_h100.builder import BuildError, find_nvcc
        except ModuleNotFoundError as e:
            raise PipelineError(f"building the kernel needs the latch-codegen-h100 package ({e}); install it, "
                                "or pass --no-build to stop after planning") from None
        try:
            find_nvcc()  # the build's own search: LATCH_NVCC, CUDA_HOME, PATH, /usr/local/cuda
        except BuildError as e:
            raise PipelineError(f"{e}; or pass --no-build to stop after planning") from None

        out_dir = Path(build_dir or Path("build") / f"{Path(example_path).stem}-{doc.schedule.strategy}")
        t0 = time.perf_counter()
        doc = _build(doc, out_dir)
        times["build"] = time.perf_counter() - t0
        st = dict(doc.build.stats)
        say(f"build     {times['build']:7.2f} s  {out_dir} ({st.get('bodies', '?')} bodies, "
            f"{len(doc.build.units)} units, cached: {st.get('cached')})")
    return Compiled(ex, doc, out_dir, times)


def _summary(name: str, doc: Document) -> str:
    if name == "schedule" and doc.schedule is not None:
        s = doc.schedule
        tasks = sum(len(p.tasks) for p in s.programs)
        bars = sum(p.num_barriers for p in s.programs)
        ctrs = sum(len(p.counters) for p in s.programs)
        return f"  {s.strategy}: {tasks} tasks on {s.num_sms} SMs, {bars} barriers, {ctrs} counters"
    if name == "memory.plan" and doc.memory is not None:
        peak = max((p.peak_live_bytes for p in doc.memory.programs), default=0)
        return f"  arena {doc.memory.arena_bytes:,} bytes (peak live {peak:,})"
    if name == "schedule.validate":
        return "  hazard-free"
    return ""


def resolve_target(target: str) -> str:
    if target not in TARGETS:
        raise PipelineError(f"unknown target {target!r}; choose one of {TARGETS}")
    has_gpu = _device_sms() is not None
    if target == "gpu" and not has_gpu:
        raise PipelineError("--target gpu was asked for, but torch sees no CUDA device; "
                            "run on a machine with a Hopper GPU or use --target sim (the CPU arena simulator)")
    if target == "auto":
        return "gpu" if has_gpu else "sim"
    return target


def run_checks(compiled: Compiled, target: str, *, steps: int, seed: int = 0,
               say: Callable[[str], None] = lambda m: None):
    """Run ``steps`` updates on ``target`` and gate them against the FP64 reference."""
    if target == "gpu":
        if compiled.build_dir is None:
            raise PipelineError("the GPU target needs a build; drop --no-build")
        from .gpu import gpu_compare

        return gpu_compare(compiled.example, compiled.build_dir, steps=steps, progress=say)
    from .simulator import check_example

    return check_example(compiled.example, compiled.doc, steps=steps, seed=seed, progress=say)


@click.command("compile", cls=InterspersedCommand)
@click.argument("example", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="argument for the example's build()")
@click.option("--scheduler", default=None, help="scheduling strategy (default: $LATCH_SCHEDULER or barrier)")
@click.option("--num-sms", type=int, default=None, help="SMs to schedule for (default: the device's, else 132)")
@click.option("--no-policy", is_flag=True, help="keep every op in FP32 (skip memory.policy's BF16 matrix operands)")
@click.option("--remat-budget", type=int, default=None, help="bytes: recompute cheap forward values to fit")
@click.option("--target", type=click.Choice(TARGETS), default="auto", show_default=True,
              help="where to run the check: the GPU, the CPU arena simulator, or GPU when present")
@click.option("--steps", type=int, default=2, show_default=True, help="updates to run and gate")
@click.option("--no-build", is_flag=True, help="stop after planning and validation (no nvcc)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="write the planned document")
@click.option("--build-dir", type=click.Path(file_okay=False), default=None, help="default: build/EXAMPLE-STRATEGY")
def compile_command(example, overrides, scheduler, num_sms, no_policy, remat_budget, target, steps, no_build,
                    output, build_dir):
    """Compile EXAMPLE.py's whole training update into one kernel, run it and check it.

    Captures the update, plans it (policy, schedule, memory, hazard validation), builds the
    kernel with nvcc, then runs STEPS updates on the GPU (or, without one, on the CPU arena
    simulator) and prints the gate tables against the FP64 reference.
    """
    from latch_capture.examples import parse_overrides

    def say(m: str) -> None:
        click.echo(m, err=True)

    try:
        where = resolve_target(target)
        if where == "sim" and target == "auto":
            say("target: no CUDA device seen by torch: checking on the CPU arena simulator (--target gpu to insist)")
        compiled = compile_example(example, overrides=parse_overrides(list(overrides)), scheduler=scheduler,
                                   num_sms=num_sms, policy=not no_policy, remat_budget=remat_budget,
                                   build_dir=build_dir, build=not no_build, say=say)
        if output:
            save(compiled.doc, output)
            say(f"wrote {output}")
        t0 = time.perf_counter()
        result = run_checks(compiled, where, steps=steps, say=say)
        say(f"run+check {time.perf_counter() - t0:7.2f} s  on {'the GPU' if where == 'gpu' else 'the CPU arena simulator'}")
    except Exception as e:  # every stage's errors name their culprit; show them without a traceback
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(2)
    click.echo(result.format())
    verdict = "PASS" if result.passed else "FAIL"
    click.echo(f"latch compile {Path(example).name}: {verdict}: {len(result.tables)} run(s) on "
               f"{'GPU' if where == 'gpu' else 'CPU arena simulator'}, {compiled.doc.schedule.strategy} schedule")
    if not result.passed:
        sys.exit(1)
