"""latch::sdpa and latch::sdpa_backward: shape rules, the torch custom ops, derivatives, references."""

import math
import subprocess
import sys

import pytest

from latch_core.ir import TensorType
from latch_core.registry import ATTENTION, ShapeError
from latch_ops import attention as A

torch = pytest.importorskip("torch")
F = torch.nn.functional


def T(shape, dtype="f32"):
    return TensorType(shape, dtype)


def _spec(name):
    return {s.name: s for s in A.SPECS}[name]


# --------------------------------------------------------------------------------------------
# Shape rules (no torch needed for the rules themselves)

def test_shape_rule_forward():
    out, lse = _spec(A.SDPA).check([T((2, 3, 5, 8)), T((2, 3, 7, 8)), T((2, 3, 7, 4))], {"causal": True, "scale": 0.5})
    assert out == T((2, 3, 5, 4)) and lse == T((2, 3, 5))
    out, lse = _spec(A.SDPA).check([T((1, 1, 4, 8), "bf16")] * 3, {"causal": False, "scale": 1.0})
    assert out.dtype == "bf16" and lse.dtype == "f32"  # the row statistic stays f32 for half operands
    _, lse = _spec(A.SDPA).check([T((1, 1, 4, 8), "f64")] * 3, {"causal": False, "scale": 1.0})
    assert lse.dtype == "f64"


@pytest.mark.parametrize("inputs, attrs, match", [
    ([T((2, 3, 5, 8)), T((2, 3, 7, 6)), T((2, 3, 7, 4))], {"causal": True, "scale": 1.0}, "head dims differ"),
    ([T((2, 3, 5, 8)), T((2, 4, 7, 8)), T((2, 4, 7, 8))], {"causal": True, "scale": 1.0}, "batch and head"),
    ([T((2, 3, 5, 8)), T((2, 3, 7, 8)), T((2, 3, 6, 8))], {"causal": True, "scale": 1.0}, "sequence lengths"),
    ([T((3, 5, 8)), T((3, 5, 8)), T((3, 5, 8))], {"causal": True, "scale": 1.0}, r"q must be \[B, H, T, D\]"),
    ([T((1, 1, 4, 8)), T((1, 1, 4, 8), "f64"), T((1, 1, 4, 8))], {"causal": True, "scale": 1.0}, "share one dtype"),
    ([T((1, 1, 4, 8), "i64")] * 3, {"causal": True, "scale": 1.0}, "float tensor"),
    ([T((1, 1, 4, 8))] * 3, {"causal": True}, "'scale'"),
    ([T((1, 1, 4, 8))] * 3, {"causal": 1, "scale": 1.0}, "'causal' must be a bool"),
    ([T((1, 1, 4, 8))] * 3, {"causal": True, "scale": float("nan")}, "finite"),
])
def test_shape_rule_errors_name_the_problem(inputs, attrs, match):
    with pytest.raises(ShapeError, match=match) as e:
        _spec(A.SDPA).check(inputs, attrs)
    assert "latch::sdpa" in str(e.value)


def test_shape_rule_backward():
    q, k, v = T((2, 3, 5, 8)), T((2, 3, 7, 8)), T((2, 3, 7, 4))
    o, l = T((2, 3, 5, 4)), T((2, 3, 5))
    spec = _spec(A.SDPA_BACKWARD)
    assert spec.check([o, None, q, k, v, o, l], {"causal": True, "scale": 1.0}) == [q, k, v]
    assert spec.check([o, l, q, k, v, o, l], {"causal": True, "scale": 1.0}) == [q, k, v]
    with pytest.raises(ShapeError, match="grad_out must be"):
        spec.check([T((2, 3, 5, 8)), None, q, k, v, o, l], {"causal": True, "scale": 1.0})
    with pytest.raises(ShapeError, match="grad_lse must be"):
        spec.check([o, T((2, 3, 7)), q, k, v, o, l], {"causal": True, "scale": 1.0})


def test_specs_are_complete():
    for spec in A.SPECS:
        assert spec.tags == {ATTENTION}
        assert callable(spec.extra["reference"]) and spec.cost is not None and spec.signature
    q = T((1, 2, 64, 16))
    full = A.cost_sdpa([q, q, q], [q, T((1, 2, 64))], {"causal": False, "scale": 1.0})[0]
    causal = A.cost_sdpa([q, q, q], [q, T((1, 2, 64))], {"causal": True, "scale": 1.0})[0]
    assert 0.5 < causal / full < 0.52  # (64*65/2) / 64^2


