"""The gathers' row path at TinyMoE-200M's MoE shapes (issue 11/12, results/gr.md), read from the
generated code and the SASS: index_select of [32768, 768] BF16 and FP32 tables by 65,536 indices in
132 row tiles (the dispatch at 32 x 1024 tokens). Each body's machine code is found by its label in
nvdisasm's listing of the kernel (a noinline body is a labelled function inside it).

What the old body lacked: per row, the task record, its lo and the index were loaded one after
another (a store may alias them) before that row's loads, for every row of a step; 6 loads per lane
were in flight before the first store. Now the task's box is read once, the indices of a chunk of
steps arrive by one coalesced load a chunk ahead and reach each step by shuffle, the rows two steps
ahead go to L2 by prefetch, and no body spills."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile

import pytest

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build, generate
from latch_codegen_h100.sass import find_cuobjdump

import test_gather_rows as R

pytestmark = pytest.mark.skipif(not H.have_sass_tools(), reason="nvcc or cuobjdump not installed")


def moe_doc(rows=32768, n=65536, width=768, tiles=132):
    v = [Value("xb", (rows, width), "bf16", "batch"), Value("xf", (rows, width), "f32", "batch"),
         Value("idx", (n,), "i64", "batch"), Value("yb", (n, width), "bf16"), Value("yf", (n, width), "f32")]
    nodes = [("gb", "latch::index_select", ("xb", "idx"), ("yb",), {"dim": 0}),
             ("gf", "latch::index_select", ("xf", "idx"), ("yf",), {"dim": 0})]
    g = H.graph("update", v, nodes, [("batch", ["xb", "xf", "idx"])], [("metrics", ["yb", "yf"])])
    return H.planned([g], tiles=tiles, num_sms=132, groups={"update": [["gb"], ["gf"]]})


def body_sass(library) -> dict[str, list[str]]:
    """body function name (latch_body_...) -> its SASS instructions, from nvdisasm over the sm_90a cubin."""
    tool = find_cuobjdump()
    bindir = os.path.dirname(tool)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    d = tempfile.mkdtemp()
    subprocess.run([tool, "-xelf", "all", os.path.abspath(library)], cwd=d, check=True, capture_output=True, env=env)
    cubin = [f for f in glob.glob(os.path.join(d, "*.cubin")) if "sm_90" in f][0]
    nvdisasm = os.path.join(bindir, "nvdisasm") if os.path.exists(os.path.join(bindir, "nvdisasm")) else "nvdisasm"
    text = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True, env=env).stdout
    out: dict[str, list[str]] = {}
    cur = None
    for ln in text.splitlines():
        m = re.match(r"^\$latch_kernel\$_Z\d+(latch_body_[0-9a-f]+)\S*:", ln)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        if re.match(r"^\S+:", ln) and not ln.startswith(".L"):
            cur = None
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", ln)
        if m and cur:
            out[cur].append(m.group(1).strip())
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe") / "b"
    doc = moe_doc()
    src = R.body_sources(generate(doc, jobs=1))
    build(doc, out, jobs=2, use_cache=False)
    return src, out


def _func(src: str) -> str:
    return re.search(r"void (latch_body_[0-9a-f]+)\(", src).group(1)


def test_the_index_is_loaded_a_chunk_ahead_and_reaches_the_step_by_shuffle(built):
    src, _ = built
    for name in ("gb", "gf"):
        body = src[name]
        row = body.split("// row path", 1)[1].split("\n    } else {", 1)[0]  # the row path, not the scalar loop
        step = row[row.index("for (long long k_ = 0"):]
        assert "c.t->" not in row, name  # the task's box read once, into locals
        assert len(re.findall(r"latch::ld<long long>\(in1", row)) == 1, name  # in load_
        assert "latch::ld<long long>(in1" not in step, name  # the step loop loads no index
        assert "load_(k_ / KC_ + 1)" in step and "__shfl_sync(0xffffffffu, cx_" in step, name
        assert "latch::gpf(pb_" in step, name  # the rows ahead go to L2


def test_loads_in_flight_before_the_first_store_and_no_local_memory(built):
    src, out = built
    log = (out / "build.log").read_text()
    assert R._function_spills(log) == []
    sass = body_sass(out / "program.so")
    for name, loads in (("gb", 6), ("gf", 8)):
        ins = sass[_func(src[name])]
        ldg = [i for i, x in enumerate(ins) if re.search(r"\bLDG\.E\S*\.128\b", x)]
        stg = [i for i, x in enumerate(ins) if re.search(r"\bSTG\.E\S*\.128\b", x)]
        assert stg, name
        assert sum(i < stg[0] for i in ldg) >= loads, (name, len(ldg), stg[0])
        assert not any(re.search(r"\b(LDL|STL)\b", x) for x in ins), name
        assert any("CCTL.E.PF2" in x for x in ins), name  # prefetch.global.L2
        assert sum("SHFL.IDX" in x for x in ins) >= 4, name
