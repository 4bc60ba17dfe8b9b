"""Document (graph + schedule + memory) -> generated CUDA units, binary tables and a manifest.

What is generated:
- ``kernel.cu``: the persistent kernel (``cuda/latch_kernel_main.cuh``), the dispatch switch from
  body id to body function, and the C ABI;
- ``unit_<k>.cu``: the body functions, one per distinct :class:`~.bodies.BodySpec`, grouped into
  units of at most ``bodies_per_unit`` (units are compiled in parallel and cached by ninja);
- per program, binary tables (instruction lists, tasks, operands, counter targets: ``tables.py``);
- ``consts.bin``: constant data, written into the arena once at load;
- ``manifest.json``: everything the runtime needs (buffers, programs, outputs, error context).

Rendering bodies (calling the lowerings) runs in parallel across units in worker processes.
Sources depend only on the set of body signatures, so a schedule or memory change that keeps the
signatures leaves the sources, and the compiled library, unchanged.
"""

from __future__ import annotations

import concurrent.futures as _cf
import math
import multiprocessing as _mp
import os
from pathlib import Path
from typing import Any

import attrs

from latch_core.document import Document
from latch_core.ir import BATCH, CONST, HYPER, Graph
from latch_core.aliasing import alias_prefixes
from latch_core.registry import COPY, ELEMENTWISE, VIEW
from latch_core.sections import BARRIER, SIGNAL, TASK, WAIT, ProgramMemory, ProgramSchedule

from . import tables as T
from .bodies import BodySpec, CodegenError, GroupSite, Rendered, group_spec, node_index, render_body
from .lowering import Lowering, LoweringError
from .tickets import TICKET, table_lists, tickets_on

CUDA_DIR = Path(__file__).parent / "cuda"
THREADS = 256  # consumer threads: what every op body is written to (LATCH_THREADS)
BLOCK_THREADS = THREADS + 128  # plus the producer warpgroup (cuda/latch_kernel_main.cuh)
ARENA = "arena"


def ops_cuda_dir() -> Path:
    import latch_ops

    return Path(latch_ops.__file__).parent / "cuda"


@attrs.frozen
class Unit:
    name: str  # file name, e.g. "unit_0.cu"
    source: str
    bodies: tuple[str, ...] = ()  # body keys defined in this unit
    lines: tuple[tuple[int, int, str], ...] = ()  # (first line, last line, body key), 1-based


@attrs.frozen
class Generated:
    units: tuple[Unit, ...]  # kernel.cu first
    tables: dict = attrs.field(eq=False)  # program -> ProgramTables
    consts: bytes
    manifest: dict = attrs.field(eq=False)
    include_dirs: tuple[str, ...]
    headers: tuple[str, ...]  # absolute paths of every header the sources include


def _lowerings(regs=None) -> dict[str, Lowering]:
    if regs is None:
        from latch_core.plugins import registries

        regs = registries()
    return dict(regs.lowerings.items())


def _op_specs(regs=None):
    if regs is None:
        from latch_core.plugins import registries

        regs = registries()
    return regs.ops


# The views latch-schedule's fusion inlines into elementwise bodies (latch_schedule.fusion.FUSABLE_VIEWS).
FUSABLE_VIEWS = frozenset({"latch::reshape", "latch::permute", "latch::expand", "latch::slice", "latch::select"})


def strip_alias_prefix(graph: Graph, grp, ops, nodes: dict) -> tuple[Any, dict[str, tuple[str, int]]]:
    """``grp`` without its alias prefix (``latch_core.aliasing.alias_prefixes``: contiguous views
    that are addresses, not computations), and ``{view output: (storage value, byte offset)}``.
    The stripped group reads each prefix output as an input of its own, at the storage value's
    placement plus the offset; its other inputs keep their first-use order."""

    def fusable(n) -> bool:
        if n.op not in ops:
            return False
        tags = ops.get(n.op).tags
        return bool(tags & {ELEMENTWISE, COPY}) or (VIEW in tags and n.op in FUSABLE_VIEWS)

    pre = alias_prefixes(graph, grp.nodes, fusable, grp.outputs)
    if not pre:
        return grp, {}
    keep = [x for x in grp.nodes if not (nodes[x].outputs and nodes[x].outputs[0] in pre)]
    produced = {o for x in keep for o in nodes[x].outputs}
    ins: list[str] = []
    for x in keep:
        for v in nodes[x].inputs:
            if v is not None and v not in produced and v not in ins:
                ins.append(v)
    return attrs.evolve(grp, nodes=tuple(keep), inputs=tuple(ins)), pre


def g_nodes_op(nodes: dict, grp) -> str:
    return nodes[grp.nodes[0]].op


