"""Matrix products as Latch tasks inside the persistent kernel, against torch.mm in a CUDA graph.

    latch-pipeline bench-matmul                      # TinyMoE-200M's dense products, 2 x 1024 and 32 x 1024 tokens
    latch-pipeline bench-matmul --tokens 2048 --only qkv
    latch-pipeline bench-matmul --tokens 32768 --only fwd --classic --config wgmma_pp_128x512x64

Every product a training step of TinyMoE-200M's dense path runs (QKV, attention output, router and
the tied LM head: forward, input gradient and weight gradient; ``CASES``) becomes its own programs in
ONE build: ``<case>.check`` (one product, FP32 output, gated against the FP64 product of the same BF16
operands: relative L2 and the largest element error), and ``<case>.x1`` / ``<case>.xR`` (1 and R
independent copies of the product, BF16 output like torch.mm's, in one launch: the barrier scheduler
puts all their tiles in one phase, so the worker's producer runs from one tile into the next). The
time per product is ``(t(xR) - t(x1)) / (R - 1)`` (launch overhead and the last wave's tail cancel);
``t(xR) / R`` is shown too. The control is torch.mm on the same operands, R products captured in one
CUDA graph, timed per replay / R. Medians of CUDA-event timings; fresh random operands per case.

``--config NAME`` (repeatable) adds ``<case>@NAME`` rows: the same product with that configuration
forced (its own ``.check`` against FP64 too), for every case where NAME is legal. ``--classic``
adds ``<case>@classic`` rows where the default chose a ping-pong configuration
(``wgmma_pp_*``): the model's choice with ping-pong left out (``cost_pingpong_efficiency=0``),
i.e. what the default was before it, timed in the same launch sequence.

The document is built without torch (``matmul_document``), so CI can schedule, plan, validate and
compile it (``tests/test_bench_matmul.py``); the timing needs the GPU.
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import attrs
import click

from latch_core.document import Document
from latch_core.ir import BATCH, Graph, GraphSection, Group, Node, Value

from .timing import capture_graph, median_ms

D_MODEL, QKV, VOCAB, EXPERTS = 768, 3 * 768, 49152, 16
# The product with FP32 output against FP64 (of the same BF16 operands): FP32 accumulation over
# K <= 49,152 products stays far below 1e-4 in relative L2 (run 7 measured 5.7e-5 at K = 49,152 and
# 7.6e-7 at K = 768, linear in K); a wrong tile or index gives O(1). The BF16 storage of an output
# alone costs ~2e-3, so this gate is 20x tighter than what a BF16 consumer could notice.
REL_GATE, MAX_GATE = 1e-4, 1e-3


def bf16_gate(torch_rel: float) -> float:
    """The gate of a BF16 output against FP64: twice what torch.mm's own BF16 output of the same
    operands shows (its rounding, ~2e-3), at least 4e-3. A wrong tile or a stale box gives O(1)."""
    return max(2 * torch_rel, 4e-3)


@attrs.frozen
class Case:
    """out[M, N] = A @ B with a stored [K, M] when ``ta`` (else [M, K]) and b stored [N, K] when ``tb``
    (else [K, N]): the forms a training step produces (forward: tb; input gradient: neither; weight
    gradient: ta)."""

    name: str
    m: int
    n: int
    k: int
    ta: bool = False
    tb: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def a_shape(self) -> tuple[int, int]:
        return (self.k, self.m) if self.ta else (self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.tb else (self.k, self.n)

    @property
    def layout(self) -> str:
        return ("A^T" if self.ta else "A") + " " + ("B^T" if self.tb else "B")


def cases(tokens: int) -> list[Case]:
    """TinyMoE-200M's dense products at ``tokens`` tokens: Linear(d_in -> d_out) forward
    [T, d_in] @ W[d_out, d_in]^T, input gradient [T, d_out] @ W, weight gradient dY^T @ X."""
    out = []
    for name, d_in, d_out in (("qkv", D_MODEL, QKV), ("attn_out", D_MODEL, D_MODEL), ("router", D_MODEL, EXPERTS),
                              ("lm_head", D_MODEL, VOCAB)):
        t = tokens
        out.append(Case(f"{name}.fwd.{t}", t, d_out, d_in, tb=True))
        out.append(Case(f"{name}.dgrad.{t}", t, d_in, d_out))
        out.append(Case(f"{name}.wgrad.{t}", d_out, d_in, t, ta=True))
    return out


def repeats(c: Case, target_s: float = 300e-6, rate: float = 500e12) -> int:
    """Copies per timed launch: enough for ~``target_s`` of products, 2..16."""
    return max(2, min(16, round(target_s / (c.flops / rate))))


def _program(c: Case, name: str, copies: int, out_dtype: str, config: str | None = None,
             epilogue_slots: int | None = None) -> Graph:
    a, b = f"{c.name}.a", f"{c.name}.b"
    values = [Value(a, c.a_shape, "bf16", BATCH), Value(b, c.b_shape, "bf16", BATCH)]
    nodes, outs = [], []
    attrs_ = {"trans_a": c.ta, "trans_b": c.tb, "out_dtype": out_dtype, "operand_dtype": "bf16",
              "accum_dtype": "f32"}
    if config:
        attrs_["config"] = config
    if epilogue_slots:
        attrs_["epilogue_slots"] = epilogue_slots
    for r in range(copies):
        o = f"{name}.out{r}"
        values.append(Value(o, (c.m, c.n), out_dtype))
        nodes.append(Node(f"{name}.mm{r}", "latch::matmul", (a, b), (o,), attrs_, source=f"bench_matmul {c.name}"))
        outs.append(o)
    return Graph(name, values, nodes, (Group("batch", (a, b)),), (Group("metrics", tuple(outs)),))


def case_groups(case_list: Iterable[Case]) -> dict[str, list[Case]]:
    """The cases by layout (forward, input gradient, weight gradient; names ``<op>.<kind>.<tokens>``),
    in their order: bench-matmul builds one kernel per group."""
    out: dict[str, list[Case]] = {}
    for c in case_list:
        out.setdefault(c.name.split(".")[1], []).append(c)
    return out


def sweep_configs(c: Case) -> list[str]:
    """The wgmma configurations a sweep times for ``c``: every BN the body runs for its layout."""
    ns = (64, 96, 128, 192, 256) if c.tb else (64, 128, 192, 256)
    return [f"wgmma_128x{n}x64" for n in ns if n <= max(64, 2 * c.n)]


def forced_name(case: str, config: str) -> str:
    return f"{case}@{config}"


def config_fits(c: Case, config: str) -> bool:
    """Whether the wgmma configuration ``config`` is one the body runs for ``c``'s layout."""
    from latch_core.configs import configs_for
    from latch_core.ir import TensorType

    a, b = TensorType(c.a_shape, "bf16"), TensorType(c.b_shape, "bf16")
    names = {x.name for x in configs_for("latch::matmul", [a, b], [TensorType((c.m, c.n), "bf16")],
                                         {"trans_a": c.ta, "trans_b": c.tb})}
    return config in names


