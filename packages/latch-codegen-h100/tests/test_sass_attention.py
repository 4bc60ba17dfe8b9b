"""The attention bodies' machine code: BF16 head dims 64 and 128 run on the tensor cores
(HMMA.16816.F32.BF16, cp.async staging: LDGSTS), so do FP32 values under operand_dtype bf16 (the
policy's attention in captured models), the f64 bodies are SIMT (no HMMA); the head-dim-64
bodies and both forwards hold everything in registers (no spills).

The file's nvcc builds (16, ~4 s each) start together when the first test needs one (``builds``:
two at a time in threads, in the order the tests read them): nvcc's front end runs on one core, and
one build after another kept one of CI's 2 cores idle. Each build is the ``build`` call the test
made itself before, with ``use_cache=False`` (what they check is the machine code, not the cache;
builds running ahead must not read LATCH_CACHE_DIR, which other tests set per test). A test waits
for its own builds and asserts on them as before; a failed build raises its error in that test.
"""

from __future__ import annotations

import re

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100.testing import BuildsAhead
from latch_codegen_h100.sass import _run


needs_tools = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")

BF16_D = [64, 128]
FWD_CASES = [(64, True, True), (128, True, False), (128, False, True), (64, False, False)]
BESIDE_D = [64, 128]
BWD_CASES = [(64, True, False, "wgmma"), (128, True, True, "wgmma"), (128, False, False, "wgmma"),
             (64, False, True, "wgmma"), (64, True, True, "wgmma2"), (128, True, False, "wgmma2")]


def _documents(item) -> list:
    """(key, document factory) of each build the selected test ``item`` of this file reads."""
    p = item.callspec.params if hasattr(item, "callspec") else {}
    name = item.originalname
    if name == "test_bf16_attention_runs_on_the_tensor_cores":
        return [(("attention", dt, p["d"]), lambda dt=dt: _attention_doc(dt, p["d"])) for dt in ("bf16", "f64")]
    if name == "test_fp32_values_under_the_bf16_policy_run_on_the_tensor_cores":
        return [(("attention", "f32", 64, "bf16"), lambda: _attention_doc("f32", 64, operand="bf16")),
                (("attention", "f32", 64, None), lambda: _attention_doc("f32", 64))]
    if name == "test_wgmma_forward_is_hgmma_fed_by_tma_without_spills":
        k = (p["d"], p["causal"], p["fwd_only"])
        return [(("forward",) + k, lambda: _wgmma_forward_doc(*k))]
    if name == "test_wgmma_forward_beside_a_product_keeps_both_pipelined":
        return [(("beside", p["d"]), lambda: _beside_doc(p["d"]))]
    if name == "test_both_wgmma_attention_bodies_beside_a_128x64_product_stay_pipelined":
        return [(("triple",), _triple_doc)]
    if name == "test_wgmma_backward_is_hgmma_fed_by_tma_without_spills":
        k = (p["d"], p["causal"], p["glse"], p["body"])
        return [(("backward",) + k, lambda: _wgmma_backward_doc(k[0], k[1], k[2], bwd_body=k[3]))]
    return []


@pytest.fixture(scope="module")
def builds(request, tmp_path_factory):
    """``builds.get(key, make_doc)`` -> (built document, build directory); the selected tests'
    builds start at the module's first test, two at a time (latch_codegen_h100.testing)."""
    b = BuildsAhead(tmp_path_factory.mktemp("sass-attention"), jobs=2, use_cache=False)
    if H.have_sass_tools():
        for item in request.session.items:
            if item.module is request.module:
                for key, make_doc in _documents(item):
                    if key not in b:  # planned here, in this thread; only build runs ahead
                        b.submit(key, make_doc())
    yield b
    b.close()