def _where(graph: Graph, node_name: str) -> str:
    for n in graph.nodes:
        if n.name == node_name:
            src = f", from {n.source}" if n.source else ""
            return f"node {n.name!r} ({n.op}{src})"
    return f"node {node_name!r}"


# --------------------------------------------------------------------------------------------
# External buffers: everything bound at run time, indexed from 1 (0 is the arena)


def external_buffers(doc: Document) -> list[dict]:
    out: list[dict] = []
    seen: dict[str, dict] = {}

    def add(v, role):
        if v.name in seen:
            b = seen[v.name]
            if (tuple(b["shape"]), b["dtype"]) != (tuple(v.shape), v.dtype):
                raise CodegenError(f"buffer {v.name!r} is {v.dtype}{list(v.shape)} in one program and "
                                   f"{b['dtype']}{b['shape']} in another; one name must mean one buffer")
            return
        b = {"name": v.name, "role": role, "shape": list(v.shape), "dtype": v.dtype}
        seen[v.name] = b
        out.append(b)

    for v in doc.graph.layout:
        add(v, v.role)
    for ps in doc.schedule.programs:
        g = doc.graph.program(ps.program)
        for grp in g.inputs:
            for name in grp.values:
                v = g.value(name)
                if v.role in (BATCH, HYPER) or (v.role in ("param", "state") and name not in seen):
                    add(v, v.role)
    return out


# --------------------------------------------------------------------------------------------
# Per-program lowering to tables


@attrs.frozen
class _ProgramPlan:
    name: str
    tables: T.ProgramTables
    info: dict
    group_rec: dict  # group id -> (body id, op_begin, op_count)
    locs: dict  # group id -> [(buffer, offset)] of its operands (inputs, then outputs)
    body_keys: dict  # group id -> body key
    groups: dict = attrs.field(factory=dict)  # group id -> the group as lowered (alias prefix stripped)
    lists: tuple = ()  # the SM lists as the tables hold them (tickets.table_lists)


def _check_sync(ps: ProgramSchedule) -> dict[int, int]:
    """Validate the instruction lists against the sync contract; returns counter id -> dense index."""
    counters = {c.id: i for i, c in enumerate(ps.counters)}
    expected = {c.id: c.expected for c in ps.counters}
    ntasks = len(ps.tasks)
    signals: dict[int, int] = {}
    for s, sm in enumerate(ps.sms):
        next_barrier = 0
        for k, ins in enumerate(sm):
            kind = ins[0]
            where = f"program {ps.program!r} SM {s} instruction {k} {ins!r}"
            if kind == TASK:
                if not 0 <= ins[1] < ntasks:
                    raise CodegenError(f"{where}: no task {ins[1]} (the schedule has {ntasks})")
            elif kind == BARRIER:
                if ins[1] != next_barrier:
                    raise CodegenError(f"{where}: barriers must run in order 0..{ps.num_barriers - 1} on every SM; "
                                       f"expected barrier {next_barrier}")
                next_barrier += 1
            elif kind == WAIT:
                if ins[1] not in counters:
                    raise CodegenError(f"{where}: waits on undeclared counter {ins[1]}")
                if ins[2] > expected[ins[1]]:
                    raise CodegenError(f"{where}: waits for {ins[2]} signals; counter {ins[1]} expects {expected[ins[1]]}")
            elif kind == SIGNAL:
                if ins[1] not in counters:
                    raise CodegenError(f"{where}: signals undeclared counter {ins[1]}")
                signals[ins[1]] = signals.get(ins[1], 0) + 1
            else:
                raise CodegenError(f"{where}: unknown instruction kind {kind!r}")
        if ps.num_barriers and next_barrier != ps.num_barriers:
            raise CodegenError(f"program {ps.program!r} SM {s}: runs {next_barrier} of {ps.num_barriers} barriers; "
                               "every SM must run every barrier (a grid barrier needs all blocks)")
    for c in ps.counters:
        if signals.get(c.id, 0) != c.expected:
            raise CodegenError(f"program {ps.program!r} counter {c.id}: expects {c.expected} signals per launch, "
                               f"the SM lists send {signals.get(c.id, 0)}")
    return counters


