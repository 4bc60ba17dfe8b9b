"""The GPU program against the FP64 reference, and its speed against eager PyTorch and a CUDA graph.

Gates (``gpu_compare``): for each of ``steps`` consecutive updates, the program runs one update on
the GPU, and the FP64 reference interpreter runs the same update from the same pre-update weights,
state and batch (copied off the GPU, so each step's gate measures that step's error and a drift in
one step cannot hide in, or blame, a later one). Groups: loss, every gradient (the document must
be captured with ``grads``), new params, the param update (new - old), new state, metrics; each
step prints a gate table (``latch_check.gates``).

Routing (a document captured with ``routing=True``, whose programs output each ``token_topk``
node's expert choice): under a reduced-precision policy the program may pick another expert than
FP64 for a token whose top-k probabilities nearly tie; everything downstream of that discrete
choice then differs by O(1), and gating it against pure FP64 would blame the kernel for rounding.
So each program run of the update is checked in two parts (:func:`reference_gates`):
- routing gates: per decision node, the program's choice against FP64's top-k of the FP64
  probabilities computed from the SAME upstream decisions (the reference replaying the program's
  routing up to that node), so each decision is judged on its own and a legitimate flip in layer 0
  cannot make layer 1's comparison meaningless; a flip passes only as a near-tie
  (``gates.ROUTING_FACTOR``);
- every continuous group, with the unchanged thresholds, against the FP64 reference run with the
  program's routing forced (``reference.run(..., force=...)``): what FP64 computes given the
  program's discrete decisions.
Routing a program could not have chosen (an index out of range or repeated) cannot be replayed:
its gate fails and the continuous groups are gated against the free reference, said in the title.

Thresholds (relative L2) depend on the numerical policy the document carries, and are fixed here,
not tuned per run: an all-FP32 program (``GATES_F32``) is held to about 100x the rounding error of
FP32 arithmetic over these reductions; a program with BF16 operands in its matrix products or
attention (``GATES_BF16``) to what 8-bit mantissas allow.

Timing (``bench``): one update of the program (all launches it takes) against the same update in
eager PyTorch (functional forward, ``torch.autograd.grad``, the example's optimizer function,
in-place copies), and against that eager update captured once in a CUDA graph and replayed; CUDA
events, medians, all measured in the same process. ``launch_counts`` counts the GPU activities
(kernels, copies, fills) of one program update with the torch profiler.

    latch-pipeline compile examples/mlp.py --target gpu --scheduler dataflow --steps 10 --bench
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from latch_core.document import Document, load

from . import reference
from .compare import CompareResult
from .gates import Gate, GateTable, RoutingGate, attach_torch, program_gates, routing_gate
from .policy import has_routing, policy_of  # noqa: F401  (re-exported: latch_check.gpu.policy_of)
from .timing import capture_graph, events_ms

GATES_F32 = {"loss": 1e-5, "grad": 1e-4, "new_params": 1e-5, "param_update": 1e-3, "new_state": 1e-4,
             "metric": 1e-4}
GATES_BF16 = {"loss": 1e-2, "grad": 5e-2, "new_params": 1e-3, "param_update": 1e-1, "new_state": 5e-2,
              "metric": 5e-2, "weight_copies": 5e-3}
"""``weight_copies`` (the update's BF16 copies of its new weights, ``memory.weight_copies``) against the
reference's new weights: the new weights' own gate (1e-3) plus BF16's unit roundoff 2^-8 = 3.9e-3 (round
to nearest with 8 significant bits: each element within 2^-8 of its value, so the relative L2 of the
rounding alone is at most 2^-8): 5e-3. A copy the update did not rewrite differs from the new weights
by the whole step (a first AdamW step moves each weight by about lr = 3e-4 against weights of ~0.02 at
initialisation: 1.5e-2); the GPU test ``tests/test_weight_copies_gpu.py`` also requires every copy to be
bit for bit ``new_param.to(torch.bfloat16)``."""


def thresholds_for(doc: Document) -> dict[str, float]:
    return dict(GATES_BF16 if policy_of(doc) == "bf16" else GATES_F32)


def policy_faithful_ops(ops=None):
    """The op registry with every reference rounding its float operands to bf16 where the node
    says ``operand_dtype="bf16"``, and its results where it says ``out_dtype="bf16"`` (math still in
    float64). Running the FP64 interpreter with it
    gives what a policy-following GPU computes, to rounding; comparing that against the plain
    FP64 reference tells a policy effect (e.g. a routing decision flipped by BF16 router operands)
    from a kernel error: a gate that fails for both has nothing to do with the kernel."""
    import attrs

    from latch_core.registry import Registry

    if ops is None:
        from latch_core.plugins import registries

        ops = registries().ops
    out = Registry("op")

    def rounded(ts):
        return [t.to(torch.bfloat16).to(t.dtype) if t is not None and t.is_floating_point() else t for t in ts]

    def rounding(ref):
        def run(inputs, node_attrs):
            if node_attrs.get("operand_dtype") == "bf16":
                inputs = rounded(inputs)
            res = ref(inputs, node_attrs)
            if node_attrs.get("out_dtype") == "bf16":  # a result the node writes in BF16 (memory.policy)
                res = rounded(res)
            return res
        return run

    for name, spec in ops.items():
        out.add(name, attrs.evolve(spec, extra={**spec.extra, "reference": rounding(spec.extra["reference"])}),
                ops.owner(name))
    return out


def _layout_dtypes(doc: Document) -> dict[str, torch.dtype]:
    from latch_ops.common import torch_dtype

    return {v.name: torch_dtype(v.dtype) for v in doc.graph.layout}


def _batch_dtypes(doc: Document) -> dict[str, torch.dtype]:
    from latch_ops.common import torch_dtype

    out = {}
    for g in doc.graph.programs:
        for grp in g.inputs:
            if grp.name == "batch":
                for n in grp.values:
                    out[n] = torch_dtype(g.value(n).dtype)
    return out


class GpuRun:
    """The example's weights, state and batches on the GPU, bound to a loaded program."""

    def __init__(self, example, build_dir: str | Path, *, device: str | torch.device = "cuda"):
        from latch_capture import bind_inputs
        from latch_codegen_h100 import Program

        self.example = example
        self.dir = Path(build_dir)
        self.doc = load(self.dir / "program.latch.json")
        self.prog = Program.load(self.dir, device=device)
        self.device = self.prog.device
        self.K = int(self.doc.graph.meta("microbatches", 1))
        self.hyper = dict(self.doc.graph.meta("hyper", ()) or ())
        flat = bind_inputs(self.doc, params=example.params(), state=example.initial_state(), inputs=example.inputs,
                           targets=example.targets, hyper=self.hyper)
        dts = _layout_dtypes(self.doc)
        self.layout = {n: flat[n].detach().to(self.device, dts[n]).contiguous().clone() for n in dts}
        self._bdt = _batch_dtypes(self.doc)

    def load_state(self, params: Mapping[str, torch.Tensor], state: Any) -> None:
        """Overwrite the layout's parameters and optimizer state (accumulators to zero)."""
        from latch_capture import bind_inputs

        flat = bind_inputs(self.doc, params=params, state=state, inputs=self.example.inputs,
                           targets=self.example.targets, hyper=self.hyper)
        for n, t in self.layout.items():
            t.copy_(flat[n].detach().to(t.device, t.dtype))

    def batches(self, step: int) -> list[tuple[Any, Any]]:
        return [self.example.microbatch(step * self.K + k) for k in range(self.K)]

    def gpu_batch(self, mb: tuple[Any, Any]) -> dict[str, torch.Tensor]:
        from latch_capture import batch_inputs

        return {n: t.detach().to(self.device, self._bdt.get(n, t.dtype)).contiguous()
                for n, t in batch_inputs(*mb).items()}

    def update(self, batches, *, check: bool = True) -> dict[str, torch.Tensor]:
        gb = [self.gpu_batch(b) for b in batches]
        return self.prog.run(self.layout, self.layout, gb if self.K > 1 else gb[0], self.hyper, check=check)

    def update_each(self, batches, *, check: bool = True) -> list[dict[str, torch.Tensor]]:
        """One update like :meth:`update`, returning the outputs of EVERY program it launches (the
        K-1 ``accumulate`` runs too: their routing decisions are needed to replay them)."""
        seq = ["accumulate"] * (self.K - 1) + ["accumulate_and_update"] if self.K > 1 else ["update"]
        return [self.prog.run_program(name, self.layout, self.layout, self.gpu_batch(b), self.hyper, check=check)
                for name, b in zip(seq, batches)]


