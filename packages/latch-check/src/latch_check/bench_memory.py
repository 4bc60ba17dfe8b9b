"""Bandwidth-bound bodies as Latch tasks inside the persistent kernel, against their bytes floor.

    latch-pipeline bench-memory                       # clip + AdamW over TinyMoE-200M, and the row/elementwise bodies
    latch-pipeline bench-memory --only adamw --json out.json

What runs, all programs of ONE build (the document is built without torch: :func:`memory_document`,
so CI schedules, plans, validates and compiles it):

- ``clip_adamw``: the global-norm clip and AdamW with weight decay over TinyMoE-200M's 207,729,408
  parameters (their real shapes: :func:`tinymoe_shapes`), op for op what ``examples/_optim.py``'s
  ``adamw(max_norm=1.0)`` captures: each gradient's sum of squares (two levels, the square fused
  into the first: latch-schedule ``split`` and ``fusion``), the fixed-order sum of the 67 partial
  norms and the clip coefficient in one scalar task, then per parameter one fused pass reading
  p, g, m, v and the scalars (clip coefficient, bias corrections, decay) and writing p, m, v in
  place. Floor: 28 bytes per parameter (16 read, 12 written) at 4.27 TB/s.
- ``clip_adamw.bf16``: the same plus the BF16 copy of every new weight written by the same pass
  (sibling fusion; 30 bytes per parameter).
- ``grad_norm``: the clip's norm alone (4 bytes per parameter).
- row and elementwise bodies of the transformer update at 32 x 1024 tokens (d 768, SwiGLU hidden
  2048): residual add (also at an odd row length, which exercises the unaligned paths), cast to
  BF16, SwiGLU forward and backward, GELU forward and backward, the head split (reshape +
  permute), a select of a stacked QKV, a concatenation, RMSNorm forward and backward
  (weight gradient included), each as ``<body>.x1`` and
  ``<body>.x<R>`` (R independent copies on their own tensors, so nothing stays in the 60 MiB L2);
  time per body ``(t(xR) - t(x1)) / (R - 1)``. Floor: every input read once, every output written
  once, at 4.27 TB/s.

The control for the optimizer is torch's own: ``clip_grad_norm_(foreach=True)`` then
``torch.optim.AdamW(fused=True, capturable=True)`` over the same tensors, replayed from one CUDA
graph; both optimizer figures are ms per launch (replay) of several issued back to back
(:func:`back_to_back_ms`: the host's binding of ~270 tensors overlaps the previous launch, as in a
training loop), with one launch timed alone beside them in the JSON and under the table; for the other bodies, the same formula in eager torch ops on the same inputs (one copy),
replayed from a CUDA graph (its per-kernel overhead, ~1 us a kernel, is included). The optimizer's result is checked against FP64 (torch in float64, the same formula) before
timing: relative L2 of the new weights, both moments and the norm.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import attrs
import click

from latch_core.document import Document
from latch_core.ir import BATCH, HYPER, PARAM, STATE, Graph, GraphSection, Group, Node, Value

from .timing import capture_graph, events_ms, median_ms

HBM_BYTES_S = 4.27e12  # measured copy bandwidth of the H200 (TARGETS.md)
GOAL = 0.80  # of the bytes floor
TOKENS, D_MODEL, HIDDEN = 32 * 1024, 768, 2048
TINYMOE_PARAMS = 207_729_408
REL_GATE = 1e-5  # FP32 arithmetic against FP64: a wrong formula or index gives O(1e-2) and more
LR, BETAS, EPS, WD, MAX_NORM = 3e-4, (0.9, 0.999), 1e-8, 0.1, 1.0


def tinymoe_shapes(vocab: int = 49152, d: int = 768, layers: int = 8, experts: int = 16,
                   hidden: int = 512) -> list[tuple[str, tuple[int, ...]]]:
    """TinyMoE-200M's parameters in ``examples/tinymoe.py``'s order: the tied embedding, per layer
    two RMSNorm weights, the fused QKV and output projections, the router and three stacked expert
    weights, the final norm."""
    out = [("embed.weight", (vocab, d))]
    for i in range(layers):
        b = f"blocks.{i}"
        out += [(f"{b}.attn_norm.weight", (d,)), (f"{b}.attn.qkv.weight", (3 * d, d)),
                (f"{b}.attn.out.weight", (d, d)), (f"{b}.ffn_norm.weight", (d,)),
                (f"{b}.ffn.router.weight", (experts, d)), (f"{b}.ffn.w1", (experts, d, hidden)),
                (f"{b}.ffn.w3", (experts, d, hidden)), (f"{b}.ffn.w2", (experts, hidden, d))]
    return out + [("norm.weight", (d,))]


class _B:
    """A tiny graph builder: values and nodes with fresh names."""

    def __init__(self, prefix: str):
        self.prefix, self.values, self.nodes, self.k = prefix, [], [], 0

    def value(self, name: str, shape, dtype: str = "f32", role: str = "intermediate") -> str:
        self.values.append(Value(name, tuple(shape), dtype, role))
        return name

    def op(self, op: str, inputs, shape, attrs_=None, dtype: str = "f32", name: str | None = None) -> str:
        self.k += 1
        out = name or f"{self.prefix}.t{self.k}"
        self.value(out, shape, dtype)
        self.nodes.append(Node(f"{out}.node" if name else f"{self.prefix}.n{self.k}", f"latch::{op}", tuple(inputs),
                               (out,), dict(attrs_ or {}), source=f"bench_memory {self.prefix}"))
        return out


def adamw_program(name: str, shapes, *, clip: float | None = MAX_NORM, bf16_copy: bool = False,
                  norm_only: bool = False) -> Graph:
    """Clip + AdamW as ``examples/_optim.py`` writes it (its captured op sequence), over ``shapes``."""
    b1, b2 = BETAS
    b = _B(name)
    params = [b.value(n, s, role=PARAM) for n, s in shapes]
    grads = [b.value(f"grad.{n}", s, role=BATCH) for n, s in shapes]
    m_in = [b.value(f"exp_avg.{n}", s, role=STATE) for n, s in shapes]
    v_in = [b.value(f"exp_avg_sq.{n}", s, role=STATE) for n, s in shapes]
    step = b.value("step", (), role=STATE)
    lr = b.value("lr", (), role=HYPER)
    coef, metrics = None, []
    if clip is not None or norm_only:
        total = None
        for (n, s), g in zip(shapes, grads):
            sq = b.op("mul", (g, g), s)
            part = b.op("sum", (sq,), (), {"accum_dtype": "f32", "dims": tuple(range(len(s))), "keepdim": False})
            total = part if total is None else b.op("add", (total, part), ())
        norm = b.op("sqrt", (total,), (), name="metric.grad_norm")
        metrics.append(norm)
        if not norm_only:
            r = b.op("reciprocal", (b.op("add", (norm,), (), {"scalar": 1e-6}),), ())
            if clip != 1.0:
                r = b.op("mul", (r,), (), {"scalar": float(clip)})
            coef = b.op("clamp", (r,), (), {"max": 1.0})
    outs_p, outs_s, inplace = [], [], []
    if not norm_only:
        new_step = b.op("add", (step,), (), {"scalar": 1.0}, name="new.step")
        bias1 = b.op("sub", (b.op("pow", (new_step,), (), {"scalar": b1, "scalar_first": True}),), (),
                     {"scalar": 1.0, "scalar_first": True})
        bias2 = b.op("sub", (b.op("pow", (new_step,), (), {"scalar": b2, "scalar_first": True}),), (),
                     {"scalar": 1.0, "scalar_first": True})
        step_size = b.op("div", (lr, bias1), ())
        outs_s.append(new_step)
        inplace.append((new_step, step))
        news_m, news_v = [], []
        for (n, s), p, g, m, v in zip(shapes, params, grads, m_in, v_in):
            if coef is not None:
                g = b.op("mul", (g, coef), s)
            m2 = b.op("add", (m, b.op("mul", (b.op("sub", (g, m), s),), s, {"scalar": 1 - b1})), s,
                      name=f"new.exp_avg.{n}")
            v2 = b.op("add", (b.op("mul", (v,), s, {"scalar": b2}),
                              b.op("mul", (b.op("mul", (g,), s, {"scalar": 1 - b2}), g), s)), s, name=f"new.exp_avg_sq.{n}")
            decay = b.op("sub", (b.op("mul", (lr,), (), {"scalar": WD}),), (), {"scalar": 1.0, "scalar_first": True})
            pd = b.op("mul", (p, decay), s)
            denom = b.op("add", (b.op("div", (b.op("sqrt", (v2,), s), b.op("sqrt", (bias2,), ())), s),), s,
                         {"scalar": EPS})
            p2 = b.op("sub", (pd, b.op("div", (b.op("mul", (step_size, m2), s), denom), s)), s, name=f"new.{n}")
            outs_p.append(p2)
            news_m.append(m2)
            news_v.append(v2)
            inplace += [(p2, p), (m2, m), (v2, v)]
            if bf16_copy:
                metrics.append(b.op("cast", (p2,), s, {"dtype": "bf16"}, dtype="bf16", name=f"bf16.{n}"))
        outs_s += news_m + news_v
    inputs = [Group("params", params), Group("state", [step] + m_in + v_in), Group("batch", grads), Group("hyper", [lr])]
    if norm_only:
        inputs = [Group("batch", grads)]
        b.values = [v for v in b.values if v.name in set(grads) or v.role == "intermediate"]
    outputs = [Group(k, v) for k, v in (("new_params", outs_p), ("new_state", outs_s), ("metrics", metrics)) if v]
    return Graph(name, b.values, b.nodes, inputs, outputs, inplace if not norm_only else ())


# --------------------------------------------------------------------------------------------
# The row and elementwise bodies of the transformer update

@attrs.frozen
class Body:
    name: str
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype)
    build: object  # (builder, {input name: value}) -> {output name: value}
    read: float = 1.0  # the share of the inputs' bytes the body must read (a select reads one slice)

    def floor_bytes(self, outs: dict[str, tuple[tuple[int, ...], str]]) -> int:
        size = {"f32": 4, "bf16": 2}
        return (round(self.read * sum(math.prod(s) * size[d] for _, s, d in self.inputs))
                + sum(math.prod(s) * size[d] for s, d in outs.values()))


def _rmsnorm_fwd(b, x, w, T=TOKENS, d=D_MODEL):
    ms = b.op("mean", (b.op("mul", (x, x), (T, d)),), (T, 1), {"dims": (1,), "keepdim": True})
    r = b.op("rsqrt", (b.op("add", (ms,), (T, 1), {"scalar": 1e-6}),), (T, 1))
    return {"y": b.op("mul", (b.op("mul", (x, r), (T, d)), w), (T, d))}


def _rmsnorm_bwd(b, x, w, dy, T=TOKENS, d=D_MODEL):
    """dx = r * (dy * w) - x * r^3 * mean(dy * w * x), dw = sum_rows(dy * x * r), r = rsqrt(mean(x^2) + eps)."""
    ms = b.op("mean", (b.op("mul", (x, x), (T, d)),), (T, 1), {"dims": (1,), "keepdim": True})
    r = b.op("rsqrt", (b.op("add", (ms,), (T, 1), {"scalar": 1e-6}),), (T, 1))
    gw = b.op("mul", (dy, w), (T, d))
    s = b.op("mean", (b.op("mul", (gw, x), (T, d)),), (T, 1), {"dims": (1,), "keepdim": True})
    r3s = b.op("mul", (b.op("mul", (b.op("mul", (r, r), (T, 1)), r), (T, 1)), s), (T, 1))
    dx = b.op("sub", (b.op("mul", (gw, r), (T, d)), b.op("mul", (x, r3s), (T, d))), (T, d))
    dw = b.op("sum", (b.op("mul", (b.op("mul", (dy, x), (T, d)), r), (T, d)),), (d,), {"dims": (0,), "keepdim": False})
    return {"dx": dx, "dw": dw}


def bodies(T: int = TOKENS, d: int = D_MODEL, h: int = HIDDEN) -> list[Body]:
    f32 = "f32"
    return [
        Body("residual_add", (("x", (T, d), f32), ("y", (T, d), f32)), lambda b, v: {"o": b.op("add", (v["x"], v["y"]), (T, d))}),
        Body("cast_bf16", (("x", (T, d), f32),),
             lambda b, v: {"o": b.op("cast", (v["x"],), (T, d), {"dtype": "bf16"}, dtype="bf16")}),
        Body("swiglu.fwd", (("a", (T, h), f32), ("c", (T, h), f32)),
             lambda b, v: {"o": b.op("mul", (b.op("silu", (v["a"],), (T, h)), v["c"]), (T, h))}),
        Body("swiglu.bwd", (("a", (T, h), f32), ("c", (T, h), f32), ("do", (T, h), f32)),
             lambda b, v: {"da": b.op("silu_backward", (b.op("mul", (v["do"], v["c"]), (T, h)), v["a"]), (T, h)),
                           "dc": b.op("mul", (v["do"], b.op("silu", (v["a"],), (T, h))), (T, h))}),
        Body("gelu.fwd", (("x", (T, 4 * d), f32),),
             lambda b, v: {"o": b.op("gelu", (v["x"],), (T, 4 * d), {"approximate": "tanh"})}),
        Body("gelu.bwd", (("dy", (T, 4 * d), f32), ("x", (T, 4 * d), f32)),
             lambda b, v: {"dx": b.op("gelu_backward", (v["dy"], v["x"]), (T, 4 * d), {"approximate": "tanh"})}),
        # an odd row length: tiles start at unaligned elements, so the vector path, its tail and the
        # element-wise fallback all run (a correctness case more than a speed one)
        Body("residual_add.odd", (("x", (T // 8 + 3, d - 1), f32), ("y", (T // 8 + 3, d - 1), f32)),
             lambda b, v: {"o": b.op("add", (v["x"], v["y"]), (T // 8 + 3, d - 1))}),
        # the view bodies of attention's plumbing (the general fused body's vector/ILP path, and
        # concat's): the head split (reshape + permute to (B, H, S, Dh)), the middle third of a
        # stacked QKV, the concatenation of two halves
        Body("heads.permute", (("x", (T, d), f32),),
             lambda b, v: {"o": b.op("permute", (b.op("reshape", (v["x"],), (2, T // 2, d // 64, 64),
                                                      {"shape": (2, T // 2, d // 64, 64)}),),
                                     (2, d // 64, T // 2, 64), {"perm": (0, 2, 1, 3)})}),
        Body("qkv.select", (("qkv", (3, T, d), f32),),
             lambda b, v: {"o": b.op("select", (v["qkv"],), (T, d), {"dim": 0, "index": 1})}, read=1 / 3),
        Body("concat", (("a", (T, d), f32), ("c", (T, d), f32)),
             lambda b, v: {"o": b.op("concat", (v["a"], v["c"]), (T, 2 * d), {"dim": 1})}),
        Body("rmsnorm.fwd", (("x", (T, d), f32), ("w", (d,), f32)), lambda b, v: _rmsnorm_fwd(b, v["x"], v["w"], T, d)),
        Body("rmsnorm.bwd", (("x", (T, d), f32), ("w", (d,), f32), ("dy", (T, d), f32)),
             lambda b, v: _rmsnorm_bwd(b, v["x"], v["w"], v["dy"], T, d)),
    ]


def body_program(body: Body, copies: int, prog: str) -> Graph:
    b = _B(prog)
    ins, outs = [], []
    for r in range(copies):
        vals = {n: b.value(f"{prog}.{n}.r{r}", s, dt, BATCH) for n, s, dt in body.inputs}
        ins += list(vals.values())
        outs += list(body.build(b, vals).values())
    return Graph(prog, b.values, b.nodes, (Group("batch", ins),), (Group("metrics", outs),))


def output_types(g: Graph, copy: int = 0) -> dict[str, tuple[tuple[int, ...], str]]:
    """The outputs of copy ``copy`` of a body program (shape, dtype): for the floor."""
    outs = g.outputs[0].values
    per = len(outs) // max(1, len({v.rsplit(".r", 1)[-1] for v in g.inputs[0].values}))
    return {o: (g.value(o).shape, g.value(o).dtype) for o in outs[copy * per:(copy + 1) * per]}


REPEATS = 4


def memory_document(only: str | None = None, shapes=None, T: int = TOKENS) -> Document:
    shapes = tinymoe_shapes() if shapes is None else shapes
    progs = []
    keep = lambda n: only is None or only in n  # noqa: E731
    if keep("clip_adamw"):
        progs.append(adamw_program("clip_adamw", shapes))
    if keep("clip_adamw.bf16"):
        progs.append(adamw_program("clip_adamw.bf16", shapes, bf16_copy=True))
    if keep("grad_norm"):
        progs.append(adamw_program("grad_norm", shapes, norm_only=True))
    for body in bodies(T):
        if keep(body.name):
            progs.append(body_program(body, 1, f"{body.name}.x1"))
            progs.append(body_program(body, REPEATS, f"{body.name}.x{REPEATS}"))
    return Document(graph=GraphSection(progs, (), {"example": "bench_memory"}))


def plan_document(doc: Document, num_sms: int) -> Document:
    """The pipeline's passes from the reduction split to the validator (latch_core.pipeline)."""
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    passes = registries().passes
    doc = run_pass(passes.get("schedule.split_reductions"), doc, num_sms=num_sms)
    doc = run_pass(passes.get("schedule"), doc, scheduler="barrier", num_sms=num_sms)
    doc = run_pass(passes.get("memory.plan"), doc)
    return run_pass(passes.get("schedule.validate"), doc)


