"""PyTorch's scaled dot-product attention, in the forms it is traced as, captured as ONE latch::sdpa
node (and one latch::sdpa_backward), checked against eager PyTorch in FP64 over two steps: causal
or not, an explicit scale, masks known at capture time (boolean or additive, built from index
comparisons as transformers builds them), grouped-query attention. Masks Latch cannot express
and dropout are refused, naming the attention call's line."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from latch_capture import Example, tensor_update  # noqa: E402
from latch_capture.errors import CaptureError  # noqa: E402
from latch_check.compare import compare  # noqa: E402

B, T, C, H = 2, 8, 16, 4


def sgd(params, grads, state, hyper):
    return {n: p - 0.05 * grads[n] for n, p in params.items()}, state


def mse(out, target):
    return ((out - target) ** 2).mean()


def causal_bool(T):
    i = torch.arange(T)
    return (i[:, None] >= i[None, :]).view(1, 1, T, T)  # built from arange: folded at capture


class Attn(nn.Module):
    def __init__(self, kv_heads=H, **kw):
        super().__init__()
        torch.manual_seed(0)
        self.kv_heads, self.kw = kv_heads, kw
        d = C // H
        self.q = nn.Linear(C, C, bias=False)
        self.kv = nn.Linear(C, 2 * kv_heads * d, bias=False)
        self.half_v = kw.pop("half_v", False)  # value head dim != query head dim: torch's math path
        self.o = nn.Linear(C // 2 if self.half_v else C, C, bias=False)

    def forward(self, x):
        d = C // H
        q = self.q(x).view(B, T, H, d).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2, self.kv_heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        if self.half_v:
            v = v[..., : d // 2]
        kw = dict(self.kw)
        mask = kw.pop("mask", None)
        if mask == "bool":
            kw["attn_mask"] = causal_bool(T)
        elif mask == "additive":
            kw["attn_mask"] = torch.zeros(T, T).masked_fill(~causal_bool(T)[0, 0], float("-inf"))
        elif mask == "ones":
            kw["attn_mask"] = torch.ones(B, 1, T, T, dtype=torch.bool)
        elif mask == "window":
            i = torch.arange(T)
            kw["attn_mask"] = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 3)
        elif mask == "data":
            kw["attn_mask"] = (x[:, :, 0] > -1e9)[:, None, None, :].expand(B, 1, T, T)  # all True, from data
        y = F.scaled_dot_product_attention(q, k, v, **kw)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


def _example(**kw):
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(B, T, C, generator=g), torch.randn(B, T, C, generator=g)
    return Example(model=Attn(**kw), objective=mse, inputs=x, targets=t, optimizer=tensor_update(sgd), name="attn")


CASES = {
    "causal": dict(is_causal=True),
    "full": dict(),
    "scale": dict(is_causal=True, scale=0.3),
    "bool_causal_mask": dict(mask="bool"),
    "additive_causal_mask": dict(mask="additive"),
    "all_ones_mask": dict(mask="ones"),
    "gqa": dict(kv_heads=2, is_causal=True, enable_gqa=True),
}
CAUSAL = {"causal": True, "full": False, "scale": True, "bool_causal_mask": True, "additive_causal_mask": True,
          "all_ones_mask": False, "gqa": True}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_forms_are_one_latch_node_and_match_eager_fp64(name):
    ex = _example(**CASES[name])
    doc = ex.capture(grads=True)
    nodes = doc.graph.program("update").nodes
    fwd = [n for n in nodes if n.op == "latch::sdpa"]
    bwd = [n for n in nodes if n.op == "latch::sdpa_backward"]
    assert len(fwd) == 1 and len(bwd) == 1
    assert fwd[0].attr_dict["causal"] is CAUSAL[name]
    assert fwd[0].attr_dict["scale"] == pytest.approx(0.3 if name == "scale" else (C // H) ** -0.5)
    assert not any(v.role == "const" and v.dtype == "bool" and v.numel > 1 for v in doc.graph.program("update").values), \
        "a recognised mask leaves nothing in the graph"
    assert all("test_capture_attention.py" in n.source for n in fwd + bwd)
    result = compare(ex, doc, steps=2)
    assert result.passed, result.format()


def test_the_math_path_lowers_op_by_op_and_matches_eager_fp64():
    ex = _example(is_causal=True, half_v=True)
    doc = ex.capture(grads=True)
    ops = {n.op for n in doc.graph.program("update").nodes}
    assert "latch::sdpa" not in ops and "latch::softmax" in ops  # decomposed by torch: matmuls + softmax
    result = compare(ex, doc, steps=2)
    assert result.passed, result.format()


@pytest.mark.parametrize("mask, what", [("window", "neither causal nor full"), ("data", "computed from the batch")])
def test_masks_latch_cannot_express_are_refused_at_the_attention_line(mask, what):
    with pytest.raises(CaptureError, match=what) as e:
        _example(mask=mask).capture()
    assert "test_capture_attention.py:" in str(e.value) and "aten._scaled_dot_product_flash_attention_for_cpu at" in str(e.value)


def test_attention_dropout_is_refused():
    with pytest.raises(CaptureError, match="dropout") as e:
        _example(is_causal=True, dropout_p=0.1).capture()
    assert "test_capture_attention.py" in str(e.value)
