"""bench-memory without a GPU: the document (clip + AdamW over TinyMoE-200M's shapes, the row and
elementwise bodies) schedules, plans and validates; the fused passes are what the fusion promises
(one pass per parameter for AdamW, the square inside the sum-of-squares partials); every program
simulates to the FP64 reference; the benchmark's own FP64 step is the graph's formula."""

from __future__ import annotations

import math
import re

import pytest
import torch

from latch_check import bench_memory as bm
from latch_check import reference
from latch_check.simulator import simulate

SMALL = [("embed.weight", (64, 32)), ("n.weight", (32,)), ("w1", (4, 32, 16)), ("router", (3, 32))]


def test_tinymoe_shapes_are_the_examples_207_7m_parameters():
    shapes = bm.tinymoe_shapes()
    assert sum(math.prod(s) for _, s in shapes) == bm.TINYMOE_PARAMS == 207_729_408
    assert len(shapes) == 1 + 8 * 8 + 1


@pytest.fixture(scope="module")
def small_doc():
    return bm.plan_document(bm.memory_document(shapes=SMALL, T=48), num_sms=8)


def test_adamw_is_one_pass_per_parameter_and_the_square_is_fused_into_the_norm(small_doc):
    doc = small_doc
    g = doc.graph.program("clip_adamw")
    ps = next(p for p in doc.schedule.programs if p.program == "clip_adamw")
    nodes = {n.name: n for n in g.nodes}
    grads = {f"grad.{n}" for n, _ in SMALL}
    readers = [grp for grp in ps.groups if set(grp.inputs) & grads]
    # each gradient is read by exactly two groups: its sum-of-squares partial and its AdamW pass
    for gname in grads:
        assert sum(gname in grp.inputs for grp in readers) == 2, gname
    adam = [grp for grp in readers if any(o.startswith("new.") for o in grp.outputs)]
    assert len(adam) == len(SMALL)
    for grp in adam:
        ops = [nodes[n].op for n in grp.nodes]
        # the clip scale and AdamW with decay: the op sequence capture records for examples/_optim.py
        assert "+".join(o.split("::")[1] for o in ops) == "mul+sub+mul+add+mul+mul+mul+add+mul+sqrt+div+add+mul+div+sub"
        name = grp.outputs[-1][len("new."):]
        assert sorted(grp.outputs) == sorted([f"new.{name}", f"new.exp_avg.{name}", f"new.exp_avg_sq.{name}"])
        big = [v for v in grp.inputs if g.value(v).shape]
        assert len(big) == 4  # p, g, m, v; the rest are scalars
    norms = [grp for grp in readers if grp not in adam]
    for grp in norms:  # mul (the square) + the sum's first level, one body: the squares never reach memory
        assert [nodes[n].op for n in grp.nodes] == ["latch::mul", "latch::sum"]
        assert len(grp.outputs) == 1


def test_without_the_prologue_fusion_the_squares_would_be_materialised(small_doc):
    from latch_core.plugins import registries
    from latch_schedule.fusion import fuse

    g = small_doc.graph.program("clip_adamw")
    plans = fuse(g, registries().ops, enabled=False)
    squares = [p for p in plans if [n.op for n in p.nodes] == ["latch::mul"] and
               len(p.nodes[0].inputs) == 2 and p.nodes[0].inputs[0] == p.nodes[0].inputs[1]]
    assert len(squares) == len(SMALL)


def test_every_program_simulates_to_the_fp64_reference(small_doc):
    doc = small_doc
    gen = torch.Generator().manual_seed(0)
    for g in doc.graph.programs:
        inputs = {}
        for grp in g.inputs:
            for v in grp.values:
                val = g.value(v)
                t = torch.randn(val.shape, generator=gen, dtype=torch.float64)
                if "exp_avg_sq" in v:
                    t = t.abs()
                if v == "step":
                    t = torch.tensor(3.0, dtype=torch.float64)
                if v == "lr":
                    t = torch.tensor(bm.LR, dtype=torch.float64)
                inputs[v] = t.to(torch.float32 if val.dtype == "f32" else torch.bfloat16)
        ref = reference.run(doc, g.name, inputs)
        for seed in (0, 1):
            got = simulate(doc, g.name, inputs, seed=seed)
            for k, r in ref.items():
                d = (got[k].double() - r.double()).norm() / max(r.double().norm(), 1e-30)
                assert d <= 1e-12, (g.name, k, float(d))