def _plan_program(doc: Document, ps: ProgramSchedule, pm: ProgramMemory, ext: dict[str, int],
                  lowerings: dict[str, Lowering], ops, specs: dict[str, BodySpec], sites: dict[str, GroupSite],
                  body_ids: dict[str, int]) -> _ProgramPlan:
    g = doc.graph.program(ps.program)
    place = {p.value: p for p in pm.placements}
    nodes = {n.name: n for n in g.nodes}

    aliases: dict[str, tuple[str, int]] = {}  # alias-prefix outputs -> (storage value, byte offset)

    def locate(value: str, group_id: int) -> tuple[int, int]:
        if value in aliases:
            base, off = aliases[value]
            buf, at = locate(base, group_id)
            return buf, at + off
        p = place.get(value)
        if p is None:
            raise CodegenError(f"program {ps.program!r} group {group_id}: value {value!r} crosses the group boundary "
                               "but the memory plan has no placement for it; re-run the memory stage")
        if p.buffer == ARENA:
            return 0, p.offset
        if p.buffer not in ext:
            raise CodegenError(f"program {ps.program!r}: value {value!r} is placed in buffer {p.buffer!r}, which is "
                               "not a layout value, batch input or hyper-parameter")
        return ext[p.buffer], p.offset

    operands: list[tuple[int, int]] = []
    group_rec: dict[int, tuple[int, int, int]] = {}  # group id -> (body id, op_begin, op_count)
    group_locs: dict[int, list[tuple[int, int]]] = {}
    group_keys: dict[int, str] = {}
    groups_info = {}
    groups_by_id = {}
    index = node_index(g)
    for full in ps.groups:
        for nn in full.nodes:
            if nn not in nodes:
                raise CodegenError(f"program {ps.program!r} group {full.id}: no node {nn!r} in the graph")
        grp, pre = strip_alias_prefix(g, full, ops, nodes)
        aliases.update(pre)
        groups_by_id[grp.id] = grp
        for nn in grp.nodes:
            n = nodes.get(nn)
            if n is None:
                raise CodegenError(f"program {ps.program!r} group {grp.id}: no node {nn!r} in the graph")
            if n.op not in lowerings:
                src = f" (from {n.source})" if n.source else ""
                raise CodegenError(
                    f"program {ps.program!r}: node {n.name!r}{src} uses op {n.op}, which has no H100 lowering; "
                    "install the plugin that provides its body (`latch-pipeline plugins` lists lowerings)")
        locs = [locate(v, grp.id) for v in (*grp.inputs, *grp.outputs)]
        aliased = False
        if len(grp.nodes) == 1:
            n = nodes[grp.nodes[0]]
            is_view = n.op in ops and VIEW in ops.get(n.op).tags
            first_in = next((i for i in n.inputs if i is not None), None)
            if is_view and first_in is not None and len(grp.outputs) == 1:
                aliased = locate(first_in, grp.id) == locate(grp.outputs[0], grp.id)
        try:
            spec = group_spec(g, grp, aliased, index)
        except LoweringError as e:
            raise CodegenError(f"program {ps.program!r} group {grp.id}: {e}") from None
        key = spec.key
        if key not in specs:
            specs[key] = spec
            sites[key] = GroupSite(ps.program, grp.id, tuple(grp.nodes), tuple(nodes[x].source for x in grp.nodes))
            body_ids[key] = len(body_ids)
        group_rec[grp.id] = (body_ids[key], len(operands), len(locs))
        group_locs[grp.id] = locs
        group_keys[grp.id] = key
        operands.extend(locs)
        groups_info[str(grp.id)] = {
            "nodes": list(grp.nodes),
            "ops": [nodes[x].op for x in grp.nodes],
            "source": next((nodes[x].source for x in grp.nodes if nodes[x].source), None),
            "body": key,
        }
        if pre:
            groups_info[str(grp.id)]["aliases"] = {v: list(b) for v, b in pre.items()}

    counters = _check_sync(ps)
    for k, t in enumerate(ps.tasks):
        if t.id != k:
            raise CodegenError(f"program {ps.program!r}: task ids must be 0..{len(ps.tasks) - 1} in order; "
                               f"position {k} holds task {t.id}")
        if t.group not in group_rec:
            raise CodegenError(f"program {ps.program!r} task {t.id}: no group {t.group}")
        grp = groups_by_id[t.group]
        prim = g.value(grp.primary)
        if len(t.tile) != len(prim.shape):
            raise CodegenError(f"program {ps.program!r} task {t.id}: tile {t.tile} has rank {len(t.tile)}; the "
                               f"group's primary {grp.primary!r} has shape {list(prim.shape)}")
        for d, ((lo, hi), n) in enumerate(zip(t.tile, prim.shape)):
            if not 0 <= lo <= hi <= n:
                raise CodegenError(f"program {ps.program!r} task {t.id}: tile {t.tile} leaves the primary "
                                   f"{grp.primary!r} of shape {list(prim.shape)} in dimension {d}")
        if len(grp.nodes) == 1 and lowerings[g_nodes_op(nodes, grp)].whole:
            full = tuple((0, n) for n in prim.shape)
            if tuple(t.tile) != full:
                raise CodegenError(
                    f"program {ps.program!r} task {t.id}: {_where(g, grp.nodes[0])} has a body that computes its "
                    f"whole output in one task, but the schedule gives it the tile {t.tile} of {list(prim.shape)}; "
                    "schedule this op as one task")
        if len(t.tile) > T.MAX_DIMS:
            raise CodegenError(f"program {ps.program!r} task {t.id}: rank {len(t.tile)} exceeds {T.MAX_DIMS}")

    tp = table_lists(ps, pm, tickets_on(doc), g)
    # Ticket k counts on dense counter len(ps.counters) + k: each launch adds its tasks plus one
    # ticket past the end per list (tickets.py), its ``expected``.
    expected = [c.expected for c in ps.counters] + [len(q.tasks) + len(ps.sms) for q in tp.queues]
    queue_at, at = [], sum(len(sm) for sm in tp.sms)
    for q in tp.queues:
        queue_at.append(at)
        at += len(q.tasks)
    sms = []
    for sm in tp.sms:
        row = []
        for ins in sm:
            if ins[0] in (WAIT, SIGNAL):
                row.append((ins[0], counters[ins[1]], *ins[2:]))
            elif ins[0] == TICKET:
                row.append((TICKET, len(ps.counters) + ins[1], queue_at[ins[1]], len(tp.queues[ins[1]].tasks)))
            else:
                row.append(ins)
        sms.append(row)
    instrs, sm_begin = T.pack_instrs(sms, [[(TASK, t) for t in q.tasks] for q in tp.queues])
    tabs = T.ProgramTables(
        instrs=instrs, sm_begin=sm_begin, tasks=b"", operands=T.pack_operands(operands),
        expected=T.pack_u32(expected),
    )

    outputs = []
    inplace_new = {new for new, _ in g.inplace}
    for grp in g.outputs:
        for name in grp.values:
            v = g.value(name)
            p = place.get(name)
            if p is None:
                raise CodegenError(f"program {ps.program!r}: output {name!r} has no placement")
            buf = 0 if p.buffer == ARENA else ext.get(p.buffer)
            outputs.append({"group": grp.name, "value": name, "buffer": buf, "offset": p.offset,
                            "shape": list(v.shape), "dtype": v.dtype, "inplace": name in inplace_new})
    copy_back = []
    for item in dict(doc.memory.stats).get("copy_back", ()) or ():
        prog, new, old = item
        if prog == ps.program:
            p = place[new]
            copy_back.append({"new": new, "old": old, "offset": p.offset, "nbytes": p.nbytes, "buffer": ext[old]})
    for new, old in g.inplace:
        p = place.get(new)
        if p is None:
            raise CodegenError(f"program {ps.program!r}: in-place output {new!r} has no placement")
        if p.buffer != old and not any(c["new"] == new for c in copy_back):
            raise CodegenError(f"program {ps.program!r}: in-place output {new!r} is placed in {p.buffer!r}, neither in "
                               f"the buffer of {old!r} nor listed for copy-back; the update would be lost")

    inputs = {grp.name: list(grp.values) for grp in g.inputs}
    info = {
        "num_lists": len(ps.sms),
        "num_tasks": len(ps.tasks),
        "num_barriers": ps.num_barriers,
        "num_counters": len(expected),  # the schedule's counters, then one per ticketed phase
        "counter_ids": [c.id for c in ps.counters],  # dense index (tables) -> schedule's counter id
        "tickets": [{"phase": q.phase, "tasks": len(q.tasks), "counter": len(ps.counters) + k, "begin": queue_at[k]}
                    for k, q in enumerate(tp.queues)],
        "arena_bytes": pm.arena_bytes,
        "inputs": inputs,
        "outputs": outputs,
        "copy_back": copy_back,
        "groups": groups_info,
        "tables": {k: f"tables/{ps.program}.{k}.bin" for k in tabs.files()},
    }
    return _ProgramPlan(ps.program, tabs, info, group_rec, group_locs, group_keys, groups_by_id, tp.sms)


