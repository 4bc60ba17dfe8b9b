"""Matrix products through the whole CPU pipeline (issue 9's graph side): the BF16 policy stored as
casts, transposes folded into operand layouts, a body configuration per matmul, split-K.

- the transformer's planned document: every matmul reads BF16 tensors (weights cast once, read
  transposed through trans flags), no transpose copy of any weight or activation is left;
- the rewritten graphs compute what the captured ones do (FP64 reference, both programs);
- the examples pass the arena simulator's gates under both strategies with FP32 and BF16;
- a split-K product ([128, 4096] @ [4096, 256] on 132 SMs) simulates correctly and deterministically.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from latch_capture import batch_inputs, bind_inputs, program_inputs
from latch_capture.examples import load_example
from latch_check import reference
from latch_check.compare import _f64
from latch_check.simulator import check_example, simulate
from latch_core.lint import check as lint_check
from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.passes import run_pass
from latch_core.plugins import registries

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TRANSFORMER_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)
TINYMOE_SMALL = dict(vocab=64, d_model=32, layers=2, heads=4, experts=4, expert_hidden=16, batch=2, seq=8)
CASES = {"transformer": ("transformer.py", TRANSFORMER_SMALL), "tinymoe": ("tinymoe.py", TINYMOE_SMALL),
         "mlp": ("mlp.py", {}), "transformer_example": ("transformer.py", {})}
_cache: dict = {}


def _passes():
    return registries().passes


def _captured(case):
    if case not in _cache:
        path, kw = CASES[case]
        ex = load_example(EXAMPLES / path, **kw)
        _cache[case] = (ex, ex.capture(grads=True))
    return _cache[case]


REWRITE_SWITCHES = ("matmul_layouts", "matmul_configs", "split_reductions")


def _rewrites(doc, *, num_sms=132, matmul_layouts=True, matmul_configs=True, split_reductions=True, cost=None, **_):
    """The pipeline's graph rewrites before ``schedule`` (latch_core.pipeline), in its order."""
    if matmul_layouts:
        doc = run_pass(_passes().get("schedule.matmul_layouts"), doc)
    if split_reductions:
        doc = run_pass(_passes().get("schedule.split_reductions"), doc, num_sms=num_sms)
    if matmul_configs:
        doc = run_pass(_passes().get("schedule.matmul_configs"), doc, num_sms=num_sms, **(cost or {}))
    return doc


def _planned(case, *, policy=True, scheduler="barrier", num_sms=132, **sched):
    ex, doc = _captured(case)
    if policy:
        doc = run_pass(_passes().get("memory.policy"), doc)
    doc = _rewrites(doc, num_sms=num_sms, **sched)
    doc = run_pass(_passes().get("schedule"), doc, scheduler=scheduler, num_sms=num_sms,
                   **{k: v for k, v in sched.items() if k not in REWRITE_SWITCHES})
    doc = run_pass(_passes().get("memory.plan"), doc)
    run_pass(_passes().get("schedule.validate"), doc)
    lint_check(doc.graph, registries().ops, require_known_ops=True)  # every rewrite keeps the IR legal
    return ex, doc


def _matmuls(g):
    return [n for n in g.nodes if n.op == "latch::matmul"]


def _is_transpose(n):
    perm = n.attr("perm")
    return n.op == "latch::permute" and perm == tuple(range(len(perm) - 2)) + (len(perm) - 1, len(perm) - 2)


def test_transformer_matmuls_read_bf16_with_trans_flags_and_no_transpose_copies():
    _, doc = _planned("transformer_example")  # examples/transformer.py as shipped
    g = doc.graph.program("update")
    producers = g.producers()
    mms = _matmuls(g)
    assert mms
    for n in mms:
        assert [g.value(v).dtype for v in n.inputs] == ["bf16", "bf16"], n.name
        assert g.value(n.outputs[0]).dtype == "f32" and n.attr("out_dtype") == "f32", n.name
        assert n.attr("operand_dtype") == "bf16" and n.attr("accum_dtype") == "f32"
        assert isinstance(n.attr("config"), str), n.name
        for v in n.inputs:  # nothing transposes an operand on its way in
            p = producers.get(v)
            assert p is None or not _is_transpose(p), (n.name, p)
            if p is not None and p.op == "latch::reshape":
                q = producers.get(p.inputs[0])
                assert q is None or not _is_transpose(q), (n.name, q)
    assert sum(bool(n.attr("trans_b")) for n in mms) >= 7  # qkv, out, w1, w3, w2 (x2), LM head
    assert sum(bool(n.attr("trans_a")) for n in mms) >= 11  # weight gradients + tied LM head
    # weights: cast once, read as stored, never copied transposed
    params = set(g.group("params").values)
    casts = [n for n in g.nodes if n.op == "latch::cast" and n.inputs[0] in params]
    weights = {v for n in mms for v in n.inputs if producers.get(v) is not None
               and producers[v].op == "latch::cast" and producers[v].inputs[0] in params}
    assert len(casts) == len({n.inputs[0] for n in casts}) == len(weights) >= 11
    assert not any(n.op == "latch::permute" and (n.inputs[0] in params or n.inputs[0] in
                                                  {c.outputs[0] for c in casts}) for n in g.nodes)
    # and the memory plan holds no transposed copy of anything a matmul reads
    placed = {p.value for p in doc.memory.program("update").placements}
    assert not any(_is_transpose(n) and n.outputs[0] in placed for n in g.nodes)
    assert dict(dict(doc.graph.meta("schedule.matmul_layouts"))["update"])["folds"] >= 18
    rows = [dict(r) for r in dict(doc.graph.meta("matmul_configs"))["update"]]
    assert {r["node"] for r in rows} == {n.name for n in mms if not n.name.endswith(".partial")} | \
        {n.name.removesuffix(".partial") for n in mms if n.name.endswith(".partial")}
    assert all(r["config"].startswith("wgmma_128x") for r in rows)


