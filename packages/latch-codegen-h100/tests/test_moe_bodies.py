"""The grouped wgmma bodies of the ragged expert products (lower_moe.py, latch_moe.cuh).

CPU: which body a node gets; the three products at TinyMoE's layouts compile for sm_90a into HGMMA
fed by TMA, not serialised, without spills. GPU (marked): each product against its FP64
reference over ragged routing (an empty expert, segments shorter than a K block, longer than a
tile, tiles that straddle experts), and the expert-weight gradient bit-identical across runs.
"""

from __future__ import annotations

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100.lower_moe import ragged_wgmma
from latch_codegen_h100.sass import sass_report

BF, F = "bf16", "f32"


needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")


def test_the_wgmma_body_is_taken_for_bf16_operands_tma_can_stream():
    R, d, h, E = 4096, 768, 512, 16  # TinyMoE-200M's expert layer
    # wide outputs take 128 x 256 sub-tiles, as their tiles (latch_ops.moe.tilings.cols); grad_w 128 x 128
    assert ragged_wgmma("latch::ragged_mm", (((R, d), BF), ((E, d, h), BF)), F) == 256
    assert ragged_wgmma("latch::ragged_mm_grad_x", (((R, h), BF), ((E, d, h), BF)), F) == 256
    assert ragged_wgmma("latch::ragged_mm", (((R, d), BF), ((E, d, 192), BF)), F) == 128
    assert ragged_wgmma("latch::ragged_mm_grad_x", (((R, h), BF), ((E, 192, h), BF)), F) == 128
    assert ragged_wgmma("latch::ragged_mm_grad_w", (((R, d), BF), ((R, h), BF)), F) == 128
    assert ragged_wgmma("latch::ragged_mm_grad_x", (((R, 8), BF), ((E, 40, 8), BF)), F) == 64
    # FP32 operands, rows TMA cannot stream (not 16-byte multiples), an FP64 result: SIMT
    assert ragged_wgmma("latch::ragged_mm", (((R, d), F), ((E, d, h), F)), F) is None
    assert ragged_wgmma("latch::ragged_mm", (((R, 12), BF), ((E, 12, h), BF)), F) is None
    assert ragged_wgmma("latch::ragged_mm", (((R, d), BF), ((E, d, h), BF)), "f64") is None


def _doc(R=512, d=128, h=192, E=4, strategy="barrier", tiles=3, split="rows"):
    values = [Value("x", (R, d), BF, "batch"), Value("w", (E, d, h), BF, "batch"), Value("off", (E + 1,), "i64", "batch"),
              Value("g", (R, h), BF, "batch"), Value("y", (R, h), F), Value("dx", (R, d), F),
              Value("dw", (E, d, h), F)]
    nodes = [("fwd", "latch::ragged_mm", ("x", "w", "off"), ("y",), {"out_dtype": F}),
             ("dgrad", "latch::ragged_mm_grad_x", ("g", "w", "off"), ("dx",), {"out_dtype": F}),
             ("wgrad", "latch::ragged_mm_grad_w", ("x", "g", "off"), ("dw",), {"out_dtype": F})]
    g = H.graph("update", values, nodes, [("batch", ["x", "w", "off", "g"])], [("metrics", ["y", "dx", "dw"])])
    return H.planned([g], strategy=strategy, tiles=tiles, split=split)


@needs_tools
def test_ragged_products_compile_to_tensor_cores_fed_by_tma(tmp_path, cache):
    out = tmp_path / "b"
    doc = build(_doc(), out, jobs=2)
    stats = dict(doc.build.stats)
    assert stats.get("spill_stores", 0) == 0 and "wgmma_warnings" not in stats, stats
    r = sass_report(out / "program.so")
    # three bodies: forward and grad_x through gemm_k_block (two sites of four), grad_w its own two
    assert sum(r.hgmma.values()) >= 3 * 8, r
    assert any(k.startswith("64x128x16.F32.BF16") for k in r.hgmma), r
    assert r.hgmma_serialized == 0, r
    assert r.utmaldg >= 3, r
    assert r.local_loads == 0, r


