"""Attention as Latch tasks inside the persistent kernel, against torch's flash SDPA in a CUDA graph.

    latch-pipeline bench-attention                 # the four cases of issue 10
    latch-pipeline bench-attention --only gqa --iters 5
    latch-pipeline bench-attention --forward mma,wgmma   # both forward bodies, a row each
    latch-pipeline bench-attention --backward mma,wgmma  # both backward bodies (wgmma forward), a row each
    latch-pipeline bench-attention --backward wgmma,wgmma2  # the backward without / with the overlap

Each case (batch, query heads, key/value heads, sequence, head dim; causal) becomes two programs
of ONE build: ``<case>.fwd`` (``latch::sdpa``: out and lse) and ``<case>.fwdbwd`` (``latch::sdpa``
then ``latch::sdpa_backward`` with ``grad_out`` a batch input: dq, dk, dv). Operands and outputs
are BF16 (lse FP32), ``operand_dtype`` bf16, as the numerical policy gives a model's attention.

- **Gate**: every output against the FP64 reference (latch_ops.attention's math) of the same BF16
  operands, relative L2 <= ``REL_GATE``; torch's flash result against the same reference is
  printed beside it for scale (its error is the BF16 rounding of the outputs and of P).
- **Determinism**: ``<case>.fwdbwd`` runs twice on the same inputs; dq, dk, dv must be bitwise
  equal (no float atomics anywhere in the backward).
- **Time**: medians of CUDA-event timings of one launch of each program; the control is
  ``F.scaled_dot_product_attention`` (flash backend; forward, and forward + backward through
  autograd) captured in one CUDA graph and replayed, on the same tensors.

The document is built without torch (``attention_document``), so CI schedules, plans, validates
and compiles it (tests/test_bench_attention.py); the timing needs the GPU.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Iterable

import attrs
import click

from latch_core.document import Document
from latch_core.ir import BATCH, Graph, GraphSection, Group, Node, Value

# BF16 outputs carry ~2^-9 relative rounding per element (~1.1e-3 in relative L2) and P is rounded
# to BF16 before P @ V as flash attention does: torch's flash SDPA measures 2-4e-3 against FP64 on
# these cases. A wrong tile, mask or group gives O(1e-1..1).
REL_GATE = 1e-2
B2B = 5  # launches per sample of the back-to-back timings


@attrs.frozen
class Case:
    name: str
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool = True

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seq, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.kv_heads, self.seq, self.head_dim)

    def flops(self, backward: bool = False) -> float:
        """Matrix-product flops as flash attention counts them: 4 B H T^2 D forward (half under
        causal), 2.5x that for the backward."""
        f = 4.0 * self.batch * self.heads * self.seq * self.seq * self.head_dim
        if self.causal:
            f /= 2
        return f * (3.5 if backward else 1.0)


CASES = (
    Case("b2h12s1024d64", 2, 12, 12, 1024, 64),
    Case("b32h12s1024d64", 32, 12, 12, 1024, 64),
    Case("b2h16s4096d128", 2, 16, 16, 4096, 128),
    Case("gqa.b2h32kv8s2048d128", 2, 32, 8, 2048, 128),
)


def _programs(c: Case, dtype: str = "bf16", glse: bool = False, body: str | None = None,
              operand: str | None = None, fwd_body: str | None = None, bwd_body: str | None = None) -> list[Graph]:
    """``body`` goes on both nodes (``attention_body``); ``fwd_body`` on the forward node only,
    ``bwd_body`` on the backward node only (each overrides ``body`` there)."""
    q, k, v, go, gl = (f"{c.name}.{n}" for n in ("q", "k", "v", "go", "glse"))
    attrs_ = {"causal": c.causal, "scale": c.scale}
    if body:
        attrs_["attention_body"] = body
    if dtype in ("bf16", "f16"):
        attrs_["operand_dtype"] = dtype
    elif operand:  # e.g. FP32 values under the BF16 policy, as in a captured model
        attrs_["operand_dtype"] = operand
    stat = "f32" if dtype in ("bf16", "f16") else dtype
    ins = [Value(q, c.q_shape, dtype, BATCH), Value(k, c.kv_shape, dtype, BATCH), Value(v, c.kv_shape, dtype, BATCH)]
    progs = []
    for kind in ("fwd", "fwdbwd"):
        p = f"{c.name}.{kind}"
        out, lse = f"{p}.out", f"{p}.lse"
        values = list(ins) + [Value(out, c.q_shape, dtype), Value(lse, c.q_shape[:3], stat)]
        fattrs = dict(attrs_, attention_body=fwd_body) if fwd_body else attrs_
        nodes = [Node(f"{p}.sdpa", "latch::sdpa", (q, k, v), (out, lse), fattrs, source=f"bench_attention {c.name}")]
        outs: tuple = (out, lse)
        batch = (q, k, v)
        if kind == "fwdbwd":
            dq, dk, dv = f"{p}.dq", f"{p}.dk", f"{p}.dv"
            values += [Value(go, c.q_shape, dtype, BATCH), Value(dq, c.q_shape, dtype), Value(dk, c.kv_shape, dtype),
                       Value(dv, c.kv_shape, dtype)]
            if glse:
                values.append(Value(gl, c.q_shape[:3], stat, BATCH))
            battrs = dict(attrs_, attention_body=bwd_body) if bwd_body else attrs_
            nodes.append(Node(f"{p}.sdpa_backward", "latch::sdpa_backward", (go, gl if glse else None, q, k, v, out, lse),
                              (dq, dk, dv), battrs, source=f"bench_attention {c.name}"))
            outs = (out, dq, dk, dv)
            batch = (q, k, v, go) + ((gl,) if glse else ())
        progs.append(Graph(p, values, nodes, (Group("batch", batch),), (Group("metrics", outs),)))
    return progs


def attention_document(case_list: Iterable[Case], dtype: str = "bf16", glse: bool = False,
                       body: str | None = None, fwd_body: str | None = None, bwd_body: str | None = None) -> Document:
    """Per case ``<case>.fwd`` and ``<case>.fwdbwd`` (see the module docstring); ``glse``: the
    backward also takes a gradient of lse (a batch input ``<case>.glse``); ``body="simt"`` forces
    the SIMT bodies (attribute ``attention_body``); ``fwd_body`` ("mma", "wgmma") the forward's body
    (the forward node only), ``bwd_body`` ("mma", "wgmma", "wgmma2") the backward's. With ``fwd_body`` other
    than "mma", each case is named ``<case>-<fwd_body>``, with ``bwd_body`` other than "mma"
    ``...-b<bwd_body>`` (:func:`variant`), so one document can hold every body pair of a case."""
    if fwd_body or bwd_body:
        case_list = [variant(c, fwd_body or "mma", bwd_body or "mma") for c in case_list]
    progs = [p for c in case_list for p in _programs(c, dtype, glse, body, fwd_body=fwd_body, bwd_body=bwd_body)]
    return Document(graph=GraphSection(progs, (), {"example": "bench_attention"}))


def head_dim_documents(case_list: Iterable[Case], bodies: tuple = ("mma",)):
    """(head dim, its cases, its document with every body in ``bodies``: forward bodies, or (forward,
    backward) pairs), one per head dim:
    with wgmma forwards of both head dims inlined in one kernel, ptxas serialises every wgmma
    (C7511, "insufficient register resources"; results/fa.md), so each head dim is its own build."""
    case_list = list(case_list)
    for d in sorted({c.head_dim for c in case_list}):
        group = [c for c in case_list if c.head_dim == d]
        progs = [g for b in bodies for g in attention_document(
            group, fwd_body=_pair(b)[0], bwd_body=_pair(b)[1]).graph.programs]
        yield d, group, Document(graph=GraphSection(progs, (), {"example": "bench_attention"}))


def plan_document(doc: Document, num_sms: int) -> Document:
    """Schedule (barrier strategy), plan memory and validate (the pipeline's passes)."""
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    passes = registries().passes
    doc = run_pass(passes.get("schedule"), doc, scheduler="barrier", num_sms=num_sms)
    doc = run_pass(passes.get("memory.plan"), doc)
    return run_pass(passes.get("schedule.validate"), doc)


def task_counts(doc: Document, program: str) -> dict[str, tuple[int, float]]:
    """Per op in ``program``'s schedule: (tasks, the longest task's estimated microseconds)."""
    sched = next(p for p in doc.schedule.programs if p.program == program)
    g = doc.graph.program(program)
    op_of = {n.name: n.op for n in g.nodes}
    group_op = {grp.id: op_of[grp.nodes[0]] for grp in sched.groups}
    counts: dict[str, tuple[int, float]] = {}
    for t in sched.tasks:
        op = group_op[t.group]
        n, worst = counts.get(op, (0, 0.0))
        counts[op] = (n + 1, max(worst, 1e6 * t.cost))
    return counts


# --------------------------------------------------------------------------------------------
# On the GPU

def make_inputs(c: Case, device, seed: int, dtype=None) -> dict:
    import torch

    dtype = dtype or torch.bfloat16
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda s: torch.randn(s, device=device, generator=g, dtype=torch.float32).to(dtype)  # noqa: E731
    return {f"{c.name}.q": mk(c.q_shape), f"{c.name}.k": mk(c.kv_shape), f"{c.name}.v": mk(c.kv_shape),
            f"{c.name}.go": mk(c.q_shape),
            f"{c.name}.glse": torch.randn(c.q_shape[:3], device=device, generator=g, dtype=torch.float32).to(
                torch.float64 if dtype == torch.float64 else torch.float32)}


def reference(c: Case, ins: dict, glse: bool = False) -> dict:
    """FP64 out, dq, dk, dv of the same operands (latch_ops.attention's math, chunked by batch)."""
    import torch

    from latch_ops.attention import sdpa_backward_math, sdpa_forward_math

    res: dict = {"out": [], "dq": [], "dk": [], "dv": []}
    for b in range(c.batch):
        q, k, v, go, gl = (ins[f"{c.name}.{n}"][b:b + 1].double() for n in ("q", "k", "v", "go", "glse"))
        out, lse = sdpa_forward_math(q, k, v, c.causal, c.scale)
        dq, dk, dv = sdpa_backward_math(go, gl if glse else None, q, k, v, out, lse, c.causal, c.scale)
        for key, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            res[key].append(t)
        del q, k, v, go, out, lse, dq, dk, dv
    return {key: torch.cat(ts) for key, ts in res.items()}


def rel_l2(got, ref) -> float:
    return (got.double() - ref).norm().item() / max(ref.norm().item(), 1e-30)


def _torch_flash(c: Case, ins: dict):
    """(forward fn, forward+backward fn, a note) of torch's flash SDPA on the case's tensors."""
    import torch
    import torch.nn.functional as F

    q = ins[f"{c.name}.q"].detach().requires_grad_()
    k = ins[f"{c.name}.k"].detach().requires_grad_()
    v = ins[f"{c.name}.v"].detach().requires_grad_()
    go = ins[f"{c.name}.go"]
    gqa = c.kv_heads != c.heads
    flash = [torch.nn.attention.SDPBackend.FLASH_ATTENTION]
    repeat = False

    def fwd():
        with torch.nn.attention.sdpa_kernel(flash):
            if repeat:  # this torch's flash kernel takes no grouped k/v: repeat them (autograd sums back)
                kk, vv = k.repeat_interleave(c.heads // c.kv_heads, 1), v.repeat_interleave(c.heads // c.kv_heads, 1)
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=c.causal, scale=c.scale)
            return F.scaled_dot_product_attention(q, k, v, is_causal=c.causal, scale=c.scale, enable_gqa=gqa)

    def fwdbwd():
        out = fwd()
        return torch.autograd.grad(out, (q, k, v), go)

    if gqa:
        try:
            fwdbwd()
        except RuntimeError:
            repeat = True
    return fwd, fwdbwd, ("flash, k/v repeated" if repeat else "flash")


def check_case(prog, c: Case, ins: dict, ref: dict, glse: bool = False) -> tuple[dict, bool]:
    """(relative L2 of out, dq, dk, dv against ``ref``, whether a second run of ``<case>.fwdbwd``
    gave the same bits)."""
    import torch

    fb = f"{c.name}.fwdbwd"
    batch = {k: v for k, v in ins.items() if glse or not k.endswith(".glse")}
    names = {"out": f"{fb}.out", "dq": f"{fb}.dq", "dk": f"{fb}.dk", "dv": f"{fb}.dv"}
    prog.launch(fb, batch=batch)
    prog.check()
    got = prog.outputs(fb, batch=batch)
    first = {key: got[n].clone() for key, n in names.items()}
    prog.launch(fb, batch=batch)
    prog.check()
    again = prog.outputs(fb, batch=batch)
    identical = all(torch.equal(first[key], again[n]) for key, n in names.items())
    return {key: rel_l2(first[key], ref[key]) for key in names}, identical


FORWARD_BODIES = ("mma", "wgmma")  # --forward: the mma.sync forward, the wgmma/TMA one (the default)
# --backward: mma.sync, the wgmma/TMA one (the default), its variant with the elementwise work
# overlapped with the products inside a warpgroup (the same bits as wgmma)
BACKWARD_BODIES = ("mma", "wgmma", "wgmma2")


def _pair(body) -> tuple[str, str]:
    """(forward body, backward body) of a forward body name or a pair."""
    return (body, "mma") if isinstance(body, str) else tuple(body)


def variant(c: Case, body: str, bwd_body: str = "mma") -> Case:
    """The case as the document names it for forward body ``body`` and backward body ``bwd_body``
    (``attention_document``)."""
    name = c.name + ("" if body == "mma" else f"-{body}") + ("" if bwd_body == "mma" else f"-b{bwd_body}")
    return attrs.evolve(c, name=name) if name != c.name else c


def run_case(prog, c: Case, iters: int, seed: int, bodies: tuple = ("mma",)) -> list[dict]:
    """One row per body in ``bodies`` (forward bodies, or (forward, backward) pairs): the same inputs,
    FP64 reference and torch control."""
    import torch

    from .timing import capture_graph, events_ms, host_us, median_ms

    b2b = lambda fn: statistics.median(events_ms(fn, iters, warmup=1, reps=B2B))  # noqa: E731

    dev = prog.device
    ins = make_inputs(c, dev, seed)
    ref = reference(c, ins)
    checked = {}
    for body in bodies:
        v = variant(c, *_pair(body))
        vins = {f"{v.name}.{k[len(c.name) + 1:]}": t for k, t in ins.items()}
        checked[body] = (v, vins, check_case(prog, v, vins, ref))
    fwd, fwdbwd, control = _torch_flash(c, ins)
    t_out = fwd()
    t_grads = fwdbwd()
    torch_errs = {"out": rel_l2(t_out, ref["out"]), "dq": rel_l2(t_grads[0], ref["dq"]),
                  "dk": rel_l2(t_grads[1], ref["dk"]), "dv": rel_l2(t_grads[2], ref["dv"])}
    del ref, t_out, t_grads
    torch.cuda.empty_cache()
    gf, gb = capture_graph(fwd, warmup=2), capture_graph(fwdbwd, warmup=2)
    tf = median_ms(gf.replay, iters)
    tb = median_ms(gb.replay, iters)
    tf5, tb5 = b2b(gf.replay), b2b(gb.replay)
    th = host_us(gf.replay, iters)
    rows = []
    for body in bodies:
        v, vins, (errs, identical) = checked[body]
        fwd_ins = {k: t for k, t in vins.items() if k.split(".")[-1] in ("q", "k", "v")}
        bwd_ins = {k: t for k, t in vins.items() if not k.endswith(".glse")}
        lf = median_ms(lambda: prog.launch(f"{v.name}.fwd", batch=fwd_ins), iters, warmup=1)
        lb = median_ms(lambda: prog.launch(f"{v.name}.fwdbwd", batch=bwd_ins), iters, warmup=1)
        lf5 = b2b(lambda: prog.launch(f"{v.name}.fwd", batch=fwd_ins))
        lb5 = b2b(lambda: prog.launch(f"{v.name}.fwdbwd", batch=bwd_ins))
        lh = host_us(lambda: prog.launch(f"{v.name}.fwd", batch=fwd_ins), iters)
        lr = host_us(prog.launcher(f"{v.name}.fwd", batch=fwd_ins), iters)
        # the same launches replayed from a CUDA graph, as the control is (the epoch is on the device)
        lgf = capture_graph(lambda: prog.launch(f"{v.name}.fwd", batch=fwd_ins), warmup=1)
        lgb = capture_graph(lambda: prog.launch(f"{v.name}.fwdbwd", batch=bwd_ins), warmup=1)
        lfg, lbg = median_ms(lgf.replay, iters), median_ms(lgb.replay, iters)
        prog.check()
        ok = identical and all(e <= REL_GATE for e in errs.values())
        rows.append({"case": v.name, "forward_body": _pair(body)[0], "backward_body": _pair(body)[1],
                     "batch": c.batch, "heads": c.heads,
                     "kv_heads": c.kv_heads, "seq": c.seq, "head_dim": c.head_dim, "causal": c.causal,
                     "control": control, "rel_l2": errs, "torch_rel_l2": torch_errs, "bitwise_repeat": identical,
                     "latch_fwd_ms": lf, "latch_fwdbwd_ms": lb, "torch_fwd_ms": tf, "torch_fwdbwd_ms": tb,
                     "fwd_ratio": tf / lf, "fwdbwd_ratio": tb / lb, "latch_fwd_tflops": c.flops() / lf / 1e9,
                     "latch_fwdbwd_tflops": c.flops(True) / lb / 1e9, "ok": ok,
                     # B2B launches between two events: the host's work for one launch overlaps the
                     # GPU's for the one before (the kernel's own time where the host is the gap)
                     "latch_fwd_b2b_ms": lf5, "latch_fwdbwd_b2b_ms": lb5, "torch_fwd_b2b_ms": tf5,
                     "torch_fwdbwd_b2b_ms": tb5, "fwd_b2b_ratio": tf5 / lf5, "fwdbwd_b2b_ratio": tb5 / lb5,
                     # host time per call (the forward's launch; torch's graph replay): the host's share
                     # of the alone - back-to-back gap, the rest is the device's launch latency
                     "latch_fwd_host_us": lh, "latch_fwd_launcher_host_us": lr, "torch_fwd_host_us": th,
                     "latch_fwd_graph_ms": lfg, "latch_fwdbwd_graph_ms": lbg,
                     "fwd_graph_ratio": tf / lfg, "fwdbwd_graph_ratio": tb / lbg})
    return rows


def _pair_line(r: dict, latch: str, torch: str, ratio: str) -> str:
    """One row's forward and f+b figures of one kind: latch_{fwd,fwdbwd}_<latch> against
    torch_{fwd,fwdbwd}_<torch>, and {fwd,fwdbwd}_<ratio>."""
    return (f"  {r['case']:<34} fwd {r['latch_fwd_' + latch]:7.3f} ms (torch {r['torch_fwd_' + torch]:.3f}) "
            f"{100 * r['fwd_' + ratio]:6.1f}%   f+b {r['latch_fwdbwd_' + latch]:7.3f} ms "
            f"(torch {r['torch_fwdbwd_' + torch]:.3f}) {100 * r['fwdbwd_' + ratio]:6.1f}%")


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':<36} {'worst rel L2':>12} {'torch':>9} {'bits':>5} {'fwd ms':>9} {'torch':>8} {'ratio':>7} "
            f"{'f+b ms':>9} {'torch':>8} {'ratio':>7} {'f+b TF':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        w = max(r["rel_l2"].values())
        tw = max(r["torch_rel_l2"].values())
        lines.append(f"{r['case']:<36} {w:12.2e} {tw:9.2e} {'same' if r['bitwise_repeat'] else 'DIFF':>5} "
                     f"{r['latch_fwd_ms']:9.3f} {r['torch_fwd_ms']:8.3f} {100 * r['fwd_ratio']:6.1f}% "
                     f"{r['latch_fwdbwd_ms']:9.3f} {r['torch_fwdbwd_ms']:8.3f} {100 * r['fwdbwd_ratio']:6.1f}% "
                     f"{r['latch_fwdbwd_tflops']:7.1f}{'' if r['ok'] else '  WRONG'}")
    b2b = [r for r in rows if "latch_fwd_b2b_ms" in r]
    if b2b:
        lines.append(f"back to back ({B2B} launches between two CUDA events; the host's work for one overlaps the GPU's "
                     f"for the one before):")
        for r in b2b:
            lines.append(_pair_line(r, "b2b_ms", "b2b_ms", "b2b_ratio"))
    graph = [r for r in rows if "latch_fwd_graph_ms" in r]
    if graph:
        lines.append("alone, both replayed from a CUDA graph (the control's own terms):")
        for r in graph:
            lines.append(_pair_line(r, "graph_ms", "ms", "graph_ratio"))
    host = [r for r in rows if "latch_fwd_host_us" in r]
    if host:
        lines.append("host time per forward call (perf_counter over 20 calls the GPU queue absorbs), and the "
                     "alone - back-to-back gap it is part of:")
        for r in host:
            gap = 1e3 * (r["latch_fwd_ms"] - r["latch_fwd_b2b_ms"])
            tgap = 1e3 * (r["torch_fwd_ms"] - r["torch_fwd_b2b_ms"])
            pre = (f" (prepared launcher {r['latch_fwd_launcher_host_us']:.1f} us)"
                   if "latch_fwd_launcher_host_us" in r else "")
            lines.append(f"  {r['case']:<34} latch launch {r['latch_fwd_host_us']:6.1f} us{pre} (gap {gap:5.1f} us)   "
                         f"torch graph replay {r['torch_fwd_host_us']:6.1f} us (gap {tgap:5.1f} us)")
    for r in rows:
        if r.get("control", "flash") != "flash":
            lines.append(f"  {r['case']}: control is torch {r['control']}")
    return "\n".join(lines)


@click.command("bench-attention")
@click.option("--only", default=None, help="keep cases whose name contains this (e.g. gqa, d128)")
@click.option("--dir", "build_dir", default="build/bench-attention", show_default=True, type=click.Path(file_okay=False))
@click.option("--iters", default=5, show_default=True)
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="also write the rows here")
@click.option("--forward", "forward", default="wgmma", show_default=True,
              help="forward bodies to time, comma-separated: wgmma (the default: TMA + wgmma through the worker's "
                   "ring), mma (mma.sync); each is a row of its own on the same inputs")
