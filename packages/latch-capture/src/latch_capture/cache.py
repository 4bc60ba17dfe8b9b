"""The capture cache: an unchanged example is not traced again.

A capture is a function of what it reads, and the key is exactly that:
- the example file and every local file it imported (modules loaded from the example's folder,
  e.g. ``examples/_optim.py``), by content;
- the overrides given to its ``build()`` and the capture options (gradients, routing, microbatches);
- torch's version, Python's version and ``LATCH_PLUGINS``;
- Latch's capture code: the Python sources of latch-core, latch-capture and of every installed
  ``latch.plugins`` package (the op specs capture lowers against).

An entry is stored under the key of everything but the imported files (known only after a first
capture); its index records each imported file's digest, and an entry is used only when every one
of them is unchanged. Any doubt (a missing, unreadable or different file) is a miss, and the capture
runs. Computing the key imports nothing: no torch, no example code.

Where: ``LATCH_CAPTURE_CACHE``, else ``$LATCH_CACHE_DIR/capture``, else ``~/.cache/latch/capture``.
An example that reads data files at build time (not imports) should pass what it read as an
override, or run with the cache off (``--no-cache``): the key cannot see file reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata, util
from pathlib import Path
from typing import Any, Mapping

VERSION = 1
ENV = "LATCH_CAPTURE_CACHE"
_DIGESTS: dict[tuple[str, int, int], str] = {}


def cache_dir() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    if os.environ.get("LATCH_CACHE_DIR"):
        return Path(os.environ["LATCH_CACHE_DIR"]) / "capture"
    return Path.home() / ".cache" / "latch" / "capture"


def file_digest(path: Path) -> str:
    st = path.stat()
    memo = (str(path), st.st_mtime_ns, st.st_size)
    if memo not in _DIGESTS:
        _DIGESTS[memo] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[memo]


def _package_dirs() -> list[Path]:
    """The folders of latch-core, latch-capture and every latch.plugins entry point's top package,
    found without importing them."""
    tops = {"latch_core", "latch_capture"}
    for ep in metadata.entry_points(group="latch.plugins"):
        tops.add(ep.value.split(":")[0].split(".")[0])
    dirs = []
    for top in sorted(tops):
        try:
            spec = util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            dirs += [Path(p) for p in spec.submodule_search_locations]
        elif spec.origin:
            dirs.append(Path(spec.origin))
    return dirs


def code_digest() -> str:
    """sha256 over the Python sources capture's result depends on (see the module docstring)."""
    h = hashlib.sha256()
    for d in _package_dirs():
        files = [d] if d.is_file() else sorted(d.rglob("*.py"))
        for f in files:
            h.update(f"{f.name if d.is_file() else f.relative_to(d.parent)} {file_digest(f)}\n".encode())
    return h.hexdigest()


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def key(example: str | Path, overrides: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    path = Path(example).resolve()
    data = {
        "version": VERSION, "example": str(path), "source": file_digest(path),
        "overrides": _jsonable(overrides), "options": _jsonable(options),
        "torch": _torch_version(), "python": sys.version.split()[0],
        "plugins": os.environ.get("LATCH_PLUGINS", ""), "code": code_digest(),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)


def local_imports(example: str | Path) -> dict[str, str]:
    """{path: digest} of the local files the example depends on (the example itself excluded: it is
    in the key): every loaded module whose file lies under the example's folder, and every module
    the example's namespace refers to (a helper imported by name, wherever it was found first in
    this process) that is not installed (outside ``sys.prefix``)."""
    from .examples import MODULES

    path = Path(example).resolve()
    folder = path.parent
    installed = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    files = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and folder in Path(f).resolve().parents:
            files.add(Path(f).resolve())
    module = MODULES.get(str(path))
    for v in list(vars(module).values()) if module is not None else ():
        m = v if isinstance(v, type(sys)) else sys.modules.get(getattr(v, "__module__", None) or "")
        f = getattr(m, "__file__", None)
        if f and not any(root in Path(f).resolve().parents for root in installed):
            files.add(Path(f).resolve())
    return {str(p): file_digest(p) for p in sorted(files) if p != path and p.suffix == ".py" and p.is_file()}


def lookup(k: str) -> Path | None:
    """The cached document of key ``k`` when every local file its capture imported is unchanged."""
    index = cache_dir() / f"{k}.json"
    try:
        rec = json.loads(index.read_text())
        if rec.get("version") != VERSION:
            return None
        for f, digest in rec["files"].items():
            if file_digest(Path(f)) != digest:
                return None
        doc = cache_dir() / rec["document"]
        return doc if doc.is_file() else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(k: str, document_text: str, files: Mapping[str, str]) -> None:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    doc_name = f"{k}.latch.json"
    _atomic_write(d / doc_name, document_text)
    _atomic_write(d / f"{k}.json", json.dumps({"version": VERSION, "document": doc_name, "files": dict(files)},
                                              indent=1))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
