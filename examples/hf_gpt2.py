"""Example: transformers' GPT-2 (``GPT2LMHeadModel``), unchanged, tiny configuration.

Learned position embeddings, LayerNorm, GELU (tanh form) MLP in ``Conv1D`` layers, causal
attention through PyTorch's SDPA (transformers' default ``attn_implementation="sdpa"``), tied
output head, the model's own ``labels=`` loss. See ``_hf.py`` for the training setup.

    latch-pipeline check examples/hf_gpt2.py
    latch-pipeline compile examples/hf_gpt2.py --set layers=4
"""

from dataclasses import dataclass

from _hf import lm_example, make_config, seeded
from latch_capture import Example


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    positions: int = 64
    batch: int = 2
    seq: int = 32
    seed: int = 0
    lr: float = 1e-3
    clip: float = 1.0
    microbatches: int = 1
    attn: str = "sdpa"  # transformers' attn_implementation ("sdpa" is its default, "eager" works too)


def build(**overrides) -> Example:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = make_config(Config, overrides)
    hf = GPT2Config(vocab_size=cfg.vocab, n_positions=cfg.positions, n_embd=cfg.d_model, n_layer=cfg.layers,
                    n_head=cfg.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    bos_token_id=0, eos_token_id=0, attn_implementation=cfg.attn)
    return lm_example("hf_gpt2", seeded(cfg.seed, lambda: GPT2LMHeadModel(hf)), cfg)
