"""What library models need beyond the core lowering, each captured and checked against eager
PyTorch in FP64 over two steps (a wrong lowering is a failed gate): top-k (any dim, largest or
smallest), constant padding (positive and negative, float and integer), values known at capture
time folded (integer positions from arange), grouped products traced as ``latch::ragged_mm``
with MoE dispatch's sort/histc/cumsum, and explicit FP32 casts in model code (the FP64 check
reads every float dtype as float64, as the reference runs the program)."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from latch_capture import Example, tensor_update  # noqa: E402
from latch_capture.errors import CaptureError  # noqa: E402
from latch_check.compare import Float64Everywhere, compare  # noqa: E402


def sgd(params, grads, state, hyper):
    return {n: p - 0.05 * grads[n] for n, p in params.items()}, state


def mse(out, target):
    return ((out - target) ** 2).mean()


class Fn(nn.Module):
    def __init__(self, fn, n=6, m=8):
        super().__init__()
        torch.manual_seed(1)
        self.w = nn.Parameter(torch.randn(n, m) * 0.5)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, x)


def _check(fn, x, t, steps=2):
    ex = Example(model=Fn(fn), objective=mse, inputs=x, targets=t, optimizer=tensor_update(sgd), name="fn")
    doc = ex.capture(grads=True)
    result = compare(ex, doc, steps=steps)
    assert result.passed, result.format()
    return doc


def _ops(doc):
    return [n.op for n in doc.graph.program("update").nodes]


def test_topk_any_dim_largest_and_smallest():
    def fn(s, x):
        h = x @ s.w  # [4, 8]
        v1, i1 = torch.topk(h, 3, dim=-1)
        v0, i0 = torch.topk(h, 2, dim=0, largest=False)
        return v1.sum(-1, keepdim=True) * i1.float().mean() + v0.sum(0) + torch.gather(h, 1, i1).mean()

    doc = _check(fn, torch.randn(4, 6), torch.randn(4, 8))
    assert _ops(doc).count("latch::token_topk") == 2


def test_constant_pad_positive_negative_float_and_int():
    def fn(s, x):
        h = x @ s.w  # [4, 8]
        p = F.pad(h, (1, 2, 0, 1), value=0.5)  # [5, 11]
        q = F.pad(h, (-2, 1))  # crop 2 on the left, pad 1 on the right: [4, 7]
        ids = F.pad(torch.arange(4), (0, 1), value=-100)  # integer padding (labels do this)
        return p[:4, :7] + q + (ids[:4] >= 0).float().unsqueeze(1)

    _check(fn, torch.randn(4, 6), torch.randn(4, 7))


def test_integer_values_from_arange_are_folded_floats_are_not():
    def fn(s, x):
        pos = torch.arange(4).unsqueeze(0).expand(2, -1).reshape(-1)[:4]  # folded: positions 0..3
        freq = torch.arange(8).float() * 0.1  # float arithmetic: stays in the graph (FP64 reference)
        return (x @ s.w).index_select(0, pos) * torch.cos(freq)

    doc = _check(fn, torch.randn(4, 6), torch.randn(4, 8))
    ops = _ops(doc)
    assert "latch::cos" in ops and "latch::mul" in ops
    g = doc.graph.program("update")
    consts = [v for v in g.values if v.role == "const" and v.dtype == "i64"]
    assert any(v.data == (0, 1, 2, 3) for v in consts), "the folded positions are one constant"


def test_grouped_mm_and_moe_dispatch_become_routing_ops():
    """transformers' grouped_mm dispatch, written out: sort the top-k expert ids, histc counts,
    cumsum offsets, F.grouped_mm (its fake kernel takes BF16 only, capture traces it as ragged_mm;
    the eager FP64 check runs it as a plain loop)."""
    E, k, D, Hd = 4, 2, 6, 5

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.router = nn.Parameter(torch.randn(D, E))
            self.w = nn.Parameter(torch.randn(E, D, Hd) * 0.3)

        def forward(self, x):
            probs = F.softmax(x @ self.router, dim=-1)
            gate, ids = torch.topk(probs, k, dim=-1)
            flat = ids.reshape(-1)
            ids_g, perm = torch.sort(flat)
            xs = x[perm // k]
            counts = torch.histc(ids_g.float(), bins=E, min=0, max=E - 1)
            offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
            ys = F.grouped_mm(xs, self.w, offs=offs) if hasattr(F, "grouped_mm") else torch._grouped_mm(xs, self.w, offs=offs)
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel())
            y = ys[inv].view(x.shape[0], k, Hd) * gate.unsqueeze(-1)
            return y.sum(1)

    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(8, D, generator=g), torch.randn(8, Hd, generator=g)
    ex = Example(model=MoE(), objective=mse, inputs=x, targets=t, optimizer=tensor_update(sgd), name="moe")
    doc = ex.capture(grads=True)
    ops = _ops(doc)
    assert {"latch::route_order", "latch::ragged_mm", "latch::ragged_mm_grad_w", "latch::token_topk"} <= set(ops)
    result = compare(ex, doc, steps=2)
    assert result.passed, result.format()


def test_sorting_other_values_is_refused_with_the_way_out():
    def fn(s, x):
        return torch.sort((x @ s.w).reshape(-1)).values.reshape(4, 8)

    ex = Example(model=Fn(fn), objective=mse, inputs=torch.randn(4, 6), targets=torch.randn(4, 8),
                 optimizer=tensor_update(sgd))
    with pytest.raises(CaptureError, match="route_order") as e:
        ex.capture()
    assert "aten.sort" in str(e.value) and "test_capture_library_ops.py" in str(e.value)


def test_explicit_fp32_casts_check_at_fp64():
    """RMSNorm/rotary/loss-style casts: in the FP32 program they are no nodes, the FP64 reference
    runs them at FP64, and the eager FP64 side reads float32 as float64 too."""

    def fn(s, x):
        h = (x @ s.w).to(torch.float32)
        r = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        p = torch.softmax(r.float(), dim=-1, dtype=torch.float32)
        return p * torch.ones(8, dtype=torch.float32) + r.half().float() * 0.1

    _check(fn, torch.randn(4, 6), torch.randn(4, 8))
    with Float64Everywhere():
        y = torch.ones(3, dtype=torch.float64)
        assert y.float().dtype == torch.float64 and y.to(torch.bfloat16).dtype == torch.float64
        assert torch.zeros(2, dtype=torch.float32).dtype == torch.float64
        assert y.to(torch.int32).dtype == torch.int32 and torch.softmax(y, 0, dtype=torch.float16).dtype == torch.float64
