"""bench-attention's document on the CPU: it schedules into (batch, head, block) tasks, validates,
runs on the arena simulator at odd lengths against the FP64 reference, and compiles for sm_90a.

The file's nvcc builds (6) start when the first test needs one (``builds``: two at a time in
threads, in the order the tests read them; the documents are planned in the test thread): nvcc's
front end runs on one core, and one build after another kept one of CI's 2 cores idle. Each is the
``build`` call its test made before, with ``use_cache=False`` (the tests check the builds, not the
cache; builds running ahead must not read LATCH_CACHE_DIR, which tests set per test). A test waits
for its own builds and asserts on them as before; a failed build raises its error in that test.
"""

from __future__ import annotations

import shutil

import pytest

from latch_check import bench_attention as BA
from latch_codegen_h100 import BuildsAhead, have_nvcc
from latch_ops import attention as A

torch = pytest.importorskip("torch")


HEAD_DIMS = [64, 128]


def _ring_docs():
    """bench-attention --forward mma,wgmma's document (both forwards of two cases, the backward
    pinned to mma.sync) and the plain document of the same cases, planned."""
    from latch_core.document import Document
    from latch_core.ir import GraphSection

    cases = [BA.Case("a", 1, 4, 2, 77, 64), BA.Case("b", 1, 2, 2, 300, 128, causal=False)]
    progs = [g for b in BA.FORWARD_BODIES for g in BA.attention_document(cases, fwd_body=b, bwd_body="mma").graph.programs]
    return (BA.plan_document(Document(graph=GraphSection(progs, (), {"example": "t"})), 132),
            BA.plan_document(BA.attention_document(cases), 132))


def _head_dim_doc(pairs, d):
    """(the cases of head dim ``d``, their document, unplanned) of bench-attention's build per head dim."""
    docs = {dd: (group, doc) for dd, group, doc in BA.head_dim_documents(BA.CASES, pairs)}
    assert sorted(docs) == HEAD_DIMS
    return docs[d]


def _both_backwards(d):
    return (("wgmma", "mma"), ("wgmma", "wgmma")) if d == 64 else (("wgmma", "wgmma"), ("wgmma", "wgmma2"))


def _documents(item) -> list:
    """(key, planned-document factory) of each build the selected test ``item`` of this file reads."""
    p = item.callspec.params if hasattr(item, "callspec") else {}
    name = item.originalname
    if name == "test_wgmma_forward_document_compiles_with_the_ring":
        return [(("ring", k), lambda k=k: _ring_docs()[k]) for k in (0, 1)]
    if name == "test_bench_builds_per_head_dim_keep_the_wgmma_pipelined":
        return [(("per_head_dim", p["d"]), lambda: BA.plan_document(_head_dim_doc(("mma", "wgmma"), p["d"])[1], 132))]
    if name == "test_bench_builds_with_both_backwards_keep_the_wgmma_pipelined":
        return [(("both_backwards", p["d"]),
                 lambda: BA.plan_document(_head_dim_doc(_both_backwards(p["d"]), p["d"])[1], 132))]
    return []


@pytest.fixture(scope="module")
def builds(request, tmp_path_factory):
    """``builds.get(key, make_doc)`` -> (built document, build directory); the selected tests'
    builds start at the module's first test, two at a time (latch_codegen_h100.testing)."""
    b = BuildsAhead(tmp_path_factory.mktemp("bench-attention"), use_cache=False)
    if have_nvcc():
        ring = None
        for item in request.session.items:
            if item.module is request.module:
                for key, make in _documents(item):
                    if key in b:
                        continue
                    if key[0] == "ring":  # one planning of both ring documents
                        ring = ring or _ring_docs()
                        b.submit(key, ring[key[1]])
                    else:
                        b.submit(key, make())
    yield b
    b.close()


def _tasks(doc, program, op):
    sched = next(p for p in doc.schedule.programs if p.program == program)
    g = doc.graph.program(program)
    op_of = {n.name: n.op for n in g.nodes}
    groups = {grp.id for grp in sched.groups if op_of[grp.nodes[0]] == op}
    return [t for t in sched.tasks if t.group in groups]


def test_issue_cases_split_every_head_into_blocks():
    doc = BA.plan_document(BA.attention_document(BA.CASES), 132)
    for c in BA.CASES:
        g = c.heads // c.kv_heads
        blocks_f = -(-c.seq // A.QUERY_TILE)
        blocks_b = -(-c.seq // A.BLOCK)
        fwd = _tasks(doc, f"{c.name}.fwd", "latch::sdpa")
        bwd = _tasks(doc, f"{c.name}.fwdbwd", "latch::sdpa_backward")
        assert len(fwd) == c.batch * c.heads * blocks_f
        assert len(bwd) == c.batch * c.kv_heads * blocks_b
        for t in bwd:
            (b0, b1), (h0, h1), (r0, r1), _ = t.tile
            assert b1 - b0 == 1 and h1 - h0 == g and r1 - r0 <= A.BLOCK < c.seq
        # causal: the tasks of one head cost about the same (dq of block n + dk/dv of block n)
        costs = [t.cost for t in bwd[: blocks_b]]
        assert max(costs) < 1.5 * min(costs)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads, kv_heads, seq, dim, glse", [(2, 2, 77, 16, False), (4, 2, 130, 8, True),
                                                             (3, 1, 65, 4, False)])
