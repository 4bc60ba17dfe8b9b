"""Example 3: a dense GPT-style decoder trained with AdamW + global-norm clipping.

RMSNorm, rotary position embeddings (RoPE, rotate-half form), causal attention through Latch's own
``latch::sdpa`` custom op, a SwiGLU MLP, tied input/output embedding, cross-entropy. The building
blocks (RMSNorm, RoPE, attention) are shared with ``tinymoe.py``.

Everything is ordinary PyTorch a user could have written; the only Latch-specific call is
``latch_ops.attention.sdpa`` in place of ``F.scaled_dot_product_attention`` (so the captured graph
holds one device-neutral attention node with its own backward).

``build(**overrides)`` returns a ``latch_capture.Example`` (what ``capture_module`` takes); the
overrides are the fields of :class:`Config`, e.g. ``build(d_model=128, layers=4)``:

    latch-pipeline capture examples/transformer.py -o transformer.latch.json --set layers=4
"""


import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from _optim import adamw  # examples/ is on sys.path while latch_capture.load_example loads an example
from latch_capture import Example
from latch_ops.attention import sdpa


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    mlp_hidden: int = 128  # SwiGLU hidden size
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    batch: int = 2
    seq: int = 32
    init_std: float = 0.02
    seed: int = 0
    # optimizer
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0
    microbatches: int = 1
    device: str = "cpu"  # "meta" builds the model without allocating its weights
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def check(self) -> "Config":
        if self.d_model % self.heads:
            raise ValueError(f"Config: d_model={self.d_model} is not divisible by heads={self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"Config: head_dim={self.head_dim} must be even for RoPE's rotate-half")
        return self


def make_config(cls, overrides: dict):
    """``cls`` with ``overrides`` applied; an unknown key is an error naming the valid ones."""
    names = {f.name for f in fields(cls)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise TypeError(f"{cls.__qualname__}: unknown override(s) {bad}; valid: {sorted(names)}")
    return replace(cls(), **overrides).check()


# --------------------------------------------------------------------------------------------
# Building blocks (shared with tinymoe.py)

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq: int, head_dim: int, base: float, like: torch.Tensor):
    """cos, sin [seq, head_dim/2] for positions 0..seq-1, computed in the traced program (so the
    model builds on the meta device and the tables follow the program's dtype)."""
    half = head_dim // 2
    inv_freq = torch.exp(torch.arange(half, dtype=like.dtype, device=like.device) * (-2.0 * math.log(base) / head_dim))
    angles = torch.arange(seq, dtype=like.dtype, device=like.device).unsqueeze(1) * inv_freq.unsqueeze(0)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on x [B, H, T, D] with cos/sin [T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)  # (its backward is one cat; slicing's is two zero-padded slice_backwards)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE; attention itself is one ``latch::sdpa`` node."""

    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False, device=device, dtype=dtype)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False, device=device, dtype=dtype)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = sdpa(q, k, v, causal=True)  # [B, H, T, D]
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int, device=None, dtype=None):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False, device=device, dtype=dtype)
        self.w3 = nn.Linear(d, hidden, bias=False, device=device, dtype=dtype)
        self.w2 = nn.Linear(hidden, d, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg, ffn: nn.Module, device=None, dtype=None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, device=device, dtype=dtype)
        self.attn = Attention(cfg, device=device, dtype=dtype)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, device=device, dtype=dtype)
        self.ffn = ffn

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Decoder(nn.Module):
    """Token embedding (tied with the output head), blocks, final RMSNorm, logits."""

    def __init__(self, cfg, make_ffn, device=None, dtype=None):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(Block(cfg, make_ffn(), device=device, dtype=dtype) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, device=device, dtype=dtype)
        self.head_dim, self.rope_base = cfg.head_dim, cfg.rope_base

    def forward(self, tokens):
        x = self.embed(tokens)
        cos, sin = rope_tables(tokens.shape[1], self.head_dim, self.rope_base, x)  # once, for every layer
        for block in self.blocks:
            x = block(x, cos, sin)
        return F.linear(self.norm(x), self.embed.weight)  # tied output embedding


def init_weights(model: nn.Module, std: float, seed: int) -> None:
    """Normal(0, std) matrices and embeddings, ones for norms; deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type == "meta":
                continue
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).mul_(std).to(p.dtype))


def cross_entropy(logits, targets):
    """The objective: mean next-token cross-entropy over every position."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example_batch(cfg, seed: int = 1):
    """(tokens, targets) [batch, seq] int64, distinct tensors (capture must not see one object twice)."""
    if cfg.device == "meta":
        return (torch.empty(cfg.batch, cfg.seq, dtype=torch.long, device="meta"),
                torch.empty(cfg.batch, cfg.seq, dtype=torch.long, device="meta"))
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)
    return seq[:, :-1].clone(), seq[:, 1:].clone()


def make_model(cfg: Config) -> Decoder:
    dtype = getattr(torch, cfg.dtype)
    model = Decoder(cfg, lambda: SwiGLU(cfg.d_model, cfg.mlp_hidden, device=cfg.device, dtype=dtype),
                    device=cfg.device, dtype=dtype)
    init_weights(model, cfg.init_std, cfg.seed)
    return model


def make_example(name: str, cfg, model: nn.Module) -> Example:
    """The Example for a decoder ``model``: cross-entropy, AdamW + clipping with ``lr`` a run-time
    hyper-parameter, and a deterministic batch per microbatch index (none on the meta device)."""
    tokens, targets = example_batch(cfg, seed=cfg.seed * 1_000_003 + 1)

    def batch(index: int):
        return example_batch(cfg, seed=cfg.seed * 1_000_003 + 1 + index)

    return Example(
        name=name,
        model=model,
        objective=cross_entropy,
        inputs=tokens,
        targets=targets,
        optimizer=adamw(betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, max_norm=cfg.clip),
        hyper={"lr": cfg.lr},
        microbatches=cfg.microbatches,
        batch=None if cfg.device == "meta" else batch,
    )


def build(**overrides) -> Example:
    cfg = make_config(Config, overrides)
    return make_example("transformer", cfg, make_model(cfg))