def local_deps(ps: ProgramSchedule, sms=None, since_barrier: bool = False) -> dict[int, int]:
    """Task id -> Task::dep: the position, among the tasks of its SM list, of the latest earlier task
    of the same list that writes a value the task reads (-1 if none). The worker's producer may issue
    a task's TMA loads while earlier tasks of its SM still run; it waits for this one first.
    Dependencies on other SMs are ordered by the schedule's own waits and barriers.
    ``since_barrier`` (a ticketed kernel, whose producer counts so): positions count from the list's
    last grid barrier, and a writer before it needs no wait (the consumers complete every store
    before they arrive; the producer passes only a completed barrier). ``sms``: the lists as the
    tables hold them (default the schedule's; a ticketed phase's queue tasks are not in them and get
    -1: no two tasks of a queue conflict, tickets.py)."""
    out: dict[int, int] = {}
    for sm in (ps.sms if sms is None else sms):
        last_writer: dict[str, int] = {}
        pos = 0
        for ins in sm:
            if ins[0] == BARRIER and since_barrier:
                last_writer, pos = {}, 0
                continue
            if ins[0] != TASK:
                continue
            t = ps.tasks[ins[1]]
            out[t.id] = max((last_writer.get(a.value, -1) for a in t.reads), default=-1)
            for a in t.writes:
                last_writer[a.value] = pos
            pos += 1
    return out


