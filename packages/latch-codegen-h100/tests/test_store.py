"""Faults during and after builds (store.py): what the build trusts, and builds running at once.

- a truncated or corrupted program.so, in the build directory or in the cache, is rebuilt and never
  loaded (Program.load refuses it before dlopen);
- builds of one document into one directory, and into several directories sharing one cache, run
  in parallel processes without an error, and leave a library that verifies;
- a build killed in the middle leaves nothing a later build trusts;
- the build refuses a document the validator rejects; ``validate=False`` builds it and says so.
Needs nvcc (skipped without it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import pytest

import h100_handmade as H
from latch_codegen_h100 import BuildError, build
from latch_codegen_h100 import builder, store

HERE = Path(__file__).resolve().parent
WANTED = ("ops", "moe", "schedule", "memory", "codegen-h100")  # no torch-importing capture in the children


def _plugins() -> str:
    from importlib import metadata

    from latch_core import plugins

    installed = {e.name for e in metadata.entry_points(group=plugins.GROUP)}
    return ",".join(n for n in WANTED if n in installed)




needs_nvcc = pytest.mark.skipif(not H.have_nvcc(), reason="nvcc not installed")






def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _cached(doc) -> str:
    return dict(doc.build.stats)["cached"]


# ------------------------------------------------------------------------------------------------
# Verified before use


@needs_nvcc
def test_a_truncated_library_in_the_directory_is_rebuilt_never_trusted(tmp_path, cache):
    out = tmp_path / "b"
    build(H.small_doc(), out, jobs=2)
    good = store.digest(out / "program.so")
    _truncate(out / "program.so")
    with pytest.raises(store.CorruptLibrary, match="not the library its build recorded"):
        store.verify_directory(out)
    again = build(H.small_doc(), out, jobs=2)
    assert "request" not in dict(again.build.stats)  # the fast path did not trust it
    assert _cached(again) == "cache" and store.digest(out / "program.so") == good
    store.verify_directory(out)
    # the same with the library's size kept (bytes flipped in place)
    data = bytearray((out / "program.so").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / "program.so").write_bytes(bytes(data))
    third = build(H.small_doc(), out, jobs=2)
    assert _cached(third) == "cache" and store.digest(out / "program.so") == good


@needs_nvcc
def test_a_truncated_cache_entry_is_replaced_not_used(tmp_path, cache):
    first = build(H.small_doc(), tmp_path / "a", jobs=2)
    lib, meta = store.cache_entry(cache, first.build.key)
    good = json.loads(meta.read_text())["sha256"]
    _truncate(lib)
    second = build(H.small_doc(), tmp_path / "b", jobs=2)
    assert _cached(second) == "no"  # compiled again: the cache entry did not verify
    store.verify_directory(tmp_path / "b")
    # a good entry again (nvcc's output embeds source paths, so it differs from the first one's)
    assert store.digest(lib) == json.loads(meta.read_text())["sha256"] != good
    third = build(H.small_doc(), tmp_path / "c", jobs=2)
    assert _cached(third) == "cache"


def test_the_runtime_refuses_a_corrupt_library_before_loading_it(tmp_path):
    torch = pytest.importorskip("torch")
    from latch_codegen_h100.runtime import Program, ProgramError

    out = tmp_path / "b"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"library": "program.so"}))
    (out / "program.so").write_bytes(b"\x7fELF" + b"\0" * 60)  # what a truncated link leaves
    with pytest.raises(ProgramError, match="no build.key record"):
        Program.load(out)
    store.write_trust(out, "k", out / "program.so")
    _truncate(out / "program.so")
    with pytest.raises(ProgramError, match="refusing to load it"):
        Program.load(out)
    assert torch is not None


# ------------------------------------------------------------------------------------------------
# Builds at once, in separate processes

_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import h100_handmade as H
    from latch_codegen_h100 import build
    doc = build(H.small_doc(), sys.argv[1], jobs=1)
    print("OK", dict(doc.build.stats)["cached"])
""")


