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


def _head_doc(logits: str, out: str, v: int = V):
    f = "f32"
    values = [("x", (N, v), logits, "batch"), ("t", (N,), "i64", "batch"), ("g", (), f, "batch"),
              ("tot", (), f, "batch"), ("nll", (N,), f), ("lse", (N,), f), ("valid", (N,), f), ("dx", (N, v), out)]
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
    # BF16 logits take the ring body (inlined): it calls the register body out of line for the tiles
    # it cannot take, and has its own scale division slow path: one call more
    assert _calls(b / "program.so") <= (5 if logits == "bf16" else 4)
    if (logits, out) == ("bf16", "bf16"):
        # the backward's chunk of 8 between two of its 16-byte stores: unpack, FFMA + MUFU.EX2, FMUL,
        # pack, the address, and the rare branch of the chunk holding the target. Run 29's body spent
        # 142 instructions there (per-element one-hot and ignore selects, a per-chunk row cursor,
        # 64-bit target arithmetic: 287 us a task, issue-bound); this one 78.
        ins = [ln for ln in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
        at = [i for i, ln in enumerate(ins) if "STG.E.128" in ln]
        gaps = [b2 - a for a, b2 in zip(at, at[1:])]
        assert len(gaps) >= 7 and max(sorted(gaps)[:7]) <= 100, gaps


# ---- the backward's ring body (issue 11, results/xb.md) ---------------------------------------------

def _sass(b) -> str:
    return _run([find_cuobjdump(), "-sass", str(b / "program.so")])


def _ring_facts(text: str) -> dict:
    count = lambda pat: len(re.findall(pat, text))  # noqa: E731
    return {"tma3d": count(r"\bUTMALDG\.3D\b"), "bulk": count(r"\bUBLKCP\b"), "trywait": count(r"\bSYNCS\.PHASECHK"),
            "arrive": count(r"\bSYNCS\.ARRIVE"), "lds128": count(r"\bLDS\.128\b"), "ldl": count(r"\bLDL\b")}


@needs_tools
@pytest.mark.parametrize("stage,chunks", [(16384, 4), (49152, 4)])
def test_xent_backward_streams_bf16_logits_through_the_ring(tmp_path, cache, monkeypatch, stage, chunks):
    """BF16 logits, BF16 dlogits at the head: the producer's 3-D TMA loads (UTMALDG.3D) fill the ring,
    the consumers wait on the stages' full barriers (SYNCS.PHASECHK), read their chunks with LDS.128
    in rounds of 4 a thread (one round in a 16 KiB stage; three in the 48 KiB stages of TinyMoE-200M's
    kernel, whose products size the ring: the body's own request is patched up here to get that
    ring; 12 at once spilled in that kernel) and release each stage (SYNCS.ARRIVE); no local memory
    beyond the forward's call context (13 STL.64, as before)."""
    from latch_codegen_h100 import lower_xent

    monkeypatch.setattr(lower_xent, "STAGE_BYTES", stage)
    b = tmp_path / "b"
    doc = build(_head_doc("bf16", "bf16"), b, jobs=2)
    stats = dict(doc.build.stats)
    ring = dict(stats["ring"])
    assert ring["stage_bytes"] == stage and ring["stages"] >= 4, ring
    assert stats.get("spill_stores", 0) == 0 and stats.get("spill_loads", 0) == 0, stats
    r = sass_report(b / "program.so")
    assert r.local_loads == 0 and r.local_stores <= 16, r
    f = _ring_facts(_sass(b))
    assert f["tma3d"] >= 1 and f["trywait"] >= 2 and f["arrive"] >= 1, f
    # the stage's chunks (plus the queue slot's 16-byte reads, 3 of them)
    assert f["lds128"] >= chunks + 3, f
    # the register body is still there for the tiles the ring cannot take (its 16-byte loads)
    assert r.ldg128 >= 17, r


@needs_tools
@pytest.mark.parametrize("logits,out,v", [("f32", "bf16", V), ("bf16", "bf16", V + 1), ("bf16", "bf16", 4096)])
def test_xent_backward_keeps_the_register_body_where_the_ring_cannot_go(tmp_path, cache, logits, out, v):
    """FP32 logits, an odd V and a row shorter than a box keep the register body: no ring in the
    kernel, no TMA load, no mbarrier, and its 16-byte loads (the odd V: the scalar path)."""
    b = tmp_path / "b"
    d = build(_head_doc(logits, out, v), b, jobs=2)
    ring = dict(dict(d.build.stats)["ring"])
    assert ring["stages"] == 0, ring
    f = _ring_facts(_sass(b))
    assert f["tma3d"] == 0 and f["trywait"] == 0 and f["arrive"] == 0, f
