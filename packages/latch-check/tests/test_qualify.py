"""The gate table's torch column (PyTorch's own update on the same inputs), the fresh-state rule,
PyTorch's graph-safe MoE product, and the bench command's parsing and table. CPU only."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from latch_check.bench import BenchError, format_table, parse_shapes
from latch_check.gates import FRESH_FACTOR, Gate, GateTable, attach_torch

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_a_gate_passes_only_on_its_threshold_and_fresh_sign_like_failures_near_pytorch_are_labelled():
    g = [Gate("param_update", 0.12, 0.1, 10), Gate("grad w", 0.06, 0.05, 10), Gate("new_params", 2e-3, 1e-3, 10)]
    t = [Gate("param_update", 0.10, 0.1, 10), Gate("grad w", 0.06, 0.05, 10), Gate("new_params", 1e-3, 1e-3, 10)]
    fresh = attach_torch(g, t, "fresh")
    # 0.12 > 0.1 fails, whatever PyTorch scores; within 1.5 x PyTorch's 0.10 it is labelled torch-level
    assert not fresh[0].passed and fresh[0].torch_level and fresh[0].torch_passed
    assert fresh[0].result_text == "FAIL (torch-level: 1.20x torch)"
    assert not fresh[1].passed and not fresh[1].torch_level and fresh[1].torch_passed is False  # grads: no label
    assert not fresh[2].passed and not fresh[2].torch_level and fresh[2].result_text == "FAIL"  # 2e-3 > 1.5 x 1e-3
    trained = attach_torch(g, t, "trained")
    assert not trained[0].passed and not trained[0].torch_level  # trained: no label either
    assert attach_torch([Gate("param_update", 0.05, 0.1, 10)], t, "fresh")[0].result_text == "ok"
    assert attach_torch([Gate("param_update", math.nan, 0.1, 1)], t, "fresh")[0].passed is False
    with pytest.raises(ValueError):
        attach_torch(g, t, "warm")


def test_table_shows_the_torch_column_and_says_which_gates_pytorch_fails():
    gates = attach_torch([Gate("loss", 1e-5, 1e-2, 1), Gate("param_update", 0.12, 0.1, 10)],
                         [Gate("loss", 2e-5, 1e-2, 1), Gate("param_update", 0.11, 0.1, 10)], "fresh")
    text = GateTable("t", gates).format()
    assert "torch result" in text and "1.10e-01" in text and "FAIL (torch-level: 1.09x torch)" in text
    assert "PyTorch's own update on the same inputs FAILS 1: param_update" in text
    assert "1 FAILED" in text and "1 of the failures torch-level" in text
    plain = GateTable("t", [Gate("loss", 1e-5, 1e-2, 1)]).format()
    assert "torch" not in plain  # no column where nothing was measured


def test_graph_safe_grouped_product_matches_the_reference_and_its_gradients():
    from latch_check.torch_native import grouped_ragged_mm, native_route_order
    from latch_ops.moe.reference import (
        ragged_mm_grad_w_math, ragged_mm_grad_x_math, ragged_mm_math, route_order_math,
    )

    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(37)])  # uneven counts, one may be 0
    for a, b in zip(native_route_order(idx, 4), route_order_math(idx, 4)):
        assert torch.equal(a, b)
    _, _, offsets = route_order_math(idx, 4)
    x = torch.randn(74, 32, generator=g, requires_grad=True)
    w = torch.randn(4, 32, 16, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = grouped_ragged_mm(x, w, offsets)
    assert y.dtype == torch.bfloat16
    xb, wb = x.detach().bfloat16().double(), w.detach().bfloat16().double()
    ref = ragged_mm_math(xb, wb, offsets)
    assert (y.double() - ref).norm() / ref.norm() < 1e-2
    dy = torch.randn(74, 16, generator=g)
    y.backward(dy.bfloat16())
    dyb = dy.bfloat16().double()
    for got, want in ((x.grad, ragged_mm_grad_x_math(dyb, wb, offsets)), (w.grad, ragged_mm_grad_w_math(xb, dyb, offsets))):
        assert (got.double() - want).norm() / want.norm() < 1e-2


def test_cpu_qualification_small_transformer_gates_pytorch_bf16_on_the_same_reference():
    from latch_check.pipeline import compile_example
    from latch_check.qualify import cpu_tables

    c = compile_example(EXAMPLES / "transformer.py", overrides={"seq": 16}, build=False)
    fresh, trained = cpu_tables(c.example, c.doc, trained=3)
    assert "fresh state" in fresh.title and "trained state (3 FP32 updates)" in trained.title
    for t in (fresh, trained):
        rows = {g.group: g for g in t.gates}
        assert all(g.torch_rel is not None for g in t.gates)
        # BF16 rounding, not zero and not O(1): both the policy and PyTorch
        assert 1e-4 < rows["grad embed.weight"].rel_l2 < 3e-2 and 1e-4 < rows["grad embed.weight"].torch_rel < 3e-2
        assert t.passed
    assert fresh.gates[-1].step == 0 and trained.gates[-1].step == 3
    upd = {g.group: g for g in fresh.gates}["param_update"]
    assert upd.factor == FRESH_FACTOR
    assert {g.group: g for g in trained.gates}["param_update"].factor is None


def test_bench_shapes_parse_and_bad_ones_name_the_culprit():
    assert parse_shapes("2x1024, 32x1024,16x8x1024") == [(1, 2, 1024), (1, 32, 1024), (16, 8, 1024)]
    for bad in ("2y1024", "0x8", "1x2x3x4", ","):
        with pytest.raises(BenchError):
            parse_shapes(bad)


def test_bench_table_gives_ratios_and_shows_failed_controls():
    row = {"shape": "2x1024", "latch": {"median_ms": 2.0, "min_ms": 1.9, "max_ms": 2.2},
           "graph": {"median_ms": 5.0, "min_ms": 4.9, "max_ms": 5.1, "ratio_vs_latch": 2.5},
           "eager": {"error": "RuntimeError: boom"}}
    text = format_table([row], ("eager", "graph"))
    assert "2.500x" in text and "FAILED" in text and "2x1024 eager: RuntimeError: boom" in text
    assert "2.000 (1.900-2.200)" in text


def test_bench_times_back_to_back_beside_alone_and_tables_both(monkeypatch):
    """Run 35/36: the bench (each update alone, 11.63 ms) and the profile (11.16) disagreed; the
    alone timing holds the host's work before the launch. The back-to-back timing (the training
    loop's steady state) is taken beside it, its ratio against the control's back-to-back timing."""
    from latch_check import bench

    calls = []

    def fake_events(fn, iters, warmup, reps=1):
        calls.append(reps)
        return [10.0 / reps + 1.0] * iters  # host work counts fully alone, is hidden back to back

    monkeypatch.setattr(bench, "events_ms", fake_events)
    t = bench._times(lambda: None, 3, 0, back_to_back=5)
    assert calls == [1, 5] and t["median_ms"] == 11.0 and t["b2b"]["median_ms"] == 3.0 and t["b2b"]["reps"] == 5
    assert "b2b" not in bench._times(lambda: None, 3, 0)
    row = {"shape": "2x1024", "latch": {"median_ms": 2.0, "min_ms": 1.9, "max_ms": 2.2,
                                        "b2b": {"median_ms": 1.5, "min_ms": 1.4, "max_ms": 1.6, "reps": 5}},
           "graph": {"median_ms": 5.0, "min_ms": 4.9, "max_ms": 5.1, "ratio_vs_latch": 2.5,
                     "b2b": {"median_ms": 4.5, "min_ms": 4.4, "max_ms": 4.6, "reps": 5, "ratio_vs_latch": 3.0}},
           "eager": {"error": "RuntimeError: boom"}}
    text = format_table([row], ("eager", "graph"))
    alone, b2b = text.split("back to back (5 updates")
    assert "2.500x" in alone and "3.000x" not in alone and "3.000x" in b2b and "1.500 (1.400-1.600)" in b2b
    assert "FAILED" in b2b  # a failed control is failed in both tables


def test_eager_control_runs_tinymoe_with_the_graph_safe_moe_and_microbatches_on_the_cpu():
    from latch_capture.examples import load_example
    from latch_check.controls import control

    ex = load_example(EXAMPLES / "tinymoe.py", vocab=64, d_model=32, layers=1, heads=2, experts=4, expert_hidden=16,
                      batch=2, seq=16)
    before = {n: p.detach().clone() for n, p in ex.model.named_parameters()}
    with control(ex, "cpu", "eager", [ex.microbatch(0), ex.microbatch(1)]) as step:
        losses = [float(step()) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses) and abs(losses[0] - math.log(64)) < 0.5
    # the control trains a copy: the example's own weights are untouched
    assert all(torch.equal(before[n], p) for n, p in ex.model.named_parameters())


def test_compiled_control_traces_an_example_whose_model_spans_two_files():
    """TinyMoE's MoE (tinymoe.py, loaded under a private module name) inlined into transformer.py's
    Block: torch.compile imports the module of what it inlines (the H200 run of 2026-12-01 failed
    with ModuleNotFoundError before controls.importable). aot_eager: dynamo's tracing, no C++ build."""
    from latch_capture.examples import load_example
    from latch_check.controls import control

    ex = load_example(EXAMPLES / "tinymoe.py", vocab=64, d_model=32, layers=1, heads=2, experts=4, expert_hidden=16,
                      batch=2, seq=16)
    with control(ex, "cpu", "compiled", [ex.microbatch(0)], backend="aot_eager") as step:
        losses = [float(step()) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0]