def test_imports_without_torch():
    # A fresh interpreter with torch made unimportable: the specs, the MoE plugin and the registries load.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import latch_ops.attention, latch_ops.moe.plugin, latch_ops.moe.specs\n"
        "assert len(latch_ops.attention.SPECS) == 2\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------------------------
# The math against torch's own attention (an independent implementation), in float64

def _qkv(B=2, H=3, Tq=5, Tk=5, D=8, Dv=8, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dtype).requires_grad_(grad)  # noqa: E731
    return mk(B, H, Tq, D), mk(B, H, Tk, D), mk(B, H, Tk, Dv)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq, tk", [(5, 5), (3, 6), (6, 3)])
def test_math_matches_torch_sdpa(causal, tq, tk):
    q, k, v = _qkv(Tq=tq, Tk=tk, Dv=4)
    scale = 0.37
    out, lse = A.sdpa_forward_math(q, k, v, causal, scale)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_math_matches_torch_autograd(causal):
    q, k, v = _qkv(Tq=4, Tk=6, Dv=5, grad=True)
    scale = 0.3
    want_out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    go = torch.randn_like(want_out)
    want = torch.autograd.grad(want_out, (q, k, v), go)
    out, lse = A.sdpa_forward_math(q.detach(), k.detach(), v.detach(), causal, scale)
    got = A.sdpa_backward_math(go, None, q.detach(), k.detach(), v.detach(), out, lse, causal, scale)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12)


# --------------------------------------------------------------------------------------------
# The torch custom ops

def test_custom_ops_pass_opcheck():
    ops = A.torch_ops()
    q, k, v = _qkv(B=1, H=2, Tq=3, Tk=4, D=4, Dv=3, grad=True)
    torch.library.opcheck(ops.sdpa, (q, k, v, True, 0.5))
    out, lse = A.sdpa_forward_math(q.detach(), k.detach(), v.detach(), True, 0.5)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    args = (go, gl, q.detach(), k.detach(), v.detach(), out, lse, True, 0.5)
    torch.library.opcheck(ops.sdpa_backward, args)
    torch.library.opcheck(ops.sdpa_backward, (go, None) + args[2:])


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_both_outputs(causal):
    # The derivative rule (latch::sdpa_backward, incl. the lse path) against finite differences.
    ops = A.torch_ops()
    q, k, v = _qkv(B=1, H=2, Tq=3, Tk=4, D=3, Dv=2, grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: ops.sdpa(q, k, v, causal, 0.7), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: ops.sdpa(q, k, v, causal, 0.7)[0], (q, k, v))


def test_reference_equals_eager_op_and_strides_are_contiguous():
    ops = A.torch_ops()
    q, k, v = _qkv(Tq=4, Tk=4)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous operand, as models produce
    out, lse = ops.sdpa(qt, k, v, True, 0.25)
    ref = _spec(A.SDPA).extra["reference"]([q, k, v], {"causal": True, "scale": 0.25})
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    assert out.is_contiguous() and lse.is_contiguous()
    go = torch.randn_like(out)
    got = ops.sdpa_backward(go, None, qt, k, v, out, lse, True, 0.25)
    want = _spec(A.SDPA_BACKWARD).extra["reference"]([go, None, q, k, v, out, lse], {"causal": True, "scale": 0.25})
    for g, w in zip(got, want):
        assert torch.equal(g, w) and g.is_contiguous()


def test_half_precision_keeps_f32_statistics():
    q, k, v = _qkv(Tq=4, Tk=4, dtype=torch.bfloat16)
    out, lse = A.torch_ops().sdpa(q, k, v, True, 0.5)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    want, _ = A.sdpa_forward_math(q.double(), k.double(), v.double(), True, 0.5)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_wrapper_default_scale_and_error_at_trace():
    q, k, v = _qkv(D=16)
    torch.testing.assert_close(A.sdpa(q, k, v, causal=False), F.scaled_dot_product_attention(q, k, v),
                               rtol=1e-12, atol=1e-12)
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fq, fk = mode.from_tensor(q), mode.from_tensor(k[..., :8].contiguous())
    with mode:
        with pytest.raises(ShapeError, match="q and k head dims differ"):
            A.sdpa(fq, fk, fk)


