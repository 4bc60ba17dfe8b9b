"""Hand-built planned documents for codegen tests: a graph, a simple schedule, a simple memory plan.

The schedule puts each node in its own group, splits each group's primary output into row tiles
(``tiles`` per group), and orders groups either by grid barriers (one phase per group) or by
dataflow counters (a task waits for every task of the groups it reads from). The memory plan puts
every intermediate in the arena at distinct offsets, and in-place outputs in their old buffers.
This is deliberately simple and independent of latch-schedule's schedulers and latch-memory, but the
documents are legal (the build validates what it builds): each task's write footprint is exactly
what its body stores for its tile, and its reads what the body reads (the op tilings of
latch_schedule.tasks.GroupTiler say what that is: an in-place elementwise update of row tiles then
reads only its own rows); under dataflow a task writing a value in place of an input also waits for
every task of the other groups reading that input.
"""

from __future__ import annotations

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value  # noqa: F401 (Node re-exported)
from latch_core.sections import (
    Access, Counter, FusionGroup, MemorySection, Placement, ProgramMemory, ProgramSchedule, ScheduleSection, Task,
)


def graph(name, values, nodes, inputs, outputs, inplace=()):
    """Nodes as (name, op, inputs, outputs[, attrs]) tuples or Node records."""
    vals = [Value(*v) if isinstance(v, tuple) else v for v in values]
    return Graph(name, vals, [Node(*n) if isinstance(n, tuple) else n for n in nodes],
                 [Group(k, v) for k, v in inputs], [Group(k, v) for k, v in outputs], inplace)


