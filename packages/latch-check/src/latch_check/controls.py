"""The strongest PyTorch control of an update: the compiled model, torch's fused AdamW and
``clip_grad_norm_``, the whole update captured in ONE CUDA graph (TARGETS.md's "strongest").

    step, info = compiled_graph_step(example, device)   # step() replays the graph: one update

What it runs, for an example whose optimizer says what it is in torch terms
(``TensorUpdate.control``, e.g. examples/_optim.py's ``adamw``): ``torch.compile(model)`` forward,
the example's objective, ``loss.backward()``, ``torch.nn.utils.clip_grad_norm_`` (foreach),
``torch.optim.AdamW(fused=True, capturable=True)``. Attention written with Latch's ``latch_ops.
attention.sdpa`` (whose eager form is a reference formula) runs as torch's own
``F.scaled_dot_product_attention`` (flash) in the control, so the control is the fastest PyTorch has.
Parameters are FP32 like the Latch program's master weights; the matrix products run in BF16 under
``torch.autocast`` when ``bf16`` (the policy the Latch program follows).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F


class ControlError(RuntimeError):
    pass


def _flash_sdpa(q, k, v, *, causal: bool = True, scale: float | None = None):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@contextlib.contextmanager
def flash_attention(model: torch.nn.Module):
    """While inside: modules whose code calls ``latch_ops.attention.sdpa`` call torch's flash SDPA."""
    from latch_ops.attention import sdpa

    patched = []
    for m in model.modules():
        g = getattr(type(m).forward, "__globals__", {})
        for name, v in list(g.items()):
            if v is sdpa:
                patched.append((g, name))
                g[name] = _flash_sdpa
    try:
        yield
    finally:
        for g, name in patched:
            g[name] = sdpa


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device).clone()
    if isinstance(x, Mapping):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def compiled_graph_step(example, device, *, bf16: bool = True, warmup: int = 3) -> tuple[Callable[[], Any], dict]:
    """One update of ``example`` as the strongest control: see the module docstring. Returns
    (``replay``, info) where ``replay()`` runs one update (the graph's replay)."""
    ctl = getattr(example.optimizer, "control", None)
    if not ctl or ctl.get("optimizer") != "adamw":
        raise ControlError(f"example {getattr(example, 'name', '?')!r}: its optimizer does not say what it is in torch "
                           "terms (TensorUpdate.control); the compiled control runs torch's fused AdamW")
    lr = ctl.get("lr")
    if lr is None:
        lr = float((example.hyper or {}).get("lr", 1e-3))
    model = copy.deepcopy(example.model).to(device)
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=torch.tensor(lr, device=device), betas=ctl["betas"], eps=ctl["eps"],
                            weight_decay=ctl["weight_decay"], fused=True, capturable=True)
    max_norm = ctl.get("max_norm")
    cmodel = torch.compile(model)
    x, y = example.microbatch(0)
    x, y = _to(x, device), _to(y, device)

    def call():
        if isinstance(x, Mapping):
            return cmodel(**x)
        return cmodel(x)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            res = example.objective(call(), y)
        loss = res if isinstance(res, torch.Tensor) else res[0]
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.detach()

    with flash_attention(model):
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            for _ in range(warmup):  # compiles, allocates the gradients and the optimizer state
                step()
        torch.cuda.current_stream(device).wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = step()
    return graph.replay, {"loss": loss, "parameters": sum(p.numel() for p in params), "bf16": bf16}


__all__ = ["compiled_graph_step", "flash_attention", "ControlError"]