def matmul_document(case_list: Iterable[Case], sweep: bool = False, epilogue_slots: int | None = None,
                    configs: Iterable[str] = ()) -> Document:
    """The benchmark's graph section: per case ``<case>.check``, ``<case>.x1``, ``<case>.xR`` with the
    configuration the schedule chooses; with ``sweep``, also ``<case>@<config>.x1`` / ``.xR`` for
    every configuration of :func:`sweep_configs` (calibrating the cost model). ``epilogue_slots``:
    every product's ``epilogue_slots`` attribute (latch_ops.matmul; None: the body's default).
    ``configs``: per case also ``<case>@<config>.check`` / ``.x1`` / ``.xR`` with that configuration
    forced, where it fits the case (:func:`config_fits`)."""
    progs = []
    e = epilogue_slots
    configs = list(configs)
    for c in case_list:
        for cfg in configs:
            if config_fits(c, cfg):
                f = forced_name(c.name, cfg)
                progs.append(_program(c, f"{f}.check", 1, "f32", cfg, e))
                progs.append(_program(c, f"{f}.x1", 1, "bf16", cfg, e))
                progs.append(_program(c, f"{f}.x{repeats(c)}", repeats(c), "bf16", cfg, e))
        progs.append(_program(c, f"{c.name}.check", 1, "f32", epilogue_slots=e))
        progs.append(_program(c, f"{c.name}.x1", 1, "bf16", epilogue_slots=e))
        progs.append(_program(c, f"{c.name}.x{repeats(c)}", repeats(c), "bf16", epilogue_slots=e))
        if sweep:
            for cfg in sweep_configs(c):
                progs.append(_program(c, f"{c.name}@{cfg}.x1", 1, "bf16", cfg, e))
                progs.append(_program(c, f"{c.name}@{cfg}.x{repeats(c)}", repeats(c), "bf16", cfg, e))
    return Document(graph=GraphSection(progs, (), {"example": "bench_matmul"}))


