"""The ping-pong matmul configuration (``wgmma_pp_128x<W>x64``, latch_gemm_pingpong.cuh): what the
lowering generates for it, what it refuses, and the machine code of its bodies in the three layouts
of a training step (forward, input gradient, weight gradient) with a BF16 (TMA-store) and an FP32
output: tensor-core products issued back to back, TMA loads and stores, no local memory."""

from __future__ import annotations

import re

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100.codegen import generate
from latch_codegen_h100.bodies import CodegenError
from latch_codegen_h100.sass import _run, find_cuobjdump, sass_report

F, BF = "f32", "bf16"
needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")


def _doc(cfg="wgmma_pp_128x512x64", tiles=2):
    values = [Value("x", (256, 128), BF, "batch"), Value("w", (640, 128), BF, "batch"),
              Value("g", (256, 640), BF, "batch"), Value("y", (256, 640), BF), Value("y32", (256, 640), F),
              Value("dx", (256, 128), BF), Value("dw", (640, 128), F)]
    a = {"operand_dtype": BF, "accum_dtype": "f32", "config": cfg}
    nodes = [("fwd", "latch::matmul", ("x", "w"), ("y",), dict(a, trans_b=True)),
             ("fwd32", "latch::matmul", ("x", "w"), ("y32",), dict(a, trans_b=True, out_dtype=F)),
             ("dgrad", "latch::matmul", ("g", "w"), ("dx",), dict(a)),
             ("wgrad", "latch::matmul", ("g", "x"), ("dw",), dict(a, trans_a=True, out_dtype=F))]
    g = H.graph("update", values, nodes, [("batch", ["x", "w", "g"])], [("out", ["y", "y32", "dx", "dw"])])
    return H.planned([g], tiles=tiles)


def test_the_pingpong_config_generates_the_pingpong_body_over_128_wide_subtiles():
    gen = generate(_doc(), jobs=1)
    src = "\n".join(u.source for u in gen.units[1:])
    assert src.count("latch::gemm_pp_consume<__nv_bfloat16, false, true>(p, epi") == 2  # fwd, fwd32
    assert src.count("latch::gemm_pp_consume<__nv_bfloat16, false, false>(p, epi") == 1  # dgrad: b [K, N]
    assert src.count("latch::gemm_pp_consume<__nv_bfloat16, true, false>(p, epi") == 1  # wgrad: a [K, M]
    assert "gemm_consume<" not in src
    # the producer half is the cooperative body's over 128 x 128 sub-tiles
    assert src.count("latch::gemm_produce<128, 128, false, true>(p,") == 2
    # the epilogues: TMA stores for the BF16 and the FP32 outputs (128 columns are whole boxes)
    assert src.count("latch::GemmStoreTma<__nv_bfloat16, 2> epi{") == 2
    assert src.count("latch::GemmStoreTma<float, 2> epi{") == 2
    # one stage holds A 128 x 64 and B 128 x 64; b's boxes are 128 rows of K
    assert gen.manifest["ring"]["stage_bytes"] == 32768
    tm = gen.manifest["programs"]["update"]["tmaps"]
    assert {"value": "w", "dims": [128, 640], "box": [64, 128]} in [{k: t[k] for k in ("value", "dims", "box")} for t in tm]


@pytest.mark.parametrize("cfg", ["wgmma_pp_128x200x64", "wgmma_pp_64x512x64", "wgmma_pp_128x512x32", "wgmma_pp_x"])
def test_a_pingpong_name_the_body_cannot_run_is_refused_by_name(cfg):
    with pytest.raises(CodegenError) as e:
        generate(_doc(cfg), jobs=1)
    assert cfg in str(e.value) and "ping-pong" in str(e.value) and "multiple of 128" in str(e.value)


@needs_tools
def test_pingpong_bodies_are_hgmma_fed_by_tma_without_spills_or_serialisation(tmp_path, cache):
    out = tmp_path / "b"
    doc = build(_doc(), out, jobs=2)
    stats = dict(doc.build.stats)
    # ptxas C7510/C7511/C7518 (wgmma serialised) would be recorded as wgmma_warnings
    assert stats.get("spill_stores", 0) == 0 and stats.get("spill_loads", 0) == 0, stats
    assert "wgmma_warnings" not in stats, stats
    r = sass_report(out / "program.so")
    # four bodies, two K-block sites each (the first block, the loop), eight m64n128 per site
    assert r.hgmma.get("64x128x16.F32.BF16", 0) >= 4 * 2 * 8, r
    assert set(r.hgmma) == {"64x128x16.F32.BF16"}, r
    assert r.hgmma_serialized == 0, r
    assert r.utmaldg >= 4 and r.utmastg >= 4, r
    assert r.setmaxreg_alloc == (224,) and r.setmaxreg_dealloc == (56,), r
    assert r.local_loads == 0 and r.local_stores == 0, r
    # the turns: named barriers over both consumer warpgroups (0x100 threads), passed without waiting
    text = _run([find_cuobjdump(), "-sass", str(out / "program.so")])
    assert re.search(r"\bBAR\.ARV\s[^;]*0x100\s*;", text), "no bar.arrive over 256 threads"
    assert re.search(r"\bBAR\.SYNC\S*\s[^;]*0x100\s*;", text), "no bar.sync over 256 threads"
