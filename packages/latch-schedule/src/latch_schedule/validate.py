"""The static hazard validator: proves a (graph, schedule, memory) document race-free.

For every program it checks, and reports every violation it finds (naming tasks, values, SMs):

1. structure: every graph node in exactly one fusion group; group inputs/outputs agree with the
   graph; every task of a group reads only the group's inputs and writes only its outputs, with
   boxes inside the values; the tasks of a group write every element of every group output;
2. footprints (``check_footprints``): each task's declared boxes contain what the group's body
   touches for its tile (recomputed from the op tilings), so the later checks can trust them;
3. order: the SM lists are well formed and cannot deadlock (:mod:`latch_core.order`);
4. read-after-write: every box a task reads is covered by the boxes other tasks write, and each of
   those writers happens-before the reader (or the value is a program input/constant);
5. write-after-write: tasks writing overlapping boxes of one value are ordered;
6. memory (with a ``memory`` section): every touched value has one placement of the right size;
   whenever two values' bytes overlap in one buffer, one of them is entirely done (every reader and
   writer) before any writer of the other starts: value-level through happens-before summaries
   (frontier of the first value's users against the meet of the second's writers), refined box by
   box when the two share one placement and one type (in-place updates); live-on-entry values
   (inputs, constants) cannot come second and live-on-exit values (outputs, constants) cannot come
   first; the declared liveness ``first``/``last`` covers every actual access.

Scale: indexes per value (``latch_schedule.boxes.BoxIndex``) and O(1) happens-before queries, no
all-pairs over tasks; a TinyMoE program of ~40,000 tasks validates in seconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from latch_core.document import Document
from latch_core.ir import CONST, Graph
from latch_core.order import Order, ScheduleOrderError
from latch_core.registry import Registry
from latch_core.sections import Placement, ProgramMemory, ProgramSchedule

from .boxes import BoxIndex, MultiIndex, contains, covered, full_box, is_empty, within
from .fusion import GroupPlan, is_pointwise
from latch_core.gcpause import gc_paused
from .tasks import GroupTiler
from .tiling import CostModel

ARENA = "arena"


class ValidationError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        head = f"{len(problems)} hazard(s) found:\n  " + "\n  ".join(problems[:30])
        if len(problems) > 30:
            head += f"\n  ... and {len(problems) - 30} more"
        super().__init__(head)


class _Report:
    def __init__(self, limit: int):
        self.items: list[str] = []
        self.limit = limit
        self.dropped = 0

    def __call__(self, msg: str) -> None:
        if len(self.items) < self.limit:
            self.items.append(msg)
        else:
            self.dropped += 1

    def done(self) -> list[str]:
        if self.dropped:
            return self.items + [f"... and {self.dropped} more problem(s) not shown"]
        return self.items


def _ops(ops):
    if ops is not None:
        return ops
    from latch_core.plugins import registries

    return registries().ops


@gc_paused  # allocation-heavy: see latch_core.gcpause
def validate(doc: Document, *, ops: Registry | None = None, check_footprints: bool = True,
             check_memory: bool = True, limit: int = 200) -> list[str]:
    """Every problem found in ``doc`` (empty: proven hazard-free). Needs graph + schedule; the
    memory checks run when the document has a memory section and ``check_memory``."""
    problems: list[str] = []
    if doc.graph is None or doc.schedule is None:
        return ["the document needs graph and schedule sections to be validated"]
    ops = _ops(ops)
    scheduled = {p.program for p in doc.schedule.programs}
    for g in doc.graph.programs:
        if g.name not in scheduled:
            problems.append(f"program {g.name!r} has no schedule; run the schedule pass")
    for ps in doc.schedule.programs:
        try:
            graph = doc.graph.program(ps.program)
        except Exception:
            problems.append(f"schedule names program {ps.program!r}, which the graph section lacks")
            continue
        pm = None
        if check_memory and doc.memory is not None:
            try:
                pm = doc.memory.program(ps.program)
            except KeyError:
                problems.append(f"program {ps.program!r} has no memory plan; run the memory plan pass")
        alignment = doc.memory.alignment if doc.memory is not None else 1
        arena = doc.memory.arena_bytes if doc.memory is not None else 0
        problems += ProgramValidator(graph, ps, pm, ops, check_footprints, limit, alignment, arena).run()
    return problems


def check(doc: Document, **kw: Any) -> None:
    problems = validate(doc, **kw)
    if problems:
        raise ValidationError(problems)


class ProgramValidator:
    def __init__(self, graph: Graph, ps: ProgramSchedule, pm: ProgramMemory | None, ops: Registry | None,
                 check_footprints: bool = True, limit: int = 200, alignment: int = 1, arena_bytes: int = 0):
        self.g = graph
        self.ps = ps
        self.pm = pm
        self.ops = ops
        self.check_footprints = check_footprints
        self.alignment = alignment
        self.arena_bytes = arena_bytes
        self.p = _Report(limit)
        self.order: Order | None = None
        self.name = f"program {ps.program!r}"
        self.plans: list[GroupPlan] = []
        self.node_map = {n.name: n for n in graph.nodes}

    # ---- naming ------------------------------------------------------------------------------
    def task(self, t: int) -> str:
        task = self.ps.tasks[t]
        where = ""
        if self.order is not None:
            s, i = self.order.position(t)
            where = f", SM {s} #{i}"
        grp = self.ps.groups[task.group] if 0 <= task.group < len(self.ps.groups) else None
        node = grp.nodes[-1] if grp is not None and grp.nodes else "?"
        src = ""
        n = self.node_map.get(node)
        if n is not None:
            src = f" {n.op}" + (f" from {n.source}" if n.source else "")
        return f"task {t} (group {task.group}: node {node!r}{src}, tile {list(task.tile)}{where})"

    # ---- driver ------------------------------------------------------------------------------
    def run(self) -> list[str]:
        ok = self._structure()
        if ok and self.check_footprints:
            self._footprints()
        try:
            self.order = Order.from_schedule(self.ps)
        except ScheduleOrderError as e:
            for pr in e.problems:
                self.p(pr)
        self._index()
        if self.order is not None:
            self._raw()
            self._waw()
            if self.pm is not None:
                self._memory()
        return self.p.done()

    # ---- 1. structure --------------------------------------------------------------------------
    def _structure(self) -> bool:
        g, ps, p = self.g, self.ps, self.p
        start = len(p.items)
        node_group: dict[str, int] = {}
        nodes = {n.name: n for n in g.nodes}
        for i, grp in enumerate(ps.groups):
            if grp.id != i:
                p(f"{self.name}: groups[{i}] has id {grp.id}; group ids must equal their index")
            for nn in grp.nodes:
                if nn not in nodes:
                    p(f"{self.name} group {i}: node {nn!r} is not in the graph")
                elif nn in node_group:
                    p(f"{self.name}: node {nn!r} is in groups {node_group[nn]} and {i}")
                else:
                    node_group[nn] = i
        for n in g.nodes:
            if n.name not in node_group:
                p(f"{self.name}: node {n.name!r} ({n.op}) is in no fusion group, so nothing computes it")
        if len(p.items) > start:
            return False
        consumers: dict[str, set[int]] = defaultdict(set)
        for n in g.nodes:
            for v in n.inputs:
                if v is not None:
                    consumers[v].add(node_group[n.name])
        outputs = set(g.output_names())
        self.plans: list[GroupPlan] = []
        for i, grp in enumerate(ps.groups):
            gnodes = [nodes[nn] for nn in grp.nodes]
            produced = {o for n in gnodes for o in n.outputs}
            for o in grp.outputs:
                if o not in produced:
                    p(f"{self.name} group {i}: output {o!r} is not produced by its nodes")
            internal = produced - set(grp.outputs)
            for v in internal:
                if v in outputs or any(c != i for c in consumers.get(v, ())):
                    p(f"{self.name} group {i}: value {v!r} is kept inside the group but is read outside it "
                      f"(or is a program output); list it in the group's outputs")
            if grp.primary not in grp.outputs:
                p(f"{self.name} group {i}: primary {grp.primary!r} is not one of its outputs")
            needed = {v for n in gnodes for v in n.inputs if v is not None and v not in produced}
            if needed - set(grp.inputs):
                p(f"{self.name} group {i}: reads {sorted(needed - set(grp.inputs))[:4]} without listing them as inputs")
            pw = {n.name for n in gnodes
                  if is_pointwise(self.ops.get(n.op) if self.ops is not None and n.op in self.ops else None)}
            self.plans.append(GroupPlan(gnodes, grp.inputs, grp.outputs, internal, grp.primary,
                                        grp.body, len(pw) == len(gnodes), pw))
        allowed_in = [set(grp.inputs) for grp in ps.groups]
        allowed_out = [set(grp.outputs) for grp in ps.groups]
        checked: set = set()  # (kind, group, access): tiles of a group repeat whole-value accesses
        for t in ps.tasks:
            if not 0 <= t.group < len(ps.groups):
                p(f"{self.name}: task {t.id} names group {t.group}, which does not exist")
                continue
            for kind, accs, allowed in (("reads", t.reads, allowed_in[t.group]),
                                        ("writes", t.writes, allowed_out[t.group])):
                for a in accs:
                    key = (kind, t.group, a)
                    if key in checked:
                        continue
                    checked.add(key)
                    if not g.has_value(a.value):
                        p(f"{self.name}: {self.task(t.id)} {kind} {a.value!r}, which the graph does not declare")
                        continue
                    if a.value not in allowed:
                        p(f"{self.name}: {self.task(t.id)} {kind} %{a.value}, which is not among its group's "
                          f"{'inputs' if kind == 'reads' else 'outputs'}")
                    if not within(a.box, g.value(a.value).shape):
                        p(f"{self.name}: {self.task(t.id)} {kind} %{a.value} box {list(a.box)} outside its "
                          f"shape {list(g.value(a.value).shape)}")
        return len(p.items) == start

    # ---- 2. footprints ----------------------------------------------------------------------
    def _footprints(self) -> None:
        g, ps, p = self.g, self.ps, self.p
        tilers: dict[int, GroupTiler] = {}
        for t in ps.tasks:
            tiler = tilers.get(t.group)
            if tiler is None:
                try:
                    tiler = tilers[t.group] = GroupTiler(g, self.plans[t.group], self.ops, CostModel())
                except Exception as e:
                    p(f"{self.name} group {t.group}: cannot derive its footprints: {e}")
                    tilers[t.group] = tiler = None  # type: ignore[assignment]
            if tiler is None:
                continue
            if not within(t.tile, tiler.shape):
                p(f"{self.name}: {self.task(t.id)}: tile outside the primary output {list(tiler.shape)}")
                continue
            need_r, need_w = tiler.footprint(t.tile)
            for kind, need, have in (("read", need_r, t.reads), ("write", need_w, t.writes)):
                for v, box in need.items():
                    if any(a.value == v and (a.box == box or contains(a.box, box)) for a in have):
                        continue  # the usual case: one declared box holds it
                    if is_empty(box):
                        continue
                    boxes = [a.box for a in have if a.value == v]
                    if not covered(box, boxes, False):
                        p(f"{self.name}: {self.task(t.id)}: its body {kind}s %{v} {list(box)}, but its footprint "
                          f"declares only {[list(b) for b in boxes]}; footprints must be supersets")

    # ---- indexes ------------------------------------------------------------------------------
    def _index(self) -> None:
        writers: dict[str, list] = defaultdict(list)
        readers: dict[str, list] = defaultdict(list)
        for t in self.ps.tasks:
            for a in t.writes:
                writers[a.value].append((a.box, t.id))
            for a in t.reads:
                readers[a.value].append((a.box, t.id))
        self.writers = writers
        self.readers = readers
        self.w_index = {v: BoxIndex(items) for v, items in writers.items()}
        self.inputs = set(self.g.input_names()) | {v.name for v in self.g.values if v.role == CONST}
        self.outputs = set(self.g.output_names())
        # Overlapping writes of one value (ordered or not: _waw decides), and coverage of each
        # group output by its writers.
        self.w_pairs = {v: idx.pairs() for v, idx in self.w_index.items()}
        self.disjoint = {v: not pairs for v, pairs in self.w_pairs.items()}
        self.complete: set[str] = set()  # values whose writers cover every element
        for grp in self.ps.groups:
            for v in grp.outputs:
                if not self.g.has_value(v):
                    continue
                full = full_box(self.g.value(v).shape)
                boxes = [b for b, _ in writers.get(v, []) if within(b, [hi for _, hi in full])]
                if covered(full, boxes, self.disjoint.get(v, True)):
                    self.complete.add(v)
                else:
                    self.p(f"{self.name} group {grp.id}: its tasks leave part of output %{v} "
                           f"{[hi for _, hi in full]} unwritten")

    # ---- 4. read-after-write ------------------------------------------------------------------
    def _raw(self) -> None:
        order, p = self.order, self.p
        cache: dict[tuple, list[int]] = {}  # (value, box) -> writers: tiles share whole-value reads
        for t in self.ps.tasks:
            for a in t.reads:
                v = a.value
                idx = self.w_index.get(v)
                if idx is None:
                    if v not in self.inputs and not is_empty(a.box):
                        p(f"{self.name}: {self.task(t.id)} reads %{v}, which is no program input and no task writes")
                    continue
                key = (v, a.box)
                hits = cache.get(key)
                if hits is None:
                    hits = cache[key] = idx.query(a.box)
                if t.id in hits:
                    p(f"{self.name}: {self.task(t.id)} reads %{v} {list(a.box)}, which it writes itself")
                    hits = [h for h in hits if h != t.id]
                if not order.all_before(hits, t.id):
                    for w in hits:
                        if not order.before(w, t.id):
                            p(f"read before write: {self.name}: {self.task(t.id)} reads %{v} {list(a.box)}, "
                              f"but {self.task(w)} writes it and no barrier or counter chain orders the write first")
                if self.g.has_value(v) and v not in self.inputs and v not in self.complete:
                    hs = set(hits)
                    boxes = [b for b, h in self.writers[v] if h in hs]
                    if not covered(a.box, boxes, self.disjoint.get(v, False)):
                        p(f"{self.name}: {self.task(t.id)} reads elements of %{v} {list(a.box)} that no task writes")

    # ---- 5. write-after-write -----------------------------------------------------------------
    def _waw(self) -> None:
        for v, pairs in self.w_pairs.items():
            for a, b in pairs:
                if a != b and not self.order.ordered(a, b):
                    self.p(f"write race: {self.name}: {self.task(a)} and {self.task(b)} write overlapping "
                           f"boxes of %{v} and nothing orders them")

    # ---- 6. memory ----------------------------------------------------------------------------
    def _memory(self) -> None:
        g, pm, p, order = self.g, self.pm, self.p, self.order
        touched = set(self.writers) | set(self.readers)
        places: dict[str, Placement] = {}
        for pl in pm.placements:
            if pl.value in places:
                p(f"{self.name}: value %{pl.value} has two placements")
                continue
            places[pl.value] = pl
        inplace = dict(g.inplace)  # new -> old
        buffer_size = {}
        for v in g.input_names():
            if g.has_value(v):
                buffer_size[v] = g.value(v).nbytes
        for v in sorted(touched):
            if v not in places:
                p(f"{self.name}: value %{v} is read or written by tasks but has no placement in the memory plan")
        for v, pl in places.items():
            if not g.has_value(v):
                p(f"{self.name}: the memory plan places %{v}, which the graph does not declare")
                continue
            val = g.value(v)
            if pl.nbytes < val.nbytes:
                p(f"{self.name}: %{v} needs {val.nbytes} bytes but its placement has {pl.nbytes}")
            if pl.buffer == ARENA:
                if pl.offset < 0 or pl.offset % max(1, self.alignment):
                    p(f"{self.name}: %{v} at arena offset {pl.offset}, not a multiple of the alignment {self.alignment}")
                if self.arena_bytes and pl.offset + pl.nbytes > self.arena_bytes:
                    p(f"{self.name}: %{v} at [{pl.offset}, {pl.offset + pl.nbytes}) overruns the arena "
                      f"({self.arena_bytes} bytes)")
            else:
                if pl.buffer != v and inplace.get(v) != pl.buffer:
                    p(f"{self.name}: %{v} is placed in external buffer {pl.buffer!r}; only that input itself and "
                      f"the value that overwrites it in place may live there")
                size = buffer_size.get(pl.buffer)
                if size is not None and (pl.offset < 0 or pl.offset + pl.nbytes > size):
                    p(f"{self.name}: %{v} at [{pl.offset}, {pl.offset + pl.nbytes}) overruns buffer "
                      f"{pl.buffer!r} ({size} bytes)")
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
            users = self._users(v)
            if pl.first != -1:
                ws = [t for _, t in self.writers.get(v, ())]
                if pl.first not in ws:
                    p(f"{self.name}: %{v} declares first = {pl.first}, which is not a task writing it "
                      f"(writers: {sorted(set(ws))[:6]})")
                elif any(order.before(w, pl.first) for w in ws):
                    early = next(w for w in ws if order.before(w, pl.first))
                    p(f"{self.name}: %{v} declares its life starts at task {pl.first}, but {self.task(early)} "
                      f"writes it earlier")
            if pl.last != -1:
                if not 0 <= pl.last < n or pl.last not in users:
                    p(f"{self.name}: %{v} declares last = {pl.last}, which is not a task reading or writing it")
                else:
                    late = [x for x in users if order.before(pl.last, x)]
                    if late:
                        p(f"lifetime too short: {self.name}: %{v} declares its last use at task {pl.last}, but "
                          f"{self.task(late[0])} uses it later")