def chosen_config(doc: Document, program: str) -> str:
    """The configuration (and split-K) the schedule gave the product in ``program``."""
    g = doc.graph.program(program)
    for n in g.nodes:
        if n.op == "latch::matmul":
            cfg = n.attr("config") or "default"
            return cfg + (f" S={n.attr('split_k')}" if n.attr("split_k") else "")
    return "?"


SPLIT_CHOICES = (1, 2, 4, 8, 16)


def split_name(case: str) -> str:
    return f"{case}@split"


def with_split_variants(doc: Document, num_sms: int) -> Document:
    """Add ``<case>@split.x1`` / ``.xR`` where the default cost model splits the product (split-K
    on since run 13 measured where it wins): the same copies with split-K off (S = 1, the best
    unsplit configuration), so one run times both choices side by side. The row is named for the
    split decision it checks; its ``config`` column says which choice it is (no ``S=``: whole)."""
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    timed = [g for g in doc.graph.programs if "@" not in g.name and not g.name.endswith(".check")]
    if not timed:
        return doc
    renamed = []
    for g in timed:
        case, _, rest = g.name.rpartition(".")
        new = f"{split_name(case)}.{rest}"
        renamed.append(_program_like(g, new))
    configs = registries().passes.get("schedule.matmul_configs")
    sub = Document(graph=GraphSection(renamed, (), {}))
    default = run_pass(configs, sub, num_sms=num_sms)
    split_by_default = {g.name for g in default.graph.programs if any(n.attr("split_k") for n in g.nodes)}
    whole = run_pass(configs, sub, num_sms=num_sms, cost_split_k_choices=(1,))
    keep = [g for g in whole.graph.programs if g.name in split_by_default]
    if not keep:
        return doc
    return attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=tuple(doc.graph.programs) + tuple(keep)))


def classic_name(case: str) -> str:
    return f"{case}@classic"


def with_classic_variants(doc: Document, num_sms: int) -> Document:
    """Add ``<case>@classic.x1`` / ``.xR`` where the default cost model chooses a ping-pong
    configuration: the same copies configured with ping-pong left out (``cost_pingpong_efficiency
    = 0``: the choice before it existed), so one run times both side by side."""
    from latch_core.passes import run_pass
    from latch_core.plugins import registries
    from latch_schedule.matmul_configs import PINGPONG_PREFIX

    timed = [g for g in doc.graph.programs if "@" not in g.name and not g.name.endswith(".check")]
    if not timed:
        return doc
    renamed = [_program_like(g, f"{classic_name(g.name.rpartition('.')[0])}.{g.name.rpartition('.')[2]}")
               for g in timed]
    configs = registries().passes.get("schedule.matmul_configs")
    sub = Document(graph=GraphSection(renamed, (), {}))
    default = run_pass(configs, sub, num_sms=num_sms)
    pp = {g.name for g in default.graph.programs
          if any(str(n.attr("config") or "").startswith(PINGPONG_PREFIX) for n in g.nodes)}
    classic = run_pass(configs, sub, num_sms=num_sms, cost_pingpong_efficiency=0)
    keep = [g for g in classic.graph.programs if g.name in pp]
    if not keep:
        return doc
    return attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=tuple(doc.graph.programs) + tuple(keep)))