def test_compiled_control_compiles_the_loss_with_the_model():
    """The strongest control must not run the objective eagerly: TinyMoE's cross-entropy outside
    torch.compile materialises FP32 copies of the logits (6.4 GB at 32 x 1024; the form every run up
    to 2026-12-06 timed, kept as ``graph_model``). A recording backend sees which aten ops the
    compiled graphs hold: the loss's log-softmax must be among them."""
    from latch_capture.examples import load_example
    from latch_check.controls import control

    seen: list[str] = []

    def recording_backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    ex = load_example(EXAMPLES / "transformer.py", vocab=64, d_model=32, layers=1, heads=2, batch=2, seq=16)
    with control(ex, "cpu", "compiled", [ex.microbatch(0)], backend=recording_backend) as step:
        losses = [float(step()) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0]
    assert any("cross_entropy" in t or "log_softmax" in t or "nll_loss" in t for t in seen), sorted(set(seen))[:40]


def test_controls_name_every_kind_and_refuse_an_unknown_one():
    from latch_capture.examples import load_example
    from latch_check.bench import CONTROLS, DEFAULT_CONTROLS
    from latch_check.controls import GRAPHED, KINDS, ControlError, control

    assert set(CONTROLS) == set(KINDS) and set(GRAPHED) <= set(KINDS) and "graph_model" not in DEFAULT_CONTROLS
    ex = load_example(EXAMPLES / "mlp.py")
    with pytest.raises(ControlError, match="graph_model"):
        with control(ex, "cpu", "graph-model"):
            pass