def _finish_tables(doc: Document, plan: _ProgramPlan, rendered: dict) -> _ProgramPlan:
    """The task records and tensor maps of a program, once every body is rendered (a body with a
    producer half gets its group's tensor maps, and its tasks the index of the first)."""
    ps = next(p for p in doc.schedule.programs if p.program == plan.name)
    g = doc.graph.program(ps.program)
    maps: list[T.TmapRecord] = []
    first_map: dict[int, int] = {}
    descr = []
    for gid, key in plan.body_keys.items():
        r = rendered[key]
        if not r.produces:
            continue
        first_map[gid] = len(maps)
        locs = plan.locs[gid]
        for j, m in enumerate(r.tensor_maps):
            buf, off = locs[m.operand]
            grp = plan.groups.get(gid) or next(x for x in ps.groups if x.id == gid)
            value = (*grp.inputs, *grp.outputs)[m.operand]
            v = g.value(value)
            if math.prod(m.dims) != v.numel:
                raise CodegenError(f"program {ps.program!r} group {gid}: tensor map {j} views {value!r} "
                                   f"({v.dtype}{list(v.shape)}) as dims {list(m.dims)}; the element counts differ")
            maps.append(T.TmapRecord.of(buf, off, v.dtype, m.dims, m.box, m.swizzle))
            descr.append({"group": gid, "value": value, "dims": list(m.dims), "box": list(m.box)})
    # a ticketed kernel's producer counts Task::dep from the last barrier, in every program
    deps = local_deps(ps, plan.lists, since_barrier=tickets_on(doc)) if first_map else {}
    records = []
    for t in ps.tasks:
        body, ob, oc = plan.group_rec[t.group]
        tm = first_map.get(t.group, -1)
        records.append(T.TaskRecord(body, t.id, t.group, ob, oc, tuple(a for a, _ in t.tile),
                                    tuple(b for _, b in t.tile), tm, deps.get(t.id, -1) if tm >= 0 else -1))
    tabs = attrs.evolve(plan.tables, tasks=b"".join(r.pack() for r in records), tmaps=T.pack_tmaps(maps))
    info = dict(plan.info, num_tmaps=len(maps), tmaps=descr, tables={k: f"tables/{ps.program}.{k}.bin" for k in tabs.files()})
    return attrs.evolve(plan, tables=tabs, info=info)


def _constants(doc: Document) -> tuple[bytes, list[dict]]:
    data, recs, seen = bytearray(), [], {}
    for ps in doc.schedule.programs:
        g = doc.graph.program(ps.program)
        place = {p.value: p for p in doc.memory.program(ps.program).placements}
        for v in g.values:
            if v.role != CONST or v.name not in place:
                continue
            p = place[v.name]
            if p.buffer != ARENA:
                raise CodegenError(f"program {ps.program!r}: constant {v.name!r} is placed in {p.buffer!r}; "
                                   "constants live in the arena")
            if v.data is None:
                raise CodegenError(f"program {ps.program!r}: constant {v.name!r} has no data")
            if (v.name, p.offset) in seen:
                continue
            try:
                b = T.const_bytes(v.data, v.dtype, v.numel, v.name)
            except (ValueError, OverflowError) as e:
                raise CodegenError(f"program {ps.program!r}: {e}") from None
            seen[(v.name, p.offset)] = True
            recs.append({"value": v.name, "offset": p.offset, "file_offset": len(data), "nbytes": len(b),
                         "program": ps.program})
            data += b
    return bytes(data), recs


# --------------------------------------------------------------------------------------------
# Rendering units (parallel)

_WORKER_LOWERINGS: dict[str, Lowering] | None = None
PARALLEL_MIN_BODIES = 192  # below this, rendering serially is faster than starting workers