def _program_like(g: Graph, name: str) -> Graph:
    """``g`` with its name, nodes and outputs renamed from ``g.name`` to ``name`` (inputs shared)."""
    old = g.name
    ren = lambda v: name + v[len(old):] if v.startswith(old + ".") else v  # noqa: E731
    values = [attrs.evolve(v, name=ren(v.name)) for v in g.values]
    nodes = [attrs.evolve(n, name=ren(n.name), inputs=tuple(ren(i) for i in n.inputs),
                          outputs=tuple(ren(o) for o in n.outputs)) for n in g.nodes]
    outs = tuple(attrs.evolve(gr, values=tuple(ren(v) for v in gr.values)) for gr in g.outputs)
    return attrs.evolve(g, name=name, values=values, nodes=nodes, outputs=outs)


def plan_document(doc: Document, num_sms: int, split_k: bool = True, classic: bool = False) -> Document:
    """The pipeline's passes from the configuration choice to the validator (latch_core.pipeline);
    with ``split_k``, first the split-K variants (:func:`with_split_variants`); with ``classic``, the
    variants without ping-pong (:func:`with_classic_variants`)."""
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    passes = registries().passes
    if classic:
        doc = with_classic_variants(doc, num_sms)
    if split_k:
        doc = with_split_variants(doc, num_sms)
    doc = run_pass(passes.get("schedule.matmul_configs"), doc, num_sms=num_sms)
    doc = run_pass(passes.get("schedule"), doc, scheduler="barrier", num_sms=num_sms)
    doc = run_pass(passes.get("memory.plan"), doc)
    return run_pass(passes.get("schedule.validate"), doc)


# --------------------------------------------------------------------------------------------
# On the GPU


