"""The memory half of the static validator (check 6 of :mod:`latch_schedule.validate`).

Placement rules, each a field the GPU or the runtime reads (docs/CONTRACTS.md section 4):
- bindings: a program input (param, state, batch, hyper) lives in its own external buffer (the
  buffer named after it, offset 0): the runtime binds buffers by name, so an input placed anywhere
  else is read from bytes nothing wrote. A value that overwrites an input in place lives in that
  input's buffer at offset 0, or in the arena with the pair listed for copy-back. Everything else
  lives in the arena: any other buffer name is one nothing binds at run time;
- sizes and bounds: a placement has exactly the value's bytes; an arena offset is a multiple of the
  section's alignment (a power of two) and of the element size (the GPU's loads are natural-size),
  and ends inside the program's arena, which the section's arena (what the runtime allocates) holds;
- constants: written once at load into the arena, so no value of ANY program may share their bytes
  (one arena serves every program of the layout; :func:`cross_program`);
- reuse: whenever two values' bytes overlap in one buffer, one of them is entirely done (every
  reader and writer) before any writer of the other starts (value-level through happens-before
  summaries, refined box by box for two values sharing one placement and one type: in-place
  updates); live-on-entry values cannot come second, live-on-exit values cannot come first;
- liveness: the declared ``first``/``last`` covers every actual access (-1 claims the launch's
  start or end: conservative; a task id must be a first writer / last user, and an output's life
  ends at the exit).
"""

from __future__ import annotations

from collections import defaultdict

from latch_core.document import Document
from latch_core.ir import CONST, DTYPES
from latch_core.order import Order
from latch_core.sections import Placement

from .boxes import MultiIndex

ARENA = "arena"


def copy_back_pairs(doc: Document, program: str) -> set[tuple[str, str]]:
    """The (new, old) pairs the memory section lists for copy-back after ``program``'s launch."""
    out = set()
    for item in dict(doc.memory.stats).get("copy_back", ()) or ():
        if isinstance(item, (tuple, list)) and len(item) == 3 and item[0] == program:
            out.add((item[1], item[2]))
    return out


def section_problems(doc: Document) -> list[str]:
    """Rules of the memory section as a whole."""
    m, out = doc.memory, []
    a = m.alignment
    if type(a) is not int or a <= 0 or a & (a - 1):
        out.append(f"memory section: alignment {a!r} is not a positive power of two; re-run memory.plan")
    for pm in m.programs:
        if pm.arena_bytes > m.arena_bytes:
            out.append(f"memory plan of program {pm.program!r} needs an arena of {pm.arena_bytes} bytes, but the "
                       f"section's arena (what the runtime allocates) is {m.arena_bytes} bytes")
    scheduled = {p.program for p in doc.schedule.programs}
    for item in dict(m.stats).get("copy_back", ()) or ():
        if not (isinstance(item, (tuple, list)) and len(item) == 3 and item[0] in scheduled):
            out.append(f"memory section: copy_back entry {item!r} is not (program, new value, old value) of a "
                       "scheduled program")
    return out


def cross_program(doc: Document) -> list[str]:
    """Constants are written once, at load: no placement of any program may share their bytes."""
    consts: dict[tuple[str, int], int] = {}  # (name, offset) -> nbytes
    others: list[tuple[int, int, str, str]] = []
    for pm in doc.memory.programs:
        try:
            g = doc.graph.program(pm.program)
        except Exception:
            continue
        for pl in pm.placements:
            if pl.buffer != ARENA or pl.nbytes <= 0 or not g.has_value(pl.value):
                continue
            if g.value(pl.value).role == CONST:
                consts[(pl.value, pl.offset)] = pl.nbytes
            else:
                others.append((pl.offset, pl.offset + pl.nbytes, pm.program, pl.value))
    out = []
    ranges = sorted((off, off + n, name) for (name, off), n in consts.items())
    for i, (lo, hi, name) in enumerate(ranges):
        for lo2, hi2, name2 in ranges[i + 1:]:
            if lo2 >= hi:
                break
            out.append(f"constants %{name} and %{name2} share arena bytes [{lo2}, {min(hi, hi2)}): both are "
                       "written once at load, so one of them is wrong")
    others.sort()
    for lo, hi, name in ranges:
        for lo2, hi2, prog, v in others:  # few constants: a scan is fine
            if lo2 < hi and lo < hi2:
                out.append(f"program {prog!r} places %{v} on arena bytes [{max(lo, lo2)}, {min(hi, hi2)}) of "
                           f"constant %{name}, which is written once at load and read by later launches; "
                           "constants' bytes are never reused")
                break
    return out