# ------------------------------------------------------------------------------------------
# One update's gates: free FP64 reference, or routing gates + the reference replaying the routing


def decision_nodes(graph) -> list[tuple[Any, str]]:
    """(node, decision value) of every routing decision of ``graph``; each must be in its routing
    group, or the reference could not replay it (e.g. a recomputed copy of a token_topk)."""
    from latch_capture.programs import DECISIONS

    routed = set(graph.group("routing", outputs=True).values)
    out = []
    for n in graph.nodes:
        if n.op in DECISIONS:
            v = n.outputs[DECISIONS[n.op]]
            if v not in routed:
                src = f" (from {n.source})" if n.source else ""
                raise ValueError(f"program {graph.name!r}: node {n.name!r} ({n.op}){src} decides routing, but its "
                                 f"output {v!r} is not in the routing group, so its decision cannot be replayed; "
                                 "capture with routing=True, and keep passes that copy nodes (memory.remat) away "
                                 "from routing ops")
            out.append((n, v))
    return out


def _valid_choice(idx: torch.Tensor, experts: int) -> bool:
    if idx.numel() == 0:
        return True
    srt = torch.sort(idx.long(), dim=1).values
    return bool(((idx >= 0) & (idx < experts)).all()) and not bool((srt[:, 1:] == srt[:, :-1]).any())


