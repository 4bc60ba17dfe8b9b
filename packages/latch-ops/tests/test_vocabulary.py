"""The core op vocabulary: every spec is complete, its shape rule agrees with its reference on real
tensors, the references compute what torch computes, and the rules reject misuse by name."""

import math
import subprocess
import sys

import pytest

from latch_core.ir import TensorType
from latch_core.registry import (
    ATTENTION, COPY, ELEMENTWISE, INDEXING, MATMUL, NORM, RANDOM, REDUCTION, ROUTING, STRUCTURAL, VIEW, ShapeError,
)
from latch_ops.vocabulary import SPECS

torch = pytest.importorskip("torch")

from latch_ops.common import reference_float_dtype, torch_dtype  # noqa: E402

BY_NAME = {s.name: s for s in SPECS}
TAGS = {ELEMENTWISE, REDUCTION, MATMUL, VIEW, COPY, INDEXING, ATTENTION, ROUTING, NORM, RANDOM, STRUCTURAL}


def T(*shape, dtype="f32"):
    return TensorType(shape, dtype)


def test_import_without_torch():
    code = ("import sys, latch_ops, latch_ops.plugin, latch_ops.vocabulary; "
            "assert 'torch' not in sys.modules, 'latch_ops imported torch'; print(len(latch_ops.vocabulary.SPECS))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(SPECS)


def test_every_spec_is_complete():
    for s in SPECS:
        assert s.name.startswith("latch::"), s.name
        assert callable(s.extra.get("reference")), s.name
        assert callable(s.cost), s.name
        assert s.tags and s.tags <= TAGS, (s.name, s.tags)
        assert s.signature.startswith(s.name.removeprefix("latch::")), s.name
        assert s.doc, s.name


def test_plugin_registers_core_and_attention():
    from latch_core.plugins import load_with
    from latch_ops import plugin

    regs = load_with(("ops-under-test", plugin), entry_points=False)
    for s in SPECS:
        assert regs.ops.owner(s.name) == "ops-under-test"
    try:
        from latch_ops import attention
    except ModuleNotFoundError:
        return
    for s in attention.SPECS:
        assert s.name in regs.ops


# ------------------------------------------------------------------------------------------
# (op, operand types, attrs, torch expression on the operands or None)
CASES = [
    ("latch::add", [T(2, 3), T(3)], {}, lambda a, b: a + b),
    ("latch::add", [T(2, 1, 3), T(4, 1)], {}, lambda a, b: a + b),
    ("latch::sub", [T(2, 3)], {"scalar": 1.5, "scalar_first": True}, lambda a: 1.5 - a),
    ("latch::div", [T(2, 3)], {"scalar": 4.0}, lambda a: a / 4.0),
    ("latch::div", [T(2, 3, dtype="i64"), T(2, 3, dtype="i64")], {"rounding_mode": "floor"},
     lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("latch::pow", [T(3)], {"scalar": 0.9, "scalar_first": True}, lambda a: 0.9 ** a),
    ("latch::pow", [T(3)], {"scalar": 2.0}, lambda a: a ** 2),
    ("latch::mul", [T(4, dtype="i64")], {"scalar": 3}, lambda a: a * 3),
    ("latch::maximum", [T(2, 3), T(2, 3)], {}, torch.maximum),
    ("latch::minimum", [T(2, 3)], {"scalar": 0.0}, lambda a: torch.clamp(a, max=0.0)),
    ("latch::lt", [T(2, 3), T(3)], {}, lambda a, b: a < b),
    ("latch::ge", [T(2, 3)], {"scalar": 0.0}, lambda a: a >= 0),
    ("latch::logical_and", [T(3, dtype="bool"), T(3, dtype="bool")], {}, torch.logical_and),
    ("latch::logical_not", [T(3, dtype="bool")], {}, torch.logical_not),
    ("latch::exp", [T(2, 3)], {}, torch.exp),
    ("latch::rsqrt", [T(5)], {}, torch.rsqrt),
    ("latch::gelu", [T(5)], {"approximate": "tanh"}, lambda a: torch.nn.functional.gelu(a, approximate="tanh")),
    ("latch::silu", [T(5)], {}, torch.nn.functional.silu),
    ("latch::neg", [T(5, dtype="i32")], {}, torch.neg),
    ("latch::where", [T(2, 3, dtype="bool"), None, T(2, 3)], {"scalar_a": -math.inf},
     lambda c, b: torch.where(c, torch.tensor(-math.inf, dtype=b.dtype), b)),
    ("latch::where", [T(3, dtype="bool"), T(2, 3), T(1)], {}, torch.where),
    ("latch::clamp", [T(4)], {"max": 1.0}, lambda a: torch.clamp(a, max=1.0)),
    ("latch::cast", [T(4, dtype="i64")], {"dtype": "f32"}, lambda a: a.to(torch.float64)),
    ("latch::cast", [T(4)], {"dtype": "bf16"}, lambda a: a),  # the reference never narrows a float
    ("latch::cast", [T(4)], {"dtype": "i32"}, lambda a: a.to(torch.int32)),
    ("latch::tril", [T(3, 4)], {"diagonal": 1}, lambda a: torch.tril(a, 1)),
    ("latch::full", [], {"shape": (2, 2), "value": 3.0, "dtype": "f32"}, None),
    ("latch::arange", [], {"start": 2, "step": 3, "size": 4, "dtype": "i64"}, None),
    ("latch::arange", [], {"start": 0.5, "step": 0.25, "size": 4, "dtype": "f32"}, None),
    ("latch::gelu_backward", [T(5), T(5)], {"approximate": "none"},
     lambda g, x: torch.ops.aten.gelu_backward(g, x)),
    ("latch::threshold_backward", [T(5), T(5)], {"threshold": 0.0}, lambda g, x: torch.where(x > 0, g, 0 * g)),
    ("latch::sum", [T(2, 3, 4)], {"dims": (0, 2), "keepdim": True}, lambda a: a.sum((0, 2), keepdim=True)),
    ("latch::sum", [T(2, 3, dtype="bool")], {"dims": (0, 1), "keepdim": False}, lambda a: a.sum()),
    ("latch::mean", [T(2, 3)], {"dims": (1,), "keepdim": False}, lambda a: a.mean(1)),
    ("latch::amax", [T(2, 3)], {"dims": (1,), "keepdim": True}, lambda a: a.amax(1, keepdim=True)),
    ("latch::prod", [T(2, 3)], {"dims": (0, 1), "keepdim": False}, lambda a: a.prod()),
    ("latch::argmax", [T(2, 3)], {"dims": (1,), "keepdim": False}, lambda a: a.argmax(1)),
    ("latch::matmul", [T(2, 3, 4), T(2, 4, 5)], {}, torch.matmul),
    ("latch::reshape", [T(2, 6)], {"shape": (3, 4)}, lambda a: a.reshape(3, 4)),
    ("latch::permute", [T(2, 3, 4)], {"perm": (2, 0, 1)}, lambda a: a.permute(2, 0, 1)),
    ("latch::expand", [T(3, 1)], {"shape": (2, 3, 4)}, lambda a: a.expand(2, 3, 4)),
    ("latch::slice", [T(4, 10)], {"dim": 1, "start": 1, "end": 9, "step": 3}, lambda a: a[:, 1:9:3]),
    ("latch::select", [T(4, 10)], {"dim": 0, "index": 2}, lambda a: a[2]),
    ("latch::concat", [T(2, 3), T(2, 1), T(2, 2)], {"dim": 1}, lambda *xs: torch.cat(xs, 1)),
    ("latch::slice_scatter", [T(4, 6), T(4, 2)], {"dim": 1, "start": 1, "end": 5, "step": 2},
     lambda a, b: torch.slice_scatter(a, b, 1, 1, 5, 2)),
    ("latch::select_scatter", [T(4, 6), T(6)], {"dim": 0, "index": 3}, lambda a, b: torch.select_scatter(a, b, 0, 3)),
    ("latch::copy", [T(3)], {}, lambda a: a),
    ("latch::softmax", [T(2, 5)], {}, lambda a: a.softmax(-1)),
    ("latch::log_softmax", [T(2, 5)], {}, lambda a: a.log_softmax(-1)),
    ("latch::layer_norm", [T(2, 3, 4), T(4), T(4)], {"normalized_ndim": 1, "eps": 1e-5}, None),
    ("latch::layer_norm", [T(2, 3, 4), None, None], {"normalized_ndim": 2, "eps": 1e-5}, None),
    ("latch::layer_norm_backward", [T(2, 4), T(2, 4), T(2, 1), T(2, 1), T(4), T(4)],
     {"normalized_ndim": 1, "output_mask": (True, False, True)}, None),
    ("latch::abs", [T(5)], {}, torch.abs),
    ("latch::sign", [T(5)], {}, torch.sign),
    ("latch::relu", [T(5)], {}, torch.relu),
    ("latch::log", [T(5)], {}, torch.log),
    ("latch::log1p", [T(5)], {}, torch.log1p),
    ("latch::expm1", [T(5)], {}, torch.expm1),
    ("latch::sqrt", [T(5)], {}, torch.sqrt),
    ("latch::reciprocal", [T(5)], {}, torch.reciprocal),
    ("latch::sin", [T(5)], {}, torch.sin),
    ("latch::cos", [T(5)], {}, torch.cos),
    ("latch::tanh", [T(5)], {}, torch.tanh),
    ("latch::erf", [T(5)], {}, torch.erf),
    ("latch::sigmoid", [T(5)], {}, torch.sigmoid),
    ("latch::remainder", [T(6)], {"scalar": 0.75}, lambda a: torch.remainder(a, 0.75)),
    ("latch::remainder", [T(6, dtype="i64"), T(6, dtype="i64")], {}, torch.remainder),
    ("latch::eq", [T(4, dtype="i64")], {"scalar": 2}, lambda a: a == 2),
    ("latch::ne", [T(4), T(4)], {}, lambda a, b: a != b),
    ("latch::gt", [T(4)], {"scalar": 0.0, "scalar_first": True}, lambda a: 0.0 > a),
    ("latch::le", [T(2, 4), T(4)], {}, lambda a, b: a <= b),
    ("latch::logical_or", [T(3, dtype="bool"), T(3, dtype="bool")], {}, torch.logical_or),
    ("latch::logical_xor", [T(3, dtype="i64"), T(3, dtype="i64")], {}, torch.logical_xor),
    ("latch::triu", [T(2, 3, 4)], {"diagonal": -1}, lambda a: torch.triu(a, -1)),
    ("latch::amin", [T(2, 3)], {"dims": (0, 1), "keepdim": False}, lambda a: a.amin()),
    ("latch::argmin", [T(2, 3)], {"dims": (0,), "keepdim": True}, lambda a: a.argmin(0, keepdim=True)),
    ("latch::sigmoid_backward", [T(5), T(5)], {}, lambda g, y: g * y * (1 - y)),
    ("latch::tanh_backward", [T(5), T(5)], {}, lambda g, y: g * (1 - y * y)),
    ("latch::silu_backward", [T(5), T(5)], {},
     lambda g, x: g * torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))),
    ("latch::softmax_backward", [T(2, 5), T(2, 5)], {}, lambda g, y: y * (g - (g * y).sum(-1, keepdim=True))),
    ("latch::log_softmax_backward", [T(2, 5), T(2, 5)], {}, lambda g, y: g - y.exp() * g.sum(-1, keepdim=True)),
]