@needs_tools
def test_wide_ragged_products_compile_to_n256_tensor_cores_without_spills(tmp_path, cache):
    # TinyMoE-200M's expert layer: the forward and grad_x at N 256 (tilings.cols), grad_w at N 128
    out = tmp_path / "w"
    doc = build(_doc(R=4096, d=768, h=512, E=16, tiles=32), out, jobs=2)
    stats = dict(doc.build.stats)
    assert stats.get("spill_stores", 0) == 0 and "wgmma_warnings" not in stats, stats
    r = sass_report(out / "program.so")
    assert r.hgmma.get("64x256x16.F32.BF16", 0) >= 8 and r.hgmma.get("64x128x16.F32.BF16", 0) >= 4, r
    assert r.hgmma_serialized == 0 and r.local_loads == 0 and r.local_stores == 0, r


# --------------------------------------------------------------------------------------------
# GPU

def _routing(R, E, gen):
    """Offsets with an empty expert, a segment shorter than a K block, one longer than a tile."""
    import torch

    assert E >= 4
    sizes = [0, 37, 300]
    rest = R - sum(sizes)
    cuts = torch.sort(torch.randint(0, rest + 1, (E - 4,), generator=gen)).values.tolist()
    parts = [b - a for a, b in zip([0] + cuts, cuts + [rest])]
    sizes = sizes + parts
    off = [0]
    for s in sizes:
        off.append(off[-1] + s)
    return torch.tensor(off, dtype=torch.int64)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy,split,shape", [("barrier", "rows", (512, 128, 192, 6)),
                                                  ("dataflow", "cols", (512, 128, 192, 6)),
                                                  ("barrier", "rows", (1024, 256, 512, 8))])
def test_ragged_products_match_fp64_and_weight_gradients_repeat_bit_for_bit(strategy, split, shape, tmp_path):
    """The third shape takes the wide bodies (128 x 256 sub-tiles: ragged_mm N = 512, grad_x N = 256)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from latch_codegen_h100.runtime import Program

    R, d, h, E = shape
    build(_doc(R, d, h, E, strategy=strategy, split=split), tmp_path / "b")
    prog = Program.load(tmp_path / "b")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(R, d, generator=gen).bfloat16()
    w = torch.randn(E, d, h, generator=gen).bfloat16()
    gr = torch.randn(R, h, generator=gen).bfloat16()
    off = _routing(R, E, gen)
    batch = {"x": x.cuda(), "w": w.cuda(), "off": off.cuda(), "g": gr.cuda()}
    outs = prog.run_program("update", batch=batch)
    again = prog.run_program("update", batch=batch)
    xd, wd, gd = x.double(), w.double(), gr.double()
    y = torch.zeros(R, h, dtype=torch.float64)
    dx = torch.zeros(R, d, dtype=torch.float64)
    dw = torch.zeros(E, d, h, dtype=torch.float64)
    for e in range(E):
        lo, hi = int(off[e]), int(off[e + 1])
        y[lo:hi] = xd[lo:hi] @ wd[e]
        dx[lo:hi] = gd[lo:hi] @ wd[e].T
        dw[e] = xd[lo:hi].T @ gd[lo:hi]
    for name, ref in (("y", y), ("dx", dx), ("dw", dw)):
        got = outs[name].double().cpu()
        err = ((got - ref).norm() / ref.norm()).item()
        assert err <= 1e-5, f"{name}: rel-L2 {err:.3g} against FP64 (FP32 accumulation of BF16 operands)"
    assert torch.all(outs["dw"][0] == 0), "an expert without rows has a zero gradient"
    for name in ("y", "dx", "dw"):
        assert torch.equal(outs[name], again[name]), f"{name} differs between two runs"


def _routing_doc(N=2048, E=16, k=2, strategy="barrier", tiles=3):
    values = [Value("probs", (N, E), F, "batch"), Value("vals", (N, k), F), Value("idx", (N, k), "i64"),
              Value("ids", (N, k), "i64", "batch"), Value("token", (N * k,), "i64"), Value("pos", (N * k,), "i64"),
              Value("offsets", (E + 1,), "i64")]
    nodes = [("topk", "latch::token_topk", ("probs",), ("vals", "idx"), {"k": k}),
             ("order", "latch::route_order", ("ids",), ("token", "pos", "offsets"), {"num_experts": E})]
    g = H.graph("update", values, nodes, [("batch", ["probs", "ids"])],
                [("metrics", ["vals", "idx", "token", "pos", "offsets"])])
    return H.planned([g], strategy=strategy, tiles=tiles)


@needs_tools
def test_routing_bodies_compile(tmp_path, cache):
    doc = build(_routing_doc(), tmp_path / "r", jobs=2)
    assert dict(doc.build.stats).get("spill_stores", 0) == 0


@pytest.mark.gpu
def test_routing_bodies_match_their_references_exactly(tmp_path):
    """token_topk with ties (to the lower expert) in row tiles; route_order on skewed routing
    (an expert nobody picks) at TinyMoE's 2 x 1024 tokens."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from latch_codegen_h100.runtime import Program
    from latch_ops.moe.reference import route_order_math, token_topk_math

    N, E, k = 2048, 16, 2
    build(_routing_doc(N, E, k), tmp_path / "r")
    prog = Program.load(tmp_path / "r")
    gen = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(N, E, generator=gen), -1)
    probs[::7, 3] = probs[::7, 5]  # ties
    probs[::11] = 1.0 / E  # a whole row tied
    ids = torch.multinomial(torch.tensor([4.0] + [1.0] * (E - 2) + [0.0]), N * k, replacement=True,
                            generator=gen).view(N, k)
    outs = prog.run_program("update", batch={"probs": probs.cuda(), "ids": ids.cuda()})
    v, i = token_topk_math(probs, k)
    assert torch.equal(outs["idx"].cpu(), i) and torch.equal(outs["vals"].cpu(), v)
    token, pos, off = route_order_math(ids, E)
    assert torch.equal(outs["offsets"].cpu(), off)
    assert torch.equal(outs["token"].cpu(), token) and torch.equal(outs["pos"].cpu(), pos)


