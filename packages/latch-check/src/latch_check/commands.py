"""latch-check's ``latch-pipeline`` commands: ``compile``, ``check`` and ``simulate``.

This module imports no torch: each command imports what it runs when it runs, so ``latch-pipeline
--help`` stays fast. ``compile`` is the one command line for the whole pipeline, on the CPU and on
the GPU (gates over N updates, the benchmark, routing replay, the build directory, the policy).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from latch_core.cli import InterspersedCommand

TARGETS = ("auto", "gpu", "sim")
FP64_THRESHOLD = 1e-10  # = latch_check.gates.FP64_THRESHOLD (a test keeps them equal; gates imports torch)
SIM_THRESHOLD = 1e-12  # = latch_check.simulator.SIM_THRESHOLD (likewise)


def _say(quiet: bool):
    from latch_core import progress

    def say(m: str) -> None:
        if not (quiet or progress.quiet()):
            click.echo(m, err=True)

    return say


def _fail(e: Exception, code: int = 2):
    click.echo(f"error: {type(e).__name__}: {e}", err=True)
    sys.exit(code)


@click.command("compile", cls=InterspersedCommand)
@click.argument("example", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="argument for the example's build()")
@click.option("--scheduler", default=None, help="scheduling strategy (default: $LATCH_SCHEDULER or barrier)")
@click.option("--num-sms", type=int, default=None, help="SMs to schedule for (default: the device's, else 132)")
@click.option("--policy/--no-policy", default=True, show_default=True,
              help="memory.policy: BF16 operands for matmul/attention (--no-policy keeps every op in FP32)")
@click.option("--remat-budget", type=int, default=None, help="bytes: recompute cheap forward values to fit")
@click.option("--split-reductions/--no-split-reductions", default=True, show_default=True,
              help="schedule.split_reductions: big full reductions in two levels")
@click.option("--alias-views/--no-alias-views", default=True, show_default=True,
              help="contiguous views fold into their readers as addresses (schedule.alias_views + schedule option)")
@click.option("--row-groups/--no-row-groups", default=True, show_default=True,
              help="a row reduction, the chain on its statistic and their broadcast consumer as one group "
                   "(RMSNorm reads x once; schedule option row_groups)")
@click.option("--fuse-views/--no-fuse-views", default=True, show_default=True,
              help="fusable views cloned per reader that fuses them (schedule.fuse_views) and concat fused with "
                   "its producers and consumers (schedule option fuse_concat): RoPE as one pass")
@click.option("--weight-copies/--no-weight-copies", default=True, show_default=True,
              help="memory.weight_copies: each weight's BF16 copy is optimizer state written by the update "
                   "(--no-weight-copies casts every weight at the start of every update)")
@click.option("--attention-storage/--no-attention-storage", default=True, show_default=True,
              help="memory.policy: attention's q, k, v, dO stored in BF16 and its out, dq, dk, dv written in BF16, so "
                   "the ring's wgmma attention bodies run (--no-attention-storage: FP32 storage, rounded in the "
                   "mma.sync bodies)")
@click.option("--store-products/--no-store-products", default=False, show_default=True,
              help="memory.policy option products: a BF16-policy product whose result only feeds BF16 consumers "
                   "(through elementwise ops) writes BF16")
@click.option("--routing/--no-routing", default=None,
              help="output routing decisions and replay them in the reference (default: when the update routes)")
@click.option("--target", type=click.Choice(TARGETS), default="auto", show_default=True,
              help="where to run the check: the GPU, the CPU arena simulator, or GPU when present")
@click.option("--steps", type=int, default=2, show_default=True, help="updates to run and gate (0: none)")
@click.option("--seed", type=int, default=0, show_default=True, help="the simulator's random legal task order")
@click.option("--bench", is_flag=True, help="GPU: time one update against eager PyTorch and its CUDA graph (BENCH line)")
@click.option("--iters", type=int, default=50, show_default=True, help="timed iterations of --bench")
@click.option("--strongest", is_flag=True,
              help="with --bench: also the compiled model and loss with the whole update in ONE CUDA graph, and the same "
                   "with the loss eager (STRONGEST line)")
@click.option("--no-eager", is_flag=True, help="with --bench: skip the eager controls (large models)")
@click.option("--torch-column", is_flag=True,
              help="GPU: each gate table also shows PyTorch's own (BF16 autocast) update on the same inputs (docs/GATES.md)")
@click.option("--trained", type=int, default=0, show_default=True,
              help="GPU: also gate one update at the state after N eager FP32 updates (with --torch-column)")
@click.option("--twice", is_flag=True, help="run the pipeline a second time and report the cached rebuild")
@click.option("--no-build", is_flag=True, help="stop after planning and validation (no nvcc)")
@click.option("--no-cache", is_flag=True, help="capture, build and check again even when nothing changed")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="write the planned document")
@click.option("--build-dir", "--dir", "build_dir", type=click.Path(file_okay=False), default=None,
              help="default: build/EXAMPLE-STRATEGY")
@click.option("-q", "--quiet", is_flag=True, help="no per-stage lines and no progress bars")
def compile_command(example, overrides, scheduler, num_sms, policy, remat_budget, split_reductions, alias_views, row_groups,
                    fuse_views, weight_copies, attention_storage, store_products, routing, target,
                    steps, seed, bench, iters, strongest, no_eager, torch_column, trained, twice, no_build, no_cache,
                    output, build_dir, quiet):
    """Compile EXAMPLE.py's whole training update into one kernel, run it and check it.

    Runs latch_core.pipeline (capture, memory.policy, [memory.remat], schedule.split_reductions,
    schedule, memory.plan, schedule.validate, build), then STEPS updates: on the GPU, gated
    against Latch's FP64 reference; without one, on the CPU arena simulator (the exact schedule and
    memory plan) against the same FP64 interpreter, where the BF16 policy is not simulated.
    ``latch-pipeline check`` compares the captured graph with eager PyTorch.
    """
    from latch_core import progress
    from latch_core.document import save

    from .pipeline import compile_example, gates_line, policy_note, resolve_target, run_checks, summary_line

    if quiet:
        progress.set_quiet()
    say = _say(quiet)
    try:
        from latch_capture.examples import parse_overrides

        where = resolve_target(target)
        if where == "sim" and target == "auto":
            say("target: no CUDA device seen by torch: checking on the CPU arena simulator (--target gpu to insist)")
        if bench and where != "gpu":
            raise click.UsageError("--bench times the kernel on the GPU; there is none here (--target sim)")
        if (torch_column or trained) and where != "gpu":
            raise click.UsageError("--torch-column and --trained gate the kernel on the GPU; on the CPU, "
                                   "tools/qualify_gates.py gives the same tables for the BF16 policy")
        if trained < 0:
            raise click.UsageError(f"--trained must be 0 or more, got {trained}")
        kw = dict(overrides=parse_overrides(list(overrides)), scheduler=scheduler, num_sms=num_sms, policy=policy,
                  remat_budget=remat_budget, split_reductions=split_reductions, build_dir=build_dir,
                  build=not no_build, routing=routing, cache=not no_cache, alias_views=alias_views,
                  row_groups=row_groups, fuse_views=fuse_views, weight_copies=weight_copies,
                  attention_storage=attention_storage, store_products=store_products)
        compiled = compile_example(example, say=say, **kw)
        click.echo(summary_line(compiled))
        if output:
            save(compiled.doc, output)
            say(f"wrote {output}")
        again = None
        if twice:
            t0 = time.perf_counter()
            again = compile_example(example, say=lambda m: None, **kw)
            st = dict(again.doc.build.stats) if again.doc.build is not None else {}
            click.echo(f"{compiled.name}: cached rebuild {again.times.get('build', 0.0):.3f} s (cached: "
                       f"{st.get('cached')}); whole second pipeline {time.perf_counter() - t0:.2f} s")
        result = None
        if steps > 0 or trained > 0:
            note = policy_note(compiled.doc, where)
            if note:
                say(note)
            t0 = time.perf_counter()
            result, cached = run_checks(compiled, where, steps=steps, seed=seed, cache=not no_cache, say=say,
                                        torch_column=torch_column, trained=trained)
            how = "cached result of an identical run (--no-cache runs it again)" if cached else (
                "on the GPU" if where == "gpu" else "on the CPU arena simulator")
            say(f"run+check {time.perf_counter() - t0:7.2f} s  {how}")
        bench_line = _bench(compiled, iters, again, strongest=strongest, eager=not no_eager) if bench else None
    except click.UsageError:
        raise
    except Exception as e:  # every stage's errors name their culprit; show them without a traceback
        _fail(e)
    if result is not None:
        click.echo(result.format())
        click.echo(gates_line(compiled, result, steps=steps))
    if bench_line:
        click.echo(bench_line)
    passed = result is None or result.passed
    where_s = "GPU" if where == "gpu" else "CPU arena simulator"
    runs = f"{len(result.tables) if hasattr(result, 'tables') else result.runs} run(s) on {where_s}" if result else \
        "no runs (--steps 0)"
    extra = " (BF16 policy not simulated)" if result is not None and policy_note(compiled.doc, where) else ""
    click.echo(f"latch compile {Path(example).name}: {'PASS' if passed else 'FAIL'}: {runs}, "
               f"{compiled.doc.schedule.strategy} schedule{extra}")
    if not passed:
        sys.exit(1)


def _bench(compiled, iters: int, again=None, *, strongest: bool = False, eager: bool = True) -> str:
    from .gpu import bench

    if compiled.build_dir is None:
        raise click.UsageError("--bench needs a build; drop --no-build")
    r = bench(compiled.example, compiled.build_dir, iters=iters, strongest=strongest, eager=eager)

    def ms(key):
        v = r.get(key)
        return "-" if v is None else v if isinstance(v, str) else f"{v:.4f}"

    st = dict(compiled.doc.build.stats)
    return (f"BENCH {compiled.name} {compiled.doc.schedule.strategy}: ms/update (each timed alone | 20 back to back): "
            f"latch {ms('latch_ms')} | {ms('latch_pipelined_ms')}, eager {ms('eager_ms')} | "
            f"{ms('eager_pipelined_ms')}, cuda graph {ms('cuda_graph_ms')} | {ms('cuda_graph_pipelined_ms')}; "
            f"launches/update {r['launches_per_update']}; GPU activities/update {r['activities_per_update']}; "
            f"build cold {compiled.times.get('build', 0.0):.2f} s (cached: {st.get('cached')})"
            + (f", cached {again.times.get('build', 0.0):.3f} s" if again is not None else "")
            + (_strongest_line(compiled, r) if strongest else ""))


def _strongest_line(compiled, r: dict) -> str:
    c, latch = r.get("compiled_graph_ms"), r.get("latch_ms")
    ratio = _ratio(c, latch)
    shown = f"{c:.4f}" if isinstance(c, float) else str(c)
    return (f"\nSTRONGEST {compiled.name} {compiled.doc.schedule.strategy}: compiled model and loss + whole update in ONE "
            f"CUDA graph {shown} ms (setup {r.get('compiled_setup_s', 0):.1f} s); latch {latch if isinstance(latch, str) else f'{latch:.4f}'} ms; "
            f"latch speed vs the control {ratio}"
            + _model_only(r.get("compiled_graph_model_ms"), latch))


def _ratio(control, latch) -> str:
    """control / latch (> 1: the program is faster), or '-' where either is an error text."""
    return f"{control / latch:.3f}x" if isinstance(control, float) and isinstance(latch, float) else "-"


def _model_only(c, latch) -> str:
    if c is None:
        return ""
    return (f"; with the loss outside torch.compile (the control of earlier runs) "
            f"{c:.4f} ms, {_ratio(c, latch)}" if isinstance(c, float) else f"; loss outside torch.compile: {c}")


@click.command("check", cls=InterspersedCommand)
@click.argument("example", type=click.Path(dir_okay=False))
@click.option("-d", "--doc", "doc_path", type=click.Path(dir_okay=False), default=None,
              help="captured document to check (default: capture the example now)")
@click.option("--steps", type=int, default=3, show_default=True, help="updates to compare")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="argument for the example's build()")
@click.option("--microbatches", type=int, default=None, help="override the example's microbatch count")
@click.option("--threshold", type=float, default=FP64_THRESHOLD, show_default=True, help="relative-L2 gate")
def check_command(example, doc_path, steps, overrides, microbatches, threshold):
    """Compare EXAMPLE.py's captured update (Latch's FP64 interpreter) with eager PyTorch in FP64.

    This is the check of capture itself: the graph computes what PyTorch computes."""
    from latch_capture.errors import CaptureError
    from latch_capture.examples import load_example, parse_overrides
    from latch_core.document import DocumentError, load

    from . import reference
    from .compare import compare

    try:
        kw = parse_overrides(list(overrides))
        if microbatches is not None:
            kw["microbatches"] = microbatches
        ex = load_example(example, **kw)
        doc = load(doc_path) if doc_path else None
        if doc is not None and doc.graph is None:
            raise CaptureError(f"{doc_path} has no graph section", hint="capture it first (latch-pipeline capture)")
        if doc is not None:
            k_doc = int(doc.graph.meta("microbatches", 1))
            if k_doc != ex.microbatches:
                raise CaptureError(f"{doc_path} was captured with {k_doc} microbatches, the example has {ex.microbatches}",
                                   hint="pass --microbatches or re-capture")
            last = doc.graph.programs[-1]
            if not any(g.name == "grads" for g in last.outputs):
                click.echo(f"note: {doc_path} has no gradient outputs; capture with --grads to gate each gradient",
                           err=True)
        result = compare(ex, doc, steps=steps, thresholds=threshold, progress=lambda m: click.echo(m, err=True))
    except (CaptureError, DocumentError, reference.ReferenceError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(result.format())
    if not result.passed:
        click.echo("check: FAILED", err=True)
        sys.exit(1)
    click.echo(f"check: {steps} step(s) passed")


@click.command("simulate", cls=InterspersedCommand)
@click.argument("example", type=click.Path(dir_okay=False))
@click.option("-d", "--doc", "doc_path", type=click.Path(dir_okay=False), default=None,
              help="document to run (default: capture the example now); schedule and memory are added if missing")
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), default=None,
              help="write the scheduled and planned document here")
@click.option("--scheduler", default=None, help="strategy (default: $LATCH_SCHEDULER, else barrier)")
@click.option("--num-sms", type=int, default=None, help="SMs to schedule for (default: the scheduler's, 132)")
@click.option("--fuse/--no-fuse", default=True, show_default=True, help="fuse elementwise chains")
@click.option("--steps", type=int, default=1, show_default=True, help="updates to simulate")
@click.option("--seed", type=int, default=0, show_default=True, help="picks the random legal task order")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="argument for the example's build()")
@click.option("--microbatches", type=int, default=None, help="override the example's microbatch count")
@click.option("--threshold", type=float, default=SIM_THRESHOLD, show_default=True, help="relative-L2 gate")
@click.option("--check-finite", is_flag=True, help="name the first input holding a NaN or an infinity")
def simulate_command(example, doc_path, out_path, scheduler, num_sms, fuse, steps, seed, overrides,
                     microbatches, threshold, check_finite):
    """Run EXAMPLE.py's schedule and memory plan on the CPU arena simulator against FP64."""
    from latch_capture.errors import CaptureError
    from latch_capture.examples import load_example, parse_overrides
    from latch_core.document import DocumentError, load, save
    from latch_core.passes import PassError

    from .simulator import SimulationError, check_example, prepare

    try:
        kw = parse_overrides(list(overrides))
        if microbatches is not None:
            kw["microbatches"] = microbatches
        ex = load_example(example, **kw)
        doc = load(doc_path) if doc_path else ex.capture(grads=True, progress=lambda m: click.echo(m, err=True))
        doc = prepare(doc, scheduler=scheduler, num_sms=num_sms, fuse=fuse)
        if out_path:
            save(doc, out_path)
        for pm in doc.memory.programs:
            click.echo(f"memory plan {pm.program}: arena {pm.arena_bytes:,} bytes, peak live {pm.peak_live_bytes:,} bytes")
        result = check_example(ex, doc, steps=steps, seed=seed, thresholds=threshold,
                               progress=lambda m: click.echo(m, err=True), check_finite=check_finite or None)
    except (CaptureError, DocumentError, PassError, SimulationError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(result.format())
    if not result.passed:
        click.echo("simulate: FAILED", err=True)
        sys.exit(1)
    click.echo(f"simulate: {len(result.tables)} program run(s) passed")
