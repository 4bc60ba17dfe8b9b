"""memory.weight_copies on the real examples (results/wc.md).

- The planned full-size TinyMoE-200M and dense transformer (meta device, 2 x 1024 tokens): no cast
  of a parameter is left anywhere in the update; each copy is written by the fusion group that
  computes its new weight (AdamW's), in place over the state buffer; the bytes the fusion groups move
  fall by exactly 4 B per copied parameter (6 B of cast gone, 2 B more in AdamW), the cast tasks go
  and the phases and barriers stay.
- Every example on the CPU: the arena simulator matches the FP64 interpreter with the copies on
  (the copies have their own gate), microbatches included; the FP64 reference computes the same
  update with and without the copies, bit for bit (its cast never rounds, so its copy is the weight).
- ``bind_inputs`` creates each copy from its parameter; a GPU-side reference replays the copy as the
  weight (``reference_gates``).
- nvcc builds the transformer with its copies (tensor cores, TMA, register split in the SASS), and
  the build's manifest and buffers carry the copies for the runtime.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from latch_core.ir import DTYPES
from cross_helpers import needs_nvcc, planned
from latch_core.pipeline import Request, compile

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DENSE = dict(d_model=768, layers=8, heads=12, mlp_hidden=2048, vocab=49152, batch=2, seq=1024, device="meta")
MOE200 = dict(device="meta")  # examples/tinymoe.py's defaults: TinyMoE-200M at 2 x 1024 tokens
TRANSFORMER_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)
TINYMOE_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, experts=4, expert_hidden=16, batch=2, seq=8)


def group_bytes(doc, program: str = "update") -> int:
    """Bytes the schedule's fusion groups read and write, each crossing value once per group."""
    g = doc.graph.program(program)
    return sum(g.value(v).nbytes for fg in doc.schedule.program(program).groups for v in (*fg.inputs, *fg.outputs))


def param_casts(g) -> list:
    params = set(g.group("params").values)
    return [n for n in g.nodes if n.op == "latch::cast" and n.inputs[0] in params]


def _plan(example: str, overrides: dict, copies: bool):
    return compile(Request(example=str(EXAMPLES / example), overrides=overrides, build=False, weight_copies=copies))


def _check_full_size(example: str, overrides: dict, capsys) -> dict:
    # once per session (cross_helpers.planned): test_lmhead.py plans the dense transformer's request too
    before, after = (planned(Request(example=str(EXAMPLES / example), overrides=overrides, build=False,
                                     weight_copies=copies)) for copies in (False, True))
    g0, g = before.graph.program("update"), after.graph.program("update")
    cast_before = param_casts(g0)
    copied = sum(g0.value(n.inputs[0]).numel for n in cast_before)
    assert cast_before and not param_casts(g), [n.name for n in param_casts(g)]
    copies = dict(dict(after.graph.meta("memory.weight_copies"))["copies"])
    assert sorted(copies.values()) == sorted({n.inputs[0] for n in cast_before})
    # every copy: written by the group that computes its new weight, in place over the state buffer
    s = after.schedule.program("update")
    new_of = {old: new for new, old in g.inplace}
    by_output = {o: fg for fg in s.groups for o in fg.outputs}
    placed = {p.value: p.buffer for p in after.memory.program("update").placements}
    for c, p in copies.items():
        written = new_of[c]
        fg = by_output[written]
        assert new_of[p] in fg.outputs and f"new.exp_avg.{p}" in fg.outputs, (c, fg.nodes)
        assert placed[written] == c  # in place: the copy's own state buffer, no copy-back
    assert dict(dict(dict(after.memory.stats)["programs"])["update"])["copy_back"] == ()
    # bytes: -4 B per copied parameter, exactly; the cast tasks go; phases and barriers stay
    b0, b1 = group_bytes(before), group_bytes(after)
    assert b0 - b1 == 4 * copied, (b0, b1, copied)
    s0 = before.schedule.program("update")
    cast_groups = {fg.id for fg in s0.groups if len(fg.nodes) == 1 and fg.nodes[0] in {n.name for n in cast_before}}
    cast_tasks = sum(1 for t in s0.tasks if t.group in cast_groups)
    assert len(cast_groups) == len(cast_before)
    # every other group keeps its tasks, except the optimizer groups that now also write a copy:
    # they move 2 B more per parameter, so the tiler may give them more tiles (never fewer)
    def tasks_of(sch, skip=()):
        out = {}
        for t in sch.tasks:
            if t.group not in skip:
                key = sch.groups[t.group].nodes[0]  # the copy's cast joins a group as its last node
                out[key] = out.get(key, 0) + 1
        return out

    t0, t1 = tasks_of(s0, cast_groups), tasks_of(s)
    writers = {by_output[new_of[c]].nodes[0] for c in copies}
    assert {k: v for k, v in t0.items() if k not in writers} == {k: v for k, v in t1.items() if k not in writers}
    assert all(t1[k] >= t0[k] for k in writers)
    assert len(s0.tasks) - len(s.tasks) == cast_tasks - sum(t1[k] - t0[k] for k in writers)
    phases = lambda sch: len({t.phase for t in sch.tasks})  # noqa: E731
    assert (phases(s), s.num_barriers) == (phases(s0), s0.num_barriers)
    row = dict(example=example, copies=len(copies), elements=copied, bytes_before=b0, bytes_after=b1,
               tasks_before=len(s0.tasks), tasks_after=len(s.tasks), phases=phases(s), barriers=s.num_barriers,
               arena_before=before.memory.arena_bytes, arena_after=after.memory.arena_bytes)
    with capsys.disabled():
        print(f"\n{example} full size: {len(copies)} copies ({copied:,} elements); group bytes {b0 / 1e9:.4f} -> "
              f"{b1 / 1e9:.4f} GB; tasks {len(s0.tasks):,} -> {len(s.tasks):,}; phases {phases(s)}, barriers "
              f"{s.num_barriers}; arena {before.memory.arena_bytes / 1e9:.3f} -> {after.memory.arena_bytes / 1e9:.3f} GB")
    return row


