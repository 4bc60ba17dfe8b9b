"""Which body the LM head's cross-entropy backward lowers to (lower_xent.ring_taken, results/xb.md):
the ring body (a TMA producer half) for 16-bit logits with V a multiple of 8 and at least a box
long, the register body for everything else; and the ring's tensor map (rows as pieces of W)."""

from __future__ import annotations

import pytest

from latch_codegen_h100 import lower_xent as X
from latch_codegen_h100.lowering import BodyContext, Operand


def _ctx(logits="bf16", out="bf16", N=2048, V=49152, present=True):
    f = lambda shape, dt="f32": Operand("p", shape, dt)  # noqa: E731
    ins = (f(()), Operand("x", (N, V), logits), Operand("t", (N,), "i64"), f((N,)), f(()))
    return BodyContext("latch::cross_entropy_backward", {"ignore_index": -100, "reduction": "mean"}, ins,
                       (Operand("dx", (N, V), out, present),))


@pytest.mark.parametrize("logits,out,V,ring", [
    ("bf16", "bf16", 49152, True), ("f16", "f16", 49152, True), ("bf16", "f32", 49152, True),
    ("bf16", "bf16", 8200, True),   # V = 8 x 1025: W = 8, the smallest row piece
    ("f32", "bf16", 49152, False),  # FP32 logits: the register body
    ("f32", "f32", 49152, False), ("f64", "f64", 49152, False),
    ("bf16", "bf16", 49153, False),  # odd V: the scalar path
    ("bf16", "bf16", 49148, False),  # V a multiple of 4, not 8
    ("bf16", "bf16", 4096, False),   # a row shorter than a box
])
def test_ring_rule(logits, out, V, ring):
    ctx = _ctx(logits, out, V=V)
    assert X.ring_taken(ctx) is ring
    low = {l.op: l for l in X.lowerings()}["latch::cross_entropy_backward"]
    body = low.body(ctx)
    assert ("cross_entropy_grad_ring" in body) is ring and ("cross_entropy_grad_tile" in body) is not ring
    assert (low.producer(ctx) is None) is not ring and (low.tensor_maps(ctx) is None) is not ring


def test_ring_off_switch(monkeypatch):
    monkeypatch.setattr(X, "RING", False)
    assert not X.ring_taken(_ctx())


@pytest.mark.parametrize("V,W,boxk", [(49152, 256, 32), (8200, 8, 256), (8208, 16, 256), (50304, 128, 64)])
def test_ring_map_views_a_row_as_pieces(V, W, boxk):
    assert X.ring_geometry(V) == (W, boxk)
    (m,) = X._backward_maps(_ctx(V=V, N=37))
    assert m.operand == 1 and m.dims == (W, V // W, 37) and m.box == (W, boxk, 1) and m.swizzle == 0
    assert W * boxk <= V and V % W == 0 and 2 * W % 16 == 0  # a box within a row, 16-byte row pieces
    assert X._backward_stage_bytes(_ctx(V=V)) == 16384
