"""The static hazard validator: proves a (graph, schedule, memory) document race-free.

It checks every field the GPU, the runtime and the simulator read, and reports every violation it
finds (naming tasks, values, SMs, source lines):

1. structure: every graph node in exactly one fusion group, every node's op registered (the
   registry is what code generation and the checks use: an unknown op cannot be lowered or
   trusted), a group's nodes in graph order (its body computes them in that order) with its
   primary the first output of its last node; group inputs/outputs agree with the graph (no
   repeats); every task of a group reads only the group's inputs and writes only its outputs,
   with boxes inside the values; the tasks of a group write every element of every group output;
   at most ``num_sms`` SM lists;
2. footprints (``check_footprints``): each task's declared read boxes contain what the group's
   body reads for its tile (supersets are conservative), and its declared write boxes are exactly
   what the body stores for its tile (recomputed from the op tilings): a write footprint larger
   than the tile would make the coverage and ordering checks trust elements nothing computes;
3. order: the SM lists are well formed, follow the kernel's barrier and counter arithmetic and
   cannot deadlock (:mod:`latch_core.order`, whose model is the kernel's: a test runs it against an
   independent interpreter of ``latch_kernel_main.cuh``'s arithmetic on random schedules);
4. read-after-write: every box a task reads is covered by the boxes other tasks write, and each of
   those writers happens-before the reader (or the value is a program input/constant);
5. write-after-write: tasks writing overlapping boxes of one value are ordered;
6. memory (with a ``memory`` section; :mod:`latch_schedule.validate_memory`): bindings (inputs in
   their own buffers, in-place updates in the buffer they overwrite or listed for copy-back,
   everything else in the arena), sizes, alignment, arena bounds (always), constants never
   reused by any program, byte reuse only between values one of which is finished before the
   other is written, declared liveness covering every access.

Scale: indexes per value (``latch_schedule.boxes.BoxIndex``) and O(1) happens-before queries, no
all-pairs over tasks; a TinyMoE program of ~40,000 tasks validates in seconds.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Any

from latch_core.document import Document
from latch_core.ir import CONST, Graph
from latch_core.order import Order, ScheduleOrderError
from latch_core.registry import Registry
from latch_core.gcpause import gc_paused
from latch_core.sections import ProgramMemory, ProgramSchedule

from .boxes import BoxIndex, contains, covered, full_box, is_empty, within
from .fusion import GroupPlan, accumulates_into, is_pointwise
from .tasks import GroupTiler
from .tiling import CostModel
from .validate_memory import MemoryChecks, copy_back_pairs, cross_program, section_problems
from latch_core.errors import UserError

ARENA = "arena"


class ValidationError(UserError, ValueError):
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


# Documents proven hazard-free in this process, by the identity of their (immutable) sections and of
# the op registry: the pipeline validates, then the build validates what it is given (the same
# section objects), and the second proof is free. Weak references: nothing is kept alive.
_PROVEN: dict[tuple, tuple] = {}


def _proof_key(doc: Document, ops) -> tuple:
    return (id(doc.graph), id(doc.schedule), id(doc.memory), id(ops))


def _proven(doc: Document, ops) -> bool:
    hit = _PROVEN.get(_proof_key(doc, ops))
    return hit is not None and all(r() is x for r, x in zip(hit, (doc.graph, doc.schedule, doc.memory)))


def _remember(doc: Document, ops) -> None:
    key = _proof_key(doc, ops)
    try:
        refs = tuple(weakref.ref(x, lambda _r, k=key: _PROVEN.pop(k, None)) for x in (doc.graph, doc.schedule, doc.memory))
    except TypeError:  # a section that cannot be weakly referenced: do not remember
        return
    _PROVEN[key] = refs


def validate(doc: Document, *, ops: Registry | None = None, check_footprints: bool = True,
             check_memory: bool = True, limit: int = 200) -> list[str]:
    """Every problem found in ``doc`` (empty: proven hazard-free). Needs graph + schedule; the
    memory checks run when the document has a memory section and ``check_memory``."""
    if doc.graph is None or doc.schedule is None:
        return ["the document needs graph and schedule sections to be validated"]
    ops = _ops(ops)
    full = check_footprints and check_memory and doc.memory is not None
    if full and _proven(doc, ops):
        return []
    problems = _validate(doc, ops, check_footprints, check_memory, limit)
    if full and not problems:
        _remember(doc, ops)
    return problems


@gc_paused  # allocation-heavy: see latch_core.gcpause
def _validate(doc: Document, ops, check_footprints: bool, check_memory: bool, limit: int) -> list[str]:
    problems: list[str] = []
    memory = doc.memory if check_memory else None
    scheduled = {p.program for p in doc.schedule.programs}
    for g in doc.graph.programs:
        if g.name not in scheduled:
            problems.append(f"program {g.name!r} has no schedule; run the schedule pass")
    if memory is not None:
        problems += section_problems(doc)
        problems += cross_program(doc)
    layout = {v.name for v in doc.graph.layout}
    for ps in doc.schedule.programs:
        try:
            graph = doc.graph.program(ps.program)
        except Exception:
            problems.append(f"schedule names program {ps.program!r}, which the graph section lacks")
            continue
        if len(ps.sms) > doc.schedule.num_sms:
            problems.append(f"program {ps.program!r} has {len(ps.sms)} SM lists but the schedule is for "
                            f"num_sms = {doc.schedule.num_sms}; the kernel runs one list per SM")
        pm = None
        if memory is not None:
            try:
                pm = memory.program(ps.program)
            except KeyError:
                problems.append(f"program {ps.program!r} has no memory plan; run the memory plan pass")
        v = ProgramValidator(graph, ps, pm, ops, check_footprints, limit,
                             memory.alignment if memory is not None else 1,
                             pm.arena_bytes if pm is not None else 0)
        v.layout = layout
        v.copy_back = copy_back_pairs(doc, ps.program) if memory is not None else set()
        problems += v.run()
    return problems


def check(doc: Document, **kw: Any) -> None:
    problems = validate(doc, **kw)
    if problems:
        raise ValidationError(problems)


class ProgramValidator(MemoryChecks):
    def __init__(self, graph: Graph, ps: ProgramSchedule, pm: ProgramMemory | None, ops: Registry | None,
                 check_footprints: bool = True, limit: int = 200, alignment: int = 1, arena_bytes: int = 0):
        self.g = graph
        self.ps = ps
        self.pm = pm
        self.ops = ops
        self.check_footprints = check_footprints
        self.alignment = alignment
        self.arena_bytes = arena_bytes  # the program's arena (placements must end inside it)
        self.layout: set[str] = set()  # layout value names (buffers the runtime binds)
        self.copy_back: set[tuple[str, str]] = set()  # (new, old) pairs listed for copy-back
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
        if not ok:  # malformed groups or accesses: the indexes below would misread them
            return self.p.done()
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
            if self.ops is not None and n.op not in self.ops:
                src = f" from {n.source}" if n.source else ""
                p(f"{self.name}: node {n.name!r}{src} uses op {n.op}, which no installed plugin registers; install "
                  "the plugin that provides it (`latch-pipeline plugins` lists the ops)")
        if len(p.items) > start:
            return False
        consumers: dict[str, set[int]] = defaultdict(set)
        for n in g.nodes:
            for v in n.inputs:
                if v is not None:
                    consumers[v].add(node_group[n.name])
        outputs = set(g.output_names())
        self.plans: list[GroupPlan] = []
        position = {n.name: k for k, n in enumerate(g.nodes)}
        for i, grp in enumerate(ps.groups):
            gnodes = [nodes[nn] for nn in grp.nodes]
            produced = {o for n in gnodes for o in n.outputs}
            made_by = {o: k for k, n in enumerate(gnodes) for o in n.outputs}
            for k, n in enumerate(gnodes):
                late = [v for v in n.inputs if v is not None and made_by.get(v, -1) >= k]
                if late:
                    p(f"{self.name} group {i}: node {n.name!r} reads %{late[0]}, which a node listed after it in the "
                      "group computes; a group's nodes are computed in the order listed (graph order)")
            if [position[n.name] for n in gnodes] != sorted(position[n.name] for n in gnodes):
                p(f"{self.name} group {i}: nodes {list(grp.nodes)[:6]} are not in graph order")
            for what, seq in (("inputs", grp.inputs), ("outputs", grp.outputs), ("nodes", grp.nodes)):
                if len(set(seq)) != len(seq):
                    p(f"{self.name} group {i}: its {what} list a value twice ({list(seq)[:6]})")
            if gnodes and gnodes[-1].outputs and grp.primary != gnodes[-1].outputs[0]:
                p(f"{self.name} group {i}: primary %{grp.primary} is not the first output of its last node "
                  f"{gnodes[-1].name!r} (%{gnodes[-1].outputs[0]}); tiles cover the group's sink")
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
            if set(grp.inputs) - needed:
                p(f"{self.name} group {i}: lists inputs {sorted(set(grp.inputs) - needed)[:4]} that none of its nodes "
                  "reads from outside the group")
            specs = {n.name: self.ops.get(n.op) if self.ops is not None and n.op in self.ops else None for n in gnodes}
            pw = {n for n, sp in specs.items() if is_pointwise(sp)}
            onto = {n: j for n, sp in specs.items() if (j := accumulates_into(sp)) is not None}
            self.plans.append(GroupPlan(gnodes, grp.inputs, grp.outputs, internal, grp.primary,
                                        grp.body, len(pw) == len(gnodes), pw, onto=onto))
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
            self._exact_writes(t, need_w)
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

    def _exact_writes(self, t, need_w: dict) -> None:
        """A task's declared writes must be what its body stores for its tile, no more: the coverage
        and read-after-write checks believe a declared write computes those elements."""
        body = {v: b for v, b in need_w.items() if not is_empty(b)}
        declared: dict[str, list] = {}
        for a in t.writes:
            if not is_empty(a.box):
                declared.setdefault(a.value, []).append(a.box)
        for v, boxes in declared.items():
            b = body.get(v)
            if b is None or not all(contains(b, x) for x in boxes):
                got = [list(x) for x in boxes]
                made = f"writes %{v} {list(b)}" if b is not None else f"writes nothing of %{v}"
                self.p(f"{self.name}: {self.task(t.id)}: its body, for tile {list(t.tile)}, {made}, but the task declares "
                       f"it writes {got}; write footprints must be exactly what the body stores (elements outside "
                       "the tile would never be computed)")

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
        self.inputs_only = set(self.g.input_names())
        self.inputs = self.inputs_only | {v.name for v in self.g.values if v.role == CONST}
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
