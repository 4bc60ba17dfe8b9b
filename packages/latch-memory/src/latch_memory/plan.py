"""The pass ``memory.plan``: Schedule -> MemorySection (placements, arena offsets, in-place updates).

Placement rules (docs/CONTRACTS.md section 4):
- program inputs (params, state, batch, hyper) live in their own external buffers (buffer = name);
- a ``new_params``/``new_state`` output paired in place with an input takes that input's buffer
  (offset 0) when no read of the old value can follow an overlapping write of the new one
  (:func:`latch_memory.liveness.inplace_hazards`); otherwise it gets an arena slot, live on exit,
  and the pair is listed in the section's ``copy_back`` stat: after the launch the runtime copies
  ``nbytes`` from the arena at the new value's offset into the old value's buffer;
- constants of every program share one constant area at the bottom of the arena, written once at
  load and never reused (one arena serves every program of the layout);
- everything else a task writes lives in the arena, offsets assigned per program by
  :func:`latch_memory.arena.assign_offsets` above the constant area; a value computed pointwise
  from an operand that dies into it (every reader of the operand writes the value) takes over
  the operand's bytes (:func:`_handoffs`: gradient sums, optimizer temporaries), so the two count
  once.

``peak_live_bytes`` is a lower bound any legal plan must meet (constants included): the weight of
a set of arena slots (hand-off chains count once) that pairwise may not share bytes
(:func:`latch_memory.arena.clique_bound`: the slots live at one position of the execution order,
extended by slots unordered with all of them). The stat ``peak_live_bytes_one_order`` is the plain
peak of that one order (a weaker bound).
"""

from __future__ import annotations

import time

import attrs

from latch_core.document import Document
from latch_core.gcpause import paused_gc
from latch_core.ir import CONST, Graph
from latch_core.registry import Registry
from latch_core.sections import MemorySection, Placement, ProgramMemory, ProgramSchedule

from .arena import align_up, assign_offsets, clique_bound, peak
from .liveness import Liveness, inplace_hazards, self_update_ok
from latch_core.errors import UserError

ARENA = "arena"
DEFAULT_ALIGNMENT = 256


class PlanError(UserError, ValueError):
    pass


def _constants(doc: Document) -> list[tuple[str, int]]:
    """Constants of every scheduled program, by name; one name must mean one constant."""
    seen: dict[str, tuple] = {}
    out = []
    for ps in doc.schedule.programs:
        g = doc.graph.program(ps.program)
        for v in g.values:
            if v.role != CONST:
                continue
            sig = (v.shape, v.dtype, v.data)
            if v.name in seen:
                if seen[v.name] != sig:
                    raise PlanError(
                        f"constant {v.name!r} differs between programs (program {ps.program!r} has "
                        f"{v.dtype}{list(v.shape)}); constants share one arena area, so give them distinct names")
                continue
            seen[v.name] = sig
            out.append((v.name, v.nbytes))
    return out


def plan_program(graph: Graph, ps: ProgramSchedule, ops: Registry, const_offsets: dict[str, int], const_end: int,
                 alignment: int = DEFAULT_ALIGNMENT) -> tuple[ProgramMemory, dict]:
    """The memory plan of one program (and its stats). ``ops``: the op tags decide which groups may
    update a value in place within one task."""
    t0 = time.perf_counter()
    live = Liveness(graph, ps)
    t_live = time.perf_counter() - t0
    inputs = set(graph.input_names())
    inplace = dict(graph.inplace)  # new -> old
    groups = {grp.id: grp for grp in ps.groups}
    nodes = {n.name: n for n in graph.nodes}
    placements: list[Placement] = []
    arena_items: list[tuple[str, int]] = []
    copy_back: list[tuple[str, str]] = []
    refused: dict[str, list[str]] = {}

    for life in live:
        name = life.value
        v = graph.value(name)
        first, last = live.first_task(life), live.last_task(life)
        if v.role == CONST:
            placements.append(Placement(name, ARENA, const_offsets[name], life.nbytes, -1, -1))
        elif name in inputs:
            placements.append(Placement(name, name, 0, life.nbytes, -1, last))
        elif name in inplace:
            old = inplace[name]
            writers = {ps.tasks[t].group for t in life.writers}
            ok = {gid for gid in writers if self_update_ok(groups[gid], nodes, graph, ops, old, name)}
            hazards = inplace_hazards(live, name, old, ok)
            if hazards:
                refused[name] = hazards
                copy_back.append((name, old))
                arena_items.append((name, life.nbytes))
            else:
                placements.append(Placement(name, old, 0, life.nbytes, first, last))
        else:
            arena_items.append((name, life.nbytes))

    lives = live.lives
    t1 = time.perf_counter()
    handoff = _handoffs(live, ps, graph, ops, groups, nodes, {n for n, _ in arena_items})
    slots = _slots([n for n, _ in arena_items], handoff, lives)
    items = [(root, lives[root].nbytes, min(lives[m].start for m in ms), max(lives[m].end for m in ms))
             for root, ms in slots.items()]

    def slots_compatible(a: str, b: str) -> bool:
        return all(live.compatible(lives[x], lives[y]) for x in slots[a] for y in slots[b])

    offsets, top = assign_offsets(items, ordered=slots_compatible, alignment=alignment,
                                  base=align_up(const_end, alignment))
    t_arena = time.perf_counter() - t1
    for root, members in slots.items():
        for name in members:
            life = lives[name]
            placements.append(Placement(name, ARENA, offsets[root], life.nbytes, live.first_task(life),
                                        live.last_task(life)))
    placements.sort(key=lambda p: p.value)

    t2 = time.perf_counter()
    peak_linear = peak(items)
    bound = max(clique_bound(items, slots_compatible), peak_linear)
    t_bound = time.perf_counter() - t2
    const_bytes = sum(live[n].nbytes for n in lives if graph.value(n).role == CONST)
    arena_bytes = max(top, const_end) if (arena_items or const_end) else 0
    pm = ProgramMemory(ps.program, placements, arena_bytes, bound + const_bytes)
    stats = {
        "arena_bytes": arena_bytes,
        "peak_live_bytes": bound + const_bytes,
        "peak_live_bytes_one_order": peak_linear + const_bytes,
        "arena_values": len(arena_items),
        "arena_handoffs": len(handoff),
        "inplace": sorted(n for n in inplace if n not in refused and n in lives),
        "copy_back": sorted(copy_back),
        "copy_back_reasons": {n: r[0] for n, r in sorted(refused.items())},
        "seconds_liveness": round(t_live, 4),
        "seconds_arena": round(t_arena, 4),
        "seconds_bound": round(t_bound, 4),
    }
    return pm, stats


