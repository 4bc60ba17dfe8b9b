"""bench-memory's document through nvcc (sm_90a): every program builds, and the machine code holds
the fused bodies' 128-bit accesses. (Cross-package: it reads latch-codegen-h100's machine code.)"""

from __future__ import annotations

import re

import pytest

from cross_helpers import needs_nvcc
from latch_check import bench_memory as bm

SMALL = [("embed.weight", (64, 32)), ("n.weight", (32,)), ("w1", (4, 32, 16)), ("router", (3, 32))]


@needs_nvcc
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


@needs_nvcc
def test_reduction_prologues_with_scalars_broadcasts_and_views_compile(tmp_path, monkeypatch):
    """The three forms of a reduction's prologue (flat with a scalar operand; a broadcast operand;
    a permute view: all three the four-wide row path, the last two through fuse.py's ILP operand
    classes, with the coordinate-decoding element path beside them) build for sm_90a."""
    from latch_codegen_h100 import build, generate
    from latch_core.document import Document
    from latch_core.ir import BATCH, Graph, GraphSection, Group, Node, Value

    vals = [Value("x", (64, 32), "f32", BATCH), Value("s", (), "f32", BATCH), Value("w", (32,), "f32", BATCH)]
    nodes = []

    def n(name, op, ins, shape, attrs=None):
        vals.append(Value(name, shape, "f32"))
        nodes.append(Node(f"{name}.n", f"latch::{op}", ins, (name,), attrs or {}))
        return name

    a = n("a", "sum", (n("xs", "mul", ("x", "s"), (64, 32)),), (64,), {"dims": (1,), "keepdim": False})
    b = n("b", "sum", (n("xw", "mul", ("x", "w"), (64, 32)),), (64,), {"dims": (1,), "keepdim": False})
    t = n("t", "permute", ("x",), (32, 64), {"perm": (1, 0)})
    c = n("c", "amax", (n("tr", "relu", (t,), (32, 64)),), (32,), {"dims": (1,), "keepdim": False})
    g = Graph("p", vals, nodes, (Group("batch", ("x", "s", "w")),), (Group("metrics", (a, b, c)),))
    doc = bm.plan_document(Document(graph=GraphSection([g], (), {})), num_sms=4)
    groups = {tuple(grp.nodes) for grp in doc.schedule.programs[0].groups}
    assert ("xs.n", "a.n") in groups and ("xw.n", "b.n") in groups and ("t.n", "tr.n", "c.n") in groups
    src = "\n".join(u.source for u in generate(doc).units)
    # the row path (rows held in registers: lower_reduce.rows_statements) and a decoded coordinate
    assert "load4v(b_ + r_, v_[u_][k_])" in src and "% 32LL" in src
    monkeypatch.setenv("LATCH_CACHE_DIR", str(tmp_path / "cache"))
    build(doc, tmp_path / "b")


@needs_nvcc
def test_the_optimizer_pass_has_no_ieee_slow_paths_and_weak_16_byte_accesses(tmp_path, monkeypatch):
    """clip + AdamW alone for sm_90a: the per-element square root and divisions are the branch-free
    MUFU forms (no FCHK, the IEEE division's range check that guards an out-of-line slow path; run
    16 measured this pass at 23% of its floor with them), the 16-byte accesses are the plain weak
    LDG/STG.E.128 (no .STRONG.SM), and nothing spills."""
    from latch_codegen_h100 import build
    from latch_codegen_h100.sass import _run, find_cuobjdump

    monkeypatch.setenv("LATCH_CACHE_DIR", str(tmp_path / "cache"))
    doc = bm.plan_document(bm.memory_document(only="clip_adamw", shapes=SMALL + [("big", (96, 768))], T=48), num_sms=8)
    doc = build(doc, tmp_path / "b")
    sass = _run([find_cuobjdump(), "-sass", str(tmp_path / "b" / "program.so")])
    assert "FCHK" not in sass
    assert "MUFU.SQRT" in sass and "MUFU.RCP" in sass
    assert re.search(r"\bLDG\.E\.128 ", sass) and re.search(r"\bSTG\.E\.128 ", sass)
    assert not re.search(r"\b(LDG|STG)\.E\.128\.STRONG", sass)
    assert dict(doc.build.stats).get("spill_stores", 0) == 0


