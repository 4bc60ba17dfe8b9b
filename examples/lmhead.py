"""The LM head with cross-entropy alone (issue 11's benchmark, ``latch-pipeline bench-lmhead``).

    logits = (hidden + x) @ weight^T        hidden [T, D], weight [V, D] parameters, x [T, D] batch
    loss   = cross_entropy(logits, targets) mean over the T rows

``hidden`` stands for the last hidden states: as a parameter, its gradient is the head's input
gradient dX (the batch input ``x`` shifts it, so each batch differs). The update outputs the loss
and the gradients (dX, dW) and leaves the parameters as they are (no optimizer traffic), so the
program is exactly the head's forward and backward. Defaults are small; the benchmark's size is
``--set tokens=2048 --set d_model=768 --set vocab=49152``.
"""

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from latch_capture import Example, tensor_update


@dataclass(frozen=True)
class Config:
    tokens: int = 64
    d_model: int = 64
    vocab: int = 512
    seed: int = 0
    init_std: float = 0.02
    ignore_every: int = 0  # > 0: every k-th target is -100 (F.cross_entropy's ignore_index)
    device: str = "cpu"


class LMHead(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        g = torch.Generator().manual_seed(cfg.seed)
        self.hidden = nn.Parameter(torch.randn(cfg.tokens, cfg.d_model, generator=g).to(cfg.device))
        self.weight = nn.Parameter((torch.randn(cfg.vocab, cfg.d_model, generator=g) * cfg.init_std).to(cfg.device))

    def forward(self, x):
        return F.linear(self.hidden + x, self.weight)


def cross_entropy(logits, targets):
    return F.cross_entropy(logits, targets)


def batch(cfg: Config, index: int):
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7 + index)
    t = torch.randint(0, cfg.vocab, (cfg.tokens,), generator=g)
    if cfg.ignore_every > 0:
        t[::cfg.ignore_every] = -100
    return torch.randn(cfg.tokens, cfg.d_model, generator=g) * 0.1, t


def keep(params, grads, state, hyper):
    """No optimizer: the parameters stay (the update's outputs are the loss and the gradients)."""
    return {n: p for n, p in params.items()}, state


def build(**overrides) -> Example:
    names = {f.name for f in fields(Config)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise TypeError(f"lmhead: unknown override(s) {bad}; valid: {sorted(names)}")
    cfg = replace(Config(), **overrides)
    x, t = batch(cfg, 0)
    return Example(name="lmhead", model=LMHead(cfg), objective=cross_entropy, inputs=x, targets=t,
                   optimizer=tensor_update(keep), batch=lambda i: batch(cfg, i))