def test_traced_update_has_one_node_per_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    ops = A.torch_ops()

    def step(q, k, v):
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            out = A.sdpa(q, k, v, causal=True)
            return torch.autograd.grad(out.square().sum(), (q, k, v))

    gm = make_fx(step, tracing_mode="fake")(*_qkv(dtype=torch.float32))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(ops.sdpa.default) == 1
    assert targets.count(ops.sdpa_backward.default) == 1
    bwd = next(n for n in gm.graph.nodes if n.target is ops.sdpa_backward.default)
    assert bwd.args[1] is None  # lse unused: grad_lse absent, not a materialised zeros tensor


# --------------------------------------------------------------------------------------------
# Tilings (used by latch-schedule): every tile computed from only its footprint (everything else
# poisoned with NaN) equals the reference there, so the footprints cover what the op reads.

def _poisoned(t, box):
    out = torch.full_like(t, float("nan"))
    idx = tuple(slice(lo, hi) for lo, hi in box)
    out[idx] = t[idx]
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_tiles_read_only_their_footprint(causal):
    pytest.importorskip("latch_schedule.tiling")
    q, k, v = _qkv(B=2, H=2, Tq=7, Tk=5, D=4, Dv=3)
    attrs = {"causal": causal, "scale": 0.5}
    types = [A.latch_type(t) for t in (q, k, v)]
    tiling = _spec(A.SDPA).extra["tiling"](types, _spec(A.SDPA).check(types, attrs), attrs)
    assert tiling.split_dims == (0, 1, 2)
    out, lse = A.sdpa_forward_math(q, k, v, causal, 0.5)
    for box in (((1, 2), (0, 1), (0, 3), (0, 3)), ((0, 1), (1, 2), (3, 7), (0, 3))):
        ins, outs = tiling.footprint(box)
        o, l = A.sdpa_forward_math(*[_poisoned(t, b) for t, b in zip((q, k, v), ins)], causal, 0.5)
        idx = tuple(slice(lo, hi) for lo, hi in box)
        assert torch.equal(o[idx], out[idx]) and torch.equal(l[idx[:3]], lse[idx[:3]])
        assert outs == [box, box[:3]]


