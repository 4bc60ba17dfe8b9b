"""The vector/ILP path's unroll factor U for groups that load nothing or hold accurate transcendental
forms (fuse.ILP_HEAVY). TinyMoE-200M's RoPE tables (arange, exp, cos, sin: no loads) took U = 12 in
run 29: 9,504 SASS instructions with 303 LDL / 213 STL (sinf/cosf's slow-path local arrays unrolled 48
times), 53 us for 6.5k elements a task while the other 128 SMs waited at barrier 0. Needs nvcc and
cuobjdump for the machine-code half."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import h100_handmade as H
from latch_codegen_h100.bodies import FUNC, group_spec, render_body
from latch_codegen_h100.codegen import _lowerings
from latch_codegen_h100.fuse import ILP_MIN_U


def _tables_graph(T: int = 1024, half: int = 32):
    """TinyMoE-200M's rope_tables group as captured (examples/transformer.py:91)."""
    values = [("arange", (half,), "f32"), ("mul", (half,), "f32"), ("exp", (half,), "f32"),
              ("arange_1", (T,), "f32"), ("unsqueeze", (T, 1), "f32"), ("unsqueeze_1", (1, half), "f32"),
              ("mul_1", (T, half), "f32"), ("cos", (T, half), "f32"), ("sin", (T, half), "f32")]
    nodes = [("arange", "latch::arange", (), ("arange",), {"dtype": "f32", "size": half, "start": 0.0, "step": 1.0}),
             ("mul", "latch::mul", ("arange",), ("mul",), {"scalar": -0.28782313662425574}),
             ("exp", "latch::exp", ("mul",), ("exp",), {}),
             ("arange_1", "latch::arange", (), ("arange_1",), {"dtype": "f32", "size": T, "start": 0.0, "step": 1.0}),
             ("unsqueeze", "latch::reshape", ("arange_1",), ("unsqueeze",), {"shape": (T, 1)}),
             ("unsqueeze_1", "latch::reshape", ("exp",), ("unsqueeze_1",), {"shape": (1, half)}),
             ("mul_1", "latch::mul", ("unsqueeze", "unsqueeze_1"), ("mul_1",), {}),
             ("cos", "latch::cos", ("mul_1",), ("cos",), {}),
             ("sin", "latch::sin", ("mul_1",), ("sin",), {})]
    return H.graph("update", values, nodes, [], [("metrics", ["cos", "sin"])])


def _source(g) -> str:
    from latch_core.sections import FusionGroup

    names = tuple(n.name for n in g.nodes)
    grp = FusionGroup(0, names, (), ("cos", "sin"), "cos", "k")
    return render_body(group_spec(g, grp), _lowerings()).source


def _unroll(src: str) -> int:
    m = re.search(r"float o\d+_\[(\d+)\]\[\d+\];", src)
    assert m, "the group did not take the vector/ILP path"
    return int(m.group(1))


def test_a_group_without_loads_and_with_sin_cos_unrolls_the_least():
    assert _unroll(_source(_tables_graph())) == ILP_MIN_U


def test_a_loading_group_of_cheap_ops_still_unrolls_for_bytes_in_flight():
    """The bound is only for heavy or load-free groups: a plain scaled copy keeps its U > ILP_MIN_U."""
    from latch_core.sections import FusionGroup

    g = H.graph("update", [("x", (1024, 32), "f32", "batch"), ("y", (1024, 32), "f32")],
                [("m", "latch::mul", ("x",), ("y",), {"scalar": 2.0})], [("batch", ["x"])], [("metrics", ["y"])])
    grp = FusionGroup(0, ("m",), ("x",), ("y",), "y", "k")
    assert _unroll(render_body(group_spec(g, grp), _lowerings()).source) > ILP_MIN_U


@pytest.mark.skipif(H.cuobjdump() is None, reason="needs cuobjdump")
def test_the_rope_tables_body_is_short_machine_code(tmp_path):
    """Compiled alone: under 3,000 SASS instructions (9,504 at U = 12) and under 100 local loads (303)."""
    import latch_codegen_h100
    import latch_ops
    from latch_codegen_h100.builder import find_nvcc

    try:
        nvcc = find_nvcc()
    except Exception:
        pytest.skip("needs nvcc")
    inc = [Path(latch_codegen_h100.__file__).parent / "cuda", Path(latch_ops.__file__).parent / "cuda"]
    cu = tmp_path / "b.cu"
    cu.write_text('#include "latch_kernel.cuh"\n#include "latch_elementwise.cuh"\n'
                  + _source(_tables_graph()).replace(FUNC, "body_fn")
                  + "\n__global__ void __launch_bounds__(256) k(latch::Ctx c) { body_fn(c); }\n")
    r = subprocess.run([nvcc, "-gencode", "arch=compute_90a,code=sm_90a", "-std=c++17", "-O3",
                        *[f"-I{p}" for p in inc], "-cubin", "-o", str(tmp_path / "b.cubin"), str(cu)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    sass = subprocess.run([H.cuobjdump(), "-sass", str(tmp_path / "b.cubin")], capture_output=True, text=True).stdout
    count = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, re.M))
    ldl = len(re.findall(r"\bLDL\b", sass))
    assert count < 3000 and ldl < 100, (count, ldl)