INDEX_CASES = [  # ops whose integer operands need valid indices: (op, operands as tensors, attrs, torch expression)
    ("latch::embedding", lambda: [torch.randn(7, 3), torch.tensor([[1, 6], [0, 1]])], {},
     lambda w, i: w[i]),
    ("latch::embedding_backward", lambda: [torch.randn(2, 2, 3), torch.tensor([[1, 6], [0, 1]])],
     {"num_weights": 7, "padding_idx": 0}, None),
    ("latch::gather", lambda: [torch.randn(3, 4), torch.tensor([[0, 3], [1, 1], [2, 0]])], {"dim": 1},
     lambda x, i: torch.gather(x, 1, i)),
    ("latch::scatter_add", lambda: [torch.zeros(3, 4), torch.tensor([[0, 3], [1, 1], [2, 0]]), torch.ones(3, 2)],
     {"dim": 1}, lambda x, i, s: torch.scatter_add(x, 1, i, s)),
    ("latch::index_select", lambda: [torch.randn(5, 2), torch.tensor([4, 0, 4])], {"dim": 0},
     lambda x, i: x[i]),
    ("latch::index_add", lambda: [torch.zeros(5, 2), torch.tensor([4, 0, 4]), torch.ones(3, 2)], {"dim": 0},
     lambda x, i, s: x.index_add(0, i, s)),
    ("latch::nll_loss", lambda: [torch.randn(4, 5).log_softmax(-1), torch.tensor([1, 4, -100, 0]), None],
     {"reduction": "mean", "ignore_index": -100},
     lambda lp, t, w: (torch.nn.functional.nll_loss(lp, t), None)),
    ("latch::nll_loss_backward", lambda: [torch.tensor(1.0), torch.randn(4, 5), torch.tensor([1, 4, 2, 0]),
                                          torch.tensor([1.0, 2.0, 1.0, 0.5, 3.0]), torch.tensor(6.5)],
     {"reduction": "mean", "ignore_index": -100},
     lambda g, lp, t, w, tw: torch.zeros(4, 5, dtype=torch.float64).scatter(1, t[:, None], -w[t][:, None] / tw)),
    ("latch::scatter", lambda: [torch.zeros(3, 4), torch.tensor([[0, 3], [1, 2], [2, 0]]), torch.randn(3, 2)],
     {"dim": 1}, lambda x, i, s: torch.scatter(x, 1, i, s)),
    ("latch::cross_entropy", lambda: [torch.randn(4, 5), torch.tensor([1, 4, -100, 0])], {"ignore_index": -100},
     lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction="none", ignore_index=-100)),
    ("latch::cross_entropy_backward", lambda: [torch.tensor(1.0), torch.randn(4, 5), torch.tensor([1, 4, -100, 0]),
                                               torch.randn(4).exp(), torch.tensor(3.0)],
     {"ignore_index": -100, "reduction": "sum"}, None),  # vs torch's autograd: tests/test_cross_entropy.py
]


