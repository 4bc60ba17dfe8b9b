"""The gathers' row path (issue 12/11, lower_indexing.py): index_select and embedding copy whole rows
(one index per row, 16-byte LDG/STG) where the run after the indexed dim is long enough, the scalar
loop elsewhere. Read from the generated source and the SASS; the numbers are test_gpu_gather.py's."""

from __future__ import annotations

import re

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build, generate
from latch_codegen_h100.builder import check_compiles
from latch_codegen_h100.lower_indexing import LOADS_IN_FLIGHT, _row_plan, row_path_taken
from latch_codegen_h100.lowering import Operand
from latch_codegen_h100.sass import sass_report

needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")
B, F, I = "bf16", "f32", "i64"


def gather_graph(rows=64, width=768, n=96):
    """TinyMoE-200M's routed-row gathers (bf16 and f32 rows of 768, the reshape+index_select of the
    combine as an alias prefix), its embedding, and two gathers the row path cannot take (index_select
    along the last dim; an embedding four wide)."""
    v = [Value("xb", (rows, width), B, "batch"), Value("xf", (rows, width), F, "batch"),
         Value("idx", (n,), I, "batch"), Value("x2", (rows // 2, 2, width), F, "batch"),
         Value("w", (50, width), F, "param"), Value("tok", (2, 24), I, "batch"),
         Value("w4", (11, 4), F, "param"), Value("tok4", (5,), I, "batch"),
         Value("x3", (8, 6, 40), F, "batch"), Value("i3", (5,), I, "batch"), Value("i0", (5,), I, "batch"),
         Value("yb", (n, width), B), Value("yf", (n, width), F), Value("x2r", (rows, width), F),
         Value("y2", (n, width), F), Value("e", (2, 24, width), F), Value("e4", (5, 4), F),
         Value("y3", (8, 5, 40), F), Value("y30", (5, 6, 40), F), Value("ylast", (8, 6, 5), F)]
    nodes = [("gb", "latch::index_select", ("xb", "idx"), ("yb",), {"dim": 0}),
             ("gf", "latch::index_select", ("xf", "idx"), ("yf",), {"dim": 0}),
             ("flat", "latch::reshape", ("x2",), ("x2r",), {"shape": (rows, width)}),
             ("g2", "latch::index_select", ("x2r", "idx"), ("y2",), {"dim": 0}),
             ("emb", "latch::embedding", ("w", "tok"), ("e",)),
             ("emb4", "latch::embedding", ("w4", "tok4"), ("e4",)),
             ("g3", "latch::index_select", ("x3", "i3"), ("y3",), {"dim": 1}),
             ("g30", "latch::index_select", ("x3", "i0"), ("y30",), {"dim": 0}),
             ("glast", "latch::index_select", ("x3", "i3"), ("ylast",), {"dim": 2})]
    return H.graph("update", v, nodes,
                   [("params", ["w", "w4"]), ("batch", ["xb", "xf", "idx", "x2", "tok", "tok4", "x3", "i3", "i0"])],
                   [("metrics", ["yb", "yf", "y2", "e", "e4", "y3", "y30", "ylast"])])


GROUPS = [["gb"], ["gf"], ["flat", "g2"], ["emb"], ["emb4"], ["g3"], ["g30"], ["glast"]]


def gather_doc(tiles=3, split="rows", **kw):
    g = gather_graph(**kw)
    return H.planned([g], [g.value("w"), g.value("w4")], tiles=tiles, split=split, groups={"update": GROUPS})


def body_sources(gen) -> dict[str, str]:
    """group's first node -> the text of its body's device function."""
    texts: dict[str, str] = {}
    for u in gen.units:
        lines = u.source.splitlines()
        for first, last, key in u.lines:
            texts[key] = "\n".join(lines[first - 1:last])
    groups = gen.manifest["programs"]["update"]["groups"]
    return {info["nodes"][-1]: texts[info["body"]] for info in groups.values()}


def test_the_row_path_is_chosen_for_the_tinymoe_gathers_and_the_scalar_loop_elsewhere():
    gen = generate(gather_doc(), jobs=1)
    src = body_sources(gen)
    for name in ("gb", "gf", "g2", "emb", "g3", "g30"):
        assert "// row path" in src[name], name
        assert "__ldcg((reinterpret_cast<const uint4*>" in src[name] and "__stcg(" in src[name], name
        # the index is loaded once per row, not per element: one load of in1 in the row path
        row = src[name].split("// row path", 1)[1].split("} else {", 1)[0]
        assert len(re.findall(r"latch::ld<long long>\(in1", row)) == 1, name
        assert "latch_report(latch::ERR_INDEX_RANGE" in row, name
    for name in ("emb4", "glast"):
        assert "// row path" not in src[name] and "__ldcg" not in src[name], name
        assert "for (long long i = threadIdx.x; i < n_tile; i += LATCH_THREADS)" in src[name], name
    # index_select keeps the scalar loop for tiles that split a dim after dim + 1 (g30: dim 2); dim + 1
    # itself may be split (the run starts at lo[dim + 1])
    assert "if (c.t->lo[2] == 0 && c.t->hi[2] == 40) {" in src["g30"]
    assert "for (long long i = threadIdx.x; i < n_tile" in src["g30"].split("} else {", 1)[1]
    assert "if (true) {" in src["g3"]
    # the rows of 768: bf16 96 vectors of 16 bytes (3 per lane), three rows per warp step; f32 6 per lane,
    # four rows of 2 per pass, three passes (ROW_LOADS = 8 loads per lane at most; test_gather_ilp.py)
    assert "a warp per row, 2 row(s) x 3 16-byte vector(s)" in src["gb"]
    assert "a warp per row, 4 row(s) x 2 16-byte vector(s)" in src["gf"]


def test_reshape_index_select_is_the_index_select_body_at_the_views_storage():
    """The combine's reshape+index_select (fuse.py never sees it): the reshape is an alias prefix,
    stripped by codegen.strip_alias_prefix, and the group runs index_select's own row path."""
    gen = generate(gather_doc(), jobs=1)
    groups = gen.manifest["programs"]["update"]["groups"]
    g2 = next(info for info in groups.values() if info["nodes"] == ["g2"])  # the reshape stripped
    assert g2["ops"] == ["latch::index_select"] and g2["aliases"] == {"x2r": ["x2", 0]}
    gf = next(info for info in groups.values() if info["nodes"] == ["gf"])
    assert g2["body"] == gf["body"]  # one function: the plain f32 gather's
    assert "// row path" in body_sources(gen)["g2"]


def test_row_plan():
    o = lambda dt: Operand("p", (4, 768), dt)  # noqa: E731
    assert _row_plan(o(B), o(B), 768) == (32, 3, 2, 8, True)
    assert _row_plan(o(F), o(F), 768) == (32, 2, 4, 4, True)
    assert _row_plan(o(F), o(B), 768) == (32, 2, 4, 4, False)  # converting: 4 elements per vector
    g, u, rw, vw, raw = _row_plan(o(F), o(F), 49152)  # 192 KB rows: the block per row
    assert (g, u, rw) == (256, 8, 1)
    for dt in (B, F):
        g, u, rw, vw, raw = _row_plan(o(dt), o(dt), 768)
        assert u * rw <= LOADS_IN_FLIGHT
    assert row_path_taken("latch::index_select", (8, 6, 40), (8, 5, 40), 1)
    assert not row_path_taken("latch::index_select", (8, 6, 40), (8, 6, 5), 2)
    assert not row_path_taken("latch::embedding", (11, 4), (5, 4))
    assert not row_path_taken("latch::gather", (8, 40), (8, 40), 0)


def test_the_gathers_compile(tmp_path):
    """nvcc's front end and NVVM over every body (row tiles and column tiles)."""
    for split in ("rows", "cols"):
        check_compiles(gather_doc(split=split), tmp_path / split)


def _converting_doc():
    """index_select with a BF16 output from FP32 rows (a policy may give the gather its reader's dtype)."""
    v = [Value("x", (64, 768), F, "batch"), Value("idx", (96,), I, "batch"), Value("y", (96, 768), B)]
    g = H.graph("update", v, [("g", "latch::index_select", ("x", "idx"), ("y",), {"dim": 0})],
                [("batch", ["x", "idx"])], [("metrics", ["y"])])
    return H.planned([g], tiles=3)


def test_a_converting_gather_uses_ld4_st4():
    src = body_sources(generate(_converting_doc(), jobs=1))["g"]
    assert "// row path: a warp per row, 4 row(s) x 2 4-element vector(s)" in src
    assert "latch::ld4<float>(src_[w_] + v0_ * 4, u_ * 128, a_[w_][u_]);" in src  # v0_ + 32 u
    assert "latch::st4<__nv_bfloat16>(dst_[w_] + v0_ * 4, u_ * 128, a_[w_][u_]);" in src


def _function_spills(build_log: str) -> list[str]:
    return [ln.strip() for ln in build_log.splitlines()
            if "spill" in ln and not re.search(r"\b0 bytes spill stores, 0 bytes spill loads", ln)]


@needs_tools
def test_the_row_path_moves_16_bytes_per_access_without_spills(tmp_path, cache):
    out = tmp_path / "b"
    build(gather_doc(), out, jobs=2)
    assert _function_spills((out / "build.log").read_text()) == []
    r = sass_report(out / "program.so")
    assert r.local_loads == 0, r
    # six row-path bodies: bf16 2 x 3 and f32 6 loads per unrolled step at least
    assert r.ldg128 >= 6 * 6 and r.stg128 >= 6 * 6, r


def emb_backward_doc(tokens=(2, 700), D=64, V=40, pad=3, tiles=3, split="rows", seed_dup=True, base=False):
    """embedding_backward over 1400 indices (two chunks of EMB_CHUNK) into a 40-row table: many
    repeats per row, the padding row skipped. ``base``: the third input (a tied embedding's other
    gradient, ops.embedding_grad_sum), the sum's start instead of zeros."""
    v = [Value("g", (*tokens, D), F, "batch"), Value("tok", tokens, I, "batch"), Value("dw", (V, D), F)]
    ins = ("g", "tok") + (("G",) if base else ())
    if base:
        v.append(Value("G", (V, D), F, "batch"))
    g = H.graph("update", v, [("eb", "latch::embedding_backward", ins, ("dw",),
                                {"num_weights": V, "padding_idx": pad})],
                [("batch", list(ins[:1]) + ["tok"] + list(ins[2:]))], [("metrics", ["dw"])])
    return H.planned([g], tiles=tiles, split=split)


def test_the_embedding_backward_walks_only_its_hits():
    src = body_sources(generate(emb_backward_doc(), jobs=1))["eb"]
    assert "__ballot_sync(0xffffffffu, t >= 0)" in src and "hit_[base_[s] + __popc(" in src
    assert "for (int j0 = 0; j0 < m_; j0 += 8)" in src  # the walk is over the hits only
    assert "atomic" not in src  # deterministic: no float atomics


def test_the_embedding_backward_onto_a_base_copies_its_rows_first():
    """With base (a tied embedding's other gradient) the tile starts as base's rows (16-byte loads,
    four in flight) instead of zeros, and the hits are added onto them in the same order."""
    src = body_sources(generate(emb_backward_doc(base=True), jobs=1))["eb"]
    plain = body_sources(generate(emb_backward_doc(), jobs=1))["eb"]
    assert "latch::ld4(in2, i + u * 4 * LATCH_THREADS, q_[u]);" in src and "latch::ld4(" not in plain
    assert "static_cast<const void*>(in2) != static_cast<const void*>(out0)" in src  # none where dW is base
    assert "latch::st<float>(out0, i, (float)latch::ld<float>(in2, i));" in src  # the scalar path too
    walk = plain[plain.index("for (long long k0 = 0;"):]
    assert walk in src  # the walk over the hits is the plain body's
    assert "atomic" not in src


@needs_tools
def test_the_embedding_backward_compiles_without_spills(tmp_path, cache):
    for split in ("rows", "cols"):
        for base in (False, True):
            out = tmp_path / f"{split}-{base}"
            build(emb_backward_doc(split=split, base=base), out, jobs=2, use_cache=False)
            assert _function_spills((out / "build.log").read_text()) == []
            assert sass_report(out / "program.so").local_loads == 0
