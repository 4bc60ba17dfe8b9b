"""Registries: op specs, derivative rules, lowerings, schedulers, passes, CLI commands.

Every registry maps a name to an item and remembers who registered it, so a duplicate registration
fails with both registrants named. Registrants are the plugin names pluggy knows (for entry-point
plugins: the entry point's name and distribution).
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

import attrs

from .ir import TensorType
from .errors import UserError

T = TypeVar("T")


class RegistryError(UserError, ValueError):
    pass


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}

    def add(self, name: str, item: T, registrant: str) -> None:
        if name in self._items:
            raise RegistryError(
                f"duplicate {self.kind} {name!r}: registered by {self._owners[name]!r} and again by "
                f"{registrant!r}; uninstall one of them or limit plugins with LATCH_PLUGINS"
            )
        self._items[name] = item
        self._owners[name] = registrant

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise RegistryError(f"no {self.kind} named {name!r}; registered: {known}") from None

    def owner(self, name: str) -> str:
        return self._owners[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())

    def by_owner(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, owner in self._owners.items():
            out.setdefault(owner, []).append(name)
        return {k: sorted(v) for k, v in out.items()}


class ShapeError(ValueError):
    """Raised by a shape rule: the operands do not fit the op."""


# Op tags.
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
MATMUL = "matmul"
VIEW = "view"
COPY = "copy"
INDEXING = "indexing"
ATTENTION = "attention"
ROUTING = "routing"
NORM = "norm"
RANDOM = "random"
STRUCTURAL = "structural"


@attrs.frozen
class OpSpec:
    """What an op is, independent of how any backend implements it.

    ``infer(inputs, attrs) -> outputs`` is the shape/dtype rule: ``inputs`` are the operands'
    TensorTypes (None for an absent optional operand), ``attrs`` the node's attribute dict; it
    returns the output TensorTypes or raises ShapeError. ``signature`` documents the operands
    (``"matmul(a, b) -> out"``). ``cost(inputs, outputs, attrs) -> (flops, bytes)`` is optional.
    """

    name: str
    signature: str
    infer: Callable[[Sequence[TensorType | None], dict[str, Any]], list[TensorType]]
    tags: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    num_inputs: tuple[int, int] = (0, 1 << 30)  # (min, max) operand count
    cost: Callable | None = None
    doc: str = ""
    extra: dict = attrs.field(factory=dict, eq=False, hash=False)  # torch reference etc., by key

    def check(self, inputs: Sequence[TensorType | None], attr: dict[str, Any]) -> list[TensorType]:
        lo, hi = self.num_inputs
        if not lo <= len(inputs) <= hi:
            raise ShapeError(f"{self.name} takes {lo}..{hi} operands, got {len(inputs)}")
        return list(self.infer(inputs, attr))
