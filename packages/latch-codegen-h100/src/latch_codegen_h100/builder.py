"""Build: generated units -> ``program.so`` through a generated ``build.ninja``.

The kernel is ONE translation unit: ``src/kernel.cu`` includes the unit files (the bodies), so hot
bodies inline into the worker's dispatch and ptxas keeps the register split between the producer and
the consumers (with separate compilation, -rdc, a call across units makes ptxas drop setmaxnreg
without a word). ptxas compiles the unit's functions in parallel (``-split-compile``), and nvcc's
resource report (registers, stack, spills) is parsed into the build section's stats.

Layout of a build directory::

    src/kernel.cu, src/unit_<k>.cu   generated sources (rewritten only when their text changes)
    obj/kernel.o                     the one object
    program.so                       the shared library (C ABI: cuda/latch_kernel_main.cuh)
    tables/<program>.<table>.bin     run-time tables; consts.bin
    manifest.json                    what the runtime needs; program.latch.json: the document
    build.ninja
    build.key                        the record that vouches for program.so: content key + sha256
    build.request                    the request key this directory was built from, file digests
    .build.lock                      held while a build runs in this directory

Validation first: ``build`` refuses a document the static validator (the ``schedule.validate`` pass
of latch-schedule, found through the plugins) does not prove hazard-free; ``validate=False`` skips
it for debugging and says so on stderr and in the build section's stats.

Before anything is lowered, ``build`` computes the request key (``request_key``: the document's
graph/schedule/memory, the lowering code and headers, flags, toolkit); a directory whose
``build.request`` matches, with every file it lists unchanged (sha256) and its library verified, is
returned as it is (``cached: dir``, ``request: hit``), its program.latch.json included.

Caching: the key is a hash of (generated sources, headers they include, flags, nvcc's version). A
build directory whose verified ``build.key`` record names the key is reused without running ninja;
otherwise a verified library with that key in the cache directory (``LATCH_CACHE_DIR``, default
``~/.cache/latch/h100``) is copied in; otherwise ninja compiles the units in parallel (only units
whose text changed, since unchanged sources keep their timestamps) and the result is cached. What
is trusted, how files are written and how concurrent builds are serialised: :mod:`.store`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attrs

from latch_core.document import Document
from latch_core.sections import BuildSection

from .ninja import run_ninja
from .bodies import CodegenError
from .codegen import Generated, generate
from . import store
from latch_core.errors import UserError

ARCH = "-gencode=arch=compute_90a,code=sm_90a"
COMPILE_FLAGS = (ARCH, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-lineinfo", "-split-compile=0",
                 "--resource-usage")
LIBRARY = "program.so"
# A profiling build (build(..., profile=True)) adds only this define: the kernel then records per
# instruction timestamps (cuda/latch_kernel_main.cuh). It is a flag, so it is part of the cache key.
PROFILE_FLAG = "-DLATCH_PROFILE=1"


class BuildError(UserError, RuntimeError):
    """The build failed; the message names the unit, the op(s) and the first diagnostic."""


FALLBACK_NVCC = ("/usr/local/cuda/bin/nvcc",)


def find_nvcc() -> str:
    """LATCH_NVCC, else $CUDA_HOME/bin/nvcc, else nvcc on PATH, else the usual install path."""
    explicit = os.environ.get("LATCH_NVCC")
    if explicit and not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
        raise BuildError(f"LATCH_NVCC={explicit!r} is not an executable file; point it at nvcc or unset it")
    for cand in (explicit,
                 os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME") else None,
                 shutil.which("nvcc"), *FALLBACK_NVCC):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise BuildError("nvcc not found: install the CUDA toolkit (12.4 or newer, for sm_90a), put nvcc on PATH, "
                     "or set CUDA_HOME or LATCH_NVCC")


def have_nvcc() -> bool:
    """Whether :func:`find_nvcc` finds one (the tests that compile skip exactly where a build would
    fail with "nvcc not found")."""
    try:
        find_nvcc()
        return True
    except BuildError:
        return False


def find_ninja() -> str:
    try:
        import ninja  # the PyPI package ships a binary

        p = os.path.join(ninja.BIN_DIR, "ninja")
        if os.path.isfile(p):
            return p
    except ImportError:
        pass
    p = shutil.which("ninja")
    if p:
        return p
    raise BuildError("ninja not found: `pip install ninja` (latch-codegen-h100 depends on it) or put ninja on PATH")


_VERSION_CACHE: dict[str, str] = {}


def toolkit_version(nvcc: str) -> str:
    if nvcc not in _VERSION_CACHE:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(f"{nvcc} --version failed: {e}") from None
        m = re.search(r"release ([\d.]+), V([\d.]+)", out)
        _VERSION_CACHE[nvcc] = m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"
    return _VERSION_CACHE[nvcc]


def cache_dir() -> Path:
    d = os.environ.get("LATCH_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "latch" / "h100"


def _flags(gen: Generated, profile: bool = False) -> list[str]:
    return list(COMPILE_FLAGS) + ([PROFILE_FLAG] if profile else []) + [f"-I{d}" for d in gen.include_dirs]


def build_key(gen: Generated, flags: list[str], toolkit: str) -> str:
    h = hashlib.sha256()
    h.update(f"abi {gen.manifest['abi']}\ntoolkit {toolkit}\n".encode())
    for f in flags:
        if not f.startswith("-I"):  # include dirs are paths: their contents count, not where they are
            h.update(f"flag {f}\n".encode())
    for u in gen.units:
        h.update(f"unit {u.name} {len(u.source)}\n".encode())
        h.update(u.source.encode())
    for p in gen.headers:
        data = Path(p).read_bytes()
        h.update(f"header {Path(p).name} {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# The request key: what determines a build, computed BEFORE lowering.
#
# A cached rebuild of a big program (TinyMoE-200M: 58k tasks) spent seconds generating every unit
# and table and serialising the document before it could see that nothing changed. The request key
# hashes the inputs of ``generate`` + ``compile_generated`` instead: the document's graph, schedule
# and memory sections, the Python sources of codegen and of every package that registers a lowering,
# the lowerings and op tags registered, every header of the include dirs, the flags, the unit split
# (``bodies_per_unit``; not the cores, codegen.units_for) and the toolkit. A build directory records the request key it was
# built from (``build.request``) with the size and mtime of every file it wrote; a build whose key
# matches, with those files untouched, is reused without lowering anything. Any doubt is a miss:
# the full path then runs and the content key (``build_key``) decides about compiling.

REQUEST_FILE = "build.request"
REQUEST_VERSION = 1

# Task fields code generation never reads: footprints and cost-model data serve the validator, the
# memory planner and the simulator (whose results are in the memory section, which is hashed whole).
# Hashing 58k tasks' footprints costs seconds, so they are left out; every other Task field (also
# one added later) is hashed. test_cache.py checks generate()'s output does not depend on these.
TASK_FIELDS_UNREAD = ("reads", "writes", "cost", "phase")

_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    """sha256 of a file, memoised by (path, mtime, size) within the process."""
    st = path.stat()
    memo = (str(path), st.st_mtime_ns, st.st_size)
    if memo not in _FILE_DIGESTS:
        _FILE_DIGESTS[memo] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _FILE_DIGESTS[memo]


def _package_dir(module_name: str) -> Path | None:
    """The folder of a module's top-level package (a lone module: its file)."""
    import sys

    top = sys.modules.get(module_name.split(".")[0])
    f = getattr(top, "__file__", None)
    if not f:
        return None
    f = Path(f).resolve()
    return f.parent if f.name == "__init__.py" else f


