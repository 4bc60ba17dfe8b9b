"""Binary run-time tables: the instruction lists, task records and operand records of a program.

These bytes are the program; the compiled kernel only interprets them. They are written next to the
sources (``tables/<program>.*.bin``) and uploaded by the runtime, never baked into the source, so a
changed schedule or memory plan over the same op signatures reuses the compiled library.

Layouts (little-endian) mirror ``cuda/latch_kernel.cuh`` (``LATCH_ABI_VERSION`` 4):
- Instr:   4 x int32 (kind, a, b, c)
- Task:    24 x int32 (body, task, group, ndim, op_begin, op_count, tmap, dep, lo[8], hi[8])
- Operand: int32 buffer, int32 pad, int64 byte offset
- instrs: the SM lists back to back, then the ticketed phases' queue tasks (tickets.py);
  sm_begin: int32[num_lists + 1] (the lists only); expected: uint32[num_counters]
- Tmap:    the tensor maps to encode at load time (``latch::TmapSpec`` in cuda/latch_kernel_main.cuh):
           int32 buffer, dtype code; int64 offset; int32 rank, swizzle code; int64 dims[3];
           int64 strides[2] (bytes); int32 box[3]; int32 pad (80 bytes)
"""

from __future__ import annotations

import struct

import attrs

from latch_core.ir import DTYPES

ABI_VERSION = 4
MAX_DIMS = 8
I_TASK, I_BARRIER, I_WAIT, I_SIGNAL, I_TICKET = 1, 2, 3, 4, 5
KIND_CODES = {"task": I_TASK, "barrier": I_BARRIER, "wait": I_WAIT, "signal": I_SIGNAL, "ticket": I_TICKET}

INSTR = struct.Struct("<4i")
TASK = struct.Struct(f"<8i{MAX_DIMS}i{MAX_DIMS}i")
OPERAND = struct.Struct("<iiq")
TMAP = struct.Struct("<iiqii3q2q3ii")

assert INSTR.size == 16 and TASK.size == 96 and OPERAND.size == 16 and TMAP.size == 80



@attrs.frozen
class TaskRecord:
    body: int
    task: int
    group: int
    op_begin: int
    op_count: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    tmap: int = -1  # first tensor map of the group (-1: the body loads none)
    dep: int = -1  # see Task::dep (cuda/latch_kernel.cuh)

    def pack(self) -> bytes:
        nd = len(self.lo)
        if nd > MAX_DIMS:
            raise ValueError(f"task {self.task}: tile of rank {nd} exceeds {MAX_DIMS}")
        pad = (0,) * (MAX_DIMS - nd)
        return TASK.pack(self.body, self.task, self.group, nd, self.op_begin, self.op_count, self.tmap, self.dep,
                         *self.lo, *pad, *self.hi, *pad)


@attrs.frozen
class TmapRecord:
    """One tensor map to encode at load time: a row-major tensor at (buffer, offset)."""

    buffer: int
    offset: int
    dtype: str
    dims: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int  # bytes

    @classmethod
    def of(cls, buffer, offset, dtype, dims, box, swizzle) -> "TmapRecord":
        return cls(int(buffer), int(offset), dtype, tuple(int(d) for d in dims), tuple(int(b) for b in box), int(swizzle))

    def pack(self) -> bytes:
        from .lowering import SWIZZLE_CODES, TMAP_DTYPES

        if self.dtype not in TMAP_DTYPES:
            raise ValueError(f"tensor map of a {self.dtype} tensor: TMA takes {sorted(TMAP_DTYPES)}")
        esize = DTYPES[self.dtype]
        strides, acc = [], esize
        for d in self.dims[:-1]:
            acc *= d
            strides.append(acc)
        r = len(self.dims)
        if self.offset % 16 or any(s % 16 for s in strides):
            raise ValueError(f"tensor map at offset {self.offset} with byte strides {strides}: TMA needs 16-byte "
                             "aligned addresses and strides")
        pad = lambda xs, n: list(xs) + [0] * (n - len(xs))  # noqa: E731
        return TMAP.pack(self.buffer, TMAP_DTYPES[self.dtype], self.offset, r, SWIZZLE_CODES[self.swizzle],
                         *pad(self.dims, 3), *pad(strides, 2), *pad(self.box, 3), 0)


def pack_tmaps(maps) -> bytes:
    return b"".join(m.pack() for m in maps)


@attrs.frozen
class ProgramTables:
    instrs: bytes
    sm_begin: bytes
    tasks: bytes
    operands: bytes
    expected: bytes
    tmaps: bytes = b""

    def files(self) -> dict[str, bytes]:
        return {"instrs": self.instrs, "sm_begin": self.sm_begin, "tasks": self.tasks,
                "operands": self.operands, "expected": self.expected, "tmaps": self.tmaps}


def pack_instrs(sms, queues=()) -> tuple[bytes, bytes]:
    """The SM lists back to back, then each queue's task instructions (a ticket's ``b`` indexes
    them); ``sm_begin`` covers the lists."""
    out, begins = bytearray(), [0]

    def put(ins):
        kind = KIND_CODES[ins[0]]
        args = list(ins[1:]) + [0] * (3 - (len(ins) - 1))
        out.extend(INSTR.pack(kind, *args))

    for sm in sms:
        for ins in sm:
            put(ins)
        begins.append(begins[-1] + len(sm))
    for q in queues:
        for ins in q:
            put(ins)
    return bytes(out), struct.pack(f"<{len(begins)}i", *begins)


def pack_operands(ops: list[tuple[int, int]]) -> bytes:
    return b"".join(OPERAND.pack(b, 0, off) for b, off in ops)


def pack_u32(xs) -> bytes:
    xs = list(xs)
    return struct.pack(f"<{len(xs)}I", *xs)


def unpack_instrs(data: bytes) -> list[tuple[int, int, int, int]]:
    return [INSTR.unpack_from(data, i) for i in range(0, len(data), INSTR.size)]


def unpack_tasks(data: bytes) -> list[tuple[int, ...]]:
    return [TASK.unpack_from(data, i) for i in range(0, len(data), TASK.size)]


# --------------------------------------------------------------------------------------------
# Constant data -> bytes (no torch: codegen must run without it)

def _bf16_bits(x: float) -> int:
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):  # NaN: keep it a quiet NaN
        return 0x7FC0
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


_FMT = {"f64": "d", "f32": "f", "f16": "e", "i64": "q", "i32": "i", "i16": "h", "i8": "b", "u8": "B", "bool": "?"}


def _flatten(data):
    if isinstance(data, (list, tuple)):
        for x in data:
            yield from _flatten(x)
    else:
        yield data


def const_bytes(data, dtype: str, numel: int, name: str) -> bytes:
    flat = list(_flatten(data))
    if len(flat) == 1 and numel != 1:
        flat = flat * numel  # a splat constant
    if len(flat) != numel:
        raise ValueError(f"constant {name!r}: {len(flat)} data items for {numel} elements")
    if dtype == "bf16":
        return struct.pack(f"<{numel}H", *(_bf16_bits(float(x)) for x in flat))
    fmt = _FMT[dtype]
    if dtype in ("f64", "f32", "f16"):
        flat = [float(x) for x in flat]
    elif dtype == "bool":
        flat = [bool(x) for x in flat]
    else:
        flat = [int(x) for x in flat]
    return struct.pack(f"<{numel}{fmt}", *flat)