def run_case(prog, c: Case, iters: int, seed: int, configs: list[str] = (), split: bool = False,
             variants: Iterable[tuple[str, bool]] = ()) -> dict:
    """One case's row (and its variants' rows under ``"variants"``: ``(prefix, checked)`` per
    program family ``<prefix>.x1`` / ``.xR``, with ``<prefix>.check`` gated against FP64 where
    ``checked``; the split-K variant under ``"split"``)."""
    import torch

    dev = prog.device
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(c.a_shape, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16)
    b = torch.randn(c.b_shape, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16)
    batch = {f"{c.name}.a": a, f"{c.name}.b": b}
    A = a.t() if c.ta else a
    B = b.t() if c.tb else b

    # correctness: the FP32 output against the FP64 product of the same BF16 operands; torch.mm's
    # own BF16 result against the same reference is shown for scale (its error is the BF16 output
    # rounding, ~2e-3)
    prog.launch(f"{c.name}.check", batch=batch)
    prog.check()
    got = prog.outputs(f"{c.name}.check", batch=batch)[f"{c.name}.check.out0"].double()
    ref = torch.mm(A.double(), B.double())
    norm = max(ref.norm().item(), 1e-30)
    rel = (got - ref).norm().item() / norm
    worst = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
    torch_rel = (torch.mm(A, B).double() - ref).norm().item() / norm
    del got
    # the timed programs' BF16 output (its own epilogue: through shared memory and TMA stores where
    # the body allows it) against the same reference: BF16 rounding only, like torch.mm's own
    prog.launch(f"{c.name}.x1", batch=batch)
    prog.check()
    got = prog.outputs(f"{c.name}.x1", batch=batch)[f"{c.name}.x1.out0"].double()
    bf16_rel = (got - ref).norm().item() / norm
    del got, ref

    R = repeats(c)

    def timed(prefix: str) -> tuple[float, float]:
        t1 = median_ms(lambda: prog.launch(f"{prefix}.x1", batch=batch), iters)
        tr = median_ms(lambda: prog.launch(f"{prefix}.x{R}", batch=batch), iters)
        prog.check()
        return t1, tr

    t1, tr = timed(c.name)
    split_row = None
    if split:  # the split-K variant: its BF16 output against the same reference, then its time
        sname = split_name(c.name)
        prog.launch(f"{sname}.x1", batch=batch)
        prog.check()
        got = prog.outputs(f"{sname}.x1", batch=batch)[f"{sname}.x1.out0"].double()
        ref = torch.mm(A.double(), B.double())
        split_rel = (got - ref).norm().item() / norm
        del got, ref
        s1, sr = timed(sname)
        split_row = {"rel": split_rel, "ms": (sr - s1) / (R - 1), "launch_ms": sr / R}
    variant_rows = []
    for prefix, checked in variants:  # forced configurations and the classic choice: the same gates
        ref = torch.mm(A.double(), B.double())
        v_rel = v_worst = float("nan")
        v_ok = True
        if checked:
            prog.launch(f"{prefix}.check", batch=batch)
            prog.check()
            got = prog.outputs(f"{prefix}.check", batch=batch)[f"{prefix}.check.out0"].double()
            v_rel = (got - ref).norm().item() / norm
            v_worst = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
            v_ok = v_rel <= REL_GATE and v_worst <= MAX_GATE
            del got
        prog.launch(f"{prefix}.x1", batch=batch)
        prog.check()
        got = prog.outputs(f"{prefix}.x1", batch=batch)[f"{prefix}.x1.out0"].double()
        v_bf16 = (got - ref).norm().item() / norm
        del got, ref
        v1, vr = timed(prefix)
        variant_rows.append({"case": prefix, "rel": v_rel, "worst": v_worst, "bf16": v_bf16,
                             "ms": (vr - v1) / (R - 1), "launch_ms": vr / R,
                             "ok": v_ok and v_bf16 <= bf16_gate(torch_rel)})
    sweep = {}
    for cfg in configs:
        s1, sr = timed(f"{c.name}@{cfg}")
        sweep[cfg] = c.flops / ((sr - s1) / (R - 1)) / 1e9
    # the control: R torch.mm into preallocated outputs, one CUDA graph
    outs = [torch.empty((c.m, c.n), device=dev, dtype=torch.bfloat16) for _ in range(R)]

    def products():
        for o in outs:
            torch.mm(A, B, out=o)

    graph = capture_graph(products, warmup=1, device=dev)
    tt = median_ms(graph.replay, iters) / R
    latch_ms = (tr - t1) / (R - 1)
    if split_row:
        split_row.update(case=f"{c.name}@split", m=c.m, n=c.n, k=c.k, layout=c.layout, R=R, rel_l2=float("nan"),
                         max_err=float("nan"), bf16_rel_l2=split_row["rel"], latch_ms=split_row["ms"],
                         latch_launch_ms=split_row["launch_ms"], torch_ms=tt, latch_tflops=c.flops / split_row["ms"] / 1e9,
                         torch_tflops=c.flops / tt / 1e9, ratio=tt / split_row["ms"],
                         ok=split_row["rel"] <= bf16_gate(torch_rel))
    vrows = [{"case": v["case"], "m": c.m, "n": c.n, "k": c.k, "layout": c.layout, "R": R, "rel_l2": v["rel"],
              "max_err": v["worst"], "bf16_rel_l2": v["bf16"], "latch_ms": v["ms"], "latch_launch_ms": v["launch_ms"],
              "torch_ms": tt, "latch_tflops": c.flops / v["ms"] / 1e9, "torch_tflops": c.flops / tt / 1e9,
              "ratio": tt / v["ms"], "ok": v["ok"]} for v in variant_rows]
    return {"split": split_row, "variants": vrows, "case": c.name, "m": c.m, "n": c.n, "k": c.k, "layout": c.layout, "R": R, "rel_l2": rel,
            "max_err": worst, "latch_ms": latch_ms, "latch_launch_ms": tr / R, "torch_ms": tt,
            "latch_tflops": c.flops / latch_ms / 1e9, "torch_tflops": c.flops / tt / 1e9,
            "ratio": tt / latch_ms, "torch_bf16_rel_l2": torch_rel, "bf16_rel_l2": bf16_rel, "sweep_tflops": sweep,
            "ok": rel <= REL_GATE and worst <= MAX_GATE and bf16_rel <= bf16_gate(torch_rel)}


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':<22} {'M x N x K':>20} {'layout':>8} {'config':>22} {'R':>3} {'rel L2':>9} {'bf16 L2':>9} {'latch us':>9} "
            f"{'(launch)':>9} {'torch us':>9} {'latch TF':>8} {'torch TF':>8} {'vs torch':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:<22} {str(r['m']) + 'x' + str(r['n']) + 'x' + str(r['k']):>20} {r['layout']:>8} "
                     f"{r.get('config', ''):>22} {r['R']:>3} {r['rel_l2']:9.2e} {r.get('bf16_rel_l2', float('nan')):9.2e} {1e3 * r['latch_ms']:9.2f} {1e3 * r['latch_launch_ms']:9.2f} "
                     f"{1e3 * r['torch_ms']:9.2f} {r['latch_tflops']:8.0f} {r['torch_tflops']:8.0f} "
                     f"{100 * r['ratio']:7.0f}%{'' if r['ok'] else '  WRONG'}")
    return "\n".join(lines)