class MemoryChecks:
    """Mixed into :class:`latch_schedule.validate.ProgramValidator` (it provides ``g``, ``ps``,
    ``pm``, ``p``, ``order``, ``task()``, the access indexes and ``plans``)."""

    def _memory(self) -> None:
        g, pm, p = self.g, self.pm, self.p
        touched = set(self.writers) | set(self.readers)
        places: dict[str, Placement] = {}
        for pl in pm.placements:
            if pl.value in places:
                p(f"{self.name}: value %{pl.value} has two placements")
                continue
            places[pl.value] = pl
        for v in sorted(touched | set(g.output_names())):
            if v not in places:
                what = "is read or written by tasks" if v in touched else "is a program output"
                p(f"{self.name}: value %{v} {what} but has no placement in the memory plan")
        for v, pl in places.items():
            if not g.has_value(v):
                p(f"{self.name}: the memory plan places %{v}, which the graph does not declare")
                continue
            self._placement(v, pl)
        for new, old in sorted(self.copy_back):
            if dict(g.inplace).get(new) != old:
                p(f"{self.name}: copy_back lists %{new} -> %{old}, which is not an in-place pair of the program; "
                  "the runtime would overwrite %{old} with it")
            elif new in places and places[new].buffer != ARENA:
                p(f"{self.name}: copy_back lists %{new} -> %{old}, but %{new} is placed in {places[new].buffer!r}, "
                  "not the arena; the runtime would copy arena bytes nothing wrote into %{old}")
        self._liveness(places)
        by_buffer: dict[str, list[Placement]] = defaultdict(list)
        for pl in places.values():
            if g.has_value(pl.value) and pl.nbytes > 0:
                by_buffer[pl.buffer].append(pl)
        self._frontiers: dict[str, dict] = {}
        self._meets: dict[str, list[int]] = {}
        for buf, pls in by_buffer.items():
            pls.sort(key=lambda x: (x.offset, x.value))
            active: list[Placement] = []
            for pl in pls:
                active = [a for a in active if a.offset + a.nbytes > pl.offset]
                for other in active:
                    self._shared(buf, other, pl)
                active.append(pl)

    def _placement(self, v: str, pl: Placement) -> None:
        g, p = self.g, self.p
        val = g.value(v)
        inputs = self.inputs_only
        inplace = dict(g.inplace)  # new -> old
        if pl.nbytes != val.nbytes:
            p(f"{self.name}: %{v} needs {val.nbytes} bytes but its placement has {pl.nbytes}")
        where = f"buffer {pl.buffer!r} at offset {pl.offset}" if pl.buffer != ARENA else f"the arena at offset {pl.offset}"
        if v in inputs:
            if pl.buffer != v or pl.offset != 0:
                p(f"{self.name}: %{v} is a program input ({val.role}) but the plan puts it in {where}; inputs "
                  f"live in their own buffer (buffer {v!r}, offset 0), which the runtime binds by name, so the "
                  f"kernel would read bytes nothing wrote; re-run memory.plan")
            return
        if val.role == CONST and pl.buffer != ARENA:
            p(f"{self.name}: constant %{v} is placed in {where}; constants live in the arena (written at load)")
            return
        if pl.buffer != ARENA:
            old = inplace.get(v)
            if old is not None and pl.buffer == old:
                if pl.offset != 0:
                    p(f"{self.name}: %{v} overwrites %{old} in place but is placed at offset {pl.offset} of its "
                      "buffer; an in-place update covers the buffer from offset 0")
            elif pl.buffer in inputs or pl.buffer in self.layout:
                p(f"{self.name}: %{v} is placed in external buffer {pl.buffer!r}; only that input itself and the "
                  f"value that overwrites it in place may live there")
            else:
                p(f"{self.name}: %{v} is placed in buffer {pl.buffer!r}, which nothing binds at run time (the "
                  f"runtime binds the program's inputs and the layout by name; everything else lives in the "
                  f"arena); re-run memory.plan")
            return
        if v in inplace and (v, inplace[v]) not in self.copy_back:
            p(f"{self.name}: %{v} overwrites %{inplace[v]} in place but is placed in the arena without a copy_back "
              f"entry, so the update would never reach %{inplace[v]}'s buffer")
        esize = DTYPES.get(val.dtype, 1)
        if pl.offset < 0 or pl.offset % max(1, self.alignment) or pl.offset % esize:
            p(f"{self.name}: %{v} at arena offset {pl.offset}, not a multiple of the alignment {self.alignment} "
              f"and of its element size {esize}")
        if pl.offset + pl.nbytes > self.arena_bytes:
            p(f"{self.name}: %{v} at [{pl.offset}, {pl.offset + pl.nbytes}) overruns the arena "
              f"({self.arena_bytes} bytes)")

    def _users(self, v: str) -> list[int]:
        return [t for _, t in self.writers.get(v, ())] + [t for _, t in self.readers.get(v, ())]

    def _first_ok(self, u: str, v: str) -> bool:
        """Is every access of ``u`` done before any write of ``v`` starts?"""
        if u in self.outputs or v in self.inputs:
            return False  # u must survive the launch / v's bytes are valid on entry
        fu = self._frontiers.get(u)
        if fu is None:
            fu = self._frontiers[u] = self.order.frontier(self._users(u))
        mv = self._meets.get(v)
        if mv is None:
            mv = self._meets[v] = self.order.meet(t for _, t in self.writers.get(v, ()))
        return Order.precedes(fu, mv)

    def _first_ok_boxes(self, u: str, v: str) -> bool:
        """The box-by-box form for two values sharing one placement and one type."""
        if u in self.outputs or v in self.inputs:
            return False
        tasks = self.ps.tasks
        r_index = MultiIndex((b, t, tasks[t].group) for b, t in self.readers.get(u, []))
        w_index = self.w_index.get(u)
        order = self.order
        safe: dict[int, bool] = {}  # group -> inplace_safe(u, v): one answer per group, not per tile
        for wbox, w in self.writers.get(v, ()):
            hits = r_index.query(wbox)
            if w in hits:  # the task reads the old value where it writes the new one
                group = tasks[w].group
                ok = safe.get(group)
                if ok is None:
                    ok = safe[group] = group < len(self.plans) and self.plans[group].inplace_safe(self.g, u, v)
                if not ok:
                    return False
                hits = [a for a in hits if a != w]
            if w_index is not None:
                whits = w_index.query(wbox)
                if w in whits:
                    return False
                hits += whits
            if not order.all_before(hits, w):
                return False
        return True

    def _shared(self, buf: str, a: Placement, b: Placement) -> None:
        u, v = a.value, b.value
        g = self.g
        if g.value(u).role == CONST or g.value(v).role == CONST:
            self.p(f"{self.name}: %{u} and %{v} share bytes of {buf!r} but constants are written once at load "
                   f"and must never share their bytes")
            return
        if self._first_ok(u, v) or self._first_ok(v, u):
            return
        same = (a.offset == b.offset and a.nbytes == b.nbytes and g.value(u).type == g.value(v).type)
        if same and (self._first_ok_boxes(u, v) or self._first_ok_boxes(v, u)):
            return
        lo, hi = max(a.offset, b.offset), min(a.offset + a.nbytes, b.offset + b.nbytes)
        self.p(f"bytes reused while live: {self.name}: %{u} and %{v} share bytes [{lo}, {hi}) of {buf!r}, but "
               f"neither is finished before the other is written: {self._witness(u, v)}; and {self._witness(v, u)}")

    def _witness(self, u: str, v: str) -> str:
        if u in self.outputs:
            return f"%{u} is a program output and must survive the launch"
        if v in self.inputs:
            return f"%{v} is live on entry"
        users = self._users(u)
        for _, w in self.writers.get(v, ()):
            for x in users:
                if x == w or not self.order.before(x, w):
                    what = "reads/writes" if x != w else "accesses"
                    return f"{self.task(x)} {what} %{u} and is not ordered before {self.task(w)} writing %{v}"
        return f"%{u} before %{v} fails"

    def _liveness(self, places: dict[str, Placement]) -> None:
        order, p, n = self.order, self.p, len(self.ps.tasks)
        for v, pl in places.items():
            if not self.g.has_value(v):
                continue
            users = self._users(v)
            ws = [t for _, t in self.writers.get(v, ())]
            if pl.first != -1:  # -1 claims the whole launch: conservative, never wrong
                if pl.first not in ws:
                    p(f"{self.name}: %{v} declares first = {pl.first}, which is not a task writing it "
                      f"(writers: {sorted(set(ws))[:6]})")
                elif any(order.before(w, pl.first) for w in ws):
                    early = next(w for w in ws if order.before(w, pl.first))
                    p(f"{self.name}: %{v} declares its life starts at task {pl.first}, but {self.task(early)} "
                      f"writes it earlier")
            if v in self.outputs and pl.last != -1:
                p(f"{self.name}: %{v} is a program output but declares last = {pl.last}; it is live on exit (-1)")
            elif pl.last != -1:
                if not 0 <= pl.last < n or pl.last not in users:
                    p(f"{self.name}: %{v} declares last = {pl.last}, which is not a task reading or writing it")
                else:
                    late = [x for x in users if order.before(pl.last, x)]
                    if late:
                        p(f"lifetime too short: {self.name}: %{v} declares its last use at task {pl.last}, but "
                          f"{self.task(late[0])} uses it later")