def test_compiled_control_at_a_second_shape_in_the_same_process():
    """A bench times its shapes in one process, each with its own load of the example. Run 35 (H200):
    the second shape's compiled and graph controls failed in dynamo ("'NoneType' object is not
    subscriptable": guards on the first load's module, cached by name). Fails without the per-load
    module name of latch_capture.examples.load_module."""
    from latch_capture.examples import load_example
    from latch_check.controls import control

    losses = []
    for batch in (2, 4):
        ex = load_example(EXAMPLES / "tinymoe.py", vocab=64, d_model=32, layers=1, heads=2, experts=4,
                          expert_hidden=16, batch=batch, seq=16)
        with control(ex, "cpu", "compiled", [ex.microbatch(0)], backend="aot_eager") as step:
            losses.append(float(step()))
    assert all(math.isfinite(v) for v in losses)


def test_compile_refuses_the_torch_column_on_the_cpu_and_names_the_cpu_tool():
    from click.testing import CliRunner

    from latch_core.cli import main

    r = CliRunner().invoke(main, ["compile", str(EXAMPLES / "mlp.py"), "--target", "sim", "--torch-column", "-q"])
    assert r.exit_code == 2 and "tools/qualify_gates.py" in r.output
    r = CliRunner().invoke(main, ["compile", str(EXAMPLES / "mlp.py"), "--target", "sim", "--trained", "5", "-q"])
    assert r.exit_code == 2 and "--trained" in r.output


def test_the_gates_line_counts_torch_level_failures_and_still_fails():
    from types import SimpleNamespace

    from latch_check.pipeline import verdict

    level = attach_torch([Gate("new_params", 1.4e-3, 1e-3, 10), Gate("loss", 1e-5, 1e-2, 1)],
                         [Gate("new_params", 1.5e-3, 1e-3, 10), Gate("loss", 1e-5, 1e-2, 1)], "fresh")
    wrong = attach_torch([Gate("grad w", 0.2, 0.05, 10)], [Gate("grad w", 0.01, 0.05, 10)], "fresh")
    both = SimpleNamespace(passed=False, tables=[GateTable("a", level), GateTable("b", wrong)])
    assert verdict(both) == ("FAIL (2 gates, 1 torch-level: PyTorch's own BF16 update fails them too, "
                             "docs/GATES.md)")
    assert verdict(SimpleNamespace(passed=False, tables=[GateTable("b", wrong)])) == "FAIL (1 gates)"
    assert verdict(SimpleNamespace(passed=True, tables=[GateTable("a", level[1:])])) == "PASS"


