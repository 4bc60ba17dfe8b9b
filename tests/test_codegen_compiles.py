"""CI without a GPU: every example goes capture -> schedule (both strategies) -> memory plan ->
code generation -> nvcc (sm_90a, one translation unit, shared library). Nothing runs; a codegen or
lowering regression fails here instead of on the H200. With the BF16 policy, the machine code of the
MLP and the transformer is read too (cuobjdump): their products run on tensor cores fed by TMA,
with the register split.

Both strategies lower to the same op-body signatures, so the second build must reuse the first
library (same content key): the schedule lives in the binary tables, not in the sources.

The examples' first builds (barrier) start together when the first test needs one (``builds``,
latch_codegen_h100.testing.BuildsAhead: two at a time in threads, the same ``build`` calls as before, only earlier):
nvcc's front end runs on one core, and this file built one kernel after another (~110 s on CI's 2
cores). Each test waits for its own build and asserts on it as before.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from cross_helpers import needs_nvcc
from latch_codegen_h100 import BuildsAhead
from latch_codegen_h100 import build
from latch_core.passes import run_pipeline
from latch_core.plugins import registries

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


pytestmark = needs_nvcc


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One build cache for the whole file, set for the whole file: the builds running ahead read
    LATCH_CACHE_DIR while the tests run, so no test may point it elsewhere meanwhile."""
    d = tmp_path_factory.mktemp("latch-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LATCH_CACHE_DIR", str(d))
        yield d


# TinyMoE at a small size (the op-body signatures change with shapes, the code paths do not).
SMALL_MOE = {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "experts": 4, "expert_hidden": 32, "seq": 32,
             "device": "cpu"}


def _planned(name: str, scheduler: str, policy: bool, overrides=None):
    from latch_capture.examples import load_example

    doc = load_example(EXAMPLES / f"{name}.py", **(overrides or {})).capture(grads=True)
    passes = registries().passes
    seq = ([passes.get("memory.policy")] if policy else []) + [
        passes.get(n) for n in ("schedule.matmul_layouts", "schedule.split_reductions", "schedule.matmul_configs",
                                "schedule", "memory.plan")]
    return run_pipeline(seq, doc, {"schedule.split_reductions": {"num_sms": 132},
                                   "schedule.matmul_configs": {"num_sms": 132},
                                   "schedule": {"scheduler": scheduler, "num_sms": 132}})


# name -> (example, policy, overrides): the first (barrier) builds, longest first
FIRST_BUILDS = {"tinymoe_bf16": ("tinymoe", True, SMALL_MOE), "transformer_bf16": ("transformer", True, None),
                "mlp_bf16": ("mlp", True, None), "mlp": ("mlp", False, None), "two_weight": ("two_weight", False, None)}


_RUNNING: list[BuildsAhead] = []


# test -> the first build it reads
READS = {"test_two_weight_compiles": "two_weight", "test_mlp_compiles": "mlp",
         "test_transformer_with_bf16_policy_compiles": "transformer_bf16",
         "test_mlp_with_bf16_policy_runs_its_products_on_tensor_cores": "mlp_bf16",
         "test_tinymoe_small_with_bf16_policy_compiles": "tinymoe_bf16"}


@pytest.fixture(scope="module")
def builds(request, cache_dir, tmp_path_factory):
    """``builds.get(name)`` -> (the built document, its build directory) of FIRST_BUILDS[name], for
    the tests selected in this session. The documents are planned here, in this thread (capture runs
    torch); only ``build`` runs ahead."""
    ahead = BuildsAhead(tmp_path_factory.mktemp("first-builds"), jobs=2)
    _RUNNING.append(ahead)
    wanted = {READS[it.originalname] for it in request.session.items
              if it.module is request.module and it.originalname in READS}
    try:
        for name, (example, policy, overrides) in FIRST_BUILDS.items():
            if name not in wanted:
                continue
            ahead.submit(name, _planned(example, "barrier", policy, overrides))
        yield ahead
    finally:
        ahead.close()
        _RUNNING.remove(ahead)


def _compile_both(name: str, builds: BuildsAhead, tmp_path: Path):
    example, policy, overrides = FIRST_BUILDS[name]
    first, first_dir = builds.get(name)
    assert (first_dir / "program.so").exists()
    second = build(_planned(example, "dataflow", policy, overrides), tmp_path / "dataflow", jobs=2)
    assert second.build.key == first.build.key
    assert dict(second.build.stats)["cached"] in ("cache", "dir")
    assert (tmp_path / "dataflow" / "tables" / "update.instrs.bin").read_bytes() != \
        (first_dir / "tables" / "update.instrs.bin").read_bytes()
    return first_dir


def test_two_weight_compiles(tmp_path, builds):
    _compile_both("two_weight", builds, tmp_path)


@pytest.mark.slow
def test_mlp_compiles(tmp_path, builds):
    _compile_both("mlp", builds, tmp_path)


def _assert_tensor_cores(build_dir: Path):
    from latch_codegen_h100 import SassError, sass_report

    try:
        r = sass_report(build_dir / "program.so")
    except SassError as e:
        pytest.skip(f"no disassembler: {e}")
    assert sum(r.hgmma.values()) >= 8 and r.hgmma_serialized == 0, r   # wgmma, issued back to back
    assert r.utmaldg >= 2, r                                          # fed by TMA
    assert r.setmaxreg_alloc == (224,) and r.setmaxreg_dealloc == (56,), r   # the register split


@pytest.mark.slow
def test_transformer_with_bf16_policy_compiles(tmp_path, builds):
    _assert_tensor_cores(_compile_both("transformer_bf16", builds, tmp_path))


