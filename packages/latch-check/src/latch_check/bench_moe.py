"""``latch-pipeline bench-moe``: TinyMoE-200M's expert layer (examples/moe_layer.py: router, top-2,
route_order, the three ragged SwiGLU products, combine; forward + backward + SGD) inside the
persistent kernel, against torch on the same weights and batch.

One process on the GPU, in this order:
1. the pipeline builds the example (``latch_check.pipeline.compile_example``);
2. FP64 gates: two updates against the FP64 reference (``gpu.gpu_compare``, the routing replayed);
3. determinism: the same update run twice from the same weights; every output (the loss, each
   expert-weight gradient, the new weights) must be bit-identical;
4. timing (CUDA events, median): the Latch program, and the control: the same layer in torch, graph
   safe (assignments sorted by expert on the device, each expert's rows padded to a multiple of 16
   inside one static buffer of T * k + 16 * E rows, ``torch._grouped_mm`` with device offsets, the
   (token, k) rows gathered back and summed in a fixed order, autograd backward, SGD), its whole
   update replayed from one CUDA graph (TARGETS.md's MoE control at the layer's scale).
The table is printed last; ``--json`` writes every figure.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import click

from .timing import capture_graph

EXAMPLE = "examples/moe_layer.py"  # relative to the repository root


def grouped_control(example, device) -> tuple[Any, dict]:
    """(step, tensors): the layer's update in torch with _grouped_mm, graph-safe; step() runs one."""
    import torch
    import torch.nn.functional as F

    model = example.model
    E, k = model.experts, model.top_k
    p = {n: t.detach().to(device).clone() for n, t in example.params().items()}
    x, target = (t.to(device) for t in example.microbatch(0))
    lr = float(example.hyper["lr"])
    T, d = x.shape
    P = T * k + 16 * E  # the static buffer: every segment padded to a multiple of 16

    def forward(w):
        probs = F.softmax(x @ w["router.weight"].t(), dim=-1)
        gates, expert = torch.topk(probs, k, dim=-1)
        gates = gates / gates.sum(dim=-1, keepdim=True)
        flat = expert.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        # a scatter-add of ones, not bincount: CUDA's bincount reads the maximum on the host (no graph)
        counts = torch.zeros(E, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
        padded = (counts + 15) // 16 * 16
        starts = torch.cumsum(padded, 0) - padded
        first = torch.cumsum(counts, 0) - counts
        sorted_e = flat[order]
        rank = torch.arange(T * k, device=device) - first[sorted_e]
        row = starts[sorted_e] + rank  # buffer row of each sorted pair
        ends = torch.cumsum(padded, 0).to(torch.int32)
        ends[-1] = P  # the last group absorbs the tail
        xs = torch.zeros(P, d, device=device, dtype=torch.bfloat16)
        xs = xs.index_copy(0, row, x.index_select(0, order // k).bfloat16())
        w1, w3, w2 = (w[n].bfloat16() for n in ("w1", "w3", "w2"))
        h = F.silu(torch._grouped_mm(xs, w1, offs=ends)) * torch._grouped_mm(xs, w3, offs=ends)
        ys = torch._grouped_mm(h, w2, offs=ends).float()
        pos = torch.empty_like(row).scatter_(0, order, row)  # buffer row of pair (n, s)
        y = ys.index_select(0, pos).view(T, k, d)
        return (y * gates.unsqueeze(-1)).sum(dim=1)

    def step():
        leaves = {n: t.detach().requires_grad_() for n, t in p.items()}
        with torch.enable_grad():
            loss = ((forward(leaves) - target) ** 2).mean()
            grads = torch.autograd.grad(loss, list(leaves.values()))
        with torch.no_grad():
            for (n, t), g in zip(p.items(), grads):
                t.sub_(lr * g)
        return loss.detach()

    return step, p


def run(example_path: str | Path = EXAMPLE, *, overrides: dict | None = None, build_dir: str | Path | None = None,
        iters: int = 50, say=print) -> dict[str, Any]:
    import torch

    from latch_capture.examples import load_example
    from .gpu import GpuRun, bench, gpu_compare
    from .timing import events_ms
    from .pipeline import compile_example

    if not torch.cuda.is_available():
        from latch_core.errors import UserError

        raise UserError("bench-moe: needs a CUDA GPU (torch sees none); run it on the H200")
    res: dict[str, Any] = {"example": str(example_path), "overrides": dict(overrides or {})}
    c = compile_example(example_path, overrides=overrides, build_dir=build_dir)
    res["build_s"] = round(sum(c.times.values()), 2)
    example = load_example(str(example_path), **dict(overrides or {}))
    cmp = gpu_compare(example, c.build_dir, steps=2)
    for t in cmp.tables:
        say(t.format() if hasattr(t, "format") else str(t))
    res["gates_passed"] = bool(cmp.passed)

    gr = GpuRun(example, c.build_dir)
    saved = {n: t.clone() for n, t in gr.layout.items()}
    outs = []
    for _ in range(2):
        for n, t in gr.layout.items():
            t.copy_(saved[n])
        o = gr.update(gr.batches(0))
        o.update({f"new:{n}": t.clone() for n, t in gr.layout.items()})
        outs.append({n: t.detach().clone() for n, t in o.items()})
    differ = sorted(n for n in outs[0] if not torch.equal(outs[0][n], outs[1][n]))
    res["bit_identical"] = not differ
    res["differing_outputs"] = differ
    res["expert_grads_compared"] = sorted(n for n in outs[0] if n.startswith("grad") and ".w" in n)

    b = bench(example, c.build_dir, iters=iters, eager=False)
    res["latch_ms"] = b["latch_ms"]
    res["latch_launches"] = b["launches_per_update"]
    step, _ = grouped_control(example, gr.device)
    g = capture_graph(step)
    res["torch_grouped_graph_ms"] = statistics.median(events_ms(g.replay, iters, 5))
    res["ratio_torch_over_latch"] = res["torch_grouped_graph_ms"] / res["latch_ms"]
    return res


def format_table(r: dict[str, Any]) -> str:
    rows = [("FP64 gates (2 updates)", "PASS" if r["gates_passed"] else "FAIL"),
            ("two runs bit-identical", "yes" if r["bit_identical"] else f"NO: {', '.join(r['differing_outputs'])}"),
            ("latch (one persistent kernel) ms", f"{r['latch_ms']:.3f}"),
            ("torch _grouped_mm, CUDA graph ms", f"{r['torch_grouped_graph_ms']:.3f}"),
            ("speed-up (torch / latch)", f"{r['ratio_torch_over_latch']:.2f}x")]
    w = max(len(a) for a, _ in rows)
    return "\n".join(["bench-moe: TinyMoE-200M expert layer, forward + backward + SGD"]
                     + [f"  {a:<{w}s}  {b}" for a, b in rows])


@click.command("bench-moe")
@click.option("--example", default=str(EXAMPLE), show_default=True, type=click.Path(dir_okay=False),
              help="the expert-layer example (TinyMoE-200M's shapes by default)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="an override of the example's build()")
@click.option("--dir", "build_dir", default="build/bench-moe", show_default=True, type=click.Path(file_okay=False))
@click.option("--iters", default=50, show_default=True)
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="also write the figures here")
def bench_moe_command(example, sets, build_dir, iters, json_path):
    """TinyMoE-200M's expert layer in the persistent kernel vs torch _grouped_mm in a CUDA graph (GPU):
    FP64 gates, two runs bit-identical, ms per update."""
    from latch_core.cli import parse_value

    overrides = {}
    for s in sets:
        key, eq, val = s.partition("=")
        if not eq:
            raise click.BadParameter(f"--set {s!r}: write KEY=VALUE, e.g. --set tokens=1024", param_hint="--set")
        overrides[key] = parse_value(val)
    r = run(example, overrides=overrides, build_dir=build_dir, iters=iters)
    if json_path:
        Path(json_path).write_text(json.dumps(r, indent=1, default=str))
    print(format_table(r))
    if not (r["gates_passed"] and r["bit_identical"]):
        raise SystemExit(1)