def _attention_doc(dtype: str, d: int, operand: str | None = None):
    """sdpa then sdpa_backward (grouped-query 4:2, 77 rows: not a multiple of the tiles), causal."""
    stat = "f32" if dtype in ("bf16", "f32") else dtype
    B, H_, Hkv, T = 1, 4, 2, 77
    q, kv = (B, H_, T, d), (B, Hkv, T, d)
    values = [Value("q", q, dtype, "batch"), Value("k", kv, dtype, "batch"), Value("v", kv, dtype, "batch"),
              Value("go", q, dtype, "batch"), Value("o", q, dtype), Value("lse", q[:3], stat),
              Value("dq", q, dtype), Value("dk", kv, dtype), Value("dv", kv, dtype)]
    a = {"causal": True, "scale": d ** -0.5}
    if operand:
        a["operand_dtype"] = operand
    if dtype == "bf16":
        a["attention_body"] = "mma"  # (BF16 storage's default forward is the wgmma one)
    nodes = [("fwd", "latch::sdpa", ("q", "k", "v"), ("o", "lse"), a),
             ("bwd", "latch::sdpa_backward", ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"), a)]
    g = H.graph("update", values, nodes, [("batch", ["q", "k", "v", "go"])], [("metrics", ["o", "dq", "dk", "dv"])])
    return H.planned([g], tiles=1, num_sms=1)


@needs_tools
@pytest.mark.parametrize("d", BF16_D)
def test_bf16_attention_runs_on_the_tensor_cores(builds, d):
    counts = {}
    for dtype in ("bf16", "f64"):
        _, out = builds.get(("attention", dtype, d), lambda: _attention_doc(dtype, d))
        sass = _run([H.cuobjdump(), "-sass", str(out / "program.so")])
        counts[dtype] = (len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)), len(re.findall(r"\bLDGSTS\b", sass)))
        if dtype == "bf16":
            log = (out / "build.log").read_text()
            spills = [int(s) for s in re.findall(r"Function properties for _Z\d+latch_body\w+\s*\n\s*\d+ bytes stack "
                                                 r"frame, (\d+) bytes spill stores", log)]
            assert len(spills) == 2, log
            # head dim 64: none; 128: the backward's dq half keeps ~50 bytes on the stack (forward: none)
            assert (max(spills) == 0) if d == 64 else (min(spills) == 0 and max(spills) <= 64), spills
    hmma, ldgsts = counts["bf16"]
    assert hmma >= 2 * (d // 16) and ldgsts > 0, counts
    assert counts["f64"][0] == 0, counts


@needs_tools
def test_fp32_values_under_the_bf16_policy_run_on_the_tensor_cores(builds):
    _, out = builds.get(("attention", "f32", 64, "bf16"), lambda: _attention_doc("f32", 64, operand="bf16"))
    sass = _run([H.cuobjdump(), "-sass", str(out / "program.so")])
    assert len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)) >= 8
    # FP32 attention without the policy: SIMT
    _, out = builds.get(("attention", "f32", 64, None), lambda: _attention_doc("f32", 64))
    sass = _run([H.cuobjdump(), "-sass", str(out / "program.so")])
    assert not re.findall(r"\bHMMA\b", sass)


def _wgmma_forward_doc(d: int, causal: bool, fwd_only: bool):
    """latch::sdpa with attention_body="wgmma" (grouped-query 4:2, 300 rows: several key blocks, the
    last one partial), alone or followed by the (mma.sync) backward, as a training step has it."""
    B, H_, Hkv, T = 1, 4, 2, 300
    q, kv = (B, H_, T, d), (B, Hkv, T, d)
    values = [Value("q", q, "bf16", "batch"), Value("k", kv, "bf16", "batch"), Value("v", kv, "bf16", "batch"),
              Value("o", q, "bf16"), Value("lse", q[:3], "f32")]
    a = {"causal": causal, "scale": d ** -0.5}
    nodes = [("fwd", "latch::sdpa", ("q", "k", "v"), ("o", "lse"), dict(a, attention_body="wgmma"))]
    outs = ["o", "lse"]
    if not fwd_only:
        values += [Value("go", q, "bf16", "batch"), Value("dq", q, "bf16"), Value("dk", kv, "bf16"),
                   Value("dv", kv, "bf16")]
        nodes.append(("bwd", "latch::sdpa_backward", ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"),
                      dict(a, attention_body="mma")))
        outs = ["o", "dq", "dk", "dv"]
    batch = ["q", "k", "v"] + ([] if fwd_only else ["go"])
    g = H.graph("update", values, nodes, [("batch", batch)], [("metrics", outs)])
    return H.planned([g], tiles=1, num_sms=1)


