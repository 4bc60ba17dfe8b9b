"""ATen -> Latch: PyTorch's scaled dot-product attention, every form it is traced as, to ``latch::sdpa``.

``F.scaled_dot_product_attention`` is composite: what a trace records is the kernel torch picked
for the tensors' device, with its backward as another kernel. On the CPU (where capture traces)
that is ``_scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``), masks included; traced
with CUDA fake tensors, the flash, memory-efficient and cuDNN kernels. Each becomes ONE
``latch::sdpa`` (forward) or ``latch::sdpa_backward`` node, so the graph is device-neutral and the
backward is Latch's own. (The ``math`` fallback is itself composite: it arrives as matmul and
softmax ops, which lower one by one.)

- **Masks.** A mask known at capture time (transformers builds its causal mask from index
  comparisons; capture folds them, see fold.py) is inspected: allowed entries (True, or an additive
  0) and masked ones (False, or <= -1e30, i.e. -inf or a dtype's most negative number) that form
  exactly the top-left causal pattern on every (batch, head) give ``causal=True`` and no mask; an
  all-allowed mask gives no mask. Any other mask (padding from a batch's attention_mask, sliding
  windows, biases) is refused, naming the attention call.
- **Grouped-query attention** (k/v with fewer heads than q, ``enable_gqa``): k and v go to the op
  as they are; ``latch::sdpa`` reads kv head h // (H / Hkv) for query head h (torch's semantics)
  and its backward sums dk, dv over each group.
- **Statistics.** Torch's logsumexp output is Latch's ``lse`` (natural-log, per query row); a
  kernel that pads it (efficient attention to a multiple of 32 rows) gets it padded with zeros,
  and its backward reads the unpadded rows.
- Dropout (``dropout_p > 0``) is refused: random ops hide their RNG state.
"""

from __future__ import annotations

import math

import torch

from .lower import Lowerer
from .lower_shape import emit_slice

MASKED = -1e30  # an additive mask entry at or below this contributes exp(-1e30) = 0: masked
_DROPOUT = ("attention dropout is random: Latch captures no hidden RNG state; set the attention dropout "
            "to 0 (e.g. attn_pdrop=0.0 / attention_dropout=0.0 in the model's config) or call model.eval()")


def _allowed(mask: torch.Tensor) -> torch.Tensor | None:
    """Boolean 'key visible' of a known mask; None when it is an additive bias with other values."""
    if mask.dtype == torch.bool:
        return mask
    m = mask.to(torch.float64)
    zero, masked = m == 0, m <= MASKED
    if not bool((zero | masked).all()):
        return None
    return zero


def classify_mask(mask: torch.Tensor | None, causal: bool, shape: tuple[int, int, int, int]) -> bool | None:
    """``causal`` for latch::sdpa when the known mask (with torch's is_causal) is plain or causal;
    None when it is another pattern."""
    if mask is None:
        return causal
    allowed = _allowed(mask)
    if allowed is None:
        return None
    B, H, Tq, Tk = shape
    try:
        allowed = allowed.expand(B, H, Tq, Tk)
    except RuntimeError:
        return None
    tril = torch.ones(Tq, Tk, dtype=torch.bool).tril()
    if causal:
        allowed = allowed & tril
    if bool(allowed.all()):
        return False
    if bool((allowed == tril).all()):
        return True
    return None


def _mask_error(lw: Lowerer, what: str):
    return lw.fail(what, "Latch's attention takes causal or full attention: for a causal LM pass no "
                         "attention_mask (or one of all ones) and no padding; padding masks, sliding windows "
                         "and attention biases are not supported yet")


def _heads(lw: Lowerer, x: str, heads: int) -> str:
    """k or v [B, Hkv, T, D] as latch::sdpa takes it: unchanged (the op reads kv head h // G for
    query head h, G = heads / Hkv); refused when Hkv does not divide the query heads."""
    Hkv = lw.type(x).shape[1]
    if heads % Hkv:
        raise lw.fail(f"grouped-query attention with {heads} query heads and {Hkv} key/value heads",
                      "the number of query heads must be a multiple of the key/value heads")
    return x


