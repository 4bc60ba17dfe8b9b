"""Alias prefixes (issue 11): a group [contiguous view, matmul] is lowered as the matmul alone, its
operand at the view's storage plus the byte offset (no compiler needed)."""

from __future__ import annotations

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import generate
from latch_codegen_h100 import tables as T

F = "f32"


def _graph():
    values = [Value("w", (8, 16), F, "param"), Value("x", (2, 8, 8), F, "batch"), Value("a", (2, 8, 8), F),
              Value("s", (8, 8), F), Value("h", (8, 16), F), Value("loss", (), F)]
    nodes = [("relu", "latch::relu", ("x",), ("a",)),
             ("sel", "latch::select", ("a",), ("s",), {"dim": 0, "index": 1}),  # rows 8..15: byte 256
             ("mm", "latch::matmul", ("s", "w"), ("h",)),
             ("sum", "latch::sum", ("h",), ("loss",), {"dims": (0, 1), "keepdim": False})]
    return H.graph("update", values, nodes, [("params", ["w"]), ("batch", ["x"])], [("loss", ["loss"])])


def test_a_prefixed_matmul_reads_its_operand_at_the_offset():
    g = _graph()
    doc = H.planned([g], [g.value("w")], groups={"update": [["relu"], ["sel", "mm"], ["sum"]]}, tiles=1)
    gen = generate(doc, jobs=1)
    m = gen.manifest["programs"]["update"]
    info = m["groups"]["1"]
    assert info["ops"] == ["latch::matmul"] and info["aliases"] == {"s": ["a", 256]}
    place = {p.value: p for p in doc.memory.programs[0].placements}
    ops = [(b, off) for b, _, off in (T.OPERAND.unpack_from(gen.tables["update"].operands, i)
                                      for i in range(0, len(gen.tables["update"].operands), T.OPERAND.size))]
    # group 0: relu (x, a); group 1: matmul (s at a + 256, w, h); group 2: sum
    ext = {b["name"]: i + 1 for i, b in enumerate(gen.manifest["buffers"])}
    assert ops[2] == (0, place["a"].offset + 256)
    assert ops[3] == (ext["w"], 0)
    assert ops[4] == (0, place["h"].offset)
    assert len(gen.manifest["bodies"]) == 3  # relu, the matmul alone (no select in it), sum


def test_a_view_read_by_an_elementwise_body_is_not_stripped():
    values = [Value("x", (2, 8, 8), F, "batch"), Value("s", (8, 8), F), Value("y", (8, 8), F)]
    nodes = [("sel", "latch::select", ("x",), ("s",), {"dim": 0, "index": 1}),
             ("neg", "latch::neg", ("s",), ("y",))]
    g = H.graph("update", values, nodes, [("batch", ["x"])], [("y", ["y"])])
    doc = H.planned([g], [], groups={"update": [["sel", "neg"]]}, tiles=1)
    info = generate(doc, jobs=1).manifest["programs"]["update"]["groups"]["0"]
    assert info["ops"] == ["latch::select", "latch::neg"] and "aliases" not in info


def test_a_view_group_of_its_own_is_a_copy_not_an_address():
    """A contiguous view alone in its group, read by another group, is lowered as the copy it is
    (stripping it would leave a group with no node)."""
    g = _graph()
    doc = H.planned([g], [g.value("w")], groups={"update": [["relu"], ["sel"], ["mm"], ["sum"]]}, tiles=1)
    info = generate(doc, jobs=1).manifest["programs"]["update"]["groups"]["1"]
    assert info["ops"] == ["latch::select"] and "aliases" not in info
