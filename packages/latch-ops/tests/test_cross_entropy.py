"""latch::cross_entropy / cross_entropy_backward: the FP64 references against torch's own
cross-entropy and its autograd gradient, shape errors naming the op, tilings that cover what the
references read."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from latch_core.ir import TensorType  # noqa: E402
from latch_core.registry import ShapeError  # noqa: E402
from latch_ops.cross_entropy import SPECS, tiling_bwd, tiling_fwd  # noqa: E402

FWD, BWD = SPECS
IGN = -100


def _case(N=37, V=301, seed=0, ignored=(3, 17)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, V, generator=g, dtype=torch.float64) * 4
    t = torch.randint(0, V, (N,), generator=g)
    for i in ignored:
        t[i] = IGN
    return x, t


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_forward_and_backward_match_torch_in_float64(reduction):
    x, t = _case()
    nll, lse, valid = FWD.extra["reference"]([x, t], {"ignore_index": IGN})
    total = valid.sum()
    loss = nll.sum() / total if reduction == "mean" else nll.sum()
    xl = x.clone().requires_grad_()
    want = F.cross_entropy(xl, t, ignore_index=IGN, reduction=reduction)
    (dx_want,) = torch.autograd.grad(want, xl, torch.tensor(0.75, dtype=torch.float64))
    assert loss.dtype == torch.float64
    assert abs(loss.item() - want.item()) <= 1e-13 * abs(want.item())
    assert torch.equal(valid, (t != IGN).double())
    assert torch.allclose(lse, torch.logsumexp(x, 1), rtol=1e-15, atol=0)
    (dx,) = BWD.extra["reference"]([torch.tensor(0.75, dtype=torch.float64), x, t, lse, total],
                                   {"ignore_index": IGN, "reduction": reduction, "out_dtype": "bf16"})
    assert dx.dtype == torch.float64  # the reference computes at the reference width, whatever out_dtype
    assert (dx - dx_want).norm() <= 1e-14 * dx_want.norm()
    assert torch.equal(dx[3], torch.zeros(x.shape[1], dtype=torch.float64))  # an ignored row


def test_infer_types_and_errors_name_the_op():
    logits, t = TensorType((8, 64), "bf16"), TensorType((8,), "i64")
    assert FWD.infer([logits, t], {"ignore_index": IGN}) == [TensorType((8,), "f32")] * 3
    s = TensorType((), "f32")
    out = BWD.infer([s, logits, t, TensorType((8,), "f32"), s], {"ignore_index": IGN, "reduction": "mean",
                                                                  "out_dtype": "bf16"})
    assert out == [TensorType((8, 64), "bf16")]
    with pytest.raises(ShapeError, match="latch::cross_entropy: target must be an integer tensor of shape"):
        FWD.infer([logits, TensorType((7,), "i64")], {"ignore_index": IGN})
    with pytest.raises(ShapeError, match="latch::cross_entropy_backward: reduction must be one of"):
        BWD.infer([s, logits, t, TensorType((8,), "f32"), s], {"ignore_index": IGN, "reduction": "none"})


def test_target_out_of_range_is_an_error_naming_row():
    x, t = _case(N=4, V=10, ignored=())
    t[2] = 10
    with pytest.raises(IndexError, match="latch::cross_entropy: target 10 at row 2 is outside"):
        FWD.extra["reference"]([x, t], {"ignore_index": IGN})


def test_tilings_cover_what_a_tile_computes():
    x, t = _case(N=16, V=40, ignored=(5,))
    nll, lse, valid = FWD.extra["reference"]([x, t], {"ignore_index": IGN})
    tf = tiling_fwd([TensorType((16, 40), "f32"), TensorType((16,), "i64")], [TensorType((16,), "f32")] * 3, {})
    assert tf.split_dims == (0,)
    ins, outs = tf.footprint(((4, 9),))
    (xr, xc), (tr,) = ins
    part = FWD.extra["reference"]([x[slice(*xr), slice(*xc)], t[slice(*tr)]], {"ignore_index": IGN})
    assert torch.equal(part[1], lse[4:9]) and torch.equal(part[0], nll[4:9]) and outs == [((4, 9),)] * 3
    tb = tiling_bwd([None] * 5, [TensorType((16, 40), "bf16")], {})
    assert tb.split_dims == (0, 1)
    ins, outs = tb.footprint(((2, 6), (8, 24)))
    assert ins[1] == ((2, 6), (8, 24)) and ins[2] == ((2, 6),) and ins[3] == ((2, 6),) and ins[0] == ()
    # what the arena simulator does: poison everything outside the read boxes, keep the write box
    g, tot = torch.tensor(1.0, dtype=torch.float64), valid.sum()
    attrs = {"ignore_index": IGN, "reduction": "mean"}
    full = BWD.extra["reference"]([g, x, t, lse, tot], attrs)[0]
    xp = torch.full_like(x, float("nan"))
    xp[2:6, 8:24] = x[2:6, 8:24]
    lp = torch.full_like(lse, float("nan"))
    lp[2:6] = lse[2:6]
    part = BWD.extra["reference"]([g, xp, t, lp, tot], attrs)[0]
    assert torch.equal(part[2:6, 8:24], full[2:6, 8:24])
