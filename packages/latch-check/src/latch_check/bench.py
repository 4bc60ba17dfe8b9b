"""``latch-pipeline bench``: the generated program against PyTorch's controls, in one process.

    latch-pipeline bench examples/tinymoe.py --shapes 2x1024,32x1024,16x8x1024 --json bench.json

For each shape (``BxT``: batch B of T tokens, one microbatch; ``KxBxT``: K microbatches of B x T
with the update after the last), the example is built with ``batch``, ``seq`` and
``microbatches`` set (plus every ``--set``), the whole pipeline compiles it (latch_core.pipeline,
BF16 policy unless --no-policy), and in the same process, on the same weights and batches:
- ``latch``: one update of the generated program (all its launches), the loss left on the device;
- the controls of TARGETS.md (``latch_check.controls``): ``eager``, ``compiled`` (torch.compile
  of the forward and the loss together, with fused AdamW), ``graph`` (the same with the whole update
  in ONE CUDA graph, with the graph-safe MoE of ``latch_check.torch_native``); ``graph_model`` (on
  request: the loss outside torch.compile, the strongest control as measured up to 2026-12-06).
``--gate-steps N`` / ``--trained M`` also gate the program against FP64 with PyTorch's own BF16
update as the ``torch`` column (``latch_check.gpu.gpu_compare``): N fresh updates, and one at the
state after M eager FP32 updates (200 is the benchmark's qualification; the FP64 reference runs on
the CPU, so at full size it takes minutes). Each is timed alone per update with CUDA events after warm-up: median, min and max ms; the ratio
``control / latch`` (> 1: the program is faster). A control that fails is reported with its error,
never dropped. Prints one table and writes every number to ``--json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from latch_core.cli import InterspersedCommand

from .timing import events_ms

DEFAULT_SHAPES = "2x1024,32x1024,16x8x1024"
CONTROLS = ("eager", "compiled", "graph", "graph_model")
DEFAULT_CONTROLS = ("eager", "compiled", "graph")


class BenchError(ValueError):
    pass


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"2x1024,16x8x1024"`` -> [(K, B, T)]: (1, 2, 1024), (16, 8, 1024)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            nums = [int(v) for v in part.lower().split("x")]
        except ValueError:
            nums = []
        if len(nums) not in (2, 3) or any(n < 1 for n in nums):
            raise BenchError(f"--shapes: {part!r} is not BATCHxSEQ or MICROBATCHESxBATCHxSEQ of positive integers "
                             "(e.g. 2x1024 or 16x8x1024)")
        out.append(tuple(nums) if len(nums) == 3 else (1, *nums))
    if not out:
        raise BenchError("--shapes names no shape")
    return out


def shape_name(k: int, b: int, t: int) -> str:
    return f"{b}x{t}" if k == 1 else f"{k}x{b}x{t}"


def _times(fn: Callable[[], Any], iters: int, warmup: int, back_to_back: int = 1) -> dict[str, Any]:
    """Each update timed alone (an event pair around one call on an idle GPU: the call's host work
    before its launch is inside), and, when ``back_to_back`` > 1, as a training loop runs them:
    ``back_to_back`` calls between one event pair, the host's work for one update overlapping the
    GPU's for the one before (``b2b``: ms per update)."""
    def stats(ts: list[float]) -> dict[str, Any]:
        return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts), "iters": iters}

    out = stats(events_ms(fn, iters, warmup))
    if back_to_back > 1:
        out["b2b"] = {**stats(events_ms(fn, iters, 0, reps=back_to_back)), "reps": back_to_back}
    return out


