"""The transformer and TinyMoE examples: captured, then run by the FP64 reference interpreter against
PyTorch's own FP64 eager update (loss, gradients, new params, new optimizer state) over several
steps; each Latch custom op (sdpa, token_topk, route_order, ragged_mm) is ONE node with its own
backward node; TinyMoE-200M has exactly the parameter count of TARGETS.md (on the meta device).

The graph is captured at float32 (what the GPU runs) and checked at float64: the interpreter casts
every float input to float64 and the eager side runs a float64 copy of the same model.
"""

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from latch_capture import advance, batch_inputs, bind_inputs, load_example, program_inputs  # noqa: E402
from latch_check import reference  # noqa: E402
from latch_core.lint import check  # noqa: E402
from latch_core.plugins import registries  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TOL = 1e-10  # relative L2 per tensor, FP64 against FP64

TRANSFORMER_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)
TINYMOE_SMALL = dict(vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32, batch=2, seq=16)


def _f64(tree):
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return tree.detach().to(torch.float64) if tree.is_floating_point() else tree.detach().clone()


def eager_step(model64, ex, params, state, microbatches, hyper):
    """PyTorch's own update in float64: mean loss and gradients over the microbatches, then the
    example's optimizer as plain eager tensor code."""
    losses, grads = [], None
    for tokens, targets in microbatches:
        with torch.enable_grad():
            leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
            out = torch.func.functional_call(model64, leaves, (tokens,))
            loss = ex.objective(out, targets)
            g = torch.autograd.grad(loss, list(leaves.values()))
        losses.append(loss.detach())
        g = dict(zip(params, g))
        grads = g if grads is None else {n: grads[n] + g[n] for n in grads}
    k = len(microbatches)
    grads = {n: v / k for n, v in grads.items()} if k > 1 else grads
    loss = sum(losses) / k if k > 1 else losses[0]
    new_params, new_state, *_ = ex.optimizer.update(params, grads, state, hyper)
    return loss, grads, new_params, new_state


def run_captured(doc, flat, microbatches):
    """One step of the document's programs on the interpreter: accumulate K-1 times, then the last
    program; returns (outputs of the last program, the next step's inputs)."""
    section = doc.graph
    if len(microbatches) == 1:
        progs = [section.program("update")]
    else:
        progs = [section.program("accumulate")] * (len(microbatches) - 1) + [section.program("accumulate_and_update")]
    for prog, (tokens, targets) in zip(progs, microbatches):
        flat = {**flat, **batch_inputs(tokens, targets)}
        out = reference.run(doc, prog.name, program_inputs(prog, flat))
        flat = advance(prog, flat, out)
    return out, flat


def rel_l2(got, want) -> float:
    got, want = got.to(torch.float64), want.to(torch.float64)
    den = torch.linalg.vector_norm(want)
    num = torch.linalg.vector_norm(got - want)
    return float(num / den) if den > 0 else float(num)


def check_against_eager(path, overrides, steps, microbatches=1):
    ex = load_example(path, **overrides, microbatches=microbatches)
    doc = ex.capture(grads=microbatches == 1)
    check(doc.graph, registries().ops, require_known_ops=True)

    model64 = copy.deepcopy(ex.model).to(torch.float64)
    params = _f64(dict(model64.named_parameters()))
    state = _f64(ex.initial_state())
    hyper = {k: torch.tensor(v, dtype=torch.float64) for k, v in ex.hyper.items()}
    flat = bind_inputs(doc, params={n: p.detach() for n, p in ex.model.named_parameters()}, state=ex.initial_state(),
                       inputs=ex.inputs, targets=ex.targets)
    worst: dict[str, float] = {}
    for step in range(steps):
        batches = [ex.microbatch(step * microbatches + i) for i in range(microbatches)]
        out, flat = run_captured(doc, flat, batches)
        loss, grads, params, state = eager_step(model64, ex, params, state, batches, hyper)
        want = {"loss": loss}
        if microbatches == 1:
            want.update({f"grad.{n}": g for n, g in grads.items()})
        eager_flat = bind_inputs(doc, params=params, state=state, inputs=ex.inputs, targets=ex.targets)
        for v in doc.graph.layout:
            if not v.name.startswith(("grad_acc.", "loss_acc")):
                want[f"new.{v.name}"] = eager_flat[v.name]
        missing = sorted(set(want) - set(out))
        assert not missing, f"step {step}: captured program lacks outputs {missing[:5]}"
        for name, w in want.items():
            err = rel_l2(out[name], w)
            worst[name] = max(worst.get(name, 0.0), err)
        for v in doc.graph.layout:  # accumulators are zeroed by the update
            if v.name.startswith(("grad_acc.", "loss_acc")):
                assert not bool(flat[v.name].any()), f"step {step}: {v.name} not zeroed"
    bad = {n: e for n, e in worst.items() if not e <= TOL}
    assert not bad, f"relative L2 above {TOL}: {dict(sorted(bad.items(), key=lambda x: -x[1])[:8])}"
    return doc, worst


def op_counts(doc, program="update"):
    counts: dict[str, int] = {}
    for n in doc.graph.program(program).nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    return counts


def test_transformer_matches_fp64_eager_over_steps():
    doc, worst = check_against_eager(EXAMPLES / "transformer.py", TRANSFORMER_SMALL, steps=3)
    layers = TRANSFORMER_SMALL["layers"]
    counts = op_counts(doc)
    assert counts["latch::sdpa"] == layers and counts["latch::sdpa_backward"] == layers
    assert worst["loss"] <= TOL and any(n.startswith("grad.") for n in worst)


