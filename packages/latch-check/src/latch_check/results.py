"""Cached simulator checks: an identical document checked on identical inputs gives the identical
verdict, so a re-run reads it back (``latch-pipeline compile`` on the CPU; never a GPU run).

The key: the capture key of the example (its source, the local files it imported, overrides,
capture options, torch, Latch's code: ``latch_capture.cache``), the document (graph, schedule and
memory sections), the steps and the seed of the simulated task order. Anything in doubt is a miss.
Stored beside the capture cache, in ``results/``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import attrs

from latch_core.document import dumps

VERSION = 1


@attrs.frozen
class Cached:
    """A stored verdict, printed as the original run printed it."""

    passed: bool
    text: str
    runs: int
    failures: int

    def format(self) -> str:
        return self.text


def _dir() -> Path:
    from latch_capture.cache import cache_dir

    return cache_dir() / "results"


def key(compiled, *, steps: int, seed: int) -> str | None:
    from latch_capture import cache

    req = compiled.request
    options = {"grads": bool(req.grads), "routing": req.routing, "microbatches": None}
    try:
        capture_key = cache.key(req.example, dict(req.overrides), options)
        index = json.loads((cache.cache_dir() / f"{capture_key}.json").read_text())
        files = {f: cache.file_digest(Path(f)) for f in index["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no capture record to vouch for the example's files: do not cache
    if files != index["files"]:
        return None
    # stats (pass timings among them) do not change what is simulated; the records themselves do
    d = compiled.doc
    doc = attrs.evolve(d, build=None, provenance=(),
                       schedule=d.schedule and attrs.evolve(d.schedule, stats=()),
                       memory=d.memory and attrs.evolve(d.memory, stats=()))
    h = hashlib.sha256()
    h.update(json.dumps({"version": VERSION, "capture": capture_key, "files": files, "steps": steps,
                         "seed": seed}, sort_keys=True).encode())
    h.update(dumps(doc).encode())
    return h.hexdigest()


def lookup(k: str) -> Cached | None:
    try:
        rec = json.loads((_dir() / f"{k}.json").read_text())
        if rec.get("version") != VERSION:
            return None
        return Cached(bool(rec["passed"]), str(rec["text"]), int(rec["runs"]), int(rec["failures"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(k: str, result) -> None:
    d = _dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        rec = {"version": VERSION, "passed": result.passed, "text": result.format(), "runs": len(result.tables),
               "failures": sum(len(t.failures()) for t in result.tables)}
        tmp = d / f".{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, d / f"{k}.json")
    except OSError:
        pass  # an unwritable cache only costs a re-run
