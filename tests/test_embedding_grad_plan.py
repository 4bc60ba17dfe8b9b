"""ops.embedding_grad_sum through the whole pipeline on the tied transformer example: the add of the
two gradients is gone, the embedding backward reads the LM head's gradient as its base, the memory
planner writes the sum over the base's bytes (OpSpec.extra["accumulates_into"]: the body then copies
nothing), the validator proves the plan, and the arena simulator matches the FP64 interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)


@pytest.mark.parametrize("scheduler", ["barrier", "dataflow"])
def test_the_tied_gradient_is_summed_in_place_by_the_embedding_backward(scheduler):
    from latch_check.pipeline import compile_example
    from latch_check.simulator import check_example

    c = compile_example(ROOT / "examples" / "transformer.py", overrides=SMALL, scheduler=scheduler, build=False,
                        num_sms=16)
    g = c.doc.graph.programs[0]
    (eb,) = [n for n in g.nodes if n.op == "latch::embedding_backward"]
    assert len(eb.inputs) == 3 and eb.outputs == ("grad.embed.weight",)
    base = eb.inputs[2]
    producer = {o: n for n in g.nodes for o in n.outputs}[base]
    assert producer.op == "latch::matmul"  # the LM head's weight gradient
    assert not any(n.op == "latch::add" and "grad.embed.weight" in n.outputs for n in g.nodes)
    places = {p.value: p for p in c.doc.memory.programs[0].placements}
    assert places["grad.embed.weight"].offset == places[base].offset  # written over the base's bytes
    assert check_example(c.example, c.doc, steps=1).passed