def _init_worker() -> None:
    """A spawned worker loads the installed plugins itself (lowerings are not picklable: many
    are closures), so parallel rendering uses only entry-point plugins."""
    global _WORKER_LOWERINGS
    _WORKER_LOWERINGS = _lowerings(None)


def _render_unit(name: str, specs: list[BodySpec], lowerings: dict[str, Lowering] | None = None):
    """Render the bodies of one unit: ("ok", [(key, Rendered)], headers) or ("error", key, message)."""
    lowerings = lowerings if lowerings is not None else _WORKER_LOWERINGS
    headers: list[str] = []
    for s in specs:
        for n in s.nodes:
            for h in lowerings[n.op].headers:
                if h not in headers:
                    headers.append(h)
    out = []
    for s in specs:
        try:
            out.append((s.key, render_body(s, lowerings)))
        except LoweringError as e:
            return ("error", s.key, str(e))
        except Exception as e:  # a lowering that crashes is a bug in that plugin: say which op
            return ("error", s.key, f"lowering crashed: {type(e).__name__}: {e}")
    return ("ok", out, tuple(headers))


def _unit_source(name: str, bodies: list[tuple[str, "Rendered"]], specs: dict[str, BodySpec], headers,
                 emitted: set[str]) -> tuple[str, tuple]:
    """A unit file: its headers and every body function not already emitted by an earlier unit
    (bodies with the same text share one function). Returns (text, line ranges per body key)."""
    lines = [f"// {name}: generated by latch-codegen-h100; do not edit (included by kernel.cu)", "#pragma once",
             '#include "latch_kernel.cuh"']
    lines += [f'#include "{h}"' for h in headers]
    lines.append("")
    ranges = []
    for key, r in bodies:
        if r.func in emitted:
            continue
        emitted.add(r.func)
        first = len(lines) + 1
        lines.append(f"// {specs[key].describe()}")
        lines.extend(r.named().splitlines())
        ranges.append((first, len(lines), key))
    return "\n".join(lines) + "\n", tuple(ranges)


def _assign_units(specs: dict[str, BodySpec], per_unit: int) -> list[list[BodySpec]]:
    # Stable: order by (ops, key) so adding a body disturbs few units.
    ordered = sorted(specs.values(), key=lambda s: (s.ops, s.key))
    return [ordered[i:i + per_unit] for i in range(0, len(ordered), per_unit)]


def _render_all(chunks, lowerings, jobs: int, parallel: bool):
    """Render units, in worker processes when ``parallel``. Workers are spawned, not forked: the
    caller may hold CUDA contexts and threads (torch), which a fork would copy in a broken state."""
    names = [f"unit_{i}.cu" for i in range(len(chunks))]
    if parallel and jobs > 1 and len(chunks) > 1:
        ctx = _mp.get_context("spawn")
        with _cf.ProcessPoolExecutor(max_workers=min(jobs, len(chunks)), mp_context=ctx,
                                     initializer=_init_worker) as ex:
            return list(ex.map(_render_unit, names, chunks))
    return [_render_unit(n, c, lowerings) for n, c in zip(names, chunks)]


# Shared memory the worker may use per block: the device's opt-in maximum for sm_90 (227 KiB), less
# what the worker's own static records take (the queue, mbarriers: ~2 KiB) and the ring's alignment.
SMEM_BUDGET = 232448 - 4096 - 1024
MAX_STAGES = 8


