"""The lowerings that other transformers decoder families needed beyond GPT-2, Llama and Mixtral
(tests/test_transformers_decoders.py, results/hf.md), each in a tiny model captured and run by the
FP64 interpreter against eager PyTorch in FP64 over two updates: a constant index counted from the
end (Falcon's ``qkv[..., [-2], :]``), ``softplus`` and its derivative on both sides of the threshold
(apertus' xIELU), ``baddbmm`` (Bloom's ALiBi scores), ``repeat`` (GPT-J's position table) and
``new_empty_strided``."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from latch_capture import Example, tensor_update  # noqa: E402
from latch_check.compare import compare  # noqa: E402


def sgd(params, grads, state, hyper):
    return {n: p - hyper["lr"] * grads[n] for n, p in params.items()}, state


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        torch.manual_seed(3)
        self.w = nn.Parameter(torch.randn(6, 6) * 0.5)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, x)


def negative_index(s, x):
    h = (x @ s.w).view(4, 3, 2)
    return h[..., [-1], :].sum() * 2 + h[:, [-3, 1]].pow(2).sum() + h[[-4]].sum()


def softplus(s, x):
    h = x @ s.w * 8  # values on both sides of threshold / beta
    return F.softplus(h, beta=0.5, threshold=2.0).sum() + F.softplus(h).pow(2).sum()


def baddbmm(s, x):
    h = (x @ s.w).view(2, 2, 6)
    bias = s.w[:2, :2].reshape(2, 2, 1)
    return torch.baddbmm(bias, h, h.transpose(1, 2), beta=0.5, alpha=2.0).pow(2).sum() + torch.baddbmm(
        bias, h, h.transpose(1, 2)).sum()


def repeat(s, x):
    h = x @ s.w  # [4, 6]
    return (h.repeat(2, 1, 3) * torch.arange(18.0).view(1, 1, 18)).sum() + h[0].repeat(2).pow(2).sum()


def empty_strided(s, x):
    h = x @ s.w
    return (h.new_empty_strided((4, 6), (6, 1)).fill_(1.5) * h).sum() + h.pow(2).sum()


CASES = {f.__name__: f for f in (negative_index, softplus, baddbmm, repeat, empty_strided)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_matches_eager_fp64(name):
    torch.manual_seed(4)
    ex = Example(model=Fn(CASES[name]), objective=lambda out, _t: out, inputs=torch.randn(4, 6), targets=None,
                 optimizer=tensor_update(sgd), hyper={"lr": 1e-2}, name=name)
    result = compare(ex, ex.capture(grads=True), steps=2)
    assert result.passed, result.format()

