"""Lowerings: how one op becomes CUDA code inside the megakernel.

A plugin registers one :class:`Lowering` per op through ``latch_register_lowerings``
(``register("latch::add", Lowering(...))``). A lowering has up to two forms:

- ``expr``: the elementwise expression form. ``expr(args, node) -> str`` returns a C++ expression
  computing one output element from the C++ expressions of the operands' elements (already in
  their compute type: ``float`` for f32/bf16/f16, ``double`` for f64, ``long long`` for integers,
  ``bool`` for bool). Ops with an ``expr`` can be fused with other elementwise ops into one body.
- ``view_map``: the index form of a view. ``view_map(coords, node) -> list[str]`` maps the C++
  expressions of an output element's coordinates to those of the input element it equals. Views
  fuse with elementwise ops the same way expressions do (``fuse.py`` pulls each value at the
  coordinates its consumer needs).
- ``body``: the statements of a device function computing one task's tile of the op's outputs
  (``body(ctx) -> str``, ``ctx`` a :class:`BodyContext`). Ops that are neither elementwise nor
  views need it. It runs on the worker's 256 consumer threads (latch_common.cuh states the rules:
  ``latch::block_sync()``, ``LATCH_THREADS``).
- ``producer`` (with ``tensor_maps`` and ``stage_bytes``): the producer half of a body that streams
  its operands through the kernel's ring of shared-memory stages with TMA (``producer(ctx) -> str``,
  statements run by ONE producer thread, ``c`` the task's context and ``p`` the producer's
  ``latch::Pipe``, which the statements advance; they ``return false;`` when a wait was aborted).
  ``tensor_maps(ctx)`` lists the :class:`TensorMap` the two halves use, in order (encoded by the
  runtime at load time from the operands' addresses; ``ctx.tmap(j)`` is map j's address in device
  code); ``stage_bytes(ctx)`` is the size of one ring stage the body needs. Such a body is compiled
  inline into the kernel's dispatch (``inline`` is implied), and its consumer half (``body``) reads
  the stages from ``c.pipe``.

An op that has only ``expr`` or ``view_map`` gets its body from the fused generator (a group of
one).

Invariant: the code a lowering emits depends only on what the :class:`BodyContext` shows
(op, attributes, operand shapes and dtypes, and whether the output aliases its input), never on
value names, placements or tiles: that is what lets one instantiation serve every group with the
same signature, and the tile arrive at run time in the task table.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

# Latch dtype -> (storage C type, compute C type)
CTYPES: dict[str, tuple[str, str]] = {
    "f64": ("double", "double"),
    "f32": ("float", "float"),
    "bf16": ("__nv_bfloat16", "float"),
    "f16": ("__half", "float"),
    "i64": ("long long", "long long"),
    "i32": ("int", "long long"),
    "i16": ("short", "long long"),
    "i8": ("signed char", "long long"),
    "u8": ("unsigned char", "long long"),
    "bool": ("bool", "bool"),
}


class LoweringError(ValueError):
    """A lowering cannot emit code for a node; the message names the node, op and what to do."""


def storage_type(dtype: str) -> str:
    return CTYPES[dtype][0]


def compute_type(dtype: str) -> str:
    return CTYPES[dtype][1]


def load_expr(dtype: str, ptr: str, index: str) -> str:
    """C++ expression loading element ``index`` of ``ptr`` (a typed pointer) in compute type."""
    return f"latch::ld<{storage_type(dtype)}>({ptr}, {index})"


def store_stmt(dtype: str, ptr: str, index: str, value: str) -> str:
    return f"latch::st<{storage_type(dtype)}>({ptr}, {index}, {value});"


def c_literal(x: Any, dtype: str = "f32") -> str:
    """A C++ literal for a Python scalar in the compute type of ``dtype`` (inf/nan spelled out)."""
    ct = compute_type(dtype)
    if ct == "bool":
        return "true" if x else "false"
    if ct == "long long":
        return f"{int(x)}LL"
    x = float(x)
    if math.isnan(x):
        return "latch::qnan()"
    if math.isinf(x):
        return "latch::inf()" if x > 0 else "(-latch::inf())"
    if ct == "double":
        return repr(x)
    return f"{x!r}f" if ("." in repr(x) or "e" in repr(x)) else f"{x!r}.0f"


@attrs.frozen
class Operand:
    """One operand of a body as the lowering sees it: a typed pointer expression and its type."""

    ptr: str  # C++ expression of a typed pointer (``const float*`` for inputs, ``float*`` for outputs)
    shape: tuple[int, ...]
    dtype: str
    present: bool = True  # False: an output nothing outside the group reads (no memory: skip it)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def ctype(self) -> str:
        return storage_type(self.dtype)

    def strides(self) -> tuple[int, ...]:
        """Contiguous row-major element strides (every value is contiguous in memory)."""
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))


SWIZZLE_CODES = {0: 0, 32: 1, 64: 2, 128: 3}  # bytes -> CUtensorMapSwizzle
TMAP_DTYPES = {"u8": 0, "f16": 6, "f32": 7, "f64": 8, "bf16": 9, "i32": 3, "i64": 5}  # -> CUtensorMapDataType


@attrs.frozen
class TensorMap:
    """One TMA tensor map a body uses: operand ``operand`` of the body (an index into
    ``ctx.inputs + ctx.outputs``), viewed as a row-major tensor of ``dims`` (innermost first; their
    product is the operand's element count), loaded in boxes of ``box`` elements with ``swizzle``
    bytes of shared-memory swizzling (0, 32, 64 or 128)."""

    operand: int
    dims: tuple[int, ...] = attrs.field(converter=tuple)
    box: tuple[int, ...] = attrs.field(converter=tuple)
    swizzle: int = 128

    def __attrs_post_init__(self):
        if not 1 <= len(self.dims) <= 3 or len(self.box) != len(self.dims):
            raise LoweringError(f"tensor map of operand {self.operand}: dims {self.dims} / box {self.box} must have "
                                "one to three matching entries")
        if self.swizzle not in SWIZZLE_CODES:
            raise LoweringError(f"tensor map of operand {self.operand}: swizzle {self.swizzle} is not one of 0/32/64/128")
        if any(not 1 <= b <= 256 for b in self.box):
            raise LoweringError(f"tensor map of operand {self.operand}: box {self.box} has an extent outside 1..256")


@attrs.frozen
class BodyContext:
    """What a ``body`` lowering sees: one node and the task's tile (as C++ expressions).

    ``lo(d)``/``hi(d)`` are the tile's half-open range along dimension ``d`` of the primary output
    (``outputs[primary]``); ``smem`` is a ``char*`` to the body's scratch shared memory (size
    declared by the lowering's ``smem``; never the ring); ``threads`` the consumer threads a body
    runs on. ``aliased`` is true when the
    memory plan gives the (view) output the same bytes as its first input.
    """

    op: str
    attrs: dict[str, Any]
    inputs: tuple[Operand | None, ...]
    outputs: tuple[Operand, ...]
    primary: int = 0
    aliased: bool = False
    threads: int = 256

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def lo(self, d: int) -> str:
        return f"c.t->lo[{d}]"

    def tmap(self, j: int) -> str:
        """Device address of the body's tensor map ``j`` (see :attr:`Lowering.tensor_maps`)."""
        return f"(c.tmaps + {128 * j})"

    def hi(self, d: int) -> str:
        return f"c.t->hi[{d}]"

    @property
    def smem(self) -> str:
        return "c.smem"

    def fail(self, msg: str) -> LoweringError:
        return LoweringError(f"{self.op}: {msg}")


@attrs.frozen
class Lowering:
    """How an op becomes code. See the module docstring for the two forms.

    ``headers`` are included by every unit that instantiates this op (paths relative to one of
    ``include_dirs``, which a third-party plugin points at its own package data); their contents
    are part of the build's cache key. ``smem(ctx) -> int`` is the scratch shared memory the body
    needs (bytes). A change to what a lowering emits reaches the build's cache key through the
    generated source (and the request key through the plugin's Python sources); no version field
    is needed.
    """

    op: str
    expr: Callable[[list[str], "NodeInfo"], str] | None = None
    body: Callable[[BodyContext], str] | None = None
    view_map: Callable[[list[str], "NodeInfo"], list[str]] | None = None
    headers: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    include_dirs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    smem: Callable[[BodyContext], int] | None = None
    # The body computes the whole output whatever the tile: code generation refuses a schedule
    # that splits a group of this op into several tasks (they would all write everything).
    whole: bool = False
    doc: str = ""
    # The producer half (TMA loads into the ring) and what it needs; see the module docstring.
    producer: Callable[[BodyContext], str] | None = None
    tensor_maps: Callable[[BodyContext], list[TensorMap]] | None = None
    stage_bytes: Callable[[BodyContext], int] | None = None
    # Compile the body inline into the kernel's dispatch (hot bodies: no call, registers shared with
    # the worker's loop). Implied by ``producer``.
    inline: bool = False
    # Run-time constants of the body (``c.args[i]`` in its code): a lowering that reads its shapes
    # from there instead of spelling them out lets every node with the same code share one function.
    args: Callable[[BodyContext], tuple[int, ...]] | None = None

    def __attrs_post_init__(self):
        if self.expr is None and self.body is None and self.view_map is None:
            raise LoweringError(f"lowering of {self.op}: give an `expr` (elementwise form), a `view_map` or a `body`")
        if (self.producer is None) != (self.tensor_maps is None) or (self.producer is None) != (self.stage_bytes is None):
            raise LoweringError(f"lowering of {self.op}: a producer half needs `producer`, `tensor_maps` and "
                                "`stage_bytes` together")
        if self.producer is not None and self.body is None:
            raise LoweringError(f"lowering of {self.op}: a producer half needs the consumer half `body`")

    @property
    def fusable(self) -> bool:
        return self.expr is not None or self.view_map is not None


class OnlyWhen:
    """A Lowering hook (``producer``, ``tensor_maps``, ``stage_bytes``) that answers None for the nodes
    where ``taken(ctx)`` is false (those the lowering's SIMT body computes). It keeps ``fn``'s module
    and qualified name: the build names hooks by them in its cache key."""

    def __init__(self, taken, fn):
        self.taken, self.fn = taken, fn
        self.__module__ = fn.__module__
        self.__qualname__ = fn.__qualname__

    def __call__(self, ctx: BodyContext):
        return self.fn(ctx) if self.taken(ctx) else None


@attrs.frozen
class NodeInfo:
    """What an ``expr`` lowering sees: the op, attributes and operand/result types."""

    op: str
    attrs: dict[str, Any]
    in_dtypes: tuple[str | None, ...]
    out_dtypes: tuple[str, ...]
    in_shapes: tuple[tuple[int, ...] | None, ...] = ()
    out_shapes: tuple[tuple[int, ...], ...] = ()
    # C++ expressions (long long) of the coordinates of the element being computed, in the node's
    # output shape (ops that read their own index: tril/triu, arange).
    coords: tuple[str, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def fail(self, msg: str) -> LoweringError:
        return LoweringError(f"{self.op}: {msg}")
