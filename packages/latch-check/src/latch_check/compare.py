"""Captured program (run by the FP64 reference interpreter) against PyTorch's own eager update in FP64.

Both start from the same weights, state and batches and then each follows its own trajectory for
``steps`` updates (so errors that compound over steps are seen). Each step is gated per group
(loss, each gradient, new params, param update, new state, metrics; see ``gates``).

The eager update is plain PyTorch on float64 copies of everything: ``functional_call`` of the
model, the objective, ``torch.autograd.grad``, and the user's optimizer function, run with float64
as the default dtype (tensors the model creates match the interpreter's float64) and with every
float dtype the code names read as float64 (:class:`Float64Everywhere`). That is the program's own
meaning of a cast: model code written for FP32 casts explicitly (Llama's RMSNorm
``.to(torch.float32)``, rotary ``.float()``, ``softmax(dtype=torch.float32)``, the loss's
``logits.float()``); in the captured FP32 program such a cast of an FP32 value is no node at all,
and the FP64 reference runs every float value at FP64 (a cast between float dtypes keeps its
operand's width, CONTRACTS.md section 1). Eager FP64 without the rule would round through FP32 at
each of those casts, and the check would measure FP32 rounding instead of the capture. With K
microbatches it accumulates the K gradients and losses in order and divides by K, the meaning of
the ``accumulate``/``accumulate_and_update`` programs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping

import attrs
import torch
from torch.overrides import TorchFunctionMode

from latch_capture import Example, advance, batch_inputs, bind_inputs, program_inputs
from latch_capture import tree as _tree
from latch_capture.errors import CaptureError

from . import reference
from .gates import FP64_THRESHOLD, GateTable, program_gates


class Float64Everywhere(TorchFunctionMode):
    """Every floating dtype that code passes to torch reads as float64: ``x.to(torch.float32)``,
    ``x.float()`` / ``.half()`` / ``.bfloat16()``, ``softmax(x, dtype=torch.float32)``,
    ``torch.zeros(..., dtype=torch.bfloat16)``. Integer and bool dtypes are untouched. Torch kernels
    with no float64 form (``grouped_mm``) run as a plain loop (``latch_capture.substitute``)."""

    _TO_F64 = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})

    def __init__(self):
        super().__init__()
        from latch_capture.substitute import eager_substitutes

        self._subs = eager_substitutes()  # torch kernels without a float64 form (grouped_mm)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._TO_F64:
            return args[0].double()
        args, kwargs = _f64_dtypes(args), _f64_dtypes(kwargs)
        sub = self._subs.get(func)
        if sub is not None:
            out = sub(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _f64_dtypes(x):
    if isinstance(x, torch.dtype):
        return torch.float64 if x.is_floating_point and x != torch.float64 else x
    if isinstance(x, tuple):
        return tuple(_f64_dtypes(v) for v in x)
    if isinstance(x, list):
        return [_f64_dtypes(v) for v in x]
    if isinstance(x, dict):
        return {k: _f64_dtypes(v) for k, v in x.items()}
    return x


@contextlib.contextmanager
def _default_dtype(dt: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _f64(x: Any) -> Any:
    """Float tensors -> float64 copies, recursively; everything else unchanged."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise CaptureError("the example's tensors are on the meta device",
                               hint="build the example with real (CPU) tensors to check it (--set device=cpu), "
                                    "or pass --steps 0 to plan it without a check")
        return x.detach().to(torch.float64).clone() if x.is_floating_point() else x.detach().clone()
    if isinstance(x, Mapping):
        return {k: _f64(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_f64(v) for v in x)
    return x


def _call(model, params: dict, buffers: dict, inputs: Any):
    if isinstance(inputs, torch.Tensor):
        return torch.func.functional_call(model, {**params, **buffers}, (inputs,))
    if isinstance(inputs, Mapping):
        return torch.func.functional_call(model, {**params, **buffers}, (), dict(inputs))
    return torch.func.functional_call(model, {**params, **buffers}, tuple(inputs))


def _split(res):
    if isinstance(res, torch.Tensor):
        return res, {}
    return res[0], dict(res[1])


def microbatch_update(example: Example, params: dict, state: Any, batches: list, hyper_t: Mapping[str, Any],
                      buffers: Mapping[str, Any], forward, *, loop_context=contextlib.nullcontext,
                      metric=lambda v: v.detach()) -> tuple[dict, dict, Any]:
    """The update every reference runs (the FP64 one here, PyTorch's own in qualify.py): per
    microbatch the optimizer's forward state, ``forward(leaves, buffers, inputs, targets) -> (loss,
    metrics)`` under grad and its gradients (in the parameters' dtypes), accumulated and averaged
    over the microbatches; then the optimizer's update. ``loop_context()`` wraps the microbatches
    only; ``metric`` maps each metric tensor to its output.

    Returns ``(outputs by value name, new params, new state)``; outputs use the captured names:
    ``loss``, ``grad.<p>``, ``new.<p>``, ``new.<state entry>``, ``metric.<m>``, and the zeroed
    microbatch accumulators."""
    opt = example.optimizer
    K = len(batches)
    acc: dict[str, torch.Tensor] = {}
    loss_acc = None
    metrics: dict = {}
    with loop_context():
        for inputs, targets in batches:
            fs = dict(opt.forward_state(dict(params), state, dict(hyper_t))) if opt.forward_state else {}
            leaves = {n: fs.get(n, p).detach().requires_grad_() for n, p in params.items()}
            bufs = {n: fs.get(n, b) for n, b in buffers.items()}
            with torch.enable_grad():
                loss, metrics = forward(leaves, bufs, inputs, targets)
                grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
            for (n, p), g in zip(params.items(), grads):
                g = torch.zeros_like(p) if g is None else g.to(p.dtype)
                acc[n] = g if n not in acc else acc[n] + g
            loss = loss.detach()
            loss_acc = loss if loss_acc is None else loss_acc + loss
    if K > 1:
        acc = {n: g / K for n, g in acc.items()}
        loss_acc = loss_acc / K
    res = opt.update(dict(params), dict(acc), state, dict(hyper_t))
    new_params, new_state = res[0], res[1]
    opt_metrics = dict(res[2]) if len(res) == 3 else {}
    out: dict[str, torch.Tensor] = {"loss": loss_acc}
    out.update({f"grad.{n}": g for n, g in acc.items()})
    out.update({f"new.{n}": p for n, p in new_params.items()})
    flat_state, _ = _tree.flatten(dict(new_state), "", "new_state")
    out.update({f"new.{n}": t for n, t in flat_state})
    out.update({f"metric.{k}": metric(v) for k, v in {**metrics, **opt_metrics}.items()})
    for n, p in params.items():  # microbatch accumulators are zero after an update
        out[f"new.grad_acc.{n}"] = torch.zeros_like(p)
    out["new.loss_acc"] = torch.zeros_like(loss_acc)
    return out, {n: p.detach() for n, p in new_params.items()}, _detach(new_state)


def eager_update(example: Example, params: dict, state: Any, batches: list[tuple[Any, Any]],
                 hyper: Mapping[str, float]) -> tuple[dict, dict, Any]:
    """One eager FP64 update over the given microbatches (:func:`microbatch_update`)."""
    model = example.model
    buffers = {n: _f64(b) for n, b in model.named_buffers()}
    hyper_t = {n: torch.tensor(float(v), dtype=torch.float64) for n, v in hyper.items()}

    def forward(leaves, bufs, inputs, targets):
        return _split(example.objective(_call(model, leaves, bufs, _f64(inputs)), _f64(targets)))

    with _default_dtype(torch.float64), Float64Everywhere():
        return microbatch_update(example, params, state, batches, hyper_t, buffers, forward)


def _detach(x):
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, Mapping):
        return {k: _detach(v) for k, v in x.items()}
    return x


