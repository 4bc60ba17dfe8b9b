"""bench-matmul's document (no GPU): the split-K variants it adds, renamed apart from the timed
programs, are planned and validated with the rest, and only where the cost model would split."""

from __future__ import annotations

from latch_check.bench_matmul import bf16_gate, cases, matmul_document, plan_document, split_name


def _names(doc):
    return {g.name for g in doc.graph.programs}


def test_split_variants_where_the_model_splits_and_nowhere_else():
    cl = [c for c in cases(2048) if c.name in ("lm_head.dgrad.2048", "qkv.dgrad.2048")]
    doc = plan_document(matmul_document(cl), 132)
    names = _names(doc)
    # the LM head's input gradient at 2 x 1024 tokens has 96 tiles of 128 x 128 on 132 SMs and
    # K = 49,152: the model splits it; QKV's input gradient (288 tiles) it does not
    assert f"{split_name('lm_head.dgrad.2048')}.x1" in names
    assert not any(n.startswith(split_name("qkv.dgrad.2048")) for n in names)
    # the variant is the other choice: whole (split-K off); the timed program itself is split
    g = doc.graph.program(f"{split_name('lm_head.dgrad.2048')}.x1")
    ops = [n.op for n in g.nodes]
    assert ops.count("latch::matmul") == 1 and "latch::add" not in ops
    assert not any(n.attr("split_k") for n in g.nodes) and g.nodes[0].attr("config")
    # renamed apart: every value and node of the variant carries its own name; inputs are shared
    assert all(v.name.startswith(split_name("lm_head.dgrad.2048")) or v.name.startswith("lm_head.dgrad.2048.")
               for v in g.values)
    assert {o for grp in g.outputs for o in grp.values} == {f"{split_name('lm_head.dgrad.2048')}.x1.out0"}
    plain = doc.graph.program("lm_head.dgrad.2048.x1")
    part = next(n for n in plain.nodes if n.op == "latch::matmul")
    assert part.attr("split_k") > 1 and part.attr("config") and "latch::add" in [n.op for n in plain.nodes]
    assert doc.schedule is not None and doc.memory is not None


def test_no_split_variants_when_asked_not_to():
    cl = [c for c in cases(2048) if c.name == "lm_head.dgrad.2048"]
    doc = plan_document(matmul_document(cl), 132, split_k=False)
    assert not any("@split" in n for n in _names(doc))


def test_the_bf16_gate_follows_torch_and_has_a_floor():
    assert bf16_gate(1.7e-3) == 4e-3
    assert bf16_gate(3e-3) == 6e-3


def test_cases_group_by_layout_in_order():
    from latch_check.bench_matmul import case_groups

    g = case_groups(cases(2048) + cases(32768))
    assert list(g) == ["fwd", "dgrad", "wgrad"]
    assert [c.name for c in g["fwd"]][:2] == ["qkv.fwd.2048", "attn_out.fwd.2048"]
    assert sum(len(v) for v in g.values()) == 24 and all(len(v) == 8 for v in g.values())


def test_forced_configs_and_classic_variants_sit_beside_the_default():
    """The LM head at 8 x 1024 tokens, not the 32 x 1024 of bench-matmul's ``--classic`` example:
    the claims are about the program families and the configuration choice, which follows K (768
    forward, 49,152 input gradient); at either size the same 17 programs come out with the same
    choices asserted below (at 8 x 1024 no split-K variant either: the input gradient has enough
    tiles), and the plan has a quarter of the tasks (206k against 824k; 25 s -> ~6 s on 2 cores)."""
    from latch_check.bench_matmul import classic_name, config_fits, forced_name

    T = 8192
    cl = [c for c in cases(T) if c.name in (f"lm_head.fwd.{T}", f"lm_head.dgrad.{T}")]
    pp = "wgmma_pp_128x512x64"
    doc = plan_document(matmul_document(cl, configs=[pp, "wgmma_128x96x64"]), 132, classic=True)
    names = _names(doc)
    fwd, dgrad = f"lm_head.fwd.{T}", f"lm_head.dgrad.{T}"
    assert len(names) == 17 and not any("@split" in n for n in names), sorted(names)
    # forced: every program family, checked too, where the configuration fits the layout (BN 96 needs b [N, K])
    for suffix in ("check", "x1", "x2"):
        assert f"{forced_name(fwd, pp)}.{suffix}" in names and f"{forced_name(dgrad, pp)}.{suffix}" in names
    assert config_fits(cl[0], "wgmma_128x96x64") and not config_fits(cl[1], "wgmma_128x96x64")
    assert f"{forced_name(fwd, 'wgmma_128x96x64')}.x1" in names
    assert not any(n.startswith(forced_name(dgrad, "wgmma_128x96x64")) for n in names)
    g = doc.graph.program(f"{forced_name(dgrad, pp)}.x1")
    assert {n.attr("config") for n in g.nodes if n.op == "latch::matmul"} == {pp}
    # the default takes ping-pong for the forward (K 768) and not for the input gradient (K 49,152);
    # the classic variant exists only where it did, and is the cooperative choice
    cfg = lambda p: next(n.attr("config") for n in doc.graph.program(p).nodes if n.op == "latch::matmul")  # noqa: E731
    assert cfg(f"{fwd}.x1").startswith("wgmma_pp_") and not cfg(f"{dgrad}.x1").startswith("wgmma_pp_")
    assert cfg(f"{classic_name(fwd)}.x1") == "wgmma_128x256x64"
    assert not any(n.startswith(classic_name(dgrad)) for n in names)
    assert doc.schedule is not None and doc.memory is not None


def test_run_case_rows_for_forced_and_classic_variants_without_a_gpu(monkeypatch):
    """run_case's bookkeeping for the variant rows, on the CPU: a stand-in program computes each
    product with torch (the forced variant exactly, the classic one with a wrong element) and the
    timers are stubbed; the rows carry their own gates and the forced row its FP32 check."""
    import torch

    import latch_check.bench_matmul as bm
    from latch_check.bench_matmul import Case, classic_name, forced_name, run_case

    c = Case("t.fwd.64", 64, 32, 16, tb=True)
    forced, classic = forced_name(c.name, "wgmma_pp_128x256x64"), classic_name(c.name)

    class Prog:
        device = "cpu"

        def launch(self, name, batch):
            self.batch = batch

        def check(self):
            pass

        def outputs(self, name, batch):
            a, b = batch[f"{c.name}.a"], batch[f"{c.name}.b"]
            y = torch.mm(a.double(), b.double().t()).float()
            if name.startswith(classic):
                y[3, 5] += 100.0  # a wrong element: its row must fail its gate
            return {f"{name}.out0": y}

    times = iter(range(1, 1000))
    monkeypatch.setattr(bm, "median_ms", lambda fn, iters: fn() or float(next(times)))

    class Graph:
        def replay(self):
            pass

    monkeypatch.setattr(bm, "capture_graph", lambda fn, warmup, device: Graph())
    row = run_case(Prog(), c, 3, seed=0, variants=[(forced, True), (classic, False)])
    v = {r["case"]: r for r in row["variants"]}
    assert set(v) == {forced, classic} and row["ok"]
    assert v[forced]["ok"] and v[forced]["rel_l2"] < 1e-6 and v[forced]["latch_ms"] > 0
    assert not v[classic]["ok"] and v[classic]["rel_l2"] != v[classic]["rel_l2"]  # NaN: no FP32 check
    assert all(r["R"] == row["R"] and r["torch_ms"] == row["torch_ms"] for r in v.values())
    assert bm.format_table(row["variants"]).count("WRONG") == 1
