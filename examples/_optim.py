"""Optimizers as pure tensor functions, shared by the examples.

Each returns a ``latch_capture.TensorUpdate``: ``update(params, grads, state, hyper)`` with
``params``/``grads`` dicts keyed by parameter name, ``state`` a dict of tensors and ``hyper`` a dict
of 0-dim tensors (``hyper["lr"]`` when the example declares ``hyper={"lr": ...}``). Nothing is
modified in place; every formula is plain tensor arithmetic that capture records op by op.
"""

from __future__ import annotations

import torch

from latch_capture import tensor_update


def global_norm(grads: dict) -> torch.Tensor:
    """sqrt of the sum of squares of every gradient element (torch.nn.utils.clip_grad_norm_'s norm)."""
    total = None
    for g in grads.values():
        s = (g * g).sum()
        total = s if total is None else total + s
    return torch.sqrt(total)


def clip_by_global_norm(grads: dict, max_norm: float) -> tuple[dict, torch.Tensor]:
    """Scale all gradients by min(1, max_norm / (norm + 1e-6)), as clip_grad_norm_ does."""
    norm = global_norm(grads)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return {n: g * coef for n, g in grads.items()}, norm


def sgd(lr: float | None = None):
    """p <- p - lr * g; ``lr`` None reads hyper["lr"] (a run-time input), a number bakes it in."""

    def update(params, grads, state, hyper):
        rate = hyper["lr"] if lr is None else lr
        return {n: p - rate * grads[n] for n, p in params.items()}, state

    return tensor_update(update)


def adamw(*, lr: float | None = None, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
          max_norm: float | None = None):
    """AdamW (torch.optim.AdamW's formula, decoupled decay) with optional global-norm clipping.

    State: ``step`` (f32 scalar) and per parameter ``exp_avg.<name>`` and ``exp_avg_sq.<name>``.
    ``lr`` None reads ``hyper["lr"]``. Metric ``grad_norm`` (before clipping) when clipping.
    """
    b1, b2 = betas

    def init_state(params):
        state = {"step": torch.zeros((), dtype=torch.float32, device=next(iter(params.values())).device)}
        state["exp_avg"] = {n: torch.zeros_like(p) for n, p in params.items()}
        state["exp_avg_sq"] = {n: torch.zeros_like(p) for n, p in params.items()}
        return state

    def update(params, grads, state, hyper):
        metrics = {}
        if max_norm is not None:
            grads, norm = clip_by_global_norm(grads, max_norm)
            metrics["grad_norm"] = norm
        rate = hyper["lr"] if lr is None else lr
        step = state["step"] + 1
        bias1 = 1 - b1 ** step
        bias2 = 1 - b2 ** step
        step_size = rate / bias1
        new_p, new_m, new_v = {}, {}, {}
        for n, p in params.items():
            g = grads[n]
            m = state["exp_avg"][n] + (g - state["exp_avg"][n]) * (1 - b1)
            v = state["exp_avg_sq"][n] * b2 + (1 - b2) * g * g
            p = p * (1 - rate * weight_decay)
            denom = torch.sqrt(v) / torch.sqrt(bias2) + eps
            new_p[n] = p - step_size * m / denom
            new_m[n], new_v[n] = m, v
        return new_p, {"step": step, "exp_avg": new_m, "exp_avg_sq": new_v}, metrics

    # torch's own equivalent (fused AdamW after clip_grad_norm_), for the benchmark's controls
    control = {"optimizer": "adamw", "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
               "max_norm": max_norm}
    return tensor_update(update, init_state=init_state, control=control)