def test_tinymoe_small_matches_fp64_eager_over_steps():
    doc, _ = check_against_eager(EXAMPLES / "tinymoe.py", TINYMOE_SMALL, steps=3)
    layers = TINYMOE_SMALL["layers"]
    counts = op_counts(doc)
    # one node per custom op per layer; three expert matmuls (w1, w3, w2) per layer
    assert counts["latch::sdpa"] == counts["latch::sdpa_backward"] == layers
    assert counts["latch::token_topk"] == counts["latch::token_topk_backward"] == layers
    assert counts["latch::route_order"] == layers
    assert counts["latch::ragged_mm"] == 3 * layers
    assert counts["latch::ragged_mm_grad_x"] == counts["latch::ragged_mm_grad_w"] == 3 * layers


def test_tinymoe_small_microbatches_match_fp64_eager():
    doc, _ = check_against_eager(EXAMPLES / "tinymoe.py", TINYMOE_SMALL, steps=2, microbatches=2)
    assert {p.name for p in doc.graph.programs} == {"accumulate", "accumulate_and_update"}
    assert op_counts(doc, "accumulate")["latch::ragged_mm"] == 3 * TINYMOE_SMALL["layers"]


def test_custom_op_nodes_carry_their_attributes():
    ex = load_example(EXAMPLES / "tinymoe.py", **TINYMOE_SMALL)
    graph = ex.capture().graph.program("update")
    by_op = {}
    for n in graph.nodes:
        by_op.setdefault(n.op, n)
    head_dim = TINYMOE_SMALL["d_model"] // TINYMOE_SMALL["heads"]
    assert by_op["latch::sdpa"].attr_dict == {"causal": True, "scale": pytest.approx(head_dim ** -0.5)}
    assert by_op["latch::token_topk"].attr_dict == {"k": 2}
    assert by_op["latch::route_order"].attr_dict == {"num_experts": TINYMOE_SMALL["experts"]}
    assert by_op["latch::token_topk_backward"].attr_dict == {"num_experts": TINYMOE_SMALL["experts"]}
    sdpa_bwd = by_op["latch::sdpa_backward"]
    assert sdpa_bwd.inputs[1] is None  # lse is not used by the model: its gradient is absent


def test_tinymoe_200m_parameter_count_on_meta():
    ex = load_example(EXAMPLES / "tinymoe.py", device="meta")
    params = dict(ex.model.named_parameters())
    assert all(p.device.type == "meta" for p in params.values())
    assert sum(p.numel() for p in params.values()) == 207_729_408
    experts = sum(p.numel() for n, p in params.items() if ".ffn.w" in n)
    assert experts == 150_994_944
    assert ex.inputs.shape == (2, 1024) and ex.batch is None


def test_example_overrides_are_checked():
    from latch_capture import CaptureError

    with pytest.raises((TypeError, CaptureError), match="d_modle"):
        load_example(EXAMPLES / "tinymoe.py", d_modle=64)
    # an error in the example's build() is a CaptureError naming it and the line (latch-pipeline
    # prints it without a traceback); the original exception is its cause
    with pytest.raises(CaptureError, match="build.. raised ValueError: .*not divisible by heads.*transformer.py:") as e:
        load_example(EXAMPLES / "transformer.py", d_model=30, heads=4)
    assert isinstance(e.value.__cause__, ValueError)


@pytest.mark.parametrize("scheduler", ["barrier", "dataflow"])
def test_tinymoe_tiled_custom_ops_pass_the_arena_simulator(scheduler):
    # Large enough that ragged_mm (160 expert rows) and sdpa split into several tasks: the
    # simulator runs each task on inputs poisoned outside its footprint, so a footprint that
    # misses something the op reads shows up as NaN; the schedule is also statically validated.
    import latch_schedule
    from latch_check.simulator import simulate
    from latch_memory import plan

    ov = dict(vocab=64, d_model=32, layers=1, heads=2, experts=4, expert_hidden=16, batch=2, seq=40)
    ex = load_example(EXAMPLES / "tinymoe.py", **ov)
    doc = plan(latch_schedule.schedule(ex.capture(), scheduler=scheduler))
    latch_schedule.check(doc)
    prog, sched = doc.graph.program("update"), doc.schedule.programs[0]
    op_of = {n.name: n.op for n in prog.nodes}
    tasks: dict[str, int] = {}
    for t in sched.tasks:
        for node in next(g for g in sched.groups if g.id == t.group).nodes:
            tasks[op_of[node]] = tasks.get(op_of[node], 0) + 1
    assert tasks["latch::ragged_mm"] > 3 and tasks["latch::ragged_mm_grad_x"] > 3
    assert tasks["latch::ragged_mm_grad_w"] >= 4 and tasks["latch::sdpa"] >= 4
    assert tasks["latch::sdpa_backward"] == 4  # one per (batch, head)
    flat = bind_inputs(doc, params={n: p.detach() for n, p in ex.model.named_parameters()},
                       state=ex.initial_state(), inputs=ex.inputs, targets=ex.targets)
    ins = program_inputs(prog, flat)
    want = reference.run(doc, "update", ins)
    got = simulate(doc, "update", ins, seed=3)
    errs = {k: rel_l2(got[k], want[k]) for k in want}
    assert max(errs.values()) <= 1e-12, sorted(errs.items(), key=lambda x: -x[1])[:5]
