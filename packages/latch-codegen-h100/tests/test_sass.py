"""The machine code of a build holds what the execution model promises: tensor-core products fed by
TMA, wgmma issued back to back (not serialised), the producer/consumer register split, no local
memory. Needs nvcc and cuobjdump (the pip wheel ``nvidia-cuda-cuobjdump`` runs without a GPU)."""

from __future__ import annotations

import re

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100.sass import _run, find_cuobjdump, parse, sass_report


needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")


def _products_doc():
    """The three layouts of a training step's products (forward: b stored [N, K]; input gradient;
    weight gradient: a stored [K, M]) on BF16 operands, plus an elementwise op (an out-of-line body)."""
    bf, f = "bf16", "f32"
    values = [Value("x", (256, 128), bf, "batch"), Value("w", (192, 128), bf, "batch"),
              Value("g", (256, 192), bf, "batch"), Value("y", (256, 192), f), Value("dx", (256, 128), bf),
              Value("dw", (192, 128), f), Value("z", (256, 192), f)]
    nodes = [("fwd", "latch::matmul", ("x", "w"), ("y",), {"trans_b": True, "out_dtype": f}),
             ("dgrad", "latch::matmul", ("g", "w"), ("dx",), {}),
             ("wgrad", "latch::matmul", ("g", "x"), ("dw",), {"trans_a": True, "out_dtype": f}),
             ("act", "latch::relu", ("y",), ("z",))]
    g = H.graph("update", values, nodes, [("batch", ["x", "w", "g"])], [("metrics", ["dx", "dw", "z"])])
    return H.planned([g])


@needs_tools
def test_products_run_on_tensor_cores_fed_by_tma_with_the_register_split(tmp_path, cache):
    out = tmp_path / "b"
    doc = build(_products_doc(), out, jobs=2)
    stats = dict(doc.build.stats)
    assert stats.get("spill_stores", 0) == 0 and "wgmma_warnings" not in stats, stats
    r = sass_report(out / "program.so")
    assert sum(r.hgmma.values()) >= 3 * 8, r  # three product bodies, two K-block sites of four each
    assert any(k.startswith("64x128x16.F32.BF16") for k in r.hgmma), r
    assert r.hgmma_serialized == 0, r
    assert r.utmaldg >= 3, r
    # every product's epilogue goes through shared memory and TMA stores (two 8-row boxes per
    # 128-byte column block of each warp's rows)
    assert r.utmastg >= 3, r
    assert r.setmaxreg_alloc == (224,) and r.setmaxreg_dealloc == (56,), r
    # no spills; the only local stores are the context an out-of-line body (relu) is called with
    assert r.local_loads == 0 and r.local_stores <= 16, r
    # the worker's queue hand-off (results/rq.md): named barriers over both roles, the 256 consumers
    # and the producer warp (0x120 threads), arrived at without waiting by the side that hands a
    # slot over and synchronised on by the side that waits for it
    text = _run([find_cuobjdump(), "-sass", str(out / "program.so")])
    assert re.search(r"\bBAR\.ARV\s[^;]*0x120\s*;", text), "no bar.arrive over 288 threads"
    assert re.search(r"\bBAR\.SYNC\S*\s[^;]*0x120\s*;", text), "no bar.sync over 288 threads"


def test_the_report_counts_serialised_wgmma():
    # two marked HGMMAs in a row (each followed by a full wait) are serialised; a group of four
    # with one mark at its end is not
    pipelined = "\n".join(f"        /*{i:04x}*/  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24{', gsb0' if i % 4 == 3 else ''} ;"
                          for i in range(8))
    serial = "\n".join(f"        /*{2 * i:04x}*/  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24, gsb0 ;\n"
                       f"        /*{2 * i + 1:04x}*/  WARPGROUP.DEPBAR.LE gsb0, 0x0 ;" for i in range(4))
    assert parse(pipelined, "").hgmma_serialized == 0
    assert parse(serial, "").hgmma_serialized == 3
    assert parse(pipelined, "").hgmma == {"64x128x16.F32.BF16": 8}
