"""``gpu.reference_gates`` on the CPU: a routed program's outputs (stand-ins for the GPU's) gated as
routing decisions plus continuous groups against the FP64 reference replaying the routing.

Stand-ins: the FP64 reference itself with a chosen routing forced (a near-tie flip passes, a
clear-margin flip fails, the continuous groups stay exact either way), and, for the realistic
case, the FP64 reference with BF16-rounded matmul operands (``gpu.policy_faithful_ops``) on the
small TinyMoE, whose own routing flips a near-tie: against the free FP64 reference its MoE
gradients fail the unchanged BF16 gates, replaying its routing they pass.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latch_capture import batch_inputs, bind_inputs, capture_module, program_inputs, tensor_update
from latch_capture.examples import load_example
from latch_check import gpu, reference
from latch_check.gates import FP64_THRESHOLD, ROUTING_FACTOR, BF16_SPACING, RoutingGate, program_gates
from latch_ops.moe.torch_ops import ragged_mm, route_order, token_topk

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TH = {k: FP64_THRESHOLD for k in gpu.GATES_BF16}  # the stand-ins are exact: FP64 gates


class Routed(nn.Module):
    """Two top-2 softmax-routed layers of tanh experts. The first router's experts 2 and 3 nearly
    tie for every token (their weight rows differ by 1e-6), so swapping them is a near-tie flip;
    the other logits are spread wide, so dropping the top choice is a flip at a clear margin."""

    def __init__(self, d=6, experts=4, hidden=5, k=2):
        super().__init__()
        torch.manual_seed(0)
        self.k, self.experts = k, experts
        self.routers = nn.ModuleList(nn.Linear(d, experts, bias=False) for _ in range(2))
        with torch.no_grad():
            self.routers[0].weight.mul_(4.0)
            self.routers[0].weight[3] = self.routers[0].weight[2] + 1e-6
        self.w1 = nn.Parameter(torch.randn(experts, d, hidden) * 0.3)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, d) * 0.3)

    def moe(self, x, router):
        n, d = x.shape
        gates, expert = token_topk(F.softmax(router(x), dim=-1), self.k)
        gates = gates / gates.sum(dim=-1, keepdim=True)
        token, position, offsets = route_order(expert, self.experts)
        ys = ragged_mm(torch.tanh(ragged_mm(x.index_select(0, token), self.w1, offsets)), self.w2, offsets)
        return (ys.index_select(0, position).view(n, self.k, d) * gates.unsqueeze(-1)).sum(dim=1)

    def forward(self, x):
        return self.moe(x + self.moe(x, self.routers[0]), self.routers[1])


def sgd(params, grads, state, hyper):
    return {n: p - hyper["lr"] * grads[n] for n, p in params.items()}, state


def mse(out, target):
    return ((out - target) ** 2).mean()


def _batch(i: int):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(10, 6, generator=g), torch.randn(10, 6, generator=g)


@pytest.fixture(scope="module")
def routed():
    """(document, model, flat inputs before the update) for K = 1."""
    model = Routed()
    doc = capture_module(model, mse, *_batch(0), optimizer=tensor_update(sgd), hyper={"lr": 0.1}, grads=True,
                         routing=True)
    flat = bind_inputs(doc, params={n: p.double() for n, p in model.named_parameters()}, state={},
                       inputs=_batch(0)[0], targets=_batch(0)[1])
    return doc, model, flat


def _run(doc, flat, mb, **kw):
    g = doc.graph.program("update")
    ins = program_inputs(g, {**flat, **batch_inputs(*mb)})
    return reference.run(doc, "update", ins, **kw), ins


def _gates(table_gates):
    return {g.group: g for g in table_gates}


def _decisions(doc, program="update"):
    """[(gate name, routing value, probabilities value)] of the two layers, in order."""
    g = doc.graph.program(program)
    return [(f"routing {n.name}", n.outputs[1], n.inputs[0]) for n in g.nodes if n.op == "latch::token_topk"]


def test_a_near_tie_flip_passes_and_the_continuous_groups_are_gated_given_it(routed):
    doc, _, flat = routed
    (gate0, r0, _), (gate1, _, _) = _decisions(doc)
    free, ins = _run(doc, flat, _batch(0))
    idx = free[r0].clone()
    row = next(t for t in range(10) if len({2, 3} & set(idx[t].tolist())) == 1)  # 2 or 3 chosen, not both
    idx[row] = torch.where(idx[row] == 2, 3, torch.where(idx[row] == 3, 2, idx[row]))
    gpu_out, _ = _run(doc, flat, _batch(0), force={r0: idx})  # a program that flipped the tie
    gates, note = gpu.reference_gates(doc, flat, [_batch(0)], [gpu_out], thresholds=TH, step=3)
    by = _gates(gates)
    assert note == "" and all(g.passed for g in gates), [g for g in gates if not g.passed]
    flip = by[gate0]
    assert isinstance(flip, RoutingGate) and flip.flipped == 1 and flip.flips[0].token == row and flip.step == 3
    assert flip.flips[0].gap < 1e-5 < flip.flips[0].margin
    assert by[gate1].flipped == 0  # judged on the probabilities the flipped layer 0 produces
    assert all(g.rel_l2 == 0.0 for g in gates if not isinstance(g, RoutingGate))
    # the same outputs against the free reference: everything downstream of the flip is O(1) off
    free_gates = program_gates(doc.graph.program("update"), gpu_out, free, thresholds=TH, previous=ins)
    assert {"grad w1", "grad w2", "loss"} <= {g.group for g in free_gates if not g.passed}


def test_a_flip_at_a_clear_margin_fails_even_when_the_rest_agrees(routed):
    doc, _, flat = routed
    (gate0, r0, p0), _ = _decisions(doc)
    free, _ = _run(doc, flat, _batch(0), keep=[p0])
    probs, idx = free[p0], free[r0].clone()
    unchosen = [[e for e in range(4) if e not in idx[t].tolist()] for t in range(10)]
    gap = [probs[t, idx[t, 0]] - min(probs[t, e] for e in unchosen[t]) for t in range(10)]
    row = max(range(10), key=lambda t: gap[t])
    assert gap[row] > 10 * ROUTING_FACTOR * BF16_SPACING * probs[row, idx[row, 0]]
    idx[row, 0] = min(unchosen[row], key=lambda e: probs[row, e])  # drop the top choice for the worst one
    gpu_out, _ = _run(doc, flat, _batch(0), force={r0: idx})
    gates, _ = gpu.reference_gates(doc, flat, [_batch(0)], [gpu_out], thresholds=TH)
    failed = [g.group for g in gates if not g.passed]
    assert failed == [gate0]
    assert not _gates(gates)[gate0].flips[0].near_tie


def test_continuous_errors_still_fail_when_the_routing_agrees(routed):
    doc, _, flat = routed
    gpu_out, _ = _run(doc, flat, _batch(0))
    gpu_out = dict(gpu_out)
    gpu_out["grad.w1"] = gpu_out["grad.w1"] * (1 + 1e-6)
    gates, _ = gpu.reference_gates(doc, flat, [_batch(0)], [gpu_out], thresholds=TH)
    assert [g.group for g in gates if not g.passed] == ["grad w1"]


def test_routing_a_program_cannot_choose_fails_and_says_how_the_rest_was_gated(routed):
    doc, _, flat = routed
    _, (gate1, r1, _) = _decisions(doc)
    gpu_out, _ = _run(doc, flat, _batch(0))
    gpu_out = dict(gpu_out)
    bad = gpu_out[r1].clone()
    bad[4, 1] = 7
    gpu_out[r1] = bad
    gates, note = gpu.reference_gates(doc, flat, [_batch(0)], [gpu_out], thresholds=TH)
    assert f"[{r1!r}] names experts out of range or twice" in note and "FREE FP64 reference" in note
    assert [g.group for g in gates if not g.passed] == [gate1]


def test_a_document_that_cannot_replay_its_routing_is_refused(routed):
    doc, _, flat = routed
    gpu_out, _ = _run(doc, flat, _batch(0))
    missing = {k: v for k, v in gpu_out.items() if k != "routing.token_topk"}  # the first layer's
    with pytest.raises(KeyError, match=r"lack the routing decisions \['routing.token_topk'\]"):
        gpu.reference_gates(doc, flat, [_batch(0)], [missing], thresholds=TH)
    g = doc.graph.program("update")
    outs = [attrs.evolve(grp, values=grp.values[1:]) if grp.name == "routing" else grp for grp in g.outputs]
    cut = attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=[attrs.evolve(g, outputs=outs)]))
    with pytest.raises(ValueError, match=r"node 'token_topk' \(latch::token_topk\) \(from .*test_routing_gpu.py:\d+ "
                                         r"in moe\) decides routing, but its output 'routing.token_topk' is not in the "
                                         r"routing group"):
        gpu.reference_gates(cut, flat, [_batch(0)], [gpu_out], thresholds=TH)


def test_microbatches_replay_the_routing_of_every_program_run():
    model = Routed()
    doc = capture_module(model, mse, *_batch(0), optimizer=tensor_update(sgd), hyper={"lr": 0.1}, grads=True,
                         routing=True, microbatches=2)
    acc, last = doc.graph.program("accumulate"), doc.graph.program("accumulate_and_update")
    flat0 = bind_inputs(doc, params={n: p.double() for n, p in model.named_parameters()}, state={},
                        inputs=_batch(0)[0], targets=_batch(0)[1])
    # the stand-in program: microbatch 0 flips a near-tie, microbatch 1 routes like FP64
    ins0 = program_inputs(acc, {**flat0, **batch_inputs(*_batch(1))})
    (gate0, r0, _), _ = _decisions(doc, "accumulate")
    idx = reference.run(doc, "accumulate", ins0)[r0].clone()
    row = next(t for t in range(10) if len({2, 3} & set(idx[t].tolist())) == 1)
    idx[row] = torch.where(idx[row] == 2, 3, torch.where(idx[row] == 3, 2, idx[row]))
    out0 = reference.run(doc, "accumulate", ins0, force={r0: idx})
    flat1 = {**flat0, **{old: out0[new] for new, old in acc.inplace}}
    out1 = reference.run(doc, "accumulate_and_update", program_inputs(last, {**flat1, **batch_inputs(*_batch(2))}))
    batches = [_batch(1), _batch(2)]
    gates, note = gpu.reference_gates(doc, flat0, batches, [out0, out1], thresholds=TH)
    by = _gates(gates)
    assert note == "" and all(g.passed for g in gates)
    assert by[f"{gate0} [microbatch 0]"].flipped == 1 and by[f"{gate0} [microbatch 1]"].flipped == 0
    assert by["grad w1"].rel_l2 == 0.0  # the accumulated gradient includes the replayed flip
    with pytest.raises(ValueError, match="give the outputs of all 2 program runs of the update"):
        gpu.reference_gates(doc, flat0, batches, [out1], thresholds=TH)
    with pytest.raises(ValueError, match="captured with 2 microbatches per update, got 1 batches"):
        gpu.reference_gates(doc, flat0, batches[:1], [out1], thresholds=TH)


def test_bf16_emulation_flips_a_near_tie_that_fails_against_free_fp64_and_passes_replayed():
    """The TinyMoE failure of results/gpu.md (run 2, update 7), reproduced on the CPU at step 0 of
    a batch where BF16 operands flip a near-tie."""
    pytest.importorskip("latch_memory")  # memory.policy: a test extra of latch-check
    from latch_core.passes import run_pipeline
    from latch_core.plugins import registries

    ex = load_example(EXAMPLES / "tinymoe.py", vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32,
                      batch=2, seq=16, device="cpu")
    doc = run_pipeline([registries().passes.get("memory.policy")], ex.capture(grads=True, routing=True))
    assert gpu.policy_of(doc) == "bf16"
    g = doc.graph.program("update")
    flat = bind_inputs(doc, params={n: p.double() for n, p in ex.params().items()}, state=ex.initial_state(),
                       inputs=ex.inputs, targets=ex.targets)
    bf16 = gpu.policy_faithful_ops()
    for i in itertools.chain([30], range(64)):  # 30 flips both layers with this seed; search if it changes
        mb = ex.microbatch(i)
        ins = program_inputs(g, {**flat, **batch_inputs(*mb)})
        emu = reference.run(doc, "update", ins, ops=bf16)
        free = reference.run(doc, "update", ins)
        failed_free = [x for x in program_gates(g, emu, free, thresholds=gpu.GATES_BF16, previous=ins) if not x.passed]
        if failed_free:
            break
    else:
        pytest.fail("no batch among the first 64 makes BF16 operands flip a routing decision that fails the gates")
    assert any(x.group.startswith("grad blocks.") and x.group.endswith(".ffn.w1") for x in failed_free)
    gates, note = gpu.reference_gates(doc, flat, [mb], [emu], thresholds=gpu.GATES_BF16, step=0)
    routing = [x for x in gates if isinstance(x, RoutingGate)]
    assert note == "" and len(routing) == 2 and sum(x.flipped for x in routing) >= 1
    assert all(x.passed for x in gates), "\n".join(str(x) for x in gates if not x.passed)


class _Float32Run:
    """A stand-in for ``gpu.GpuRun`` on the CPU: the program run by the reference interpreter in
    float32 (routing included), in place on a float32 layout, like the GPU runtime."""

    def __init__(self, example, build_dir, doc):
        self.example, self.doc = example, doc
        self.K = int(doc.graph.meta("microbatches", 1))
        self.hyper = dict(doc.graph.meta("hyper", ()) or ())
        flat = bind_inputs(doc, params=example.params(), state=example.initial_state(), inputs=example.inputs,
                           targets=example.targets, hyper=self.hyper)
        self.layout = {v.name: flat[v.name].detach().float().clone() for v in doc.graph.layout}
        self.launched: list[str] = []

    def batches(self, step):
        return [self.example.microbatch(step * self.K + k) for k in range(self.K)]

    def update_each(self, batches, *, check=True):
        seq = ["accumulate"] * (self.K - 1) + ["accumulate_and_update"] if self.K > 1 else ["update"]
        outs = []
        for name, mb in zip(seq, batches):
            g = self.doc.graph.program(name)
            hyper = {n: torch.tensor(float(v)) for n, v in self.hyper.items()}
            ins = program_inputs(g, {**self.layout, **hyper, **batch_inputs(*mb)})
            out = reference.run(self.doc, name, ins, float_dtype=torch.float32)
            self.layout.update({old: out[new].clone() for new, old in g.inplace})
            outs.append({n: t for n, t in out.items() if n not in dict(g.inplace)})
            self.launched.append(name)
        return outs

    def update(self, batches, *, check=True):
        return self.update_each(batches)[-1]


@pytest.mark.parametrize("K", [1, 2])
def test_gpu_compare_gates_a_routed_program_over_several_updates(monkeypatch, K):
    """The GPU loop itself (steps, per-program outputs, in-place values read from the layout, the
    title), with a float32 CPU stand-in for the runtime."""
    from latch_capture import Example
    from latch_core.sections import ScheduleSection

    ex = Example(model=Routed(), objective=mse, inputs=_batch(0)[0], targets=_batch(0)[1],
                 optimizer=tensor_update(sgd), hyper={"lr": 0.1}, microbatches=K, name="routed", batch=_batch)
    doc = ex.capture(grads=True, routing=True)
    doc = attrs.evolve(doc, schedule=ScheduleSection("stand-in", 1, ()))
    runs = []

    def stand_in(example, build_dir):
        runs.append(_Float32Run(example, build_dir, doc))
        return runs[-1]

    monkeypatch.setattr(gpu, "GpuRun", stand_in)
    result = gpu.gpu_compare(ex, "no-build-dir", steps=2, thresholds=gpu.GATES_F32)
    assert len(result.tables) == 2 and result.passed, result.format()
    assert runs[0].launched == (["accumulate"] * (K - 1) + ["accumulate_and_update"] if K > 1 else ["update"]) * 2
    t = result.tables[1]
    assert t.title == (f"routed: step 1 ({'update' if K == 1 else 'accumulate_and_update'}, K={K}, stand-in, "
                       "policy f32) GPU vs FP64 reference replaying the GPU's routing")
    routing = [g.group for g in t.gates if isinstance(g, RoutingGate)]
    assert len(routing) == 2 * K and all(g.step == 1 for g in t.gates)
    assert {"loss", "grad w1", "new_params", "param_update"} <= {g.group for g in t.gates}
    assert "routing: choices that differ from FP64's top-k" in t.format()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tinymoe_bf16_with_routing_passes_its_gates_on_the_gpu(tmp_path):
    """The H200 acceptance of this gate (tools/gpu_check.sh runs the same with both strategies and
    prints the tables, so it deselects this test)."""
    small = dict(vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32, seq=32, device="cpu")
    from latch_check.pipeline import compile_example

    ex = compile_example(EXAMPLES / "tinymoe.py", policy=True, routing=True, overrides=small, build_dir=tmp_path).example
    result = gpu.gpu_compare(ex, tmp_path, steps=10)
    assert result.passed, result.format()
    assert all(any(isinstance(g, RoutingGate) for g in t.gates) for t in result.tables)


@pytest.mark.parametrize("K", [1, 2])
def test_gpu_compare_with_the_torch_column_and_a_trained_state(monkeypatch, K):
    """gpu_compare(torch_column=True, trained=N) through the float32 CPU stand-in: every continuous
    gate carries PyTorch's own (FP32 here: an f32 policy) update's error, measured against the
    reference replaying PyTorch's routing for one microbatch (said in the title) and not measured
    for K > 1; a last table at the trained state, where no fresh-state factor applies."""
    from latch_capture import Example
    from latch_core.sections import ScheduleSection
    from latch_check.gates import FRESH_FACTOR

    ex = Example(model=Routed(), objective=mse, inputs=_batch(0)[0], targets=_batch(0)[1],
                 optimizer=tensor_update(sgd), hyper={"lr": 0.1}, microbatches=K, name="routed", batch=_batch)
    doc = ex.capture(grads=True, routing=True)
    doc = attrs.evolve(doc, schedule=ScheduleSection("stand-in", 1, ()))

    class Run(_Float32Run):
        device = torch.device("cpu")

        def load_state(self, params, state):
            flat = bind_inputs(self.doc, params=params, state=state, inputs=self.example.inputs,
                               targets=self.example.targets, hyper=self.hyper)
            self.layout = {v.name: flat[v.name].detach().float().clone() for v in self.doc.graph.layout}

    monkeypatch.setattr(gpu, "GpuRun", lambda example, build_dir: Run(example, build_dir, doc))
    result = gpu.gpu_compare(ex, "no-build-dir", steps=1, thresholds=gpu.GATES_F32, torch_column=True, trained=3)
    assert len(result.tables) == 2 and result.passed, result.format()
    fresh, trained = result.tables
    assert "fresh state" in fresh.title and "trained (3 FP32 updates) state" in trained.title
    l2 = [g for g in fresh.gates if not isinstance(g, RoutingGate)]
    if K == 1:
        assert "replaying PyTorch's own routing" in fresh.title
        assert all(g.torch_rel is not None and g.torch_rel < 1e-5 for g in l2)  # FP32 against FP64
        assert {g.group: g for g in l2}["param_update"].factor == FRESH_FACTOR
        assert all(g.factor is None for g in trained.gates if not isinstance(g, RoutingGate))
        assert "torch result" in fresh.format()
    else:
        assert "torch column not measured" in fresh.title and all(g.torch_rel is None for g in l2)
    assert trained.gates[0].step == 3
