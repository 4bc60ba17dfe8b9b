"""Test support: small ops (namespace ``sched_test::``), graph builders, a trivial memory plan,
and the mutation generator the validator is tested with. Nothing here is on a production path.

- :class:`TestOps` is a plugin object registering elementwise, matmul, reduction, norm and
  untagged ops with honest tags (load it with ``latch_core.plugins.load_with(("t", TestOps()))``);
- :func:`distinct_placements` gives every value its own bytes (a memory plan that is always legal);
- :func:`mutants` derives broken (schedule, memory) pairs from a valid one: each is a real hazard by
  construction, and the validator must reject every one.
"""

from __future__ import annotations

import random
from typing import Iterator

import attrs

from latch_core.document import Document
from latch_core.hookspecs import hookimpl
from latch_core.ir import Graph, GraphSection, Group, Node, TensorType, Value
from latch_core.order import Order
from latch_core.registry import COPY, ELEMENTWISE, MATMUL, NORM, REDUCTION, OpSpec, ShapeError
from latch_core.sections import (
    BARRIER, SIGNAL, WAIT, MemorySection, Placement, ProgramMemory, ProgramSchedule,
)

NS = "sched_test"


def _bcast(inputs, attrs):
    shapes = [t.shape for t in inputs if t is not None]
    R = max(len(s) for s in shapes)
    out = [1] * R
    for s in shapes:
        for j, d in enumerate(s):
            k = R - len(s) + j
            if d != 1 and out[k] not in (1, d):
                raise ShapeError(f"shapes {shapes} do not broadcast")
            out[k] = max(out[k], d)
    return [TensorType(tuple(out), inputs[0].dtype)]


def _matmul(inputs, attrs):
    a, b = inputs
    if len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul {a} @ {b}")
    return [TensorType(a.shape[:-1] + (b.shape[-1],), a.dtype)]


def _sum(inputs, attrs):
    (x,) = inputs
    dims = attrs["dims"]
    keep = attrs.get("keepdim", False)
    shape = tuple((1 if keep else None) if d in dims else n for d, n in enumerate(x.shape))
    return [TensorType(tuple(n for n in shape if n is not None), x.dtype)]


def _rmsnorm(inputs, attrs):
    x, w = inputs
    return [TensorType(x.shape, x.dtype), TensorType(x.shape[:-1], x.dtype)]


def _gather(inputs, attrs):
    table, idx = inputs
    return [TensorType(idx.shape + table.shape[1:], table.dtype)]


def _cast(inputs, attrs):
    return [TensorType(inputs[0].shape, attrs["dtype"])]


def _transpose(inputs, attrs):
    (x,) = inputs
    return [TensorType(x.shape[:-2] + (x.shape[-1], x.shape[-2]), x.dtype)]


def _transpose_tiling(in_types, out_types, attrs):
    """An op the tags cannot describe, tiled through OpSpec.extra["tiling"]: a tile of the output
    reads the transposed box of the input."""
    from .tiling import Tiling

    R = len(out_types[0].shape)
    return Tiling(tuple(range(R)), lambda box: ([tuple(box[:-2]) + (box[-1], box[-2])], [box]), kind="transpose")


SPECS = [
    OpSpec(f"{NS}::add", "add(a, b) -> out", _bcast, tags={ELEMENTWISE}, num_inputs=(2, 2)),
    OpSpec(f"{NS}::mul", "mul(a, b) -> out", _bcast, tags={ELEMENTWISE}, num_inputs=(2, 2)),
    OpSpec(f"{NS}::relu", "relu(x) -> out", _bcast, tags={ELEMENTWISE}, num_inputs=(1, 1)),
    OpSpec(f"{NS}::cast", "cast(x) {dtype} -> out", _cast, tags={ELEMENTWISE, COPY}, num_inputs=(1, 1)),
    OpSpec(f"{NS}::sgd", "sgd(w, g, lr) -> w'", _bcast, tags={ELEMENTWISE}, num_inputs=(3, 3)),
    OpSpec(f"{NS}::matmul", "matmul(a, b) -> out", _matmul, tags={MATMUL}, num_inputs=(2, 2),
           cost=lambda i, o, a: (2 * o[0].numel * i[0].shape[-1], sum(t.nbytes for t in list(i) + list(o)))),
    OpSpec(f"{NS}::sum", "sum(x) {dims, keepdim} -> out", _sum, tags={REDUCTION}, num_inputs=(1, 1)),
    OpSpec(f"{NS}::rmsnorm", "rmsnorm(x, w) -> (y, rstd)", _rmsnorm, tags={NORM}, num_inputs=(2, 2)),
    OpSpec(f"{NS}::gather", "gather(table, idx) -> rows", _gather, tags=set(), num_inputs=(2, 2)),
    OpSpec(f"{NS}::transpose", "transpose(x) -> x^T", _transpose, tags=set(), num_inputs=(1, 1),
           extra={"tiling": _transpose_tiling}),
]


class TestOps:
    @hookimpl
    def latch_register_ops(self, register):
        for s in SPECS:
            register(s)


def op(name: str) -> str:
    return f"{NS}::{name}"


class Builder:
    """A tiny graph builder: ``b.input(...)``, ``b.node(op, [ins], attrs) -> out names``."""

    def __init__(self, ops, name: str = "update"):
        self.ops = ops
        self.name = name
        self.values: list[Value] = []
        self.nodes: list[Node] = []
        self.groups: dict[str, list[str]] = {}
        self._types: dict[str, TensorType] = {}

    def input(self, group: str, name: str, shape, dtype="f32", role="param") -> str:
        self.values.append(Value(name, tuple(shape), dtype, role))
        self.groups.setdefault(group, []).append(name)
        self._types[name] = TensorType(tuple(shape), dtype)
        return name

    def node(self, opname: str, inputs, attrs=None, n_out: int = 1, name: str | None = None) -> list[str]:
        spec = self.ops.get(op(opname))
        types = spec.check([self._types[i] for i in inputs], attrs or {})
        k = len(self.nodes)
        nname = name or f"n{k}_{opname}"
        outs = [f"{nname}.{j}" if len(types) > 1 else nname for j in range(len(types))]
        for o, t in zip(outs, types):
            self.values.append(Value(o, t.shape, t.dtype))
            self._types[o] = t
        self.nodes.append(Node(nname, op(opname), inputs, outs, attrs or {}, source=f"test.py:{k + 1} in build"))
        return outs

    def graph(self, outputs: dict[str, list[str]], inplace=()) -> Graph:
        return Graph(self.name, self.values, self.nodes, [Group(g, v) for g, v in self.groups.items()],
                     [Group(g, v) for g, v in outputs.items()], inplace=inplace)


def two_layer(ops, rows: int = 512, d: int = 256, h: int = 512, dataflow_friendly: bool = True) -> Document:
    """x -> matmul w1 -> relu -> matmul w2 -> rmsnorm -> sum = loss; an SGD update of w1 and w2
    written in place (gradients faked as functions of activations to keep the graph small)."""
    b = Builder(ops)
    w1 = b.input("params", "w1", (d, h))
    w2 = b.input("params", "w2", (h, d))
    nw = b.input("params", "nw", (d,))
    x = b.input("batch", "x", (rows, d), role="batch")
    lr = b.input("hyper", "lr", (), role="hyper")
    (a,) = b.node("matmul", [x, w1])
    (r,) = b.node("relu", [a])
    (m,) = b.node("matmul", [r, w2])
    (y, rstd) = b.node("rmsnorm", [m, nw], n_out=2)
    (z,) = b.node("mul", [y, y])
    (rowsum,) = b.node("sum", [z], {"dims": (1,), "keepdim": False})
    (loss,) = b.node("sum", [rowsum], {"dims": (0,), "keepdim": False})
    (xt,) = b.node("transpose", [x])
    (g1,) = b.node("matmul", [xt, r])  # [d, h]
    (rt,) = b.node("transpose", [r])
    (g2,) = b.node("matmul", [rt, y])  # [h, d]
    (nw1,) = b.node("sgd", [w1, g1, lr])
    (nw2,) = b.node("sgd", [w2, g2, lr])
    g = b.graph({"new_params": [nw1, nw2], "loss": [loss]}, inplace=[(nw1, w1), (nw2, w2)])
    return Document(graph=GraphSection(programs=[g], layout=[g.value(w1), g.value(w2), g.value(nw)]))


