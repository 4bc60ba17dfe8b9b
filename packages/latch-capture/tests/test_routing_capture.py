"""``routing=True``: every routing decision (the expert indices of each ``latch::token_topk``) is a
program output, in the group ``routing``, in every program; the decisions still feed the graph and
the update computes the same values as without the option."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latch_capture import CaptureError, Example, capture_module, tensor_update
from latch_core.lint import lint_section
from latch_ops.moe.torch_ops import ragged_mm, route_order, token_topk


class Routed(nn.Module):
    """Two top-2 softmax-routed layers of tanh experts: two routing decisions per forward."""

    def __init__(self, d=6, experts=4, hidden=5, k=2):
        super().__init__()
        torch.manual_seed(0)
        self.k, self.experts = k, experts
        self.routers = nn.ModuleList(nn.Linear(d, experts, bias=False) for _ in range(2))
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


def _capture(**kw):
    torch.manual_seed(1)
    return capture_module(Routed(), mse, torch.randn(10, 6), torch.randn(10, 6), optimizer=tensor_update(sgd),
                          hyper={"lr": 0.1}, **kw)


def _routing(g):
    return [grp.values for grp in g.outputs if grp.name == "routing"]


def test_routing_group_holds_every_token_topk_decision(ops):
    doc = _capture(grads=True, routing=True)
    assert lint_section(doc.graph, ops, require_known_ops=True) == []
    g = doc.graph.program("update")
    assert [grp.name for grp in g.outputs] == ["new_params", "loss", "grads", "routing"]
    topk = [n for n in g.nodes if n.op == "latch::token_topk"]
    assert len(topk) == 2
    names = g.group("routing", outputs=True).values
    assert names == tuple(f"routing.{n.name}" for n in topk)
    for n, name in zip(topk, names):
        assert n.outputs[1] == name  # the indices output itself, renamed, not a copy
        v = g.value(name)
        assert v.dtype == "i64" and v.shape == (10, 2)
        readers = {c.op for c in g.consumers()[name]}
        assert "latch::route_order" in readers and "latch::token_topk_backward" in readers


def test_without_routing_nothing_changes():
    g = _capture(grads=True).graph.program("update")
    assert _routing(g) == []
    assert not any(v.name.startswith("routing.") for v in g.values)


def test_every_microbatch_program_outputs_its_routing():
    torch.manual_seed(1)
    doc = capture_module(Routed(), mse, torch.randn(5, 6), torch.randn(5, 6), optimizer=tensor_update(sgd),
                         hyper={"lr": 0.1}, microbatches=3, routing=True)
    acc, last = doc.graph.program("accumulate"), doc.graph.program("accumulate_and_update")
    assert [grp.name for grp in acc.outputs] == ["new_state", "loss", "routing"]
    assert [grp.name for grp in last.outputs] == ["new_params", "new_state", "loss", "routing"]
    for g in (acc, last):
        assert len(g.group("routing", outputs=True).values) == 2
        assert all(g.value(n).shape == (5, 2) for n in g.group("routing", outputs=True).values)


def test_routed_capture_is_the_same_graph_with_named_decisions():
    """The option only names values: same nodes, same ops and attributes, same order; the values the
    program computes do not change (latch-check's routing tests run both through the reference)."""
    plain = _capture(grads=True).graph.program("update")
    routed = _capture(grads=True, routing=True).graph.program("update")
    assert [(n.op, n.attrs) for n in plain.nodes] == [(n.op, n.attrs) for n in routed.nodes]
    renamed = {a: b for p, r in zip(plain.nodes, routed.nodes) for a, b in zip(p.outputs, r.outputs) if a != b}
    assert sorted(renamed.values()) == sorted(routed.group("routing", outputs=True).values)
    assert plain.output_names() == [n for n in routed.output_names() if not n.startswith("routing.")]


def test_example_capture_passes_routing_through():
    torch.manual_seed(1)
    ex = Example(model=Routed(), objective=mse, inputs=torch.randn(4, 6), targets=torch.randn(4, 6),
                 optimizer=tensor_update(sgd), hyper={"lr": 0.1}, name="routed")
    g = ex.capture(grads=True, routing=True).graph.program("update")
    assert len(g.group("routing", outputs=True).values) == 2 and g.group("grads", outputs=True).values


def test_routing_without_a_router_is_an_error():
    model = nn.Linear(3, 3)
    with pytest.raises(CaptureError, match=r"routing=True.*no latch::token_topk") as e:
        capture_module(model, mse, torch.randn(2, 3), torch.randn(2, 3), optimizer=tensor_update(sgd),
                       hyper={"lr": 0.1}, routing=True)
    assert "capture without routing" in str(e.value)


def test_auto_routing_outputs_decisions_exactly_when_the_update_routes():
    assert _capture(routing="auto").graph == _capture(routing=True).graph
    plain = capture_module(nn.Linear(3, 3), mse, torch.randn(2, 3), torch.randn(2, 3), optimizer=tensor_update(sgd),
                           hyper={"lr": 0.1}, routing="auto")
    assert all(not _routing(g) or _routing(g) == [()] for g in plain.graph.programs)