def test_the_benchmarks_fp64_step_is_the_graphs_formula(small_doc):
    params, grads, state = bm.optimizer_inputs(SMALL, "cpu", seed=3, grad_scale=0.1)
    ref_p, ref_m, ref_v, norm = bm.reference_step(SMALL, params, grads, state)
    inputs = dict(params, **grads, **state, lr=torch.tensor(bm.LR))
    out = reference.run(small_doc, "clip_adamw", inputs)
    assert float(norm) > 1.0  # the clip is active: the coefficient is part of what is checked
    assert abs(float(out["metric.grad_norm"]) - float(norm)) <= 1e-12 * float(norm)
    for (n, _), p, m, v in zip(SMALL, ref_p, ref_m, ref_v):
        for got, want in ((out[f"new.{n}"], p), (out[f"new.exp_avg.{n}"], m), (out[f"new.exp_avg_sq.{n}"], v)):
            assert torch.allclose(got.double(), want, rtol=1e-10, atol=1e-14), n
    assert float(out["new.step"]) == float(state["step"]) + 1


def test_floor_bytes():
    assert bm.optimizer_floor_bytes(SMALL) == 28 * sum(math.prod(s) for _, s in SMALL)
    assert bm.optimizer_floor_bytes(bm.tinymoe_shapes()) == 28 * 207_729_408  # 5.8 GB: 1.36 ms at 4.27 TB/s
    body = next(b for b in bm.bodies(T=16) if b.name == "residual_add")
    assert body.floor_bytes({"o": ((16, 768), "f32")}) == 3 * 16 * 768 * 4


@pytest.mark.slow
def test_the_full_size_document_plans_with_one_adamw_pass_per_parameter():
    doc = bm.plan_document(bm.memory_document(only="clip_adamw"), num_sms=132)
    info = bm.fused_passes(doc, "clip_adamw")
    n = len(bm.tinymoe_shapes())
    assert info["gradient_passes"] == 2 * n  # the norm's partial and the AdamW pass; no third read
    assert info["barriers"] <= 3  # partials | second level | scalar combine + coefficient | AdamW


def test_generated_bodies_use_vector_accesses_and_no_atomics(small_doc):
    from latch_codegen_h100 import generate

    gen = generate(small_doc)
    src = "\n".join(u.source for u in gen.units)
    adam = [blk for blk in src.split("\n// ") if blk.startswith("latch::mul+latch::sub+latch::mul+latch::add")]
    assert adam and all("latch::gld4(" in b and "latch::gst4(" in b for b in adam)
    red = [blk for blk in src.split("\n// ") if blk.startswith("latch::mul+latch::sum")]
    assert red and all("auto load = [&]" in b and "((a1) * (a1))" in b for b in red)
    # the partials over contiguous rows (a multiple of 4 long) take the four-wide row path
    assert any("latch::reduce_rows_vec4_" in b for b in red)
    assert not re.search(r"\batomic", "\n".join(red + adam))
    # the AdamW pass computes with the branch-free division and square root (no IEEE slow paths)
    assert all("latch::ew::div_(" in b and "latch::ew::sqrt_(" in b for b in adam)
    # RMSNorm's weight gradient (a column sum of dy * x * r) reads four columns per 16-byte access
    dw = [blk for blk in src.split("\n// ") if blk.startswith("latch::mul+latch::mul+latch::sum")]
    assert dw and all("load4(b_ + off(r_ + k_ * RW_), v_[k_])" in b for b in dw)



def test_the_torch_controls_compute_the_bodies_formulas():
    """Each body's eager-torch control computes what its graph computes (FP32 against the FP64
    reference; the BF16 cast by its rounding, which the FP64 reference does not apply)."""
    doc = bm.memory_document(shapes=SMALL, T=16)
    gen = torch.Generator().manual_seed(1)
    for body in bm.bodies(16):
        g = doc.graph.program(f"{body.name}.x1")
        v = {n: torch.randn(s, generator=gen) for n, s, _ in body.inputs}
        ref = reference.run(doc, g.name, {f"{g.name}.{n}.r0": t for n, t in v.items()})
        got = bm._torch_body(body.name)(v)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(g.outputs[0].values)
        gate = bm.CAST_GATE if body.name == "cast_bf16" else 1e-6
        for t, o in zip(got, g.outputs[0].values):
            r = ref[o].double()
            assert float((t.double() - r).norm() / r.norm()) <= gate, (body.name, o)