def _attrs(lw: Lowerer, q: str, k: str, a: dict, mask_key: str | None) -> dict:
    if float(a.get("dropout_p") or 0.0) != 0.0:
        raise lw.fail(f"attention with dropout_p={a.get('dropout_p')}", _DROPOUT)
    B, H, Tq, D = lw.type(q).shape
    Tk = lw.type(k).shape[2]
    causal = bool(a.get("is_causal"))
    mask = a.get(mask_key) if mask_key else None
    if mask is not None:
        data = lw.known_value(mask)
        if data is None:
            raise _mask_error(lw, "attention with a mask computed from the batch")
        c = classify_mask(data, causal, (B, H, Tq, Tk))
        if c is None:
            raise _mask_error(lw, "attention with a mask that is neither causal nor full")
        causal = c
    scale = a.get("scale")
    return {"causal": causal, "scale": float(1.0 / math.sqrt(D) if scale is None else scale)}


def _lse_as_torch(lw: Lowerer, lse: str, index: int) -> str:
    """Latch's lse [B, H, Tq] in the shape torch's kernel gives its logsumexp (padded or reshaped)."""
    want = lw.out_type(index)
    have = lw.type(lse)
    if want.shape == have.shape:
        return lse
    if want.numel == have.numel:
        return lw.reshape(lse, want.shape)
    if len(want.shape) == 3 and want.shape[:2] == have.shape[:2] and want.shape[2] > have.shape[2]:
        pad = lw.full(want.shape[:2] + (want.shape[2] - have.shape[2],), 0.0, have.dtype)
        return lw.emit1("latch::concat", [lse, pad], {"dim": 2})
    raise lw.fail(f"an attention kernel with logsumexp {want}", "this attention kernel's statistics layout is unknown")


def _lse_as_latch(lw: Lowerer, lse: str, q: str) -> str:
    B, H, Tq, _ = lw.type(q).shape
    t = lw.type(lse)
    if t.shape == (B, H, Tq):
        return lse
    if t.numel == B * H * Tq:
        return lw.reshape(lse, (B, H, Tq))
    if len(t.shape) == 3 and t.shape[:2] == (B, H) and t.shape[2] > Tq:
        return emit_slice(lw, lse, 2, 0, Tq, 1)
    raise lw.fail(f"an attention backward with logsumexp {t}", "this attention kernel's statistics layout is unknown")


def forward(mask_key: str | None):
    """flash_for_cpu / flash / efficient / cudnn forward -> latch::sdpa; torch's other results (rng
    state, sequence offsets) become zeros of their types, read by no Latch node."""

    def low(lw: Lowerer, a: dict):
        q, k, v = a["query"], a["key"], a["value"]
        attrs = _attrs(lw, q, k, a, mask_key)
        H = lw.type(q).shape[1]
        out, lse = lw.emit("latch::sdpa", [q, _heads(lw, k, H), _heads(lw, v, H)], attrs)
        val = lw.fx_node.meta.get("val")
        results: list = [out, _lse_as_torch(lw, lse, 1)]
        for i in range(2, len(val)):
            if isinstance(val[i], torch.Tensor):
                t = lw.out_type(i)
                results.append(lw.full(t.shape, 0, t.dtype))
            else:
                results.append(None)
        return tuple(results)

    return low


def backward(mask_key: str | None, n_results: int = 3):
    def low(lw: Lowerer, a: dict):
        go = a.get("grad_out") if a.get("grad_out") is not None else a.get("grad_out_")
        q, k, v = a["query"], a["key"], a["value"]
        attrs = _attrs(lw, q, k, a, mask_key)
        H = lw.type(q).shape[1]
        lse = _lse_as_latch(lw, a["logsumexp"], q)
        # dk, dv come back with k's heads: the op sums them over each group (latch_ops.attention)
        res = list(lw.emit("latch::sdpa_backward",
                           [go, None, q, _heads(lw, k, H), _heads(lw, v, H), a["out"], lse], attrs))
        return tuple(res + [None] * (n_results - 3))

    return low


def TABLE() -> dict:
    return {
        "aten._scaled_dot_product_flash_attention_for_cpu": forward("attn_mask"),
        "aten._scaled_dot_product_flash_attention_for_cpu_backward": backward("attn_mask"),
        "aten._scaled_dot_product_flash_attention": forward(None),
        "aten._scaled_dot_product_flash_attention_backward": backward(None),
        "aten._scaled_dot_product_efficient_attention": forward("attn_bias"),
        "aten._scaled_dot_product_efficient_attention_backward": backward("attn_bias", 4),
        "aten._scaled_dot_product_cudnn_attention": forward("attn_bias"),
        "aten._scaled_dot_product_cudnn_attention_backward": backward("attn_bias"),
    }
