"""The gathers' row path and scalar loop on the GPU (issue 12/11, lower_indexing.py) against FP64.

A gather is a copy: every output element must equal its source element exactly (FP64 reference of
the FP32/BF16 inputs; BF16 from FP32 is the round-to-nearest of the FP64 value). Covers the row path
(bf16 and f32 rows of 768, the reshape+index_select alias prefix, the embedding), the scalar loop
(index_select along the last dim, an embedding four wide, tiles splitting a dim after dim + 1),
ragged tiles (100 rows in 3 tiles), odd widths (771: BF16 rows start misaligned every other row, a
3-element tail), column tiles starting at odd columns (the run's start misaligned: the scalar copy
inside the row path), a converting gather (FP32 rows, BF16 out), and an index out of range reported
with its task."""

from __future__ import annotations

import pytest
import torch

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100.runtime import LaunchError, Program

import test_gather_rows as R

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _inputs(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bounds = {"idx": g.value("xf").shape[0], "tok": g.value("w").shape[0], "tok4": g.value("w4").shape[0],
              "i3": 5, "i0": g.value("x3").shape[0]}
    params, batch = {}, {}
    for v in g.values:
        if v.role not in ("param", "batch"):
            continue
        if v.name in bounds:
            t = torch.randint(0, bounds[v.name], v.shape, generator=gen)
        else:
            t = torch.randn(v.shape, generator=gen, dtype=torch.float64)
            t = t.to(torch.bfloat16 if v.dtype == "bf16" else torch.float32)
        (params if v.role == "param" else batch)[v.name] = t
    return params, batch


def _reference(ins):
    d = {k: (t.double() if t.is_floating_point() else t) for k, t in ins.items()}
    rows = d["x2"].reshape(-1, d["x2"].shape[-1])
    return {"yb": d["xb"].index_select(0, d["idx"]), "yf": d["xf"].index_select(0, d["idx"]),
            "y2": rows.index_select(0, d["idx"]), "e": d["w"][d["tok"]], "e4": d["w4"][d["tok4"]],
            "y3": d["x3"].index_select(1, d["i3"]), "y30": d["x3"].index_select(0, d["i0"]),
            "ylast": d["x3"].index_select(2, d["i3"])}


@pytest.mark.parametrize("width,n,split", [(768, 96, "rows"), (768, 100, "rows"), (771, 100, "rows"),
                                           (771, 96, "cols")])
def test_gathers_copy_exactly(width, n, split, tmp_path):
    doc = R.gather_doc(tiles=3, split=split, width=width, n=n)
    g = doc.graph.programs[0]
    build(doc, tmp_path)
    prog = Program.load(tmp_path)
    params, batch = _inputs(g)
    outs = prog.run_program("update", params={k: v.cuda() for k, v in params.items()},
                            batch={k: v.cuda() for k, v in batch.items()})
    ref = _reference({**params, **batch})
    bad = [f"{k}: {int((outs[k].double().cpu() != r).sum())} of {r.numel()} elements differ"
           for k, r in ref.items() if not torch.equal(outs[k].double().cpu(), r)]
    assert not bad, "\n".join(bad)


def test_a_converting_gather_rounds_to_bf16(tmp_path):
    doc = R._converting_doc()
    build(doc, tmp_path)
    prog = Program.load(tmp_path)
    x = torch.randn(64, 768, dtype=torch.float64).float()
    idx = torch.randint(0, 64, (96,))
    out = prog.run_program("update", batch={"x": x.cuda(), "idx": idx.cuda()})["y"]
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.cpu(), x.double().index_select(0, idx).to(torch.bfloat16))


def _one(op, xshape, n, dim=0):
    if op == "latch::embedding":
        v = [Value("x", xshape, "f32", "param"), Value("idx", (n,), "i64", "batch"), Value("y", (n, xshape[1]), "f32")]
        node = ("gather", op, ("x", "idx"), ("y",))
    else:
        v = [Value("x", xshape, "f32", "param"), Value("idx", (n,), "i64", "batch"), Value("y", (n, xshape[1]), "f32")]
        node = ("gather", op, ("x", "idx"), ("y",), {"dim": dim})
    g = H.graph("update", v, [node], [("params", ["x"]), ("batch", ["idx"])], [("metrics", ["y"])])
    return g, H.planned([g], [g.value("x")])


