"""moe.fixed_order_scatters keeps the update PyTorch's: TinyMoE (small) with the rewrite, against
eager PyTorch in FP64, at top-2 and top-3; and no index_add is left in its MoE layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from latch_capture.examples import load_example
from latch_core.lint import lint_section
from latch_core.plugins import registries
from latch_check.compare import compare
from latch_ops.moe.scatter import fixed_order_scatters_pass

ROOT = Path(__file__).resolve().parents[3]
SMALL = dict(d_model=32, heads=2, experts=4, expert_hidden=16, vocab=64, layers=1, seq=8, batch=2)


@pytest.mark.parametrize("top_k", [2, 3])
def test_the_rewritten_update_matches_eager_pytorch(top_k):
    ex = load_example(str(ROOT / "examples" / "tinymoe.py"), top_k=top_k, **SMALL)
    doc = ex.capture(grads=True)
    g0 = doc.graph.program("update")
    assert sum(n.op == "latch::index_add" for n in g0.nodes) == 2  # dispatch and combine backward
    new, said = fixed_order_scatters_pass(doc)
    g = new.graph.program("update")
    assert said.startswith("2 MoE scatters") and not any(n.op == "latch::index_add" for n in g.nodes)
    assert sum(n.op == "latch::gather_sum" for n in g.nodes) == 1  # the dispatch's gradient back to tokens
    assert lint_section(new.graph, registries().ops, require_known_ops=True) == []
    res = compare(ex, doc=new, steps=2)
    assert res.passed, res.format()
