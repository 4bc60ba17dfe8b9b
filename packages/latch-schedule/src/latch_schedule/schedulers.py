"""The registered schedulers: ``fn(doc, options) -> ScheduleSection`` (CONTRACTS.md section 3).

Options shared by the built-in strategies:
- ``num_sms`` (int, default 132): SMs the grid has (one persistent block per SM);
- ``fuse`` (bool, default True): fuse elementwise chains (:mod:`latch_schedule.fusion`);
- ``alias_views`` (bool, default True): contiguous views become their reader's alias prefix
  (:mod:`latch_schedule.fusion`), not copy tasks;
- ``row_groups`` (bool, default True): a row reduction, the chain on its per-row statistic and
  their broadcast consumer form one group whose tasks cover whole rows
  (:mod:`latch_schedule.rowgroups`: RMSNorm reads x once);
- ``fuse_concat`` (bool, default True): ``latch::concat`` fuses with its producers and consumers
  (:mod:`latch_schedule.fusion`, "Concatenation": RoPE's halves and d(qkv)'s stack in one pass);
- ``ops``: the op registry to read tags, costs and tilings from (default: installed plugins);
- ``matmul_tile`` ((M, N)), ``cost_<field>``: overrides of :class:`latch_schedule.tiling.CostModel`;
- ``sync_seconds`` (float, default 1e-6): the estimated cost of a barrier / a cross-SM wait.

A third-party strategy reuses the same building blocks: ``latch_schedule.tasks.build`` gives the
tasks and their dependencies, and it returns a ScheduleSection the validator checks like ours.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from latch_core.document import Document
from latch_core.sections import ProgramSchedule, ScheduleSection

from . import barrier as _barrier
from . import dataflow as _dataflow
from latch_core.aliasing import alias_prefixes
from latch_core.registry import VIEW

from .fusion import FUSABLE_VIEWS, POINTWISE_TAGS
from .tasks import ScheduleError, TaskGraph, build, options_cost

DEFAULT_NUM_SMS = 132


def _ops(options: dict[str, Any]):
    if options.get("ops") is not None:
        return options["ops"]
    from latch_core.plugins import registries

    return registries().ops


def _bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(v)


def task_graphs(doc: Document, options: dict[str, Any]) -> list[TaskGraph]:
    """The task graph of every program of ``doc`` under ``options`` (for any strategy)."""
    if doc.graph is None:
        raise ScheduleError("the document has no graph section; capture a program first")
    num_sms = int(options.get("num_sms", DEFAULT_NUM_SMS))
    if num_sms < 1:
        raise ScheduleError(f"option num_sms must be >= 1, got {num_sms}")
    ops = _ops(options)
    cost = options_cost(options)
    fuse = _bool(options.get("fuse", True))
    alias = _bool(options.get("alias_views", True))
    rows = _bool(options.get("row_groups", True))
    concat = _bool(options.get("fuse_concat", True))
    return [build(g, ops, fuse_ops=fuse, num_sms=num_sms, cost=cost, alias_views=alias, row_groups=rows,
                  fuse_concat=concat)
            for g in doc.graph.programs]


def _run(name: str, doc: Document, options: dict[str, Any],
         per_program: Callable[[TaskGraph, int, float], tuple[ProgramSchedule, dict]]) -> ScheduleSection:
    num_sms = int(options.get("num_sms", DEFAULT_NUM_SMS))
    sync = float(options.get("sync_seconds", 1.0e-6))
    t0 = time.perf_counter()
    tgs = task_graphs(doc, options)
    t1 = time.perf_counter()
    programs, stats = [], {}
    graphs = {g.name: g for g in doc.graph.programs}
    ops = _ops(options)

    def fusable(n) -> bool:
        tags = ops.get(n.op).tags if n.op in ops else frozenset()
        return bool(tags & POINTWISE_TAGS) or (VIEW in tags and n.op in FUSABLE_VIEWS)

    aliases: dict[str, tuple] = {}  # program -> (view, storage value, byte offset, group)
    for tg in tgs:
        ps, st = per_program(tg, num_sms, sync)
        programs.append(ps)
        st = dict(st)
        found = [(v, base, off, gi) for gi, p in enumerate(tg.plans) if len(p.nodes) > 1
                 for v, (base, off) in alias_prefixes(graphs[tg.program], p.nodes, fusable, p.outputs).items()]
        st["alias_prefix_views"] = len(found)  # views folded into their readers as addresses
        aliases[tg.program] = tuple(found)
        stats[f"program.{tg.program}"] = st
    t2 = time.perf_counter()
    stats["seconds_tasks"] = round(t1 - t0, 4)
    stats["seconds_strategy"] = round(t2 - t1, 4)
    stats["fuse"] = _bool(options.get("fuse", True))
    stats["alias_views"] = _bool(options.get("alias_views", True))
    stats["row_groups"] = _bool(options.get("row_groups", True))
    stats["fuse_concat"] = _bool(options.get("fuse_concat", True))
    # Ticketed phases (latch_codegen_h100.tickets): the code generator takes a barrier phase's tasks
    # from one shared queue where no two tasks of one SM list depend on each other. Recorded here so
    # that every reader of the document (the build, the profile's decoder) sees the same choice.
    # ``tickets="data"``: only the phases of data-dependent bodies (the ragged expert products, whose
    # cost the routing decides at run time) take tickets; the others keep the cost model's lists.
    tk = options.get("tickets", False)
    stats["tickets"] = "data" if isinstance(tk, str) and tk.strip().lower() == "data" else _bool(tk)
    row = [p.nodes[-1].name for tg in tgs for p in tg.plans if p.row]
    stats["row_group_count"] = len(row)
    if any(aliases.values()):
        stats["aliases"] = aliases
    return ScheduleSection(strategy=name, num_sms=num_sms, programs=programs, stats=stats)


def barrier_scheduler(doc: Document, options: dict[str, Any]) -> ScheduleSection:
    return _run("barrier", doc, options, _barrier.schedule_program)


def tickets_scheduler(doc: Document, options: dict[str, Any]) -> ScheduleSection:
    """The barrier schedule, its phases' tasks taken from shared queues by tickets where no two tasks
    of one SM list in a phase depend on each other (latch_codegen_h100.tickets: the lists as the
    barrier scheduler balanced them by the cost model become a queue, longest first, that every SM
    takes from as it frees up; what the model gets wrong, or the routing decides at run time, no
    longer leaves SMs waiting at the barrier)."""
    return _run("tickets", doc, {**options, "tickets": True}, _barrier.schedule_program)


def tickets_data_scheduler(doc: Document, options: dict[str, Any]) -> ScheduleSection:
    """The barrier schedule with tickets only in the phases of data-dependent bodies (the ragged expert
    products: how many rows each expert gets is known only at run time, so no static assignment
    balances them), the cost model's lists everywhere else. Run 33: tickets in every phase were no
    faster than barrier (a ticket's cost, ~1.1 us, spent in every phase; results/wt.md), while the
    ragged phases hold most of the imbalance a queue can remove."""
    return _run("tickets_data", doc, {**options, "tickets": "data"}, _barrier.schedule_program)


def dataflow_scheduler(doc: Document, options: dict[str, Any]) -> ScheduleSection:
    return _run("dataflow", doc, options, _dataflow.schedule_program)