@pytest.mark.slow
def test_full_size_tinymoe_200m_keeps_its_copies_as_state(capsys):
    row = _check_full_size("tinymoe.py", MOE200, capsys)
    assert row["copies"] == 49 and row["elements"] == 207_716_352  # results/wc.md
    assert row["bytes_before"] - row["bytes_after"] == 830_865_408


@pytest.mark.slow
def test_full_size_dense_transformer_keeps_its_copies_as_state(capsys):
    row = _check_full_size("transformer.py", DENSE, capsys)
    assert row["copies"] == 41 and row["elements"] == 94_371_840
    assert row["bytes_before"] - row["bytes_after"] == 377_487_360


# ------------------------------------------------------------------------------------------------
# Every example on the CPU

CASES = {
    "two_weight": ("two_weight.py", {}),
    "mlp": ("mlp.py", {}),
    "mlp_k2": ("mlp.py", {"microbatches": 2}),
    "transformer": ("transformer.py", TRANSFORMER_SMALL),
    "transformer_k2": ("transformer.py", {**TRANSFORMER_SMALL, "microbatches": 2}),
    "tinymoe": ("tinymoe.py", TINYMOE_SMALL),
    "moe_layer": ("moe_layer.py", dict(tokens=64, d_model=32, expert_hidden=16, experts=4)),
    "lmhead": ("lmhead.py", {}),
}
HF = {"hf_gpt2": ("hf_gpt2.py", {}), "hf_llama": ("hf_llama.py", {}), "hf_mixtral": ("hf_mixtral.py", {})}
_planned: dict = {}


def _case(case: str, copies: bool = True):
    key = (case, copies)
    if key not in _planned:
        path, kw = {**CASES, **HF}[case]
        _planned[key] = _plan(path, kw, copies)
    return _planned[key]


def _simulate(case: str):
    from latch_capture.examples import load_example
    from latch_check.simulator import check_example

    path, kw = {**CASES, **HF}[case]
    doc = _case(case)
    return doc, check_example(load_example(EXAMPLES / path, **kw), doc, steps=1, seed=5)


