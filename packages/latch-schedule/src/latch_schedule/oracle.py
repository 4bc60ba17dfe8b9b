"""A slow, brute-force reference for the validator (test support; never on a production path).

``violations(doc, ops)`` checks the rules of docs/CONTRACTS.md sections 3 and 4 by the most direct
method available, sharing no code with :mod:`latch_schedule.validate` or :mod:`latch_core.order`:

- happens-before: an explicit graph of the SM instructions (program order; a virtual node per
  barrier that every SM's k-th barrier enters and leaves; every signal of a counter into a wait
  for all of them; a wait for ``n < expected`` follows a task only when fewer than ``n`` of the
  counter's signals can come without it), closed transitively with bitsets; deadlock by running
  the lists with the kernel's counter and barrier arithmetic (monotone: one run decides);
- data: each value's index space cut into cells at every box boundary, and every read, write and
  coverage rule checked cell by cell against every task pair;
- memory: every pair of placements sharing a byte, checked task pair by task pair.

What a body touches for its tile comes from the op tilings (``latch_schedule.tasks.GroupTiler``):
that is the specification of the bodies, not validator logic.

The result is a list of violated rules (empty: the document is legal). The mutation test asks it
and the validator about the same documents and requires the same verdict.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from latch_core.document import Document
from latch_core.ir import CONST, DTYPES, Graph
from latch_core.registry import COPY, ELEMENTWISE, Registry

from .fusion import GroupPlan
from .tasks import GroupTiler
from .tiling import CostModel

ARENA = "arena"
POINTWISE = frozenset({ELEMENTWISE, COPY})


def violations(doc: Document, ops: Registry) -> list[str]:
    out: list[str] = []
    if doc.graph is None or doc.schedule is None:
        return ["no graph or schedule"]
    progs = {g.name for g in doc.graph.programs}
    sched = [p.program for p in doc.schedule.programs]
    out += [f"program {n} unscheduled" for n in sorted(progs - set(sched))]
    out += [f"schedule of unknown program {n}" for n in sched if n not in progs]
    m = doc.memory
    if m is not None:
        a = m.alignment
        if not (type(a) is int and a > 0 and a & (a - 1) == 0):
            out.append("alignment not a power of two")
        out += [f"no memory plan for {n}" for n in sched if n not in [p.program for p in m.programs]]
        for pm in m.programs:
            if pm.arena_bytes > m.arena_bytes:
                out.append(f"{pm.program}: arena larger than the section's")
        for item in dict(m.stats).get("copy_back", ()) or ():
            if not (isinstance(item, (tuple, list)) and len(item) == 3 and item[0] in sched):
                out.append(f"bad copy_back entry {item!r}")
        out += _constants_across(doc)
    for ps in doc.schedule.programs:
        if ps.program not in progs:
            continue
        if len(ps.sms) > doc.schedule.num_sms:
            out.append(f"{ps.program}: more lists than SMs")
        pm = None
        if m is not None:
            pm = next((p for p in m.programs if p.program == ps.program), None)
        out += _Program(doc, doc.graph.program(ps.program), ps, pm, ops).run()
    return out


def _constants_across(doc: Document) -> list[str]:
    consts, others = {}, []
    for pm in doc.memory.programs:
        if pm.program not in {g.name for g in doc.graph.programs}:
            continue
        g = doc.graph.program(pm.program)
        for p in pm.placements:
            if p.buffer == ARENA and p.nbytes > 0 and g.has_value(p.value):
                if g.value(p.value).role == CONST:
                    consts[(p.value, p.offset)] = p.nbytes
                else:
                    others.append((p.offset, p.offset + p.nbytes))
    out = []
    items = list(consts.items())
    for i, ((n1, o1), s1) in enumerate(items):
        for (n2, o2), s2 in items[i + 1:]:
            if o1 < o2 + s2 and o2 < o1 + s1:
                out.append(f"constants {n1} and {n2} overlap")
        if any(lo < o1 + s1 and o1 < hi for lo, hi in others):
            out.append(f"constant {n1} overlapped by a value")
    return out


def _pointwise_path(graph: Graph, nodes: list, ops: Registry, old: str, new: str) -> bool:
    """Everything the group computes from ``old`` up to ``new`` is elementwise at ``new``'s shape."""
    if graph.value(old).type != graph.value(new).type:
        return False
    shape = graph.value(new).shape
    tainted, reached = {old}, False
    for n in nodes:
        if not any(v in tainted for v in n.inputs if v is not None):
            continue
        if n.op not in ops or not (ops.get(n.op).tags & POINTWISE) or any(graph.value(o).shape != shape
                                                                            for o in n.outputs):
            return False
        tainted.update(n.outputs)
        reached = reached or new in n.outputs
    return reached


