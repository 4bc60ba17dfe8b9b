"""Other decoder-only families in transformers, built from the same parts as GPT-2, Llama and
Mixtral, tried the same way: a tiny configuration, the model unchanged with its defaults (sdpa
attention, default experts implementation), its own ``labels=`` loss, captured and checked against
eager PyTorch in FP64 for one update. Covers biased projections (Qwen2), logit soft-capping and
alternating sliding-window layers (Gemma2), fused qkv projections (Phi3), a shared expert beside
the routed ones (Qwen2-MoE) and attention sinks with MoE (gpt-oss, whose sinks make transformers
use its eager attention: matmuls and a softmax)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from latch_capture import Example  # noqa: E402
from latch_check.compare import compare  # noqa: E402

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=0, eos_token_id=0)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                                            "moe_intermediate_size": 32,
                                                            "shared_expert_intermediate_size": 64}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                      "head_dim": 16}),
}


def _adamw():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        from _optim import adamw
    finally:
        sys.path.pop(0)
    return adamw()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_captures_and_checks(family):
    cfg_name, model_name, extra = FAMILIES[family]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    cfg = getattr(transformers, cfg_name)(**COMMON, **extra)
    for a in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(cfg, a):
            setattr(cfg, a, 0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, model_name)(cfg)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    ex = Example(model=model, objective=lambda out, _t: out.loss, targets=None, optimizer=_adamw(), hyper={"lr": 1e-3},
                 inputs={"input_ids": ids, "labels": ids.clone(), "use_cache": False}, name=family)
    doc = ex.capture(grads=True)
    nodes = doc.graph.program("update").nodes
    if model.config._attn_implementation == "sdpa":  # gpt-oss's sinks make transformers pick eager attention
        assert any(n.op == "latch::sdpa" and n.attr_dict["causal"] for n in nodes)
    if getattr(model.config, "_experts_implementation", None) == "grouped_mm":
        assert any(n.op == "latch::ragged_mm" for n in nodes)
    result = compare(ex, doc, steps=1)
    assert result.passed, result.format()