@pytest.mark.parametrize("case", list(CASES))
def test_every_example_simulates_with_its_copies(case):
    doc, result = _simulate(case)
    assert result.passed, result.format()
    copies = dict(dict(doc.graph.meta("memory.weight_copies"))["copies"])
    updating = [g for g in doc.graph.programs if g.inplace]
    last = doc.graph.programs[-1]
    gates = {g.group for t in result.tables for g in t.gates}
    if case == "two_weight":  # FP32 products (no policy casts): nothing to copy
        assert copies == {} and "weight_copies" not in gates
        return
    assert copies, "the BF16 policy casts this example's weights"
    for g in doc.graph.programs:
        assert not param_casts(g) and set(copies) <= set(g.group("state").values)
    written = {o for _, o in last.inplace}
    never = set(dict(doc.graph.meta("memory.weight_copies"))["never_updated"])
    assert {c for c, p in copies.items() if p not in never} <= written
    assert bool(updating) == any(p not in never for p in copies.values())  # lmhead's update keeps its weights
    if any(p not in never for p in copies.values()):
        assert "weight_copies" in gates


@pytest.mark.slow
@pytest.mark.parametrize("case", list(HF))
def test_transformers_examples_simulate_with_their_copies(case):
    pytest.importorskip("transformers")
    doc, result = _simulate(case)
    assert result.passed, result.format()
    assert dict(dict(doc.graph.meta("memory.weight_copies"))["copies"])


@pytest.mark.parametrize("case", ["transformer_k2"])
def test_the_fp64_reference_computes_the_same_update_with_and_without_copies(case):
    """Its cast never rounds, so the copy it is given (the weight, from bind_inputs) is what the cast
    gave it before: every output agrees bit for bit, the copies equal the new weights."""
    from latch_capture import advance, batch_inputs, bind_inputs, program_inputs
    from latch_capture.examples import load_example
    from latch_check import reference
    from latch_check.compare import _f64

    path, kw = CASES[case]
    ex = load_example(EXAMPLES / path, **kw)
    outs = {}
    for copies in (False, True):
        doc = _case(case, copies)
        flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state=_f64(ex.initial_state()),
                           inputs=ex.inputs, targets=ex.targets, hyper=dict(doc.graph.meta("hyper", ()) or ()))
        seen = []
        for step in range(2):
            for k, g in enumerate(doc.graph.programs):
                flat.update(batch_inputs(*ex.microbatch(step * len(doc.graph.programs) + k)))
                out = reference.run(doc, g.name, program_inputs(g, flat))
                seen.append(out)
                flat = advance(g, flat, out)
        outs[copies] = (seen, flat)
    (plain, flat0), (kept, flat1) = outs[False], outs[True]
    copies = dict(dict(_case(case).graph.meta("memory.weight_copies"))["copies"])
    assert copies
    for a, b in zip(plain, kept):
        assert set(a) <= set(b)
        for n in a:
            assert torch.equal(a[n], b[n]), n
    for c, p in copies.items():
        assert torch.equal(flat1[c], flat1[p]) and torch.equal(flat1[p], flat0[p])


def test_bind_inputs_creates_each_copy_from_its_parameter():
    from latch_capture import bind_inputs, weight_copies
    from latch_capture.examples import load_example

    ex = load_example(EXAMPLES / "mlp.py")
    doc = _case("mlp")
    copies = weight_copies(doc)
    assert copies
    flat = bind_inputs(doc, params=ex.params(), state=ex.initial_state(), inputs=ex.inputs, targets=ex.targets)
    for c, p in copies.items():
        assert torch.equal(flat[c], flat[p]) and flat[c].data_ptr() != flat[p].data_ptr()
        # what a GPU layout holds: the parameter rounded to nearest even, as the program's cast does
        assert torch.equal(flat[c].to(torch.bfloat16), ex.params()[p].detach().to(torch.bfloat16))
    given = {c: torch.zeros_like(flat[c]) for c in copies}  # a state that carries its copies keeps them
    flat2 = bind_inputs(doc, params=ex.params(), state={**ex.initial_state(), **given}, inputs=ex.inputs,
                        targets=ex.targets)
    assert all(torch.equal(flat2[c], given[c]) for c in copies)
    assert weight_copies(_case("mlp", False)) == {}


