"""The RoPE groups of the captured examples (dense transformer, TinyMoE) as planned by the default
pipeline: every group holding a concat renders the vector/ILP path for its row tiles (fuse.py,
``_IlpPuller._concat_lanes``): the forward rotations and the backward's d(qkv) assembly, each
operand read by 16-byte loads with its region's source picked once per group of four lanes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("latch_capture")

from latch_core.pipeline import Request, compile  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = {
    # head_dim 8: the halves' boundary (4) is a multiple of four lanes, as at d_model 768 (head_dim 64)
    "transformer.py": dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8),
    "tinymoe.py": dict(vocab=64, d_model=32, layers=2, heads=4, experts=4, expert_hidden=16, batch=2, seq=8),
}


@pytest.mark.parametrize("example", sorted(SMALL))
def test_every_rope_group_of_the_example_takes_the_vector_path(example):
    from latch_codegen_h100 import generate

    doc = compile(Request(example=str(EXAMPLES / example), overrides=SMALL[example], build=False, cache=False))
    gen = generate(doc, jobs=1)
    concat = [b for b in gen.manifest["bodies"] if "latch::concat" in b["ops"]]
    # the two forward rotations (q, k) and the backward assembly, at least
    assert len(concat) >= 2 and any("latch::permute" in b["ops"] and "latch::slice" in b["ops"] for b in concat)
    for b in concat:
        src = next(u.source for u in gen.units[1:] if b["key"] in u.bodies)
        body = src[src.index(b["function"]):]
        body = body[:body.index("\n}\n")]
        assert "U groups of W elements per thread" in body, b["ops"]
        ilp = body[body.index("U groups of W"):body.index("operands not aligned")]
        assert "latch::gld4(" in ilp and "latch::gst4(" in ilp and "latch::ld<" not in ilp, b["ops"]
