"""The Graph IR: immutable records for values, nodes, programs and the shared layout.

Invariants (checked by :func:`latch_core.lint.lint`):
- every value is defined exactly once: as a program input or as one node's output;
- nodes are in topological order (a node only reads values defined before it);
- a node's outputs agree with its op's shape/dtype rule (when the op is registered);
- every in-place pair (new -> old) has equal shape and dtype, and ``old`` is a program input.

Records are frozen ``attrs`` classes; a pass builds new records with ``attrs.evolve`` and never
mutates its input. Attribute values are JSON scalars or (nested) tuples of them, so that equality,
hashing and the JSON round trip are exact.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import attrs
from attrs import field as _field
from .errors import UserError

# dtype name -> bytes per element. Names are Latch's own, independent of torch.
DTYPES: dict[str, int] = {
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "i64": 8,
    "i32": 4,
    "i16": 2,
    "i8": 1,
    "u8": 1,
    "bool": 1,
}
FLOAT_DTYPES = frozenset({"f64", "f32", "bf16", "f16"})
INT_DTYPES = frozenset({"i64", "i32", "i16", "i8", "u8"})

# Value roles.
PARAM = "param"  # trainable parameter (FP32 master copy), updated in place
STATE = "state"  # optimizer state (moments, step count, gradient accumulators)
BATCH = "batch"  # per-step data: inputs and targets
HYPER = "hyper"  # scalar hyper-parameters given at run time (lr, ...)
CONST = "const"  # constant baked into the graph (data in ``Value.data``)
INTERMEDIATE = "intermediate"
ROLES = frozenset({PARAM, STATE, BATCH, HYPER, CONST, INTERMEDIATE})
INPUT_ROLES = frozenset({PARAM, STATE, BATCH, HYPER, CONST})


class IRError(UserError, ValueError):
    """A malformed IR record; the message names the record and field at fault.

    ``field`` (optional) is the attribute at fault, so the document codec can report the full JSON
    path of a bad field (``graph.programs[0].values[2].dtype``)."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


# The one NaN object every frozen attribute uses. NaN != NaN, but tuples compare items by identity
# first, so records holding this object compare (and hash) equal, and ``loads(dumps(doc)) == doc``
# holds for NaN attributes too.
NAN = float("nan")


def canonical_float(x: float) -> float:
    return NAN if x != x else x


def _freeze(v: Any) -> Any:
    """Turn JSON-like data into hashable, comparable form (lists -> tuples, dicts -> sorted pairs)."""
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _freeze(x)) for k, x in v.items()))
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return canonical_float(v)
    raise IRError(f"attribute value {v!r} of type {type(v).__name__} is not a JSON scalar or list")


