"""Example: transformers' Mixtral (``MixtralForCausalLM``), unchanged, tiny configuration.

Llama-style attention (GQA through PyTorch's SDPA) with a sparse MoE FFN in every layer: a softmax
router, top-2 of 4 experts with renormalised weights, and transformers' default experts
implementation ``grouped_mm`` (sort by expert, histc + cumsum offsets, grouped products), which
capture records as Latch's routing ops (route_order, ragged_mm). ``experts_impl="batched_mm"`` (gathered
expert weights, batched products) works too; ``experts_impl="eager"`` (a loop over ``nonzero``) is
refused with a message naming these switches. The model's own ``labels=`` loss. See ``_hf.py``.

    latch-pipeline check examples/hf_mixtral.py
    latch-pipeline check examples/hf_mixtral.py --set experts_impl=batched_mm
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
    expert_hidden: int = 64
    experts: int = 4
    top_k: int = 2
    positions: int = 64
    batch: int = 2
    seq: int = 32
    seed: int = 0
    lr: float = 1e-3
    clip: float = 1.0
    microbatches: int = 1
    attn: str = "sdpa"
    experts_impl: str = "grouped_mm"  # transformers' experts_implementation (its default)


def build(**overrides) -> Example:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = make_config(Config, overrides)
    hf = MixtralConfig(vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.expert_hidden,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                       max_position_embeddings=cfg.positions, num_local_experts=cfg.experts,
                       num_experts_per_tok=cfg.top_k, attn_implementation=cfg.attn,
                       experts_implementation=cfg.experts_impl)
    return lm_example("hf_mixtral", seeded(cfg.seed, lambda: MixtralForCausalLM(hf)), cfg)