def test_reference_gates_replay_a_bf16_copy_as_its_weight():
    """On the GPU the layout holds bf16(p); the reference must be given p (what its cast gave it),
    so its update is the one without copies: the gates then compare the same numbers as before."""
    from latch_capture import bind_inputs, weight_copies
    from latch_capture.examples import load_example
    from latch_check import reference
    from latch_check.compare import _f64
    from latch_check.gpu import GATES_BF16, reference_gates

    ex = load_example(EXAMPLES / "mlp.py")
    doc = _case("mlp")
    copies = weight_copies(doc)
    flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state=_f64(ex.initial_state()),
                       inputs=ex.inputs, targets=ex.targets, hyper=dict(doc.graph.meta("hyper", ()) or ()))
    exact = reference.run(doc, "update", {n: flat[n] for n in doc.graph.program("update").input_names()})
    rounded = dict(flat)
    for c in copies:  # as copied off a GPU layout
        rounded[c] = flat[c].to(torch.bfloat16).to(torch.float64)
    batches = [ex.microbatch(0)]
    outputs = [dict(exact)]
    for new, old in doc.graph.program("update").inplace:
        outputs[0][new] = exact[new]
    gates, _ = reference_gates(doc, rounded, batches, outputs, thresholds={k: 1e-12 for k in GATES_BF16})
    assert gates and all(g.rel_l2 == 0.0 for g in gates), [(g.group, g.rel_l2) for g in gates]
    assert "weight_copies" in {g.group for g in gates}


def test_the_weight_copies_gate_measures_the_bf16_rounding():
    """program_gates: the copies against the reference's new weights (never rounded); the torch
    column derives PyTorch's copy from its new weight (autocast rounds it where it reads it)."""
    from latch_check.gates import program_gates
    from latch_check.gpu import GATES_BF16

    doc = _case("mlp")
    g = doc.graph.program("update")
    copies = list(g.group("weight_copies", outputs=True).values)
    producer = g.producers()
    gen = torch.Generator().manual_seed(0)
    ref, out, pt = {}, {}, {}
    for c in copies:
        p_new = producer[c].inputs[0]
        w = torch.randn(g.value(c).shape, generator=gen, dtype=torch.float64) * 0.02
        ref[c] = ref[p_new] = w
        out[c] = w.to(torch.bfloat16)
        out[p_new] = pt[p_new] = w
    only = type(g)(g.name, g.values, g.nodes, g.inputs, [grp for grp in g.outputs if grp.name == "weight_copies"])
    gates = program_gates(only, out, ref, thresholds=GATES_BF16, torch_outputs=pt)
    (gate,) = gates
    assert gate.group == "weight_copies" and gate.threshold == GATES_BF16["weight_copies"]
    assert 1e-4 < gate.rel_l2 < 2.0 ** -8 and gate.passed  # BF16 rounding: within its unit roundoff
    assert gate.torch_rel == pytest.approx(gate.rel_l2)  # the same rounding of the same weights
    stale = {c: (ref[c] + 3e-4 * torch.sign(torch.randn(ref[c].shape, generator=gen, dtype=torch.float64)))
             .to(torch.bfloat16) for c in copies}  # a copy one AdamW step behind
    (gate,) = program_gates(only, {**out, **stale}, ref, thresholds=GATES_BF16)
    assert not gate.passed


# ------------------------------------------------------------------------------------------------
# nvcc: the transformer builds with its copies


@needs_nvcc
def test_transformer_compiles_with_its_copies(tmp_path):
    """The generated CUDA with the copies as state is valid (nvcc's front end: check_compiles; the
    products' SASS does not depend on where their BF16 operand comes from and is read in
    test_codegen_compiles), and the manifest the runtime reads declares each copy."""
    import json

    from latch_codegen_h100 import check_compiles

    doc = compile(Request(example=str(EXAMPLES / "transformer.py"), build=False, cache=False))
    copies = dict(dict(doc.graph.meta("memory.weight_copies"))["copies"])
    assert copies and not param_casts(doc.graph.program("update"))
    check_compiles(doc, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["metadata"]["memory.weight_copies"]["copies"] == copies  # what Program.weight_copies reads
    bufs = {b["name"]: b for b in manifest["buffers"]}
    layout = {v.name: v for v in doc.graph.layout}
    for c, p in copies.items():
        assert bufs[c]["role"] == "state" and bufs[c]["dtype"] == "bf16" and bufs[c]["shape"] == bufs[p]["shape"]
        assert layout[c].nbytes == math.prod(bufs[c]["shape"]) * DTYPES["bf16"]