def _all_boxes(tiling, shape):
    return pytest.importorskip("latch_schedule.tiling").split(shape, tiling, 10**6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq, tk, h, hkv", [(77, 77, 2, 2), (150, 150, 4, 2), (70, 150, 2, 1), (150, 70, 3, 3)])
def test_sdpa_backward_tiles_by_head_group_and_block(causal, tq, tk, h, hkv):
    """Every backward task, fed only its read footprint (the rest NaN), gives the reference's dq
    over its box and dk/dv over its key block; the tasks' write boxes tile every output exactly
    once (no element written twice: nothing to accumulate across tasks); no task covers a head."""
    pytest.importorskip("latch_schedule.tiling")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, h, tq, 4, generator=g, dtype=torch.float64)
    k = torch.randn(1, hkv, tk, 4, generator=g, dtype=torch.float64)
    v = torch.randn(1, hkv, tk, 3, generator=g, dtype=torch.float64)
    out, lse = A.sdpa_forward_math(q, k, v, causal, 0.5)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    args = [go, gl, q, k, v, out, lse]
    types = [A.latch_type(t) for t in args]
    spec = _spec(A.SDPA_BACKWARD)
    attrs = {"causal": causal, "scale": 0.5}
    out_types = spec.check(types, attrs)
    tiling = spec.extra["tiling"](types, out_types, attrs)
    assert tiling.split_dims == (0, 1, 2) and tiling.granule == (1, h // hkv, A.BLOCK)
    want = A.sdpa_backward_math(*args, causal, 0.5)
    written = [torch.zeros(t.shape, dtype=torch.int64) for t in out_types]
    boxes = _all_boxes(tiling, out_types[0].shape)
    assert len(boxes) == h // (h // hkv) * math.ceil(tq / A.BLOCK)
    for box in boxes:
        ins, outs = tiling.footprint(box)
        assert outs[0] == box and box[2][1] - box[2][0] <= A.BLOCK
        got = A.sdpa_backward_math(*[_poisoned(t, b) for t, b in zip(args, ins)], causal, 0.5)
        for gt, w, ob, cnt in zip(got, want, outs, written):
            idx = tuple(slice(lo, hi) for lo, hi in ob)
            assert torch.equal(gt[idx], w[idx]), (box, ob)
            cnt[idx] += 1
    for cnt in written:
        assert bool((cnt == 1).all())


def test_sdpa_forward_tiles_by_query_block_with_grouped_heads():
    pytest.importorskip("latch_schedule.tiling")
    q, _, _ = _qkv(B=1, H=4, Tq=200, Tk=200, D=4, Dv=4)
    k, v = _qkv(B=1, H=2, Tq=200, Tk=200, D=4, Dv=4, seed=1)[1:]
    attrs = {"causal": True, "scale": 0.5}
    types = [A.latch_type(t) for t in (q, k, v)]
    spec = _spec(A.SDPA)
    tiling = spec.extra["tiling"](types, spec.check(types, attrs), attrs)
    out, lse = A.sdpa_forward_math(q, k, v, True, 0.5)
    boxes = _all_boxes(tiling, out.shape)
    assert len(boxes) == 4 * math.ceil(200 / A.QUERY_TILE)
    for box in boxes:
        ins, outs = tiling.footprint(box)
        assert ins[1][1] == A.kv_heads(*box[1], 2)
        o, l = A.sdpa_forward_math(*[_poisoned(t, b) for t, b in zip((q, k, v), ins)], True, 0.5)
        idx = tuple(slice(lo, hi) for lo, hi in box)
        assert torch.equal(o[idx], out[idx]) and torch.equal(l[idx[:3]], lse[idx[:3]])


@pytest.mark.parametrize("tq, tk", [(100, 100), (64, 200), (200, 64), (64, 64)])
def test_key_blocks_partition_the_keys(tq, tk):
    blocks = [A.key_block(r0, min(tq, r0 + A.BLOCK), tq, tk) for r0 in range(0, tq, A.BLOCK)]
    covered = [j for k0, k1 in blocks for j in range(k0, k1)]
    assert covered == list(range(tk))


# --------------------------------------------------------------------------------------------
# Grouped-query attention: fewer key/value heads than query heads

def test_shape_rule_grouped_query():
    spec = _spec(A.SDPA)
    out, lse = spec.check([T((2, 8, 5, 16)), T((2, 2, 7, 16)), T((2, 2, 7, 4))], {"causal": True, "scale": 0.5})
    assert out == T((2, 8, 5, 4)) and lse == T((2, 8, 5))
    with pytest.raises(ShapeError, match="divides q's") as e:
        spec.check([T((2, 8, 5, 16)), T((2, 3, 7, 16)), T((2, 3, 7, 4))], {"causal": True, "scale": 0.5})
    assert "latch::sdpa" in str(e.value)
    with pytest.raises(ShapeError, match="batch and head"):  # k and v must agree with each other
        spec.check([T((2, 8, 5, 16)), T((2, 2, 7, 16)), T((2, 4, 7, 4))], {"causal": True, "scale": 0.5})
    q, k, v = T((2, 8, 5, 16)), T((2, 2, 7, 16)), T((2, 2, 7, 4))
    o, l = T((2, 8, 5, 4)), T((2, 8, 5))
    assert _spec(A.SDPA_BACKWARD).check([o, None, q, k, v, o, l], {"causal": True, "scale": 1.0}) == [q, k, v]


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_math_matches_torch(causal):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.4, enable_gqa=True)
    out, lse = A.sdpa_forward_math(q.detach(), k.detach(), v.detach(), causal, 0.4)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    go = torch.randn_like(want)
    grads = torch.autograd.grad(want, (q, k, v), go)
    got = A.sdpa_backward_math(go, None, q.detach(), k.detach(), v.detach(), out, lse, causal, 0.4)
    assert got[1].shape == k.shape and got[2].shape == v.shape
    for a, b in zip(got, grads):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    ops = A.torch_ops()
    assert torch.autograd.gradcheck(lambda q, k, v: ops.sdpa(q, k, v, causal, 0.7),
                                    (q[:1, :4, :4, :3].detach().clone().requires_grad_(),
                                     k[:1, :2, :4, :3].detach().clone().requires_grad_(),
                                     v[:1, :2, :4, :2].detach().clone().requires_grad_()))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_forward_tiles_weigh_the_keys_they_visit(causal):
    """Under causal a block of query rows visits the keys up to its last row: the tiling's weight
    says so, and the scheduler shares the op's cost out by it (run 26: the last block of a head
    costs ~8x the first, so equal shares let one SM take two long tiles while others idle)."""
    tasks = pytest.importorskip("latch_schedule.tasks")
    from latch_core.ir import Graph, Group, Node, Value
    from latch_core.plugins import registries

    q, k, v = _qkv(B=1, H=2, Tq=512, Tk=512, D=64, Dv=64)
    attrs = {"causal": causal, "scale": 0.125}
    types = [A.latch_type(t) for t in (q, k, v)]
    spec = _spec(A.SDPA)
    tiling = spec.extra["tiling"](types, spec.check(types, attrs), attrs)
    boxes = _all_boxes(tiling, types[0].shape)
    w = [tiling.weight(b) for b in boxes if b[1] == (0, 1)]
    if causal:
        assert w == sorted(w) and w[-1] == w[0] * (512 // A.QUERY_TILE)  # rows 0..127 see 128 keys, the last 512
    else:
        assert len(set(w)) == 1
    qs = (1, 2, 512, 64)
    values = [Value(n, qs, "bf16", "batch") for n in "qkv"] + [Value("o", qs, "bf16"), Value("lse", qs[:3], "f32")]
    g = Graph("p", values, [Node("att", A.SDPA, ("q", "k", "v"), ("o", "lse"), attrs)], [Group("batch", ["q", "k", "v"])],
              [Group("out", ["o", "lse"])])
    tg = tasks.build(g, registries().ops, num_sms=8)
    costs = [c for c, t in zip(tg.cost, tg.tiles) if t[1] == (0, 1)]
    assert (costs == sorted(costs) and costs[-1] > 3 * costs[0]) if causal else len(set(costs)) == 1


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backward_tiles_weigh_the_steps_of_both_halves(causal):
    """A backward task of block n of N runs (n + 1) dq steps and (N - n) dk/dv steps under causal
    (N and N otherwise), and a dk/dv step costs more than a dq step (run 32 on the H200: block 0
    39.3 us, block 15 26.6 us): the tiling's weight says so, the scheduler shares the op's cost out
    by it, and LPT then gives no SM three of the dearest blocks (run 32's backward phases: 110 us
    where the SMs' mean load was 94 us; with equal costs the barrier plan gave the SMs of three
    tasks blocks 0, 4 and 8, those of two tasks blocks 11 and 15)."""
    tasks = pytest.importorskip("latch_schedule.tasks")
    from latch_core.ir import Graph, Group, Node, Value
    from latch_core.plugins import registries

    B, H, T, D, sms = 2, 12, 1024, 64, 132
    qs = (B, H, T, D)
    attrs = {"causal": causal, "scale": 0.125}
    values = [Value(n, qs, "bf16", "batch") for n in ("q", "k", "v", "o", "go")] + [
        Value("lse", qs[:3], "f32", "batch"), Value("dq", qs, "bf16"), Value("dk", qs, "bf16"), Value("dv", qs, "bf16")]
    g = Graph("p", values, [Node("bwd", A.SDPA_BACKWARD, ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"),
                                 attrs)],
              [Group("batch", ["q", "k", "v", "o", "go", "lse"])], [Group("out", ["dq", "dk", "dv"])])
    tg = tasks.build(g, registries().ops, num_sms=sms)
    n_blocks = T // A.BLOCK
    by_block = {}
    for c, t in zip(tg.cost, tg.tiles):
        assert t[2][1] - t[2][0] == A.BLOCK
        by_block.setdefault(t[2][0] // A.BLOCK, set()).add(round(c * 1e9))
    assert len(by_block) == n_blocks and all(len(v) == 1 for v in by_block.values()), by_block
    cost = [by_block[n].pop() for n in range(n_blocks)]
    if not causal:
        assert len(set(cost)) == 1
        return
    assert cost == sorted(cost, reverse=True) and cost[0] > 1.2 * cost[-1], cost
    # the weight's ratio of the first and last blocks against run 32's measured one (39.3 / 26.6)
    assert 1.2 < cost[0] / cost[-1] < 1.6, cost
    # LPT over the weighted costs (the barrier scheduler's assignment): the SMs that run three
    # tasks mix dear and cheap blocks, the dearest SM's load is within 6% of the mean
    lpt = pytest.importorskip("latch_schedule.assign").lpt
    where, loads = lpt(range(len(tg.cost)), tg.cost, sms)
    per_sm: dict[int, list[int]] = {}
    for t, s in where.items():
        per_sm.setdefault(s, []).append(tg.tiles[t][2][0] // A.BLOCK)
    assert max(loads) < 1.06 * sum(loads) / sms, (max(loads), sum(loads) / sms)
    assert not [b for b in per_sm.values() if len(b) == 3 and max(b) < n_blocks // 2], per_sm
