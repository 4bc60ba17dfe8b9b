"""Test support: small ops with torch references, a naive scheduler, two-weight and MLP updates.

Used by latch-memory's and latch-check's tests so they do not depend on the real op library or
schedulers. Nothing here is on a production path. The op references use tensor methods only and
torch is imported inside ``evaluate`` and ``random_inputs``, so importing this module keeps
latch-memory torch-free.

The naive scheduler puts every node in its own fusion group, cuts the primary output into row
tiles, and gives each task an exact footprint for row-wise ops (elementwise with equal shapes,
the rows of a matmul's left operand) and the whole value otherwise (a legal superset). Strategies:
``barrier`` (phase = depth in the group DAG, a grid barrier between phases) and ``dataflow`` (one
counter per group, each task waits for all tasks of the groups it reads).
"""

from __future__ import annotations

import random as _random
from typing import Any

from latch_core.hookspecs import hookimpl
from latch_core.ir import Graph, Group, Node, TensorType, Value
from latch_core.registry import ELEMENTWISE, MATMUL, NORM, REDUCTION, VIEW, OpSpec, Registry, ShapeError
from latch_core.sections import (
    BARRIER, SIGNAL, TASK, WAIT, Access, Counter, FusionGroup, ProgramSchedule, ScheduleSection, Task,
)

# --------------------------------------------------------------------------------------------
# Test ops (namespace "test::"), registered by TestOpsPlugin


def _same(inputs, attrs):
    shapes = {tuple(t.shape) for t in inputs if t is not None}
    if len(shapes) != 1:
        raise ShapeError(f"operands must have one shape, got {sorted(shapes)}")
    return [TensorType(inputs[0].shape, inputs[0].dtype)]


def _matmul(inputs, attrs):
    a, b = inputs
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(f"matmul needs [m,k]@[k,n], got {a} @ {b}")
    return [TensorType((a.shape[0], b.shape[1]), a.dtype)]


def _transpose(inputs, attrs):
    (a,) = inputs
    return [TensorType((a.shape[1], a.shape[0]), a.dtype)]


def _total(inputs, attrs):
    return [TensorType((), inputs[0].dtype)]


def _sgd(inputs, attrs):
    w, g, lr = inputs
    if w.shape != g.shape or tuple(lr.shape) != ():
        raise ShapeError("sgd(w, g, lr): w and g of one shape, lr a scalar")
    return [TensorType(w.shape, w.dtype)]


def _rmsnorm(inputs, attrs):
    return [TensorType(inputs[0].shape, inputs[0].dtype)]


def _ref(fn_name):
    """The reference of ``test::<fn_name>``: tensor methods only, so no torch import here."""
    def ref(inputs, attrs):
        return _REFS[fn_name](inputs, dict(attrs))
    return ref


def _r_add(x, a):
    return [x[0] + x[1]]


def _r_mul(x, a):
    return [x[0] * x[1]]


def _r_relu(x, a):
    return [x[0].clamp_min(0)]


def _r_relu_grad(x, a):
    pre, g = x
    return [g * (pre > 0).to(g.dtype)]


def _r_matmul(x, a):
    return [x[0] @ x[1]]


def _r_transpose(x, a):
    return [x[0].t().contiguous()]


def _r_sum(x, a):
    return [x[0].sum()]


def _r_scale(x, a):
    return [x[0] * a["scalar"]]


def _r_sgd(x, a):
    w, g, lr = x
    return [w - lr * g]