@needs_tools
@pytest.mark.parametrize("d, causal, fwd_only", FWD_CASES)
def test_wgmma_forward_is_hgmma_fed_by_tma_without_spills(builds, d, causal, fwd_only):
    from latch_codegen_h100.sass import sass_report

    doc, out = builds.get(("forward", d, causal, fwd_only), lambda: _wgmma_forward_doc(d, causal, fwd_only))
    stats = dict(doc.build.stats)
    assert "wgmma_warnings" not in stats, stats
    log = (out / "build.log").read_text()
    assert "C7518" not in log and "serialized" not in log, log
    if fwd_only:
        assert stats.get("spill_stores", 0) == 0, stats
    # Beside an out-of-line body (the backward) the worker keeps a few words on the stack around its
    # call (as it does with the mma.sync forward); none of it inside the forward's tensor-core code
    # (descriptors are recomputed from laundered bases, not hoisted and spilled).
    text = _run([H.cuobjdump(), "-sass", str(out / "program.so")]).splitlines()
    loops = _hgmma_loops(text)
    assert loops, "no loop around the HGMMA instructions"
    local = [text[i] for a, b in loops for i in range(a, b + 1) if re.search(r"\b(LDL|STL)\b", text[i])]
    assert not local, local[:8]
    _assert_lean_score_loops(text, loops)
    r = sass_report(out / "program.so")
    n_keys = 64  # latch::awg::FwdShape::BN
    # S = Q K^T (d / 16 steps of N = keys, both operands in shared memory) and O += P V (keys / 16
    # steps of N = d, P in registers): the first block's S, then S and P V of the pipelined loop,
    # then the last P V
    assert r.hgmma.get(f"64x{n_keys}x16.F32.BF16", 0) >= 2 * (d // 16), r
    assert r.hgmma.get(f"64x{d}x16.F32.BF16", 0) >= 2 * (n_keys // 16), r
    assert r.hgmma_serialized == 0, r
    assert r.utmaldg >= 2, r  # Q, and K with V
    if fwd_only:
        assert r.local_loads == 0 and r.local_stores == 0, r
    assert r.setmaxreg_alloc == (224,) and r.setmaxreg_dealloc == (56,), r


def test_wgmma_forward_refuses_what_it_cannot_run():
    from latch_codegen_h100.lower_attention import wgmma_forward
    from latch_codegen_h100.lowering import BodyContext, LoweringError, Operand

    def ctx(dtype="bf16", d=64, op="latch::sdpa", **attrs):
        q = Operand("q", (1, 2, 77, d), dtype)
        ins = (q, q, q) if op == "latch::sdpa" else (q, None, q, q, q, q, Operand("l", (1, 2, 77), "f32"))
        return BodyContext(op, dict({"causal": True, "scale": 0.125}, **attrs), ins, (q, q))

    assert wgmma_forward(ctx(attention_body="wgmma"))
    assert wgmma_forward(ctx())  # BF16 storage's default
    assert not wgmma_forward(ctx(attention_body="mma")) and not wgmma_forward(ctx(attention_body="simt"))
    # where it cannot run, the default is the mma.sync (or SIMT) body, without an error
    assert not wgmma_forward(ctx(d=32)) and not wgmma_forward(ctx(dtype="f32", operand_dtype="bf16"))
    assert not wgmma_forward(ctx(op="latch::sdpa_backward"))
    with pytest.raises(LoweringError, match="needs BF16 q/k/v with equal head dims 64 or 128"):
        wgmma_forward(ctx(d=32, attention_body="wgmma"))
    with pytest.raises(LoweringError, match="needs BF16"):
        wgmma_forward(ctx(dtype="f32", attention_body="wgmma", operand_dtype="bf16"))
    assert not wgmma_forward(ctx(op="latch::sdpa_backward", attention_body="wgmma"))  # the backward's own body
    with pytest.raises(LoweringError, match="is not one of"):
        wgmma_forward(ctx(attention_body="wgmma9"))


def _beside_doc(d: int):
    """A product and the wgmma attention forward in one program."""
    bf, f = "bf16", "f32"
    q = (1, 4, 300, d)
    values = [Value("x", (256, 128), bf, "batch"), Value("w", (128, 128), bf, "batch"), Value("y", (256, 128), f),
              Value("q", q, bf, "batch"), Value("k", q, bf, "batch"), Value("v", q, bf, "batch"),
              Value("o", q, bf), Value("lse", q[:3], f)]
    nodes = [("mm", "latch::matmul", ("x", "w"), ("y",), {"trans_b": True, "out_dtype": f}),
             ("att", "latch::sdpa", ("q", "k", "v"), ("o", "lse"),
              {"causal": True, "scale": d ** -0.5, "attention_body": "wgmma"})]
    g = H.graph("update", values, nodes, [("batch", ["x", "w", "q", "k", "v"])], [("metrics", ["y", "o"])])
    return H.planned([g])


@needs_tools
@pytest.mark.parametrize("d", BESIDE_D)
def test_wgmma_forward_beside_a_product_keeps_both_pipelined(builds, d):
    """A training kernel inlines the attention forward with the products' wgmma bodies: ptxas must
    keep every wgmma of both pipelined (no C7511/C7518) and spill nothing."""
    from latch_codegen_h100.sass import sass_report

    doc, out = builds.get(("beside", d), lambda: _beside_doc(d))
    stats = dict(doc.build.stats)
    assert "wgmma_warnings" not in stats and stats.get("spill_stores", 0) == 0, stats
    r = sass_report(out / "program.so")
    assert r.hgmma_serialized == 0 and r.utmaldg >= 3, r


def _hgmma_loops(text: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of every innermost loop (a backward branch's range) holding an HGMMA."""
    addr = {}
    for i, line in enumerate(text):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if m:
            addr[int(m.group(1), 16)] = i
    ranges = []
    for i, line in enumerate(text):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?BRA\s+(0x[0-9a-f]+)", line)
        if m and int(m.group(3), 16) < int(m.group(1), 16) and int(m.group(3), 16) in addr:
            ranges.append((addr[int(m.group(3), 16)], i))
    loops = set()
    for i, line in enumerate(text):
        if "HGMMA" in line:
            inside = [r for r in ranges if r[0] <= i <= r[1]]
            if inside:
                loops.add(min(inside, key=lambda r: r[1] - r[0]))
    return sorted(loops)


def _loop_products(text: list[str], loops: list[tuple[int, int]]) -> list[tuple[int, dict]]:
    """Per HGMMA loop: (its 64x64 products with both operands in shared memory, {accumulator:
    products with register A}) -- an SS step reads ``HGMMA.64x64x16.F32.BF16 Racc, gdesc[..]``, a
    register-A step ``HGMMA.64xNx16.F32.BF16 Racc, Ra, gdesc[..]``."""
    out = []
    for a, b in loops:
        ss, rs = 0, {}
        for i in range(a, b + 1):
            m = re.search(r"HGMMA\.64x\d+x16\.F32\.BF16 (R\d+), (R\d+), gdesc", text[i])
            if m:
                rs[m.group(1)] = rs.get(m.group(1), 0) + 1
            elif re.search(r"HGMMA\.64x64x16\.F32\.BF16 R\d+, gdesc", text[i]):
                ss += 1
        out.append((ss, rs))
    return out


def _assert_lean_score_loops(text: list[str], loops: list[tuple[int, int]], branches: bool = False) -> None:
    """The score work of the tensor-core loops (results/lead12.md, change 1): 2^x is MUFU.EX2 alone
    (latch::awg::ex2; exp2f's range check around it is an FSETP against -126 and a squaring, 4 more
    instructions an element). ``branches``: the causal / end-of-sequence masks are also one uniform
    branch per block, not a divergent branch per element (a BSSY / BSYNC pair around each element's
    exponential: the backward's loops had one per MUFU.EX2, 33 for 32; now a few per block)."""
    body = [text[i] for a, b in loops for i in range(a, b + 1)]
    assert any("MUFU.EX2" in line for line in body), "no MUFU.EX2 in the tensor-core loops"
    wrapped = [line.strip() for line in body if re.search(r"FSETP\.GEU\.AND\b.*-126", line)]
    assert not wrapped, wrapped[:4]
    if branches:
        for a, b in loops:
            bssy = sum(1 for i in range(a, b + 1) if re.search(r"\bBSSY\b", text[i]))
            mufu = sum(1 for i in range(a, b + 1) if "MUFU.EX2" in text[i])
            assert 2 * bssy <= mufu, (bssy, mufu, text[a][:60])


def _wgmma_backward_doc(d: int, causal: bool, glse: bool = False, T: int = 300, bwd_body: str = "wgmma"):
    """latch::sdpa then latch::sdpa_backward, with attention_body="wgmma" and ``bwd_body`` (grouped-query
    4:2, 300 rows: several blocks, the last one partial), as a training step has them."""
    B, H_, Hkv = 1, 4, 2
    q, kv = (B, H_, T, d), (B, Hkv, T, d)
    values = [Value("q", q, "bf16", "batch"), Value("k", kv, "bf16", "batch"), Value("v", kv, "bf16", "batch"),
              Value("go", q, "bf16", "batch"), Value("o", q, "bf16"), Value("lse", q[:3], "f32"),
              Value("dq", q, "bf16"), Value("dk", kv, "bf16"), Value("dv", kv, "bf16")]
    batch = ["q", "k", "v", "go"]
    if glse:
        values.append(Value("gl", q[:3], "f32", "batch"))
        batch.append("gl")
    a = {"causal": causal, "scale": d ** -0.5, "attention_body": "wgmma"}
    nodes = [("fwd", "latch::sdpa", ("q", "k", "v"), ("o", "lse"), a),
             ("bwd", "latch::sdpa_backward", ("go", "gl" if glse else None, "q", "k", "v", "o", "lse"),
              ("dq", "dk", "dv"), dict(a, attention_body=bwd_body))]
    g = H.graph("update", values, nodes, [("batch", batch)], [("metrics", ["o", "dq", "dk", "dv"])])
    return H.planned([g], tiles=1, num_sms=1)


@needs_tools
@pytest.mark.parametrize("d, causal, glse, body", BWD_CASES)
def test_wgmma_backward_is_hgmma_fed_by_tma_without_spills(builds, d, causal, glse, body):
    """The wgmma backward beside the wgmma forward (one head dim, as a model's kernel): every wgmma
    pipelined (no C7510/C7511/C7512/C7515/C7518), S/dP as 64x64 products from shared memory, dQ/dK/dV
    as 64xD products with register A, TMA loads (3-D boxes and the 1-D lse/glse boxes). ptxas keeps a
    few words of the task loops (counters, pointers) on the stack, outside the tensor-core loops:
    no local memory between the first and the last HGMMA."""
    from latch_codegen_h100.sass import sass_report

    doc, out = builds.get(("backward", d, causal, glse, body),
                          lambda: _wgmma_backward_doc(d, causal, glse, bwd_body=body))
    stats = dict(doc.build.stats)
    log = (out / "build.log").read_text()
    assert "wgmma_warnings" not in stats, (stats, log[-3000:])
    for w in ("C7510", "C7511", "C7512", "C7515", "C7518", "serialized"):
        assert w not in log, log[-3000:]
    assert stats.get("spill_stores", 0) <= 128, stats
    text = _run([H.cuobjdump(), "-sass", str(out / "program.so")]).splitlines()
    loops = _hgmma_loops(text)
    assert loops, "no loop around the HGMMA instructions"
    local = [text[i] for a, b in loops for i in range(a, b + 1) if re.search(r"\b(LDL|STL)\b", text[i])]
    assert not local, local[:8]
    if body == "wgmma":  # (wgmma2, not used, keeps its per-element branches)
        _assert_lean_score_loops(text, loops, branches=True)
    # dK and dV in one pass over the query blocks at both head dims: one loop holds S^T and dP^T once
    # (2 x d/16 steps of 64x64 from shared memory) and the register-A products into both
    # accumulators, 4 steps each. (Head dim 128's former two passes, a dV loop and then a dK loop
    # recomputing S^T, had no loop with two register-A accumulators.)
    kv = [(ss, rs) for ss, rs in _loop_products(text, loops) if len(rs) == 2]
    assert len(kv) == 1 and kv[0][0] == 2 * (d // 16) and sorted(kv[0][1].values()) == [4, 4], kv
    r = sass_report(out / "program.so")
    # backward: S (dQ half) and S^T (dK/dV half) and their dP: 4 x d/16 steps of 64x64 from shared
    # memory; dQ, dV, dK: 3 x 4 steps of 64xd with register A
    assert r.hgmma.get("64x64x16.F32.BF16", 0) >= 4 * (d // 16), r
    assert r.hgmma.get(f"64x{d}x16.F32.BF16", 0) >= 3 * 4, r
    assert r.hgmma_serialized == 0, r
    assert r.utmaldg >= 4, r
    assert r.setmaxreg_alloc == (224,) and r.setmaxreg_dealloc == (56,), r


def _triple_doc():
    """Head dim 64: the wgmma forward, the wgmma backward and a 128 x 64 product in one kernel (the
    least of the dense transformer's kernel that serialised every wgmma: results/sa.md)."""
    bf, f = "bf16", "f32"
    B, H_, T, d = 1, 2, 300, 64
    q = (B, H_, T, d)
    values = [Value("x", (256, 128), bf, "batch"), Value("w", (128, 128), bf, "batch"), Value("y", (256, 128), f),
              Value("q", q, bf, "batch"), Value("k", q, bf, "batch"), Value("v", q, bf, "batch"),
              Value("go", q, bf, "batch"), Value("o", q, bf), Value("lse", q[:3], f),
              Value("dq", q, bf), Value("dk", q, bf), Value("dv", q, bf)]
    a = {"causal": True, "scale": d ** -0.5}
    nodes = [("mm", "latch::matmul", ("x", "w"), ("y",), {"out_dtype": f, "config": "wgmma_128x64x64"}),
             ("fwd", "latch::sdpa", ("q", "k", "v"), ("o", "lse"), a),
             ("bwd", "latch::sdpa_backward", ("go", None, "q", "k", "v", "o", "lse"), ("dq", "dk", "dv"), a)]
    g = H.graph("update", values, nodes, [("batch", ["x", "w", "q", "k", "v", "go"])],
                [("metrics", ["y", "o", "dq", "dk", "dv"])])
    return H.planned([g])


@needs_tools
def test_both_wgmma_attention_bodies_beside_a_128x64_product_stay_pipelined(builds):
    """With O += P V accumulated into O across the key loop, this kernel's wgmma were all serialised
    (C7511: 83 of 84 HGMMA in the dense transformer's kernel); the forward's per-block P V
    accumulator (latch::awg::FwdOwnPv) keeps every one pipelined. Both attention bodies are the
    defaults (lower_attention.kernel_defaults leaves a head-dim-64 forward on wgmma)."""
    from latch_codegen_h100.sass import sass_report

    doc, out = builds.get(("triple",), _triple_doc)
    stats = dict(doc.build.stats)
    log = (out / "build.log").read_text()
    assert "wgmma_warnings" not in stats, (stats, log[-3000:])
    assert "C7511" not in log and "serialized" not in log, log[-3000:]
    r = sass_report(out / "program.so")
    # the forward's S and P V (64 keys a block), the backward's products, the 128 x 64 product
    assert r.hgmma.get("64x64x16.F32.BF16", 0) >= 2 * 4 + 4 * 4 + 3 * 4, r
    assert r.hgmma_serialized == 0, r
    text = _run([H.cuobjdump(), "-sass", str(out / "program.so")]).splitlines()
    local = [text[i] for a, b in _hgmma_loops(text) for i in range(a, b + 1) if re.search(r"\b(LDL|STL)\b", text[i])]
    assert not local, local[:8]


def test_wgmma_backward_is_the_default_and_refuses_what_it_cannot_run():
    from latch_codegen_h100.lower_attention import tensor_cores, wgmma_backward
    from latch_codegen_h100.lowering import BodyContext, LoweringError, Operand

    def ctx(dtype="bf16", d=64, lse="f32", glse=False, **attrs):
        q = Operand("q", (1, 2, 77, d), dtype)
        gl = Operand("g", (1, 2, 77), "f32") if glse else None
        ins = (q, gl, q, q, q, q, Operand("l", (1, 2, 77), lse))
        return BodyContext("latch::sdpa_backward", dict({"causal": True, "scale": 0.125}, **attrs), ins, (q, q, q))

    assert wgmma_backward(ctx()) and not tensor_cores(ctx())  # BF16 storage's default
    assert not wgmma_backward(ctx(attention_body="mma")) and tensor_cores(ctx(attention_body="mma"))
    assert not wgmma_backward(ctx(d=32))  # where it cannot run, the default is another body, no error
    assert wgmma_backward(ctx(attention_body="wgmma")) and not tensor_cores(ctx(attention_body="wgmma"))
    assert wgmma_backward(ctx(d=128, glse=True, attention_body="wgmma"))
    with pytest.raises(LoweringError, match="needs BF16 q/k/v with equal head dims 64 or 128"):
        wgmma_backward(ctx(d=32, attention_body="wgmma"))
    with pytest.raises(LoweringError, match="FP32 lse"):
        wgmma_backward(ctx(lse="bf16", attention_body="wgmma"))


def test_wgmma2_is_a_backward_body_chosen_by_name():
    """attention_body="wgmma2" runs the wgmma backward's variant 2 (the overlapped one); the default
    stays variant 1; on the forward node it is an error naming the node."""
    from latch_codegen_h100.lower_attention import bwd_variant, wgmma_backward, wgmma_forward
    from latch_codegen_h100.lowering import BodyContext, LoweringError, Operand

    def ctx(op="latch::sdpa_backward", **attrs):
        q = Operand("q", (1, 2, 77, 64), "bf16")
        ins = (q, None, q, q, q, q, Operand("l", (1, 2, 77), "f32")) if op.endswith("backward") else (q, q, q)
        outs = (q, q, q) if op.endswith("backward") else (q, q)
        return BodyContext(op, dict({"causal": True, "scale": 0.125}, **attrs), ins, outs)

    assert wgmma_backward(ctx(attention_body="wgmma2")) and bwd_variant(ctx(attention_body="wgmma2")) == 2
    assert bwd_variant(ctx()) == 1 and bwd_variant(ctx(attention_body="wgmma")) == 1
    with pytest.raises(LoweringError, match="wgmma2.*backward body"):
        wgmma_forward(ctx(op="latch::sdpa", attention_body="wgmma2"))