@needs_nvcc
def test_the_rmsnorm_bodies_are_row_groups_and_compile_without_spills(tmp_path, monkeypatch):
    """bench-memory's RMSNorm forward is ONE row group (the mean, rsqrt and the scaled row in one
    pass: x read once) and its backward one row group for dx (both statistics, r and dx) beside
    the column reduction for dw; at the model's row length (768) the row body builds for sm_90a
    with 16-byte accesses and nothing spilled."""
    from latch_codegen_h100 import build, generate
    from latch_codegen_h100.sass import _run, find_cuobjdump

    doc = bm.plan_document(bm.memory_document(only="rmsnorm", T=64), num_sms=8)
    assert bm.row_groups(doc, "rmsnorm.fwd.x1") == 1 and bm.row_groups(doc, "rmsnorm.bwd.x1") == 1
    groups = {p.program: p.groups for p in doc.schedule.programs}
    assert len(groups["rmsnorm.fwd.x1"]) == 1 and len(groups["rmsnorm.bwd.x1"]) == 2
    assert bm.row_groups(doc, "rmsnorm.fwd.x4") == 4
    src = "\n".join(u.source for u in generate(doc).units)
    assert "row group: rows of 768 elements, 2 row(s) per warp at once" in src
    monkeypatch.setenv("LATCH_CACHE_DIR", str(tmp_path / "cache"))
    doc = build(doc, tmp_path / "b")
    sass = _run([find_cuobjdump(), "-sass", str(tmp_path / "b" / "program.so")])
    assert re.search(r"\bLDG\.E\.128 ", sass) and re.search(r"\bSTG\.E\.128 ", sass)
    assert dict(doc.build.stats).get("spill_stores", 0) == 0


def test_scheduler_and_code_generator_share_the_row_group_classifier():
    """The scheduler decides row groups and the code generator writes their bodies from the same
    value classes (latch_core.rowclass): one function, not two copies that could drift apart."""
    import latch_codegen_h100.lower_rowgroup as lr
    import latch_schedule.rowgroups as rg
    from latch_core.rowclass import value_class
    assert rg.value_class is value_class and lr.value_class is value_class


def _instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) of every instruction of cuobjdump's -sass text, in order (the
    megakernel is one function: addresses do not restart)."""
    out = []
    for ln in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", ln)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def _loops(ins: list[tuple[int, str]]) -> list[list[str]]:
    """The instructions from each backward branch's target to the branch: a loop's body as ptxas
    laid it out (its first instruction is where an iteration starts)."""
    at = {a: k for k, (a, _) in enumerate(ins)}
    loops = []
    for k, (a, x) in enumerate(ins):
        m = re.search(r"\bBRA\s+0x([0-9a-f]+)", x)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            loops.append([y for _, y in ins[at[int(m.group(1), 16)]:k + 1]])
    return loops


@needs_nvcc
def test_the_adamw_loop_prefetches_into_l2_two_batches_ahead(tmp_path, monkeypatch):
    """flat.py's vector loop prefetches (prefetch.global.L2: CCTL.E.PF2) each of AdamW's four FP32
    inputs' U = 3 groups PREFETCH_AHEAD iterations ahead: in each copy of the AdamW loop (found by
    its backward branch, its 9 STG.E.128 and its square root) 12 prefetches, all before the first
    of the register loads (ptxas places those at a third of the way in: results/aw.md), the 12
    LDG.E.128 and 9 STG.E.128 kept, no local memory in the loop and no spills in the kernel."""
    from latch_codegen_h100 import build, flat
    from latch_codegen_h100.sass import _run, find_cuobjdump

    assert flat.PREFETCH_AHEAD > 0
    monkeypatch.setenv("LATCH_CACHE_DIR", str(tmp_path / "cache"))
    doc = bm.plan_document(bm.memory_document(only="clip_adamw", shapes=SMALL + [("big", (96, 768))], T=48), num_sms=8)
    doc = build(doc, tmp_path / "b")
    stats = dict(doc.build.stats)
    assert stats.get("spill_stores", 0) == 0 and stats.get("spill_loads", 0) == 0, stats
    sass = _run([find_cuobjdump(), "-sass", str(tmp_path / "b" / "program.so")])
    adamw = [lp for lp in _loops(_instructions(sass))
             if sum("STG.E.128 " in x for x in lp) == 9 and any("MUFU.SQRT" in x for x in lp)]
    assert adamw, "no AdamW vector loop in the machine code"
    for lp in adamw:
        ldg = [k for k, x in enumerate(lp) if re.search(r"\bLDG\.E\.128 ", x)]
        pf = [k for k, x in enumerate(lp) if re.search(r"\bCCTL\.E\.PF2 ", x)]
        assert len(ldg) == 12, len(ldg)  # 4 inputs x 3 groups, still 16 bytes each
        assert len(pf) == 12, len(pf)  # the same groups' lines, two iterations ahead
        assert max(pf) < min(ldg), (pf, ldg)
        assert not any(re.search(r"\b(LDL|STL)\b", x) for x in lp)
