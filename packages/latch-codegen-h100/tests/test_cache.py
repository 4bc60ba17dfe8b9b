"""The request key (checked before lowering) and the build directory's record of it.

A cached rebuild must skip lowering entirely, and a change of anything that determines the build
(graph, schedule, memory plan, flags, unit split, headers, lowering code, registered lowerings) must
never reuse a stale directory. Needs nvcc for the tests that compile; the key tests need none.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import attrs
import pytest

import h100_handmade as H
from latch_core.hookspecs import hookimpl
from latch_core.plugins import load_with
from latch_core.sections import Access, MemorySection, Task
from latch_codegen_h100 import BuildError, Lowering, build, generate
from latch_codegen_h100 import builder




needs_nvcc = pytest.mark.skipif(not H.have_nvcc(), reason="nvcc not installed")







def _no_lowering(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("generate() ran on a cached rebuild")

    monkeypatch.setattr(builder, "generate", refuse)


def _with_tasks(doc, fn):
    progs = tuple(attrs.evolve(ps, tasks=tuple(fn(t) for t in ps.tasks)) for ps in doc.schedule.programs)
    return attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=progs))


# ------------------------------------------------------------------------------------------------
# The document digest


def test_task_fields_left_out_of_the_key_are_exactly_the_ones_codegen_never_reads():
    """A new Task field is hashed (conservative); the ones left out must not change what is generated."""
    assert set(builder.TASK_FIELDS_UNREAD) <= {f.name for f in attrs.fields(Task)}
    doc = H.small_doc()
    other = _with_tasks(doc, lambda t: attrs.evolve(
        t, reads=(Access("x", ((0, 1),)),), writes=(), cost=t.cost + 1.0, phase=t.phase + 7))
    assert builder.document_digest(other) == builder.document_digest(doc)
    a, b = generate(doc, jobs=1), generate(other, jobs=1)
    assert [u.source for u in a.units] == [u.source for u in b.units]
    assert {p: t.files() for p, t in a.tables.items()} == {p: t.files() for p, t in b.tables.items()}
    assert json.dumps(a.manifest, sort_keys=True) == json.dumps(b.manifest, sort_keys=True)
    assert a.consts == b.consts


def test_the_document_digest_covers_graph_schedule_and_memory():
    doc = H.small_doc()
    base = builder.document_digest(doc)
    assert builder.document_digest(H.small_doc()) == base  # equal documents, other objects
    assert builder.document_digest(attrs.evolve(doc, build=None, provenance=())) == base
    changed = {
        "graph attribute": H.small_doc(scale=3.0),
        "tiles": H.small_doc(tiles=4),
        "SMs": H.small_doc(num_sms=3),
        "strategy": H.small_doc(strategy="dataflow"),
        "task tile": _with_tasks(doc, lambda t: attrs.evolve(t, tile=((0, 1),)) if t.id == 0 else t),
        "task group": _with_tasks(doc, lambda t: attrs.evolve(t, group=1 - t.group) if t.id == 0 else t),
    }
    pm = doc.memory.programs[0]
    moved = tuple(attrs.evolve(p, offset=p.offset + 256) if p.buffer == "arena" else p for p in pm.placements)
    assert moved != pm.placements
    changed["placement"] = attrs.evolve(doc, memory=attrs.evolve(
        doc.memory, programs=(attrs.evolve(pm, placements=moved),)))
    changed["memory stats"] = attrs.evolve(doc, memory=attrs.evolve(doc.memory, stats={"copy_back": ()}))
    digests = {k: builder.document_digest(d) for k, d in changed.items()}
    assert base not in digests.values(), [k for k, v in digests.items() if v == base]
    assert len(set(digests.values())) == len(digests)


# ------------------------------------------------------------------------------------------------
# The environment digest: flags, unit split, headers, lowering code, registered lowerings


def _acme_module(tmp_path, body_text: str):
    """A plugin module in its own file (a lone module: its file is what is hashed)."""
    f = tmp_path / "acme_lowering_mod.py"
    f.write_text(f"def body(ctx):\n    return {body_text!r}\n")
    spec = importlib.util.spec_from_file_location("acme_lowering_mod", f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["acme_lowering_mod"] = mod
    spec.loader.exec_module(mod)
    return f, mod


def _regs(mod, inc):
    class Acme:
        @hookimpl
        def latch_register_lowerings(register):
            register("acme::twice", Lowering("acme::twice", body=mod.body, headers=("acme.cuh",),
                                             include_dirs=(str(inc),)))

    return load_with(("acme", Acme), ("codegen", __import__("latch_codegen_h100.plugin").plugin),
                     entry_points=False)


@needs_nvcc
def test_the_environment_digest_covers_flags_split_headers_and_lowering_code(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "acme.cuh").write_text("// acme\n")
    (inc / "acme_detail.h").write_text("// included by acme.cuh only\n")
    f, mod = _acme_module(tmp_path, "/* v1 */")
    try:
        regs = _regs(mod, inc)

        def key(**kw):
            opts = dict(bodies_per_unit=None, profile=False, regs=regs) | kw
            return builder.environment_digest(**opts)

        base = key()
        assert key() == base
        seen = {"base": base, "profile": key(profile=True), "bodies_per_unit": key(bodies_per_unit=1)}
        (inc / "acme_detail.h").write_text("// changed transitive include\n")
        seen["header"] = key()
        f.write_text("def body(ctx):\n    return '/* v2 */'\n")  # the plugin's code changed on disk
        seen["lowering code"] = key()
        seen["no acme"] = builder.environment_digest(
            bodies_per_unit=None, profile=False,
            regs=load_with(("codegen", __import__("latch_codegen_h100.plugin").plugin), entry_points=False))
        monkeypatch.setattr(builder, "_VERSION_CACHE", {builder.find_nvcc(): "99.9"})
        seen["toolkit"] = key()
        assert len(set(seen.values())) == len(seen), seen
    finally:
        sys.modules.pop("acme_lowering_mod", None)


def test_codegen_sources_are_part_of_the_environment_digest():
    """The lowering code of the built-in ops (this package) and latch-core/latch-ops count."""
    regs = load_with(("codegen", __import__("latch_codegen_h100.plugin").plugin), entry_points=False)
    dirs = {builder._package_dir(m) for m in ("latch_codegen_h100.codegen", "latch_core", "latch_ops")}
    assert all(d is not None and (d / "__init__.py").exists() for d in dirs)
    low = regs.lowerings.get("latch::mul")
    assert builder._callable_module(low.expr).startswith("latch_codegen_h100")


# ------------------------------------------------------------------------------------------------
# Builds


@needs_nvcc
def test_a_cached_rebuild_skips_lowering_and_returns_the_same_build(tmp_path, cache, monkeypatch):
    out = tmp_path / "b"
    first = build(H.small_doc(), out, jobs=2)
    assert (out / builder.REQUEST_FILE).exists()
    saved = (out / "program.latch.json").read_bytes()
    _no_lowering(monkeypatch)
    again = build(H.small_doc(), out, jobs=2)
    st = dict(again.build.stats)
    assert st["cached"] == "dir" and st["request"] == "hit"
    assert (again.build.key, again.build.units, again.build.flags, again.build.toolkit) == \
        (first.build.key, first.build.units, first.build.flags, first.build.toolkit)
    assert st["bodies"] == dict(first.build.stats)["bodies"]
    assert (out / "program.latch.json").read_bytes() == saved  # not re-serialised


@needs_nvcc
def test_changed_schedule_memory_or_graph_never_reuse_the_directory(tmp_path, cache):
    out = tmp_path / "b"
    first = build(H.small_doc(), out, jobs=2)

    # schedule: other tiles, same bodies -> lowered again, same library, new tables
    doc = H.small_doc(tiles=4, num_sms=3)
    second = build(doc, out, jobs=2)
    assert "request" not in dict(second.build.stats)
    assert second.build.key == first.build.key and dict(second.build.stats)["cached"] == "dir"
    m = json.loads((out / "manifest.json").read_text())
    assert (out / "tables" / "update.tasks.bin").stat().st_size == 96 * m["programs"]["update"]["num_tasks"]
    assert m["programs"]["update"]["num_tasks"] == len(doc.schedule.programs[0].tasks)

    # memory: the arena placements move -> new operand table
    pm = doc.memory.programs[0]
    moved = tuple(attrs.evolve(p, offset=p.offset + 256) if p.buffer == "arena" else p for p in pm.placements)
    doc2 = attrs.evolve(doc, memory=MemorySection(256, doc.memory.arena_bytes + 256,
                                                  (attrs.evolve(pm, placements=moved, arena_bytes=pm.arena_bytes + 256),)))
    before = (out / "tables" / "update.operands.bin").read_bytes()
    third = build(doc2, out, jobs=2)
    assert "request" not in dict(third.build.stats)
    assert (out / "tables" / "update.operands.bin").read_bytes() != before

    # graph: another scalar -> another source, another library
    fourth = build(H.small_doc(scale=5.0), out, jobs=2)
    assert "request" not in dict(fourth.build.stats)
    assert fourth.build.key != first.build.key and dict(fourth.build.stats)["cached"] == "no"
    assert "5.0f" in "".join(p.read_text() for p in (out / "src").glob("unit_*.cu"))

    # and back: the first document again is not a hit of the record the last build wrote
    fifth = build(H.small_doc(), out, jobs=2)
    assert fifth.build.key == first.build.key and "request" not in dict(fifth.build.stats)


@needs_nvcc
def test_a_profiling_build_does_not_reuse_a_normal_directory(tmp_path, cache, monkeypatch):
    out = tmp_path / "b"
    first = build(H.small_doc(), out, jobs=2)
    calls = []
    real = builder.compile_generated

    def spy(gen, out_dir, **kw):
        calls.append(kw.get("profile"))
        raise BuildError("stop here: the request was a miss, as it must be")

    monkeypatch.setattr(builder, "compile_generated", spy)
    with pytest.raises(BuildError, match="stop here"):
        build(H.small_doc(), out, jobs=2, profile=True)
    assert calls == [True]
    assert not (out / builder.REQUEST_FILE).exists()  # a failed build leaves no valid record
    monkeypatch.setattr(builder, "compile_generated", real)
    again = build(H.small_doc(), out, jobs=2)  # the record is gone: lowered again, library reused
    assert again.build.key == first.build.key and "request" not in dict(again.build.stats)


@needs_nvcc
def test_a_touched_output_file_is_a_miss(tmp_path, cache):
    out = tmp_path / "b"
    build(H.small_doc(), out, jobs=2)
    good = (out / "tables" / "update.tasks.bin").read_bytes()
    (out / "tables" / "update.tasks.bin").write_bytes(b"\0" * len(good))
    again = build(H.small_doc(), out, jobs=2)
    assert "request" not in dict(again.build.stats)
    assert (out / "tables" / "update.tasks.bin").read_bytes() == good
    (out / "program.so").unlink()
    third = build(H.small_doc(), out, jobs=2)
    assert "request" not in dict(third.build.stats) and (out / "program.so").exists()
    assert dict(build(H.small_doc(), out, jobs=2).build.stats)["request"] == "hit"


@needs_nvcc
def test_use_cache_false_always_lowers(tmp_path, cache, monkeypatch):
    out = tmp_path / "b"
    build(H.small_doc(), out, jobs=2)
    _no_lowering(monkeypatch)
    with pytest.raises(AssertionError, match="generate"):
        build(H.small_doc(), out, jobs=2, use_cache=False)


def test_two_runs_of_the_same_pipeline_give_the_same_document_digest():
    """The passes record their own timings in section stats; those must not make a re-run of the
    same pipeline miss the request key (it did: TinyMoE-200M's cached rebuild re-lowered, 5.4 s)."""
    from pathlib import Path

    compile_example = pytest.importorskip("latch_check.pipeline").compile_example  # the whole pipeline
    from latch_codegen_h100.builder import document_digest

    ex = str(Path(__file__).resolve().parents[3] / "examples" / "mlp.py")
    a, b = (compile_example(ex, scheduler="dataflow", build=False).doc for _ in range(2))
    assert document_digest(a) == document_digest(b)
    slower = attrs.evolve(a, schedule=attrs.evolve(a.schedule, stats={**dict(a.schedule.stats), "seconds_tasks": 99.0}))
    assert document_digest(slower) == document_digest(a)
    other = attrs.evolve(a, schedule=attrs.evolve(a.schedule, stats={**dict(a.schedule.stats), "fuse": "changed"}))
    assert document_digest(other) != document_digest(a)
