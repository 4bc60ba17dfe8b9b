"""The arena simulator on gathers split into several tasks (embedding, index_select): each task reads
only its rows of the index tensor, so the index elements outside them are poisoned; the simulator
fills them with indices the task did read, twice, and an output that differs between the two
fillings depends on unread indices (a footprint too small), which must show."""

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("latch_schedule")
pytest.importorskip("latch_memory")

from latch_capture import Example, tensor_update  # noqa: E402
from latch_check.simulator import check_example, prepare, simulate  # noqa: E402
from latch_core.sections import Access  # noqa: E402

V, D = 64, 256


class Gathers(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.out = nn.Linear(D, V)

    def forward(self, t):
        rows = self.emb.weight.index_select(0, t.reshape(-1)).reshape(*t.shape, D)
        return self.out(self.emb(t) + rows)


def _sgd(params, grads, state, hyper):
    return {n: p - 0.1 * grads[n] for n, p in params.items()}, state


@pytest.fixture(scope="module")
def planned():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tokens, targets = torch.randint(0, V, (4, 256), generator=g), torch.randint(0, V, (4, 256), generator=g)
    ex = Example(model=Gathers(), objective=lambda o, y: F.cross_entropy(o.reshape(-1, V), y.reshape(-1)),
                 inputs=tokens, targets=targets, optimizer=tensor_update(_sgd), name="gathers")
    return ex, prepare(ex.capture(grads=True))


def _nodes(doc):
    return {n.name: n for n in doc.graph.program("update").nodes}


def _gather_groups(doc):
    ps, nodes = doc.schedule.program("update"), _nodes(doc)
    return ps, {grp.id: grp for grp in ps.groups
                if any(nodes[n].op in ("latch::embedding", "latch::index_select") for n in grp.nodes)}


def test_split_gathers_match_fp64(planned):
    ex, doc = planned
    ps, groups = _gather_groups(doc)
    assert groups, "the model has an embedding and an index_select"
    for gid in groups:
        assert sum(1 for t in ps.tasks if t.group == gid) > 1, "each gather is split into several tasks"
    result = check_example(ex, doc, steps=1)
    assert result.passed, result.format()


def test_an_index_footprint_too_small_shows_as_nan(planned):
    ex, doc = planned
    ps, groups = _gather_groups(doc)
    nodes = _nodes(doc)
    gid = next(g for g, grp in groups.items() if nodes[grp.nodes[0]].op == "latch::embedding")
    idx = nodes[groups[gid].nodes[0]].inputs[1]
    tasks, shrunk = [], False
    for t in ps.tasks:
        wide = [a for a in t.reads if a.value == idx and any(hi - lo > 1 for lo, hi in a.box)]
        if t.group == gid and not shrunk and wide:
            # claim the task reads only the first half of its index box along a dim wider than one
            # (the simulator fills the unread indices with the smallest and then the largest read
            # one: a half keeps several distinct values read)
            reads = []
            for a in t.reads:
                if a.value == idx:
                    d = next(k for k, (lo, hi) in enumerate(a.box) if hi - lo > 1)
                    box = list(a.box)
                    box[d] = (box[d][0], (box[d][0] + box[d][1]) // 2)
                    a = Access(a.value, tuple(box))
                reads.append(a)
            t, shrunk = attrs.evolve(t, reads=reads), True
        tasks.append(t)
    assert shrunk, "no embedding task reads more than one index row: the test needs one"
    bad = attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, tasks=tasks)]))
    from latch_capture import bind_inputs, program_inputs

    from latch_check.compare import _f64

    g = doc.graph.program("update")
    flat = bind_inputs(doc, params={n: _f64(p) for n, p in ex.params().items()}, state={}, inputs=ex.inputs,
                       targets=ex.targets)
    out = simulate(bad, "update", program_inputs(g, flat), 0)
    assert torch.isnan(out["loss"]).all()