def _routed_run(doc, graph, ins, outputs, ops, *, step, suffix) -> tuple[dict, list[RoutingGate], str]:
    """The reference of one program run replaying ``outputs``' routing, and its routing gates."""
    nodes = decision_nodes(graph)
    missing = [v for _, v in nodes if v not in outputs]
    if missing:
        raise KeyError(f"program {graph.name!r}: the program's outputs lack the routing decisions {missing[:4]}")
    chosen = {v: outputs[v].detach().cpu() for _, v in nodes}
    probs = [n.inputs[0] for n, _ in nodes]
    bad = [v for n, v in nodes if not _valid_choice(chosen[v], graph.value(n.inputs[0]).shape[1])]
    note = ""
    if bad:
        note = (f"routing {bad[:3]} names experts out of range or twice: continuous groups against the FREE FP64 "
                "reference")
        ref = reference.run(doc, graph.name, ins, ops=ops, keep=probs)
    else:
        ref = reference.run(doc, graph.name, ins, ops=ops, force=chosen, keep=probs)
    gates = []
    for n, v in nodes:
        p = ref[n.inputs[0]]
        fp64_choice = ops.get(n.op).extra["reference"]([p], n.attr_dict)[n.outputs.index(v)]
        gates.append(routing_gate(f"routing {n.name}{suffix}", p, chosen[v], fp64_choice, step=step))
    return ref, gates, note