def _spawn(out: Path, cache: Path, tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "one_build.py"
    if not script.exists():  # written once: a process starting while it is rewritten would read a part
        script.write_text(_SCRIPT.format(here=str(HERE)))
    env = dict(os.environ, LATCH_CACHE_DIR=str(cache), LATCH_PLUGINS=_plugins())
    # its own session: the test can end it and its ninja/nvcc children by its process group id
    return subprocess.Popen([sys.executable, str(script), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@needs_nvcc
def test_parallel_builds_into_one_directory_and_one_cache_are_safe(tmp_path, cache):
    one = tmp_path / "one"
    procs = [_spawn(one, cache, tmp_path) for _ in range(4)]  # one directory
    procs += [_spawn(tmp_path / f"d{k}", cache, tmp_path) for k in range(4)]  # one cache
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out.startswith("OK"), err[-2000:]
    kinds = sorted(out.split()[1] for out, _ in results)
    assert kinds.count("no") == 1, kinds  # one compile; everyone else reused its result
    for d in [one] + [tmp_path / f"d{k}" for k in range(4)]:
        store.verify_directory(d)
    assert not list(one.rglob("*.tmp"))


@needs_nvcc
def test_a_killed_build_leaves_nothing_a_later_build_trusts(tmp_path, cache):
    out = tmp_path / "b"
    p = _spawn(out, cache, tmp_path)
    deadline = time.time() + 300
    while time.time() < deadline and not (out / "build.ninja").exists():  # ninja is about to run nvcc
        time.sleep(0.05)
    time.sleep(1.0)
    assert p.poll() is None, "the build finished before it could be interrupted"
    os.killpg(p.pid, signal.SIGKILL)  # the build and its ninja/nvcc children (the group it leads)
    p.wait()
    time.sleep(0.5)
    assert store.read_trust(out) is None and not (out / builder.REQUEST_FILE).exists()
    with pytest.raises(store.CorruptLibrary):
        store.verify_directory(out)
    again = build(H.small_doc(), out, jobs=2)
    assert _cached(again) in ("no", "cache")
    store.verify_directory(out)


@needs_nvcc
def test_a_damaged_library_newer_than_its_objects_is_relinked(tmp_path, cache):
    """Without its record, a program.so is never taken as it is (ninja would call a damaged one
    newer than its objects up to date): the build relinks it, from the same objects."""
    out = tmp_path / "b"
    build(H.small_doc(), out, jobs=2, use_cache=False)
    good = store.digest(out / "program.so")
    store.drop_trust(out)
    _truncate(out / "program.so")
    again = build(H.small_doc(), out, jobs=2, use_cache=False)
    assert _cached(again) == "no"
    store.verify_directory(out)
    assert store.digest(out / "program.so") == good  # relinked, byte for byte the library it was


# ------------------------------------------------------------------------------------------------
# Validation is part of the build


def _racy(doc):
    """Two tiles of one group writing the same rows: a write race the validator must refuse."""
    ps = doc.schedule.programs[0]
    tasks = list(ps.tasks)
    tasks[1] = attrs.evolve(tasks[1], tile=tasks[0].tile, reads=tasks[0].reads, writes=tasks[0].writes)
    return attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, tasks=tasks)]))


def test_the_build_refuses_a_document_the_validator_rejects(tmp_path, cache):
    with pytest.raises(BuildError, match="refusing to build a document the static validator rejects"):
        build(_racy(H.small_doc()), tmp_path / "b", jobs=2)
    assert not (tmp_path / "b" / "program.so").exists()


@needs_nvcc
def test_validate_false_builds_it_and_says_so(tmp_path, cache, capfd):
    doc = build(_racy(H.small_doc()), tmp_path / "b", jobs=2, validate=False)
    assert dict(doc.build.stats)["validated"] is False
    assert "static validation SKIPPED" in capfd.readouterr().err


def test_the_build_command_refuses_and_no_validate_says_it_skipped(tmp_path, cache):
    from click.testing import CliRunner

    from latch_core.cli import main
    from latch_core.document import save

    path = tmp_path / "racy.latch.json"
    save(_racy(H.small_doc()), path)
    r = CliRunner().invoke(main, ["build", "-i", str(path), "-d", str(tmp_path / "b")])
    assert r.exit_code == 1 and "refusing to build" in r.output and "write race" in r.output
    if H.have_nvcc():
        r = CliRunner().invoke(main, ["build", "-i", str(path), "-d", str(tmp_path / "b"), "--no-validate"])
        assert r.exit_code == 0 and "SKIPPED" in r.output, r.output


def test_the_build_command_checks_the_cuda_alone_and_still_refuses_a_racy_document(tmp_path, cache):
    """`build --check-cuda`: the generated CUDA through nvcc's front end (-ptx), no program.so; the
    hazard proof still runs first."""
    from click.testing import CliRunner

    from latch_core.cli import main
    from latch_core.document import save

    good, racy = tmp_path / "good.latch.json", tmp_path / "racy.latch.json"
    save(H.small_doc(), good)
    save(_racy(H.small_doc()), racy)
    r = CliRunner().invoke(main, ["build", "-i", str(racy), "-d", str(tmp_path / "r"), "--check-cuda"])
    assert r.exit_code == 1 and "refusing to build" in r.output and "write race" in r.output
    if H.have_nvcc():
        r = CliRunner().invoke(main, ["build", "-i", str(good), "-d", str(tmp_path / "g"), "--check-cuda"])
        assert r.exit_code == 0 and "the generated CUDA compiles" in r.output, r.output
        assert (tmp_path / "g" / "obj" / "kernel.ptx").stat().st_size > 0
        assert not (tmp_path / "g" / "program.so").exists()