def bench_shape(example_path: str, shape: tuple[int, int, int], *, overrides: dict, iters: int, latch_iters: int,
                controls: tuple[str, ...], policy: bool, scheduler: str | None, build_dir: str | None,
                say: Callable[[str], None], latch: bool = True, gate_steps: int = 0,
                trained: int = 0, back_to_back: int = 1, store_products: bool = False) -> dict[str, Any]:
    """Every timing of one shape (module docstring) as a JSON-ready dict."""
    import torch

    from .controls import control
    from .pipeline import compile_example

    K, B, T = shape
    ov = {**overrides, "batch": B, "seq": T, "microbatches": K}
    row: dict[str, Any] = {"shape": shape_name(K, B, T), "microbatches": K, "batch": B, "seq": T,
                           "tokens_per_update": K * B * T}
    t0 = time.perf_counter()
    compiled = compile_example(example_path, overrides=ov, scheduler=scheduler, policy=policy, build=latch,
                               build_dir=build_dir and f"{build_dir}/{row['shape']}", say=say,
                               store_products=store_products)
    row["store_products"] = store_products
    row["compile_s"] = time.perf_counter() - t0
    row["strategy"] = compiled.doc.schedule.strategy
    example = compiled.example
    from .policy import policy_of

    bf16 = policy_of(compiled.doc) == "bf16"
    row["policy"] = "bf16" if bf16 else "f32"
    batches = [example.microbatch(k) for k in range(K)]
    if latch:
        from .gpu import GpuRun

        run = GpuRun(example, compiled.build_dir)
        gb = [run.gpu_batch(b) for b in batches]
        arg = gb if K > 1 else gb[0]

        def latch_step():
            return run.prog(run.layout, run.layout, arg, run.hyper, check=False)

        say(f"bench {row['shape']}: latch ({latch_iters} timed updates)")
        row["latch"] = _times(latch_step, latch_iters, min(2, latch_iters), back_to_back)
        run.prog.check()
        say(f"bench {row['shape']}: latch {row['latch']}")
        del run
        if gate_steps > 0 or trained > 0:
            from .gpu import gpu_compare

            say(f"bench {row['shape']}: gates over {gate_steps} fresh update(s)"
                + (f" and at the state after {trained} FP32 updates" if trained else "") + ", with the torch column")
            res = gpu_compare(example, compiled.build_dir, steps=gate_steps, torch_column=True, trained=trained)
            row["gates"] = {"passed": res.passed, "tables": res.format()}
    for kind in controls:
        say(f"bench {row['shape']}: control {kind}")
        t0 = time.perf_counter()
        try:
            with control(example, "cuda", kind, batches, bf16=bf16) as step:
                setup = time.perf_counter() - t0
                row[kind] = {**_times(step, iters, 3, back_to_back), "setup_s": setup}
        except Exception as e:  # reported in the table and the JSON, never a silent pass
            row[kind] = {"error": f"{type(e).__name__}: {e}"[:400]}
        say(f"bench {row['shape']}: {kind} {row[kind]}")
        torch.cuda.empty_cache()
    lat = row.get("latch", {}).get("median_ms")
    lat_b = row.get("latch", {}).get("b2b", {}).get("median_ms")
    for kind in controls:
        c = row[kind].get("median_ms")
        if lat and c:
            row[kind]["ratio_vs_latch"] = c / lat  # > 1: the generated program is faster
        cb = row[kind].get("b2b", {}).get("median_ms")
        if lat_b and cb:
            row[kind]["b2b"]["ratio_vs_latch"] = cb / lat_b
    return row


def format_table(rows: list[dict], controls: tuple[str, ...]) -> str:
    """The table of each update timed alone, then, where the bench ran them, the back-to-back table."""
    text = _table(rows, controls, None)
    reps = next((r[k]["b2b"]["reps"] for r in rows for k in ("latch", *controls) if "b2b" in r.get(k, {})), None)
    if reps:
        text += "\n" + _table(rows, controls, reps)
    return text


def _table(rows: list[dict], controls: tuple[str, ...], reps: int | None) -> str:
    def pick(r, key):  # the timing this table shows (an error is shown in both tables)
        v = r.get(key)
        if v is None or not reps or "error" in v:
            return v
        return v.get("b2b")

    def cell(r, key):
        v = pick(r, key)
        if v is None:
            return "-"
        if "error" in v:
            return "FAILED"
        return f"{v['median_ms']:.3f} ({v['min_ms']:.3f}-{v['max_ms']:.3f})"

    head = ["shape", "latch ms"] + [f"{k} ms" for k in controls] + [f"{k}/latch" for k in controls]
    body = []
    for r in rows:
        ratios = []
        for k in controls:
            x = (pick(r, k) or {}).get("ratio_vs_latch")
            ratios.append("-" if x is None else f"{x:.3f}x")
        body.append([r["shape"], cell(r, "latch")] + [cell(r, k) for k in controls] + ratios)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    if reps:
        lines.insert(0, f"back to back ({reps} updates between two CUDA events, as a training loop issues them: the "
                        "host's work for one overlaps the GPU's for the one before)")
        lines.append("ms per update: median (min-max) over the samples; X/latch > 1: the generated program is faster")
        return "\n".join(lines)
    lines.append("ms per update: median (min-max) of CUDA-event timings; X/latch > 1: the generated program is faster")
    for r in rows:
        for k in controls:
            if "error" in r.get(k, {}):
                lines.append(f"  {r['shape']} {k}: {r[k]['error']}")
    return "\n".join(lines)


