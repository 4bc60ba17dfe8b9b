"""The LM head fused with cross-entropy inside the persistent kernel, against torch.compile's.

    latch-pipeline bench-lmhead                                  # 2048 x 768 x 49152, BF16 products
    latch-pipeline bench-lmhead --tokens 4096 --json lmhead.json

What runs: ``examples/lmhead.py`` (logits = (hidden + x) @ W^T, mean cross-entropy; the update
outputs the loss, dX = grad hidden and dW, and leaves the parameters) through the whole pipeline,
so the program is what the dense transformer's LM head becomes: the product writes BF16 logits,
``latch::cross_entropy`` reads them once for lse and the loss, ``latch::cross_entropy_backward``
writes BF16 dlogits, then the dX and dW products; no FP32 tensor of the logits' size
(``memory.fuse_cross_entropy``). The control is ``torch.compile`` of the same head (FP32
parameters, autocast BF16 product, ``F.cross_entropy`` on the FP32 upcast logits, ``backward()``),
on the same inputs.

Both are gated against the FP64 head on the GPU (relative L2 of loss, dX, dW; thresholds of the
BF16 policy, ``latch_check.gpu.GATES_BF16``), timed by CUDA events (median ms of forward +
backward), and their peak memory taken from torch's allocator: what the allocator held at the
peak above what it held before the parameters, inputs and program were made (so both count
parameters, gradients and every intermediate, and Latch its arena). A ``LMHEAD`` line ends it.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click

ROOT_EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "lmhead.py"


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _gates(loss, dx, dw, ref, th) -> list[tuple[str, float, float, bool]]:
    rows = [("loss", _rel(loss.reshape(()), ref[0]), th["loss"]), ("grad hidden (dX)", _rel(dx, ref[1]), th["grad"]),
            ("grad weight (dW)", _rel(dw, ref[2]), th["grad"])]
    return [(n, e, g, e <= g) for n, e, g in rows]


def _fp64_head(hidden, x, w, t):
    import torch
    import torch.nn.functional as F

    h = (hidden.double() + x.double()).requires_grad_()
    wd = w.double().requires_grad_()
    loss = F.cross_entropy(F.linear(h, wd), t)
    dx, dw = torch.autograd.grad(loss, [h, wd])
    return loss.detach(), dx, dw


def _peak(fn) -> int:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def run_bench(tokens: int, d_model: int, vocab: int, iters: int, warmup: int, build_dir: str,
              say=print, example: Path = ROOT_EXAMPLE) -> dict:
    import torch
    import torch.nn.functional as F

    from .gpu import GATES_BF16, GpuRun
    from .timing import events_ms
    from .pipeline import compile_example

    if not torch.cuda.is_available():
        raise click.ClickException("bench-lmhead runs on the GPU; torch sees no CUDA device")
    if not Path(example).is_file():
        raise click.ClickException(f"bench-lmhead needs {example} (the repository's examples/lmhead.py; --example PATH)")
    over = {"tokens": tokens, "d_model": d_model, "vocab": vocab}
    res: dict = {"tokens": tokens, "d_model": d_model, "vocab": vocab, "device": torch.cuda.get_device_name(0),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    t0 = time.perf_counter()
    compiled = compile_example(example, overrides=over, build_dir=build_dir,
                               say=lambda m: say("  " + m))
    res["pipeline_s"] = round(time.perf_counter() - t0, 1)
    doc = compiled.doc
    g = doc.graph.program("update")
    n_logits = tokens * vocab
    big = [(v.name, v.dtype) for v in g.values if v.shape and len(v.shape) == 2 and v.shape[0] * v.shape[1] == n_logits]
    res["logit_sized_values"] = big
    res["f32_logit_sized"] = [n for n, dt in big if dt in ("f32", "f64")]
    s = doc.schedule.program("update")
    res["tasks"], res["phases"] = len(s.tasks), len({t.phase for t in s.tasks} - {-1})
    res["arena_bytes"] = doc.memory.arena_bytes

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    holder: dict = {}

    def latch_setup_and_step():
        holder["run"] = run = GpuRun(compiled.example, compiled.build_dir)
        holder["batch"] = run.gpu_batch(run.batches(0)[0])
        holder["out"] = run.prog.run(run.layout, run.layout, holder["batch"], run.hyper, check=True)  # every output

    res["latch_peak_bytes"] = _peak(latch_setup_and_step) - base
    run, gb, out = holder["run"], holder["batch"], holder["out"]
    hidden, w = run.layout["hidden"], run.layout["weight"]
    x, t = gb["input"], gb["target"]
    ref = _fp64_head(hidden, x, w, t)
    res["latch_gates"] = _gates(out["loss"], out["grad.hidden"], out["grad.weight"], ref, GATES_BF16)

    def latch_step():  # as latch_check.gpu.bench times an update: the loss back, still on the GPU
        return run.prog(run.layout, run.layout, gb, run.hyper, check=False)

    res["latch_ms"] = statistics.median(events_ms(latch_step, iters, warmup))
    run.prog.check()
    # torch.compile's head on the same inputs (copies: the program's layout stays untouched)
    ph = hidden.detach().clone().requires_grad_()
    pw = w.detach().clone().requires_grad_()
    xc, tc = x.clone(), t.clone()
    del holder, out
    torch.cuda.synchronize()

    def head(hh, xx, ww, tt):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = F.linear(hh + xx, ww)
        return F.cross_entropy(logits.float(), tt)

    cf = torch.compile(head)

    def control_step():
        ph.grad = None
        pw.grad = None
        loss = cf(ph, xc, pw, tc)
        loss.backward()
        return loss

    t1 = time.perf_counter()
    loss_c = control_step()  # compiles
    torch.cuda.synchronize()
    res["control_compile_s"] = round(time.perf_counter() - t1, 1)
    res["control_gates"] = _gates(loss_c.detach(), ph.grad, pw.grad, ref, GATES_BF16)
    res["control_ms"] = statistics.median(events_ms(control_step, iters, warmup))
    # the control's peak: a fresh copy of its parameters and inputs, measured like the program's
    del run
    ph.grad = None
    pw.grad = None
    torch.cuda.synchronize()
    base_c = torch.cuda.memory_allocated()
    keep: dict = {}

    def control_setup_and_step():
        keep["h"] = hh = ph.detach().clone().requires_grad_()
        keep["w"] = ww = pw.detach().clone().requires_grad_()
        keep["x"], keep["t"] = xc.clone(), tc.clone()
        cf(hh, keep["x"], ww, keep["t"]).backward()

    res["control_peak_bytes"] = _peak(control_setup_and_step) - base_c
    res["speedup"] = res["control_ms"] / res["latch_ms"]
    return res


def format_rows(r: dict) -> list[str]:
    lines = [f"bench-lmhead {r['tokens']} x {r['d_model']} x {r['vocab']} on {r['device']} ({r['date']}): "
             f"program {r['tasks']} tasks, {r['phases']} phases, arena {r['arena_bytes'] / 1e6:.0f} MB; "
             f"logit-sized tensors {r['logit_sized_values']} (FP32: {r['f32_logit_sized'] or 'none'})"]
    lines.append(f"{'':9} {'group':18} {'rel L2':>9} {'gate':>7}  result")
    for who in ("latch", "control"):
        for n, e, gate, ok in r[f"{who}_gates"]:
            lines.append(f"{who:9} {n:18} {e:9.2e} {gate:7.0e}  {'ok' if ok else 'FAIL'}")
    lines.append(f"{'':9} {'ms fwd+bwd':>12} {'peak MB':>9}")
    lines.append(f"{'latch':9} {r['latch_ms']:12.3f} {r['latch_peak_bytes'] / 1e6:9.0f}")
    lines.append(f"{'compile':9} {r['control_ms']:12.3f} {r['control_peak_bytes'] / 1e6:9.0f}")
    ok = all(g[3] for g in r["latch_gates"]) and not r["f32_logit_sized"]
    lines.append(f"LMHEAD {'PASS' if ok else 'FAIL'}: latch {r['latch_ms']:.3f} ms vs torch.compile "
                 f"{r['control_ms']:.3f} ms ({r['speedup']:.2f}x), peak {r['latch_peak_bytes'] / 1e6:.0f} MB vs "
                 f"{r['control_peak_bytes'] / 1e6:.0f} MB")
    return lines


@click.command("bench-lmhead")
@click.option("--tokens", default=2048, show_default=True)
@click.option("--d-model", default=768, show_default=True)
@click.option("--vocab", default=49152, show_default=True)
@click.option("--iters", default=20, show_default=True)
@click.option("--warmup", default=3, show_default=True)
@click.option("--dir", "build_dir", default="build/bench-lmhead", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="also write the result here")
@click.option("--example", default=str(ROOT_EXAMPLE), show_default=True, type=click.Path(dir_okay=False),
              help="the LM-head example file")
def bench_lmhead_command(tokens, d_model, vocab, iters, warmup, build_dir, json_path, example):
    """Time the fused LM head + cross-entropy (forward + backward) in the kernel against torch.compile's."""
    r = run_bench(tokens, d_model, vocab, iters, warmup, build_dir, say=click.echo, example=Path(example))
    for line in format_rows(r):
        click.echo(line)
    if json_path:
        Path(json_path).write_text(json.dumps(r, indent=1))
    if not all(g[3] for g in r["latch_gates"]) or r["f32_logit_sized"]:
        raise SystemExit(1)