def optimizer_floor_bytes(shapes, bf16_copy: bool = False, norm_only: bool = False) -> int:
    n = sum(math.prod(s) for _, s in shapes)
    return n * (4 if norm_only else 28 + (2 if bf16_copy else 0))


def fused_passes(doc: Document, program: str) -> dict[str, int]:
    """What the schedule made of ``program``: groups, tasks, barriers, and how many groups read a
    full gradient (the fused AdamW passes and the sum-of-squares partials)."""
    g = doc.graph.program(program)
    ps = next(p for p in doc.schedule.programs if p.program == program)
    full = {v.name for v in g.values if v.shape and math.prod(v.shape) > 1 and v.name.startswith("grad.")}
    reads = [grp for grp in ps.groups if set(grp.inputs) & full]
    return {"groups": len(ps.groups), "tasks": len(ps.tasks), "barriers": ps.num_barriers,
            "gradient_passes": len(reads), "nodes": len(g.nodes)}


# --------------------------------------------------------------------------------------------
# On the GPU

def _rel(got, ref) -> float:
    import torch

    num = sum(float(torch.sum((g.double() - r) ** 2)) for g, r in zip(got, ref))
    den = sum(float(torch.sum(r ** 2)) for r in ref)
    return math.sqrt(num / max(den, 1e-300))