def _inputs(ex, doc, name):
    flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state=_f64(ex.initial_state()),
                       inputs=ex.inputs, targets=ex.targets, hyper=dict(doc.graph.meta("hyper", ()) or ()))
    flat.update(batch_inputs(*ex.microbatch(0)))
    return program_inputs(doc.graph.program(name), flat)


@pytest.mark.parametrize("case", ["transformer", "tinymoe"])
@pytest.mark.parametrize("policy", [True, False])
def test_rewritten_graphs_compute_what_the_captured_ones_do(case, policy):
    ex, captured = _captured(case)
    _, doc = _planned(case, policy=policy)
    for g in captured.graph.programs:
        ins = _inputs(ex, captured, g.name)
        want = reference.run(captured, g.name, ins)
        got = reference.run(doc, g.name, ins)
        assert want.keys() == got.keys()
        for k in want:
            w, o = want[k], got[k]
            if w.is_floating_point():
                scale = w.abs().max().clamp_min(1e-30)
                assert (o - w).abs().max() / scale < 1e-12, k
            else:
                assert torch.equal(o, w), k


@pytest.mark.parametrize("scheduler", ["barrier", "dataflow"])
@pytest.mark.parametrize("policy", [True, False])
@pytest.mark.parametrize("case", ["transformer", "tinymoe"])
def test_examples_pass_the_simulator_gates_with_both_policies(case, policy, scheduler):
    ex, doc = _planned(case, policy=policy, scheduler=scheduler, num_sms=132)
    g = doc.graph.program(doc.graph.programs[0].name)
    if not policy:  # FP32: layouts fold all the same, operands stay f32
        assert all(g.value(v).dtype == "f32" for n in _matmuls(g) for v in n.inputs)
        assert any(n.attr("trans_b") for n in _matmuls(g)) and not any(n.op == "latch::cast" and
                                                                        n.attr("dtype") == "bf16" for n in g.nodes)
    result = check_example(ex, doc, steps=1, seed=5)
    assert result.passed, result.format()


# ---------------------------------------------------------------------------------------------
# Split-K


def _product_doc(m=128, k=4096, n=256, then=None) -> Document:
    vals = [Value("a", (m, k), "f32", "batch"), Value("b", (k, n), "f32", "param"), Value("y", (m, n), "f32")]
    nodes = [Node("mm", "latch::matmul", ("a", "b"), ("y",), source="t.py:1 in f")]
    out = "y"
    if then:  # y feeds another product only: the policy has the first one write bf16
        vals += [Value("c", (n, then), "f32", "param"), Value("z", (m, then), "f32")]
        nodes.append(Node("mm2", "latch::matmul", ("y", "c"), ("z",), source="t.py:2 in f"))
        out = "z"
    params = ["b"] + (["c"] if then else [])
    g = Graph("update", vals, nodes, [Group("params", params), Group("batch", ["a"])], [Group("loss", [out])])
    return Document(graph=GraphSection([g]))


@pytest.mark.parametrize("then", [None, 64])
def test_split_k_simulates_correctly_and_deterministically(then):
    doc0 = _product_doc(then=then)
    doc = run_pass(_passes().get("memory.policy"), doc0, master=None)
    doc = _rewrites(doc, num_sms=132, cost={"cost_split_k_choices": (1, 2, 4, 8, 16)})  # split-K is opt-in
    doc = run_pass(_passes().get("schedule"), doc, num_sms=132)
    g = doc.graph.program("update")
    part = next(n for n in g.nodes if n.name == "mm.partial")
    s = part.attr("split_k")
    assert s >= 2 and g.value(part.outputs[0]).shape == (s, 128, 256)
    assert part.attr("config").startswith("wgmma_") and part.attr("out_dtype") == "f32"
    tail = [n.op for n in g.nodes if n.name.startswith("mm") and n.name != "mm2"]
    assert tail == (["latch::matmul"] + ["latch::select"] * s + ["latch::add"] * (s - 1)
                    + (["latch::cast"] if then else []))
    rows = dict(doc.graph.meta("matmul_configs"))["update"]
    row = dict(next(r for r in rows if dict(r)["node"] == "mm"))
    assert row["split_k"] == s and row["tiles"] < 132 * row["waves"] + 1
    doc = run_pass(_passes().get("memory.plan"), doc)
    run_pass(_passes().get("schedule.validate"), doc)
    lint_check(doc.graph, registries().ops, require_known_ops=True)
    torch.manual_seed(0)
    ins = {v: torch.randn(doc0.graph.program("update").value(v).shape, dtype=torch.float64)
           for v in doc0.graph.program("update").input_names()}
    want = reference.run(doc0, "update", ins)  # the product as captured: no casts, no split
    runs = [simulate(doc, "update", ins, seed) for seed in (0, 1)]
    out = runs[0]["z" if then else "y"]
    ref = want["z" if then else "y"]
    assert ((out - ref).norm() / ref.norm()).item() < 1e-13
    for other in runs[1:]:  # other interleavings of the tasks, bit for bit the same result
        assert all(torch.equal(runs[0][k], other[k]) for k in runs[0])


def test_options_turn_the_rewrites_off():
    _, doc = _planned("mlp", policy=True, matmul_layouts=False, matmul_configs=False)
    g = doc.graph.program("update")
    assert not any(n.attr("trans_a") or n.attr("trans_b") or n.attr("config") for n in _matmuls(g))
    assert any(_is_transpose(n) for n in g.nodes)
    assert doc.graph.meta("matmul_configs") is None and doc.graph.meta("schedule.matmul_layouts") is None
