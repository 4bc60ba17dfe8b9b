"""The runtime: load a build directory and run its programs on CUDA tensors, through ctypes.

No compiled torch extension: the library has a small C ABI (``cuda/latch_kernel_main.cuh``) and
torch only provides memory (the arena and the tables, allocated once through its caching allocator)
and the current stream. So a build works with whatever torch the GPU machine has.

One update = one cooperative launch per program run (``update``; or ``accumulate`` K-1 times then
``accumulate_and_update``), plus, where the memory plan asks for it, copy-backs of in-place values.
Counters and the barrier word are never reset between launches (per-launch epochs, kept on the
device: see the kernel); after a launch that reported an error they are zeroed and the epochs
restart. A launch passes nothing that changes from one launch to the next, so launches can be
captured into a CUDA graph (``torch.cuda.graph``) and replayed.

A profiling build (``build(..., profile=True)``) is recognised by its flag in the manifest; every
launch then gets a zeroed record buffer and is bracketed by CUDA events, and :meth:`Program.profile`
returns the records (latch_codegen_h100.profile aggregates them). A normal build takes none of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from . import tables as T
from . import guard
from .store import CorruptLibrary, verify_directory
from .builder import PROFILE_FLAG
from .profile import LaunchRecords

DTYPES = {
    "f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
    "bool": torch.bool,
}
ERR_WAIT_TIMEOUT, ERR_BARRIER_TIMEOUT, ERR_BAD_BODY, ERR_INDEX_RANGE, ERR_PIPE_TIMEOUT = 1, 2, 3, 4, 5
TMAP_BYTES = 128
DEFAULT_TIMEOUT_S = 10.0
PROFILE_KEEP = 64  # launches whose records a profiling build keeps until profile() reads them
PROFILE_SLEEP_CYCLES = 200_000  # ~0.1 ms of GPU sleep before a profiled launch (longer than the launch call)


BINDINGS_KEPT = 8  # bindings (sets of tensors) cached per program: e.g. double-buffered batches
_data_ptr = torch.Tensor.data_ptr
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (what torch.compile's code calls)


class ProgramError(RuntimeError):
    """A program cannot run with what it was given (a tensor's shape, dtype, device, ...)."""


class LaunchError(RuntimeError):
    """The kernel reported an error (spin timeout, bad index, ...) or CUDA refused the launch."""


class _Args(ctypes.Structure):
    _fields_ = [
        ("instrs", ctypes.c_void_p), ("sm_begin", ctypes.c_void_p), ("tasks", ctypes.c_void_p),
        ("operands", ctypes.c_void_p), ("buffers", ctypes.c_void_p), ("counters", ctypes.c_void_p),
        ("expected", ctypes.c_void_p), ("barrier", ctypes.c_void_p), ("error", ctypes.c_void_p),
        ("num_lists", ctypes.c_int32), ("num_barriers", ctypes.c_uint32), ("program", ctypes.c_int32),
        ("pad_", ctypes.c_uint32), ("timeout_ns", ctypes.c_uint64), ("tmaps", ctypes.c_void_p),
    ]


assert ctypes.sizeof(_Args) == 104

# Error record: int32 code, block, pc, task, counter; uint32 value, target; int32 abort, program,
# pad; int64 a, b.
_ERROR_WORDS = 14  # 56 bytes as int32 words


def _as_mapping(x, names: Sequence[str], what: str) -> dict[str, Any]:
    if x is None:
        return {}
    if isinstance(x, Mapping):
        return dict(x)
    if isinstance(x, (list, tuple)):
        if len(x) != len(names):
            raise ProgramError(f"{what}: got {len(x)} tensors, the program takes {len(names)} ({', '.join(names)}); "
                               "pass a dict by name to be explicit")
        return dict(zip(names, x))
    raise ProgramError(f"{what}: expected a dict of tensors by name (or a list in program order), got {type(x).__name__}")


def check_tensor(name: str, t: Any, spec: dict, device: torch.device) -> torch.Tensor:
    """Check one bound tensor against the build's expectation; the error names the tensor."""
    want = f"{spec['dtype']}{list(spec['shape'])}"
    what = f"{spec.get('role', 'tensor')} {name!r}"
    if not isinstance(t, torch.Tensor):
        raise ProgramError(f"{what}: expected a torch.Tensor ({want}), got {type(t).__name__}")
    if tuple(t.shape) != tuple(spec["shape"]):
        raise ProgramError(f"{what}: shape {list(t.shape)}, the program was built for {want}")
    if t.dtype != DTYPES[spec["dtype"]]:
        raise ProgramError(f"{what}: dtype {t.dtype}, the program was built for {want} ({DTYPES[spec['dtype']]})")
    if not t.is_contiguous():
        raise ProgramError(f"{what}: not contiguous (strides {t.stride()}); pass .contiguous()")
    if t.device != device:
        raise ProgramError(f"{what}: on {t.device}, the program runs on {device}; move it with .to({str(device)!r})")
    return t


class _Binding:
    """One program bound to one set of tensors (:meth:`Program._binding`): the checked tensors by
    buffer name and, from its first launch, what the launch needs (:meth:`Program._prepare`)."""

    __slots__ = ("bound", "prepared")

    def __init__(self, bound: dict):
        self.bound, self.prepared = bound, None


class _ProgramTables:
    def __init__(self, name: str, info: dict, root: Path, device: torch.device):
        self.name = name
        self.info = info
        self.raw = {k: (root / p).read_bytes() for k, p in info["tables"].items()}
        self.num_tmaps = int(info.get("num_tmaps", 0))
        self.dev = {}
        for k, data in self.raw.items():
            if k == "tmaps":
                continue
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(16, dtype=torch.uint8)
            self.dev[k] = t.to(device)
        n = max(1, info["num_counters"])
        # counters..., the barrier word, the epoch, the blocks done with this launch (the kernel's Args::barrier)
        self.sync = torch.zeros(n + 3, dtype=torch.int32, device=device)
        sm_begin = self.raw["sm_begin"]
        self.num_instrs = int.from_bytes(sm_begin[-4:], "little", signed=True) if sm_begin else 0


class Program:
    """A loaded build. ``program(params, state, batch, hyper=None)`` runs one update in place and
    returns the loss; :meth:`run` returns every output that is not written in place."""

    def __init__(self, build_dir: str | Path, *, device: torch.device | str | int | None = None,
                 timeout_s: float | None = None):
        root = Path(build_dir)
        try:
            self.manifest = json.loads((root / "manifest.json").read_text())
        except OSError as e:
            raise ProgramError(f"{root}: no readable manifest.json ({e.strerror}); build it with "
                               "`latch-pipeline build` or latch_codegen_h100.build") from None
        lib_path = root / self.manifest.get("library", "program.so")
        if not lib_path.exists():
            raise ProgramError(f"{lib_path}: the library is missing; the build in {root} did not finish")
        self.root = root
        try:  # a truncated or replaced library would kill the process inside dlopen (store.py)
            verify_directory(root)
        except CorruptLibrary as e:
            raise ProgramError(str(e)) from None
        self.lib = ctypes.CDLL(str(lib_path.resolve()))
        self.lib.latch_error_string.restype = ctypes.c_char_p
        self.profiling = PROFILE_FLAG in self.manifest.get("flags", ())
        if self.profiling != hasattr(self.lib, "latch_launch_profile"):
            raise ProgramError(f"{lib_path}: the manifest says {'a' if self.profiling else 'no'} profiling build "
                               f"({PROFILE_FLAG}), the library {'lacks' if self.profiling else 'has'} "
                               "latch_launch_profile: they come from different builds; rebuild the directory")
        # Records of profiled launches not yet read back: (program, buffer, start event, end event).
        self._profiled: deque = deque(maxlen=PROFILE_KEEP)
        abi = self.lib.latch_abi_version()
        if abi != T.ABI_VERSION or self.manifest.get("abi") != T.ABI_VERSION:
            raise ProgramError(f"{lib_path}: ABI version {abi} (manifest {self.manifest.get('abi')}), this runtime "
                               f"speaks {T.ABI_VERSION}; rebuild with this latch-codegen-h100")
        if not torch.cuda.is_available():
            raise ProgramError("no CUDA device: torch.cuda.is_available() is False")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if device.type != "cuda":
            raise ProgramError(f"device {device} is not a CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.timeout_ns = int(1e9 * (timeout_s if timeout_s is not None
                                     else float(os.environ.get("LATCH_SPIN_TIMEOUT_S", DEFAULT_TIMEOUT_S))))
        with torch.cuda.device(device):
            torch.cuda.init()
            sms, smem_max, major, minor = (ctypes.c_int() for _ in range(4))
            self._check(self.lib.latch_device_info(device.index, ctypes.byref(sms), ctypes.byref(smem_max),
                                                   ctypes.byref(major), ctypes.byref(minor)), "reading the device")
            if (major.value, minor.value) != (9, 0):
                raise ProgramError(f"{torch.cuda.get_device_name(device)} is compute capability "
                                   f"{major.value}.{minor.value}; this build is for sm_90a (H100/H200)")
            self.num_sms = sms.value
            if self.num_sms > int(self.lib.latch_max_blocks()):
                raise ProgramError(f"{torch.cuda.get_device_name(device)} has {self.num_sms} SMs; the worker "
                                   f"(latch_kernel_main.cuh LATCH_MAX_BLOCKS) supports at most "
                                   f"{self.lib.latch_max_blocks()} blocks: raise LATCH_MAX_BLOCKS and rebuild")
            self.smem = int(self.manifest["smem"])
            if self.smem > smem_max.value:
                raise ProgramError(f"the kernel needs {self.smem} bytes of shared memory per block; the device "
                                   f"allows {smem_max.value}")
            self.block_threads = int(self.lib.latch_block_threads())
            self._latch_launch = self.lib.latch_launch
            self._latch_launch.argtypes = [ctypes.POINTER(_Args), ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                                           ctypes.c_void_p]
            self._latch_launch.restype = ctypes.c_int
            self._smem_arg = ctypes.c_longlong(self.smem)
            self.lib.latch_dynamic_smem.restype = ctypes.c_longlong
            if int(self.lib.latch_dynamic_smem()) != self.smem:
                raise ProgramError(f"{lib_path}: the library needs {self.lib.latch_dynamic_smem()} bytes of dynamic "
                                   f"shared memory, the manifest says {self.smem}: they come from different builds")
            blocks, regs = ctypes.c_int(), ctypes.c_int()
            self._check(self.lib.latch_prepare(device.index, ctypes.c_longlong(self.smem), ctypes.byref(blocks),
                                               ctypes.byref(regs)), "preparing the kernel")
            if blocks.value < 1:
                raise ProgramError(f"the kernel cannot be resident on an SM ({regs.value} registers/thread, "
                                   f"{self.smem} bytes shared memory): a cooperative launch is impossible")
            self.registers = regs.value
            for name, info in self.manifest["programs"].items():
                if info["num_lists"] > self.num_sms:
                    raise ProgramError(f"program {name!r} was scheduled for {info['num_lists']} SMs; this device has "
                                       f"{self.num_sms}: re-run the schedule stage with num_sms={self.num_sms}")
            self.programs = {name: _ProgramTables(name, info, root, device)
                             for name, info in self.manifest["programs"].items()}
            arena_bytes = max(256, int(self.manifest["arena_bytes"]))
            self.arena = torch.empty(arena_bytes, dtype=torch.uint8, device=device)
            self.error = torch.zeros(_ERROR_WORDS, dtype=torch.int32, device=device)
            self._error_host = torch.zeros(_ERROR_WORDS, dtype=torch.int32).pin_memory()
            self._consts = (root / "consts.bin").read_bytes() if (root / "consts.bin").exists() else b""
            self._write_consts()
        self.buffers = self.manifest["buffers"]
        self._buffer_index = {b["name"]: i + 1 for i, b in enumerate(self.buffers)}
        self._program_index = {name: i for i, name in enumerate(self.manifest["programs"])}
        self._hyper_buffers = [b for b in self.buffers if b["role"] == "hyper"]
        self._reset_bindings()
        self.launches = 0
        meta = self.manifest.get("metadata", {})
        self.microbatches = int(meta.get("microbatches", 1) or 1)
        self.hyper_defaults = dict(meta.get("hyper", meta.get("hyper_defaults", {})) or {})

    def _reset_bindings(self) -> None:
        """The caches of the launch path (see :class:`_Binding`)."""
        self._needed: dict[str, set[str]] = {}
        self._bindings: dict[str, OrderedDict] = {}  # program -> key -> _Binding, the most recent last
        self._hyper_cache: dict[str, tuple[Any, torch.Tensor]] = {}
        self._captured: list = []  # bindings launched inside a CUDA-graph capture (kept for its replays)

    @property
    def weight_copies(self) -> dict[str, str]:
        """copy -> parameter of each BF16 weight copy the programs keep as state (``memory.weight_copies``):
        read by every program, rewritten in place by the programs that update the parameter."""
        meta = self.manifest.get("metadata", {}).get("memory.weight_copies") or {}
        return dict(meta.get("copies") or {})

    def initial_copies(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weight copies' values before the first update: ``cast(p)`` of each parameter (on this
        device, in the copy's dtype, round to nearest even as the program's cast)."""
        specs = {b["name"]: b for b in self.buffers}
        out = {}
        for c, p in self.weight_copies.items():
            if p not in params:
                raise ProgramError(f"initial_copies: parameter {p!r} (whose BF16 copy is state {c!r}) is not in params")
            out[c] = params[p].detach().to(self.device, DTYPES[specs[c]["dtype"]]).contiguous()
        return out

    @classmethod
    def load(cls, build_dir: str | Path, **kw) -> "Program":
        return cls(build_dir, **kw)

    # ------------------------------------------------------------------------------------------
    def _check(self, code: int, what: str) -> None:
        if code != 0:
            msg = self.lib.latch_error_string(code).decode()
            raise LaunchError(f"CUDA error {code} ({msg}) while {what}")

    def _write_consts(self) -> None:
        if not self._consts:
            return
        data = torch.frombuffer(bytearray(self._consts), dtype=torch.uint8).to(self.device)
        for c in self.manifest["consts"]:
            self.arena[c["offset"]:c["offset"] + c["nbytes"]].copy_(data[c["file_offset"]:c["file_offset"] + c["nbytes"]])

    def _sequence(self) -> list[str]:
        progs = self.manifest["programs"]
        if "accumulate_and_update" in progs:
            k = self.microbatches
            return ["accumulate"] * (k - 1) + ["accumulate_and_update"]
        if "update" in progs:
            return ["update"]
        if len(progs) == 1:
            return list(progs)
        raise ProgramError(f"the build has programs {sorted(progs)}; run one by name with run_program()")

    def _check_tensor(self, name: str, t: Any, spec: dict) -> torch.Tensor:
        return check_tensor(name, t, spec, self.device)

    def _hyper_tensor(self, name: str, value: Any, spec: dict) -> torch.Tensor:
        """The device tensor a hyper-parameter is bound to: the caller's own (a tensor on this device),
        or one the runtime keeps per name and rewrites in place (``fill_``, queued on the stream)
        when the value changes, so a schedule that changes the learning rate every step keeps the
        same address: no new pointer table, no re-encoded tensor maps, no host-to-device copy."""
        if isinstance(value, torch.Tensor):
            if value.device == self.device:
                return self._check_tensor(name, value, spec)
            value = value.item()
        if not isinstance(value, (int, float, bool)):
            raise ProgramError(f"hyper-parameter {name!r}: expected a number or a tensor, got {type(value).__name__}")
        cached = self._hyper_cache.get(name)
        if cached is not None:
            if cached[0] != value or type(cached[0]) is not type(value):
                cached[1].fill_(value)
                self._hyper_cache[name] = (value, cached[1])
            return cached[1]
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ProgramError(f"hyper-parameter {name!r}: first given while a CUDA graph is being captured; launch "
                               "the program once before capturing (or pass the value as a tensor on the device)")
        t = torch.tensor(value, dtype=DTYPES[spec["dtype"]]).reshape(spec["shape"]).to(self.device)
        self._hyper_cache[name] = (value, t)
        return t

    def _bind(self, prog: str, params, state, batch, hyper) -> dict[str, torch.Tensor]:
        """The tensors program ``prog`` runs on, by buffer name, checked (see :meth:`_binding`)."""
        return self._binding(prog, params, state, batch, hyper).bound

    def _binding(self, prog: str, params, state, batch, hyper) -> "_Binding":
        """Bind the caller's tensors to program ``prog``. The checks (names, shapes, dtypes, devices,
        weight copies) run once per set of tensors: a binding is cached under the names, object ids
        and data pointers of what was passed (a tensor whose storage was swapped, ``p.data = ...``,
        binds anew), and holds the pointer table and launch arguments, so a training loop that
        passes the same tensors pays one pass over them per launch and no table is rebuilt."""
        info = self.manifest["programs"][prog]
        groups = info["inputs"]
        given: dict[str, Any] = {}
        for gname, x in (("params", params), ("state", state), ("batch", batch)):
            if x is not None:
                given.update(x if isinstance(x, dict) else _as_mapping(x, groups.get(gname, []), gname))
        hyper_given = _as_mapping(hyper, groups.get("hyper", []), "hyper")
        needed = self._needed.get(prog)
        if needed is None:
            needed = self._needed[prog] = {v for g in ("params", "state", "batch", "hyper") for v in groups.get(g, [])}
        hyper_bound = {}
        for b in self._hyper_buffers:
            name = b["name"]
            if name not in needed:
                continue
            if name in hyper_given:
                hyper_bound[name] = self._hyper_tensor(name, hyper_given[name], b)
            elif name in self.hyper_defaults:
                hyper_bound[name] = self._hyper_tensor(name, self.hyper_defaults[name], b)
            else:
                raise ProgramError(f"hyper-parameter {name!r} not given and the document records no default")
        vals = list(given.values())
        try:
            key = (tuple(given), tuple(map(id, vals)), tuple(map(_data_ptr, vals)), tuple(hyper_given),
                   tuple(map(id, hyper_bound.values())), tuple(map(_data_ptr, hyper_bound.values())))
        except TypeError:  # not a tensor: the checks below name it
            key = None
        cache = self._bindings.setdefault(prog, OrderedDict())
        hit = cache.get(key) if key is not None else None
        if hit is not None:
            cache.move_to_end(key)
        else:
            specs = self._input_specs(needed)
            absent = [c for c in self.weight_copies if c in needed and c not in given]
            if absent:
                c = absent[0]
                raise ProgramError(f"state {c!r} (the BF16 copy of parameter {self.weight_copies[c]!r} the update "
                                   f"keeps, memory.weight_copies){' and ' + str(len(absent) - 1) + ' more' if len(absent) > 1 else ''}"
                                   f" is missing; create the copies once before the first update, "
                                   f"state.update(program.initial_copies(params)), and pass them with the state every "
                                   f"update (the program rewrites them in place), or compile with --no-weight-copies")
            guard.check_inputs(self, prog, specs, given, hyper_given, error=ProgramError)  # latch_core.inputs
            bound = {}
            for b in self.buffers:
                name = b["name"]
                if b["role"] == "hyper":
                    continue
                if name not in given:
                    if name in needed:
                        raise ProgramError(f"{b['role']} {name!r} ({b['dtype']}{b['shape']}) is missing; program "
                                           f"{prog!r} needs it")
                    continue
                bound[name] = self._check_tensor(name, given[name], b)
            bound.update(hyper_bound)
            hit = _Binding(bound)
            if key is not None:
                cache[key] = hit
                if len(cache) > BINDINGS_KEPT:
                    cache.popitem(last=False)
        if guard.finite_wanted(self):  # opt-in: reads every element
            guard.check_inputs(self, prog, self._input_specs(needed), given, {}, finite=True, error=ProgramError)
        return hit

    def _input_specs(self, needed: set[str]) -> dict[str, dict]:
        """The manifest's buffers of the tensors a program takes (hyper-parameters aside), by name."""
        return {b["name"]: b for b in self.buffers if b["name"] in needed and b["role"] != "hyper"}

    def _prepare(self, prog: str, bnd: "_Binding") -> None:
        """A binding's device pointer table (the arena, then every buffer; 0 where the program takes
        none), its tensor maps and launch arguments and its copy-backs: made on its first launch."""
        p = self.programs[prog]
        info = p.info
        bound = bnd.bound
        if torch.cuda.is_current_stream_capturing():
            raise ProgramError(f"program {prog!r}: its first launch with these tensors is being captured into a CUDA "
                               "graph; launch it once before capturing (that launch uploads the pointer table and the "
                               "tensor maps, which a capture cannot), as torch code is warmed up before a capture")
        ptrs = (self.arena.data_ptr(),) + tuple(bound[b["name"]].data_ptr() if b["name"] in bound else 0
                                                for b in self.buffers)
        table = torch.tensor(ptrs, dtype=torch.int64).to(self.device)
        a = _Args()
        a.instrs = p.dev["instrs"].data_ptr()
        a.sm_begin = p.dev["sm_begin"].data_ptr()
        a.tasks = p.dev["tasks"].data_ptr()
        a.operands = p.dev["operands"].data_ptr()
        a.buffers = table.data_ptr()
        a.counters = p.sync.data_ptr()
        a.expected = p.dev["expected"].data_ptr()
        a.barrier = p.sync.data_ptr() + 4 * max(1, info["num_counters"])
        a.error = self.error.data_ptr()
        a.num_lists = info["num_lists"]
        a.num_barriers = info["num_barriers"]
        a.program = self._program_index[prog]
        a.timeout_ns = self.timeout_ns
        tmaps = self._tensor_maps(p, table) if p.num_tmaps else None
        a.tmaps = tmaps.data_ptr() if tmaps is not None else None
        copies = [(bound[cb["old"]].view(-1).view(torch.uint8), self.arena[cb["offset"]:cb["offset"] + cb["nbytes"]])
                  for cb in info["copy_back"]]
        bnd.prepared = (table, tmaps, a, ctypes.pointer(a), copies)

    def _launch(self, prog: str, bnd: "_Binding") -> None:
        p = self.programs[prog]
        if bnd.prepared is None:
            self._prepare(prog, bnd)
        _table, _tmaps, a, a_ptr, copies = bnd.prepared
        if torch.cuda.is_current_stream_capturing():
            self._captured.append(bnd)  # a graph holds its table's address: never evicted, never freed
        stream = self._stream()
        if self.profiling:
            code = self._launch_profiled(prog, a, stream)
        else:
            code = self._latch_launch(a_ptr, self.device.index, self.num_sms, self._smem_arg, stream)
        if code:
            self._check(code, f"launching program {prog!r} ({self.num_sms} blocks x {self.block_threads} threads, "
                              f"{self.smem} B smem)")
        self.launches += 1
        for dst, src in copies:
            dst.copy_(src)

    def _stream(self) -> int:
        """The current stream's handle on this device (torch's raw accessor where it has one: it
        makes no Stream object)."""
        if _RAW_STREAM is not None:
            return _RAW_STREAM(self.device.index)
        return torch.cuda.current_stream(self.device).cuda_stream

    def _on_device(self):
        """A context on this program's device: none where it is already torch's current device."""
        if torch.cuda.current_device() == self.device.index:
            return contextlib.nullcontext()
        return torch.cuda.device(self.device)

    def _tensor_maps(self, p: "_ProgramTables", ptrs: torch.Tensor) -> torch.Tensor:
        """The program's TMA tensor maps encoded for the buffers of ``ptrs`` (the device pointer table),
        on the device. Encoded on the host by the library (the driver's cuTensorMapEncodeTiled) once per
        binding (:meth:`_prepare`), which keeps them, so a training loop over the same tensors encodes once."""
        host_ptrs = ptrs.cpu()
        out = torch.empty(p.num_tmaps * TMAP_BYTES + 64, dtype=torch.uint8)
        base = out.data_ptr()
        aligned = (base + 63) // 64 * 64
        detail = ctypes.c_int(0)
        specs = ctypes.create_string_buffer(p.raw["tmaps"], len(p.raw["tmaps"]))
        code = self.lib.latch_encode_tmaps(specs, p.num_tmaps, ctypes.c_void_p(host_ptrs.data_ptr()),
                                           ctypes.c_void_p(aligned), ctypes.byref(detail))
        if code == -1:
            raise LaunchError("the CUDA driver has no cuTensorMapEncodeTiled (needs a CUDA 12 driver or newer)")
        if code != 0:
            i = code - 1000
            m = p.info.get("tmaps", [{}] * (i + 1))[i]
            raise LaunchError(f"program {p.name!r}: the driver refused tensor map {i} (group {m.get('group')}, value "
                              f"{m.get('value')!r}, dims {m.get('dims')}, box {m.get('box')}) with CUresult "
                              f"{detail.value}; the tensor's address or strides are not 16-byte aligned")
        enc = out[aligned - base: aligned - base + p.num_tmaps * TMAP_BYTES]
        t = torch.empty(p.num_tmaps * TMAP_BYTES, dtype=torch.uint8, device=self.device)
        t.copy_(enc)  # from pageable memory: synchronous, so ``out`` may go away
        return t

    def _launch_profiled(self, prog: str, a: _Args, stream: int) -> int:
        """The profiling build's launch: records for every instruction, then every block (see
        cuda/latch_kernel_main.cuh), zeroed first (zero marks a record the kernel did not write),
        and CUDA events around exactly the kernel launch. On an idle GPU the start event would fire
        before the host has even submitted the kernel, so a short GPU sleep is queued first: the
        events then time the kernel, not the host's launch call."""
        if torch.cuda.is_current_stream_capturing():
            raise ProgramError(f"{self.root} is a profiling build: its launches time themselves with CUDA events "
                               "and cannot be captured into a CUDA graph; capture a normal build")
        p = self.programs[prog]
        queued = sum(t["tasks"] for t in p.info.get("tickets", ()))
        n = p.num_instrs + self.num_sms + queued  # lists, blocks, queue tasks
        buf = torch.zeros((n, 2), dtype=torch.int64, device=self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(PROFILE_SLEEP_CYCLES)
        start.record()
        code = self.lib.latch_launch_profile(ctypes.byref(a), ctypes.c_void_p(buf.data_ptr()), self.device.index,
                                             self.num_sms, ctypes.c_longlong(self.smem), ctypes.c_void_p(stream))
        end.record()
        if code == 0:
            self._profiled.append((prog, buf, start, end))
        return code

    def profile(self, *, clear: bool = True) -> list[LaunchRecords]:
        """The records of the launches since the last call (at most the last PROFILE_KEEP), in launch
        order; waits for them. Only for a profiling build (``build(..., profile=True)``). Aggregate
        them with ``latch_codegen_h100.profile.report(doc, records)``."""
        if not self.profiling:
            raise ProgramError(f"{self.root} is not a profiling build: rebuild it with build(doc, out_dir, "
                               "profile=True) (tools/profile_report.py does) to get per-instruction records")
        out = []
        for prog, buf, start, end in self._profiled:
            end.synchronize()
            host = buf.cpu()
            n = self.programs[prog].num_instrs
            pairs = [tuple(x) for x in host.tolist()]
            m = n + self.num_sms
            out.append(LaunchRecords(prog, pairs[:n], pairs[n:m], float(start.elapsed_time(end)), pairs[m:]))
        if clear:
            self._profiled.clear()
        return out

    def _read_outputs(self, prog: str, bound: dict[str, torch.Tensor], groups=None) -> dict[str, torch.Tensor]:
        out = {}
        for o in self.manifest["programs"][prog]["outputs"]:
            if o["inplace"] or (groups is not None and o["group"] not in groups):
                continue
            nbytes = DTYPES[o["dtype"]].itemsize * max(1, _numel(o["shape"]))
            if o["buffer"] == 0:
                raw = self.arena[o["offset"]:o["offset"] + nbytes]
                t = raw.view(DTYPES[o["dtype"]]).reshape(o["shape"]).clone()
            else:
                t = bound[self.buffers[o["buffer"] - 1]["name"]].clone()
            out[o["value"]] = t
        return out

    # ------------------------------------------------------------------------------------------
    def run_program(self, prog: str, params=None, state=None, batch=None, hyper=None, *, check: bool = True):
        """Launch one program once; returns its outputs that are not written in place."""
        if prog not in self.programs:
            raise ProgramError(f"no program {prog!r} in this build; it has {sorted(self.programs)}")
        with self._on_device():
            bnd = self._binding(prog, params, state, batch, hyper)
            self._launch(prog, bnd)
            out = self._read_outputs(prog, bnd.bound)
            if check:
                self.check()
        return out

    def launch(self, prog: str, params=None, state=None, batch=None, hyper=None) -> None:
        """Launch one program once and return at once: no output is read and no error record is
        waited for (call :meth:`check`; :meth:`outputs` reads the outputs). For benchmarks."""
        if prog not in self.programs:
            raise ProgramError(f"no program {prog!r} in this build; it has {sorted(self.programs)}")
        with self._on_device():
            self._launch(prog, self._binding(prog, params, state, batch, hyper))

    def launcher(self, prog: str, params=None, state=None, batch=None, hyper=None):
        """A function that launches program ``prog`` on these very tensors, with nothing checked
        again: bound, checked and prepared once here, each call is the launch and the
        copy-backs (what :meth:`launch` does after its one pass over the inputs). The tensors'
        storage must stay where it is (rebind after ``p.data = ...``); hyper-parameters are the
        values given here (a tensor passed here is read at each launch). For benchmarks and tight
        loops; errors are read by :meth:`check`."""
        if prog not in self.programs:
            raise ProgramError(f"no program {prog!r} in this build; it has {sorted(self.programs)}")
        with self._on_device():
            bnd = self._binding(prog, params, state, batch, hyper)
            if bnd.prepared is None:
                self._prepare(prog, bnd)

        def go() -> None:
            with self._on_device():  # (the library's launch sets the device and leaves it set)
                self._launch(prog, bnd)
        return go

    def outputs(self, prog: str, params=None, state=None, batch=None, hyper=None) -> dict[str, torch.Tensor]:
        """Copies of program ``prog``'s outputs (not written in place) as its last launch left them."""
        with self._on_device():
            return self._read_outputs(prog, self._bind(prog, params, state, batch, hyper))

    def run(self, params, state, batch, hyper=None, *, check: bool = True, groups=None) -> dict[str, torch.Tensor]:
        """One complete update: ``update``, or ``accumulate`` K-1 times then ``accumulate_and_update``.
        ``batch`` is one mapping, or, for K microbatches, a list of K mappings. Returns the last
        program's outputs that are not written in place (loss, gradients where captured, metrics),
        or only those of the output ``groups`` named; with microbatches the last program's loss is
        already the step's (capture averages it). ``check=False`` skips the wait for the kernel's
        error record (call :meth:`check` later)."""
        seq = self._sequence()
        if len(seq) > 1:
            if not isinstance(batch, (list, tuple)) or len(batch) != len(seq):
                raise ProgramError(f"the build runs {len(seq)} microbatches: pass batch as a list of "
                                   f"{len(seq)} dicts (one per microbatch)")
            batches = list(batch)
        else:
            batches = [batch]
        out: dict[str, torch.Tensor] = {}
        snap = guard.Snapshot() if guard.safe_wanted(self) else None  # opt-in: see guard.py
        with self._on_device():
            try:
                for k, (prog, b) in enumerate(zip(seq, batches)):
                    bnd = self._binding(prog, params, state, b, hyper)
                    if snap is not None:
                        snap.save(self, prog, bnd.bound)
                    self._launch(prog, bnd)
                    if k == len(seq) - 1:
                        out = self._read_outputs(prog, bnd.bound, groups)
                if check or snap is not None:
                    self.check()
            except LaunchError as e:
                if snap is None:
                    raise
                snap.restore()
                raise LaunchError(snap.explain(e)) from None
        return out

    def __call__(self, params, state, batch, hyper=None, *, check: bool = True):
        """One update in place; returns the loss (the value of the output group ``loss``)."""
        out = self.run(params, state, batch, hyper, check=check, groups=("loss",))
        names = [o["value"] for o in self.manifest["programs"][self._sequence()[-1]]["outputs"] if o["group"] == "loss"]
        return out.get(names[0]) if names else None

    # ------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Wait for the launches so far and raise LaunchError if the kernel reported an error."""
        self._error_host.copy_(self.error)  # synchronous: waits for the stream
        e = self._error_host.tolist()
        if e[0] == 0:
            return
        self.error.zero_()
        self._profiled.clear()  # an aborted launch's records are incomplete
        for p in self.programs.values():  # counters are inconsistent after an aborted launch
            p.sync.zero_()  # (the epoch and the done count with them)
        raise LaunchError(self.describe_error(e))

    def describe_error(self, e: list[int]) -> str:
        code, block, pc, task, counter, value, target, _abort, prog_index = e[:9]
        a = e[10] & 0xFFFFFFFF | (e[11] << 32)
        b = e[12] & 0xFFFFFFFF | (e[13] << 32)
        value &= 0xFFFFFFFF
        target &= 0xFFFFFFFF
        names = list(self.manifest["programs"])
        prog = names[prog_index] if 0 <= prog_index < len(names) else names[0]
        if code == ERR_WAIT_TIMEOUT:
            t = self._next_task(prog, block, pc)
            ids = self.manifest["programs"][prog].get("counter_ids", [])
            cid = ids[counter] if 0 <= counter < len(ids) else counter
            msg = (f"spin timeout in program {prog!r}: SM {block}, task {t} ({self._task_desc(prog, t)}) waited on "
                   f"counter {cid}: value {value} of target {target} after {self.timeout_ns / 1e9:g} s")
            # The SM that reports first need not be the cause (a wait downstream of a stuck SM times
            # out too): name every wait of the tables that no launch can satisfy.
            roots = self.unsatisfiable_waits(prog)
            if roots:
                msg += "; cause: " + "; ".join(roots[:4]) + (f"; and {len(roots) - 4} more" if len(roots) > 4 else "")
            return msg
        if code == ERR_BARRIER_TIMEOUT:
            return (f"spin timeout in program {prog!r}: SM {block} waited at barrier {counter}: {value} of {target} "
                    f"blocks arrived after {self.timeout_ns / 1e9:g} s")
        if code == ERR_BAD_BODY:
            return f"program {prog!r}: task {task} names body {a}; the build has {b} bodies (tables and library disagree)"
        if code == ERR_INDEX_RANGE:
            return (f"program {prog!r}: task {task} ({self._task_desc(prog, task)}) read index {a}, outside [0, {b}); "
                    "check the batch's index tensors")
        if code == ERR_PIPE_TIMEOUT:
            what = (f"a stage of the ring (mbarrier at shared address {a}, phase parity {b})" if a >= 0
                    else f"the consumers to finish this SM's task number {b} before loading its outputs")
            return (f"program {prog!r}: pipeline timeout on SM {block}, task {task} ({self._task_desc(prog, task)}): "
                    f"waited {self.timeout_ns / 1e9:g} s for {what}; the producer and consumer halves of a body "
                    "disagree about the stages they use (a bug in that body's lowering)")
        return f"program {prog!r}: kernel error code {code} (SM {block}, task {task})"

    def unsatisfiable_waits(self, prog: str) -> list[str]:
        """Waits in ``prog``'s instruction tables whose count exceeds the signals the tables send to
        that counter in one launch: they can never be satisfied (the tables are corrupt or were
        built for another schedule). Each is described as "SM s, task t (node, op) waits on counter
        c for n signals; the program sends k"."""
        p = self.programs[prog]
        instrs = T.unpack_instrs(p.raw["instrs"])
        begins = [int.from_bytes(p.raw["sm_begin"][i:i + 4], "little", signed=True)
                  for i in range(0, len(p.raw["sm_begin"]), 4)]
        signals: dict[int, int] = {}
        for ins in instrs:
            if ins[0] == T.I_SIGNAL:
                signals[ins[1]] = signals.get(ins[1], 0) + 1
        ids = p.info.get("counter_ids", [])
        out = []
        for sm in range(len(begins) - 1):
            for pc in range(begins[sm], begins[sm + 1]):
                op, c, n = instrs[pc][:3]
                if op == T.I_WAIT and n > signals.get(c, 0):
                    t = self._next_task(prog, sm, pc - begins[sm])
                    cid = ids[c] if 0 <= c < len(ids) else c
                    out.append(f"SM {sm}, task {t} ({self._task_desc(prog, t)}) waits on counter {cid} for {n} "
                               f"signals; the program sends {signals.get(c, 0)}")
        return out

    def _next_task(self, prog: str, block: int, pc: int) -> int:
        p = self.programs[prog]
        instrs = T.unpack_instrs(p.raw["instrs"])
        begins = [int.from_bytes(p.raw["sm_begin"][i:i + 4], "little", signed=True)
                  for i in range(0, len(p.raw["sm_begin"]), 4)]
        if block + 1 >= len(begins):
            return -1
        for ins in instrs[begins[block] + max(pc, 0):begins[block + 1]]:
            if ins[0] == T.I_TASK:
                return ins[1]
        return -1

    def _task_desc(self, prog: str, task: int) -> str:
        if task < 0:
            return "no task"
        p = self.programs[prog]
        recs = T.unpack_tasks(p.raw["tasks"])
        if task >= len(recs):
            return "unknown task"
        group = str(recs[task][2])
        g = p.info["groups"].get(group, {})
        nodes = ", ".join(g.get("nodes", [])[:3])
        ops = ", ".join(sorted(set(g.get("ops", []))))
        src = f", from {g['source']}" if g.get("source") else ""
        return f"node {nodes}, op {ops}{src}"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def random_inputs(prog: Program, *, seed: int = 0) -> dict[str, Any]:
    """Inputs for a smoke run (``latch-pipeline run`` without --inputs): params ~ N(0, 0.02),
    state zero but the weight copies (``cast(p)``), float batch ~ N(0, 1), integer batch zero (a valid index for any table)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {"params": {}, "state": {}, "hyper": None}
    batch: dict[str, torch.Tensor] = {}
    for b in prog.buffers:
        dt = DTYPES[b["dtype"]]
        if b["role"] == "hyper":
            continue
        if b["role"] == "param":
            t = (torch.randn(b["shape"], generator=gen, dtype=torch.float64) * 0.02).to(dt)
            out["params"][b["name"]] = t.to(prog.device)
        elif b["role"] == "state":
            out["state"][b["name"]] = torch.zeros(b["shape"], dtype=dt, device=prog.device)
        elif dt.is_floating_point:
            batch[b["name"]] = torch.randn(b["shape"], generator=gen, dtype=torch.float64).to(dt).to(prog.device)
        else:
            batch[b["name"]] = torch.zeros(b["shape"], dtype=dt, device=prog.device)
    out["state"].update(prog.initial_copies(out["params"]))  # a weight copy starts as cast(p), never zero
    n = len(prog._sequence())
    out["batch"] = [dict(batch) for _ in range(n)] if n > 1 else batch
    return out