def _callable_module(fn) -> str | None:
    fn = getattr(fn, "func", fn)  # functools.partial
    return getattr(fn, "__module__", None)


def _without_timings(stats):
    """Section stats less the passes' own timings (``seconds*`` keys, at any depth): they differ
    between two runs of the same pipeline and say nothing about what is generated."""
    if isinstance(stats, tuple) and stats and all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in stats):
        return tuple((k, _without_timings(v)) for k, v in stats if not k.startswith("seconds"))
    return stats


def document_digest(doc: Document) -> str:
    """sha256 over what code generation reads of ``doc``: the graph and memory sections whole, the
    schedule section with its tasks less TASK_FIELDS_UNREAD. The build section and provenance do not
    count (they do not change what is generated)."""
    import operator

    from latch_core.document import encode as _encode
    from latch_core.sections import Task

    h = hashlib.sha256()

    def put(tag: str, text: str) -> None:
        data = text.encode()
        h.update(f"{tag} {len(data)}\n".encode())
        h.update(data)

    put("graph", json.dumps(_encode(doc.graph), allow_nan=False, separators=(",", ":")))
    memory = attrs.evolve(doc.memory, stats=_without_timings(doc.memory.stats))
    put("memory", json.dumps(_encode(memory), allow_nan=False, separators=(",", ":")))
    s = doc.schedule
    put("schedule", json.dumps([s.strategy, s.num_sms, _encode(_without_timings(s.stats))], allow_nan=False))
    hashed = tuple(f.name for f in attrs.fields(Task) if f.name not in TASK_FIELDS_UNREAD)
    get = operator.attrgetter(*hashed)
    for ps in s.programs:
        put("program", json.dumps([ps.program, ps.num_barriers, _encode(ps.groups), _encode(ps.counters)],
                                  allow_nan=False))
        put("sms", repr(ps.sms))  # tuples of str/int: repr is canonical
        put("tasks " + ",".join(hashed), repr([get(t) for t in ps.tasks]))
    return h.hexdigest()


