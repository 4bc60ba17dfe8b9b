"""The MoE ops: shape rules, the entry-point registration, custom ops (opcheck, gradcheck), references."""

import pytest
from hypothesis import given, settings, strategies as st

from latch_core.ir import TensorType
from latch_core.registry import ShapeError
from latch_ops.moe import specs as S

torch = pytest.importorskip("torch")
from latch_ops.moe import torch_ops as M  # noqa: E402  (needs torch)
from latch_ops.moe.reference import route_order_math  # noqa: E402


def T(shape, dtype="f32"):
    return TensorType(shape, dtype)


SPECS = {s.name: s for s in S.SPECS}


# --------------------------------------------------------------------------------------------
# Registration and shape rules

def test_registered_through_the_moe_entry_point(monkeypatch):
    from latch_core.plugins import load_with

    monkeypatch.setenv("LATCH_PLUGINS", "moe")  # the entry point alone, as a third-party package
    regs = load_with()
    for name in SPECS:
        assert regs.ops.owner(name) == "moe"
        assert regs.ops.get(name) is SPECS[name]
        assert callable(SPECS[name].extra["reference"])
    # derivatives: each differentiable custom op carries its torch autograd formula (capture
    # traces through it), and the backward ops that formula emits are registered Latch ops too
    custom = {S.RAGGED_MM: M._ragged_mm, S.TOKEN_TOPK: M._token_topk}
    for op in custom.values():
        assert op._backward_fn is not None
    assert {S.TOKEN_TOPK_BACKWARD, S.RAGGED_MM_GRAD_X, S.RAGGED_MM_GRAD_W} <= set(regs.ops)


def test_shape_rules():
    assert SPECS[S.TOKEN_TOPK].check([T((10, 4))], {"k": 2}) == [T((10, 2)), T((10, 2), "i64")]
    assert SPECS[S.TOKEN_TOPK_BACKWARD].check([T((10, 2)), T((10, 2), "i64")], {"num_experts": 4}) == [T((10, 4))]
    assert SPECS[S.ROUTE_ORDER].check([T((10, 2), "i64")], {"num_experts": 4}) == [
        T((20,), "i64"), T((20,), "i64"), T((5,), "i64")]
    assert SPECS[S.RAGGED_MM].check([T((20, 8)), T((4, 8, 3)), T((5,), "i64")], {}) == [T((20, 3))]
    assert SPECS[S.RAGGED_MM_GRAD_X].check([T((20, 3)), T((4, 8, 3)), T((5,), "i64")], {}) == [T((20, 8))]
    assert SPECS[S.RAGGED_MM_GRAD_W].check([T((20, 8)), T((20, 3)), T((5,), "i64")], {}) == [T((4, 8, 3))]


@pytest.mark.parametrize("op, inputs, attrs, match", [
    (S.TOKEN_TOPK, [T((10, 4))], {"k": 5}, "k=5 exceeds"),
    (S.TOKEN_TOPK, [T((10, 4))], {}, "'k' must be an int"),
    (S.TOKEN_TOPK, [T((10, 4), "i64")], {"k": 1}, "float tensor"),
    (S.TOKEN_TOPK, [T((2, 10, 4))], {"k": 1}, r"\[N, E\]"),
    (S.TOKEN_TOPK_BACKWARD, [T((10, 2)), T((10, 3), "i64")], {"num_experts": 4}, "one shape"),
    (S.ROUTE_ORDER, [T((10, 2))], {"num_experts": 4}, "integer tensor"),
    (S.ROUTE_ORDER, [T((10, 2), "i64")], {"num_experts": 0}, ">= 1"),
    (S.RAGGED_MM, [T((20, 8)), T((4, 7, 3)), T((5,), "i64")], {}, "Din=8 but w"),
    (S.RAGGED_MM, [T((20, 8)), T((4, 8, 3)), T((4,), "i64")], {}, r"offsets must be \[E\+1\]"),
    (S.RAGGED_MM, [T((20, 8)), T((4, 8, 3), "f64"), T((5,), "i64")], {}, "share one dtype"),
    (S.RAGGED_MM_GRAD_X, [T((20, 4)), T((4, 8, 3)), T((5,), "i64")], {}, "Dout=4 but w"),
    (S.RAGGED_MM_GRAD_X, [T((20, 3)), T((4, 8, 3)), T((4,), "i64")], {}, r"offsets must be \[E\+1\]"),
    (S.RAGGED_MM_GRAD_W, [T((20, 8)), T((19, 3)), T((5,), "i64")], {}, "row count"),
    (S.RAGGED_MM_GRAD_W, [T((20, 8)), T((20, 3), "i64"), T((5,), "i64")], {}, "float tensor"),
])
def test_shape_rule_errors_name_op_and_operand(op, inputs, attrs, match):
    with pytest.raises(ShapeError, match=match) as e:
        SPECS[op].check(inputs, attrs)
    assert op in str(e.value)