def _split_doc(N=2048, E=16, k=2, num_sms=8):
    """route_order split over chunks of pairs (latch_ops.moe.route_split), scheduled by the real
    scheduler (the chunk granules of route_place and route_rows are its to keep)."""
    from latch_core.document import Document
    from latch_core.passes import run_pass
    from latch_core.plugins import registries
    from latch_core.ir import GraphSection
    from latch_ops.moe import route_split as rs

    P = N * k
    chunk = rs.plan_chunks(P, E)
    C = -(-P // chunk)
    a = {"num_experts": E, "chunk": chunk}
    values = [Value("ids", (N, k), "i64", "batch"), Value("counts", (C, E), "i32"), Value("token", (P,), "i64"),
              Value("pos", (P,), "i64"), Value("pairs", (P,), "i64"), Value("offsets", (E + 1,), "i64")]
    nodes = [("count", rs.ROUTE_COUNT, ("ids",), ("counts",), dict(a)),
             ("place", rs.ROUTE_PLACE, ("ids", "counts"), ("pos",), dict(a)),
             ("rows", rs.ROUTE_ROWS, ("ids", "counts"), ("token", "pairs"), dict(a)),
             ("offs", rs.ROUTE_OFFSETS, ("counts",), ("offsets",), {"num_experts": E})]
    g = H.graph("update", values, nodes, [("batch", ["ids"])], [("metrics", ["counts", "token", "pos", "pairs", "offsets"])])
    passes = registries().passes
    doc = run_pass(passes.get("schedule"), Document(graph=GraphSection([g], (), {})), num_sms=num_sms)
    return run_pass(passes.get("memory.plan"), doc), C


@needs_tools
def test_the_split_routing_bodies_compile_and_spread_over_the_sms(tmp_path, cache):
    doc, C = _split_doc()
    sched = doc.schedule.program("update")
    groups = {grp.id: grp.nodes for grp in sched.groups}
    per = {}
    for t in sched.tasks:
        for n in groups[t.group]:
            per[n] = per.get(n, 0) + 1
    assert per["count"] == C and per["place"] == C and per["rows"] == C and per["offs"] == 1, per
    out = tmp_path / "s"
    doc = build(doc, out, jobs=2)
    assert dict(doc.build.stats).get("spill_stores", 0) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("N", [2048, 32768])
def test_the_split_routing_bodies_equal_route_order_bit_for_bit(tmp_path, N):
    """The split route_order at TinyMoE's 2 x 1024 and 32 x 1024 tokens, skewed routing (an expert
    nobody picks): the same sort as route_order, pairs its inverse, twice the same bits."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from latch_codegen_h100.runtime import Program
    from latch_ops.moe.reference import route_count_math, route_order_math

    E, k = 16, 2
    doc, _C = _split_doc(N, E, k, num_sms=132)
    build(doc, tmp_path / "s")
    prog = Program.load(tmp_path / "s")
    gen = torch.Generator().manual_seed(5)
    ids = torch.multinomial(torch.tensor([4.0] + [1.0] * (E - 2) + [0.0]), N * k, replacement=True,
                            generator=gen).view(N, k)
    outs = prog.run_program("update", batch={"ids": ids.cuda()})
    token, pos, off = route_order_math(ids, E)
    chunk = dict(doc.graph.program("update").nodes[0].attrs)["chunk"]
    assert torch.equal(outs["counts"].cpu(), route_count_math(ids, E, chunk))
    assert torch.equal(outs["offsets"].cpu(), off)
    assert torch.equal(outs["token"].cpu(), token) and torch.equal(outs["pos"].cpu(), pos)
    assert torch.equal(outs["pairs"].cpu(), torch.argsort(pos))
    again = prog.run_program("update", batch={"ids": ids.cuda()})
    assert all(torch.equal(again[n], outs[n]) for n in outs)


def _gather_sum_doc(R=4096, N=2048, k=2, D=768, dtype=F, base=False):
    from latch_ops.moe.gather_sum import GATHER_SUM

    values = [Value("src", (R, D), dtype, "batch"), Value("index", (N * k,), "i64", "batch"), Value("out", (N, D), dtype),
              Value("base", (N, D), dtype, "batch")]
    ins = ("src", "index", "base") if base else ("src", "index")
    g = H.graph("update", values if base else values[:3], [("gs", GATHER_SUM, ins, ("out",), {"k": k})],
                [("batch", list(ins))], [("metrics", ["out"])])
    return H.planned([g], tiles=4)


@needs_tools
@pytest.mark.parametrize("base", [False, True])
def test_gather_sum_keeps_every_rows_loads_in_flight(tmp_path, cache, base):
    """The MoE dispatch's gradient back to tokens (moe.fixed_order_scatters): the k rows of U groups
    (and base's, when the residual's gradient is folded in) load as 16-byte vectors before any is
    summed, without local memory."""
    from latch_codegen_h100.lower_moe import GATHER_U

    out = tmp_path / "g"
    build(_gather_sum_doc(base=base), out, jobs=2)
    r = sass_report(out / "program.so")
    assert r.local_loads == 0 and r.local_stores <= 16, r  # the kernel's own frame (test_sass.py's bound)
    assert r.ldg128 >= GATHER_U * (2 + base) and r.stg128 >= GATHER_U, r


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,D,base", [(F, 768, False), (BF, 768, False), (F, 30, False), (F, 768, True),
                                         (F, 30, True)])
def test_gather_sum_equals_the_gathered_rows_summed_in_slot_order(tmp_path, dtype, D, base):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from latch_codegen_h100.runtime import Program

    R, N, k = 4096, 2048, 2
    build(_gather_sum_doc(R, N, k, D, dtype, base), tmp_path / "g")
    prog = Program.load(tmp_path / "g")
    gen = torch.Generator().manual_seed(3)
    tdt = torch.float32 if dtype == F else torch.bfloat16
    src = torch.randn(R, D, generator=gen).to(tdt)
    index = torch.randperm(R, generator=gen)[: N * k]
    b = torch.randn(N, D, generator=gen).to(tdt)
    batch = {"src": src.cuda(), "index": index.cuda()} | ({"base": b.cuda()} if base else {})
    got = prog.run_program("update", batch=batch)["out"].cpu()
    rows = src.double()[index].view(N, k, D)
    acc = b.double() if base else torch.zeros(N, D, dtype=torch.float64)
    for s_ in range(k):  # from zero (or base) in slot order, rounded once
        acc = acc + rows[:, s_]
    want = acc.to(tdt)
    assert torch.equal(got, want)