def environment_digest(*, bodies_per_unit: int | None, profile: bool, regs=None) -> str:
    """sha256 over everything outside the document that determines a build (see the section comment)."""
    from latch_core.plugins import registries

    from .codegen import headers_of, include_dirs_of

    regs = regs if regs is not None else registries()
    nvcc = find_nvcc()
    h = hashlib.sha256()
    h.update(f"request {REQUEST_VERSION}\nnvcc {nvcc}\ntoolkit {toolkit_version(nvcc)}\n"
             f"bodies_per_unit {bodies_per_unit}\nflags {COMPILE_FLAGS!r} {PROFILE_FLAG if profile else ''}\n".encode())
    modules = {__name__, "latch_core", "latch_ops"}
    lowerings = dict(regs.lowerings.items())
    for name, low in lowerings.items():
        fields = []
        for f in attrs.fields(type(low)):
            v = getattr(low, f.name)
            if callable(v):
                mod = _callable_module(v)
                if mod:
                    modules.add(mod)
                v = f"{mod}:{getattr(getattr(v, 'func', v), '__qualname__', type(v).__name__)}"
            fields.append((f.name, v))
        h.update(f"lowering {name} {regs.lowerings.owner(name)} {fields!r}\n".encode())
    for name in regs.ops:
        h.update(f"op {name} {sorted(regs.ops.get(name).tags)!r}\n".encode())
    dirs = sorted({d for d in (_package_dir(m) for m in modules) if d is not None})
    for d in dirs:
        files = [d] if d.is_file() else sorted(d.rglob("*.py"))
        for f in files:
            h.update(f"py {f.relative_to(d.parent)} {_file_digest(f)}\n".encode())
    for p in headers_of(include_dirs_of(lowerings)):
        h.update(f"header {p} {_file_digest(Path(p))}\n".encode())
    return h.hexdigest()


def request_key(doc: Document, *, bodies_per_unit: int | None = None,
                profile: bool = False, regs=None) -> str:
    """The key of a build request, computable without lowering (see the section comment)."""
    env = environment_digest(bodies_per_unit=bodies_per_unit, profile=profile, regs=regs)
    return hashlib.sha256(f"{env}\n{document_digest(doc)}\n".encode()).hexdigest()


