"""The PyTorch controls of an update (TARGETS.md), on the same model, weights and batches.

    with control(example, device, "graph", batches) as step:   # step() runs one update
        ...
    step, info = compiled_graph_step(example, device)           # the strongest, as a replay function

Kinds (``KINDS``):
- ``eager``: the model as written, ``loss.backward()``, ``torch.nn.utils.clip_grad_norm_``
  (foreach), ``torch.optim.AdamW(foreach=True)``;
- ``compiled``: the forward AND the objective in one ``torch.compile``'d function (inductor fuses
  the loss into what produces its input: the cross-entropy reads the BF16 logits once instead of
  materialising FP32 copies of them), the same backward and clipping, ``torch.optim.AdamW(fused=True)``;
- ``graph`` (the strongest): ``compiled`` with ``AdamW(fused=True, capturable=True)`` and the whole
  update, every microbatch included, captured in ONE CUDA graph and replayed;
- ``graph_model``: ``graph`` with only the model compiled and the objective run eagerly inside the
  graph: the strongest control as this project measured it up to 2026-12-06 (results/gpu.md runs
  24-56), kept so that those ratios can be set beside the new ones.
Each needs an example whose optimizer says what it is in torch terms (``TensorUpdate.control``,
e.g. examples/_optim.py's ``adamw``). Parameters are FP32 like the Latch program's master weights;
the forward runs under ``torch.autocast(bf16)`` when ``bf16`` (the policy the Latch program follows).
Latch's ops in the model run as PyTorch's own (``latch_check.torch_native``: flash SDPA, the
graph-safe MoE with ``torch._grouped_mm``), in every kind, so the controls differ only in how
PyTorch runs them. With K microbatches each runs forward and backward of ``loss / K`` per
microbatch (gradients accumulate in ``.grad``), then clipping and one optimizer step.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from .timing import capture_graph
from .torch_native import torch_native

KINDS = ("eager", "compiled", "graph", "graph_model")
GRAPHED = ("graph", "graph_model")  # the kinds captured in one CUDA graph


class ControlError(RuntimeError):
    pass


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device).clone()
    if isinstance(x, Mapping):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


def _settings(example) -> dict:
    ctl = getattr(example.optimizer, "control", None)
    if not ctl or ctl.get("optimizer") != "adamw":
        raise ControlError(f"example {getattr(example, 'name', '?')!r}: its optimizer does not say what it is in torch "
                           "terms (TensorUpdate.control); the controls run torch's AdamW")
    ctl = dict(ctl)
    if ctl.get("lr") is None:
        ctl["lr"] = float((example.hyper or {}).get("lr", 1e-3))
    return ctl


@contextlib.contextmanager
def importable(model: torch.nn.Module):
    """While inside: the modules that define ``model``'s classes are in ``sys.modules``. An example
    file is loaded under a private module name (``latch_capture.examples.load_module``) that is not
    registered there; torch.compile imports the module of every function it inlines from another
    module (TinyMoE's ``MoE.forward`` called from transformer.py's ``Block``), and would fail."""
    import sys

    from latch_capture.examples import MODULES

    known = {m.__name__: m for m in MODULES.values()}
    added = []
    for m in model.modules():
        name = type(m).__module__
        if name not in sys.modules and name in known:
            sys.modules[name] = known[name]
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def control(example, device, kind: str, batches: Sequence[tuple[Any, Any]] | None = None, *, bf16: bool = True,
            warmup: int = 3, backend: str = "inductor") -> Iterator[Callable[[], torch.Tensor]]:
    """While inside: ``step()`` runs one update of ``kind`` over ``batches`` (default: the
    example's first microbatch), returning the mean loss (on the device). See the module docstring.
    ``backend``: torch.compile's (tests on the CPU use ``aot_eager``)."""
    if kind not in KINDS:
        raise ControlError(f"unknown control {kind!r}; choose from {KINDS}")
    ctl = _settings(example)
    device = torch.device(device)
    model = copy.deepcopy(example.model).to(device)
    params = list(model.parameters())
    if kind == "eager":
        opt = torch.optim.AdamW(params, lr=ctl["lr"], betas=ctl["betas"], eps=ctl["eps"],
                                weight_decay=ctl["weight_decay"], foreach=True)
    else:
        lr = torch.tensor(ctl["lr"], device=device) if kind in GRAPHED else ctl["lr"]
        opt = torch.optim.AdamW(params, lr=lr, betas=ctl["betas"], eps=ctl["eps"], weight_decay=ctl["weight_decay"],
                                fused=True, capturable=kind in GRAPHED)
    max_norm = ctl.get("max_norm")
    if kind != "eager":
        torch._dynamo.reset()  # each control compiles its own copy from nothing, not against an earlier one's guards
    fwd = torch.compile(model, backend=backend) if kind == "graph_model" else model
    batches = [_to(b, device) for b in (batches if batches is not None else [example.microbatch(0)])]
    K = len(batches)

    def call(x):
        if isinstance(x, Mapping):
            return fwd(**x)
        if isinstance(x, (tuple, list)):
            return fwd(*x)
        return fwd(x)

    def forward_loss(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            res = example.objective(call(x), y)
        return res if isinstance(res, torch.Tensor) else res[0]

    if kind in ("compiled", "graph"):
        forward_loss = torch.compile(forward_loss, backend=backend)

    def step():
        total = None
        for x, y in batches:
            loss = forward_loss(x, y)
            (loss / K if K > 1 else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return total / K if K > 1 else total

    with torch_native(model), importable(model):
        if kind not in GRAPHED:
            yield step
            return
        # the warm-up calls compile, allocate the gradients and the optimizer state
        graph = capture_graph(step, warmup=warmup, device=device)
    yield graph.replay


def compiled_graph_step(example, device, *, bf16: bool = True, warmup: int = 3,
                        batches: Sequence[tuple[Any, Any]] | None = None,
                        kind: str = "graph") -> tuple[Callable[[], Any], dict]:
    """The strongest control as ``(replay, info)``: ``replay()`` runs one update (module docstring);
    ``kind`` one of ``GRAPHED``."""
    if kind not in GRAPHED:
        raise ControlError(f"compiled_graph_step: {kind!r} is not captured in a CUDA graph; choose from {GRAPHED}")
    gen = control(example, device, kind, batches, bf16=bf16, warmup=warmup)
    replay = gen.__enter__()  # the graph needs nothing of the context after capture
    gen.__exit__(None, None, None)
    return replay, {"parameters": sum(p.numel() for p in example.model.parameters()), "bf16": bf16}


__all__ = ["control", "compiled_graph_step", "KINDS", "GRAPHED", "ControlError"]
