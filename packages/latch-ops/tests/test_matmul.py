"""``latch::matmul``'s layouts, output dtype and split-K partials: the rule, the reference (against
torch for every combination) and the errors, each naming the op and the operand at fault."""

import itertools
import math

import pytest

from latch_core.ir import TensorType
from latch_core.registry import ShapeError
from latch_ops.matmul import MATMUL_SPEC, k_range

torch = pytest.importorskip("torch")

from latch_ops.common import reference_float_dtype  # noqa: E402

REF = MATMUL_SPEC.extra["reference"]


def _stored(batch, m, k, n, ta, tb):
    a = batch + ((k, m) if ta else (m, k))
    b = batch + ((n, k) if tb else (k, n))
    return a, b


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
@pytest.mark.parametrize("ta,tb", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("split", [None, 2, 3, 7])
@pytest.mark.parametrize("out_dtype", [None, "bf16", "f32"])
def test_every_layout_dtype_and_split_matches_torch(batch, ta, tb, split, out_dtype):
    m, k, n = 5, 13, 4
    sa, sb = _stored(batch, m, k, n, ta, tb)
    attrs = {"trans_a": ta, "trans_b": tb}
    if split:
        attrs["split_k"] = split
    if out_dtype:
        attrs["out_dtype"] = out_dtype
    (out,) = MATMUL_SPEC.check([TensorType(sa, "f32"), TensorType(sb, "f32")], attrs)
    lead = (split,) if split else ()
    assert out == TensorType(lead + batch + (m, n), out_dtype or "f32")
    torch.manual_seed(0)
    a, b = torch.randn(sa, dtype=torch.float64), torch.randn(sb, dtype=torch.float64)
    (got,) = REF([a, b], attrs)
    assert got.dtype == torch.float64 and tuple(got.shape) == out.shape  # FP64-neutral: never narrowed
    want = torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)
    if split:
        c = math.ceil(k / split)
        for s in range(split):  # each partial sums its own K slice, independently of the others
            aa = a.transpose(-1, -2) if ta else a
            bb = b.transpose(-1, -2) if tb else b
            part = torch.matmul(aa[..., s * c:(s + 1) * c], bb[..., s * c:(s + 1) * c, :])
            assert torch.allclose(got[s], part, rtol=1e-12, atol=1e-12)
        got = got.sum(0)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    flops, nbytes = MATMUL_SPEC.cost([TensorType(sa, "f32"), TensorType(sb, "f32")], [out], attrs)
    assert flops == 2 * math.prod(batch) * m * n * k
    assert nbytes == 4 * (math.prod(sa) + math.prod(sb)) + out.nbytes


def test_reference_output_follows_the_reference_width():
    a, b = torch.randn(3, 4, dtype=torch.float32), torch.randn(4, 2, dtype=torch.float32)
    with reference_float_dtype("f32"):
        (got,) = REF([a, b], {"out_dtype": "bf16"})
    assert got.dtype == torch.float32  # bf16 is the policy's storage; the reference never rounds


def test_k_ranges_partition_the_contraction():
    for k, s in [(13, 2), (13, 7), (4096, 16), (8, 8), (10, 4)]:
        covered = [i for part in range(s) for i in range(*k_range(part, k, s))]
        assert covered == list(range(k))


def T(*shape, dtype="f32"):
    return TensorType(shape, dtype)


BAD = [
    ([T(2, 3), T(4, 5)], {}, "K=3"),
    ([T(3, 2), T(3, 5)], {"trans_a": True, "trans_b": True}, "(trans_b)"),
    ([T(4, 3), T(4, 5)], {"trans_b": True}, "b[*B, N, K] (trans_b)"),
    ([T(2, 3, 4), T(3, 4, 5)], {}, "batch dims"),
    ([T(3, 4), T(2, 4, 5)], {}, "same rank"),
    ([T(3, 4), T(4, 5, dtype="bf16")], {}, "share one float dtype"),
    ([T(3, 4, dtype="i32"), T(4, 5, dtype="i32")], {}, "float dtype"),
    ([T(3, 4), T(4, 5)], {"trans_a": 1}, "'trans_a' must be true or false"),
    ([T(3, 4), T(4, 5)], {"out_dtype": "i32"}, "'out_dtype' must be a float dtype"),
    ([T(3, 4), T(4, 5)], {"split_k": 1}, "'split_k' must be an int >= 2"),
    ([T(3, 4), T(4, 5)], {"split_k": 8}, "split_k=8 exceeds the contraction length K=4"),
    ([T(3, 4), T(4, 5)], {"config": 3}, "'config' must be"),
    ([T(3, 4), T(4, 5)], {"epilogue_slots": 9}, "'epilogue_slots' must be an int in 1..8"),
    ([T(3, 4), T(4, 5)], {"epilogue_slots": True}, "'epilogue_slots' must be an int in 1..8"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[-1])
def test_misuse_is_rejected_naming_the_op_and_operand(case):
    types, attrs, fragment = case
    with pytest.raises(ShapeError) as e:
        MATMUL_SPEC.check(types, attrs)
    assert "latch::matmul" in str(e.value) and fragment in str(e.value), str(e.value)
