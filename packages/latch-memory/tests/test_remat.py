"""memory.remat: lower peaks under a budget, identical results (FP64), honest reports."""

import pytest

from latch_core.document import program_doc
from latch_core.lint import check
from latch_core.passes import run_pass
from latch_memory.plugin import REMAT
from latch_memory.remat import RematError, estimate, remat_program
from latch_memory.testing import evaluate, mlp_graph, random_inputs, test_registry, two_weight_graph

REG = test_registry()


def _same_results(g1, g2):
    torch = pytest.importorskip("torch")
    ins = random_inputs(g1, seed=3)
    a, b = evaluate(g1, ins, REG), evaluate(g2, ins, REG)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_estimate_counts_intermediates_only():
    g = two_weight_graph(with_const=False)
    est = estimate(g)
    # at the last node the outputs loss, g1, g2 are live; inputs and the new weights (written in
    # place into the old weights' buffers) are not counted
    assert est.profile[-1] == 4 * (1 + 4 * 6 + 6 * 3)
    assert est.sizes["w1_new"] == 0 and est.sizes["g1"] == 4 * 4 * 6


@pytest.mark.parametrize("layers", [2, 4])
def test_remat_lowers_the_peak_and_keeps_results(layers):
    g = mlp_graph(layers=layers, batch=64, width=16)
    before = estimate(g).peak
    g2, st = remat_program(g, REG, budget_bytes=0)
    check(g2, REG, require_known_ops=True)
    assert st["peak_before"] == before and st["peak_after"] == estimate(g2).peak < before
    assert st["recomputed"] >= 1 and st["met"] is False  # budget 0 cannot be met: said, not hidden
    # only cheap ops were duplicated: the matmuls are as many as before
    mm = lambda gr: sum(n.op == "test::matmul" for n in gr.nodes)  # noqa: E731
    assert mm(g2) == mm(g)
    _same_results(g, g2)


def test_budget_met_stops_early_and_generous_budget_changes_nothing():
    g = mlp_graph(layers=4, batch=64, width=16)
    peak = estimate(g).peak
    g2, st = remat_program(g, REG, budget_bytes=int(peak * 0.75))
    assert st["met"] and st["peak_after"] <= peak * 0.75
    g3, st3 = remat_program(g, REG, budget_bytes=peak)
    assert g3 == g and st3["recomputed"] == 0 and st3["peak_after"] == peak


def test_tags_limit_what_is_recomputed():
    g = mlp_graph(layers=4, batch=64, width=16)
    g2, st = remat_program(g, REG, budget_bytes=0, tags=("view",))
    assert all(n.op in ("test::transpose",) for n in g2.nodes if ".remat" in n.name)
    _same_results(g, g2)


def test_pass_reports_in_metadata_and_strict_fails():
    doc = program_doc(mlp_graph(layers=3, batch=64, width=16))
    out = run_pass(REMAT, doc, budget_bytes=20000, registry=REG)
    rep = dict(dict(dict(out.graph.metadata)["memory.remat"])["update"])
    assert rep["peak_after"] < rep["peak_before"] and rep["budget_bytes"] == 20000
    with pytest.raises(RematError, match=r"program 'update' peak \d+ bytes > budget 10"):
        run_pass(REMAT, doc, budget_bytes=10, strict=True, registry=REG)
    with pytest.raises(RematError, match="budget_bytes must be"):
        run_pass(REMAT, doc, budget_bytes=-1, registry=REG)


def test_the_pass_without_a_budget_names_the_option():
    """`passes memory.remat` without -O memory.remat.budget_bytes=N: a user's error naming the option
    (it was a TypeError traceback)."""
    from latch_core.document import Document

    from latch_memory.remat import remat_pass

    with pytest.raises(RematError, match="budget_bytes=N"):
        remat_pass(Document())
