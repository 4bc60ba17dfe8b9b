"""Lowering a traced fx graph (ATen ops) to a Latch fragment (latch:: nodes).

The :class:`Lowerer` walks the fx nodes in order and calls the table entry for each op
(``aten_table.TABLE``); an entry emits zero or more Latch nodes through :meth:`Lowerer.emit` and
returns the Latch value(s) standing for the fx node's result. Entries that return an existing value
(detach, clone, identity views) emit nothing: aliases cost no node.

Invariants checked here, for every fx node: the Latch result has exactly the shape and dtype torch
computed (a mismatch is a lowering bug and says so), and every emitted node passes its op's shape
rule. Ops in the ``latch`` torch namespace (custom ops, ``torch.ops.latch.NAME``) lower generically
to ``latch::NAME``: tensor arguments become operands in schema order (None for an absent optional
tensor), every other argument an attribute under its schema name, and each result an output.
"""

from __future__ import annotations

import operator
import time
from typing import Any, Callable, Mapping, Sequence

import attrs
import torch
import torch.fx as fx

from latch_core.ir import CONST, INTERMEDIATE, Node, TensorType, Value
from latch_core.registry import ShapeError
from latch_ops.common import from_torch_dtype

from .errors import CaptureError
from .source import node_source


class Ref(str):
    """A Latch value name standing for a tensor argument (plain strings are string attributes)."""


class LoweringBug(RuntimeError):
    """A lowering produced a type different from torch's: a bug in latch-capture, not in user code."""


@attrs.frozen
class Fragment:
    """A lowered trace: ``inputs`` name the placeholders in order; ``outputs`` the value standing for
    each traced output (it may be an input or a constant when the function returned one unchanged)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    values: tuple[Value, ...]  # intermediates and constants defined by the fragment
    nodes: tuple[Node, ...]
    input_types: Mapping[str, TensorType] = attrs.field(eq=False)


def ttype_of(val: Any, what: str) -> TensorType:
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"{what} produced a {type(val).__name__}, not a tensor",
                           hint="Latch graphs carry tensors only; keep Python numbers static")
    try:
        return TensorType(tuple(int(d) for d in val.shape), from_torch_dtype(val.dtype))
    except (ValueError, TypeError) as e:
        raise CaptureError(f"{what} has an unsupported shape or dtype", hint=str(e)) from None


def op_key(target: Any) -> str:
    """'aten.add.Tensor' for an OpOverload; the op's repr otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def packet_key(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return op_key(target)


