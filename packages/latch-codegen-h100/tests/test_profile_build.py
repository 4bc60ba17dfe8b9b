"""The profiling build: compiled with -DLATCH_PROFILE=1 under its own cache key, while a normal
build's sources, flags and compiled code carry nothing of it. Needs nvcc; no GPU."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import pytest

import h100_handmade as H
from latch_codegen_h100 import build, builder, generate
from latch_codegen_h100 import tables as T

ROOT = Path(__file__).resolve().parents[3]




pytestmark = pytest.mark.skipif(not H.have_nvcc(), reason="nvcc not installed")






def _preprocessed(out: Path, flags) -> str:
    """kernel.cu through nvcc's preprocessor with the build's own flags (device side)."""
    cmd = [builder.find_nvcc(), *[f for f in flags if f not in ("-lineinfo",)], "-E", "--cuda",
           str(out / "src" / "kernel.cu"), "-o", "-"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_profiling_build_of_the_mlp_compiles_and_differs_only_by_its_flag(tmp_path, cache):
    compile_example = pytest.importorskip("latch_check.pipeline").compile_example  # the whole pipeline

    doc = compile_example(ROOT / "examples" / "mlp.py", num_sms=132, build=False).doc
    out = tmp_path / "prof"
    built = build(doc, out, jobs=2, profile=True)
    assert builder.PROFILE_FLAG in built.build.flags
    manifest = json.loads((out / "manifest.json").read_text())
    assert builder.PROFILE_FLAG in manifest["flags"]
    assert "-DLATCH_PROFILE=1" in (out / "build.ninja").read_text()
    lib = ctypes.CDLL(str(out / "program.so"))
    assert lib.latch_abi_version() == T.ABI_VERSION == 4 and hasattr(lib, "latch_launch_profile") and hasattr(lib, "latch_launch")

    # The generated sources are the normal build's; only the flags (hence the key) differ.
    gen = generate(doc, jobs=2)
    for u in gen.units:
        assert (out / "src" / u.name).read_text() == u.source
    normal = builder._flags(gen)
    assert builder.PROFILE_FLAG not in normal
    assert [f for f in built.build.flags if f != builder.PROFILE_FLAG] == normal
    tk = builder.toolkit_version(builder.find_nvcc())
    assert builder.build_key(gen, normal, tk) != built.build.key == builder.build_key(gen, list(built.build.flags), tk)
    pre = _preprocessed(out, built.build.flags)
    assert "latch_launch_profile" in pre and "prof_store" in pre


def test_a_normal_build_compiles_no_profiling_code(tmp_path, cache):
    out = tmp_path / "normal"
    doc = build(H.small_doc(), out, jobs=2)
    assert builder.PROFILE_FLAG not in doc.build.flags
    assert "LATCH_PROFILE" not in (out / "build.ninja").read_text()
    lib = ctypes.CDLL(str(out / "program.so"))
    assert not hasattr(lib, "latch_launch_profile")
    pre = _preprocessed(out, doc.build.flags)
    assert "prof_store" not in pre and "latch_launch_profile" not in pre and "prof_t0" not in pre
    # The kernel keeps its one parameter (the ABI the runtime's normal path launches with).
    assert "latch_kernel(latch::Args a )" in pre or "latch_kernel(latch::Args a)" in pre

    # A profiling build of the same document: another key, so the two never share a cached library.
    prof = build(H.small_doc(), tmp_path / "p", jobs=2, profile=True)
    assert prof.build.key != doc.build.key and dict(prof.build.stats)["cached"] == "no"


def test_the_runtime_refuses_a_manifest_and_library_of_different_builds(tmp_path, cache):
    pytest.importorskip("torch")
    from latch_codegen_h100.runtime import Program, ProgramError

    out = tmp_path / "normal"
    build(H.small_doc(), out, jobs=2)
    m = json.loads((out / "manifest.json").read_text())
    m["flags"].append(builder.PROFILE_FLAG)
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ProgramError, match="different builds"):
        Program.load(out)
