"""Helpers shared by the cross-package tests in tests/ (importable through tests/conftest.py).

- ``have_nvcc`` (latch_codegen_h100's) / ``needs_nvcc``: whether nvcc is installed, found the
  way the build finds it (``find_nvcc``: LATCH_NVCC, CUDA_HOME, PATH, the usual install path),
  so a test skips exactly where a build would fail with "nvcc not found".
- ``planned``: the document ``latch_core.pipeline.compile`` returns for a request, computed once per
  test session. Planning a full-size model (meta device) takes 10-20 s on 2 cores, and several
  files plan the same request (the dense transformer at 2 x 1024 tokens: test_lmhead.py and
  test_weight_copies.py). Documents are frozen attrs records, so a test cannot change what another
  one reads; the key is the whole request, so two requests that differ in anything plan apart.

(Builds started ahead of the tests that read them: latch_codegen_h100.testing.BuildsAhead.)
"""

from __future__ import annotations

import pytest

from latch_codegen_h100 import have_nvcc

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
