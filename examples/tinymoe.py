"""Example 4: TinyMoE-200M, the main workload (TARGETS.md), trained with AdamW + global-norm clipping.

Decoder-only LM: vocab 49152, d_model 768, 8 layers, 12 heads (head dim 64), RoPE (base 10000),
RMSNorm, causal attention (``latch::sdpa``), an MoE FFN in every layer: 16 experts, softmax router,
top-2 with the two weights renormalised, each expert a SwiGLU with hidden size 512 (no bias), tied
input/output embedding, cross-entropy. 207,729,408 parameters (150,994,944 in experts).
AdamW lr 3e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.1; clipping at global norm 1.0.

The MoE FFN uses Latch's MoE ops, all with static shapes (routing decisions are data):
``token_topk`` (router probabilities -> top-k gates and expert ids), ``route_order`` (the N*k
(token, slot) pairs sorted by expert: source token per row, row per pair, per-expert offsets) and
``ragged_mm`` (rows sorted by expert times their expert's weights); moving tokens into expert order
and back are ordinary ``index_select`` calls.

Workloads: ``build()`` is 2 x 1024 tokens; ``build(batch=8, microbatches=16)`` is 16 microbatches of
8 x 1024; ``build(device="meta")`` builds without allocating the 200M weights. Tests use a small
configuration, e.g. ``build(**SMALL)``.
"""


from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from latch_capture import Example
from latch_ops.moe.torch_ops import ragged_mm, route_order, token_topk
from transformer import Decoder, init_weights, make_config, make_example  # examples/ is on sys.path

PARAMETERS = 207_729_408  # TinyMoE-200M, asserted in tests on the meta device
EXPERT_PARAMETERS = 150_994_944

# A configuration small enough for FP64 checks in CI (same structure, every feature exercised).
SMALL = dict(vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32, batch=2, seq=16)


@dataclass(frozen=True)
class Config:
    vocab: int = 49152
    d_model: int = 768
    layers: int = 8
    heads: int = 12
    experts: int = 16
    top_k: int = 2
    expert_hidden: int = 512  # SwiGLU hidden size of each expert
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    batch: int = 2
    seq: int = 1024
    init_std: float = 0.02
    seed: int = 0
    # optimizer
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0
    microbatches: int = 1
    device: str = "cpu"  # "meta": no real weights (capture traces with fake tensors)
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def check(self) -> "Config":
        if self.d_model % self.heads:
            raise ValueError(f"Config: d_model={self.d_model} is not divisible by heads={self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"Config: head_dim={self.head_dim} must be even for RoPE's rotate-half")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"Config: top_k={self.top_k} must lie in [1, experts={self.experts}]")
        return self


class MoE(nn.Module):
    """Top-k softmax-routed mixture of SwiGLU experts with renormalised gates.

    Expert weights are stacked: w1, w3 [E, d, h] and w2 [E, h, d], so ``ragged_mm`` takes each
    expert's slice for the rows routed to it.
    """

    def __init__(self, d: int, hidden: int, experts: int, top_k: int, device=None, dtype=None):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(d, experts, bias=False, device=device, dtype=dtype)
        self.w1 = nn.Parameter(torch.empty(experts, d, hidden, device=device, dtype=dtype))
        self.w3 = nn.Parameter(torch.empty(experts, d, hidden, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, d, device=device, dtype=dtype))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, d]
        n = x.shape[0]
        probs = F.softmax(self.router(x), dim=-1)  # [N, E]
        gates, expert = token_topk(probs, self.top_k)  # [N, k], [N, k]
        gates = gates / gates.sum(dim=-1, keepdim=True)  # renormalise the k chosen weights
        token, position, offsets = route_order(expert, self.experts)  # [N*k], [N*k], [E+1]
        xs = x.index_select(0, token)  # rows in expert order
        h = F.silu(ragged_mm(xs, self.w1, offsets)) * ragged_mm(xs, self.w3, offsets)
        ys = ragged_mm(h, self.w2, offsets)  # [N*k, d]
        y = ys.index_select(0, position).view(n, self.top_k, shape[-1])  # back to (token, slot) order
        return (y * gates.unsqueeze(-1)).sum(dim=1).reshape(shape)


def make_model(cfg: Config) -> Decoder:
    dtype = getattr(torch, cfg.dtype)

    def ffn():
        return MoE(cfg.d_model, cfg.expert_hidden, cfg.experts, cfg.top_k, device=cfg.device, dtype=dtype)

    model = Decoder(cfg, ffn, device=cfg.device, dtype=dtype)
    init_weights(model, cfg.init_std, cfg.seed)
    return model


def build(**overrides) -> Example:
    cfg = make_config(Config, overrides)
    return make_example("tinymoe", cfg, make_model(cfg))