def test_cpu_qualification_of_transformers_mixtral_replays_pytorchs_own_topk():
    """transformers' Mixtral routes with its own torch.topk: PyTorch's choices are recorded and
    replayed in the reference, so the torch column is measured (it was 'not measured: PyTorch made
    0 routing decisions' on the H200, run 24)."""
    pytest.importorskip("transformers")
    from latch_check.pipeline import compile_example
    from latch_check.qualify import cpu_tables, torch_update

    c = compile_example(EXAMPLES / "hf_mixtral.py", build=False, routing=True)
    (fresh,) = cpu_tables(c.example, c.doc, simulate=False)
    assert all(g.torch_rel is not None for g in fresh.gates), fresh.format()
    grads = [g for g in fresh.gates if g.group.startswith("grad ")]
    assert grads and all(1e-4 < g.torch_rel < 3e-2 for g in grads), fresh.format()
    rec: list = []
    torch_update(c.example, c.example.params(), c.example.initial_state(), [c.example.microbatch(0)],
                 dict(c.example.hyper or {}), routing=rec)
    assert len(rec) == 2 and all(r.shape[-1] == 2 for r in rec)   # one top-2 per layer, in call order


def test_the_strongest_line_reports_both_graph_controls():
    from types import SimpleNamespace

    from latch_check.commands import _strongest_line

    compiled = SimpleNamespace(name="transformer", doc=SimpleNamespace(schedule=SimpleNamespace(strategy="barrier")))
    line = _strongest_line(compiled, {"compiled_graph_ms": 6.0, "latch_ms": 8.0, "compiled_graph_model_ms": 7.2})
    assert "compiled model and loss" in line and "6.0000 ms" in line and "0.750x" in line
    assert "loss outside torch.compile" in line and "7.2000 ms, 0.900x" in line
    failed = _strongest_line(compiled, {"compiled_graph_ms": 6.0, "latch_ms": 8.0,
                                        "compiled_graph_model_ms": "control failed: RuntimeError: x"})
    assert "control failed: RuntimeError: x" in failed


def test_bench_builds_the_store_products_variant_when_asked(monkeypatch):
    """``bench --store-products`` times the program built with products stored in BF16 (the
    option compile has): the flag reaches the pipeline and the row says which program it timed."""
    from latch_check import bench, pipeline

    seen = []
    real = pipeline.compile_example

    def spy(*a, **kw):
        seen.append(kw.get("store_products"))
        return real(*a, **kw)

    monkeypatch.setattr(pipeline, "compile_example", spy)
    small = {"vocab": 256, "d_model": 64, "layers": 1, "heads": 4, "experts": 4, "expert_hidden": 32}
    for flag in (True, False):
        row = bench.bench_shape(str(EXAMPLES / "tinymoe.py"), (1, 2, 16), overrides=small, iters=1, latch_iters=1,
                                controls=(), policy=True, scheduler=None, build_dir=None, say=lambda m: None,
                                latch=False, store_products=flag)
        assert row["store_products"] is flag and row["policy"] == "bf16"
    assert seen == [True, False]


def test_cpu_qualification_of_a_routed_program_replays_the_policys_own_routing(monkeypatch):
    """At the state after 20 updates a near-tie of block 0's top-2 flips under BF16 rounding: gated
    against the FREE FP64 routing, the policy's FFN and router gradients scored 0.14-0.22 (PyTorch's,
    replayed on its own routing, 7e-3). Each column is gated against the reference replaying its
    own decisions, as on the GPU (gpu._routed_run)."""
    from latch_check import reference
    from latch_check.pipeline import compile_example
    from latch_check.qualify import cpu_tables

    forced = []
    real = reference.run

    def spy(*a, **kw):
        if kw.get("force") is not None:
            forced.append(kw["force"])
        return real(*a, **kw)

    monkeypatch.setattr(reference, "run", spy)
    small = {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "experts": 4, "expert_hidden": 32,
             "batch": 2, "seq": 16}
    c = compile_example(EXAMPLES / "tinymoe.py", overrides=small, build=False)
    fresh, trained = cpu_tables(c.example, c.doc, trained=20, simulate=False)
    assert len(forced) == 4  # per state: the policy's routing and PyTorch's
    for t in (fresh, trained):
        rows = {g.group: g for g in t.gates}
        assert rows["grad blocks.0.ffn.router.weight"].rel_l2 < 2e-2, t.format()
        assert rows["grad blocks.0.ffn.w2"].rel_l2 < 2e-2, t.format()
        assert t.passed, t.format()