@pytest.mark.slow
def test_mlp_with_bf16_policy_runs_its_products_on_tensor_cores(builds):
    _assert_tensor_cores(builds.get("mlp_bf16")[1])


@pytest.mark.slow
def test_tinymoe_small_with_bf16_policy_compiles(tmp_path, builds):
    _compile_both("tinymoe_bf16", builds, tmp_path)


def test_matmul_layouts_out_dtypes_and_split_k_compile(tmp_path, cache_dir):
    """Every new form of latch::matmul reaches nvcc through the SIMT body: split-K partials (plain and
    with a transposed a), a product writing bf16 for the next one, a batched product reading b
    transposed; the schedule records a configuration on each."""
    from latch_core.document import Document
    from latch_core.ir import Graph, GraphSection, Group, Node, Value

    vals = [Value("a", (128, 4096), "f32", "batch"), Value("b", (4096, 256), "f32", "param"),
            Value("c", (256, 64), "f32", "param"), Value("q", (3, 40, 24), "f32", "batch"),
            Value("k", (3, 56, 24), "f32", "param"), Value("d", (4096, 128), "f32", "batch"),
            Value("e", (4096, 64), "f32", "param"),
            Value("y", (128, 256), "f32"), Value("z", (128, 64), "f32"), Value("s", (3, 40, 56), "f32"),
            Value("f", (128, 64), "f32")]
    nodes = [Node("mm", "latch::matmul", ("a", "b"), ("y",)), Node("mm2", "latch::matmul", ("y", "c"), ("z",)),
             Node("qk", "latch::matmul", ("q", "k"), ("s",), {"trans_b": True}),
             Node("dw", "latch::matmul", ("d", "e"), ("f",), {"trans_a": True})]
    g = Graph("update", vals, nodes, [Group("params", ["b", "c", "k", "e"]), Group("batch", ["a", "q", "d"])],
              [Group("loss", ["z", "s", "f"])])
    passes = registries().passes
    doc = run_pipeline([passes.get("memory.policy"), passes.get("schedule.matmul_layouts"),
                        passes.get("schedule.matmul_configs"), passes.get("schedule"), passes.get("memory.plan")],
                       Document(graph=GraphSection([g])),
                       {"memory.policy": {"master": None},
                        "schedule.matmul_configs": {"num_sms": 132, "cost_split_k_choices": (1, 2, 4, 8, 16)},
                        "schedule": {"num_sms": 132}})
    prog = doc.graph.program("update")
    mms = [n for n in prog.nodes if n.op == "latch::matmul"]
    assert all(n.attr("config") for n in mms)
    assert {n.name for n in mms if n.attr("split_k")} == {"mm.partial", "dw.partial"}
    built = build(doc, tmp_path / "mm", jobs=2)
    assert (tmp_path / "mm" / "program.so").exists()
    src = "\n".join(p.read_text() for p in (tmp_path / "mm" / "src").rglob("*.cu*"))
    # rank-2 BF16 products run the wgmma body (split-K partials loop over their split index; dW reads
    # a M-major); the batched q k^T the SIMT body, reading k transposed
    assert "latch::gemm_consume<__nv_bfloat16, 128, " in src and "for (int s = c.t->lo[0]; s < c.t->hi[0]; ++s)" in src
    assert ", true, false>(p, epi," in src  # dW: A M-major, B N-major
    assert "matmul_tile<__nv_bfloat16, __nv_bfloat16, float, float, 1, false, true>" in src  # q k^T
    assert dict(built.build.stats)["bodies"] >= 6


def test_hf_mixtral_with_bf16_policy_and_routing_compiles(tmp_path):
    """transformers' Mixtral, unchanged, through the whole pipeline as `latch-pipeline compile
    --policy --routing` runs it (every pass, alias views included) to nvcc's front end
    (check_compiles: the CUDA is valid, ptxas not run; the full builds above run ptxas on the same
    lowerings). Its router's mask chain fused into a column sum once named a temporary `v4`, as the
    vector loader's output array was named: nvcc refused the unit (H200 run 23); the output array
    is `o4_` now."""
    pytest.importorskip("transformers")
    from latch_check.pipeline import compile_example
    from latch_codegen_h100 import check_compiles

    c = compile_example(EXAMPLES / "hf_mixtral.py", scheduler="barrier", num_sms=132, policy=True, routing=True,
                        build=False)
    ptx = check_compiles(c.doc, tmp_path / "b")
    assert ptx.stat().st_size > 0 and ".entry" in ptx.read_text()


def test_check_compiles_names_the_unit_and_op_of_invalid_cuda(tmp_path, monkeypatch):
    """The front-end check fails where nvcc would: a generated name colliding with another (the
    Mixtral bug's kind) is a BuildError naming the unit, not a pass."""
    from latch_codegen_h100 import BuildError, builder, check_compiles

    for ahead in _RUNNING:  # no build may run ahead while generate is patched below
        ahead.finish()

    doc = _planned("mlp", "barrier", True)
    real = builder.generate

    def broken(d, **kw):
        gen = real(d, **kw)
        u = gen.units[-1]
        bad = attrs.evolve(u, source=u.source + "\nstatic int latch_dup_; static float latch_dup_;\n")
        return attrs.evolve(gen, units=tuple(gen.units[:-1]) + (bad,))

    monkeypatch.setattr(builder, "generate", broken)
    with pytest.raises(BuildError) as e:
        check_compiles(doc, tmp_path / "b")
    msg = str(e.value)
    last = real(doc).units[-1].name
    assert f"nvcc failed on unit {last}" in msg and '"latch_dup_" has already been defined' in msg, msg
    assert (tmp_path / "b" / "build.log").exists()