def freeze_attrs(d: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    if d is None:
        return ()
    items = d.items() if isinstance(d, Mapping) else d
    return tuple(sorted((str(k), _freeze(v)) for k, v in items))


def _check_dtype(inst, attribute, value):
    if value not in DTYPES:
        raise IRError(f"{type(inst).__name__}.{attribute.name}: unknown dtype {value!r}; known: {sorted(DTYPES)}",
                      field=attribute.name)


def _check_shape(inst, attribute, value):
    for d in value:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise IRError(
                f"{type(inst).__name__}.{attribute.name}: shape {value!r} has a non-static or negative "
                f"dimension {d!r}; Latch needs static shapes",
                field=attribute.name,
            )


@attrs.frozen
class TensorType:
    shape: tuple[int, ...] = attrs.field(converter=tuple, validator=_check_shape)
    dtype: str = attrs.field(validator=_check_dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@attrs.frozen
class Value:
    """A tensor in a program. ``data`` holds the literal contents of a ``const`` value (flat list)."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=tuple, validator=_check_shape)
    dtype: str = attrs.field(validator=_check_dtype)
    role: str = attrs.field(default=INTERMEDIATE)
    data: tuple | None = attrs.field(default=None, converter=lambda d: None if d is None else _freeze(d))

    @role.validator
    def _role(self, attribute, value):
        if value not in ROLES:
            raise IRError(f"value {self.name!r}: unknown role {value!r}; known: {sorted(ROLES)}", field="role")

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype]


@attrs.frozen
class Node:
    """One op application. ``inputs`` may contain ``None`` for an absent optional operand.

    ``source`` is the user's source line the node came from ("file.py:12 in forward"), kept for
    error messages; it is not part of a node's semantics.
    """

    name: str
    op: str = _field()
    inputs: tuple[str | None, ...] = attrs.field(converter=tuple)
    outputs: tuple[str, ...] = attrs.field(converter=tuple)
    attrs: tuple[tuple[str, Any], ...] = attrs.field(factory=tuple, converter=freeze_attrs)
    source: str | None = _field(default=None, eq=False)

    @op.validator
    def _op(self, attribute, value):
        if "::" not in value:
            raise IRError(f"node {self.name!r}: op name {value!r} must be namespaced, e.g. 'latch::matmul'",
                          field="op")

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


def fresh_name(names: set[str], base: str) -> str:
    """``base``, or ``base`` with ``_`` appended until it is not in ``names``; the name is added to
    ``names`` (graph rewrites use it for the values and nodes they create)."""
    name = base
    while name in names:
        name += "_"
    names.add(name)
    return name


@attrs.frozen
class Group:
    """A named, ordered group of program inputs or outputs (e.g. ``params``, ``new_state``)."""

    name: str
    values: tuple[str, ...] = attrs.field(converter=tuple)


@attrs.frozen
class Graph:
    """One program: a pure function from grouped inputs to grouped outputs.

    ``inplace`` pairs (new, old): output value ``new`` overwrites input value ``old`` after the
    program runs (new weights replace old ones). ``regions`` holds named sub-graphs used by
    ``latch::repeat`` nodes (a region repeated N times with carried values); a region's inputs are
    (carried..., per-iteration..., invariant...) and its outputs are the carried values' next state.
    """

    name: str
    values: tuple[Value, ...] = attrs.field(converter=tuple)
    nodes: tuple[Node, ...] = attrs.field(converter=tuple)
    inputs: tuple[Group, ...] = attrs.field(converter=tuple)
    outputs: tuple[Group, ...] = attrs.field(converter=tuple)
    inplace: tuple[tuple[str, str], ...] = attrs.field(factory=tuple, converter=lambda x: tuple(tuple(p) for p in x))
    regions: tuple["Graph", ...] = attrs.field(factory=tuple, converter=tuple)

    # Derived lookups, computed once (the record is immutable).
    _value_map: dict = attrs.field(init=False, eq=False, repr=False, hash=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_value_map", {v.name: v for v in self.values})

    def value(self, name: str) -> Value:
        try:
            return self._value_map[name]
        except KeyError:
            raise IRError(f"program {self.name!r}: no value named {name!r}") from None

    def has_value(self, name: str) -> bool:
        return name in self._value_map

    def group(self, name: str, *, outputs: bool = False) -> Group:
        for g in self.outputs if outputs else self.inputs:
            if g.name == name:
                return g
        kind = "output" if outputs else "input"
        raise IRError(f"program {self.name!r}: no {kind} group {name!r}")

    def input_names(self) -> list[str]:
        return [v for g in self.inputs for v in g.values]

    def output_names(self) -> list[str]:
        return [v for g in self.outputs for v in g.values]

    def region(self, name: str) -> "Graph":
        for r in self.regions:
            if r.name == name:
                return r
        raise IRError(f"program {self.name!r}: no region {name!r}")

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i is not None:
                    out.setdefault(i, []).append(n)
        return out


@attrs.frozen
class GraphSection:
    """The ``graph`` section: one or more programs over one parameter/state layout.

    ``layout`` names the persistent buffers every program shares (params and state, by name, in
    order); each program binds to them by name. ``metadata`` carries free-form capture facts
    (example name, microbatch count, hyper-parameter defaults).
    """

    programs: tuple[Graph, ...] = attrs.field(converter=tuple)
    layout: tuple[Value, ...] = attrs.field(factory=tuple, converter=tuple)
    metadata: tuple[tuple[str, Any], ...] = attrs.field(factory=tuple, converter=freeze_attrs)

    def program(self, name: str) -> Graph:
        for p in self.programs:
            if p.name == name:
                return p
        raise IRError(f"graph section: no program {name!r}; programs: {[p.name for p in self.programs]}")

    def meta(self, key: str, default: Any = None) -> Any:
        return dict(self.metadata).get(key, default)