def bind_args(target: torch._ops.OpOverload, args: Sequence, kwargs: Mapping) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    out: dict[str, Any] = {}
    for i, a in enumerate(target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


class Lowerer:
    def __init__(self, gm: fx.GraphModule, input_names: Sequence[str], ops, consts: Mapping[str, torch.Tensor],
                 taken: set[str] | None = None):
        self.gm = gm
        self.ops = ops
        self.consts = consts
        self.input_names = list(input_names)
        self.types: dict[str, TensorType] = {}
        self.values: list[Value] = []
        self.nodes: list[Node] = []
        self.env: dict[fx.Node, Any] = {}
        self.taken: set[str] = set(taken or ()) | set(input_names)
        self.fx_node: fx.Node | None = None
        self.source: str | None = None
        self._counter = 0
        self._view_src: dict[str, tuple] = {}  # view result -> (kind, operand, attrs): see reshape()
        # Values known at capture time (folded from constants, see fold.py): name -> tensor. Such a
        # name has a type but no defining node until a node reads it (``resolve``), so a value only
        # ever inspected (a causal mask) costs nothing in the graph.
        self.known: dict[str, torch.Tensor] = {}
        self._alias: dict[str, str] = {}

    # ---------------------------------------------------------------- naming, values, nodes
    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            self._counter += 1
            name = f"{base}_{self._counter}"
        self.taken.add(name)
        return name

    def type(self, name: str) -> TensorType:
        return self.types[name]

    def where(self) -> str:
        return op_key(self.fx_node.target).removesuffix(".default") if self.fx_node is not None else "?"

    def emit(self, op: str, inputs: Sequence[str | None], attrs: Mapping[str, Any] | None = None,
             base: str | None = None) -> list[str]:
        """Add one Latch node; returns its output value names (types from the op's shape rule)."""
        attrs = dict(attrs or {})
        inputs = [None if i is None else self.resolve(str(i)) for i in inputs]
        try:
            spec = self.ops.get(op)
        except Exception:
            raise CaptureError(f"op {op} has no registered OpSpec, needed to lower", op=self.where(), source=self.source,
                               hint="install the latch-ops plugin that defines it (latch-pipeline plugins lists them)") from None
        in_types = [None if i is None else self.types[i] for i in inputs]
        try:
            out_types = spec.check(in_types, attrs)
        except ShapeError as e:
            raise CaptureError("Latch cannot express", op=self.where(), source=self.source,
                               hint=f"{e} (while lowering to {op}); rewrite this line or cast its operands explicitly") from None
        names = [self.fresh(base or (self.fx_node.name if self.fx_node is not None else "v")) for _ in out_types]
        for n, t in zip(names, out_types):
            self.types[n] = t
            self.values.append(Value(n, t.shape, t.dtype, INTERMEDIATE))
        self.nodes.append(Node(names[0], op, tuple(inputs), tuple(names), attrs, self.source))
        return [Ref(n) for n in names]

    def emit1(self, op: str, inputs: Sequence[str | None], attrs: Mapping[str, Any] | None = None) -> str:
        return self.emit(op, inputs, attrs)[0]

    def const(self, base: str, data: torch.Tensor) -> str:
        t = ttype_of(data, f"constant {base!r}")
        if data.device.type == "meta":
            raise CaptureError(
                f"the constant {base!r} is on the meta device and has no data",
                hint="create it on the CPU, compute it inside forward (e.g. from torch.arange), "
                     "or supply it through forward_state")
        name = self.fresh(base)
        flat = data.detach().reshape(-1).tolist()
        self.types[name] = t
        self.values.append(Value(name, t.shape, t.dtype, CONST, data=flat))
        return Ref(name)

    # ---------------------------------------------------------------- values known at capture time
    def fold(self, base: str, data: torch.Tensor) -> str:
        """A value whose data is known now (computed from constants): typed, defined on first use."""
        t = ttype_of(data, f"constant {base!r}")
        name = self.fresh(base)
        self.types[name] = t
        self.known[name] = data
        return Ref(name)

    def known_value(self, name: str | None) -> torch.Tensor | None:
        """The data of a value known at capture time, else None."""
        return None if name is None else self.known.get(str(name))

    def resolve(self, name: str) -> str:
        """The value a node may read for ``name``: a known value gets its defining nodes now (a
        ``latch::full`` when uniform, a constant expanded along broadcast dims, else a constant)."""
        if name not in self.known:
            return name
        real = self._alias.get(name)
        if real is None:
            real = self._alias[name] = self._materialize(name, self.known[name])
        return real

    def _materialize(self, name: str, data: torch.Tensor) -> str:
        t = self.types[name]
        flat = data.reshape(-1)
        if flat.numel() > 0:
            first = flat[0]
            same = (flat == first) | (flat.isnan() & first.isnan()) if data.is_floating_point() else flat == first
            if bool(same.all()):
                v = first.item()
                return self.full(t.shape, v, t.dtype)
        # dims along which torch broadcast (stride 0): keep one slice, expand back
        sl = tuple(slice(0, 1) if data.shape[d] > 1 and data.stride(d) == 0 else slice(None) for d in range(data.dim()))
        compact = data[sl]
        if compact.numel() < data.numel():
            return self.expand(self.const(name, compact.contiguous()), t.shape)
        # the known value becomes a constant under its own name (a buffer keeps the buffer's name)
        del self.types[name]
        self.taken.discard(name)
        real = self.const(name, data.contiguous())
        if real != name:
            raise LoweringBug(f"constant {name!r} was renamed to {real!r}")
        return real

    # ---------------------------------------------------------------- helpers for table entries
    def cast(self, name: str, dtype: str) -> str:
        if self.types[name].dtype == dtype:
            return name
        return self.emit1("latch::cast", [name], {"dtype": dtype})

    # View chains fold: reshape(reshape(x)) is one reshape of x, permute(permute(x)) one permute
    # (none at all when the composition is the identity). The inner view, if nothing else reads
    # it, is removed as dead code when programs are assembled.
    def reshape(self, name: str, shape: Sequence[int]) -> str:
        shape = tuple(int(d) for d in shape)
        src = self._view_src.get(name)
        if src is not None and src[0] == "reshape":
            name = src[1]
        if tuple(self.types[name].shape) == shape:
            return Ref(name)
        out = self.emit1("latch::reshape", [name], {"shape": shape})
        self._view_src[out] = ("reshape", name, shape)
        return out

    def expand(self, name: str, shape: Sequence[int]) -> str:
        shape = tuple(int(d) for d in shape)
        if tuple(self.types[name].shape) == shape:
            return name
        return self.emit1("latch::expand", [name], {"shape": shape})

    def permute(self, name: str, perm: Sequence[int]) -> str:
        perm = tuple(int(p) for p in perm)
        src = self._view_src.get(name)
        if src is not None and src[0] == "permute":
            name, inner = src[1], src[2]
            perm = tuple(inner[p] for p in perm)
        if perm == tuple(range(len(perm))):
            return Ref(name)
        out = self.emit1("latch::permute", [name], {"perm": perm})
        self._view_src[out] = ("permute", name, perm)
        return out

    def full(self, shape: Sequence[int], value: Any, dtype: str) -> str:
        return self.emit1("latch::full", [], {"shape": tuple(int(d) for d in shape), "value": value, "dtype": dtype})

    def out_type(self, index: int | None = None) -> TensorType:
        val = self.fx_node.meta.get("val")
        if index is not None:
            val = val[index]
        return ttype_of(val, self.where())

    def fail(self, what: str, hint: str) -> CaptureError:
        return CaptureError(what, op=self.where(), source=self.source, hint=hint)

    # ---------------------------------------------------------------- the walk
    def arg(self, a: Any) -> Any:
        """fx args -> Latch value names (tensors), recursively through lists; other values unchanged."""
        if isinstance(a, fx.Node):
            if a not in self.env:
                raise LoweringBug(f"fx node {a.name} used before it was lowered")
            v = self.env[a]
            if isinstance(v, str):
                return Ref(v)
            if isinstance(v, (list, tuple)):
                return type(v)(None if x is None else Ref(x) for x in v)
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        return a

    def run(self, output_keys: Sequence[str], progress: Callable[[str], None] | None) -> Fragment:
        from .aten_table import lower_node

        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.input_names):
            raise LoweringBug(f"{len(placeholders)} placeholders for {len(self.input_names)} inputs")
        input_types = {}
        for ph, name in zip(placeholders, self.input_names):
            t = ttype_of(ph.meta.get("val"), f"input {name!r}")
            input_types[name] = t
            if name in self.consts:
                self.env[ph] = None
                if ph.users:
                    self.fx_node, self.source = ph, None
                    self.taken.discard(name)  # a buffer's constant keeps the buffer's name
                    data = self.consts[name]
                    if data.device.type != "meta" and not data.is_floating_point() and not data.is_complex():
                        self.env[ph] = self.fold(name, data.detach())
                    else:
                        self.env[ph] = self.const(name, data)
                continue
            self.types[name] = t
            self.env[ph] = name
        total = sum(1 for n in self.gm.graph.nodes if n.op == "call_function")
        done = 0
        t_next = time.perf_counter() + 2.0
        outputs: list[str] = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            self.fx_node, self.source = node, node_source(node)
            if node.op == "get_attr":
                data = getattr(self.gm, node.target)
                base = str(node.target).lstrip("_")
                if isinstance(data, torch.Tensor) and data.device.type != "meta" and not data.is_floating_point():
                    self.env[node] = self.fold(base, data.detach())
                else:
                    self.env[node] = self.const(base, data)
                continue
            if node.op == "output":
                flat = node.args[0]
                flat = list(flat) if isinstance(flat, (list, tuple)) else [flat]
                if len(flat) != len(output_keys):
                    raise LoweringBug(f"{len(flat)} traced outputs for keys {list(output_keys)}")
                for key, o in zip(output_keys, flat):
                    v = self.arg(o)
                    if not isinstance(v, str):
                        raise CaptureError(f"output {key!r} is not a tensor computed by the traced code",
                                           hint="return tensors from the objective and the update")
                    outputs.append(self.resolve(str(v)))
                continue
            if node.op != "call_function":
                raise LoweringBug(f"unexpected fx node kind {node.op} ({node.name})")
            if node.target is operator.getitem:
                src, idx = node.args
                res = self.env[src][idx]
            else:
                res = lower_node(self, node)
            self._verify(node, res)
            self.env[node] = res
            done += 1
            if progress is not None and done % 500 == 0 and time.perf_counter() > t_next:
                t_next = time.perf_counter() + 2.0
                progress(f"  lowering: {done}/{total} torch nodes, {len(self.nodes)} Latch nodes")
        return Fragment(tuple(self.input_names), tuple(outputs), tuple(self.values), tuple(self.nodes), input_types)

    def _verify(self, node: fx.Node, res: Any) -> None:
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            if not isinstance(res, (list, tuple)) or len(res) != len(val):
                raise LoweringBug(f"{self.where()} ({node.name}): lowering gave {res!r} for {len(val)} results")
            pairs = list(zip(res, val))
        else:
            pairs = [(res, val)]
        for r, v in pairs:
            if v is None or not isinstance(v, torch.Tensor):
                continue
            if not isinstance(r, str):
                raise LoweringBug(f"{self.where()} ({node.name}): lowering gave {r!r} for a tensor result")
            want = ttype_of(v, self.where())
            if self.types[r] != want:
                raise LoweringBug(
                    f"lowering of {self.where()} at {self.source or '?'} gave {self.types[r]} but torch computes "
                    f"{want}; this is a bug in latch-capture's lowering table, please report it")


def lower(gm: fx.GraphModule, input_names: Sequence[str], output_keys: Sequence[str], ops,
          consts: Mapping[str, torch.Tensor], progress: Callable[[str], None] | None = None) -> Fragment:
    return Lowerer(gm, input_names, ops, consts).run(output_keys, progress)