def _r_rmsnorm(x, a):
    v = x[0]
    return [v / (v.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()]


_REFS = {
    "add": _r_add, "mul": _r_mul, "relu": _r_relu, "relu_grad": _r_relu_grad, "matmul": _r_matmul,
    "transpose": _r_transpose, "sum": _r_sum, "scale": _r_scale, "sgd": _r_sgd, "rmsnorm": _r_rmsnorm,
}


def test_op_specs() -> list[OpSpec]:
    def spec(name, infer, tags, n):
        return OpSpec(f"test::{name}", f"{name}(...)", infer, tags=tags, num_inputs=(n, n),
                      extra={"reference": _ref(name)})

    return [
        spec("add", _same, {ELEMENTWISE}, 2),
        spec("mul", _same, {ELEMENTWISE}, 2),
        spec("relu", _same, {ELEMENTWISE}, 1),
        spec("relu_grad", _same, {ELEMENTWISE}, 2),
        spec("scale", _same, {ELEMENTWISE}, 1),
        spec("matmul", _matmul, {MATMUL}, 2),
        spec("transpose", _transpose, {VIEW}, 1),
        spec("sum", _total, {REDUCTION}, 1),
        spec("sgd", _sgd, {ELEMENTWISE}, 3),
        spec("rmsnorm", _rmsnorm, {NORM}, 1),
    ]


class TestOpsPlugin:
    """Register with ``latch_core.plugins.load_with(("memtest", TestOpsPlugin()))``."""

    __test__ = False  # not a pytest test class

    @hookimpl
    def latch_register_ops(self, register):
        for s in test_op_specs():
            register(s)


def test_registry() -> Registry:
    reg = Registry("op")
    for s in test_op_specs():
        reg.add(s.name, s, "memtest")
    return reg


test_registry.__test__ = False  # type: ignore[attr-defined]
test_op_specs.__test__ = False  # type: ignore[attr-defined]

# --------------------------------------------------------------------------------------------
# A two-weight update: y = relu(x @ w1) @ w2, loss = sum(y * y), SGD on both weights


def two_weight_graph(batch: int = 8, d_in: int = 4, d_hidden: int = 6, d_out: int = 3, *, with_const: bool = True) -> Graph:
    V = Value
    vals = [
        V("w1", (d_in, d_hidden), "f32", "param"), V("w2", (d_hidden, d_out), "f32", "param"),
        V("x", (batch, d_in), "f32", "batch"), V("lr", (), "f32", "hyper"),
    ]
    nodes = []

    def node(name, op, ins, out_shape, **attrs):
        vals.append(V(name, out_shape, "f32"))
        nodes.append(Node(f"n_{name}", f"test::{op}", ins, (name,), attrs, source=f"two_weight.py:{len(nodes) + 1} in update"))

    x_in = "x"
    if with_const:
        vals.append(V("half", (batch, d_in), "f32", "const", data=[0.5] * (batch * d_in)))
        node("xs", "mul", ("x", "half"), (batch, d_in))
        x_in = "xs"
    node("pre", "matmul", (x_in, "w1"), (batch, d_hidden))
    node("h", "relu", ("pre",), (batch, d_hidden))
    node("y", "matmul", ("h", "w2"), (batch, d_out))
    node("yy", "mul", ("y", "y"), (batch, d_out))
    node("loss", "sum", ("yy",), ())
    node("dy", "scale", ("y",), (batch, d_out), scalar=2.0)
    node("hT", "transpose", ("h",), (d_hidden, batch))
    node("g2", "matmul", ("hT", "dy"), (d_hidden, d_out))
    node("w2T", "transpose", ("w2",), (d_out, d_hidden))
    node("dh", "matmul", ("dy", "w2T"), (batch, d_hidden))
    node("dpre", "relu_grad", ("pre", "dh"), (batch, d_hidden))
    node("xT", "transpose", (x_in,), (d_in, batch))
    node("g1", "matmul", ("xT", "dpre"), (d_in, d_hidden))
    node("w1_new", "sgd", ("w1", "g1", "lr"), (d_in, d_hidden))
    node("w2_new", "sgd", ("w2", "g2", "lr"), (d_hidden, d_out))
    return Graph(
        "update", vals, nodes,
        inputs=[Group("params", ("w1", "w2")), Group("batch", ("x",)), Group("hyper", ("lr",))],
        outputs=[Group("new_params", ("w1_new", "w2_new")), Group("loss", ("loss",)), Group("grads", ("g1", "g2"))],
        inplace=[("w1_new", "w1"), ("w2_new", "w2")],
    )


def mlp_graph(layers: int = 3, batch: int = 16, width: int = 8) -> Graph:
    """x_l = relu(rmsnorm(x_{l-1}) @ w_l); loss = sum(x_L * x_L); SGD on every w_l. The backward
    needs each layer's normed input and pre-activation: the shape where recomputation pays."""
    V = Value
    vals = [V(f"w{l}", (width, width), "f32", "param") for l in range(layers)]
    vals += [V("x", (batch, width), "f32", "batch"), V("lr", (), "f32", "hyper")]
    nodes = []

    def node(name, op, ins, shape, **attrs):
        vals.append(V(name, shape, "f32"))
        nodes.append(Node(f"n_{name}", f"test::{op}", ins, (name,), attrs, source=f"mlp.py:{len(nodes) + 1} in update"))

    act = (batch, width)
    cur = "x"
    for l in range(layers):
        node(f"nx{l}", "rmsnorm", (cur,), act)
        node(f"pre{l}", "matmul", (f"nx{l}", f"w{l}"), act)
        node(f"a{l}", "relu", (f"pre{l}",), act)
        cur = f"a{l}"
    node("sq", "mul", (cur, cur), act)
    node("loss", "sum", ("sq",), ())
    node(f"da{layers - 1}", "scale", (cur,), act, scalar=2.0)
    for l in reversed(range(layers)):
        node(f"dpre{l}", "relu_grad", (f"pre{l}", f"da{l}"), act)
        node(f"nxT{l}", "transpose", (f"nx{l}",), (width, batch))
        node(f"g{l}", "matmul", (f"nxT{l}", f"dpre{l}"), (width, width))
        if l:
            # the gradient through rmsnorm is left out: the test needs the data flow, not calculus
            node(f"wT{l}", "transpose", (f"w{l}",), (width, width))
            node(f"da{l - 1}", "matmul", (f"dpre{l}", f"wT{l}"), act)
    for l in range(layers):
        node(f"w{l}_new", "sgd", (f"w{l}", f"g{l}", "lr"), (width, width))
    return Graph(
        "update", vals, nodes,
        inputs=[Group("params", tuple(f"w{l}" for l in range(layers))), Group("batch", ("x",)), Group("hyper", ("lr",))],
        outputs=[Group("new_params", tuple(f"w{l}_new" for l in range(layers))), Group("loss", ("loss",))],
        inplace=[(f"w{l}_new", f"w{l}") for l in range(layers)],
    )


# --------------------------------------------------------------------------------------------
# The naive scheduler


def _full(shape) -> tuple:
    return tuple((0, d) for d in shape)


def _row_tiles(shape, n: int) -> list[tuple]:
    if not shape or shape[0] < 2 or n <= 1:
        return [_full(shape)]
    n = min(n, shape[0])
    step = -(-shape[0] // n)
    return [((lo, min(lo + step, shape[0])),) + _full(shape[1:]) for lo in range(0, shape[0], step)]


def naive_schedule(graph: Graph, ops: Registry, *, strategy: str = "barrier", num_sms: int = 4,
                   tiles: int = 2, seed: int = 0) -> ProgramSchedule:
    """One group per node; see the module docstring. ``seed`` shuffles which SM gets which task."""
    rng = _random.Random(seed)
    producer_group: dict[str, int] = {}
    groups, tasks = [], []
    level: dict[int, int] = {}
    for gi, n in enumerate(graph.nodes):
        ins = tuple(dict.fromkeys(i for i in n.inputs if i is not None))
        groups.append(FusionGroup(gi, (n.name,), ins, n.outputs, n.outputs[0], n.op))
        for o in n.outputs:
            producer_group[o] = gi
        level[gi] = 1 + max((level[producer_group[i]] for i in ins if i in producer_group), default=-1)
        prim = graph.value(n.outputs[0]).shape
        tags = ops.get(n.op).tags if n.op in ops else frozenset()
        same_out = all(graph.value(o).shape == prim for o in n.outputs)
        for box in _row_tiles(prim, tiles if same_out else 1):
            reads = []
            for k, i in enumerate(n.inputs):
                if i is None:
                    continue
                ishape = graph.value(i).shape
                if ELEMENTWISE in tags and ishape == prim:
                    reads.append(Access(i, box))
                elif MATMUL in tags and k == 0 and len(ishape) == 2:
                    reads.append(Access(i, (box[0], (0, ishape[1]))))
                else:
                    reads.append(Access(i, _full(ishape)))
            writes = [Access(o, box) for o in n.outputs]
            tasks.append(Task(len(tasks), gi, box, reads, writes, 0.0, level[gi] if strategy == "barrier" else -1))

    sms: list[list[tuple]] = [[] for _ in range(num_sms)]
    counters = []
    if strategy == "barrier":
        phases = sorted({t.phase for t in tasks})
        for bi, ph in enumerate(phases):
            if bi:
                for sm in sms:
                    sm.append((BARRIER, bi - 1))
            for t in (t for t in tasks if t.phase == ph):
                sms[rng.randrange(num_sms)].append((TASK, t.id))
        nb = max(len(phases) - 1, 0)
    elif strategy == "dataflow":
        per_group: dict[int, int] = {}
        for t in tasks:
            per_group[t.group] = per_group.get(t.group, 0) + 1
        counters = [Counter(g, c) for g, c in sorted(per_group.items())]
        for t in tasks:  # tasks are in topological order, so round-robin never deadlocks
            sm = sms[rng.randrange(num_sms)]
            for i in groups[t.group].inputs:
                if i in producer_group:
                    pg = producer_group[i]
                    sm.append((WAIT, pg, per_group[pg]))
            sm.append((TASK, t.id))
            sm.append((SIGNAL, t.group))
        nb = 0
    else:
        raise ValueError(f"naive_schedule: unknown strategy {strategy!r}; use 'barrier' or 'dataflow'")
    return ProgramSchedule(graph.name, groups, tasks, sms, counters, nb)


def naive_schedule_section(graph_or_doc: Any, ops: Registry, **kw) -> ScheduleSection:
    graphs = graph_or_doc.graph.programs if hasattr(graph_or_doc, "graph") else [graph_or_doc]
    progs = [naive_schedule(g, ops, **kw) for g in graphs]
    return ScheduleSection(kw.get("strategy", "barrier"), kw.get("num_sms", 4), progs)


def evaluate(graph: Graph, inputs: dict, ops: Registry) -> dict:
    """Run ``graph`` node by node with the ops' references, in float64 (test oracle for passes that
    must not change results; the project's interpreter is latch_check.reference)."""
    import torch

    env = {}
    for v in graph.values:
        if v.role == "const":
            env[v.name] = torch.tensor(v.data, dtype=torch.float64).reshape(v.shape)
    for k, t in inputs.items():
        env[k] = t.to(torch.float64) if t.is_floating_point() else t
    for n in graph.nodes:
        outs = ops.get(n.op).extra["reference"]([None if i is None else env[i] for i in n.inputs], n.attr_dict)
        env.update(zip(n.outputs, outs))
    return {o: env[o] for o in graph.output_names()}


def random_inputs(graph: Graph, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in graph.input_names():
        v = graph.value(name)
        out[name] = torch.tensor(0.05, dtype=torch.float64) if v.role == "hyper" else torch.randn(v.shape, generator=gen, dtype=torch.float64)
    return out


evaluate.__test__ = False  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# The arena rule, written plainly (the quadratic version latch_memory.arena replaced): a reference


def quadratic_assign_offsets(items, ordered=None, *, alignment=256, base=0):
    """The previous implementation, each item against every placed one (the rule written plainly),
    with placed ranges rounded up to the alignment as the new one stores them (no item can start in
    the padding, so only the measure of a gap's waste changes)."""
    queue = sorted(items, key=lambda it: (-it[1], it[2]))
    placed, offsets, top = [], {}, base
    for name, size, start, end in queue:
        if size == 0:
            offsets[name] = base
            continue
        busy = sorted((lo - base, _align_up(hi - base, alignment)) for other, lo, hi, s2, e2 in placed
                      if start <= e2 and s2 <= end)
        maybe = [(o, lo - base, hi - base) for o, lo, hi, s2, e2 in placed if not (start <= e2 and s2 <= end)]
        checked = set()
        while True:
            best, waste, cursor = None, None, 0
            for lo, hi in busy:
                st = _align_up(cursor, alignment)
                if st + size <= lo and (waste is None or lo - cursor - size < waste):
                    best, waste = st, lo - cursor - size
                cursor = max(cursor, hi)
            off = best if best is not None else _align_up(cursor, alignment)
            clash = None
            if ordered is not None:
                for o, lo, hi in maybe:
                    if lo < off + size and off < hi and o not in checked:
                        checked.add(o)
                        if not ordered(name, o):
                            clash = (lo, _align_up(hi, alignment))
                            break
            if clash is None:
                break
            busy = sorted(busy + [clash])
        offsets[name] = base + off
        placed.append((name, base + off, base + off + size, start, end))
        top = max(top, base + off + size)
    return offsets, top


def _align_up(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment
