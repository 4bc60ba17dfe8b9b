"""The arena simulator: run the exact schedule and memory plan of a program on the CPU.

What it executes (docs/CONTRACTS.md section 5):
- one arena and one external buffer per named buffer, each a flat array indexed by the plan's byte
  offsets; every value is read and written at its planned offset, so two values the plan puts on
  the same bytes really share them here;
- the tasks in a random legal order (``latch_core.order.legal_order``: the SM lists interleaved at
  random, respecting barriers and counter waits; a schedule that cannot finish raises its
  DeadlockError, which names every stuck SM and its instruction);
- each task computes its whole fusion group with the ops' ``extra["reference"]`` functions, on
  copies of its inputs in which everything outside the task's read boxes is poisoned (NaN for
  floats), then stores ONLY its write boxes: a footprint smaller than what the body needs shows up
  as NaN in the result. Integers have no NaN, and a poisoned index makes a gather's reference
  fail: a task whose integer inputs are partly outside its boxes (an embedding split by rows of
  its indices) runs its group twice, the unread integers filled with the smallest and then the
  largest value it did read, and a write-box element that differs between the two depends on
  unread data: NaN (or an error for an integer result);
- when the last reader of a value has run, the value's bytes are poisoned (NaN) and marked free.

Storage width: every element is stored as float64, whatever its dtype, at ``esize`` consecutive
slots of a float64 array with one slot per planned byte (element ``i`` of a value at ``offset``
occupies slots ``offset + i*esize ... + esize - 1``, each holding the element). The layout is the
plan's, byte for byte, and arithmetic stays exact, so the result matches the FP64 reference
interpreter to rounding. A read takes the first slot and treats the element as NaN unless all its
slots agree: a partial overwrite by a misaligned value is caught too. Integers (< 2**53) and
booleans round-trip exactly. Cost: 8 bytes of host memory per planned byte.

Cost: bookkeeping (pending reads, ownership, clobber checks) is local to the boxes a task touches;
what grows with the whole value is the poisoned copy of each input and the group's reference,
once per task (the project's transformer at d_model 512, seq 256, 2,529 tasks: ~50 s on CI's
2 cores; it could not run before, as its embedding is split into several tasks).

Checks (``checks=True``, the default), besides the numbers: every byte carries the id of the value
that last wrote it and every element of a value the number of reads still to come (including one
for the program's exit when the value is an output). A write over bytes of another value with
reads still pending, and a read of bytes that no longer (or never) held the value, raise
:class:`SimulationError` naming the task, both values, their placements and the readers still
waiting: a lifetime bug in the plan, a missing dependency in the schedule. With ``checks=False``
the same bugs show up only as NaN or wrong numbers.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from latch_core import inputs as input_rules
from latch_core.document import Document
from latch_core.ir import DTYPES, FLOAT_DTYPES
from latch_core.order import legal_order
from latch_core.errors import UserError

FREED = -1
UNWRITTEN = -2
ARENA = "arena"

_TORCH = {
    "f64": torch.float64, "f32": torch.float64, "bf16": torch.float64, "f16": torch.float64,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
    "bool": torch.bool,
}


class SimulationError(UserError, RuntimeError):
    """The schedule or memory plan does something the program's semantics forbid."""


def _overlapping(boxes) -> bool:
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(boxes[i], boxes[j])):
                return True
    return False


def _fmt_box(box) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


class _Buffer:
    def __init__(self, name: str, nbytes: int):
        self.name = name
        self.data = torch.full((nbytes,), float("nan"), dtype=torch.float64)
        self.owner = torch.full((nbytes,), UNWRITTEN, dtype=torch.int32)


class ArenaSimulator:
    """One program's schedule + memory plan, ready to run; see the module docstring."""

    def __init__(self, doc: Document, program: str, *, ops=None, checks: bool = True, check_finite: bool | None = None):
        if doc.graph is None or doc.schedule is None or doc.memory is None:
            raise SimulationError(
                f"simulate: the document lacks section(s) {sorted({'graph', 'schedule', 'memory'} - doc.sections())}; "
                "run capture, schedule and memory.plan first")
        if ops is None:
            from latch_core.plugins import registries

            ops = registries().ops
        self.ops = ops
        self.checks = checks
        # opt-in: name the first input holding a NaN or infinity (LATCH_CHECK_FINITE=1 for every run)
        self.check_finite = input_rules.finite_by_default() if check_finite is None else bool(check_finite)
        self.graph = g = doc.graph.program(program)
        self.ps = doc.schedule.program(program)
        self.pm = doc.memory.program(program)
        self.nodes = {n.name: n for n in g.nodes}
        self.groups = {grp.id: grp for grp in self.ps.groups}
        self.copy_back = [(new, old) for prog, new, old in dict(doc.memory.stats).get("copy_back", ()) if prog == program]

        self.place = {}
        sizes: dict[str, int] = {}
        for p in self.pm.placements:
            if not g.has_value(p.value):
                raise SimulationError(f"memory plan of {program!r}: placement of {p.value!r}, which the program does not declare")
            if p.nbytes != g.value(p.value).nbytes:
                raise SimulationError(f"memory plan of {program!r}: placement of {p.value!r} has {p.nbytes} bytes, "
                                      f"the value has {g.value(p.value).nbytes}")
            if p.value in self.place:
                raise SimulationError(f"memory plan of {program!r}: {p.value!r} is placed twice")
            self.place[p.value] = p
            sizes[p.buffer] = max(sizes.get(p.buffer, 0), p.offset + p.nbytes)
        if sizes.get(ARENA, 0) > self.pm.arena_bytes:
            worst = max((p for p in self.pm.placements if p.buffer == ARENA), key=lambda p: p.offset + p.nbytes)
            raise SimulationError(f"memory plan of {program!r}: {worst.value!r} at arena offset {worst.offset} "
                                  f"+ {worst.nbytes} bytes ends past the arena ({self.pm.arena_bytes} bytes)")
        sizes[ARENA] = max(sizes.get(ARENA, 0), self.pm.arena_bytes)
        self.buffers = {name: _Buffer(name, n) for name, n in sizes.items()}
        self.ids = {name: i for i, name in enumerate(sorted(self.place))}
        self.names = sorted(self.place)

        needed = set(g.input_names()) | set(g.output_names())
        for t in self.ps.tasks:
            needed.update(a.value for a in t.reads + t.writes)
        missing = sorted(v for v in needed if v not in self.place)
        if missing:
            raise SimulationError(f"memory plan of {program!r}: no placement for {missing[:10]}; "
                                  "re-run memory.plan on the current schedule")
        self.outputs = set(g.output_names()) | {new for new, _ in self.copy_back}

    # ---- byte addressing ----------------------------------------------------------------------
    def _view(self, v: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (a buffer's data or owner array) over ``v``'s planned bytes, shaped
        ``[*shape, esize]``: slicing it with a box gives the box's bytes without index arrays."""
        val = self.graph.value(v)
        p = self.place[v]
        return tensor[p.offset:p.offset + p.nbytes].view(*val.shape, DTYPES[val.dtype])

    def _slices(self, v: str, box) -> tuple:
        shape = self.graph.value(v).shape
        if len(box) != len(shape):
            raise SimulationError(f"box {_fmt_box(box)} of {v!r} has {len(box)} dimensions, the value has {len(shape)}")
        return tuple(slice(lo, hi) for lo, hi in box)

    def _where(self, v: str) -> str:
        p = self.place[v]
        return f"{p.buffer}[{p.offset}:{p.offset + p.nbytes}]"

    # ---- state ---------------------------------------------------------------------------------
    def _reset(self, inputs: Mapping[str, torch.Tensor]) -> None:
        g = self.graph
        for b in self.buffers.values():
            b.data.fill_(float("nan"))
            b.owner.fill_(UNWRITTEN)
        # the runtime's own rules (latch_core.inputs), with dtypes matched by kind: values are held
        # in float64 here, so any float tensor stands for an f32 input, but never an integer one
        specs = {n: {"role": g.value(n).role, "dtype": g.value(n).dtype, "shape": g.value(n).shape}
                 for n in g.input_names()}
        try:
            input_rules.check(specs, inputs, exact_dtype=False, where=f"program {g.name!r}", finite=self.check_finite)
        except input_rules.InputError as e:
            raise SimulationError(f"simulate: {e}") from None
        for name in g.input_names():
            t = inputs[name]
            self._write(name, tuple((0, d) for d in t.shape), t)
        for v in g.values:
            if v.role == "const" and v.name in self.place:
                data = torch.tensor(v.data, dtype=torch.float64).reshape(v.shape)
                self._write(v.name, tuple((0, d) for d in v.shape), data)
        # reads still to come, per element: one per reading task (union of its boxes), one for the exit.
        # Bookkeeping stays within the boxes a task touches (a task's reads are kept as its boxes, or
        # as one union mask only where its boxes of a value overlap), and ``live`` counts each
        # value's elements with reads pending, so no step costs the size of a whole value per task.
        self.task_reads: dict[int, list[tuple[str, Any]]] = {}
        self.pending = {v: torch.zeros(g.value(v).shape, dtype=torch.int32) for v in self.place}
        self.readers: dict[str, set[int]] = {}
        for t in self.ps.tasks:
            per_value: dict[str, list] = {}
            for a in t.reads:
                per_value.setdefault(a.value, []).append(tuple(a.box))
            reads = []
            for v, bxs in per_value.items():
                bxs = list(dict.fromkeys(bxs))
                if len(bxs) == 1 or not _overlapping(bxs):
                    sel: Any = [self._slices(v, b) for b in bxs]
                else:
                    m = torch.zeros(g.value(v).shape, dtype=torch.bool)
                    for b in bxs:
                        m[self._slices(v, b)] = True
                    sel = m
                reads.append((v, sel))
                self._add_pending(v, sel, 1)
                self.readers.setdefault(v, set()).add(t.id)
            self.task_reads[t.id] = reads
        for v in self.outputs:
            self.pending[v] += 1
        self.live = {v: int(self.pending[v].count_nonzero()) for v in self.place}
        self.done: set[int] = set()
        self.last_writer: dict[str, int] = {}

    def _add_pending(self, v: str, sel, delta: int) -> int:
        """pending[v] += delta over a task's selection; returns how many elements reached zero."""
        pend = self.pending[v]
        if isinstance(sel, torch.Tensor):
            zeroed = int((pend[sel] == -delta).sum()) if delta < 0 else 0
            pend[sel] += delta
            return zeroed
        zeroed = 0
        for sl in sel:
            region = pend[sl]
            if delta < 0:
                zeroed += int((region == -delta).sum())
            region += delta
        return zeroed

    def _write(self, v: str, box, data: torch.Tensor, task: int | None = None) -> None:
        if tuple(data.shape) != tuple(self.graph.value(v).shape):
            raise SimulationError(f"value {v!r}: computed shape {tuple(data.shape)}, declared {self.graph.value(v).shape}")
        sl = self._slices(v, box)
        buf = self.buffers[self.place[v].buffer]
        vid = self.ids[v]
        own = self._view(v, buf.owner)[sl]
        if self.checks and task is not None:
            self._check_clobber(v, box, own, vid, task)
        self._view(v, buf.data)[sl] = data[sl].to(torch.float64).unsqueeze(-1)
        own.fill_(vid)
        if task is not None:
            self.last_writer[v] = task

    def _check_clobber(self, v, box, own: torch.Tensor, vid: int, task: int) -> None:
        """``own``: the owners of the bytes ``v``'s box is about to take over."""
        others = own[(own >= 0) & (own != vid)]
        if others.numel() == 0:
            return  # fresh, freed or already v's bytes
        lo, hi = int(others.min()), int(others.max())
        owners = [lo] if lo == hi else torch.unique(others).tolist()
        for x in owners:
            if x < 0 or x == vid:
                continue
            xname = self.names[x]
            if self.live[xname] == 0:
                continue  # x is dead: its bytes are free to take
            # the exact elements of x under these bytes: map the box's byte positions to x's elements
            p, xp = self.place[v], self.place[xname]
            e, xe = DTYPES[self.graph.value(v).dtype], DTYPES[self.graph.value(xname).dtype]
            sel = self._box_bytes(v, box, p.offset, e)[own == x]
            elems = (sel - xp.offset) // xe
            if bool((self.pending[xname].reshape(-1)[elems] > 0).any()):
                waiting = sorted(self.readers.get(xname, set()) - self.done)
                who = f"tasks {waiting[:8]} still have to read it" if waiting else "it is a program output"
                raise SimulationError(
                    f"task {task} (group {self.ps.tasks[task].group}) writes {v!r}{_fmt_box(box)} at "
                    f"{self._where(v)} over live bytes of {xname!r} ({self._where(xname)}, last written by task "
                    f"{self.last_writer.get(xname, 'input')}); {who}: the memory plan ends {xname!r}'s lifetime "
                    "too early, or the schedule does not order those reads before this write")

    def _box_bytes(self, v: str, box, offset: int, esize: int) -> torch.Tensor:
        """Byte positions of ``v``'s elements in ``box``, shaped [*box, esize] (like ``_view``)."""
        shape = self.graph.value(v).shape
        strides = [esize] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        pos = torch.arange(esize, dtype=torch.int64) + offset
        nd = len(shape)
        for d, (lo, hi) in enumerate(box):
            ax = torch.arange(lo, hi, dtype=torch.int64) * strides[d]
            pos = pos + ax.view(*([1] * d), hi - lo, *([1] * (nd - d - 1)), 1)
        return pos

    def _read(self, v: str, boxes, task: int, read_mask: list | None = None) -> torch.Tensor:
        val = self.graph.value(v)
        floating = val.dtype in FLOAT_DTYPES
        if floating:
            fill = float("nan")
        elif val.dtype == "bool":
            fill = 1.0
        else:
            fill = float(torch.iinfo(_TORCH[val.dtype]).min)
        out = torch.full(val.shape, fill, dtype=torch.float64)
        seen = torch.zeros(val.shape, dtype=torch.bool) if read_mask is not None else None
        buf = self.buffers[self.place[v].buffer]
        vid = self.ids[v]
        data, owner = self._view(v, buf.data), self._view(v, buf.owner)
        for box in boxes:
            sl = self._slices(v, box)
            if self.checks:
                own = owner[sl]
                bad = own != vid
                if bool(bad.any()):
                    x = int(own[bad][0])
                    if x == UNWRITTEN:
                        why = "no task has written those bytes yet (the read is not ordered after its producer)"
                    elif x == FREED:
                        why = "those bytes were freed after what the plan thinks is the value's last read"
                    else:
                        why = (f"they now hold {self.names[x]!r} (written by task {self.last_writer.get(self.names[x], 'input')}): "
                               "the write was not ordered after this read")
                    raise SimulationError(
                        f"task {task} (group {self.ps.tasks[task].group}) reads {v!r}{_fmt_box(box)} at {self._where(v)}, "
                        f"but {why}")
            raw = data[sl]
            vals = raw[..., 0]
            if not self.checks:
                # an element whose slots disagree was partly overwritten: NaN. (With the checks on,
                # every byte read is owned by v, i.e. was last written by v: the slots agree.)
                vals = torch.where((raw == raw[..., :1]).all(dim=-1), vals, torch.full_like(vals, float("nan")))
            if not floating and bool(torch.isnan(vals).any()):
                raise SimulationError(f"task {task} reads poisoned integer data of {v!r}{_fmt_box(box)} at {self._where(v)}")
            out[sl] = vals
            if seen is not None:
                seen[sl] = True
        if read_mask is not None:
            read_mask.append(seen)
        return out.to(_TORCH[val.dtype])

    def _free_if_dead(self, v: str) -> None:
        if v in self.outputs or self.live[v] > 0:
            return
        buf = self.buffers[self.place[v].buffer]
        p = self.place[v]
        region = slice(p.offset, p.offset + p.nbytes)
        mine = buf.owner[region] == self.ids[v]
        buf.data[region][mine] = float("nan")
        buf.owner[region][mine] = FREED

    # ---- execution -------------------------------------------------------------------------------
    def _run_task(self, tid: int) -> None:
        t = self.ps.tasks[tid]
        grp = self.groups.get(t.group)
        if grp is None:
            raise SimulationError(f"task {tid} names group {t.group}, which the schedule does not declare")
        boxes: dict[str, list] = {}
        for a in t.reads:
            if a.value not in grp.inputs:
                raise SimulationError(f"task {tid} reads {a.value!r}, which is not an input of its group {grp.id} "
                                      f"(inputs {list(grp.inputs)})")
            boxes.setdefault(a.value, []).append(a.box)
        env: dict[str, Any] = {}
        unread: dict[str, torch.Tensor] = {}  # integer/bool inputs -> elements outside the read boxes
        for v in grp.inputs:
            if self.graph.value(v).dtype in FLOAT_DTYPES:
                env[v] = self._read(v, boxes.get(v, ()), tid)
            else:
                seen: list = []
                env[v] = self._read(v, boxes.get(v, ()), tid, seen)
                if not bool(seen[0].all()):
                    unread[v] = ~seen[0]
        if not unread:
            env = self._compute(tid, grp, env)
        else:
            env = self._compute_split_integers(tid, grp, env, unread, t.writes)
        # this task's reads are over before its stores (a body loads before it stores), so a task
        # may overwrite in place what it alone still had to read
        for v, sel in self.task_reads[tid]:
            self.live[v] -= self._add_pending(v, sel, -1)
        self.done.add(tid)
        for a in t.writes:
            if a.value not in grp.outputs:
                raise SimulationError(f"task {tid} writes {a.value!r}, which is not an output of its group {grp.id} "
                                      f"(outputs {list(grp.outputs)})")
            self._write(a.value, a.box, env[a.value], tid)
        for v in boxes:
            self._free_if_dead(v)

    def _compute_split_integers(self, tid: int, grp, env: dict, unread: dict, writes) -> dict:
        """The group on inputs whose integer elements outside the task's read boxes are poisoned.

        A float NaN propagates to what depends on it; an integer has no such value, and an index
        outside its range makes a gather's reference raise. So the unread integer elements are
        filled twice with values the task did read (its smallest, then its largest; 0 where it read
        none), both valid wherever the read ones are, and the group runs on each: an element of the
        task's write boxes that differs between the two runs depends on data the footprint does not
        cover, and becomes NaN (a float) or an error (an integer), as a float read outside the boxes
        would."""
        runs = []
        for pick in (torch.min, torch.max):
            e = dict(env)
            for v, mask in unread.items():
                x = e[v]
                read = x[~mask]
                fill = pick(read) if read.numel() else torch.zeros((), dtype=x.dtype)
                e[v] = torch.where(mask, fill.to(x.dtype), x)
            runs.append(self._compute(tid, grp, e))
        out, other = runs
        for a in writes:
            v = a.value
            x, y = out[v], other[v]
            sl = self._slices(v, a.box)
            differ = (x[sl] != y[sl]) & ~(torch.isnan(x[sl]) & torch.isnan(y[sl])) if x.is_floating_point() else x[sl] != y[sl]
            if bool(differ.any()):
                if not x.is_floating_point():
                    raise SimulationError(
                        f"task {tid} (group {grp.id}) writes {v!r}{_fmt_box(a.box)}, which depends on elements of "
                        f"{sorted(unread)} outside the task's read boxes: a read footprint is too small")
                region = x[sl].clone()
                region[differ] = float("nan")
                x = x.clone()
                x[sl] = region
                out[v] = x
        return out

    def _compute(self, tid: int, grp, env: dict) -> dict:
        """Every node of the group with the ops' references; ``env`` holds the group's inputs."""
        env = dict(env)
        for name in grp.nodes:
            node = self.nodes.get(name)
            if node is None:
                raise SimulationError(f"group {grp.id} names node {name!r}, which program {self.graph.name!r} lacks")
            spec = self.ops.get(node.op)
            ref = spec.extra.get("reference")
            if ref is None:
                raise SimulationError(f"node {name!r}: op {node.op!r} has no reference function (OpSpec.extra['reference'])")
            args = []
            for i in node.inputs:
                if i is not None and i not in env:
                    raise SimulationError(f"group {grp.id}: node {name!r} reads {i!r}, which is neither a group input "
                                          "nor computed earlier in the group")
                args.append(None if i is None else env[i])
            try:
                outs = ref(args, node.attr_dict)
            except Exception as e:
                raise SimulationError(
                    f"task {tid}: node {name!r} ({node.op}) failed on its inputs (elements outside the task's read "
                    f"boxes are poisoned; is a read footprint too small?): {type(e).__name__}: {e}") from e
            if len(outs) != len(node.outputs):
                raise SimulationError(f"node {name!r}: reference of {node.op} returned {len(outs)} outputs, "
                                      f"the node declares {len(node.outputs)}")
            for o, val in zip(node.outputs, outs):
                if tuple(val.shape) != tuple(self.graph.value(o).shape):
                    raise SimulationError(f"node {name!r}: reference of {node.op} gave {o!r} shape {tuple(val.shape)}, "
                                          f"declared {self.graph.value(o).shape}")
                env[o] = val
        return env

    def run(self, inputs: Mapping[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
        # One intra-op thread: the simulation is thousands of mid-sized ops, where torch's thread
        # pool costs more than it gives, most of all on a busy machine (the d_model 512 transformer
        # on CI's 2 cores under load: 139 s with 2 threads, 49 s with 1).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._run(inputs, seed)
        finally:
            torch.set_num_threads(threads)

    def _run(self, inputs: Mapping[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
        self._reset(inputs)
        for tid in legal_order(self.ps, seed):
            self._run_task(tid)
        for new, old in self.copy_back:  # what the runtime does after the launch
            full = tuple((0, d) for d in self.graph.value(new).shape)
            data = self._read(new, [full], -1)
            dst = self.buffers.get(old)
            if dst is None:
                raise SimulationError(f"copy back {new!r} -> {old!r}: no buffer named {old!r} in the plan")
            nb = self.place[new].nbytes
            dst.data[:nb].view(*data.shape, -1)[...] = data.to(torch.float64).unsqueeze(-1)
        out = {}
        for name in self.graph.output_names():
            full = tuple((0, d) for d in self.graph.value(name).shape)
            try:
                out[name] = self._read(name, [full], -1)
            except SimulationError as e:
                raise SimulationError(f"program output {name!r}: {e}") from None
        return out


def simulate(doc: Document, program: str, inputs: Mapping[str, torch.Tensor], seed: int = 0, *,
             ops=None, checks: bool = True, check_finite: bool | None = None) -> dict[str, torch.Tensor]:
    """Run ``program`` of ``doc`` (graph + schedule + memory) on the CPU; see the module docstring.

    Returns every program output (float values as float64, integers and booleans in their dtype).
    ``ops``: an op registry (default: the installed plugins'). ``seed`` picks the interleaving.
    Inputs are checked as the GPU runtime checks them (latch_core.inputs: names, shapes, dtype kinds;
    ``check_finite=True`` also names the first input holding a NaN or an infinity).
    """
    return ArenaSimulator(doc, program, ops=ops, checks=checks, check_finite=check_finite).run(inputs, seed)


# ------------------------------------------------------------------------------------------
# An example end to end on the simulator: schedule + plan where missing, then every program of
# ``steps`` updates simulated and gated against the FP64 interpreter on the same inputs.

SIM_THRESHOLD = 1e-12  # the same references on the same float64 inputs: rounding only


def prepare(doc: Document, *, scheduler: str | None = None, num_sms: int | None = None, fuse: bool = True) -> Document:
    """``doc`` with a schedule and a memory plan: the registered ``schedule`` and ``memory.plan``
    passes run where the sections are missing (a present section is used as it is)."""
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    passes = registries().passes
    if doc.schedule is None:
        opts: dict[str, Any] = {"fuse": fuse}
        if scheduler:
            opts["scheduler"] = scheduler
        if num_sms:
            opts["num_sms"] = int(num_sms)
        split = {"num_sms": opts["num_sms"]} if "num_sms" in opts else {}
        doc = run_pass(passes.get("schedule"), run_pass(passes.get("schedule.split_reductions"), doc, **split), **opts)
    if doc.memory is None:
        doc = run_pass(passes.get("memory.plan"), doc)
    return doc


def check_example(example, doc: Document, *, steps: int = 1, seed: int = 0, thresholds=SIM_THRESHOLD, ops=None,
                  checks: bool = True, progress=None, check_finite: bool | None = None):
    """Simulate ``steps`` updates of ``example`` with ``doc`` (graph + schedule + memory) and gate
    every program run against the FP64 interpreter on the same inputs; the simulator's outputs
    carry the state to the next run. Returns a :class:`latch_check.compare.CompareResult`."""
    from latch_capture import advance, batch_inputs, bind_inputs, program_inputs

    from . import reference
    from .compare import CompareResult, _f64
    from .gates import GateTable, program_gates

    say = progress or (lambda m: None)
    section = doc.graph
    K = int(section.meta("microbatches", 1))
    runs = ["update"] if K == 1 else ["accumulate"] * (K - 1) + ["accumulate_and_update"]
    params = {n: _f64(p) for n, p in example.params().items()}
    flat = bind_inputs(doc, params=params, state=_f64(example.initial_state()), inputs=example.inputs,
                       targets=example.targets, hyper=dict(section.meta("hyper", ()) or ()))
    tables = []
    for step in range(steps):
        for k, name in enumerate(runs):
            g = section.program(name)
            flat.update(batch_inputs(*example.microbatch(step * K + k)))
            ins = program_inputs(g, flat)
            ref = reference.run(doc, name, ins, ops=ops)
            out = simulate(doc, name, ins, seed + step * K + k, ops=ops, checks=checks, check_finite=check_finite)
            gates = program_gates(g, out, ref, thresholds=thresholds, step=step, previous=ins)
            title = (f"{example.name or 'example'}: step {step} {name} on the arena simulator "
                     f"({doc.schedule.strategy}, {doc.schedule.num_sms} SMs) vs the FP64 interpreter")
            tables.append(GateTable(title, gates))
            say(f"simulate: step {step} {name}: {'ok' if tables[-1].passed else 'FAILED'}")
            flat = advance(g, flat, out)
    return CompareResult(tuple(tables))