@click.command("bench-matmul")
@click.option("--tokens", default="2048,32768", show_default=True, help="token counts, comma-separated")
@click.option("--only", default=None, help="keep cases whose name contains this (e.g. qkv, lm_head.fwd)")
@click.option("--dir", "build_dir", default="build/bench-matmul", show_default=True, type=click.Path(file_okay=False))
@click.option("--iters", default=20, show_default=True)
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="also write the rows here")
@click.option("--sweep", is_flag=True, help="also time every wgmma configuration of each case (cost-model calibration)")
@click.option("--split-k/--no-split-k", default=True, show_default=True,
              help="where the cost model splits a product, also time it unsplit (rows <case>@split: the other choice)")
@click.option("--epilogue-slots", type=click.IntRange(1, 8), default=None,
              help="1 KiB output boxes each consumer warp stages before waiting for the copy engine (default: "
                   "the body's, 2); more slots take shared memory from the ring's stages")
@click.option("--config", "forced", multiple=True, metavar="NAME",
              help="also time every case with this matmul configuration forced (rows <case>@NAME, checked "
                   "against FP64 like the default; repeatable; e.g. wgmma_pp_128x512x64, wgmma_128x256x64)")
@click.option("--classic", is_flag=True,
              help="where the default chose a ping-pong configuration (wgmma_pp_*), also time the choice "
                   "without ping-pong (rows <case>@classic: the default before it)")
def bench_matmul_command(tokens, only, build_dir, iters, json_path, sweep, split_k, epilogue_slots, forced, classic):
    """Time TinyMoE-200M's dense matrix products as Latch tasks against torch.mm in a CUDA graph."""
    import json

    import torch

    from latch_codegen_h100 import Program, build

    if not torch.cuda.is_available():
        raise click.ClickException("bench-matmul runs on the GPU; torch sees no CUDA device")
    case_list = [c for t in tokens.split(",") for c in cases(int(t)) if only is None or only in c.name]
    if not case_list:
        raise click.ClickException(f"no case matches --only {only!r}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # One build per layout group, compiled at the same time: the kernel is one translation unit
    # and ptxas's time grows faster than linearly with the bodies inlined into it (all 24 cases
    # in one kernel: ~18 product functions, minutes), so three smaller kernels in parallel finish
    # long before one large one.
    groups = case_groups(case_list)
    t0 = time.perf_counter()
    forced = list(forced)
    from latch_core.configs import configs_for  # noqa: F401 (the plugins' configurations: a typo fails here)

    for cfg in forced:
        if not any(config_fits(c, cfg) for c in case_list):
            raise click.ClickException(f"--config {cfg!r} fits none of the cases {[c.name for c in case_list]}: "
                                       "name one of the matmul configurations `latch-pipeline show` prints "
                                       "(wgmma_128x<BN>x64, wgmma_pp_128x<W>x64)")
    docs = {k: plan_document(matmul_document(cs, sweep, epilogue_slots, forced), sms, split_k=split_k,
                             classic=classic)
            for k, cs in groups.items()}
    t1 = time.perf_counter()
    dirs = {k: Path(build_dir) / k for k in groups}
    with ThreadPoolExecutor(max_workers=len(groups)) as ex:
        futures = {k: ex.submit(build, docs[k], dirs[k]) for k in groups}
        docs = {k: f.result() for k, f in futures.items()}
    t2 = time.perf_counter()
    click.echo(f"bench-matmul: {len(case_list)} cases in {len(groups)} builds ({', '.join(groups)}), plan "
               f"{t1 - t0:.1f} s, build {t2 - t1:.1f} s")
    for k, d in docs.items():
        st = dict(d.build.stats)
        ring = {}
        try:
            ring = json.loads((dirs[k] / "manifest.json").read_text()).get("ring", {})
        except (OSError, ValueError):
            pass
        click.echo(f"  {k}: {st.get('cached')}, compile {st.get('compile_seconds', 0):.1f} s, "
                   f"{st.get('functions')} functions, spills {st.get('spill_stores', 0)}/{st.get('spill_loads', 0)} bytes, "
                   f"ring {ring.get('stages', '?')} stages x {ring.get('stage_bytes', '?')} B + scratch {ring.get('scratch', '?')} B")
        try:
            from latch_codegen_h100 import SassError, sass_report

            click.echo("  machine code: " + "; ".join(sass_report(dirs[k] / "program.so").lines()))
        except SassError as e:
            click.echo(f"  machine code: not read ({e})")
    rows, failed = [], []
    t3 = time.perf_counter()
    seeds = {c.name: i for i, c in enumerate(case_list)}
    for k, cs in groups.items():
        doc = docs[k]
        prog = Program.load(dirs[k])
        names = {g.name for g in doc.graph.programs}
        for c in cs:
            try:
                has_split = f"{split_name(c.name)}.x1" in names
                variants = [(forced_name(c.name, cfg), True) for cfg in forced
                            if f"{forced_name(c.name, cfg)}.x1" in names]
                if f"{classic_name(c.name)}.x1" in names:
                    variants.append((classic_name(c.name), False))
                row = run_case(prog, c, iters, seed=seeds[c.name], configs=sweep_configs(c) if sweep else (),
                               split=has_split, variants=variants)
                row["config"] = chosen_config(doc, f"{c.name}.x1")
                split_row = row.pop("split")
                new = [row]
                if split_row:
                    split_row["config"] = chosen_config(doc, f"{split_name(c.name)}.x1")
                    new.append(split_row)
                for v in row.pop("variants"):
                    v["config"] = chosen_config(doc, f"{v['case']}.x1")
                    new.append(v)
                rows.extend(new)
                # each row as soon as it is measured (a run cut short by a time limit keeps what it had)
                for r in new:
                    click.echo("row: " + format_table([r]).splitlines()[-1])
            except Exception as e:  # one failing case must not hide the others' numbers
                failed.append(c.name)
                click.echo(f"{c.name}: FAILED: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
        del prog
        gc.collect()
        torch.cuda.empty_cache()
    order = {c.name: i for i, c in enumerate(case_list)}
    rows.sort(key=lambda r: (order[r["case"].split("@")[0]], "@" in r["case"]))
    click.echo(f"bench-matmul: {len(rows)} rows timed in {time.perf_counter() - t3:.1f} s")
    click.echo(format_table(rows))
    if sweep:
        click.echo("sweep: TFLOP/s per configuration (steady state)")
        for r in rows:
            click.echo(f"  {r['case']:<22} " + "  ".join(f"{k.split('_')[1]}:{v:.0f}" for k, v in r["sweep_tflops"].items()))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    bad = [r["case"] for r in rows if not r["ok"]] + failed
    if bad:
        raise click.ClickException(f"wrong or failed: {bad}")


__all__ = ["Case", "cases", "case_groups", "matmul_document", "plan_document", "bench_matmul_command", "repeats"]