def _handoffs(live: Liveness, ps: ProgramSchedule, graph: Graph, ops: Registry, groups: dict, nodes: dict,
              arena: set[str]) -> dict[str, str]:
    """Arena values that take over the bytes of an operand dying into them: ``{new: old}``.

    ``new`` may be written over ``old`` when both live in the arena with one type, every task
    that reads ``old`` writes ``new`` (nothing else still needs ``old``), the group computes
    ``new`` from ``old`` pointwise (:func:`self_update_ok`) and no read of ``old`` is unordered
    with an overlapping write of ``new`` by another task (:func:`inplace_hazards`): the same rule
    as for in-place parameter updates, applied to gradients and other intermediates.
    """
    out: dict[str, str] = {}
    taken: set[str] = set()
    for new in sorted(arena, key=lambda n: (live[n].start, n)):  # names break ties: no set order
        ln = live[new]
        for gid in sorted({ps.tasks[t].group for t in ln.writers}):
            for old in groups[gid].inputs:
                lo = live.lives.get(old)
                if (old not in arena or old in taken or lo.live_out or not lo.readers
                        or graph.value(old).type != graph.value(new).type
                        or not set(lo.readers) <= set(ln.writers)):
                    continue
                if self_update_ok(groups[gid], nodes, graph, ops, old, new) and \
                        not inplace_hazards(live, new, old, {gid}):
                    out[new] = old
                    taken.add(old)
                    break
            if new in out:
                break
    return out


def _slots(names: list[str], handoff: dict[str, str], lives) -> dict[str, list[str]]:
    """Values that share bytes through hand-offs, as chains {first value: [values in order]}."""
    root: dict[str, str] = {}
    for name in sorted(names, key=lambda n: lives[n].start):
        root[name] = root[handoff[name]] if name in handoff else name
    slots: dict[str, list[str]] = {}
    for name in sorted(names, key=lambda n: lives[n].start):
        slots.setdefault(root[name], []).append(name)
    return slots


def plan(doc: Document, alignment: int = DEFAULT_ALIGNMENT, registry: Registry | None = None) -> Document:
    """The ``memory.plan`` pass: a :class:`MemorySection` for every scheduled program.
    ``registry``: the op registry (default: the installed plugins')."""
    with paused_gc():  # allocation-heavy: see latch_core.gcpause
        return _plan(doc, alignment, registry)


def _plan(doc: Document, alignment: int, registry: Registry | None) -> Document:
    if registry is None:
        from latch_core.plugins import registries

        registry = registries().ops
    alignment = int(alignment)
    if alignment <= 0 or alignment & (alignment - 1):
        raise PlanError(f"memory.plan: option alignment={alignment} must be a positive power of two")
    consts = _constants(doc)
    const_offsets, const_end = {}, 0
    for name, nbytes in consts:  # the constant area: packed, aligned, never reused
        const_offsets[name] = const_end
        const_end = align_up(const_end + nbytes, alignment)
    programs, per_program = [], {}
    copy_back = []
    for ps in doc.schedule.programs:
        pm, stats = plan_program(doc.graph.program(ps.program), ps, registry, const_offsets, const_end, alignment)
        programs.append(pm)
        per_program[ps.program] = stats
        copy_back += [(ps.program, new, old) for new, old in stats["copy_back"]]
    section = MemorySection(
        alignment=alignment,
        arena_bytes=max((p.arena_bytes for p in programs), default=0),
        programs=programs,
        stats={"constant_bytes": const_end, "copy_back": copy_back, "programs": per_program},
    )
    return attrs.evolve(doc, memory=section)