def _stamp(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _built_files(out_dir: Path, gen: Generated) -> list[str]:
    files = [f"src/{u.name}" for u in gen.units]
    files += [f"tables/{prog}.{k}.bin" for prog, tabs in gen.tables.items() for k in tabs.files()]
    return files + ["consts.bin", "manifest.json", LIBRARY, "build.key", "program.latch.json"]


def _write_request(out_dir: Path, request: str, section: BuildSection, files: list[str]) -> None:
    rec = {"version": REQUEST_VERSION, "request": request, "key": section.key, "units": list(section.units),
           "flags": list(section.flags), "toolkit": section.toolkit, "stats": dict(section.stats),
           "files": {f: _stamp(out_dir / f) for f in files},
           "sha256": {f: store.digest(out_dir / f) for f in files if f in _RUNTIME_READS or f.startswith("tables/")}}
    store.atomic_write(out_dir / REQUEST_FILE, json.dumps(rec, indent=1).encode())


# Files the runtime reads, verified by digest (not only size and mtime) before a directory is reused.
_RUNTIME_READS = ("manifest.json", "consts.bin", LIBRARY)


def _reuse(out_dir: Path, request: str) -> dict | None:
    """The record of ``out_dir`` when it was built from ``request``, every file it wrote is as it
    was written (size and mtime; the runtime's files by sha256) and its library verifies; else None."""
    p = out_dir / REQUEST_FILE
    try:
        rec = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(rec, dict) and rec.get("version") == REQUEST_VERSION and rec.get("request") == request
          and all(_stamp(out_dir / f) == stamp for f, stamp in rec.get("files", {}).items())
          and store.trusted_library(out_dir, rec.get("key")) is not None)
    if ok:
        for f, d in (rec.get("sha256") or {}).items():
            try:
                ok = ok and store.digest(out_dir / f) == d
            except OSError:
                ok = False
    return rec if ok else None


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    store.atomic_write(path, data)
    return True


def _ninja_file(gen: Generated, nvcc: str, flags: list[str]) -> str:
    def q(s: str) -> str:
        return s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")

    units = [u.name for u in gen.units]
    included = " ".join(f"src/{u}" for u in units[1:])
    lines = [
        "# generated by latch-codegen-h100; do not edit",
        "ninja_required_version = 1.3",
        f"nvcc = {q(nvcc)}",
        f"flags = {' '.join(q(f) for f in flags)}",
        "",
        # every output is written to $out.tmp and renamed: an interrupted step leaves no partial file
        # that ninja would later take for up to date (see store.py)
        "rule cu",
        "  command = $nvcc $flags -c $in -o $out.tmp && mv -f $out.tmp $out",
        "  description = nvcc $in",
        "rule so",
        "  command = $nvcc -shared $in -o $out.tmp -cudart static && mv -f $out.tmp $out",
        "  description = link $out",
        "",
        f"build obj/kernel.o: cu src/{units[0]}" + (f" | {included}" if included else ""),
        f"build {LIBRARY}: so obj/kernel.o",
        f"default {LIBRARY}",
    ]
    return "\n".join(lines) + "\n"


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if re.search(r"\berror\b", line, re.I) and not line.startswith("FAILED"):
            return line.strip()
    lines = [x for x in text.splitlines() if x.strip()]
    return lines[-1].strip() if lines else "(no output)"


def _explain_failure(out_dir: Path, gen: Generated, output: str) -> str:
    failed = re.findall(r"FAILED: (?:\[code=\d+\] )?(\S+)", output)
    first = _first_error(output)
    unit_name = None
    stems = [Path(failed[0]).stem] if failed else []
    m = re.search(r"src/(\w+)\.cu\(\d+\)", first)
    if m:
        stems.insert(0, m.group(1))
    for stem in stems:
        for u in gen.units:
            if unit_name is None and Path(u.name).stem == stem:
                unit_name = u.name
    if unit_name is None:
        return f"build in {out_dir} failed at {failed[0] if failed else 'an unknown step'}: {first}"
    unit = next(u for u in gen.units if u.name == unit_name)
    ops = ""
    m = re.search(re.escape(unit_name) + r"\((\d+)\)", first)
    by_key = {b["key"]: b for b in gen.manifest["bodies"]}
    if m and unit.lines:
        line = int(m.group(1))
        for lo, hi, key in unit.lines:
            if lo <= line <= hi:
                ops = f", op {'+'.join(by_key[key]['ops'])} (body {by_key[key]['describe'][:160]})"
    if not ops and unit.bodies:
        ops = ", ops " + ", ".join(sorted({"+".join(by_key[k]["ops"]) for k in unit.bodies}))
    return f"nvcc failed on unit {unit_name}{ops}: {first}  (full log: {out_dir}/build.log)"


