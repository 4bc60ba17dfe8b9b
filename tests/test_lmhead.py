"""The LM head's cross-entropy (issue 11): memory.fuse_cross_entropy keeps the captured update
exact (FP64, against eager PyTorch), and the planned document of the full-size dense transformer
holds no FP32 tensor of the logits' size."""

import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cross_helpers import needs_nvcc, planned  # noqa: E402
from latch_core.pipeline import Request, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "transformer.py")
FULL = dict(d_model=768, layers=8, heads=12, mlp_hidden=2048, vocab=49152, batch=2, seq=1024, device="meta")


def _logit_shaped(g, shape):
    """Values of ``shape`` that are not views (at d_model 64 = N the transposed weight has it too)."""
    views = {o for n in g.nodes if n.op == "latch::permute" for o in n.outputs}
    return [v for v in g.values if tuple(v.shape) == shape and v.name not in views]


def _ops(doc):
    return [n.op for n in doc.graph.program("update").nodes]


def test_fused_update_matches_eager_pytorch_in_fp64():
    from latch_capture.examples import load_example
    from latch_check.compare import compare

    doc = run(["capture", "memory.policy", "memory.fuse_cross_entropy"], None,
              {"capture": {"example": EXAMPLE, "grads": True}})
    ops = _ops(doc)
    assert ops.count("latch::cross_entropy") == 1 and ops.count("latch::cross_entropy_backward") == 1
    assert not {"latch::log_softmax", "latch::nll_loss", "latch::nll_loss_backward"} & set(ops)
    g = doc.graph.program("update")
    N, V = 2 * 32, 256
    big = _logit_shaped(g, (N, V))
    assert [v.dtype for v in big] == ["bf16", "bf16"], [(v.name, v.dtype) for v in big]
    assert dict(dict(doc.graph.meta("memory.fuse_cross_entropy"))["fused"]) == {"update": 1}
    result = compare(load_example(EXAMPLE), doc, steps=2)
    assert result.passed, result.format()


def test_without_policy_the_logits_stay_f32_but_log_softmax_goes():
    doc = run(["capture", "memory.fuse_cross_entropy"], None, {"capture": {"example": EXAMPLE, "grads": True}})
    g = doc.graph.program("update")
    ce = [n for n in g.nodes if n.op == "latch::cross_entropy"]
    assert len(ce) == 1 and g.value(ce[0].inputs[0]).dtype == "f32"
    assert [v.dtype for v in _logit_shaped(g, (64, 256))] == ["f32", "f32"]  # logits and dlogits


def test_request_switch_leaves_the_pass_out():
    assert "memory.fuse_cross_entropy" in Request(example=EXAMPLE).passes()
    assert "memory.fuse_cross_entropy" not in Request(example=EXAMPLE, fuse_cross_entropy=False).passes()


@pytest.mark.slow
def test_full_size_dense_transformer_plan_holds_no_f32_logits(capsys):
    doc = planned(Request(example=EXAMPLE, overrides=FULL, build=False))  # test_weight_copies plans it too
    g = doc.graph.program("update")
    n_logits = FULL["batch"] * FULL["seq"] * FULL["vocab"]
    big = [v for v in g.values if math.prod(v.shape) >= n_logits]
    placed = {p.value for p in doc.memory.program("update").placements}
    assert sorted(v.dtype for v in big) == ["bf16", "bf16"], [(v.name, v.dtype) for v in big]
    assert all(v.name in placed for v in big)  # the two BF16 matrices are real arena tensors
    assert not [p for p in doc.memory.program("update").placements
                if p.nbytes >= 4 * n_logits], "an arena placement of the FP32 logits' size"
    s = doc.schedule.program("update")
    phases = len({t.phase for t in s.tasks} - {-1})
    with capsys.disabled():
        print(f"\nfull-size dense transformer plan: {len(s.tasks)} tasks, {len(s.groups)} groups, {phases} phases, "
              f"{s.num_barriers} barriers, arena {doc.memory.arena_bytes / 1e9:.2f} GB, "
              f"logit-sized tensors: {[(v.name, v.dtype) for v in big]}")
    assert phases > 0 and s.num_barriers > 0


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("policy", [True, False])
def test_bodies_compile_for_sm90a_and_use_no_atomics(tmp_path, policy):
    """The two cross-entropy bodies (BF16 vector path with the policy, scalar f32 path without) and
    the embedding backward (no float atomics) in a real nvcc build."""
    from latch_check.pipeline import compile_example

    c = compile_example(ROOT / "examples" / "lmhead.py", overrides={"vocab": 1000}, policy=policy,
                        build_dir=tmp_path / "lm", cache=False)
    src = "".join(p.read_text() for p in sorted((tmp_path / "lm" / "src").glob("unit_*.cu")))
    dt = "__nv_bfloat16" if policy else "float"
    assert f"latch::cross_entropy_row<{dt}, long long, float, float>" in src
    assert f"latch::cross_entropy_grad_tile<{dt}, long long, float, {dt}, float>" in src
    assert (tmp_path / "lm" / "program.so").is_file()
    if policy:  # the embedding backward's generated source (the full build's nvcc run is the one above)
        from latch_codegen_h100 import generate

        t = compile_example(EXAMPLE, build=False)
        units = "".join(u.source for u in generate(t.doc).units[1:])
        body = units[units.index("// latch::embedding_backward("):]
        body = body[:body.index("\n}\n")]
        assert "atomic" not in body and "latch::st<float>" in body