BACK_TO_BACK = 5  # launches per timed sample of the optimizer rows


def back_to_back_ms(fn, iters: int, reps: int = BACK_TO_BACK, warmup: int = 2) -> float:
    """ms per call of ``fn`` issued ``reps`` times back to back between two CUDA events (median over
    ``iters`` samples): the host's work for call k + 1 overlaps the GPU's for call k, as in a
    training loop, so the figure is the GPU's time per call when the GPU is the slower side. (Timed
    alone, event - call - event, the host's binding of ~270 tensors runs while the GPU idles between
    the events and is counted: ``*_alone_ms``.)"""
    return statistics.median(events_ms(fn, iters, warmup, reps))


def optimizer_inputs(shapes, device, seed: int = 0, grad_scale: float = 1e-3):
    """Weights ~ N(0, 0.02), gradients ~ N(0, ``grad_scale``) (over TinyMoE-200M a global norm of ~14:
    the clip scales them), first
    moments ~ N(0, 1e-3), second moments ~ U(0, 1e-6), step 9."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda s, scale: torch.randn(s, device=device, generator=gen) * scale  # noqa: E731
    params = {n: rnd(s, 0.02) for n, s in shapes}
    grads = {f"grad.{n}": rnd(s, grad_scale) for n, s in shapes}
    state = {"step": torch.full((), 9.0, device=device)}
    state.update({f"exp_avg.{n}": rnd(s, 1e-3) for n, s in shapes})
    state.update({f"exp_avg_sq.{n}": torch.rand(s, device=device, generator=gen) * 1e-6 for n, s in shapes})
    return params, grads, state


def reference_step(shapes, params, grads, state):
    """One clip + AdamW step in float64 (``examples/_optim.py``'s formula): new p, m, v and the norm."""
    import torch

    b1, b2 = BETAS
    lr = float(torch.tensor(LR, dtype=torch.float32))  # the program's hyper-parameter is an FP32 scalar
    g64 = [grads[f"grad.{n}"].double() for n, _ in shapes]
    norm = torch.sqrt(sum(torch.sum(g * g) for g in g64))
    coef = torch.clamp(MAX_NORM / (norm + 1e-6), max=1.0)
    step = float(state["step"]) + 1
    bias1, bias2 = 1 - b1 ** step, 1 - b2 ** step
    out_p, out_m, out_v = [], [], []
    for (n, _), g in zip(shapes, g64):
        g = g * coef
        m = state[f"exp_avg.{n}"].double()
        v = state[f"exp_avg_sq.{n}"].double()
        m = m + (g - m) * (1 - b1)
        v = v * b2 + (1 - b2) * g * g
        p = params[n].double() * (1 - lr * WD)
        out_p.append(p - (lr / bias1) * m / (torch.sqrt(v) / math.sqrt(bias2) + EPS))
        out_m.append(m)
        out_v.append(v)
    return out_p, out_m, out_v, norm


def run_optimizer(prog, program: str, shapes, iters: int, seed: int = 0) -> dict:
    """The Latch program's step against FP64, then its time per launch (in place, back to back)."""
    import torch

    dev = prog.device
    params, grads, state = optimizer_inputs(shapes, dev, seed)
    norm_only = program == "grad_norm"
    row = {"case": program, "params": sum(math.prod(s) for _, s in shapes)}
    if norm_only:
        prog.launch(program, batch=grads)
        prog.check()
        got = prog.outputs(program, batch=grads)["metric.grad_norm"].double()
        ref = torch.sqrt(sum(torch.sum(g.double() ** 2) for g in grads.values()))
        row["rel_l2"] = {"grad_norm": abs(float(got) - float(ref)) / float(ref)}
        row["latch_ms"] = back_to_back_ms(lambda: prog.launch(program, batch=grads), iters)
        row["latch_alone_ms"] = median_ms(lambda: prog.launch(program, batch=grads), iters)
        row["bytes"] = optimizer_floor_bytes(shapes, norm_only=True)
        return row
    ref_p, ref_m, ref_v, ref_norm = reference_step(shapes, params, grads, state)
    hyper = {"lr": LR}
    prog.launch(program, params=params, state=state, batch=grads, hyper=hyper)
    prog.check()
    outs = prog.outputs(program, params=params, state=state, batch=grads, hyper=hyper)
    row["rel_l2"] = {
        "new_params": _rel([params[n] for n, _ in shapes], ref_p),
        "exp_avg": _rel([state[f"exp_avg.{n}"] for n, _ in shapes], ref_m),
        "exp_avg_sq": _rel([state[f"exp_avg_sq.{n}"] for n, _ in shapes], ref_v),
        "grad_norm": abs(float(outs["metric.grad_norm"]) - float(ref_norm)) / float(ref_norm),
    }
    if program.endswith(".bf16"):
        # the copy must be the new FP32 weight rounded to nearest even: exactly torch's rounding
        row["rel_l2"]["bf16_copy"] = _rel([outs[f"bf16.{n}"].float() for n, _ in shapes],
                                          [params[n].to(torch.bfloat16).double() for n, _ in shapes])
    del ref_p, ref_m, ref_v
    launch = lambda: prog.launch(program, params=params, state=state, batch=grads, hyper=hyper)  # noqa: E731
    row["latch_ms"] = back_to_back_ms(launch, iters)
    row["latch_alone_ms"] = median_ms(launch, iters)
    prog.check()
    row["bytes"] = optimizer_floor_bytes(shapes, bf16_copy=program.endswith(".bf16"))
    return row


def torch_control(shapes, iters: int, seed: int = 0) -> dict:
    """torch.nn.utils.clip_grad_norm_(foreach) + AdamW(fused, capturable) replayed from one CUDA graph,
    over tensors like the Latch program's; its first step is checked against FP64 too."""
    import torch

    dev = torch.device("cuda")
    p0, grads, state = optimizer_inputs(shapes, dev, seed)
    ref_p, _, _, _ = reference_step(shapes, p0, grads, state)
    params = [torch.nn.Parameter(p0[n]) for n, _ in shapes]
    for p, (n, _) in zip(params, shapes):
        p.grad = grads[f"grad.{n}"]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True, capturable=True)
    for p, (n, _) in zip(params, shapes):  # the same moments and step as the Latch program starts from
        opt.state[p]["step"] = torch.full((), float(state["step"]), device=dev)
        opt.state[p]["exp_avg"] = state[f"exp_avg.{n}"]
        opt.state[p]["exp_avg_sq"] = state[f"exp_avg_sq.{n}"]

    def step():
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=True)
        opt.step()

    step()
    torch.cuda.synchronize()
    rel = _rel([p.detach() for p in params], ref_p)
    del ref_p
    graph = capture_graph(step, warmup=2)
    ms = back_to_back_ms(graph.replay, iters)
    return {"torch_ms": ms, "torch_alone_ms": median_ms(graph.replay, iters), "torch_rel_l2": rel}


def _torch_body(name: str):
    """The body in eager torch ops (the same formula), for the control column; None when absent."""
    import torch
    import torch.nn.functional as F

    def rms_bwd(v):
        x, w, dy = v["x"], v["w"], v["dy"]
        r = torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        gw = dy * w
        s = (gw * x).mean(-1, keepdim=True)
        return gw * r - x * (r * r * r * s), (dy * x * r).sum(0)

    table = {
        "residual_add": lambda v: v["x"] + v["y"],
        "residual_add.odd": lambda v: v["x"] + v["y"],
        "cast_bf16": lambda v: v["x"].to(torch.bfloat16),
        "swiglu.fwd": lambda v: F.silu(v["a"]) * v["c"],
        "swiglu.bwd": lambda v: (torch.ops.aten.silu_backward(v["do"] * v["c"], v["a"]), v["do"] * F.silu(v["a"])),
        "gelu.fwd": lambda v: F.gelu(v["x"], approximate="tanh"),
        "gelu.bwd": lambda v: torch.ops.aten.gelu_backward(v["dy"], v["x"], approximate="tanh"),
        "rmsnorm.fwd": lambda v: v["x"] * torch.rsqrt((v["x"] * v["x"]).mean(-1, keepdim=True) + 1e-6) * v["w"],
        "rmsnorm.bwd": rms_bwd,
        "heads.permute": lambda v: v["x"].reshape(2, v["x"].shape[0] // 2, -1, 64).permute(0, 2, 1, 3).contiguous(),
        "qkv.select": lambda v: v["qkv"][1].clone(),
        "concat": lambda v: torch.cat((v["a"], v["c"]), 1),
    }
    return table.get(name)


def _torch_body_ms(body: Body, batch: dict, prefix: str, iters: int) -> float | None:
    """The eager torch body over the same inputs, replayed from a CUDA graph (one launch per op)."""
    fn = _torch_body(body.name)
    if fn is None:
        return None
    v = {n: batch[f"{prefix}.{n}.r0"] for n, _, _ in body.inputs}
    graph = capture_graph(lambda: fn(v), warmup=1)
    return median_ms(graph.replay, iters)


def run_body(prog, body: Body, iters: int, seed: int, doc: Document) -> dict:
    import torch

    dev = prog.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}

    def batch(prog_name: str, copies: int) -> dict:
        out = {}
        for r in range(copies):
            for n, s, d in body.inputs:
                out[f"{prog_name}.{n}.r{r}"] = torch.randn(s, device=dev, generator=gen).to(dt[d])
        return out

    b1, bR = batch(f"{body.name}.x1", 1), batch(f"{body.name}.x{REPEATS}", REPEATS)
    # correctness of one copy against FP64 (the graph's own reference interpreter)
    from . import reference

    prog.launch(f"{body.name}.x1", batch=b1)
    prog.check()
    got = prog.outputs(f"{body.name}.x1", batch=b1)
    ref = reference.run(doc, f"{body.name}.x1", {k: v.cpu() for k, v in b1.items()})
    rel = max(_rel([got[k].float()], [ref[k].double().to(dev)]) for k in got)
    t1 = median_ms(lambda: prog.launch(f"{body.name}.x1", batch=b1), iters)
    tr = median_ms(lambda: prog.launch(f"{body.name}.x{REPEATS}", batch=bR), iters)
    prog.check()
    g = doc.graph.program(f"{body.name}.x1")
    outs = {o: (g.value(o).shape, g.value(o).dtype) for o in g.outputs[0].values}
    bf16 = any(d == "bf16" for _, d in outs.values())
    try:
        torch_ms = _torch_body_ms(body, b1, f"{body.name}.x1", iters)
    except Exception as e:  # the control must not hide our own figure
        click.echo(f"{body.name}: torch control failed: {type(e).__name__}: {e}")
        torch_ms = None
    extra = {} if torch_ms is None else {"torch_ms": torch_ms}
    return {**extra, "case": body.name, "bytes": body.floor_bytes(outs), "latch_ms": (tr - t1) / (REPEATS - 1),
            "latch_launch_ms": t1, "rel_l2": {"max": rel}, "gate": CAST_GATE if bf16 else BODY_GATE,
            "groups": len(next(p for p in doc.schedule.programs if p.program == f"{body.name}.x1").groups),
            "row_groups": row_groups(doc, f"{body.name}.x1")}


