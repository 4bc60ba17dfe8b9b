"""schedule.matmul_layouts: which transposes fold into a matmul's trans flags, which never do, and
that the pass is pure. (Numerics of the folded graphs against FP64: tests/test_matmul_pipeline.py.)"""

from __future__ import annotations

import attrs
import pytest

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_schedule.layouts import fold_layouts, is_leading_reshape, is_transpose, layouts_pass


class G:
    """A raw graph of latch:: op names (the pass reads names, shapes and attributes only)."""

    def __init__(self):
        self.values, self.nodes, self.inputs = [], [], []

    def input(self, name, shape, role="param"):
        self.values.append(Value(name, shape, "f32", role))
        self.inputs.append(name)
        return name

    def node(self, op, ins, out_shape, name, **attr):
        self.values.append(Value(name, out_shape, "f32"))
        self.nodes.append(Node(name, f"latch::{op}", ins, (name,), attr, source=f"t.py:{len(self.nodes)}"))
        return name

    def graph(self, *outs):
        return Graph("update", self.values, self.nodes, [Group("params", self.inputs)], [Group("loss", outs)])


def _node(g, name):
    return next(n for n in g.nodes if n.name == name)


def test_forward_and_weight_gradient_forms_fold():
    b = G()
    x, w, dy = b.input("x", (64, 32)), b.input("w", (48, 32)), b.input("dy", (64, 48))
    t = b.node("permute", [w], (32, 48), "t", perm=(1, 0))
    y = b.node("matmul", [x, t], (64, 48), "y")  # x @ w.T
    dt = b.node("permute", [dy], (48, 64), "dt", perm=(1, 0))
    dw = b.node("matmul", [dt, x], (48, 32), "dw")  # dy.T @ x
    dx = b.node("matmul", [dy, w], (64, 32), "dx")  # unchanged
    g2, folds, removed = fold_layouts(b.graph(y, dw, dx))
    assert _node(g2, "y").inputs == ("x", "w") and _node(g2, "y").attr_dict == {"trans_b": True}
    assert _node(g2, "dw").inputs == ("dy", "x") and _node(g2, "dw").attr_dict == {"trans_a": True}
    assert _node(g2, "dx").attr_dict == {}
    assert sorted(removed) == ["dt", "t"] and not any(n.op == "latch::permute" for n in g2.nodes)
    assert not g2.has_value("t") and not g2.has_value("dt")
    assert [(f["node"], f["operand"], f["through"]) for f in folds] == [("y", "b", ("t",)), ("dw", "a", ("dt",))]


def test_a_permute_with_other_readers_stays_and_a_double_transpose_cancels():
    b = G()
    x, w = b.input("x", (8, 4)), b.input("w", (4, 8))
    t = b.node("permute", [w], (8, 4), "t", perm=(1, 0))
    tt = b.node("permute", [t], (4, 8), "tt", perm=(1, 0))
    y = b.node("matmul", [x, tt], (8, 8), "y")
    z = b.node("add", [t, x], (8, 4), "z")  # t is read elsewhere: it stays
    g2, _, removed = fold_layouts(b.graph(y, z))
    assert _node(g2, "y").inputs == ("x", "w") and _node(g2, "y").attr_dict == {}  # two flips
    assert removed == ["tt"] and g2.has_value("t")


def test_batched_transpose_under_a_leading_reshape_folds_exactly():
    b = G()
    q, k = b.input("q", (2, 3, 5, 4)), b.input("k", (2, 3, 5, 4))
    kt = b.node("permute", [k], (2, 3, 4, 5), "kt", perm=(0, 1, 3, 2))
    kr = b.node("reshape", [kt], (6, 4, 5), "kr", shape=(6, 4, 5))
    qr = b.node("reshape", [q], (6, 5, 4), "qr", shape=(6, 5, 4))
    s = b.node("matmul", [qr, kr], (6, 5, 5), "s")  # q @ k^T per head
    g2, folds, removed = fold_layouts(b.graph(s))
    n = _node(g2, "s")
    assert n.attr_dict == {"trans_b": True}
    new = next(m for m in g2.nodes if n.inputs[1] in m.outputs)
    assert new.op == "latch::reshape" and new.inputs == ("k",) and g2.value(n.inputs[1]).shape == (6, 5, 4)
    assert sorted(removed) == ["kr", "kt"]
    idx = [m.name for m in g2.nodes]
    assert idx.index(new.name) < idx.index("s")  # defined before its reader


@pytest.mark.parametrize("perm", [(0, 2, 1), (1, 0, 2), (2, 1, 0)])
def test_permutes_that_move_other_dims_never_fold(perm):
    b = G()
    x = b.input("x", (4, 4, 4))
    p = b.node("permute", [x], (4, 4, 4), "p", perm=perm)
    y = b.node("matmul", [x, p], (4, 4, 4), "y")
    g2, folds, _ = fold_layouts(b.graph(y))
    assert (folds != []) == (perm == (0, 2, 1)), perm


def test_a_reshape_touching_the_last_dims_never_folds():
    b = G()
    x, w = b.input("x", (6, 8)), b.input("w", (4, 12))
    t = b.node("permute", [w], (12, 4), "t", perm=(1, 0))
    r = b.node("reshape", [t], (8, 6), "r", shape=(8, 6))  # regroups the matrix itself
    y = b.node("matmul", [x, r], (6, 6), "y")
    g = b.graph(y)
    assert fold_layouts(g)[1] == []
    assert not is_leading_reshape(g, _node(g, "r")) and is_transpose(_node(g, "t"))


def test_a_program_output_permute_is_kept_and_the_pass_is_pure():
    b = G()
    x, w = b.input("x", (8, 4)), b.input("w", (8, 4))
    t = b.node("permute", [w], (4, 8), "t", perm=(1, 0))
    y = b.node("matmul", [x, t], (8, 8), "y")
    doc = Document(graph=GraphSection([b.graph(y, t)]))
    before = attrs.evolve(doc)
    out, _ = layouts_pass(doc)
    assert doc == before  # never mutates its input
    g2 = out.graph.programs[0]
    assert _node(g2, "y").attr_dict == {"trans_b": True} and g2.has_value("t")
    meta = dict(dict(out.graph.metadata)["schedule.matmul_layouts"])
    assert dict(meta["update"])["folds"] == 1
    assert layouts_pass(out)[0] == out  # nothing left to fold
