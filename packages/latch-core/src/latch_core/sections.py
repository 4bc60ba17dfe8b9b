"""The records of the ``schedule``, ``memory`` and ``build`` sections.

They live in latch-core (not in the stage that writes them) because several stages read them: the
validator, the arena simulator and the code generator all consume the schedule and the memory plan.

Schedule model (shared by every strategy):
- a *group* is a set of graph nodes computed together by one op body (a fusion group); values
  produced and consumed only inside it never reach memory;
- a *task* computes one tile of one group: the box it covers of the group's primary output, and the
  boxes it reads and writes of every value (its footprint, per-dimension half-open ranges);
- each SM runs an ordered instruction list: ``("task", id)``, ``("barrier", id)`` (grid-wide; every
  SM executes every barrier id in the same order), ``("wait", counter, count)`` (spin until the
  counter has been signalled ``count`` times in this launch) and ``("signal", counter)`` (a release
  increment after the previous task's writes).
"""

from __future__ import annotations

from typing import Any

import attrs

from .ir import freeze_attrs

Box = tuple[tuple[int, int], ...]

# Instruction kinds of an SM's list.
TASK = "task"
BARRIER = "barrier"
WAIT = "wait"
SIGNAL = "signal"
INSTR_KINDS = frozenset({TASK, BARRIER, WAIT, SIGNAL})


def _box(x) -> Box:
    return tuple((int(lo), int(hi)) for lo, hi in x)


@attrs.frozen
class Access:
    """The part of a value a task touches: a box of per-dimension [lo, hi) ranges."""

    value: str
    box: Box = attrs.field(converter=_box)


@attrs.frozen
class FusionGroup:
    """Graph nodes computed by one op body. ``inputs``/``outputs`` are the values that cross the
    group boundary (read from / written to memory); ``primary`` is the output the tiles cover."""

    id: int
    nodes: tuple[str, ...] = attrs.field(converter=tuple)
    inputs: tuple[str, ...] = attrs.field(converter=tuple)
    outputs: tuple[str, ...] = attrs.field(converter=tuple)
    primary: str
    body: str  # op-body signature key: groups with equal keys share one instantiation


@attrs.frozen
class Task:
    id: int
    group: int
    tile: Box = attrs.field(converter=_box)
    reads: tuple[Access, ...] = attrs.field(converter=tuple)
    writes: tuple[Access, ...] = attrs.field(converter=tuple)
    cost: float = 0.0  # estimated seconds, from the op cost models
    phase: int = -1  # barrier strategy: the phase the task runs in; -1 where phases do not apply


@attrs.frozen
class Counter:
    id: int
    expected: int  # signals one launch delivers to this counter


@attrs.frozen
class ProgramSchedule:
    program: str
    groups: tuple[FusionGroup, ...] = attrs.field(converter=tuple)
    tasks: tuple[Task, ...] = attrs.field(converter=tuple)
    sms: tuple[tuple[tuple, ...], ...] = attrs.field(
        converter=lambda s: tuple(tuple(tuple(i) for i in sm) for sm in s)
    )
    counters: tuple[Counter, ...] = attrs.field(factory=tuple, converter=tuple)
    num_barriers: int = 0


@attrs.frozen
class ScheduleSection:
    strategy: str
    num_sms: int
    programs: tuple[ProgramSchedule, ...] = attrs.field(converter=tuple)
    stats: tuple[tuple[str, Any], ...] = attrs.field(factory=tuple, converter=freeze_attrs)

    def program(self, name: str) -> ProgramSchedule:
        for p in self.programs:
            if p.program == name:
                return p
        raise KeyError(f"schedule section: no program {name!r}")


@attrs.frozen
class Placement:
    """Where a value's bytes live: ``buffer`` is ``"arena"`` (at ``offset``) or the name of an
    external buffer bound at run time (a layout value, a batch input or a hyper-parameter)."""

    value: str
    buffer: str
    offset: int
    nbytes: int
    first: int = -1  # liveness: first schedule position that writes it (-1: live on entry)
    last: int = -1  # last schedule position that reads it (-1: live on exit)


@attrs.frozen
class ProgramMemory:
    program: str
    placements: tuple[Placement, ...] = attrs.field(converter=tuple)
    arena_bytes: int
    peak_live_bytes: int


@attrs.frozen
class MemorySection:
    alignment: int
    arena_bytes: int  # max over programs: one arena serves every program of the layout
    programs: tuple[ProgramMemory, ...] = attrs.field(converter=tuple)
    stats: tuple[tuple[str, Any], ...] = attrs.field(factory=tuple, converter=freeze_attrs)

    def program(self, name: str) -> ProgramMemory:
        for p in self.programs:
            if p.program == name:
                return p
        raise KeyError(f"memory section: no program {name!r}")


@attrs.frozen
class BuildSection:
    directory: str
    key: str  # content hash of (sources, flags, toolkit)
    units: tuple[str, ...] = attrs.field(converter=tuple)
    flags: tuple[str, ...] = attrs.field(converter=tuple)
    toolkit: str = ""
    stats: tuple[tuple[str, Any], ...] = attrs.field(factory=tuple, converter=freeze_attrs)
