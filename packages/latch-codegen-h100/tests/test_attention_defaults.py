"""The attention forward's default body is chosen for the whole kernel (lower_attention.kernel_defaults):
beside a wgmma backward a head-dim-128 forward takes mma.sync, since ptxas serialised every wgmma of a
model's kernel that inlined both wgmma attention bodies (C7511; results/lead7.md); head dim 64 keeps
the wgmma forward, whose per-block P V accumulator avoids it (results/sa.md). Explicit choices stay."""

from __future__ import annotations

import pytest

import h100_handmade as H
from latch_core.document import Document
from latch_core.ir import GraphSection, Value
from latch_codegen_h100.lower_attention import kernel_defaults

Q = (1, 2, 128, 64)


def _doc(dtype="bf16", fwd_body=None, bwd_body=None, backward=True, head=64) -> Document:
    q = Q[:3] + (head,)
    f = "f32"
    values = [Value("q", q, dtype, "batch"), Value("k", q, dtype, "batch"), Value("v", q, dtype, "batch"),
              Value("o", q, dtype), Value("lse", q[:3], f if dtype == "bf16" else dtype), Value("go", q, dtype, "batch"),
              Value("dq", q, dtype), Value("dk", q, dtype), Value("dv", q, dtype)]
    att = {"causal": True, "scale": 0.125}
    nodes = [("att", "latch::sdpa", ("q", "k", "v"), ("o", "lse"),
              dict(att, **({"attention_body": fwd_body} if fwd_body else {})))]
    outs = ["o", "lse"]
    if backward:
        nodes.append(("attb", "latch::sdpa_backward", ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"),
                      dict(att, **({"attention_body": bwd_body} if bwd_body else {}))))
        outs += ["dq", "dk", "dv"]
    else:
        values = values[:5]
    ins = ["q", "k", "v"] + (["go"] if backward else [])
    g = H.graph("update", values, nodes, [("batch", ins)], [("metrics", outs)])
    return Document(graph=GraphSection([g]))


def _body(doc, name):
    return next(n for n in doc.graph.programs[0].nodes if n.name == name).attr("attention_body")


def test_a_default_head_dim_128_forward_beside_a_wgmma_backward_takes_mma():
    doc = kernel_defaults(_doc(head=128))
    assert _body(doc, "att") == "mma" and _body(doc, "attb") is None  # the backward keeps its default (wgmma)


def test_a_default_head_dim_64_forward_beside_a_wgmma_backward_keeps_wgmma():
    """TinyMoE-200M's attention (head dim 64): run 32 ran its forward on mma.sync at 39.3 us a task."""
    from latch_codegen_h100.lower_attention import wgmma_forward
    from latch_codegen_h100.lowering import BodyContext, Operand

    doc = _doc()
    assert kernel_defaults(doc) is doc and _body(doc, "att") is None
    q = Operand("q", Q, "bf16")
    assert wgmma_forward(BodyContext("latch::sdpa", {"causal": True, "scale": 0.125}, (q, q, q), (q, q)))


@pytest.mark.parametrize("kw", [dict(backward=False), dict(bwd_body="mma"), dict(bwd_body="simt"), dict(dtype="f32"),
                                dict(head=32)])
def test_the_forward_keeps_its_default_where_no_wgmma_backward_runs(kw):
    doc = _doc(**kw)
    assert kernel_defaults(doc) is doc and _body(kernel_defaults(doc), "att") is None


def test_an_explicit_forward_choice_is_kept():
    assert _body(kernel_defaults(_doc(fwd_body="wgmma")), "att") == "wgmma"
    assert _body(kernel_defaults(_doc(fwd_body="simt")), "att") == "simt"