def row_groups(doc: Document, program: str) -> int:
    """How many of ``program``'s groups are row groups (latch_schedule.rowgroups: a sum or mean
    before the group's last node: statistic, chain and consumer in one pass)."""
    g = doc.graph.program(program)
    ops = {n.name: n.op for n in g.nodes}
    ps = next(p for p in doc.schedule.programs if p.program == program)
    return sum(1 for grp in ps.groups if any(ops[n] in ("latch::sum", "latch::mean") for n in grp.nodes[:-1]))


def finish(row: dict) -> dict:
    floor_ms = row["bytes"] / HBM_BYTES_S * 1e3
    row["floor_ms"] = floor_ms
    row["gbs"] = row["bytes"] / (row["latch_ms"] * 1e-3) / 1e9
    row["of_floor"] = floor_ms / row["latch_ms"]
    gate = row.get("gate", REL_GATE)
    row["ok"] = all(v <= gate for v in row["rel_l2"].values())
    return row


BODY_GATE = 1e-5  # FP32 bodies against FP64; the BF16 cast is compared after its own rounding
CAST_GATE = 4e-3  # a BF16 result against FP64: half an ulp of 8 bits is 2e-3 relative


def format_table(rows: list[dict]) -> str:
    head = (f"{'body':<18} {'MB moved':>9} {'floor us':>9} {'latch us':>9} {'GB/s':>7} {'of floor':>8} "
            f"{'torch us':>9} {'vs torch':>8} {'rel L2':>9}  verdict")
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.get("torch_ms")
        worst = max(r["rel_l2"].values())
        verdict = ("ok" if r["of_floor"] >= GOAL else f"below {GOAL:.0%}") + ("" if r["ok"] else "  WRONG")
        torch_us = "" if t is None else f"{1e3 * t:.1f}"
        ratio = "" if t is None else f"{t / r['latch_ms']:.2f}x"
        lines.append(f"{r['case']:<18} {r['bytes'] / 1e6:9.1f} {1e3 * r['floor_ms']:9.1f} {1e3 * r['latch_ms']:9.1f} "
                     f"{r['gbs']:7.0f} {100 * r['of_floor']:7.0f}% {torch_us:>9} {ratio:>8} {worst:9.2e}  {verdict}")
    alone = [r for r in rows if "latch_alone_ms" in r]
    if alone:
        lines.append(f"(optimizer rows: ms per launch of {BACK_TO_BACK} back to back, torch's graph likewise; "
                     "one launch alone, host binding included: "
                     + ", ".join(f"{r['case']} {r['latch_alone_ms']:.3f}" + (f" (torch {r['torch_alone_ms']:.3f})"
                                                                            if "torch_alone_ms" in r else "")
                                 for r in alone) + ")")
    return "\n".join(lines)