def reference_gates(doc, flat: Mapping[str, torch.Tensor], batches: list, outputs: list[Mapping[str, torch.Tensor]], *,
                    thresholds: Mapping[str, float], step: int | None = None, ops=None,
                    torch_outputs: Mapping[str, torch.Tensor] | None = None, torch_routing: list | None = None,
                    state: str | None = None) -> tuple[list[Gate | RoutingGate], str]:
    """The gates of one update, on the CPU: ``(gates, note)``, ``note`` non-empty when the title
    must say how the reference was run.

    ``flat``: the update's inputs (layout values and hyper-parameters; floats in FP64) before it;
    ``batches``: its K microbatches ``(inputs, targets)``; ``outputs``: what the program returned,
    one dict per program run in order (K-1 ``accumulate`` then the last; only the last is needed
    without routing), the last with the in-place new values added. Without a routing group the
    last program's groups are gated against the free FP64 reference; with one, see the module
    docstring (routing gates of every run, then the continuous groups of the last run).

    ``torch_outputs`` (PyTorch's own update on the same inputs, ``latch_check.qualify``) fills the
    gates' ``torch`` column, against the same reference, or, for a routed program, against the
    reference replaying PyTorch's own routing (``torch_routing``: its expert indices per
    ``token_topk`` call; one microbatch only). ``state``: "fresh" or "trained" (``gates``).
    """
    from latch_capture import advance, batch_inputs, program_inputs, weight_copies

    if ops is None:
        from latch_core.plugins import registries

        ops = registries().ops
    section = doc.graph
    K = int(section.meta("microbatches", 1))
    if len(batches) != K:
        raise ValueError(f"the document was captured with {K} microbatches per update, got {len(batches)} batches")
    last = section.program("update" if K == 1 else "accumulate_and_update")
    seq = ([section.program("accumulate")] * (K - 1) if K > 1 else []) + [last]
    routed = has_routing(last)
    if routed and len(outputs) != K:
        raise ValueError(f"the document routes tokens: give the outputs of all {K} program runs of the update "
                         f"(GpuRun.update_each), got {len(outputs)}")
    flat = dict(flat)
    # The reference's cast never rounds, so its copy of a weight is the weight itself (what it read
    # before memory.weight_copies); the program's copy is the BF16 rounding of the same weight.
    for c, p in weight_copies(doc).items():
        flat[c] = flat[p]
    gates: list[Gate | RoutingGate] = []
    notes = []
    for k, (graph, mb) in enumerate(zip(seq, batches)):
        flat.update(batch_inputs(*mb))
        ins = program_inputs(graph, flat)
        if routed:
            suffix = f" [microbatch {k}]" if K > 1 else ""
            ref, rg, note = _routed_run(doc, graph, ins, outputs[k], ops, step=step, suffix=suffix)
            gates += rg
            notes += [note + suffix] if note else []
        else:
            ref = reference.run(doc, graph.name, ins, ops=ops)
        if k < K - 1:
            flat = advance(graph, flat, ref)
    main = program_gates(last, outputs[-1], ref, thresholds=thresholds, step=step, previous=ins)
    if torch_outputs is not None:
        ref_t = ref
        if routed:
            nodes = decision_nodes(last)
            if K > 1 or torch_routing is None or len(torch_routing) != len(nodes):
                ref_t = None
                notes.append("torch column not measured: PyTorch's routing can be replayed for one microbatch only"
                             if K > 1 else f"torch column not measured: PyTorch made {len(torch_routing or [])} "
                             f"routing decisions, the program {len(nodes)}")
            else:
                ref_t = reference.run(doc, last.name, ins, ops=ops,
                                      force={v: torch_routing[i] for i, (_, v) in enumerate(nodes)})
                notes.append("torch column against the reference replaying PyTorch's own routing")
        if ref_t is not None:
            tg = program_gates(last, torch_outputs, ref_t, thresholds=thresholds, step=step, previous=ins)
            main = attach_torch(main, tg, state)
    return main + gates, "; ".join(notes)


def gpu_compare(example, build_dir: str | Path, *, steps: int = 10, thresholds: Mapping[str, float] | None = None,
                progress: Callable[[str], None] | None = None, torch_column: bool = False,
                trained: int = 0) -> CompareResult:
    """Gate ``steps`` consecutive GPU updates against the FP64 reference (module docstring).

    ``torch_column``: each table also shows PyTorch's own update on the same inputs
    (``latch_check.qualify``; BF16 autocast under a BF16 policy) against the same FP64 reference.
    ``trained`` > 0: one more table, of the update from the state after ``trained`` eager FP32
    updates (``qualify.train``, on the GPU), with the batch after them: the trained state where
    ``param_update`` and ``new_params`` are gated by their absolute thresholds alone."""
    from latch_capture.programs import DECISIONS

    say = progress or (lambda m: None)
    run = GpuRun(example, build_dir)
    doc = run.doc
    th = dict(thresholds or thresholds_for(doc))
    last = doc.graph.program("update" if run.K == 1 else "accumulate_and_update")
    if "grads" not in {g.name for g in last.outputs}:
        say("gpu: the document has no gradient outputs (capture with grads=True to gate gradients)")
    routed = has_routing(last)
    if routed:
        decision_nodes(last)  # refuse an unreplayable document before running anything
    elif any(n.op in DECISIONS for n in last.nodes):
        say("gpu: the program routes tokens but outputs no routing decisions; a near-tie routing flip will show as "
            "O(1) errors downstream (capture with routing=True to gate routing separately)")
    bf16 = policy_of(doc) == "bf16"
    tables = []

    def one(step: int, batch_index: int, kind: str, where: str) -> None:
        batches = [example.microbatch(batch_index * run.K + k) for k in range(run.K)]
        # a copy taken before the program overwrites the layout in place
        flat = {n: (t.detach().double() if t.is_floating_point() else t.detach()).cpu().clone()
                for n, t in run.layout.items()}
        flat.update({n: torch.tensor(float(v), dtype=torch.float64) for n, v in run.hyper.items()})
        t_out, t_routing = None, []
        if torch_column:
            from .qualify import state_from_flat, torch_update

            params, state = state_from_flat(example, run.layout)
            t_out = torch_update(example, params, state, batches, run.hyper, bf16=bf16, device=run.device,
                                 routing=t_routing)
        runs = run.update_each(batches) if routed and run.K > 1 else [run.update(batches)]
        outputs = [{n: t.detach().cpu() for n, t in out.items()} for out in runs]
        for new, old in last.inplace:
            outputs[-1][new] = run.layout[old].detach().cpu()
        gates, note = reference_gates(doc, flat, batches, outputs, thresholds=th, step=step, torch_outputs=t_out,
                                      torch_routing=t_routing, state=kind)
        pt = (f"; torch: PyTorch's own {'BF16 autocast' if bf16 else 'FP32'} update on the same inputs"
              if torch_column else "")
        said = f", {where} state" if torch_column or trained > 0 else ""  # the state matters to the torch rule
        title = (f"{example.name or 'example'}: step {step} ({last.name}, K={run.K}, {doc.schedule.strategy}, "
                 f"policy {policy_of(doc)}{said}) GPU vs FP64 reference"
                 + (" replaying the GPU's routing" if routed else "") + pt + (f" ({note})" if note else ""))
        tables.append(GateTable(title, gates))
        say(f"gpu: step {step}: {'ok' if tables[-1].passed else 'FAILED'}")

    for step in range(steps):
        one(step, step, "fresh", "fresh")
    if trained > 0:
        from .qualify import train

        say(f"gpu: training {trained} eager FP32 updates for the trained-state gates")
        params, state = train(example, trained, hyper=run.hyper, device=run.device)
        run.load_state(params, state)
        one(trained, trained, "trained", f"trained ({trained} FP32 updates)")
    return CompareResult(tuple(tables))