def test_simulator_matches_the_reference_at_odd_lengths(causal, heads, kv_heads, seq, dim, glse):
    from latch_check.simulator import simulate

    c = BA.Case("t", 2, heads, kv_heads, seq, dim, causal)
    doc = BA.plan_document(BA.attention_document([c], dtype="f64", glse=glse), 8)
    ins = BA.make_inputs(c, "cpu", seed=1, dtype=torch.float64)
    ref = BA.reference(c, ins, glse=glse)
    fb = f"{c.name}.fwdbwd"
    got = simulate(doc, fb, {k: v for k, v in ins.items() if glse or not k.endswith(".glse")}, seed=3)
    for key in ("out", "dq", "dk", "dv"):
        assert BA.rel_l2(got[f"{fb}.{key}"], ref[key]) < 1e-12, key
    got = simulate(doc, f"{c.name}.fwd", {k: v for k, v in ins.items() if k[-2:] in (".q", ".k", ".v")}, seed=4)
    assert BA.rel_l2(got[f"{c.name}.fwd.out"], ref["out"]) < 1e-12


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_wgmma_forward_document_compiles_with_the_ring(builds):
    """bench-attention --forward mma,wgmma: both forwards of a case in one build; the wgmma one streams
    Q, K and V through the worker's ring (three tensor maps; a stage is one 64-key block of K and V),
    the backward pinned to
    mma.sync. The plain document (no body named) takes the wgmma backward (six tensor maps) and the
    wgmma forward at head dim 64 only: BF16 storage's defaults."""
    doc, out = builds.get(("ring", 0), lambda: _ring_docs()[0])  # the built document: the planned one + its build
    wg = doc.graph.program("a-wgmma.fwdbwd")
    assert [dict(n.attrs).get("attention_body") for n in wg.nodes] == ["wgmma", "mma"]
    mma = doc.graph.program("a.fwdbwd")
    assert [dict(n.attrs).get("attention_body") for n in mma.nodes] == ["mma", "mma"]
    fwd = _tasks(doc, "b-wgmma.fwd", "latch::sdpa")
    assert len(fwd) == 1 * 2 * -(-300 // A.QUERY_TILE)
    import json

    man = json.loads((out / "manifest.json").read_text())
    assert man["ring"]["stage_bytes"] == 32768 and man["ring"]["stages"] >= 3, man["ring"]
    streamed = [b for b in man["bodies"] if b["tensor_maps"]]
    # a stage holds one key block of K and V: 64 keys x head dim x 2 B x 2 (16 KiB at 64, 32 KiB at 128)
    assert len(streamed) == 2 and all(b["tensor_maps"] == 3 for b in streamed), streamed
    assert sorted(b["stage_bytes"] for b in streamed) == [16384, 32768], streamed
    plain, plain_out = builds.get(("ring", 1), lambda: _ring_docs()[1])
    # a real compile of the plain document: its own sources (another key), not the first library again
    assert dict(plain.build.stats)["cached"] == "no" and plain.build.key != doc.build.key
    man = json.loads((plain_out / "manifest.json").read_text())
    # defaults: the backwards stream on the ring (6 maps); beside them the head-dim-64 forward takes
    # wgmma (FwdOwnPv pipelines beside the backward) and the head-dim-128 one mma.sync
    # (lower_attention.kernel_defaults: ptxas C7511 in a model's kernel)
    fwd3 = [b for b in man["bodies"] if b["tensor_maps"] == 3]
    assert len(fwd3) == 1 and "77,64]" in fwd3[0]["describe"], man["bodies"]
    assert sum(1 for b in man["bodies"] if b["tensor_maps"] == 6) == 2, man["bodies"]


def test_bench_refuses_an_unknown_forward_body():
    from click.testing import CliRunner

    r = CliRunner().invoke(BA.bench_attention_command, ["--forward", "mma,fast"])
    assert r.exit_code != 0 and "'mma,fast'" in r.output and "must be one of" in r.output, r.output


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bench_builds_per_head_dim_keep_the_wgmma_pipelined(builds, d):
    """What bench-attention --forward mma,wgmma measures: one build per head dim of the issue's cases,
    in which ptxas keeps the wgmma forward's products pipelined (no C7511/C7518 serialisation)."""
    group, doc = _head_dim_doc(("mma", "wgmma"), d)
    assert {c.head_dim for c in group} == {d} and len(group) == 2
    built, _ = builds.get(("per_head_dim", d), lambda: BA.plan_document(doc, 132))
    assert "wgmma_warnings" not in dict(built.build.stats), dict(built.build.stats)


def test_bench_refuses_an_unknown_backward_body():
    from click.testing import CliRunner

    r = CliRunner().invoke(BA.bench_attention_command, ["--backward", "wgmma,fast"])
    assert r.exit_code != 0 and "'wgmma,fast'" in r.output and "must be one of" in r.output, r.output


def test_backward_variants_name_their_cases_and_set_the_backward_body():
    c = BA.CASES[0]
    assert BA.variant(c, "wgmma", "wgmma").name == f"{c.name}-wgmma-bwgmma"
    assert BA.variant(c, "mma", "mma") is c
    doc = BA.attention_document([c], fwd_body="wgmma", bwd_body="wgmma")
    g = doc.graph.program(f"{c.name}-wgmma-bwgmma.fwdbwd")
    assert [dict(n.attrs).get("attention_body") for n in g.nodes] == ["wgmma", "wgmma"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bench_builds_with_both_backwards_keep_the_wgmma_pipelined(builds, d):
    """What bench-attention --backward mma,wgmma (head dim 64) and --backward wgmma,wgmma2 (128)
    measure: per head dim, the wgmma forward with both backwards in one build; ptxas keeps every wgmma pipelined and
    the wgmma backward of each case streams through the ring (its 6 tensor maps: grad_lse absent)."""
    import json

    pairs = _both_backwards(d)
    group, doc = _head_dim_doc(pairs, d)
    built, out = builds.get(("both_backwards", d), lambda: BA.plan_document(doc, 132))
    stats = dict(built.build.stats)
    assert "wgmma_warnings" not in stats, stats
    man = json.loads((out / "manifest.json").read_text())
    wgmma_bwds = sum(1 for _, b in pairs if b != "mma")  # 128: wgmma and wgmma2 (the overlapped variant)
    assert len(group) == 2, group
    assert sum(1 for b in man["bodies"] if b["tensor_maps"] == 6) == wgmma_bwds * len(group), man["bodies"]


def test_table_shows_the_back_to_back_timings_and_marks_a_wrong_row():
    row = {"case": "b2h12s1024d64-wgmma-bwgmma", "rel_l2": {"out": 2e-3}, "torch_rel_l2": {"out": 2e-3},
           "bitwise_repeat": True, "latch_fwd_ms": 0.074, "torch_fwd_ms": 0.038, "fwd_ratio": 0.038 / 0.074,
           "latch_fwdbwd_ms": 0.12, "torch_fwdbwd_ms": 0.12, "fwdbwd_ratio": 1.0, "latch_fwdbwd_tflops": 94.2,
           "ok": False, "latch_fwd_b2b_ms": 0.040, "torch_fwd_b2b_ms": 0.036, "fwd_b2b_ratio": 0.9,
           "latch_fwdbwd_b2b_ms": 0.10, "torch_fwdbwd_b2b_ms": 0.11, "fwdbwd_b2b_ratio": 1.1}
    text = BA.format_table([row])
    assert "WRONG" in text
    b2b = [ln for ln in text.splitlines() if ln.strip().startswith("b2h12s1024d64")][-1]
    assert "fwd   0.040 ms (torch 0.036)   90.0%" in b2b and "110.0%" in b2b, text


def test_table_splits_the_alone_gap_into_host_time():
    row = {"case": "b2h12s1024d64-wgmma-bwgmma", "rel_l2": {"out": 2e-3}, "torch_rel_l2": {"out": 2e-3},
           "bitwise_repeat": True, "latch_fwd_ms": 0.054, "torch_fwd_ms": 0.037, "fwd_ratio": 0.037 / 0.054,
           "latch_fwdbwd_ms": 0.11, "torch_fwdbwd_ms": 0.12, "fwdbwd_ratio": 1.1, "latch_fwdbwd_tflops": 94.2,
           "ok": True, "latch_fwd_b2b_ms": 0.026, "torch_fwd_b2b_ms": 0.033, "fwd_b2b_ratio": 0.033 / 0.026,
           "latch_fwdbwd_b2b_ms": 0.09, "torch_fwdbwd_b2b_ms": 0.12, "fwdbwd_b2b_ratio": 1.3,
           "latch_fwd_host_us": 9.5, "torch_fwd_host_us": 3.25,
           "latch_fwd_graph_ms": 0.030, "latch_fwdbwd_graph_ms": 0.10, "fwd_graph_ratio": 0.037 / 0.030,
           "fwdbwd_graph_ratio": 1.2}
    text = BA.format_table([row])
    g = [ln for ln in text.splitlines() if ln.strip().startswith("b2h12s1024d64")][-2]
    assert "fwd   0.030 ms (torch 0.037)  123.3%" in g and "120.0%" in g, text
    line = [ln for ln in text.splitlines() if "latch launch" in ln][-1]
    assert "latch launch    9.5 us (gap  28.0 us)" in line and "torch graph replay    3.2 us (gap   4.0 us)" in line, text
    assert "latch launch" not in BA.format_table([{k: v for k, v in row.items() if "host" not in k}])