@click.command("bench-memory")
@click.option("--only", default=None, help="keep cases whose name contains this (clip_adamw, grad_norm, rmsnorm, ...)")
@click.option("--tokens", default=TOKENS, show_default=True, help="rows of the row/elementwise bodies")
@click.option("--dir", "build_dir", default="build/bench-memory", show_default=True, type=click.Path(file_okay=False))
@click.option("--iters", default=20, show_default=True)
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="also write the rows here")
@click.option("--no-control", is_flag=True, help="skip torch's fused AdamW + clip_grad_norm_ control")
def bench_memory_command(only, tokens, build_dir, iters, json_path, no_control):
    """Time the bandwidth-bound bodies (clip + AdamW over TinyMoE-200M, norms, activations) inside the
    persistent kernel against their bytes floor at 4.27 TB/s, and torch's fused AdamW + clipping."""
    import json

    import torch

    from latch_codegen_h100 import Program, build

    if not torch.cuda.is_available():
        raise click.ClickException("bench-memory runs on the GPU; torch sees no CUDA device")
    shapes = tinymoe_shapes()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.perf_counter()
    doc = memory_document(only, shapes, T=int(tokens))
    if not doc.graph.programs:
        raise click.ClickException(f"no case matches --only {only!r}")
    doc = plan_document(doc, sms)
    t1 = time.perf_counter()
    doc = build(doc, build_dir)
    t2 = time.perf_counter()
    click.echo(f"bench-memory: {len(doc.graph.programs)} programs, plan {t1 - t0:.1f} s, build {t2 - t1:.1f} s "
               f"({dict(doc.build.stats).get('cached')}), {dict(doc.build.stats).get('resources', '')}")
    for g in doc.graph.programs:
        if not g.name.endswith(f".x{REPEATS}"):
            click.echo(f"  schedule {g.name}: {fused_passes(doc, g.name)}")
    prog = Program.load(build_dir)
    rows, failed = [], []
    names = {g.name for g in doc.graph.programs}
    for program in ("clip_adamw", "clip_adamw.bf16", "grad_norm"):
        if program not in names:
            continue
        try:
            row = run_optimizer(prog, program, shapes, iters)
            if program == "clip_adamw" and not no_control:
                torch.cuda.empty_cache()
                row.update(torch_control(shapes, iters))
            rows.append(finish(row))
        except Exception as e:  # one failing case must not hide the others' numbers
            failed.append(program)
            click.echo(f"{program}: FAILED: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    for i, body in enumerate(bodies(int(tokens))):
        if f"{body.name}.x1" not in names:
            continue
        try:
            row = run_body(prog, body, iters, i, doc)
            rows.append(finish(row))
        except Exception as e:
            failed.append(body.name)
            click.echo(f"{body.name}: FAILED: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    click.echo(format_table(rows))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    bad = [r["case"] for r in rows if not r["ok"]] + failed
    if bad:
        raise click.ClickException(f"wrong or failed: {bad}")


__all__ = ["tinymoe_shapes", "adamw_program", "bodies", "body_program", "memory_document", "plan_document",
           "optimizer_floor_bytes", "fused_passes", "TINYMOE_PARAMS", "bench_memory_command"]