def test_every_core_op_has_a_case():
    covered = {c[0] for c in CASES} | {c[0] for c in INDEX_CASES}
    assert sorted(s.name for s in SPECS if s.name not in covered) == []


def _rand(t: TensorType):
    dt = torch_dtype(t.dtype)
    if t.dtype == "bool":
        return torch.rand(t.shape) > 0.5
    if dt.is_floating_point:
        return torch.randn(t.shape, dtype=torch.float64)
    return torch.randint(1, 5, t.shape, dtype=dt)


def _check_results(spec, declared, results):
    assert len(results) == len(declared), spec.name
    for d, r in zip(declared, results):
        assert tuple(r.shape) == tuple(d.shape), (spec.name, d, r.shape)
        want = torch.float64 if torch_dtype(d.dtype).is_floating_point else torch_dtype(d.dtype)
        assert r.dtype == want, (spec.name, d, r.dtype)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_rule_matches_reference(case):
    name, types, attrs, expr = case
    spec = BY_NAME[name]
    declared = spec.check(types, attrs)
    torch.manual_seed(0)
    args = [None if t is None else _rand(t) for t in types]
    results = spec.extra["reference"](args, attrs)
    _check_results(spec, declared, results)
    if expr is not None:
        want = expr(*[a for a in args if a is not None])
        got = results[0]
        if want.dtype == torch.bool or not want.is_floating_point():
            assert torch.equal(got, want.to(got.dtype)), name
        else:
            assert torch.allclose(got, want.to(got.dtype), rtol=1e-12, atol=1e-12, equal_nan=True), name
    flops, nbytes = spec.cost([t for t in types], declared, attrs)
    assert flops >= 0 and nbytes >= 0