def _tiles(shape, n, split="rows"):
    """Boxes covering ``shape``: ``n`` ranges of dim 0 ("rows") or of the last dim ("cols")."""
    if not shape:
        return [()]
    if split == "cols" and len(shape) >= 2:
        cols = shape[-1]
        k = max(1, min(n, cols)) if cols else 1
        step = -(-cols // k) if cols else 1
        return [tuple((0, d) for d in shape[:-1]) + ((lo, min(cols, lo + step)),) for lo in range(0, max(cols, 1), step)]
    rows = shape[0]
    n = max(1, min(n, rows)) if rows else 1
    out = []
    step = -(-rows // n) if rows else 1
    for lo in range(0, max(rows, 1), step):
        hi = min(rows, lo + step)
        out.append(((lo, hi),) + tuple((0, d) for d in shape[1:]))
    return out


def _full(shape):
    return tuple((0, d) for d in shape)


def _tiler(g, nodes, ins, outs, primary):
    """The op tilings' footprints for one group (None where latch-schedule is not installed)."""
    try:
        from latch_core.plugins import registries
        from latch_schedule.fusion import GroupPlan
        from latch_schedule.tasks import GroupTiler
        from latch_schedule.tiling import CostModel
    except ImportError:
        return None
    produced = {o for n in nodes for o in n.outputs}
    plan = GroupPlan(nodes, ins, outs, produced - set(outs), primary, "handmade", False, ())
    try:
        return GroupTiler(g, plan, registries().ops, CostModel())
    except Exception:  # an op the tilings cannot place on these shapes: whole values (not legal)
        return None


def _whole_ops() -> set[str]:
    from latch_core.plugins import registries

    return {name for name, low in registries().lowerings.items() if getattr(low, "whole", False)}


def schedule_program(g: Graph, *, strategy="barrier", num_sms=4, tiles=2, groups=None, split="rows") -> ProgramSchedule:
    """``groups``: optional list of node-name lists to fuse (default: one group per node)."""
    node_groups = groups or [[n.name] for n in g.nodes]
    by_name = {n.name: n for n in g.nodes}
    fgroups, tasks = [], []
    produced_by: dict[str, int] = {}
    group_tasks: dict[int, list[int]] = {}
    for gid, names in enumerate(node_groups):
        inside = {o for nn in names for o in by_name[nn].outputs}
        ins, outs = [], []
        for nn in names:
            for i in by_name[nn].inputs:
                if i is not None and i not in inside and i not in ins:
                    ins.append(i)
        consumers_outside = {i for n in g.nodes if n.name not in names for i in n.inputs if i}
        program_outs = set(g.output_names())
        for nn in names:
            for o in by_name[nn].outputs:
                if o in consumers_outside or o in program_outs:
                    outs.append(o)
        last = by_name[names[-1]].outputs[0]
        primary = last if last in outs else outs[-1]  # the sink's first output, as the schedulers choose
        fgroups.append(FusionGroup(gid, names, ins, outs, primary, body=f"g{gid}"))
        for o in outs:
            produced_by[o] = gid
        shape = g.value(primary).shape
        group_tasks[gid] = []
        whole = any(by_name[nn].op in _whole_ops() for nn in names)
        tiler = _tiler(g, [by_name[nn] for nn in names], ins, outs, primary)
        if tiler is not None and shape:  # split only a dim the op's tiling allows (else one task)
            dim = len(shape) - 1 if split == "cols" and len(shape) >= 2 else 0
            whole = whole or dim not in tiler.tiling.split_dims or bool(tiler.tiling.granule_of(dim))
        for tile in _tiles(shape, 1 if whole else tiles, split):
            tid = len(tasks)
            read, written = {}, {o: _full(g.value(o).shape) for o in outs}
            if tiler is not None:
                try:
                    read, written = tiler.footprint(tile)
                except Exception:  # an op the tilings cannot place on these shapes (the catalogue)
                    pass
            reads = [Access(i, read.get(i, _full(g.value(i).shape))) for i in ins]
            writes = [Access(o, written.get(o, tuple((0, 0) for _ in g.value(o).shape))) for o in outs]
            tasks.append(Task(tid, gid, tile, reads, writes, phase=gid if strategy == "barrier" else -1))
            group_tasks[gid].append(tid)
    sms = [[] for _ in range(num_sms)]
    counters = []
    if strategy == "barrier":
        for gid in range(len(fgroups)):
            for k, tid in enumerate(group_tasks[gid]):
                sms[k % num_sms].append(("task", tid))
            if gid != len(fgroups) - 1:
                for sm in sms:
                    sm.append(("barrier", gid))
        nb = max(0, len(fgroups) - 1)
    else:
        # one counter per group, signalled once per task; consumers wait for all of them
        rr = 0
        for gid, fg in enumerate(fgroups):
            counters.append(Counter(gid, len(group_tasks[gid])))
        inplace = dict(g.inplace)  # new -> old
        for gid, fg in enumerate(fgroups):
            deps = {produced_by[i] for i in fg.inputs if i in produced_by}
            for o in fg.outputs:  # write-after-read: readers of the buffer this group overwrites
                if o in inplace:
                    deps |= {k for k, other in enumerate(fgroups) if k != gid and inplace[o] in other.inputs}
            deps = sorted(deps)
            for tid in group_tasks[gid]:
                sm = sms[rr % num_sms]
                rr += 1
                for d in deps:
                    sm.append(("wait", d, len(group_tasks[d])))
                sm.append(("task", tid))
                sm.append(("signal", gid))
        nb = 0
    return ProgramSchedule(g.name, fgroups, tasks, sms, counters, nb)


def memory_program(g: Graph, ps: ProgramSchedule, *, align=256, base=0) -> ProgramMemory:
    placements, off = [], base
    inplace = dict(g.inplace)
    inputs = set(g.input_names())
    seen = set()
    touched = [v for fg in ps.groups for v in (*fg.inputs, *fg.outputs)] + g.output_names()
    for name in touched:
        if name in seen:
            continue
        seen.add(name)
        v = g.value(name)
        if name in inputs and v.role != "const":
            placements.append(Placement(name, name, 0, v.nbytes))
        elif name in inplace:
            placements.append(Placement(name, inplace[name], 0, v.nbytes))
        else:
            placements.append(Placement(name, "arena", off, v.nbytes))  # first/last -1: the whole launch
            off += -(-max(v.nbytes, 1) // align) * align
    return ProgramMemory(g.name, placements, off, off)


def planned(graphs, layout=(), *, strategy="barrier", num_sms=4, tiles=2, metadata=None, groups=None,
            split="rows") -> Document:
    graphs = list(graphs)
    scheds = [schedule_program(g, strategy=strategy, num_sms=num_sms, tiles=tiles,
                               groups=(groups or {}).get(g.name), split=split) for g in graphs]
    mems = [memory_program(g, s) for g, s in zip(graphs, scheds)]
    return Document(
        graph=GraphSection(graphs, layout, metadata or {}),
        schedule=ScheduleSection(strategy, num_sms, scheds),
        memory=MemorySection(256, max(m.arena_bytes for m in mems), mems),
    )


def have_nvcc() -> bool:
    """nvcc is installed (the build tests skip without it)."""
    from latch_codegen_h100.builder import have_nvcc as found

    return found()


def cuobjdump() -> str | None:
    """The cuobjdump the machine-code tests use, or None where it is not installed."""
    from latch_codegen_h100.sass import SassError, find_cuobjdump

    try:
        return find_cuobjdump()
    except SassError:
        return None


def have_sass_tools() -> bool:
    """nvcc and cuobjdump are both installed (the machine-code tests skip without them)."""
    return cuobjdump() is not None and have_nvcc()


def small_doc(scale=2.0, **kw) -> Document:
    """The smallest planned update: y = w * x, w2 = w - scale (w2 overwrites w in place)."""
    F = "f32"
    values = [Value("w", (8,), F, "param"), Value("x", (8,), F, "batch"), Value("y", (8,), F), Value("w2", (8,), F)]
    nodes = [("m", "latch::mul", ("w", "x"), ("y",)), ("s", "latch::sub", ("w",), ("w2",), {"scalar": scale})]
    g = graph("update", values, nodes, [("params", ["w"]), ("batch", ["x"])],
              [("new_params", ["w2"]), ("metrics", ["y"])], inplace=[("w2", "w")])
    return planned([g], [g.value("w")], **kw)