@click.command("bench", cls=InterspersedCommand)
@click.argument("example", type=click.Path(exists=True, dir_okay=False))
@click.option("--shapes", default=DEFAULT_SHAPES, show_default=True,
              help="BATCHxSEQ or MICROBATCHESxBATCHxSEQ, comma-separated")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="argument for the example's build()")
@click.option("--iters", type=int, default=20, show_default=True, help="timed updates per control")
@click.option("--latch-iters", type=int, default=None, help="timed updates of the generated program (default: --iters)")
@click.option("--controls", "controls_", default=",".join(DEFAULT_CONTROLS), show_default=True,
              help="which controls to time (eager, compiled, graph; graph_model: the loss outside torch.compile); empty for none")
@click.option("--no-latch", is_flag=True, help="time only the controls (no build)")
@click.option("--policy/--no-policy", default=True, show_default=True, help="the BF16 policy (and autocast in the controls)")
@click.option("--scheduler", default=None, help="scheduling strategy (default: $LATCH_SCHEDULER or barrier)")
@click.option("--store-products/--no-store-products", default=False, show_default=True,
              help="build the program with products feeding only BF16 consumers stored in BF16 (as compile's flag)")
@click.option("--dir", "build_dir", type=click.Path(file_okay=False), default=None, help="build directories under DIR/SHAPE")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="write every number here")
@click.option("--gate-steps", type=int, default=0, show_default=True,
              help="also gate this many fresh updates against FP64, with PyTorch's own update as the torch column")
@click.option("--trained", type=int, default=0, show_default=True,
              help="also gate one update at the state after N eager FP32 updates (the benchmark's qualification: 200)")
@click.option("--back-to-back", "back_to_back", type=int, default=5, show_default=True,
              help="also time N updates between one event pair (a training loop's steady state); 1: only alone")
@click.option("-q", "--quiet", is_flag=True)
def bench_command(example, shapes, overrides, iters, latch_iters, controls_, no_latch, policy, scheduler,
                  store_products, build_dir, json_path, gate_steps, trained, back_to_back, quiet):
    """Time EXAMPLE.py's generated program against PyTorch's controls on the GPU (same weights, batches)."""
    from .pipeline import PipelineError, resolve_target

    try:
        shape_list = parse_shapes(shapes)
        controls = tuple(c.strip() for c in controls_.split(",") if c.strip())
        bad = [c for c in controls if c not in CONTROLS]
        if bad:
            raise BenchError(f"--controls: unknown {bad}; choose from {list(CONTROLS)}")
        if iters < 1 or (latch_iters is not None and latch_iters < 1):
            raise BenchError("--iters and --latch-iters must be at least 1")
        if back_to_back < 1:
            raise BenchError("--back-to-back must be at least 1 (1: each update timed alone only)")
        resolve_target("gpu")
        from latch_capture.examples import parse_overrides

        ov = parse_overrides(list(overrides))
        say = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
        import torch

        rows = []
        for shape in shape_list:
            rows.append(bench_shape(example, shape, overrides=ov, iters=iters, latch_iters=latch_iters or iters,
                                    controls=controls, policy=policy, scheduler=scheduler, build_dir=build_dir,
                                    say=say, latch=not no_latch, gate_steps=gate_steps, trained=trained,
                                    back_to_back=back_to_back, store_products=store_products))
            if json_path:  # after every shape: a later shape's failure keeps the earlier numbers
                _write(json_path, example, rows, torch)
    except (BenchError, PipelineError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except Exception as e:  # stage errors name their culprit
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(2)
    for r in rows:
        if "gates" in r:
            click.echo(r["gates"]["tables"])
            click.echo(f"GATES {Path(example).stem} {r['shape']}: {'PASS' if r['gates']['passed'] else 'FAIL'}")
    click.echo(f"BENCH TABLE {Path(example).stem}{' --store-products' if store_products else ''} "
               f"on {torch.cuda.get_device_name(0)}")
    click.echo(format_table(rows, controls))
    if json_path:
        click.echo(f"wrote {json_path}")
    if any("gates" in r and not r["gates"]["passed"] for r in rows):
        sys.exit(1)


def _write(path, example, rows, torch) -> None:
    doc = {"example": str(example), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1))


__all__ = ["bench_command", "parse_shapes", "format_table", "bench_shape"]