@attrs.frozen
class CompareResult:
    tables: tuple[GateTable, ...]

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tables)

    def format(self) -> str:
        return "\n\n".join(t.format() for t in self.tables)


def compare(example: Example, doc=None, *, steps: int = 3, thresholds: float | Mapping[str, float] = FP64_THRESHOLD,
            hyper: Mapping[str, float] | None = None, progress: Callable[[str], None] | None = None,
            ops=None) -> CompareResult:
    """Gate the captured update against eager PyTorch in FP64 for ``steps`` updates.

    ``doc`` defaults to a fresh capture of the example with gradients as outputs.
    """
    say = progress or (lambda m: None)
    if doc is None:
        say(f"check: capturing {example.name or 'the example'}")
        doc = example.capture(grads=True, progress=progress, ops=ops)
    section = doc.graph
    K = int(section.meta("microbatches", 1))
    last = section.program("update" if K == 1 else "accumulate_and_update")
    acc_prog = section.program("accumulate") if K > 1 else None
    hyper_v = {**dict(section.meta("hyper", ()) or ()), **dict(hyper or {})}
    params = {n: _f64(p) for n, p in example.params().items()}
    state = _f64(example.initial_state())
    flat = bind_inputs(doc, params=params, state=state, inputs=example.inputs, targets=example.targets, hyper=hyper_v)
    e_params, e_state = dict(params), state
    tables = []
    for step in range(steps):
        batches = [example.microbatch(step * K + k) for k in range(K)]
        for k in range(K - 1):
            flat.update(batch_inputs(*batches[k]))
            out = reference.run(doc, acc_prog.name, program_inputs(acc_prog, flat), ops=ops)
            flat = advance(acc_prog, flat, out)
        flat.update(batch_inputs(*batches[-1]))
        ins = program_inputs(last, flat)
        out = reference.run(doc, last.name, ins, ops=ops)
        ref, e_params, e_state = eager_update(example, e_params, e_state, batches, hyper_v)
        gates = program_gates(last, out, ref, thresholds=thresholds, step=step, previous=ins)
        title = f"{example.name or 'example'}: step {step} ({last.name}, K={K}) FP64 interpreter vs eager FP64"
        tables.append(GateTable(title, gates))
        say(f"check: step {step}: {'ok' if tables[-1].passed else 'FAILED'}")
        flat = advance(last, flat, out)
    return CompareResult(tuple(tables))