def _within(box, shape) -> bool:
    return len(box) == len(shape) and all(0 <= lo <= hi <= d for (lo, hi), d in zip(box, shape))


def _empty(box) -> bool:
    return any(hi <= lo for lo, hi in box)


def _boxes_overlap(a, b) -> bool:
    return len(a) == len(b) and all(l1 < h2 and l2 < h1 for (l1, h1), (l2, h2) in zip(a, b))


class _Cells:
    """A value's index space cut at every boundary of the given boxes."""

    def __init__(self, shape, boxes):
        self.cuts = []
        for d, n in enumerate(shape):
            pts = {0, n}
            for b in boxes:
                pts.update((b[d][0], b[d][1]))
            self.cuts.append(sorted(p for p in pts if 0 <= p <= n))

    def of(self, box):
        ranges = []
        for d, (lo, hi) in enumerate(box):
            c = self.cuts[d]
            ranges.append([k for k in range(len(c) - 1) if lo <= c[k] and c[k + 1] <= hi])
        return set(itertools.product(*ranges))


class _Program:
    def __init__(self, doc, g: Graph, ps, pm, ops):
        self.doc, self.g, self.ps, self.pm, self.ops = doc, g, ps, pm, ops
        self.out: list[str] = []

    def run(self) -> list[str]:
        ok = self._structure()
        if ok:
            self._footprints()
        if self._sync() and ok:
            self._data()
            if self.pm is not None:
                self._memory()
        elif self.pm is not None:
            self._bindings()
        return self.out

    # ---- structure -------------------------------------------------------------------------------
    def _structure(self) -> bool:
        g, ps, bad = self.g, self.ps, self.out.append
        n0 = len(self.out)
        nodes = {n.name: n for n in g.nodes}
        position = {n.name: k for k, n in enumerate(g.nodes)}
        owner: dict[str, int] = {}
        for i, grp in enumerate(ps.groups):
            if grp.id != i:
                bad(f"group {i} id {grp.id}")
            for nn in grp.nodes:
                if nn not in nodes or nn in owner:
                    bad(f"group {i} node {nn} unknown or twice")
                owner[nn] = i
        for n in g.nodes:
            if n.name not in owner:
                bad(f"node {n.name} in no group")
            if n.op not in self.ops:
                bad(f"node {n.name} op {n.op} unknown")
        if len(self.out) > n0:
            return False
        outputs = set(g.output_names())
        reads_of = defaultdict(set)
        for n in g.nodes:
            for v in n.inputs:
                if v is not None:
                    reads_of[v].add(owner[n.name])
        for i, grp in enumerate(ps.groups):
            gn = [nodes[x] for x in grp.nodes]
            if [position[x] for x in grp.nodes] != sorted(position[x] for x in grp.nodes):
                bad(f"group {i} nodes out of order")
            for seq in (grp.nodes, grp.inputs, grp.outputs):
                if len(set(seq)) != len(seq):
                    bad(f"group {i} repeats")
            produced = {o for n in gn for o in n.outputs}
            if not set(grp.outputs) <= produced:
                bad(f"group {i} outputs not produced")
            for v in produced - set(grp.outputs):
                if v in outputs or reads_of[v] - {i}:
                    bad(f"group {i} keeps {v} inside")
            if grp.primary not in grp.outputs or (gn and grp.primary != gn[-1].outputs[0]):
                bad(f"group {i} primary")
            needed = {v for n in gn for v in n.inputs if v is not None and v not in produced}
            if set(grp.inputs) != needed:
                bad(f"group {i} inputs {sorted(set(grp.inputs) ^ needed)[:3]}")
        for k, t in enumerate(ps.tasks):
            if t.id != k:
                bad(f"task {k} id")
            if not 0 <= t.group < len(ps.groups):
                bad(f"task {k} group")
                continue
            grp = ps.groups[t.group]
            for accs, allowed in ((t.reads, grp.inputs), (t.writes, grp.outputs)):
                for a in accs:
                    if not g.has_value(a.value) or a.value not in allowed or not _within(a.box, g.value(a.value).shape):
                        bad(f"task {k} access {a.value}")
            if g.has_value(grp.primary) and not _within(t.tile, g.value(grp.primary).shape):
                bad(f"task {k} tile")
        return len(self.out) == n0

    def _footprints(self) -> None:
        g, ps = self.g, self.ps
        nodes = {n.name: n for n in g.nodes}
        tilers = {}
        for t in ps.tasks:
            grp = ps.groups[t.group]
            if t.group not in tilers:
                gn = [nodes[x] for x in grp.nodes]
                plan = GroupPlan(gn, grp.inputs, grp.outputs, {o for n in gn for o in n.outputs} - set(grp.outputs),
                                 grp.primary, grp.body, False, ())
                try:
                    tilers[t.group] = GroupTiler(g, plan, self.ops, CostModel())
                except Exception as e:
                    self.out.append(f"group {t.group} untileable: {e}")
                    tilers[t.group] = None
            tiler = tilers[t.group]
            if tiler is None:
                continue
            need_r, need_w = tiler.footprint(t.tile)
            for v, box in need_r.items():
                if _empty(box):
                    continue
                have = [a.box for a in t.reads if a.value == v]
                cells = _Cells(g.value(v).shape, have + [box])
                if not cells.of(box) <= set().union(*(cells.of(b) for b in have)):
                    self.out.append(f"task {t.id} reads too little of {v}")
            written = {a.value for a in t.writes if not _empty(a.box)} | {v for v, b in need_w.items() if not _empty(b)}
            for v in written:
                have = [a.box for a in t.writes if a.value == v and not _empty(a.box)]
                body = [b for x, b in need_w.items() if x == v and not _empty(b)]
                cells = _Cells(g.value(v).shape, have + body)
                if set().union(*(cells.of(b) for b in have)) != set().union(*(cells.of(b) for b in body)):
                    self.out.append(f"task {t.id} write footprint of {v} is not its tile's")

    # ---- order -------------------------------------------------------------------------------------
    def _sync(self) -> bool:
        ps, bad = self.ps, self.out.append
        n0 = len(self.out)
        expected = {}
        for c in ps.counters:
            if c.id in expected:
                bad(f"counter {c.id} twice")
            expected[c.id] = c.expected
        place = {}
        signals = defaultdict(int)
        for s, sm in enumerate(ps.sms):
            k = 0
            for i, ins in enumerate(sm):
                kind = ins[0] if ins else None
                ok_shape = len(ins) == (3 if kind == "wait" else 2) and all(type(x) is int for x in ins[1:])
                if kind not in ("task", "barrier", "wait", "signal") or not ok_shape:
                    bad(f"SM {s} #{i} malformed {ins!r}")
                    continue
                if kind == "task":
                    if ins[1] in place or not 0 <= ins[1] < len(ps.tasks):
                        bad(f"task {ins[1]} listed twice or unknown")
                    place[ins[1]] = (s, i)
                elif kind == "barrier":
                    if ins[1] != k:
                        bad(f"SM {s}: barrier #{k} is {ins[1]}")
                    k += 1
                elif ins[1] not in expected:
                    bad(f"SM {s}: undeclared counter {ins[1]}")
                elif kind == "signal":
                    signals[ins[1]] += 1
                elif not 0 <= ins[2] <= expected[ins[1]]:
                    bad(f"SM {s}: wait count {ins[2]}")
            if k != ps.num_barriers:
                bad(f"SM {s}: {k} barriers of {ps.num_barriers}")
        if len(place) != len(ps.tasks):
            bad("a task on no list")
        for c, e in expected.items():
            if signals[c] != e:
                bad(f"counter {c}: {signals[c]} signals, expects {e}")
        if len(self.out) > n0:
            return False
        if self._deadlocks(expected):
            bad("deadlock")
            return False
        self._closure(expected, place)
        return True

    def _deadlocks(self, expected) -> bool:
        """One run with the kernel's arithmetic (launch 0; the counts are exact, so launch 1 repeats
        it). Progress is monotone, so if this run gets stuck every run does."""
        ps = self.ps
        S = len(ps.sms)
        pcs = [0] * S
        here = [False] * S  # SM s has arrived at the barrier it is at
        count = defaultdict(int)
        arrivals = 0
        moved = True
        while moved:
            moved = False
            for s, sm in enumerate(ps.sms):
                while pcs[s] < len(sm):
                    ins = sm[pcs[s]]
                    if ins[0] == "wait" and count[ins[1]] < ins[2]:
                        break
                    if ins[0] == "barrier":
                        if not here[s]:
                            here[s] = True
                            arrivals += 1
                            moved = True
                        if arrivals < (ins[1] + 1) * S:
                            break
                        here[s] = False
                    if ins[0] == "signal":
                        count[ins[1]] += 1
                    pcs[s] += 1
                    moved = True
        return any(pcs[s] < len(sm) for s, sm in enumerate(ps.sms))

    def _closure(self, expected, place) -> None:
        """``anc[node]``: a bitset of the instruction nodes that happen before it. Edges: program
        order; SM s's k-th barrier -> barrier node k -> the next instruction of every SM; every
        signal of a counter -> a wait for all of them. A wait for fewer (``n < expected``) is solved
        as a fixpoint: it follows the nodes that precede more than ``|pool| - n`` of the signals
        that can come before it (``pool``: those not after it); such waits only appear in mutants."""
        ps = self.ps
        index, nodes = {}, []
        for s, sm in enumerate(ps.sms):
            for i, ins in enumerate(sm):
                index[(s, i)] = len(nodes)
                nodes.append((s, i, ins))
        total = len(nodes) + ps.num_barriers
        preds: list[list[int]] = [[] for _ in range(total)]
        sig_nodes = defaultdict(list)
        partial = {}
        for s, sm in enumerate(ps.sms):
            k = 0
            for i, ins in enumerate(sm):
                me = index[(s, i)]
                if i > 0:
                    prev = sm[i - 1]
                    preds[me].append(len(nodes) + k - 1 if prev[0] == "barrier" else index[(s, i - 1)])
                if ins[0] == "barrier":
                    preds[len(nodes) + k].append(me)
                    k += 1
                elif ins[0] == "signal":
                    sig_nodes[ins[1]].append(me)
        for s, sm in enumerate(ps.sms):
            for i, ins in enumerate(sm):
                if ins[0] == "wait" and ins[2] > 0:
                    if ins[2] == expected[ins[1]]:
                        preds[index[(s, i)]].extend(sig_nodes[ins[1]])
                    else:
                        partial[index[(s, i)]] = (ins[1], ins[2])
        extra: dict[int, int] = {}
        while True:
            anc = _close(preds, extra)
            new = {}
            for w, (c, n) in partial.items():
                pool = [anc[sg] | (1 << sg) for sg in sig_nodes[c] if not (anc[sg] >> w) & 1]
                new[w] = _at_least(pool, len(pool) - n + 1)
            if new == extra:
                break
            extra = new
        self.anc = anc
        self.node_of = {t: index[place[t]] for t in place}

    def before(self, a: int, b: int) -> bool:
        return a != b and bool((self.anc[self.node_of[b]] >> self.node_of[a]) & 1)

    # ---- data --------------------------------------------------------------------------------------
    def _data(self) -> None:
        g, ps = self.g, self.ps
        inputs = set(g.input_names()) | {v.name for v in g.values if v.role == CONST}
        acc = defaultdict(lambda: ([], []))  # value -> (reads, writes) as (task, box)
        for t in ps.tasks:
            for a in t.reads:
                acc[a.value][0].append((t.id, a.box))
            for a in t.writes:
                acc[a.value][1].append((t.id, a.box))
        outs = {v for grp in ps.groups for v in grp.outputs}
        for v in set(acc) | outs:
            reads, writes = acc[v]
            shape = g.value(v).shape
            cells = _Cells(shape, [b for _, b in reads + writes])
            wcells = defaultdict(set)
            for t, b in writes:
                for c in cells.of(b):
                    wcells[c].add(t)
            if v in outs and set(wcells) != cells.of(tuple((0, n) for n in shape)):
                self.out.append(f"{v} not fully written")
            for c, ws in wcells.items():
                ws = sorted(ws)
                for i, a in enumerate(ws):
                    for b in ws[i + 1:]:
                        if not (self.before(a, b) or self.before(b, a)):
                            self.out.append(f"write race on {v}")
            for t, b in reads:
                for c in cells.of(b):
                    ws = wcells.get(c, ())
                    if not ws and v not in inputs:
                        self.out.append(f"task {t} reads unwritten {v}")
                    if t in ws or any(not self.before(w, t) for w in ws):
                        self.out.append(f"task {t} reads {v} unordered with a write")
        self.acc = acc

    # ---- memory -------------------------------------------------------------------------------------
    def _bindings(self) -> dict:
        g, pm, bad = self.g, self.pm, self.out.append
        inputs = set(g.input_names())
        inplace = dict(g.inplace)
        cb = {(it[1], it[2]) for it in dict(self.doc.memory.stats).get("copy_back", ()) or ()
              if isinstance(it, (tuple, list)) and len(it) == 3 and it[0] == self.ps.program}
        place = {}
        for p in pm.placements:
            if p.value in place or not g.has_value(p.value):
                bad(f"placement {p.value} twice or undeclared")
                continue
            place[p.value] = p
            v = g.value(p.value)
            if p.nbytes != v.nbytes:
                bad(f"{p.value} size")
            if p.value in inputs:
                if (p.buffer, p.offset) != (p.value, 0):
                    bad(f"input {p.value} not in its buffer")
            elif p.buffer != ARENA:
                if v.role == CONST or inplace.get(p.value) != p.buffer or p.offset != 0:
                    bad(f"{p.value} in buffer {p.buffer}")
            else:
                if p.value in inplace and (p.value, inplace[p.value]) not in cb:
                    bad(f"{p.value} in the arena without copy-back")
                e = DTYPES.get(v.dtype, 1)
                if p.offset < 0 or p.offset % max(1, self.doc.memory.alignment) or p.offset % e \
                        or p.offset + p.nbytes > pm.arena_bytes:
                    bad(f"{p.value} offset {p.offset}")
        for new, old in cb:
            if inplace.get(new) != old or (new in place and place[new].buffer != ARENA):
                bad(f"copy_back {new}->{old}")
        return place

    def _memory(self) -> None:
        g, ps, bad = self.g, self.ps, self.out.append
        place = self._bindings()
        touched = set(self.acc) | set(g.output_names())
        for v in touched:
            if v not in place:
                bad(f"{v} unplaced")
        outputs = set(g.output_names())
        live_in = set(g.input_names()) | {v.name for v in g.values if v.role == CONST}
        nodes = {n.name: n for n in g.nodes}
        users = {v: {t for t, _ in r + w} for v, (r, w) in self.acc.items()}
        writers = {v: {t for t, _ in w} for v, (r, w) in self.acc.items()}

        def done_before(u, v) -> bool:
            if u in outputs or v in live_in:
                return False
            return all(self.before(x, w) for x in users.get(u, ()) for w in writers.get(v, ()))

        def boxes_ok(u, v) -> bool:  # u old, v new: same bytes, same type
            if u in outputs or v in live_in:
                return False
            r, w = self.acc.get(u, ([], []))
            for wt, wb in self.acc.get(v, ([], []))[1]:
                for kind, items in (("r", r), ("w", w)):
                    for x, xb in items:
                        if not _boxes_overlap(xb, wb):
                            continue
                        if x == wt:
                            grp = ps.groups[ps.tasks[x].group]
                            if kind == "w" or not _pointwise_path(g, [nodes[n] for n in grp.nodes], self.ops, u, v):
                                return False
                        elif not self.before(x, wt):
                            return False
            return True

        items = [p for p in place.values() if p.nbytes > 0]
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                if a.buffer != b.buffer or not (a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes):
                    continue
                u, v = a.value, b.value
                if CONST in (g.value(u).role, g.value(v).role):
                    bad(f"constant {u}/{v} shares bytes")
                    continue
                if done_before(u, v) or done_before(v, u):
                    continue
                same = (a.offset, a.nbytes) == (b.offset, b.nbytes) and g.value(u).type == g.value(v).type
                if same and (boxes_ok(u, v) or boxes_ok(v, u)):
                    continue
                bad(f"{u} and {v} share bytes while live")
        for v, p in place.items():
            ws, us = writers.get(v, set()), users.get(v, set())
            if p.first != -1 and (p.first not in ws or any(self.before(w, p.first) for w in ws)):
                bad(f"{v} first {p.first}")
            if p.last != -1 and (v in outputs or p.last not in us or any(self.before(p.last, x) for x in us)):
                bad(f"{v} last {p.last}")


def _close(preds: list[list[int]], extra: dict[int, int]) -> list[int]:
    """Ancestor bitsets of an acyclic graph given by predecessor lists (plus ``extra`` ancestors)."""
    n = len(preds)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for v, ps_ in enumerate(preds):
        for u in ps_:
            succ[u].append(v)
            indeg[v] += 1
    anc = [0] * n
    ready = [v for v in range(n) if indeg[v] == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        a = extra.get(v, 0)
        for u in preds[v]:
            a |= anc[u] | (1 << u)
        anc[v] = a
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if done != n:
        raise AssertionError("the happens-before graph of a deadlock-free schedule has a cycle")
    return anc


def _at_least(bitsets: list[int], k: int) -> int:
    """Bits set in at least ``k`` of ``bitsets``."""
    if k <= 0:
        return -1
    if k > len(bitsets):
        return 0
    level = [-1] + [0] * k  # level[j]: bits seen in at least j sets so far
    for b in bitsets:
        for j in range(k, 0, -1):
            level[j] |= level[j - 1] & b
    return level[k]