@click.option("--backward", "backward", default="wgmma", show_default=True,
              help="backward bodies to time, comma-separated: wgmma (the default: TMA + wgmma through the "
                   "worker's ring), wgmma2 (the same with its elementwise work overlapped with the products), "
                   "mma (mma.sync); each forward x backward pair is a row of its own")
def bench_attention_command(only, build_dir, iters, json_path, forward, backward):
    """Time latch::sdpa (forward, forward + backward) as Latch tasks against torch's flash SDPA."""
    import json

    import torch

    from latch_codegen_h100 import Program, build

    bodies = tuple(b.strip() for b in forward.split(",") if b.strip())
    bad_body = [b for b in bodies if b not in FORWARD_BODIES]
    if bad_body or not bodies:
        raise click.ClickException(f"--forward {forward!r}: each entry must be one of {FORWARD_BODIES}")
    bwd = tuple(b.strip() for b in backward.split(",") if b.strip())
    if not bwd or [b for b in bwd if b not in BACKWARD_BODIES]:
        raise click.ClickException(f"--backward {backward!r}: each entry must be one of {BACKWARD_BODIES}")
    bodies = tuple((f, b) for f in bodies for b in bwd)
    if not torch.cuda.is_available():
        raise click.ClickException("bench-attention runs on the GPU; torch sees no CUDA device")
    case_list = [c for c in CASES if only is None or only in c.name]
    if not case_list:
        raise click.ClickException(f"no case matches --only {only!r}; cases: {[c.name for c in CASES]}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, failed = [], []
    for d, group, doc in head_dim_documents(case_list, bodies):  # one build per head dim
        gdir = str(Path(build_dir) / f"d{d}")
        t0 = time.perf_counter()
        doc = plan_document(doc, sms)
        t1 = time.perf_counter()
        doc = build(doc, gdir)
        t2 = time.perf_counter()
        click.echo(f"bench-attention: head dim {d}: {len(group)} cases, plan {t1 - t0:.1f} s, build {t2 - t1:.1f} s "
                   f"({dict(doc.build.stats).get('cached')}; {dict(doc.build.stats).get('wgmma_warnings', 'no')} "
                   "wgmma warnings)")
        for c in group:
            for b in bodies:
                v = variant(c, *_pair(b))
                click.echo(f"  {v.name}: tasks {task_counts(doc, v.name + '.fwdbwd')}")
        prog = Program.load(gdir)
        for c in group:
            try:
                rows.extend(run_case(prog, c, iters, seed=case_list.index(c), bodies=bodies))
                click.echo(f"  {c.name}: done")
            except Exception as e:  # one failing case must not hide the others' numbers
                failed.append(c.name)
                click.echo(f"{c.name}: FAILED: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
        del prog
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    click.echo(format_table(rows))
    bad = [r["case"] for r in rows if not r["ok"]] + failed
    if bad:
        raise click.ClickException(f"wrong or failed: {bad}")


__all__ = ["Case", "CASES", "attention_document", "head_dim_documents", "plan_document", "bench_attention_command"]
