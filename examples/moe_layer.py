"""TinyMoE-200M's expert layer alone: the MoE FFN of one layer (router softmax, top-2 with the two
gates renormalised, route_order, the three ragged SwiGLU products, the deterministic combine),
forward and backward, on given hidden states, trained with plain SGD on a mean-squared error.

The shapes are TinyMoE-200M's (d_model 768, 16 experts, top-2, expert hidden 512, 2 x 1024 tokens:
4,096 routed rows); ``latch-pipeline bench-moe`` times this update inside the persistent kernel
against torch. The router is scaled up (``router_std``) so that routing is far from uniform and
the experts' segments are ragged.

    latch-pipeline compile examples/moe_layer.py --set tokens=256 --set d_model=64 --set expert_hidden=32
"""

import torch

from latch_capture import Example
from _optim import sgd
from tinymoe import MoE  # examples/ is on sys.path


def objective(y, target):
    return ((y - target) ** 2).mean(), {}


def build(tokens: int = 2048, d_model: int = 768, experts: int = 16, top_k: int = 2, expert_hidden: int = 512,
          lr: float = 1e-2, router_std: float = 0.5, seed: int = 0, device: str = "cpu") -> Example:
    g = torch.Generator().manual_seed(seed)
    model = MoE(d_model, expert_hidden, experts, top_k, device=device)
    with torch.no_grad():
        if device != "meta":
            model.router.weight.copy_(torch.randn(model.router.weight.shape, generator=g) * router_std / d_model ** 0.5)
            for w in (model.w1, model.w3):
                w.copy_(torch.randn(w.shape, generator=g) / d_model ** 0.5)
            model.w2.copy_(torch.randn(model.w2.shape, generator=g) / expert_hidden ** 0.5)

    def batch_fn(index: int):
        gb = torch.Generator().manual_seed(seed * 100_003 + 1 + index)
        return torch.randn(tokens, d_model, generator=gb), torch.randn(tokens, d_model, generator=gb)

    x, t = batch_fn(0) if device != "meta" else (torch.empty(tokens, d_model, device="meta"),) * 2
    return Example(
        name="moe_layer",
        model=model,
        objective=objective,
        inputs=x,
        targets=t,
        optimizer=sgd(),
        hyper={"lr": lr},
        batch=batch_fn if device != "meta" else None,
    )