def ring_geometry(stage_bytes: int, scratch: int) -> tuple[int, int]:
    """(stages, stage bytes) of the ring: as many stages of the largest stage any body needs as fit
    beside the bodies' scratch (at most MAX_STAGES; none when no body streams through the ring)."""
    if stage_bytes <= 0:
        return 0, 0
    stage_bytes = -(-stage_bytes // 1024) * 1024
    stages = min(MAX_STAGES, (SMEM_BUDGET - scratch) // stage_bytes)
    if stages < 2:
        raise CodegenError(f"the ring needs at least 2 stages of {stage_bytes} bytes beside {scratch} bytes of "
                           f"scratch; only {SMEM_BUDGET} bytes of shared memory are available")
    return stages, stage_bytes


def _kernel_source(body_keys: list[str], specs: dict[str, BodySpec], rendered: dict, units: list[str], max_ops: int,
                   stages: int, stage_bytes: int, scratch: int, tickets: bool = False) -> str:
    max_args = max([1] + [len(rendered[k].args) for k in body_keys])
    lines = [
        "// kernel.cu: generated by latch-codegen-h100; do not edit",
        "// One translation unit: the bodies (the unit files, included below) are compiled with the worker,",
        "// so hot bodies inline into its dispatch and the register split (setmaxnreg) survives.",
        f"#define LATCH_MAX_OPERANDS {max(1, max_ops)}",
        f"#define LATCH_NUM_BODIES {len(body_keys)}",
        f"#define LATCH_MAX_ARGS {max_args}",
        f"#define LATCH_STAGES {stages}",
        f"#define LATCH_STAGE_BYTES {stage_bytes}",
        f"#define LATCH_SCRATCH_BYTES {scratch}",
        f"#define LATCH_TICKETS {int(bool(tickets))}",  # tables with ticketed phases: their producer (tickets.py)
        '#include "latch_kernel.cuh"',
        "",
    ]
    lines += [f'#include "{u}"' for u in units]
    lines += ["", "// Run-time constants of each body (Ctx::args), by body id.",
              "__device__ __constant__ long long latch_body_args[LATCH_NUM_BODIES * LATCH_MAX_ARGS] = {"]
    for i, k in enumerate(body_keys):
        a = list(rendered[k].args) + [0] * (max_args - len(rendered[k].args))
        lines.append("  " + ", ".join(f"{x}LL" for x in a) + ",")
    lines += ["};", ""]

    def switch(funcs: dict[str, list[int]], call: str, default: str) -> list[str]:
        out = ["  switch (body) {"]
        for f, ids in funcs.items():
            labels = " ".join(f"case {i}:" for i in ids)
            out.append(f"    {labels}")
            out.append(f"      {call.format(f=f)}")
        out += [f"    default: {default}", "  }"]
        return out

    by_func: dict[str, list[int]] = {}
    by_producer: dict[str, list[int]] = {}
    for i, k in enumerate(body_keys):
        r = rendered[k]
        by_func.setdefault(r.func, []).append(i)
        if r.produces:
            by_producer.setdefault(r.producer_func, []).append(i)
    lines += ["__device__ __forceinline__ void latch_dispatch(int body, const latch::Ctx& c) {"]
    lines += switch(by_func, "{f}(c); break;", "latch_report(latch::ERR_BAD_BODY, body, LATCH_NUM_BODIES);")
    lines += ["}", "", "// Producer halves (TMA loads into the ring); false when a wait was aborted.",
              "__device__ __forceinline__ bool latch_produce(int body, const latch::Ctx& c, latch::Pipe& p) {"]
    lines += switch(by_producer, "return {f}(c, p);", "return true;")
    lines += ["}", "", '#include "latch_kernel_main.cuh"', ""]
    return "\n".join(lines)


def include_dirs_of(lowerings: dict[str, Lowering]) -> list[str]:
    """The include dirs of a build: the kernel's, latch-ops', then each lowering's own (in order)."""
    include_dirs = [str(CUDA_DIR), str(ops_cuda_dir())]
    for low in lowerings.values():
        for d in low.include_dirs:
            if str(d) not in include_dirs:
                include_dirs.append(str(d))
    return include_dirs


def headers_of(include_dirs) -> list[str]:
    """Every header of every include dir: all of them count for the cache keys (headers include
    each other, so hashing only the ones named by lowerings would miss a change in a transitive
    include)."""
    return [str(p) for d in include_dirs for p in sorted(Path(d).glob("*")) if p.suffix in (".cuh", ".h")]


UNITS_MAX = 16  # units render in parallel worker processes; nvcc compiles them as one translation unit


def units_for(num_bodies: int) -> int:
    """How many units: ~6 bodies a unit, at most UNITS_MAX. Not the machine's cores: kernel.cu
    includes every unit (one nvcc run), so the split only shares out the rendering, and a split that
    followed the cores would give the same program other sources, hence another cache key, on every
    machine (a library built here could not serve the H200's build; tools/gpu_check.sh's seeded cache)."""
    return max(1, min(UNITS_MAX, -(-num_bodies // 6)))


def generate(doc: Document, *, bodies_per_unit: int | None = None, jobs: int | None = None, regs=None,
             parallel_min_bodies: int = PARALLEL_MIN_BODIES) -> Generated:
    """Lower a planned document. Raises CodegenError naming the program/group/node/op at fault.

    ``bodies_per_unit``: default from :func:`units_for`. Units render in
    parallel worker processes when there are at least ``parallel_min_bodies`` bodies and the
    lowerings come from the installed plugins (``regs`` None)."""
    missing = {"graph", "schedule", "memory"} - doc.sections()
    if missing:
        raise CodegenError(f"code generation needs the sections graph, schedule and memory; the document lacks "
                           f"{sorted(missing)}: run the stages that produce them first")
    from .lower_attention import kernel_defaults

    doc = kernel_defaults(doc)  # the attention forward's default body, chosen for the whole kernel
    lowerings = _lowerings(regs)
    ops = _op_specs(regs)
    ext_list = external_buffers(doc)
    ext = {b["name"]: i + 1 for i, b in enumerate(ext_list)}
    specs: dict[str, BodySpec] = {}
    sites: dict[str, GroupSite] = {}
    body_ids: dict[str, int] = {}
    plans: list[_ProgramPlan] = []
    for ps in doc.schedule.programs:
        try:
            pm = doc.memory.program(ps.program)
        except KeyError:
            raise CodegenError(f"program {ps.program!r} is scheduled but has no memory plan; re-run the memory stage")
        plans.append(_plan_program(doc, ps, pm, ext, lowerings, ops, specs, sites, body_ids))

    body_keys = sorted(body_ids, key=body_ids.get)
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    if bodies_per_unit is None:
        bodies_per_unit = -(-len(specs) // units_for(len(specs))) if specs else 1
    chunks = _assign_units(specs, max(1, bodies_per_unit))
    results = _render_all(chunks, lowerings, jobs, parallel=regs is None and len(specs) >= parallel_min_bodies)
    units, rendered, emitted, headers = [], {}, set(), []
    for i, r in enumerate(results):
        if r[0] == "error":
            _, key, msg = r
            site = sites[key]
            g = doc.graph.program(site.program)
            where = ", ".join(_where(g, n) for n in site.nodes[:4])
            raise CodegenError(f"{site.describe()}: cannot lower {where}: {msg}")
        _, bodies, hdrs = r
        headers += [h for h in hdrs if h not in headers]
        src, ranges = _unit_source(f"unit_{i}.cu", bodies, specs, hdrs, emitted)
        units.append(Unit(f"unit_{i}.cu", src, tuple(k for _, _, k in ranges), ranges))
        rendered.update(bodies)
    smem = {k: r.smem for k, r in rendered.items()}
    plans = [_finish_tables(doc, p, rendered) for p in plans]
    max_ops = max((len(s.of_kind("in")) + len(s.of_kind("out")) for s in specs.values()), default=1)
    scratch = max([1024] + list(smem.values()))
    scratch = (scratch + 127) // 128 * 128
    stages, stage_bytes = ring_geometry(max([0] + [r.stage_bytes for r in rendered.values()]), scratch)
    kernel = Unit("kernel.cu", _kernel_source(body_keys, specs, rendered, [u.name for u in units], max_ops,
                                              stages, stage_bytes, scratch, tickets_on(doc)))
    kernel_smem = stages * stage_bytes + scratch + 1024

    include_dirs = include_dirs_of(lowerings)
    for h in headers:
        if not any((Path(d) / h).exists() for d in include_dirs):
            raise CodegenError(f"header {h!r} of a lowering is in none of the include dirs {include_dirs}")
    header_paths = headers_of(include_dirs)

    consts, const_recs = _constants(doc)
    manifest = {
        "abi": T.ABI_VERSION,
        "threads": THREADS,
        "block_threads": BLOCK_THREADS,
        "smem": kernel_smem,
        "ring": {"stages": stages, "stage_bytes": stage_bytes, "scratch": scratch},
        "max_operands": max(1, max_ops),
        "num_sms": doc.schedule.num_sms,
        "strategy": doc.schedule.strategy,
        "arena_bytes": doc.memory.arena_bytes,
        "buffers": ext_list,
        "consts": const_recs,
        "programs": {p.name: p.info for p in plans},
        "program_order": [p.name for p in plans],
        "metadata": {k: v for k, v in _plain(doc.graph.metadata)},
        "bodies": [{"id": body_ids[k], "key": k, "ops": list(specs[k].ops), "describe": specs[k].describe(),
                    "smem": smem.get(k, 0), "tensor_maps": len(rendered[k].tensor_maps),
                    "stage_bytes": rendered[k].stage_bytes, "function": rendered[k].func,
                    "args": list(rendered[k].args)} for k in body_keys],
        "units": [{"name": u.name, "bodies": list(u.bodies), "lines": [list(x) for x in u.lines]} for u in units],
    }
    return Generated(
        units=(kernel, *units), tables={p.name: p.tables for p in plans}, consts=consts, manifest=manifest,
        include_dirs=tuple(include_dirs), headers=tuple(sorted(set(header_paths))),
    )


def _plain(pairs) -> list[tuple[str, Any]]:
    """Frozen attribute pairs -> JSON-friendly (nested pair tuples become dicts)."""
    def conv(v):
        if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
            return {k: conv(x) for k, x in v}
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v
    return [(k, conv(v)) for k, v in pairs]