# ------------------------------------------------------------------------------------------
# Timing


def _pipelined_ms(fn: Callable[[], Any], n: int) -> float:
    """ms per call over ``n`` back-to-back calls without waiting in between (the host may run
    ahead of the GPU, as in a training loop that does not read the loss every step)."""
    return events_ms(fn, 1, 1, reps=n)[0]


def _flatten(x, prefix=""):
    if isinstance(x, torch.Tensor):
        return [(prefix, x)]
    out = []
    if isinstance(x, Mapping):
        for k in sorted(x):
            out += _flatten(x[k], f"{prefix}.{k}" if prefix else str(k))
    return out


def eager_step_fn(example, device) -> tuple[Callable[[], torch.Tensor], dict]:
    """The example's update in eager PyTorch on ``device`` (FP32), writing params and state in place."""
    model = copy.deepcopy(example.model).to(device)
    opt = example.optimizer
    params = {n: p.detach().to(device).clone() for n, p in example.params().items()}
    state = example.initial_state()
    state = {k: v for k, v in (state or {}).items()}

    def to_dev(x):
        if isinstance(x, torch.Tensor):
            return x.detach().to(device).clone()
        if isinstance(x, Mapping):
            return {k: to_dev(v) for k, v in x.items()}
        return x

    state = to_dev(state)
    buffers = {n: b for n, b in model.named_buffers()}
    hyper = {n: torch.tensor(float(v), device=device) for n, v in (example.hyper or {}).items()}
    x, y = example.microbatch(0)
    x, y = to_dev(x), to_dev(y)

    def call(leaves):
        if isinstance(x, torch.Tensor):
            return torch.func.functional_call(model, {**leaves, **buffers}, (x,))
        if isinstance(x, Mapping):
            return torch.func.functional_call(model, {**leaves, **buffers}, (), dict(x))
        return torch.func.functional_call(model, {**leaves, **buffers}, tuple(x))

    def step():
        leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
        with torch.enable_grad():
            res = example.objective(call(leaves), y)
            loss = res if isinstance(res, torch.Tensor) else res[0]
            grads = torch.autograd.grad(loss, list(leaves.values()))
        out = opt.update(dict(params), dict(zip(leaves, grads)), state, hyper)
        for n, p in out[0].items():
            params[n].copy_(p)
        new_state = dict(_flatten(out[1]))
        for n, t in _flatten(state):
            if n in new_state and new_state[n] is not t:
                t.copy_(new_state[n])
        return loss.detach()

    return step, {"params": params, "state": state}


