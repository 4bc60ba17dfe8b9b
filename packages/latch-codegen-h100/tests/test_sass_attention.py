"""The attention bodies' machine code: BF16 head dims 64 and 128 run on the tensor cores
(HMMA.16816.F32.BF16, cp.async staging: LDGSTS), so do FP32 values under operand_dtype bf16 (the
policy's attention in captured models), the f64 bodies are SIMT (no HMMA); the head-dim-64
bodies and both forwards hold everything in registers (no spills)."""

from __future__ import annotations

import re

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100.sass import _run


needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")


def _attention_doc(dtype: str, d: int, operand: str | None = None):
    """sdpa then sdpa_backward (grouped-query 4:2, 77 rows: not a multiple of the tiles), causal."""
    stat = "f32" if dtype in ("bf16", "f32") else dtype
    B, H_, Hkv, T = 1, 4, 2, 77
    q, kv = (B, H_, T, d), (B, Hkv, T, d)
    values = [Value("q", q, dtype, "batch"), Value("k", kv, dtype, "batch"), Value("v", kv, dtype, "batch"),
              Value("go", q, dtype, "batch"), Value("o", q, dtype), Value("lse", q[:3], stat),
              Value("dq", q, dtype), Value("dk", kv, dtype), Value("dv", kv, dtype)]
    a = {"causal": True, "scale": d ** -0.5}
    if operand:
        a["operand_dtype"] = operand
    nodes = [("fwd", "latch::sdpa", ("q", "k", "v"), ("o", "lse"), a),
             ("bwd", "latch::sdpa_backward", ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"), a)]
    g = H.graph("update", values, nodes, [("batch", ["q", "k", "v", "go"])], [("metrics", ["o", "dq", "dk", "dv"])])
    return H.planned([g], tiles=1, num_sms=1)


@needs_tools
@pytest.mark.parametrize("d", [64, 128])
def test_bf16_attention_runs_on_the_tensor_cores(tmp_path, cache, d):
    counts = {}
    for dtype in ("bf16", "f64"):
        out = tmp_path / dtype
        build(_attention_doc(dtype, d), out, jobs=2)
        sass = _run([H.cuobjdump(), "-sass", str(out / "program.so")])
        counts[dtype] = (len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)), len(re.findall(r"\bLDGSTS\b", sass)))
        if dtype == "bf16":
            log = (out / "build.log").read_text()
            spills = [int(s) for s in re.findall(r"Function properties for _Z\d+latch_body\w+\s*\n\s*\d+ bytes stack "
                                                 r"frame, (\d+) bytes spill stores", log)]
            assert len(spills) == 2, log
            # head dim 64: none; 128: the backward's dq half keeps ~50 bytes on the stack (forward: none)
            assert (max(spills) == 0) if d == 64 else (min(spills) == 0 and max(spills) <= 64), spills
    hmma, ldgsts = counts["bf16"]
    assert hmma >= 2 * (d // 16) and ldgsts > 0, counts
    assert counts["f64"][0] == 0, counts


@needs_tools
def test_fp32_values_under_the_bf16_policy_run_on_the_tensor_cores(tmp_path, cache):
    build(_attention_doc("f32", 64, operand="bf16"), tmp_path / "p", jobs=2)
    sass = _run([H.cuobjdump(), "-sass", str(tmp_path / "p" / "program.so")])
    assert len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)) >= 8
    build(_attention_doc("f32", 64), tmp_path / "n", jobs=2)  # FP32 attention without the policy: SIMT
    sass = _run([H.cuobjdump(), "-sass", str(tmp_path / "n" / "program.so")])
    assert not re.findall(r"\bHMMA\b", sass)