def resource_report(log: str) -> dict:
    """ptxas's report of the kernel from a build log (``--resource-usage``): registers, stack,
    spills, and any warning that wgmma instructions were serialised (a body ptxas could not prove
    convergent: a silent slowdown of every product otherwise)."""
    out: dict = {}
    m = re.search(r"Function properties for latch_kernel\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                  r"(\d+) bytes spill loads", log)
    if m:
        out.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
    m = re.search(r"Compiling entry function 'latch_kernel'[\s\S]*?Used (\d+) registers", log)
    if m:
        out["registers"] = int(m.group(1))
    warn = sorted({w.strip() for w in re.findall(r"\((C75\d\d)\) Potential Performance Loss: ([^\n]*)", log) for w in [w[0]]})
    if warn:
        out["wgmma_warnings"] = tuple(warn)
    return out


@attrs.frozen
class BuildResult:
    directory: Path
    key: str
    cached: str  # "dir" (reused in place), "cache" (copied from the cache), or "" (compiled)
    seconds: float
    units: tuple[str, ...]
    flags: tuple[str, ...]
    toolkit: str
    resources: tuple = ()  # resource_report(build log) as pairs; empty when nothing was compiled


def write_sources(gen: Generated, out_dir: Path, doc: Document | None = None) -> None:
    """Write sources, tables, consts and manifest (sources only when their text changed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for u in gen.units:
        _write_if_changed(out_dir / "src" / u.name, u.source.encode())
    for prog, tabs in gen.tables.items():
        for k, data in tabs.files().items():
            _write_if_changed(out_dir / "tables" / f"{prog}.{k}.bin", data)
    _write_if_changed(out_dir / "consts.bin", gen.consts)
    if doc is not None:
        _save(doc, out_dir / "program.latch.json")


def _save(doc: Document, path: Path) -> None:
    from latch_core.document import dumps

    store.atomic_write(path, dumps(doc).encode())


def compile_generated(gen: Generated, out_dir: str | Path, *, jobs: int | None = None, use_cache: bool = True,
                      doc: Document | None = None, profile: bool = False) -> BuildResult:
    """Compile ``gen`` into ``out_dir`` (one build at a time per directory: its lock is taken here)."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with store.lock(out_dir / LOCK_FILE):
        return _compile_locked(gen, out_dir, jobs=jobs, use_cache=use_cache, doc=doc, profile=profile)


LOCK_FILE = ".build.lock"


def _compile_locked(gen: Generated, out_dir: Path, *, jobs: int | None, use_cache: bool, doc: Document | None,
                    profile: bool) -> BuildResult:
    t0 = time.perf_counter()
    nvcc = find_nvcc()
    toolkit = toolkit_version(nvcc)
    flags = _flags(gen, profile)
    key = build_key(gen, flags, toolkit)
    units = tuple(u.name for u in gen.units)
    lib = out_dir / LIBRARY
    if use_cache and store.trusted_library(out_dir, key) is not None:
        # everything else the runtime reads is rewritten where it differs
        manifest = dict(gen.manifest, key=key, library=LIBRARY, toolkit=toolkit, flags=flags)
        write_sources(gen, out_dir, doc)
        _write_if_changed(out_dir / "manifest.json", json.dumps(manifest, indent=1).encode())
        return BuildResult(out_dir, key, "dir", time.perf_counter() - t0, units, tuple(flags), toolkit)
    store.drop_trust(out_dir)  # before anything it vouches for changes
    manifest = dict(gen.manifest, key=key, library=LIBRARY, toolkit=toolkit, flags=flags)
    write_sources(gen, out_dir, doc)
    _write_if_changed(out_dir / "manifest.json", json.dumps(manifest, indent=1).encode())
    cache = cache_dir()
    with store.lock(cache / f"{key}.lock") if use_cache else contextlib.nullcontext():
        if use_cache and store.fetch(cache, key, lib):
            store.write_trust(out_dir, key, lib)
            return BuildResult(out_dir, key, "cache", time.perf_counter() - t0, units, tuple(flags), toolkit)
        _write_if_changed(out_dir / "build.ninja", _ninja_file(gen, nvcc, flags).encode())
        # Remove sources of units that no longer exist (a smaller program), so they cannot be linked.
        keep = set(units)
        for f in (out_dir / "src").glob("*.cu"):
            if f.name not in keep:
                f.unlink()
        # An untrusted library is never kept: relinking costs one step, and ninja would take a damaged
        # program.so newer than its objects for up to date. (Objects appear only whole: see the rules.)
        lib.unlink(missing_ok=True)
        ninja = find_ninja()
        cmd = [ninja, "-C", str(out_dir)]
        if jobs:
            cmd += ["-j", str(jobs)]
        proc = run_ninja(cmd)  # ninja's [done/total] lines drive a progress bar on a terminal
        log = proc.stdout + proc.stderr
        store.atomic_write(out_dir / "build.log", log.encode())
        if proc.returncode != 0:
            raise BuildError(_explain_failure(out_dir, gen, log))
        if not lib.exists():
            raise BuildError(f"build in {out_dir}: ninja succeeded but left no {LIBRARY}; see {out_dir}/build.log")
        resources = tuple(sorted(resource_report(log).items()))
        if use_cache:
            store.store(cache, key, lib)
        store.write_trust(out_dir, key, lib)  # last: from here on the directory is trusted
    return BuildResult(out_dir, key, "", time.perf_counter() - t0, units, tuple(flags), toolkit, resources)


VALIDATOR = "schedule.validate"


def check_proven(doc: Document) -> None:
    """Raise BuildError unless the static validator proves ``doc`` hazard-free. The validator is the
    ``schedule.validate`` pass (latch-schedule), found through the plugins like every other pass."""
    from latch_core.plugins import registries

    passes = registries().passes
    if VALIDATOR not in passes:
        raise BuildError(f"refusing to build: no static validator is installed (the pass {VALIDATOR!r} of "
                         "latch-schedule), so the document cannot be proven hazard-free; install latch-schedule, "
                         "or pass validate=False / --no-validate to build it unproven (debugging only)")
    missing = set(passes.get(VALIDATOR).requires) - doc.sections()
    if missing:
        raise BuildError(f"refusing to build: the document lacks section(s) {sorted(missing)}; run the schedule and "
                         "memory.plan passes first")
    try:
        passes.get(VALIDATOR).run(doc)
    except Exception as e:  # ValidationError lists every hazard; anything else is the validator's own error
        raise BuildError(f"refusing to build a document the static validator rejects: {e}\n(fix the schedule or "
                         "memory plan, or pass validate=False / --no-validate to build it anyway, for debugging)") from None


def build(doc: Document, out_dir: str | Path, *, jobs: int | None = None, use_cache: bool = True,
          bodies_per_unit: int | None = None, profile: bool = False, validate: bool = True) -> Document:
    """Validate, generate, compile and link ``doc``'s programs into ``out_dir``; returns ``doc`` with
    a ``build`` section. Raises BuildError (a document the validator rejects, the toolchain) or
    CodegenError (lowering).

    ``validate=False``: skip the static validator (debugging only): a line on stderr says so and the
    build section's stats record ``validated: False``.
    ``profile=True``: a profiling build (units compiled with ``-DLATCH_PROFILE=1``, its own cache
    key; the runtime then records per-instruction timestamps, see latch_codegen_h100.profile). The
    generated sources are the same either way; a normal build compiles no profiling code."""
    if validate:
        check_proven(doc)
    else:
        print(f"latch build: static validation SKIPPED (validate=False) for {out_dir}: the document is not proven "
              "hazard-free", file=sys.stderr)
    t0 = time.perf_counter()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with store.lock(out_dir / LOCK_FILE):
        out = _build_locked(doc, out_dir, t0, jobs=jobs, use_cache=use_cache, bodies_per_unit=bodies_per_unit,
                            profile=profile)
    if not validate:
        out = attrs.evolve(out, build=attrs.evolve(out.build, stats=dict(out.build.stats, validated=False)))
    return out


def check_compiles(doc: Document, out_dir: str | Path, *, validate: bool = True) -> Path:
    """Generate ``doc``'s CUDA into ``out_dir`` and run nvcc's front end and NVVM on it (``-ptx``: C++
    semantics, templates, every generated name), without ptxas or the link: about a seventh of a full
    build's time for a large kernel (transformers' Mixtral: 10 s against 68 s on 2 cores). It proves
    the generated source is valid CUDA, not that ptxas accepts it (registers, wgmma pipelining):
    :func:`build` does that. Returns the PTX file; raises BuildError naming the unit and the ops of
    the failing line, as :func:`build` does."""
    if validate:
        check_proven(doc)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = generate(doc)
    write_sources(gen, out_dir, doc)
    ptx = out_dir / "obj" / "kernel.ptx"
    ptx.parent.mkdir(parents=True, exist_ok=True)
    flags = [f for f in _flags(gen) if f != "--resource-usage"]
    # the manifest as a build writes it (buffers, bodies, metadata), naming no library: none is built
    _write_if_changed(out_dir / "manifest.json", json.dumps(dict(gen.manifest, library=None, flags=flags,
                                                                   check_only=True), indent=1).encode())
    proc = subprocess.run([find_nvcc(), *flags, "-ptx", f"src/{gen.units[0].name}", "-o", str(ptx)],
                          cwd=out_dir, capture_output=True, text=True)
    store.atomic_write(out_dir / "build.log", (proc.stdout + proc.stderr).encode())
    if proc.returncode != 0:
        raise BuildError(_explain_failure(out_dir, gen, proc.stdout + proc.stderr))
    return ptx


def _build_locked(doc, out_dir: Path, t0: float, *, jobs, use_cache, bodies_per_unit, profile) -> Document:
    request = None
    if use_cache:
        # Checked before lowering: an unchanged request reuses the directory as it is, including its
        # program.latch.json (whose build section is the build that wrote the directory).
        request = request_key(doc, bodies_per_unit=bodies_per_unit, profile=profile)
        rec = _reuse(out_dir, request)
        if rec is not None:
            st = dict(rec["stats"])
            section = BuildSection(
                directory=str(out_dir), key=rec["key"], units=tuple(rec["units"]), flags=tuple(rec["flags"]),
                toolkit=rec["toolkit"],
                stats={"generate_seconds": 0.0, "compile_seconds": round(time.perf_counter() - t0, 4),
                       "cached": "dir", "bodies": st["bodies"], "smem_bytes": st["smem_bytes"], "request": "hit"},
            )
            return attrs.evolve(doc, build=section)
    (out_dir / REQUEST_FILE).unlink(missing_ok=True)  # a failed build below must not leave a valid record
    gen = generate(doc, bodies_per_unit=bodies_per_unit, jobs=jobs)
    t_gen = time.perf_counter() - t0
    res = compile_generated(gen, out_dir, jobs=jobs, use_cache=use_cache, profile=profile)  # lock re-entered
    section = BuildSection(
        directory=str(res.directory), key=res.key, units=res.units, flags=res.flags, toolkit=res.toolkit,
        stats={"generate_seconds": round(t_gen, 4), "compile_seconds": round(res.seconds, 4),
               "cached": res.cached or "no", "bodies": len(gen.manifest["bodies"]),
               "functions": len({b["function"] for b in gen.manifest["bodies"]}),
               "smem_bytes": gen.manifest["smem"], "ring": gen.manifest["ring"], **dict(res.resources)},
    )
    out = attrs.evolve(doc, build=section)
    _save(out, out_dir / "program.latch.json")
    if request is not None:
        _write_request(out_dir, request, section, _built_files(out_dir, gen))
    return out


__all__ = ["build", "compile_generated", "BuildError", "CodegenError", "BuildResult", "find_nvcc", "build_key",
           "PROFILE_FLAG", "request_key", "document_digest", "environment_digest", "check_proven"]
