"""A scatter's task walks every index to find what lands in its tile (latch-codegen-h100's scatter
bodies), so the scheduler prices each task with that walk (Tiling.task_bytes): at 32 x 1024 the
inverse permutation of TinyMoE-200M's MoE backward (a scatter of 65,536 indices in 40 tasks) was
modelled at 1.3-2.6 us a task and ran ~90 us, and LPT stacked up to five of them on one SM
(results/runs/run53-phases-32x1024.txt, interval 11: 473 us against an oracle of 169)."""

from __future__ import annotations

from latch_core import plugins
from latch_core.ir import Graph, Group, Node, Value
from latch_schedule import tasks
from latch_schedule.tiling import CostModel


def _scatter_graph(n: int) -> Graph:
    values = [Value("base", (n,), "i64", "batch"), Value("idx", (n,), "i64", "batch"),
              Value("src", (n,), "i64", "batch"), Value("out", (n,), "i64")]
    nodes = [Node("inverse", "latch::scatter", ("base", "idx", "src"), ("out",), {"dim": 0})]
    return Graph("update", values, nodes, (Group("batch", ("base", "idx", "src")),), (Group("metrics", ("out",)),))


def test_every_scatter_task_costs_the_walk_of_its_index():
    n = 65536
    tg = tasks.build(_scatter_graph(n), plugins.registries().ops, num_sms=132)
    walk = n * 8 / CostModel().sm_bytes  # the index, read whole by every task
    assert len(tg.tiles) > 1
    assert all(c >= walk for c in tg.cost), (walk, tg.cost[:4])
    assert sum(tg.cost) >= len(tg.tiles) * walk