def launch_counts(step: Callable[[], Any], updates: int = 5) -> dict[str, float]:
    """GPU activities per call of ``step`` (one update), from the torch profiler: kernels, copies,
    fills, and the median duration of the Latch kernel."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(updates):
            step()
        torch.cuda.synchronize()
    kinds = {"latch_kernel": 0, "other_kernels": 0, "memcpy": 0, "memset": 0}
    kernel_us = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower()
        if "latch_kernel" in name:
            kinds["latch_kernel"] += 1
            kernel_us.append(e.time_range.elapsed_us())
        elif "memcpy" in name:
            kinds["memcpy"] += 1
        elif "memset" in name:
            kinds["memset"] += 1
        else:
            kinds["other_kernels"] += 1
    out = {k: v / updates for k, v in kinds.items()}
    if kernel_us:
        out["kernel_us_median"] = statistics.median(kernel_us)
    return out


def bench(example, build_dir: str | Path, *, iters: int = 50, warmup: int = 10, strongest: bool = False,
          eager: bool = True) -> dict[str, Any]:
    """Median ms per update: the Latch program, eager PyTorch, and eager captured in a CUDA graph;
    with ``strongest`` also the compiled model and loss with the whole update in one CUDA graph, and
    the same with only the model compiled (latch_check.controls ``graph`` and ``graph_model``);
    ``eager=False`` skips the two eager controls."""
    run = GpuRun(example, build_dir)
    batches = run.batches(0)
    gb = [run.gpu_batch(b) for b in batches]
    prog = run.prog
    batch_arg = gb if run.K > 1 else gb[0]

    def latch_step():  # what a training loop does: one update, the loss back (still on the GPU)
        return prog(run.layout, run.layout, batch_arg, run.hyper, check=False)

    res: dict[str, Any] = {}
    warmup = min(warmup, max(2, iters))  # a slow program with few iterations needs few warm-ups
    back_to_back = max(3, min(20, iters))
    t = events_ms(latch_step, iters, warmup)
    prog.check()
    res["latch_ms"] = statistics.median(t)
    res["latch_pipelined_ms"] = _pipelined_ms(latch_step, back_to_back)
    prog.check()
    n0 = prog.launches
    latch_step()
    prog.check()
    res["launches_per_update"] = prog.launches - n0
    try:
        res["activities_per_update"] = launch_counts(latch_step)
        prog.check()
    except Exception as e:  # the profiler is a measurement aid; its failure is reported, not fatal
        res["activities_per_update"] = f"profiler failed: {type(e).__name__}: {e}"
    if strongest:
        from .controls import compiled_graph_step

        bf16 = policy_of(run.doc) == "bf16"
        try:
            t0 = time.perf_counter()
            replay, info = compiled_graph_step(example, run.device, bf16=bf16)
            res["compiled_setup_s"] = time.perf_counter() - t0
            res["compiled_graph_ms"] = statistics.median(events_ms(replay, iters, min(warmup, 3)))
            res["compiled_graph_pipelined_ms"] = _pipelined_ms(replay, 20)
            res["compiled_parameters"] = info["parameters"]
        except Exception as e:  # reported, never a silent pass
            res["compiled_graph_ms"] = f"control failed: {type(e).__name__}: {e}"
        try:  # the same with the loss outside torch.compile: the strongest control as measured before 2026-12-06
            replay, _ = compiled_graph_step(example, run.device, bf16=bf16, kind="graph_model")
            res["compiled_graph_model_ms"] = statistics.median(events_ms(replay, iters, min(warmup, 3)))
        except Exception as e:
            res["compiled_graph_model_ms"] = f"control failed: {type(e).__name__}: {e}"
    if not eager:
        return res
    step, _ = eager_step_fn(example, run.device)
    res["eager_ms"] = statistics.median(events_ms(step, iters, warmup))
    res["eager_pipelined_ms"] = _pipelined_ms(step, 20)
    try:
        graph = capture_graph(step, warmup=3)
        res["cuda_graph_ms"] = statistics.median(events_ms(graph.replay, iters, warmup))
        res["cuda_graph_pipelined_ms"] = _pipelined_ms(graph.replay, 20)
    except Exception as e:
        res["cuda_graph_ms"] = f"capture failed: {type(e).__name__}: {e}"
    return res
