"""PyTorch's own update on the same inputs, for the gate table's ``torch`` column, and the trained
state the gates are also taken at.

    outs = torch_update(example, params, state, batches, hyper, bf16=True, device="cuda")
    params, state = train(example, 200, device="cuda")      # the state after 200 FP32 updates

``torch_update`` is what a PyTorch user of the same model runs: FP32 master weights, the forward
and ``torch.autograd.grad`` under ``torch.autocast(bf16)`` (when ``bf16``; the precision the Latch
policy stands for), PyTorch's own attention and graph-safe MoE products
(``latch_check.torch_native``), then the example's optimizer function in FP32, outside autocast.
Its outputs carry the captured names (``loss``, ``grad.<p>``, ``new.<p>``, ``new.<state>``,
``metric.<m>``), so :func:`latch_check.gates.program_gates` measures it against the same FP64
reference as the program, group by group.

``train`` gives the *trained state* the gates are taken at besides the fresh one: ``updates``
updates of the example's own update in eager FP32 (the same functions, no autocast, no
substitutes: a trajectory independent of both implementations under test), over the example's
batches ``microbatch(0 .. updates*K - 1)``; the gated update then uses the next batch.

Why a trained state: at a fresh state AdamW's first update is ``-lr * m^/(sqrt(v^) + eps)`` with
``m^ = g``, ``v^ = g^2``: about ``-lr * sign(g)`` per element, so its error is set by how many
near-zero gradient entries change sign under rounding, not by how well the gradient is computed
(docs/GATES.md).
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping

import torch

from latch_capture import tree as _tree

from .compare import _call, _split, microbatch_update
from .torch_native import torch_native


def _to(x: Any, device, dtype=None) -> Any:
    if isinstance(x, torch.Tensor):
        y = x.detach().to(device)
        return (y.to(dtype) if dtype is not None and y.is_floating_point() else y).clone()
    if isinstance(x, Mapping):
        return {k: _to(v, device, dtype) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device, dtype) for v in x)
    return x


def _step(example, params: dict, state: Any, batches: list, hyper: Mapping[str, float], *, bf16: bool,
          native: bool, device) -> tuple[dict, dict, Any]:
    """PyTorch's own update (:func:`latch_check.compare.microbatch_update`): FP32 master values on
    ``device``, the forward under BF16 autocast when ``bf16``, Latch's ops as PyTorch's own when
    ``native``."""
    model = example.model
    dev = torch.device(device)
    buffers = {n: _to(b, dev) for n, b in model.named_buffers()}
    hyper_t = {n: torch.tensor(float(v), dtype=torch.float32, device=dev) for n, v in hyper.items()}

    def forward(leaves, bufs, inputs, targets):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            out = _call(model, leaves, bufs, _to(inputs, dev))
            loss, metrics = _split(example.objective(out, _to(targets, dev)))
        return loss.float(), metrics

    ctx = (lambda: torch_native(model)) if native else contextlib.nullcontext
    out, new_params, new_state = microbatch_update(example, params, state, batches, hyper_t, buffers, forward,
                                                   loop_context=ctx, metric=lambda v: v.detach().float())
    return {k: v.detach() for k, v in out.items()}, new_params, new_state


def torch_update(example, params: Mapping[str, torch.Tensor], state: Any, batches: list,
                 hyper: Mapping[str, float], *, bf16: bool = True, device: str | torch.device = "cpu",
                 routing: list | None = None) -> dict[str, torch.Tensor]:
    """PyTorch's own update of ``example`` from ``params``/``state`` over ``batches`` (module
    docstring); outputs by captured value name, on the CPU in FP64 (the values are FP32 or BF16).
    ``routing``: a list that receives the expert indices of every ``token_topk`` call, in order."""
    from .torch_native import recording

    p = {n: _to(t, device, torch.float32) for n, t in params.items()}
    s = _to(state, device, torch.float32)
    with recording() as rec:
        out, _, _ = _step(example, p, s, list(batches), hyper, bf16=bf16, native=True, device=device)
    if routing is not None:
        routing.extend(r.cpu() for r in rec)
    return {k: v.detach().cpu().double() for k, v in out.items()}


def state_from_flat(example, flat: Mapping[str, torch.Tensor]) -> tuple[dict, Any]:
    """The example's (params, optimizer state) structures from a document's flat input values."""
    params = {n: flat[n] for n in example.params()}
    leaves, rebuild = _tree.flatten(dict(example.initial_state() or {}), "", "state")
    missing = [n for n, _ in leaves if n not in flat]
    if missing:
        raise KeyError(f"the program's inputs lack the optimizer state entries {missing[:4]}")
    return params, rebuild([flat[n] for n, _ in leaves])


def train(example, updates: int, *, hyper: Mapping[str, float] | None = None,
          device: str | torch.device = "cpu") -> tuple[dict, Any]:
    """The state after ``updates`` eager FP32 updates of the example from its initialisation
    (params, optimizer state; on the CPU, FP32)."""
    K = int(example.microbatches or 1)
    hyper = dict(example.hyper or {}) if hyper is None else dict(hyper)
    params = {n: _to(t, device, torch.float32) for n, t in example.params().items()}
    state = _to(example.initial_state(), device, torch.float32)
    for u in range(updates):
        batches = [example.microbatch(u * K + k) for k in range(K)]
        _, params, state = _step(example, params, state, batches, hyper, bf16=False, native=False, device=device)
    return {n: t.cpu() for n, t in params.items()}, _to(state, "cpu")


__all__ = ["torch_update", "train", "state_from_flat", "cpu_tables"]


def cpu_tables(example, doc, *, trained: int = 0, thresholds: Mapping[str, float] | None = None,
               simulate: bool = True, seed: int = 0) -> list:
    """The gate tables of the CPU qualification (docs/GATES.md): at the fresh state and, with
    ``trained`` > 0, at the state after ``trained`` eager FP32 updates, one update of
    - the program as the BF16 policy computes it: the arena simulator (``simulate`` and a planned
      document) or the FP64 interpreter, each op rounding its operands to BF16 where the node says
      so (``gpu.policy_faithful_ops``; the math in FP64, so it is a lower bound of a GPU's error),
    - PyTorch's own BF16 autocast update (:func:`torch_update`, the ``torch`` column),
    both against Latch's FP64 interpreter on the same inputs, with the GPU's thresholds; for a routed
    program each against the interpreter replaying its own routing (the policy's decisions for the
    policy, PyTorch's for the torch column), as the GPU's gates do: a near-tie flip of the top-k
    moves whole tokens between experts and is not a numerical error."""
    from latch_capture import batch_inputs, bind_inputs, program_inputs

    from . import reference
    from .compare import _f64
    from .gates import GateTable, attach_torch, program_gates
    from .gpu import policy_faithful_ops, thresholds_for

    section = doc.graph
    K = int(section.meta("microbatches", 1))
    if K != 1:
        raise ValueError("qualify.cpu_tables: one microbatch per update only (capture with microbatches=1)")
    last = section.program("update")
    hyper = dict(section.meta("hyper", ()) or ())
    th = dict(thresholds or thresholds_for(doc))
    rounded = policy_faithful_ops()
    from latch_capture.programs import DECISIONS

    decisions = [n.outputs[DECISIONS[n.op]] for n in last.nodes if n.op in DECISIONS]
    planned = simulate and doc.schedule is not None and doc.memory is not None
    states = [("fresh", 0, None)]
    if trained > 0:
        states.append(("trained", trained, train(example, trained, hyper=hyper)))
    tables = []
    for kind, index, st in states:
        params, state = st if st is not None else ({n: p.detach() for n, p in example.params().items()},
                                                   example.initial_state())
        batches = [example.microbatch(index)]
        flat = bind_inputs(doc, params=_f64(params), state=_f64(state), inputs=example.inputs,
                           targets=example.targets, hyper=hyper)
        flat.update(batch_inputs(*batches[0]))
        ins = program_inputs(last, flat)
        if planned:
            from .simulator import simulate as sim

            prog = sim(doc, last.name, ins, seed, ops=rounded)
        else:
            prog = reference.run(doc, last.name, ins, ops=rounded, keep=decisions)
        ref = reference.run(doc, last.name, ins)
        if decisions:  # the policy's own routing replayed, as the GPU's gates do (gpu._routed_run)
            missing = [d for d in decisions if d not in prog]
            if missing:
                raise ValueError(f"qualify.cpu_tables: the program's outputs lack the routing decisions {missing[:4]}; "
                                 "compile with routing exposed (compile_example(routing=True))")
            ref = reference.run(doc, last.name, ins, force={d: prog[d] for d in decisions})
        t_routing: list = []
        t_out = torch_update(example, params, state, batches, hyper, bf16=True, routing=t_routing)
        ref_t = ref
        if decisions:  # PyTorch's own routing replayed: a near-tie flip is not a numerical error
            if len(t_routing) != len(decisions):
                raise ValueError(f"PyTorch made {len(t_routing)} routing decisions, the program {len(decisions)}")
            ref_t = reference.run(doc, last.name, ins, force=dict(zip(decisions, t_routing)))
        gates = attach_torch(program_gates(last, prog, ref, thresholds=th, step=index, previous=ins),
                             program_gates(last, t_out, ref_t, thresholds=th, step=index, previous=ins), kind)
        how = "arena simulator" if planned else "FP64 interpreter"
        label = "fresh state" if kind == "fresh" else f"trained state ({trained} FP32 updates)"
        tables.append(GateTable(f"{example.name or 'example'}: {label}: the BF16 policy ({how}, operands rounded to "
                                "BF16) and PyTorch's own BF16 autocast update (torch) vs the FP64 interpreter", gates))
    return tables
