"""bench-memory's document through nvcc (sm_90a): every program builds, and the machine code holds
the fused bodies' 128-bit accesses. (Cross-package: it reads latch-codegen-h100's machine code.)"""

from __future__ import annotations

import re

import pytest

from latch_check import bench_memory as bm

SMALL = [("embed.weight", (64, 32)), ("n.weight", (32,)), ("w1", (4, 32, 16)), ("router", (3, 32))]


def _have_nvcc() -> bool:
    from latch_codegen_h100 import BuildError
    from latch_codegen_h100.builder import find_nvcc

    try:
        find_nvcc()
        return True
    except BuildError:
        return False


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")
def test_the_document_compiles_for_sm90a_with_128_bit_accesses(tmp_path, monkeypatch):
    """nvcc builds every program; the machine code holds 128-bit global loads and stores (the
    vector path of the fused bodies: LD.E.128 / ST.E.128, generic addressing since the operand
    pointers come from the task table)."""
    from latch_codegen_h100 import build
    from latch_codegen_h100.sass import _run, find_cuobjdump

    monkeypatch.setenv("LATCH_CACHE_DIR", str(tmp_path / "cache"))
    small_doc = bm.plan_document(bm.memory_document(shapes=SMALL, T=48), num_sms=8)
    doc = build(small_doc, tmp_path / "b")
    sass = _run([find_cuobjdump(), "-sass", str(tmp_path / "b" / "program.so")])
    assert re.search(r"\bLDG?\.E\.128", sass) and re.search(r"\bSTG?\.E\.128", sass)
    assert doc.build is not None