@pytest.mark.parametrize("op", ["latch::embedding", "latch::index_select"])
def test_the_row_path_reports_an_index_out_of_range_with_its_task(op, tmp_path):
    g, doc = _one(op, (11, 64), 5)
    build(doc, tmp_path)
    prog = Program.load(tmp_path)
    x = torch.randn(11, 64, device="cuda")
    out = prog.run({"x": x}, {}, {"idx": torch.tensor([0, 3, 10, 2, 1], device="cuda")})
    assert torch.equal(out["y"], x[[0, 3, 10, 2, 1]])
    with pytest.raises(LaunchError, match=rf"task \d+ \(node gather, op {op}\) read index 99, outside \[0, 11\)"):
        prog.run({"x": x}, {}, {"idx": torch.tensor([0, 99, 1, 2, 3], device="cuda")})


def _in_order_fp32(g, tok, V, pad, base=None):
    """dW as the body must compute it: zeros (or base's rows), then grad row k added into row tok[k] in
    index order, each add rounded to FP32 (the FP64 sum is the gate; this is the exact-bits check)."""
    gf, tf = g.reshape(-1, g.shape[-1]).float(), tok.reshape(-1)
    out = torch.zeros(V, g.shape[-1], dtype=torch.float32) if base is None else base.float().clone()
    for k in range(tf.numel()):
        t = int(tf[k])
        if t != pad:
            out[t] = out[t] + gf[k]
    return out


@pytest.mark.parametrize("split", ["rows", "cols"])
def test_the_embedding_backward_sums_in_index_order_with_the_same_bits_every_run(split, tmp_path):
    doc = R.emb_backward_doc(split=split)
    build(doc, tmp_path)
    prog = Program.load(tmp_path)
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(2, 700, 64, generator=gen, dtype=torch.float64).float()
    tok = torch.randint(0, 40, (2, 700), generator=gen)
    runs = [prog.run_program("update", batch={"g": g.cuda(), "tok": tok.cuda()})["dw"].cpu() for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], _in_order_fp32(g, tok, 40, 3))
    keep = (tok != 3).reshape(-1)
    ref = torch.zeros(40, 64, dtype=torch.float64).index_add_(0, tok.reshape(-1)[keep],
                                                               g.double().reshape(-1, 64)[keep])
    assert ((runs[0].double() - ref).norm() / ref.norm()).item() < 1e-6


@pytest.mark.parametrize("split", ["rows", "cols"])
def test_the_embedding_backward_onto_a_base_sums_in_index_order_with_the_same_bits_every_run(split, tmp_path):
    """ops.embedding_grad_sum's form: dW = base + the hits, in index order (the padding row keeps base's)."""
    build(R.emb_backward_doc(split=split, base=True), tmp_path)
    prog = Program.load(tmp_path)
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(2, 700, 64, generator=gen, dtype=torch.float64).float()
    tok = torch.randint(0, 40, (2, 700), generator=gen)
    G = torch.randn(40, 64, generator=gen, dtype=torch.float64).float()
    batch = {"g": g.cuda(), "tok": tok.cuda(), "G": G.cuda()}
    runs = [prog.run_program("update", batch=batch)["dw"].cpu() for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], _in_order_fp32(g, tok, 40, 3, base=G))
    assert torch.equal(runs[0][3], G[3])


def test_the_embedding_backward_reports_an_index_out_of_range(tmp_path):
    build(R.emb_backward_doc(), tmp_path)
    prog = Program.load(tmp_path)
    tok = torch.randint(0, 40, (2, 700))
    tok[1, 5] = 40
    with pytest.raises(LaunchError, match=r"op latch::embedding_backward\) read index 40, outside \[0, 40\)"):
        prog.run_program("update", batch={"g": torch.randn(2, 700, 64, device="cuda"), "tok": tok.cuda()})