def distinct_placements(doc: Document, alignment: int = 256) -> Document:
    """A memory section where every arena value has its own bytes (always legal); inputs live in
    their own buffers and in-place new values in the buffer of the value they overwrite."""
    programs = []
    top = 0
    for ps in doc.schedule.programs:
        g = doc.graph.program(ps.program)
        inputs = set(g.input_names())
        inplace = dict(g.inplace)
        touched = {a.value for t in ps.tasks for a in t.reads + t.writes}
        placements = []
        off = 0
        for name in sorted(touched):
            v = g.value(name)
            if name in inputs:
                placements.append(Placement(name, name, 0, v.nbytes))
            elif name in inplace:
                placements.append(Placement(name, inplace[name], 0, v.nbytes))
            else:
                placements.append(Placement(name, "arena", off, v.nbytes))
                off += -(-max(v.nbytes, 1) // alignment) * alignment
        programs.append(ProgramMemory(ps.program, placements, off, off))
        top = max(top, off)
    return attrs.evolve(doc, memory=MemorySection(alignment, top, programs))


# ---------------------------------------------------------------------------------------------
# Mutants: each one a real hazard, by construction


@attrs.frozen
class Mutant:
    kind: str
    detail: str
    doc: Document


def _with_program(doc: Document, ps: ProgramSchedule | None = None, pm: ProgramMemory | None = None) -> Document:
    out = doc
    if ps is not None:
        out = attrs.evolve(out, schedule=attrs.evolve(out.schedule, programs=[
            ps if p.program == ps.program else p for p in out.schedule.programs]))
    if pm is not None:
        out = attrs.evolve(out, memory=attrs.evolve(out.memory, programs=[
            pm if p.program == pm.program else p for p in out.memory.programs]))
    return out


def _deps(ps: ProgramSchedule) -> list[tuple[int, int, str]]:
    """(producer, consumer, value) read-after-write pairs from the footprints."""
    from .boxes import BoxIndex

    writers: dict[str, list] = {}
    for t in ps.tasks:
        for a in t.writes:
            writers.setdefault(a.value, []).append((a.box, t.id))
    idx = {v: BoxIndex(items) for v, items in writers.items()}
    out = []
    for t in ps.tasks:
        for a in t.reads:
            if a.value in idx:
                for w in idx[a.value].query(a.box):
                    if w != t.id:
                        out.append((w, t.id, a.value))
    return out


def mutants(doc: Document, rng: random.Random, per_kind: int = 3) -> Iterator[Mutant]:
    """Broken variants of a valid scheduled + planned ``doc`` (first program only)."""
    ps = doc.schedule.programs[0]
    pm = doc.memory.program(ps.program)
    g = doc.graph.program(ps.program)
    order = Order.from_schedule(ps)
    deps = _deps(ps)
    cross = [(w, r, v) for w, r, v in deps if order.position(w)[0] != order.position(r)[0]]

    # 1. drop a barrier (from every SM): keep one that separates a cross-SM producer/consumer pair
    #    with no other barrier between their phases.
    if ps.num_barriers:
        bpos = [[i for i, ins in enumerate(sm) if ins[0] == BARRIER] for sm in ps.sms]

        def barriers_between(w, r):
            (sw, iw), (sr, ir) = order.position(w), order.position(r)
            after_w = {ps.sms[sw][i][1] for i in bpos[sw] if i > iw}
            before_r = {ps.sms[sr][i][1] for i in bpos[sr] if i < ir}
            return after_w & before_r

        candidates = {}
        for w, r, v in cross:
            bs = barriers_between(w, r)
            if len(bs) == 1:
                candidates.setdefault(next(iter(bs)), (w, r, v))
        for b in rng.sample(sorted(candidates), min(per_kind, len(candidates))):
            sms = [[(BARRIER, ins[1] - (ins[1] > b)) if ins[0] == BARRIER else ins for ins in sm
                    if not (ins[0] == BARRIER and ins[1] == b)] for sm in ps.sms]
            mps = attrs.evolve(ps, sms=sms, num_barriers=ps.num_barriers - 1)
            w, r, v = candidates[b]
            yield Mutant("drop_barrier", f"barrier {b} (task {r} reads %{v} from task {w})", _with_program(doc, mps))
        # the same barrier dropped on one SM only: the others wait forever
        b = rng.randrange(ps.num_barriers)
        s = rng.randrange(len(ps.sms))
        sms = [list(sm) for sm in ps.sms]
        sms[s] = [ins for ins in sms[s] if not (ins[0] == BARRIER and ins[1] == b)]
        yield Mutant("drop_barrier_one_sm", f"barrier {b} on SM {s}", _with_program(doc, attrs.evolve(ps, sms=sms)))

    # 2. drop a wait / remove a signal (dataflow)
    waits = [(s, i) for s, sm in enumerate(ps.sms) for i, ins in enumerate(sm) if ins[0] == WAIT]
    if waits:
        # a wait is needed when the task after it reads from a producer it alone orders
        made = 0
        for s, i in rng.sample(waits, min(len(waits), per_kind * 4)):
            sms = [list(sm) for sm in ps.sms]
            del sms[s][i]
            mps = attrs.evolve(ps, sms=sms)
            try:
                mo = Order.from_schedule(mps)
            except Exception:
                continue
            broken = [(w, r, v) for w, r, v in deps if not mo.before(w, r)]
            if broken:
                w, r, v = broken[0]
                yield Mutant("drop_wait", f"SM {s} instruction {i} (task {r} reads %{v} from task {w})",
                             _with_program(doc, mps))
                made += 1
                if made >= per_kind:
                    break
    signals = [(s, i) for s, sm in enumerate(ps.sms) for i, ins in enumerate(sm) if ins[0] == SIGNAL]
    for s, i in rng.sample(signals, min(len(signals), per_kind)):
        sms = [list(sm) for sm in ps.sms]
        c = sms[s][i][1]
        del sms[s][i]
        yield Mutant("remove_signal", f"signal(c{c}) at SM {s} instruction {i}", _with_program(doc, attrs.evolve(ps, sms=sms)))

    # 3. reorder: swap a dependent pair on one SM, or hoist a consumer to the front of its SM.
    same = [(w, r, v) for w, r, v in deps if order.position(w)[0] == order.position(r)[0]]
    for w, r, v in rng.sample(same, min(per_kind, len(same))):
        s, iw = order.position(w)
        _, ir = order.position(r)
        sms = [list(sm) for sm in ps.sms]
        sms[s][iw], sms[s][ir] = sms[s][ir], sms[s][iw]
        yield Mutant("swap_tasks", f"tasks {w} and {r} on SM {s} (task {r} reads %{v})",
                     _with_program(doc, attrs.evolve(ps, sms=sms)))
    for w, r, v in rng.sample(cross, min(per_kind, len(cross))):
        s, ir = order.position(r)
        sms = [list(sm) for sm in ps.sms]
        ins = sms[s].pop(ir)
        sms[s].insert(0, ins)
        yield Mutant("hoist_consumer", f"task {r} moved to the front of SM {s} (reads %{v} from task {w})",
                     _with_program(doc, attrs.evolve(ps, sms=sms)))

    # 4. shift an offset into another live value: two arena values read by one task are live
    #    together, so they can never share bytes.
    places = {p.value: p for p in pm.placements}
    pairs = []
    for t in ps.tasks:
        arena_reads = sorted({a.value for a in t.reads if places.get(a.value) and places[a.value].buffer == "arena"
                              and g.value(a.value).role != "const"})
        for i in range(len(arena_reads)):
            for j in range(i + 1, len(arena_reads)):
                pairs.append((arena_reads[i], arena_reads[j], t.id))
    for u, v, t in rng.sample(pairs, min(per_kind, len(pairs))):
        new = [attrs.evolve(p, offset=places[u].offset) if p.value == v else p for p in pm.placements]
        yield Mutant("shift_offset", f"%{v} moved onto %{u} (both read by task {t})",
                     _with_program(doc, pm=attrs.evolve(pm, placements=new)))

    # 5. shorten a lifetime: %u's declared life ends at its producer, and a value written by a
    #    task that reads %u takes %u's bytes (unless that task could legally update in place).
    cands = []
    for t in ps.tasks:
        grp = ps.groups[t.group]
        for a in t.reads:
            u = a.value
            pu = places.get(u)
            if pu is None or pu.buffer != "arena" or g.value(u).role == "const" or u in g.input_names():
                continue
            for wv in t.writes:
                pv = places.get(wv.value)
                if pv is None or pv.buffer != "arena" or wv.value in g.output_names():
                    continue
                inplace_ok = g.value(u).type == g.value(wv.value).type and len(grp.nodes) >= 1
                cands.append((u, wv.value, t.id, inplace_ok))
    rng.shuffle(cands)
    made = 0
    for u, v, t, maybe_legal in cands:
        if maybe_legal:
            continue
        writers = [x.id for x in ps.tasks if any(a.value == u for a in x.writes)]
        new = []
        for p in pm.placements:
            if p.value == u:
                p = attrs.evolve(p, last=writers[0] if writers else p.first)
            elif p.value == v:
                p = attrs.evolve(p, offset=places[u].offset)
            new.append(p)
        yield Mutant("shorten_lifetime", f"%{u} declared dead after its producer; %{v} (written by task {t}, "
                     f"which reads %{u}) reuses its bytes", _with_program(doc, pm=attrs.evolve(pm, placements=new)))
        made += 1
        if made >= per_kind:
            break


def residual_stack(ops, layers: int = 8, rows: int = 2048, d: int = 768, h: int = 2048) -> Document:
    """A transformer-shaped synthetic program for scale tests: per layer rmsnorm -> matmul ->
    relu -> matmul -> residual add, a 'backward' of two weight-gradient matmuls through transposes,
    then an in-place SGD update of every weight; a row-sum loss at the end."""
    b = Builder(ops)
    x = b.input("batch", "x", (rows, d), role="batch")
    lr = b.input("hyper", "lr", (), role="hyper")
    outs, inplace, acts = [], [], []
    ws = []
    for i in range(layers):
        w1 = b.input("params", f"w1_{i}", (d, h))
        w2 = b.input("params", f"w2_{i}", (h, d))
        nw = b.input("params", f"nw_{i}", (d,))
        (y, _rstd) = b.node("rmsnorm", [x, nw], n_out=2)
        (a,) = b.node("matmul", [y, w1])
        (r,) = b.node("relu", [a])
        (m,) = b.node("matmul", [r, w2])
        (x,) = b.node("add", [x, m])
        acts.append((y, r))
        ws.append((w1, w2))
    (sq,) = b.node("mul", [x, x])
    (rs,) = b.node("sum", [sq], {"dims": (1,), "keepdim": False})
    (loss,) = b.node("sum", [rs], {"dims": (0,), "keepdim": False})
    for (y, r), (w1, w2) in zip(reversed(acts), reversed(ws)):
        (yt,) = b.node("transpose", [y])
        (g1,) = b.node("matmul", [yt, r])
        (rt,) = b.node("transpose", [r])
        (g2,) = b.node("matmul", [rt, x])
        (n1,) = b.node("sgd", [w1, g1, lr])
        (n2,) = b.node("sgd", [w2, g2, lr])
        outs += [n1, n2]
        inplace += [(n1, w1), (n2, w2)]
    g = b.graph({"new_params": outs, "loss": [loss]}, inplace=inplace)
    return Document(graph=GraphSection(programs=[g]))
