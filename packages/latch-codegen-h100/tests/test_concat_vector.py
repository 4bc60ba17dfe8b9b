"""The fused RoPE groups (latch_schedule.fusion "Concatenation") on the vector/ILP path at the
TinyMoE-200M / dense transformer shapes (B = 2, H = 12, D = 64; T = 1024), FP32 and mixed BF16/FP32:

- forward: the q/k/v product's output (B*T, 3*H*D) read through reshape, permute, select and the two
  half slices, the rotation, the concat; written FP32 or cast to BF16;
- backward: dq, dk (B, H, T, D) (BF16 read through a cast to FP32, or FP32), each rotated back and
  concatenated by halves, stacked with dv along a new leading dim, permuted and reshaped to d(qkv)
  (B*T, 3*H*D), written FP32 or cast to BF16 (the run-26 body, 70 us per task on the element loop).

CPU: the generated text takes the vector path for row tiles (16-byte loads of FP32, 8-byte of BF16,
each region's source chosen once per group of four lanes) and nvcc compiles each body without
spills, with the vector loads and stores in the SASS. GPU (marked): every group against FP64, bit
for bit the same on a second launch."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import h100_handmade as H
from latch_codegen_h100.bodies import FUNC, group_spec, render_body
from latch_codegen_h100.codegen import _lowerings

B, H_, D, HALF = 2, 12, 64, 32
CASES = ("fwd_f32", "fwd_bf16", "bwd_f32", "bwd_bf16")


class _Build:
    def __init__(self, T: int):
        self.T, self.values, self.nodes, self.ins, self.outs, self.groups, self.k = T, [], [], [], [], [], 0

    def inp(self, name, shape, dtype="f32"):
        self.values.append((name, tuple(shape), dtype, "batch"))
        self.ins.append(name)
        return name

    def op(self, op, ins, shape, attrs=None, dtype="f32"):
        self.k += 1
        out = f"v{self.k}"
        self.values.append((out, tuple(shape), dtype))
        self.nodes.append((f"n{self.k}", f"latch::{op}", tuple(ins), (out,), dict(attrs or {})))
        self.groups[-1].append(f"n{self.k}")
        return out

    def half(self, x, shape, hi: bool):
        s = tuple(shape[:-1]) + (HALF,)
        return self.op("slice", (x,), s, {"dim": len(shape) - 1, "start": HALF if hi else 0,
                                           "end": D if hi else HALF, "step": 1})


def _forward(b: _Build, tag: str, out_dtype: str):
    T = b.T
    b.groups.append([])
    qkv = b.inp(f"qkv_{tag}", (B * T, 3 * H_ * D))
    cos, sin = b.inp(f"cos_{tag}", (T, HALF)), b.inp(f"sin_{tag}", (T, HALF))
    r = b.op("reshape", (qkv,), (B, T, 3, H_, D), {"shape": (B, T, 3, H_, D)})
    p = b.op("permute", (r,), (3, B, H_, T, D), {"perm": (2, 0, 3, 1, 4)})
    x = b.op("select", (p,), (B, H_, T, D), {"dim": 0, "index": 1})  # k
    hs = (B, H_, T, HALF)
    x1, x2 = b.half(x, (B, H_, T, D), False), b.half(x, (B, H_, T, D), True)
    a = b.op("sub", (b.op("mul", (x1, cos), hs), b.op("mul", (x2, sin), hs)), hs)
    c = b.op("add", (b.op("mul", (x2, cos), hs), b.op("mul", (x1, sin), hs)), hs)
    y = b.op("concat", (a, c), (B, H_, T, D), {"dim": 3})
    if out_dtype != "f32":
        y = b.op("cast", (y,), (B, H_, T, D), {"dtype": out_dtype}, dtype=out_dtype)
    b.outs.append(y)


def _backward(b: _Build, tag: str, io: str):
    T = b.T
    b.groups.append([])
    shape, hs = (B, H_, T, D), (B, H_, T, HALF)
    cos, sin = b.inp(f"cos_{tag}", (T, HALF)), b.inp(f"sin_{tag}", (T, HALF))
    grads = []
    for name in ("dq", "dk", "dv"):
        g = b.inp(f"{name}_{tag}", shape, io)
        grads.append(g if io == "f32" else b.op("cast", (g,), shape, {"dtype": "f32"}))
    stacked = []
    for g in grads[:2]:  # d(x1) = da*cos + db*sin, d(x2) = db*cos - da*sin
        da, db = b.half(g, shape, False), b.half(g, shape, True)
        lo = b.op("add", (b.op("mul", (da, cos), hs), b.op("mul", (db, sin), hs)), hs)
        hi = b.op("add", (b.op("mul", (db, cos), hs), b.op("mul", (b.op("neg", (da,), hs), sin), hs)), hs)
        stacked.append(b.op("concat", (lo, hi), shape, {"dim": 3}))
    stacked.append(grads[2])
    ones = [b.op("reshape", (s,), (1,) + shape, {"shape": (1,) + shape}) for s in stacked]
    st = b.op("concat", tuple(ones), (3,) + shape, {"dim": 0})
    pm = b.op("permute", (st,), (B, T, 3, H_, D), {"perm": (1, 3, 0, 2, 4)})
    y = b.op("reshape", (pm,), (B * T, 3 * H_ * D), {"shape": (B * T, 3 * H_ * D)})
    if io != "f32":
        y = b.op("cast", (y,), (B * T, 3 * H_ * D), {"dtype": io}, dtype=io)
    b.outs.append(y)


def rope_graph(T: int = 1024):
    """One program holding the four RoPE groups (CASES order); returns (graph, groups as node lists)."""
    b = _Build(T)
    _forward(b, "fwd_f32", "f32")
    _forward(b, "fwd_bf16", "bf16")
    _backward(b, "bwd_f32", "f32")
    _backward(b, "bwd_bf16", "bf16")
    g = H.graph("update", b.values, b.nodes, [("batch", b.ins)], [("metrics", b.outs)])
    return g, b.groups, b.outs


def _sources(T: int = 1024) -> dict[str, str]:
    from latch_core.sections import FusionGroup

    g, groups, outs = rope_graph(T)
    vals = {v.name: v for v in g.values}
    produced = {o for n in g.nodes for o in n.outputs}
    out = {}
    for case, names, o in zip(CASES, groups, outs):
        nodes = [n for n in g.nodes if n.name in names]
        ins = tuple(dict.fromkeys(i for n in nodes for i in n.inputs if i is not None and i not in produced))
        grp = FusionGroup(0, names, ins, (o,), o, "k")
        assert all(i in vals for i in ins)
        out[case] = render_body(group_spec(g, grp), _lowerings()).source
    return out


@pytest.fixture(scope="module")
def sources():
    return _sources()


def _ilp(src: str) -> str:
    return src[src.index("U groups of W"):src.index("operands not aligned")]


@pytest.mark.parametrize("case", CASES)
def test_the_rope_groups_take_the_vector_path_with_mixed_dtypes(sources, case):
    ilp = _ilp(sources[case])
    bf16_in, bf16_out = case == "bwd_bf16", case.endswith("bf16")
    # every operand read through one vector access per group of four lanes (a region's source picked
    # once per group: a pointer select, or a branch between sources of different storage types)
    assert "latch::ld<" not in ilp
    src = sources[case]
    ins = re.findall(r"const (float|__nv_bfloat16)\* (in\d+) =", src)
    assert ins and all(re.search(rf"latch::gld4\({n}, |= {n} \+ ", ilp) for _, n in ins)
    assert any(t == "__nv_bfloat16" for t, _ in ins) == bf16_in
    assert "latch::gst4(out0, l_," in ilp and "latch::st<" not in ilp
    assert ("__nv_bfloat16* out0" in src) == bf16_out
    # the concat's region is chosen once per group (selects), never by a branch in the arithmetic
    arith = ilp[ilp.index("for (int j_ = 0; j_ < 4; ++j_) {"):]
    arith = arith[:arith.index("for (int u_")]
    assert "if (" not in arith and " ? " in arith
    assert not re.search(r"\d+LL\b", ilp.split("{", 1)[1])  # 32-bit indices (every value < 2^31 elements)


def _nvcc() -> str | None:
    from latch_codegen_h100 import BuildError
    from latch_codegen_h100.builder import find_nvcc

    try:
        return find_nvcc()
    except BuildError:
        return None


@pytest.mark.skipif(_nvcc() is None or H.cuobjdump() is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("case", CASES)
def test_the_rope_bodies_compile_without_spills_to_vector_accesses(sources, case, tmp_path):
    """Each body as a kernel of its own: no spills, and the SASS reads its operands with 16-byte
    (FP32) or 8-byte (BF16) loads and writes 16-byte (FP32) or 8-byte (BF16) stores."""
    import latch_codegen_h100
    import latch_ops

    inc = [Path(latch_codegen_h100.__file__).parent / "cuda", Path(latch_ops.__file__).parent / "cuda"]
    cu = tmp_path / "b.cu"
    cu.write_text('#include "latch_kernel.cuh"\n' + sources[case].replace(FUNC, "body_fn")
                  + "\n__global__ void __launch_bounds__(256) k(latch::Ctx c) { body_fn(c); }\n")
    r = subprocess.run([_nvcc(), "-gencode", "arch=compute_90a,code=sm_90a", "-std=c++17", "-O3",
                        *[f"-I{p}" for p in inc], "-cubin", "-o", str(tmp_path / "b.cubin"), str(cu),
                        "-Xptxas", "-v"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in r.stderr and "bytes spill" in r.stderr
    assert not re.search(r"[1-9]\d* bytes spill", r.stderr)
    sass = subprocess.run([H.cuobjdump(), "-sass", str(tmp_path / "b.cubin")], capture_output=True, text=True).stdout
    wide_in = "LDG.E.64" if case == "bwd_bf16" else "LDG.E.128"
    wide_out = "STG.E.64" if case.endswith("bf16") else "STG.E.128"
    assert wide_in in sass and wide_out in sass, (wide_in, wide_out)


# --- GPU: every group against FP64, the same bits on a second launch ---------------------------------
# On the H200: .venv/bin/python -m pytest -q -m gpu packages/latch-codegen-h100/tests/test_concat_vector.py

@pytest.mark.gpu
def test_the_rope_groups_match_fp64_and_repeat_bit_for_bit(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from latch_codegen_h100 import build
    from latch_codegen_h100.runtime import Program
    from test_gpu_ops import make_inputs, reference, rel_l2

    g, groups, outs = rope_graph(1024)
    doc = build(H.planned([g], strategy="barrier", num_sms=132, tiles=64, groups={"update": groups}), tmp_path)
    assert doc.build is not None
    prog = Program.load(tmp_path)
    inputs = make_inputs(g)
    batch = {k: v.cuda() for k, v in inputs.items()}
    got = prog.run_program("update", batch=batch)
    again = prog.run_program("update", batch=batch)
    ref = reference(g, inputs)
    bad = []
    for case, o in zip(CASES, outs):
        err = rel_l2(got[o], ref[o])
        # FP32 output: FP32 arithmetic of exact inputs; BF16: the output's rounding (2^-9 relative)
        gate = 4e-3 if case.endswith("bf16") else 1e-6
        if not err <= gate:
            bad.append(f"{case}: rel-L2 {err:.3g} > {gate:g}")
        if not torch.equal(got[o].view(torch.int16 if got[o].dtype == torch.bfloat16 else torch.int32),
                           again[o].view(torch.int16 if again[o].dtype == torch.bfloat16 else torch.int32)):
            bad.append(f"{case}: a second launch gave other bits")
        print(f"ROPE {case}: rel-L2 {err:.3g} (gate {gate:g}), second launch bit-identical")
    assert not bad, "\n".join(bad)
