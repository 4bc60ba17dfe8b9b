"""Shared by the transformers examples (hf_gpt2.py, hf_llama.py, hf_mixtral.py): a causal LM from
transformers, used unchanged, trained on its own ``labels=`` loss with AdamW written as a pure
tensor function (``_optim.adamw``).

The model is called the way a training loop calls it, ``model(input_ids=..., labels=...,
use_cache=False)``, with the library's defaults otherwise (sdpa attention, the default experts
implementation); the objective is the output's ``.loss`` (transformers shifts the labels itself,
so ``labels`` is a copy of ``input_ids``). Weights come from transformers' own initialisation
under a fixed seed. Configurations are tiny so the FP64 checks run in CI; dropout is 0 in them
(random ops hide RNG state, so capture refuses them).
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from _optim import adamw
from latch_capture import Example


def make_config(cls, overrides: dict):
    """``cls`` with ``overrides`` applied; an unknown key is an error naming the valid ones."""
    names = {f.name for f in fields(cls)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise TypeError(f"{cls.__qualname__}: unknown override(s) {bad}; valid: {sorted(names)}")
    return replace(cls(), **overrides)


def seeded(seed: int, make):
    """``make()`` under a fixed torch seed, leaving the caller's RNG state untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def token_batch(vocab: int, batch: int, seq: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return {"input_ids": ids, "labels": ids.clone(), "use_cache": False}


def lm_loss(outputs, _targets):
    """The objective: the model's own causal-LM loss (``labels=``)."""
    return outputs.loss


def lm_example(name: str, model, cfg) -> Example:
    """The Example for a transformers causal LM: its own loss, AdamW + global-norm clipping with
    ``lr`` a run-time hyper-parameter, and a deterministic batch per microbatch index."""
    base = cfg.seed * 1_000_003 + 1

    def batch(index: int):
        return token_batch(cfg.vocab, cfg.batch, cfg.seq, base + index), None

    inputs, _ = batch(0)
    return Example(
        name=name,
        model=model,
        objective=lm_loss,
        inputs=inputs,
        targets=None,
        optimizer=adamw(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_norm=cfg.clip),
        hyper={"lr": cfg.lr},
        microbatches=cfg.microbatches,
        batch=batch,
    )