@pytest.mark.parametrize("case", INDEX_CASES, ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_indexing_rule_matches_reference(case):
    from latch_ops.common import from_torch_dtype

    name, make, attrs, expr = case
    spec = BY_NAME[name]
    torch.manual_seed(0)
    args = [None if a is None else (a.double() if a.is_floating_point() else a) for a in make()]
    types = [None if a is None else TensorType(tuple(a.shape), from_torch_dtype(a.dtype)) for a in args]
    declared = spec.check(types, attrs)
    results = spec.extra["reference"](args, attrs)
    _check_results(spec, declared, results)
    if expr is not None:
        want = expr(*args)
        want = want[0] if isinstance(want, tuple) else want
        assert torch.allclose(results[0], want.to(results[0].dtype), rtol=1e-12, atol=1e-12, equal_nan=True), name


def test_embedding_backward_sums_rows_and_skips_padding():
    spec = BY_NAME["latch::embedding_backward"]
    g = torch.ones(3, 2, dtype=torch.float64)
    idx = torch.tensor([2, 2, 0])
    (dw,) = spec.extra["reference"]([g, idx], {"num_weights": 4, "padding_idx": 0})
    assert dw.tolist() == [[0, 0], [0, 0], [2, 2], [0, 0]]


def test_reference_float_width_is_selectable():
    spec = BY_NAME["latch::full"]
    (a,) = spec.extra["reference"]([], {"shape": (2,), "value": 0.1, "dtype": "f32"})
    assert a.dtype == torch.float64 and a[0].item() == 0.1
    with reference_float_dtype("f32"):
        (b,) = spec.extra["reference"]([], {"shape": (2,), "value": 0.1, "dtype": "f32"})
    assert b.dtype == torch.float32


BAD = [
    ("latch::add", [T(2, 3), T(4)], {}, "do not broadcast"),
    ("latch::add", [T(2), T(2, dtype="f64")], {}, "share one dtype"),
    ("latch::mul", [T(2, dtype="i64")], {"scalar": 0.5}, "cast the operand"),
    ("latch::div", [T(2, dtype="i64"), T(2, dtype="i64")], {}, "true division"),
    ("latch::exp", [T(2, dtype="i64")], {}, "float"),
    ("latch::matmul", [T(2, 3), T(4, 5)], {}, "contraction dims"),
    ("latch::matmul", [T(2, 2, 3), T(3, 3, 5)], {}, "batch dims"),
    ("latch::reshape", [T(2, 3)], {"shape": (4, 2)}, "cannot reshape"),
    ("latch::permute", [T(2, 3)], {"perm": (0, 0)}, "not a permutation"),
    ("latch::slice", [T(4)], {"dim": 0, "start": -1, "end": 4, "step": 1}, "not normalised"),
    ("latch::sum", [T(2, 3)], {"dims": (2,), "keepdim": False}, "dims"),
    ("latch::sum", [T(2, 3)], {"dims": (1,)}, "keepdim"),
    ("latch::where", [T(2, dtype="f32"), T(2), T(2)], {}, "cond must be bool"),
    ("latch::concat", [T(2, 3), T(3, 3)], {"dim": 1}, "differ outside dim"),
    ("latch::index_select", [T(4, 2), T(2, 2, dtype="i64")], {"dim": 0}, "1-D"),
    ("latch::embedding", [T(4, 2), T(3, dtype="f32")], {}, "integer"),
    ("latch::nll_loss", [T(4, 5), T(4, dtype="i64"), None], {"reduction": "avg", "ignore_index": -100}, "reduction"),
    ("latch::full", [], {"shape": (2,), "value": 0.5, "dtype": "i32"}, "not representable"),
    ("latch::layer_norm_backward", [T(2, 4), T(2, 4), T(2, 1), T(2, 1), None, None],
     {"normalized_ndim": 1, "output_mask": (True, True, False)}, "w is absent"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_rules_reject_misuse_naming_the_op(case):
    name, types, attrs, fragment = case
    with pytest.raises(ShapeError) as e:
        BY_NAME[name].check(types, attrs)
    assert name in str(e.value) and fragment in str(e.value)


def test_matmul_cost_counts_multiply_adds():
    spec = BY_NAME["latch::matmul"]
    flops, nbytes = spec.cost([T(2, 3, 4), T(2, 4, 5)], [T(2, 3, 5)], {})
    assert flops == 2 * 2 * 3 * 4 * 5
    assert nbytes == 4 * (24 + 40 + 30)
