"""The machine code of the memory-bound bodies: the general fused body's vector/ILP path (views,
broadcasts, slices) and concat move 16 bytes per access (LDG.E.128 / STG.E.128) with no local
memory. Needs nvcc and cuobjdump."""

from __future__ import annotations

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100.sass import sass_report

needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")


def _views_doc():
    f = "f32"
    T, d = 256, 64
    values = [Value("x", (T, d), f, "batch"), Value("r", (T, 1), f, "batch"), Value("w", (d,), f, "batch"),
              Value("q", (T, 3 * d), f, "batch"), Value("z", (T, d), f, "batch"),
              Value("t", (T, d), f), Value("y", (T, d), f), Value("h", (T, 4, 16), f),
              Value("s", (T, d), f), Value("sz", (T, d), f), Value("cat", (T, 2 * d), f), Value("dw", (d,), f),
              Value("e", (64, 768), f, "batch"), Value("es", (64,), f), Value("qs", (T,), f)]
    nodes = [("scale", "latch::mul", ("x", "r"), ("t",)), ("scale_w", "latch::mul", ("t", "w"), ("y",)),
             ("heads", "latch::reshape", ("x",), ("h",), {"shape": (T, 4, 16)}),
             ("cols", "latch::slice", ("q",), ("s",), {"dim": 1, "start": d, "end": 2 * d, "step": 1}),
             ("cols_add", "latch::add", ("s", "z"), ("sz",)),
             ("cat", "latch::concat", ("x", "z"), ("cat",), {"dim": 1}),
             ("dw", "latch::sum", ("x",), ("dw",), {"dims": (0,), "keepdim": False}),  # the column path
             ("es", "latch::sum", ("e",), ("es",), {"dims": (1,), "keepdim": False}),  # rows of 768 in registers
             ("qs", "latch::amax", ("q",), ("qs",), {"dims": (1,), "keepdim": False})]  # four rows per warp
    g = H.graph("update", values, nodes, [("batch", ["x", "r", "w", "q", "z", "e"])],
                [("metrics", ["y", "h", "sz", "cat", "dw", "es", "qs"])])
    return H.planned([g])


@needs_tools
def test_view_and_broadcast_bodies_move_16_bytes_per_access_without_spills(tmp_path, cache):
    out = tmp_path / "b"
    doc = build(_views_doc(), out, jobs=2)
    stats = dict(doc.build.stats)
    assert stats.get("spill_stores", 0) == 0, stats
    r = sass_report(out / "program.so")
    # x*r*w: x and w by 16 bytes (r once per group of four); the reshape copy; the slice + add (q, z);
    # concat's two operands: at least one LDG.E.128 per vector operand access, and the stores
    assert r.ldg128 >= 8, r
    assert r.stg128 >= 4, r
    assert r.local_loads == 0, r
