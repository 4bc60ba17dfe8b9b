"""The machine code of the LM head's cross-entropy bodies (latch_xent.cuh) at the TinyMoE-200M head
(2048 x 49152): 16-byte global loads and stores (LDG.E.128 / STG.E.128, not the generic LD.E.128
the Ctx pointers compile to in plain C++), 8 in flight per thread and bulk L2 prefetches of the next
iterations, no local memory, no
64-bit division on the backward's address path, and no per-element selects in the backward's chunk (run 26's body called the udiv64 subroutine once per
8 elements: 531 us per task against a 126 us model; results/ce.md). Needs nvcc and cuobjdump."""

from __future__ import annotations

import re

import pytest

import h100_handmade as H
from latch_codegen_h100 import build
from latch_codegen_h100.sass import _run, find_cuobjdump, sass_report

needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")

N, V = 2048, 49152


def _head_doc(logits: str, out: str):
    f = "f32"
    values = [("x", (N, V), logits, "batch"), ("t", (N,), "i64", "batch"), ("g", (), f, "batch"),
              ("tot", (), f, "batch"), ("nll", (N,), f), ("lse", (N,), f), ("valid", (N,), f), ("dx", (N, V), out)]
    nodes = [("fwd", "latch::cross_entropy", ("x", "t"), ("nll", "lse", "valid"), {"ignore_index": -100}),
             ("bwd", "latch::cross_entropy_backward", ("g", "x", "t", "lse", "tot"), ("dx",),
              {"ignore_index": -100, "reduction": "mean", "out_dtype": out})]
    g = H.graph("update", values, nodes, [("batch", ["x", "t", "g", "tot"])], [("metrics", ["nll", "valid", "dx"])])
    return H.planned([g], num_sms=132, tiles=128)  # 16-row tiles, as the scheduler gives g209


def _calls(so) -> int:
    text = _run([find_cuobjdump(), "-sass", str(so)])
    return len(re.findall(r"\bCALL\.REL\b", text))


# (logits, dlogits) -> (16-byte loads, 16-byte stores) at least: 8 words in flight per thread in the
# forward (8 chunks of 8 BF16, 4 of 8 FP32) and a tail chunk; the backward's 8 chunks of BF16, 3 of
# FP32 (6 words); a chunk's BF16 dlogits one store, FP32 two.
CASES = {("bf16", "bf16"): (17, 8), ("f32", "bf16"): (16, 3), ("f32", "f32"): (16, 6)}


@needs_tools
@pytest.mark.parametrize("logits,out", list(CASES))
def test_xent_bodies_move_16_bytes_per_access_without_spills_or_divisions(tmp_path, cache, logits, out):
    b = tmp_path / "b"
    doc = build(_head_doc(logits, out), b, jobs=2)
    stats = dict(doc.build.stats)
    assert stats.get("spill_stores", 0) == 0 and stats.get("spill_loads", 0) == 0, stats
    r = sass_report(b / "program.so")
    loads, stores = CASES[(logits, out)]
    assert r.ldg128 >= loads and r.stg128 >= stores, r
    text = _run([find_cuobjdump(), "-sass", str(b / "program.so")])
    assert not re.search(r"\bLD\.E\.128\b|\bST\.E\.128\b", text), "generic 16-byte accesses: the asm paths are gone"
    # the L2 prefetches of the next iterations (cp.async.bulk.prefetch.L2): the forward's, the backward's
    assert len(re.findall(r"\bUBLKPF\.L2\b", text)) >= 2, "no bulk L2 prefetch"
    # no local memory beyond the out-of-line bodies' call context (as test_sass's products)
    assert r.local_loads == 0 and r.local_stores <= 16, r
    # two body calls, the scale's float-division slow path and the backward's rows-per-pass division
    # (once a tile, where a row has fewer chunks than threads); run 26's backward added five calls of
    # the 64-bit division subroutine
    assert _calls(b / "program.so") <= 4
    if (logits, out) == ("bf16", "bf16"):
        # the backward's chunk of 8 between two of its 16-byte stores: unpack, FFMA + MUFU.EX2, FMUL,
        # pack, the address, and the rare branch of the chunk holding the target. Run 29's body spent
        # 142 instructions there (per-element one-hot and ignore selects, a per-chunk row cursor,
        # 64-bit target arithmetic: 287 us a task, issue-bound); this one 78.
        ins = [ln for ln in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
        at = [i for i, ln in enumerate(ins) if "STG.E.128" in ln]
        gaps = [b2 - a for a, b2 in zip(at, at[1:])]
        assert len(gaps) >= 7 and max(sorted(gaps)[:7]) <= 100, gaps
