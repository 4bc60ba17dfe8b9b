"""Helpers shared by the cross-package tests in tests/ (importable through tests/conftest.py).

- ``have_nvcc`` / ``needs_nvcc``: whether nvcc is installed, found the way the build finds it
  (``latch_codegen_h100.builder.find_nvcc``: LATCH_NVCC, CUDA_HOME, PATH, the usual install path),
  so a test skips exactly where a build would fail with "nvcc not found".
- ``planned``: the document ``latch_core.pipeline.compile`` returns for a request, computed once per
  test session. Planning a full-size model (meta device) takes 10-20 s on 2 cores, and several
  files plan the same request (the dense transformer at 2 x 1024 tokens: test_lmhead.py and
  test_weight_copies.py). Documents are frozen attrs records, so a test cannot change what another
  one reads; the key is the whole request, so two requests that differ in anything plan apart.
- ``Ahead``: work (nvcc builds) started in background threads before the tests that read it. nvcc's
  front end compiles a translation unit on one core, so a file whose tests build one kernel after
  another keeps one of CI's 2 cores idle; two builds side by side use both. The same calls run with
  the same arguments, only earlier; a test reads its result with ``get``, which re-raises the work's
  own exception (a BuildError names the unit and the op) in that test.
"""

from __future__ import annotations

import concurrent.futures
import functools

import pytest


@functools.cache
def have_nvcc() -> bool:
    from latch_codegen_h100 import BuildError
    from latch_codegen_h100.builder import find_nvcc

    try:
        find_nvcc()
        return True
    except BuildError:
        return False


needs_nvcc = pytest.mark.skipif(not have_nvcc(), reason="nvcc not installed")

_PLANNED: list = []  # (request, document): Request holds a dict, so it is compared, not hashed


def planned(request):
    """``compile(request)``, once per session for equal requests (``request``: a
    latch_core.pipeline.Request with build=False; a build writes files and is not shared here)."""
    from latch_core.pipeline import compile

    if request.build:
        raise ValueError("planned() shares plans only; a request that builds must run compile() itself")
    for seen, doc in _PLANNED:
        if seen == request:
            return doc
    doc = compile(request)
    _PLANNED.append((request, doc))
    return doc


class Ahead:
    """Named calls running in a pool of ``workers`` threads (see the module docstring)."""

    def __init__(self, workers: int = 2):
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="latch-ahead")
        self._futures: dict[str, concurrent.futures.Future] = {}

    def submit(self, name: str, fn, *args, **kwargs) -> None:
        if name in self._futures:
            raise ValueError(f"{name!r} was submitted already")
        self._futures[name] = self._pool.submit(fn, *args, **kwargs)

    def get(self, name: str):
        """The call's result, waiting for it; its exception, raised here."""
        return self._futures[name].result()

    def finish(self) -> None:
        """Wait until nothing runs (before a test patches what the calls use); errors stay with ``get``."""
        concurrent.futures.wait(list(self._futures.values()))

    def close(self) -> None:
        self.finish()
        self._pool.shutdown()
