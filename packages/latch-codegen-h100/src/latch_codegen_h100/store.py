"""What the build trusts, and how it writes it: digests, atomic files, locks, the library cache.

Rules (each a fault test in tests/test_store.py):
- nothing is trusted by name or timestamp alone: a library in a build directory or in the cache is
  used only when its sha256 equals the digest recorded when it was built (``Trust``); a truncated
  or corrupted one is removed and rebuilt, never loaded;
- every file appears whole or not at all: written to a unique temporary name in the same folder,
  flushed, then renamed over the target (``atomic_write``, ``atomic_copy``); the nvcc steps of
  build.ninja write ``$out.tmp`` and rename it, so an interrupted compile leaves no half object or
  library that ninja would later think up to date;
- the record that vouches for a directory (``build.key``: the content key and the library digest)
  is removed before anything it vouches for is touched and written last, so an interrupted build
  leaves nothing a later build trusts;
- one build at a time per directory and per cache key: ``lock(path)`` takes an exclusive
  ``fcntl.flock`` on ``path`` (held by the process, released when it exits, even by a kill), so
  concurrent builds of one document into one directory wait for each other and then reuse the
  result, and builds into different directories compile one key once;
- cache entries are content-addressed: ``<key>.so`` (the key hashes sources, headers, flags and
  toolkit) plus ``<key>.json`` (its sha256 and size), the JSON written after the library.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator
from latch_core.errors import UserError

TRUST_FILE = "build.key"
TRUST_VERSION = 1


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_copy(src: Path, dst: Path) -> str:
    """Copy ``src`` over ``dst`` atomically; returns the sha256 of what was written."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        h = hashlib.sha256()
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                h.update(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dst)
        return h.hexdigest()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_HELD: dict[str, int] = {}  # lock files this process holds -> depth (a lock is re-entrant within it)


@contextlib.contextmanager
def lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) for the duration of the block. Re-entrant
    within one process (build() holds its directory's lock and calls compile_generated, which takes
    it too); between processes, flock serialises."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    name = str(path.resolve())
    if _HELD.get(name):
        _HELD[name] += 1
        try:
            yield
        finally:
            _HELD[name] -= 1
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        _HELD[name] = 1
        try:
            yield
        finally:
            _HELD.pop(name, None)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# The record that vouches for a build directory's library


def write_trust(out_dir: Path, key: str, library: Path) -> str:
    d = digest(library)
    rec = {"version": TRUST_VERSION, "key": key, "library": library.name, "sha256": d,
           "size": library.stat().st_size}
    atomic_write(out_dir / TRUST_FILE, (json.dumps(rec) + "\n").encode())
    return d


def read_trust(out_dir: Path) -> dict | None:
    try:
        rec = json.loads((out_dir / TRUST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("version") == TRUST_VERSION else None


def drop_trust(out_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (out_dir / TRUST_FILE).unlink()


def trusted_library(out_dir: Path, key: str | None = None) -> Path | None:
    """The directory's library when its record names ``key`` (any key when None) and the file's
    sha256 is the recorded one; else None (a mismatching library is deleted: it must never load)."""
    rec = read_trust(out_dir)
    if rec is None or (key is not None and rec.get("key") != key):
        return None
    lib = out_dir / str(rec.get("library", ""))
    try:
        if lib.stat().st_size == rec.get("size") and digest(lib) == rec.get("sha256"):
            return lib
    except OSError:
        return None
    drop_trust(out_dir)
    with contextlib.suppress(OSError):
        lib.unlink()
    return None


class CorruptLibrary(UserError, RuntimeError):
    pass


def verify_directory(out_dir: str | Path) -> None:
    """For the runtime, before it loads a library: raise CorruptLibrary unless ``out_dir``'s library
    is the one its build recorded (a truncated or replaced program.so would crash the process)."""
    out_dir = Path(out_dir)
    rec = read_trust(out_dir)
    if rec is None:
        raise CorruptLibrary(f"{out_dir}: no {TRUST_FILE} record (the build did not finish, or it predates "
                             "library digests); rebuild it: latch-pipeline build -i DOC -d DIR")
    lib = out_dir / str(rec.get("library", ""))
    ok = lib.exists() and lib.stat().st_size == rec.get("size") and digest(lib) == rec.get("sha256")
    if not ok:
        raise CorruptLibrary(f"{lib} is not the library its build recorded (sha256/size differ: truncated or "
                             "replaced); refusing to load it. Rebuild the directory (the build replaces it)")


# --------------------------------------------------------------------------------------------
# The content-addressed cache


def cache_entry(cache: Path, key: str) -> tuple[Path, Path]:
    return cache / f"{key}.so", cache / f"{key}.json"


def fetch(cache: Path, key: str, dst: Path) -> bool:
    """Copy the cached library for ``key`` to ``dst`` when the entry verifies; a corrupt entry is
    removed (the caller compiles and stores a fresh one)."""
    lib, meta = cache_entry(cache, key)
    try:
        rec = json.loads(meta.read_text())
        want = rec["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        got = atomic_copy(lib, dst)
    except OSError:
        got = None
    if got == want:
        return True
    for p in (meta, lib, dst):
        with contextlib.suppress(OSError):
            p.unlink()
    return False


def store(cache: Path, key: str, library: Path) -> None:
    """Add ``library`` under ``key`` (library first, then its record). An unwritable cache only
    costs a rebuild later."""
    lib, meta = cache_entry(cache, key)
    try:
        d = atomic_copy(library, lib)
        atomic_write(meta, (json.dumps({"sha256": d, "size": lib.stat().st_size}) + "\n").encode())
    except OSError:
        pass
