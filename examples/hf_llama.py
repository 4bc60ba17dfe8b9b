"""Example: transformers' Llama (``LlamaForCausalLM``), unchanged, tiny configuration.

RMSNorm and rotary embeddings computed in FP32 by explicit casts (``.to(torch.float32)``,
``.float()``), grouped-query attention (4 query heads, 2 key/value heads) through PyTorch's SDPA,
a SwiGLU MLP, untied output head, the model's own ``labels=`` loss. See ``_hf.py``.

    latch-pipeline check examples/hf_llama.py
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
    kv_heads: int = 2
    mlp_hidden: int = 128
    positions: int = 64
    batch: int = 2
    seq: int = 32
    seed: int = 0
    lr: float = 1e-3
    clip: float = 1.0
    microbatches: int = 1
    attn: str = "sdpa"


def build(**overrides) -> Example:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = make_config(Config, overrides)
    hf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.mlp_hidden,
                     num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                     max_position_embeddings=cfg.positions, attn_implementation=cfg.attn)
    return lm_example("hf_llama", seeded(cfg.seed, lambda: LlamaForCausalLM(hf)), cfg)
