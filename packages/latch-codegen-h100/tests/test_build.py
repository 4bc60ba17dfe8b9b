"""The build: one nvcc translation unit (kernel.cu includes the units), shared library with a C ABI,
cache, error reports.

Needs nvcc (present in CI and on the development machine); no GPU.
"""

from __future__ import annotations

import ctypes
import json
import time

import pytest

import h100_catalogue as C
import h100_handmade as H
from latch_core.hookspecs import hookimpl
from latch_core.ir import Value
from latch_core.plugins import load_with, registries
from latch_codegen_h100 import BuildError, Lowering, build, generate
from latch_codegen_h100 import builder
from latch_codegen_h100 import tables as T





pytestmark = pytest.mark.skipif(not H.have_nvcc(), reason="nvcc not installed")

F = "f32"






def test_build_links_a_library_with_the_c_abi_and_rebuilds_from_cache(tmp_path, cache):
    out = tmp_path / "b"
    doc = build(H.small_doc(), out, jobs=2)
    assert doc.build is not None and dict(doc.build.stats)["cached"] == "no"
    assert (out / "program.so").exists() and (out / "build.ninja").exists()
    ninja = (out / "build.ninja").read_text()
    # One translation unit (kernel.cu includes the unit files): no separate compilation, no device link.
    assert "-rdc=true" not in ninja and "-dlink" not in ninja and "arch=compute_90a,code=sm_90a" in ninja
    assert "build obj/kernel.o: cu src/kernel.cu | src/unit_0.cu" in ninja
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["key"] == doc.build.key
    lib = ctypes.CDLL(str(out / "program.so"))
    assert lib.latch_abi_version() == T.ABI_VERSION == 4
    assert lib.latch_block_threads() == 384
    assert lib.latch_num_bodies() == len(manifest["bodies"])
    assert (out / "tables" / "update.tasks.bin").stat().st_size == 96 * manifest["programs"]["update"]["num_tasks"]

    t0 = time.perf_counter()
    again = build(H.small_doc(), out, jobs=2)
    assert time.perf_counter() - t0 < 1.0
    assert dict(again.build.stats)["cached"] == "dir" and again.build.key == doc.build.key

    other = tmp_path / "c"
    t0 = time.perf_counter()
    third = build(H.small_doc(), other, jobs=2)
    assert time.perf_counter() - t0 < 1.0
    assert dict(third.build.stats)["cached"] == "cache"
    assert (other / "program.so").read_bytes() == (out / "program.so").read_bytes()


def test_a_schedule_change_reuses_the_library(tmp_path, cache):
    out = tmp_path / "b"
    first = build(H.small_doc(), out, jobs=2)
    values = H.small_doc().graph.programs[0]
    doc = H.planned([values], [values.value("w")], tiles=4, num_sms=3)  # other tiles, same signatures
    second = build(doc, out, jobs=2)
    assert second.build.key == first.build.key
    assert dict(second.build.stats)["cached"] == "dir"


def test_nvcc_errors_name_the_unit_the_op_and_the_first_diagnostic(tmp_path, cache):
    class P:
        @hookimpl
        def latch_register_lowerings(register):
            register("acme::broken", Lowering("acme::broken", body=lambda ctx: "this_is_not_cuda(;"))

    regs = load_with(("acme", P), entry_points=False)
    values = [Value("x", (4,), F, "batch"), Value("y", (4,), F)]
    g = H.graph("update", values, [("n0", "acme::broken", ("x",), ("y",))], [("batch", ["x"])],
                [("metrics", ["y"])])
    gen = generate(H.planned([g]), jobs=1, regs=regs)
    with pytest.raises(BuildError) as e:
        builder.compile_generated(gen, tmp_path / "b", jobs=2)
    msg = str(e.value)
    assert "unit_0.cu" in msg and "acme::broken" in msg and "error" in msg and "build.log" in msg


def test_missing_nvcc_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("LATCH_NVCC", raising=False)
    monkeypatch.setattr(builder, "FALLBACK_NVCC", ())
    with pytest.raises(BuildError, match="nvcc not found: install the CUDA toolkit"):
        build(H.small_doc(), tmp_path / "b")
    monkeypatch.setenv("LATCH_NVCC", str(tmp_path / "nope"))
    with pytest.raises(BuildError, match="LATCH_NVCC=.*is not an executable file"):
        build(H.small_doc(), tmp_path / "b")


def test_every_lowering_compiles(tmp_path, cache):
    """One node of every op of the core vocabulary, compiled for sm_90a (no GPU needed)."""
    regs = registries()
    g = C.example_graph(regs.ops)
    missing = sorted(o for o, low in regs.lowerings.items() if o.startswith("latch::") and o not in C.EXAMPLES)
    assert not missing, f"lowerings without a catalogue example: {missing}"
    gen = generate(H.planned([g]), jobs=2)
    res = builder.compile_generated(gen, tmp_path / "cat", jobs=2)
    assert (res.directory / "program.so").exists()


def test_the_key_covers_every_header_of_the_include_dirs(tmp_path, monkeypatch):
    import attrs

    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "a.cuh").write_text("// a\n")
    (inc / "b.cuh").write_text("// b, included by a.cuh only\n")
    gen = generate(H.small_doc(), jobs=1)
    gen = attrs.evolve(gen, headers=gen.headers + (str(inc / "a.cuh"), str(inc / "b.cuh")))
    flags = builder._flags(gen)
    k1 = builder.build_key(gen, flags, "13.0")
    (inc / "b.cuh").write_text("// b changed\n")
    assert builder.build_key(gen, flags, "13.0") != k1
    assert builder.build_key(gen, flags, "12.8") != builder.build_key(gen, flags, "13.0")
    real = generate(H.small_doc(), jobs=1)
    assert any(h.endswith("latch_matmul.cuh") for h in real.headers)  # not named by these ops' lowerings


def test_a_third_party_lowering_brings_its_own_header(tmp_path, cache):
    """A plugin package ships an op body as a .cuh in its own folder; the build finds it through
    the lowering's include_dirs and its text is part of the cache key."""
    inc = tmp_path / "acme_cuda"
    inc.mkdir()
    (inc / "acme_twice.cuh").write_text(
        "#pragma once\n#include \"latch_common.cuh\"\n"
        "namespace acme { template <class T> __device__ void twice(const T* x, T* y, long long lo, long long hi) {\n"
        "  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) latch::st<T>(y, i, 2 * latch::ld<T>(x, i)); } }\n")

    class Acme:
        @hookimpl
        def latch_register_lowerings(register):
            register("acme::twice", Lowering(
                "acme::twice", headers=("acme_twice.cuh",), include_dirs=(str(inc),),
                body=lambda ctx: f"acme::twice<{ctx.inputs[0].ctype}>({ctx.inputs[0].ptr}, {ctx.outputs[0].ptr}, "
                                 "c.t->lo[0], c.t->hi[0]);"))

    regs = load_with(("acme", Acme), ("codegen", __import__("latch_codegen_h100.plugin").plugin), entry_points=False)
    values = [Value("x", (40,), F, "batch"), Value("y", (40,), F)]
    g = H.graph("update", values, [("n0", "acme::twice", ("x",), ("y",))], [("batch", ["x"])], [("metrics", ["y"])])
    gen = generate(H.planned([g]), jobs=1, regs=regs)
    assert str(inc / "acme_twice.cuh") in gen.headers
    res = builder.compile_generated(gen, tmp_path / "b", jobs=2)
    assert (res.directory / "program.so").exists()