def test_costs():
    x, w, off, out = T((20, 8)), T((4, 8, 3)), T((5,), "i64"), T((20, 3))
    flops, nbytes = S.cost_ragged_mm([x, w, off], [out], {})
    assert flops == 2 * 20 * 8 * 3 and nbytes == x.nbytes + w.nbytes + off.nbytes + out.nbytes
    assert S.cost_ragged_mm_grad_x([out, w, off], [x], {})[0] == flops
    assert S.cost_ragged_mm_grad_w([x, out, off], [w], {})[0] == flops


# --------------------------------------------------------------------------------------------
# token_topk

def test_token_topk_values_order_and_ties():
    probs = torch.tensor([[0.1, 0.4, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
    vals, idx = M.token_topk(probs, 2)
    assert idx.tolist() == [[1, 2], [0, 1]]  # ties go to the lower expert index
    assert vals.tolist() == [[0.4, 0.4], [0.7, 0.1]]


def test_token_topk_matches_torch_topk_without_ties():
    probs = torch.randn(50, 16, dtype=torch.float64).softmax(-1)
    vals, idx = M.token_topk(probs, 3)
    want = torch.topk(probs, 3, dim=-1)
    assert torch.equal(vals, want.values) and torch.equal(idx, want.indices)


def test_token_topk_opcheck_and_gradcheck():
    probs = torch.randn(6, 5, dtype=torch.float64).requires_grad_()
    torch.library.opcheck(torch.ops.latch.token_topk, (probs, 2))
    idx = M.token_topk(probs.detach(), 2)[1]
    torch.library.opcheck(torch.ops.latch.token_topk_backward, (torch.randn(6, 2, dtype=torch.float64), idx, 5))
    assert torch.autograd.gradcheck(lambda p: M.token_topk(p, 2)[0], (probs,))


# --------------------------------------------------------------------------------------------
# route_order

def _check_route(indices, E):
    token, position, offsets = M.route_order(indices, E)
    n, k = indices.shape
    flat = indices.reshape(-1)
    assert offsets.tolist() == [0] + torch.cumsum(torch.bincount(flat, minlength=E), 0).tolist()
    assert sorted(position.tolist()) == list(range(n * k))  # a permutation
    pairs = torch.arange(n * k)
    # pair p = (token p // k, slot p % k) sits at sorted row position[p], inside its expert's segment
    assert torch.equal(token[position], pairs // k)
    for e in range(E):
        rows = position[flat == e]
        assert bool(((rows >= offsets[e]) & (rows < offsets[e + 1])).all())
        assert rows.tolist() == sorted(rows.tolist())  # stable: (token, slot) order kept inside an expert
    return token, position, offsets


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), k=st.integers(1, 3), E=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_route_order_properties(n, k, E, seed):
    g = torch.Generator().manual_seed(seed)
    _check_route(torch.randint(0, E, (n, k), generator=g), E)


def test_route_order_example_and_empty_experts():
    idx = torch.tensor([[2, 0], [0, 2], [2, 3]])
    token, position, offsets = _check_route(idx, 5)
    assert token.tolist() == [0, 1, 0, 1, 2, 2]
    assert offsets.tolist() == [0, 2, 2, 5, 6, 6]
    assert position.tolist() == [2, 0, 1, 3, 4, 5]


def test_route_order_rejects_bad_expert_index():
    with pytest.raises(ValueError, match=r"latch::route_order: indices\[1, 0\] = 7 is not an expert index in \[0, 4\)"):
        route_order_math(torch.tensor([[0, 1], [7, 2]]), 4)


def test_route_order_opcheck():
    torch.library.opcheck(torch.ops.latch.route_order, (torch.randint(0, 4, (7, 2)), 4))


# --------------------------------------------------------------------------------------------
# ragged_mm

def _ragged_case(R=9, Din=5, Dout=4, E=4, counts=(3, 0, 4, 2), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, Din, generator=g, dtype=dtype)
    w = torch.randn(E, Din, Dout, generator=g, dtype=dtype)
    offsets = torch.cumsum(torch.tensor((0,) + tuple(counts)), 0)
    return x, w, offsets


def test_ragged_mm_rowwise_definition():
    x, w, offsets = _ragged_case(R=11)  # rows 9, 10 lie in no segment
    out = M.ragged_mm(x, w, offsets)
    expert = [0, 0, 0, 2, 2, 2, 2, 3, 3]
    for r in range(11):
        want = x[r] @ w[expert[r]] if r < 9 else torch.zeros(4, dtype=x.dtype)
        torch.testing.assert_close(out[r], want, rtol=1e-13, atol=1e-13)


def test_ragged_mm_gradient_definitions_and_empty_expert():
    x, w, offsets = _ragged_case()
    grad = torch.randn(9, 4, dtype=torch.float64)
    dx = torch.ops.latch.ragged_mm_grad_x(grad, w, offsets)
    dw = torch.ops.latch.ragged_mm_grad_w(x, grad, offsets)
    assert torch.equal(dw[1], torch.zeros_like(dw[1]))  # expert 1 received no rows
    torch.testing.assert_close(dw[2], x[3:7].T @ grad[3:7], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(dx[7:9], grad[7:9] @ w[3].T, rtol=1e-13, atol=1e-13)


def test_ragged_mm_rejects_bad_offsets():
    x, w, _ = _ragged_case()
    with pytest.raises(ValueError, match=r"latch::ragged_mm: offsets must be non-decreasing, but offsets\[1\] = 5"):
        M.ragged_mm(x, w, torch.tensor([0, 5, 3, 9, 9]))
    with pytest.raises(ValueError, match=r"offsets must lie in \[0, 9\]"):
        M.ragged_mm(x, w, torch.tensor([0, 3, 3, 9, 12]))


def test_ragged_mm_opcheck_and_gradcheck():
    x, w, offsets = _ragged_case(R=7, Din=3, Dout=2, E=3, counts=(2, 0, 5))
    # the backward has no derivative of its own (no double backward): check it on plain tensors
    grad = torch.randn(7, 2, dtype=torch.float64)
    torch.library.opcheck(torch.ops.latch.ragged_mm_grad_x, (grad, w, offsets))
    torch.library.opcheck(torch.ops.latch.ragged_mm_grad_w, (x, grad, offsets))
    x.requires_grad_(), w.requires_grad_()
    torch.library.opcheck(torch.ops.latch.ragged_mm, (x, w, offsets))
    assert torch.autograd.gradcheck(lambda x, w: M.ragged_mm(x, w, offsets), (x, w))


# --------------------------------------------------------------------------------------------
# References: the spec's reference is the eager custom op, exactly

def test_references_equal_eager_ops():
    probs = torch.randn(8, 4, dtype=torch.float64).softmax(-1)
    ref = SPECS[S.TOKEN_TOPK].extra["reference"]
    vals, idx = M.token_topk(probs, 2)
    assert all(torch.equal(a, b) for a, b in zip(ref([probs], {"k": 2}), (vals, idx)))
    gv = torch.randn(8, 2, dtype=torch.float64)
    assert torch.equal(SPECS[S.TOKEN_TOPK_BACKWARD].extra["reference"]([gv, idx], {"num_experts": 4})[0],
                       torch.ops.latch.token_topk_backward(gv, idx, 4))
    got = SPECS[S.ROUTE_ORDER].extra["reference"]([idx], {"num_experts": 4})
    assert all(torch.equal(a, b) for a, b in zip(got, M.route_order(idx, 4)))
    x, w, offsets = _ragged_case()
    assert torch.equal(SPECS[S.RAGGED_MM].extra["reference"]([x, w, offsets], {})[0], M.ragged_mm(x, w, offsets))
    g = torch.randn(9, 4, dtype=torch.float64)
    assert torch.equal(SPECS[S.RAGGED_MM_GRAD_X].extra["reference"]([g, w, offsets], {})[0],
                       torch.ops.latch.ragged_mm_grad_x(g, w, offsets))
    assert torch.equal(SPECS[S.RAGGED_MM_GRAD_W].extra["reference"]([x, g, offsets], {})[0],
                       torch.ops.latch.ragged_mm_grad_w(x, g, offsets))


# --------------------------------------------------------------------------------------------
# A whole MoE layer from these ops equals a dense formulation, values and gradients

def _moe_sparse(x, router, w1, w3, w2, k):
    n, E = x.shape[0], router.shape[1]
    probs = (x @ router).softmax(-1)
    vals, idx = M.token_topk(probs, k)
    gates = vals / vals.sum(-1, keepdim=True)
    token, position, offsets = M.route_order(idx, E)
    xs = x.index_select(0, token)
    h = torch.nn.functional.silu(M.ragged_mm(xs, w1, offsets)) * M.ragged_mm(xs, w3, offsets)
    y = M.ragged_mm(h, w2, offsets)
    return (y.index_select(0, position).view(n, k, -1) * gates.unsqueeze(-1)).sum(1)


def _moe_dense(x, router, w1, w3, w2, k):
    probs = (x @ router).softmax(-1)
    top = torch.topk(probs, k, dim=-1)
    gates = top.values / top.values.sum(-1, keepdim=True)
    weight = torch.zeros_like(probs).scatter(1, top.indices, gates)  # [N, E]
    h = torch.nn.functional.silu(torch.einsum("nd,edh->enh", x, w1)) * torch.einsum("nd,edh->enh", x, w3)
    y = torch.einsum("enh,ehd->end", h, w2)
    return torch.einsum("ne,end->nd", weight, y)


def test_moe_layer_matches_dense_formulation():
    g = torch.Generator().manual_seed(3)
    n, d, hdim, E, k = 12, 6, 5, 4, 2
    args = [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
            for s in ((n, d), (d, E), (E, d, hdim), (E, d, hdim), (E, hdim, d))]
    out_s, out_d = _moe_sparse(*args, k), _moe_dense(*args, k)
    torch.testing.assert_close(out_s, out_d, rtol=1e-12, atol=1e-12)
    go = torch.randn_like(out_s)
    for a, b in zip(torch.autograd.grad(out_s, args, go), torch.autograd.grad(out_d, args, go)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_moe_layer_traces_to_single_nodes():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(*args):
        with torch.enable_grad():
            args = [a.detach().requires_grad_() for a in args]
            return torch.autograd.grad(_moe_sparse(*args, 2).square().sum(), args)

    shapes = ((12, 6), (6, 4), (4, 6, 5), (4, 6, 5), (4, 5, 6))
    gm = make_fx(step, tracing_mode="fake")(*[torch.randn(*s) for s in shapes])
    names = [n.target.name() for n in gm.graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    counts = {op: names.count(op) for op in set(names) if op.startswith("latch::")}
    assert counts == {"latch::token_topk": 1, "latch::token_topk_backward": 1, "latch::route_order": 1,
                      "latch::ragged_mm": 3, "latch::ragged_mm_grad_x": 3, "latch::ragged_mm_grad_w": 3}


def test_ragged_mm_gradient_ops_only_where_needed():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w, offsets = _ragged_case(dtype=torch.float32)

    def step(x, w, offsets):  # x is data (no gradient), w a weight
        with torch.enable_grad():
            w = w.detach().requires_grad_()
            return torch.autograd.grad(M.ragged_mm(x, w, offsets).sum(), [w])

    gm = make_fx(step, tracing_mode="fake")(x, w, offsets)
    names = [n.target.name() for n in gm.graph.nodes if isinstance(getattr(n, "target", None), torch._ops.OpOverload)]
    assert "latch::ragged_mm_grad_w" in names and "latch::ragged_mm_grad_x" not in names


# --------------------------------------------------------------------------------------------
# Tilings (used by latch-schedule): footprints cover what the reference reads

def test_ragged_tilings_footprints():
    pytest.importorskip("latch_schedule.tiling")
    x, w, off = T((300, 64)), T((4, 64, 40)), T((5,), "i64")
    t = SPECS[S.RAGGED_MM].extra["tiling"]([x, w, off], [T((300, 40))], {})
    assert t.split_dims == (0, 1)
    ins, outs = t.footprint(((128, 256), (0, 40)))
    assert ins == [((128, 256), (0, 64)), ((0, 4), (0, 64), (0, 40)), ((0, 5),)] and outs == [((128, 256), (0, 40))]
    # grad_x: dx[R, Din] columns are w's middle dim, also when Din == Dout (no guessing from shapes)
    sq = T((4, 40, 40))
    t = SPECS[S.RAGGED_MM_GRAD_X].extra["tiling"]([T((300, 40)), sq, off], [T((300, 40))], {})
    ins, _ = t.footprint(((0, 128), (8, 16)))
    assert ins[1] == ((0, 4), (8, 16), (0, 40))
    t = SPECS[S.RAGGED_MM_GRAD_W].extra["tiling"]([x, T((300, 40)), off], [w], {})
    ins, outs = t.footprint(((2, 3), (0, 32), (8, 16)))
    assert ins == [((0, 300), (0, 32)), ((0, 300), (8, 16)), ((0, 5),)] and outs == [((2, 3), (0, 32), (8, 16))]


def test_wide_bf16_expert_products_tile_128_by_256():
    # TinyMoE-200M (4096 sorted rows, d 768, hidden 512, 16 experts, BF16 operands): 128 x 256 tiles
    # for the forward and grad_x (one wgmma sub-tile of N 256 per expert a tile meets), 128 x 128 for
    # narrower outputs and for FP32 operands (the SIMT body); grad_w keeps (1, 128, 128)
    pytest.importorskip("latch_schedule.tiling")
    from latch_ops.moe import tilings

    R, d, h, E = 4096, 768, 512, 16
    off = T((E + 1,), "i64")
    for dt, want in (("bf16", 256), ("f16", 256), ("f32", 128)):
        t = SPECS[S.RAGGED_MM].extra["tiling"]([T((R, d), dt), T((E, d, h), dt), off], [T((R, h), "f32")], {})
        assert t.granule == (128, want), (dt, t.granule)
        t = SPECS[S.RAGGED_MM_GRAD_X].extra["tiling"]([T((R, h), dt), T((E, d, h), dt), off], [T((R, d), "f32")], {})
        assert t.granule == (128, want), (dt, t.granule)
    t = SPECS[S.RAGGED_MM].extra["tiling"]([T((R, d), "bf16"), T((E, d, 192), "bf16"), off], [T((R, 192), "f32")], {})
    assert t.granule == (128, 128)
    t = SPECS[S.RAGGED_MM_GRAD_W].extra["tiling"]([T((R, d), "bf16"), T((R, h), "bf16"), off], [T((E, d, h), "f32")], {})
    assert t.granule == (1, 128, 128)
    assert tilings.cols(255, "bf16") == 128 and tilings.cols(256, "bf16") == 256


def _poisoned(t, box):
    out = torch.full_like(t, float("nan"))
    idx = tuple(slice(lo, hi) for lo, hi in box)
    out[idx] = t[idx]
    return out


@pytest.mark.parametrize("op", [S.RAGGED_MM, S.RAGGED_MM_GRAD_X, S.RAGGED_MM_GRAD_W])
def test_ragged_tiles_read_only_their_footprint(op):
    # Each output tile computed from only its footprint (the rest of every float operand poisoned
    # with NaN) equals the reference on that tile: the footprint covers what the op reads.
    pytest.importorskip("latch_schedule.tiling")
    x, w, offsets = _ragged_case(R=11, Din=6, Dout=5, E=4, counts=(3, 0, 4, 2))
    grad = torch.randn(11, 5, dtype=torch.float64)
    args = {S.RAGGED_MM: [x, w, offsets], S.RAGGED_MM_GRAD_X: [grad, w, offsets],
            S.RAGGED_MM_GRAD_W: [x, grad, offsets]}[op]
    spec = SPECS[op]
    ref = spec.extra["reference"]
    types = [T(tuple(a.shape), "i64" if a.dtype == torch.int64 else "f64") for a in args]
    out_type = spec.check(types, {})[0]
    tiling = spec.extra["tiling"](types, [out_type], {})
    full = ref(args, {})[0]
    boxes = {2: [((0, 4), (0, 5)), ((3, 8), (1, 3)), ((8, 11), (4, 6))],
             3: [((0, 1), (0, 3), (0, 5)), ((2, 3), (2, 6), (1, 3)), ((1, 2), (0, 6), (0, 5))]}[len(out_type.shape)]
    for box in boxes:
        box = tuple((lo, min(hi, n)) for (lo, hi), n in zip(box, out_type.shape))
        ins, outs = tiling.footprint(box)
        assert outs == [box]
        part = ref([a if a.dtype == torch.int64 else _poisoned(a, b) for a, b in zip(args, ins)], {})[0]
        idx = tuple(slice(lo, hi) for lo, hi in box)
        assert torch.equal(part[idx], full[idx]), box


def test_token_topk_backward_tiles_by_rows_and_reads_only_their_footprint():
    """Tiles of rows (run 29: as one task it took 133 us a layer while the other SMs waited): each
    tile computed from only its footprint (the other rows of the gradient poisoned) equals the
    reference on its rows."""
    pytest.importorskip("latch_schedule.tiling")
    g = torch.randn(9, 2, dtype=torch.float64)
    idx = torch.stack([torch.randperm(5)[:2] for _ in range(9)])
    spec = SPECS[S.TOKEN_TOPK_BACKWARD]
    attrs = {"num_experts": 5}
    types = [T((9, 2), "f64"), T((9, 2), "i64")]
    out = spec.check(types, attrs)[0]
    tiling = spec.extra["tiling"](types, [out], attrs)
    assert tiling.split_dims == (0,)
    full = spec.extra["reference"]([g, idx], attrs)[0]
    for box in (((0, 4), (0, 5)), ((4, 9), (0, 5)), ((3, 4), (0, 5))):
        ins, outs = tiling.footprint(box)
        assert outs == [box] and ins[1] == (box[0], (0, 2))
        part = spec.extra["reference"]([_poisoned(g, ins[0]), idx], attrs)[0]
        assert torch.equal(part[box[0][0]:box[0][1]], full[box[0][0]:box[0][1]]), box


@pytest.mark.parametrize("op", ["latch::softmax", S.TOKEN_TOPK, S.TOKEN_TOPK_BACKWARD])
def test_the_routers_short_rows_spread_over_the_sms(op):
    """A router's rows are latency-bound (CostModel.row_latency): run 26 had softmax on 5 SMs for
    ~72 us and token_topk on 3 for ~110 us a layer, run 29 token_topk_backward as one task of 133 us,
    the other SMs waiting. [2048, 16] must now take (nearly) every SM."""
    tasks = pytest.importorskip("latch_schedule.tasks")
    from latch_core.ir import Graph, Group, Node, Value
    from latch_core.plugins import registries

    N, E, k = 2048, 16, 2
    if op == "latch::softmax":
        values, ins, outs = [Value("x", (N, E), "f32", "batch"), Value("y", (N, E), "f32")], ("x",), ("y",)
        attrs = {"dim": 1}
    elif op == S.TOKEN_TOPK:
        values = [Value("x", (N, E), "f32", "batch"), Value("v", (N, k), "f32"), Value("i", (N, k), "i64")]
        ins, outs, attrs = ("x",), ("v", "i"), {"k": k}
    else:
        values = [Value("g", (N, k), "f32", "batch"), Value("i", (N, k), "i64", "batch"), Value("y", (N, E), "f32")]
        ins, outs, attrs = ("g", "i"), ("y",), {"num_experts": E}
    g = Graph("p", values, [Node("n", op, ins, outs, attrs)], [Group("batch", list(ins))], [Group("out", list(outs))])
    tg = tasks.build(g, registries().ops, num_sms=132)
    assert len(tg.tiles) >= 100, (op, len(tg.tiles))
