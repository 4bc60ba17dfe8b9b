"""Models nobody here wrote: transformers' GPT-2, Llama and Mixtral (examples/hf_*.py, tiny configs,
the models unchanged, their own ``labels=`` loss, ``use_cache=False``, the library's default sdpa
attention and default experts implementation), each captured, checked against eager PyTorch in
FP64 over two updates, and run on the CPU arena simulator (schedule + memory plan) against the
FP64 interpreter. Every node names the model's own file and line, never a Latch frame."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("latch_schedule")
pytest.importorskip("latch_memory")

from latch_capture import load_example  # noqa: E402
from latch_capture.errors import CaptureError  # noqa: E402
from latch_check.compare import compare  # noqa: E402
from latch_check.simulator import check_example, prepare  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODELS = {"hf_gpt2": "modeling_gpt2.py", "hf_llama": "modeling_llama.py", "hf_mixtral": "modeling_mixtral.py"}


@pytest.fixture(scope="module", params=sorted(MODELS))
def captured(request):
    ex = load_example(EXAMPLES / f"{request.param}.py")
    return request.param, ex, ex.capture(grads=True)


def test_capture_check_and_simulate(captured):
    name, ex, doc = captured
    nodes = doc.graph.program("update").nodes
    ops = {n.op for n in nodes}
    sdpa = [n for n in nodes if n.op == "latch::sdpa"]
    assert sdpa and all(n.attr_dict["causal"] is True for n in sdpa), "transformers' causal mask is recognised"
    if name == "hf_mixtral":
        assert {"latch::route_order", "latch::ragged_mm", "latch::token_topk"} <= ops
    # source lines: the model's file (in site-packages) or the example's, never Latch's own
    assert all(n.source for n in nodes)
    assert not [n.source for n in nodes if "latch_" in n.source or "packages/latch-" in n.source]
    assert any(MODELS[name] in n.source for n in nodes)
    result = compare(ex, doc, steps=2)
    assert result.passed, result.format()
    sim = check_example(ex, prepare(doc), steps=1)
    assert sim.passed, sim.format()


def test_mixtral_batched_mm_experts_check():
    ex = load_example(EXAMPLES / "hf_mixtral.py", experts_impl="batched_mm", layers=1)
    result = compare(ex, ex.capture(grads=True), steps=1)
    assert result.passed, result.format()


def test_mixtral_eager_experts_loop_is_refused_naming_the_switch():
    from latch_check.pipeline import compile_example

    with pytest.raises(CaptureError) as e:
        compile_example(EXAMPLES / "hf_mixtral.py", overrides={"experts_impl": "eager", "layers": 1}, build=False)
    msg = str(e.value)
    assert 'experts_implementation="grouped_mm"' in msg and "batched_mm" in msg
    assert "modeling_mixtral.py:" in msg and "pipeline.py" not in msg and "latch_" not in msg


def test_a_padding_mask_from_the_batch_is_refused_with_the_way_out():
    ex = load_example(EXAMPLES / "hf_llama.py", layers=1)
    ex.inputs = dict(ex.inputs, attention_mask=torch.ones(ex.inputs["input_ids"].shape, dtype=torch.long))
    with pytest.raises(CaptureError) as e:
        ex.capture()
    msg = str(e.value)
    assert "masking_utils.py:" in msg and "drop attention_mask" in msg
