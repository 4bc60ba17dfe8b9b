"""Test support: nvcc builds started ahead of the tests that read them.

nvcc's front end compiles a translation unit on one core, so a test file whose tests build one
kernel after another keeps one of CI's two cores idle; two builds side by side use both. The same
``build`` calls run with the same arguments, only earlier, in threads; the documents are planned by
the caller in its own thread (capture runs torch). A test reads its build with ``get``, which
re-raises the build's own exception (a BuildError names the unit and the op) in that test. Used by
latch-codegen-h100's, latch-check's and the cross-package tests; nothing here is on a production path.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any, Callable


class BuildsAhead:
    """``build(doc, root / key, **build_kwargs)`` of each submitted document in a pool of ``workers``
    threads; ``get(key)`` -> (the built document, its build directory)."""

    def __init__(self, root: Path, workers: int = 2, **build_kwargs: Any):
        self.root, self.build_kwargs = Path(root), build_kwargs
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="latch-build-ahead")
        self._futures: dict[Any, concurrent.futures.Future] = {}

    def __contains__(self, key) -> bool:
        return key in self._futures

    def _dir(self, key) -> Path:
        return self.root / ("-".join(map(str, key)) if isinstance(key, tuple) else str(key))

    def submit(self, key, doc) -> None:
        """Start building ``doc`` under ``key`` (a key submitted before is left as it is)."""
        if key in self._futures:
            return
        from . import build

        out = self._dir(key)
        self._futures[key] = self._pool.submit(lambda: (build(doc, out, **self.build_kwargs), out))

    def get(self, key, make_doc: Callable[[], Any] | None = None):
        """(built document, build directory) of ``key``, waiting for it; a key nobody submitted is
        planned (``make_doc()``) and built now."""
        if key not in self._futures and make_doc is not None:
            self.submit(key, make_doc())
        return self._futures[key].result()

    def finish(self) -> None:
        """Wait until nothing runs (before a test patches what the builds use); errors stay with ``get``."""
        concurrent.futures.wait(list(self._futures.values()))

    def close(self) -> None:
        self.finish()
        self._pool.shutdown()
