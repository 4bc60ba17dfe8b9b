"""On the H200 (marked gpu): the LM head's cross-entropy bodies and the deterministic embedding
backward inside the persistent kernel, against the FP64 reference."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.parametrize("over", [dict(tokens=256, d_model=128, vocab=4096, ignore_every=5),
                                  dict(tokens=100, d_model=64, vocab=1003)])  # odd V: the scalar paths
def test_lmhead_gates_on_gpu(tmp_path, over):
    from latch_check.gpu import gpu_compare
    from latch_check.pipeline import compile_example

    c = compile_example(ROOT / "examples" / "lmhead.py", overrides=over, build_dir=tmp_path / "b", cache=False)
    ops = [n.op for n in c.doc.graph.program("update").nodes]
    assert "latch::cross_entropy" in ops and "latch::cross_entropy_backward" in ops
    r = gpu_compare(c.example, c.build_dir, steps=2)
    assert r.passed, r.format()


def test_embedding_backward_same_bits_every_run(tmp_path):
    from latch_check.gpu import GpuRun
    from latch_check.pipeline import compile_example

    c = compile_example(ROOT / "examples" / "transformer.py", build_dir=tmp_path / "b", cache=False)
    run = GpuRun(c.example, c.build_dir)
    start = {n: t.clone() for n, t in run.layout.items()}
    batch = run.gpu_batch(run.batches(0)[0])
    grads = []
    for _ in range(3):
        layout = {n: t.clone() for n, t in start.items()}
        out = run.prog.run(layout, layout, batch, run.hyper)
        grads.append(out["grad.embed.weight"].clone())
    assert all(torch.equal(grads[0], g) for g in grads[1:])
