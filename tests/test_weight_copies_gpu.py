"""On the H200 (marked gpu): BF16 weight copies kept as state (memory.weight_copies) against the same
program without them (``--no-weight-copies``: every update casts every weight again).

Two updates from the same weights and batches: every output and every layout tensor the two builds
share agrees (expected bit for bit: the forward reads the same BF16 bits, ``__floats2bfloat162_rn``
in the AdamW body as in the cast body, torch's ``.to(bfloat16)`` for the first copy; the test accepts
the BF16 gate of the group and prints how many tensors are bit-identical), and after each update
every copy is exactly ``new_param.to(torch.bfloat16)``. Microbatches: the copy is read by each
``accumulate`` run and written once by ``accumulate_and_update``. The runtime's own entry points
(``random_inputs``, ``initial_copies``, a missing copy named) too.

    python -m pytest -q -m gpu tests/test_weight_copies_gpu.py -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SMALL_MOE = dict(vocab=256, d_model=64, layers=2, heads=4, experts=4, expert_hidden=32, seq=32, device="cpu")
CASES = {
    "transformer": ("transformer.py", {}),
    "tinymoe": ("tinymoe.py", SMALL_MOE),
    "mlp_k2": ("mlp.py", {"microbatches": 2}),
}


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _runs(tmp_path, case):
    from latch_check.gpu import GpuRun
    from latch_check.pipeline import compile_example

    path, over = CASES[case]
    out = {}
    for copies in (True, False):
        c = compile_example(EXAMPLES / path, overrides=over, build_dir=tmp_path / f"b{int(copies)}", cache=False,
                            weight_copies=copies)
        out[copies] = (c, GpuRun(c.example, c.build_dir))
    return out


def _kind(name: str) -> str:
    return ("grad" if name.startswith("grad.") else "metric" if name.startswith("metric.")
            else "loss" if name == "loss" else "new_state")


@pytest.mark.parametrize("case", list(CASES))
def test_two_updates_with_copies_match_two_without(tmp_path, case, capsys):
    from latch_capture import weight_copies
    from latch_check.gates import rel_l2
    from latch_check.gpu import GATES_BF16

    runs = _runs(tmp_path, case)
    (c1, r1), (c0, r0) = runs[True], runs[False]
    copies = weight_copies(c1.doc)
    assert copies and not weight_copies(c0.doc)
    for c, p in copies.items():  # before the first update: cast(p), as the cast task would write it
        assert torch.equal(r1.layout[c], r1.layout[p].to(torch.bfloat16)), c
    roles = {v.name: v.role for v in c0.doc.graph.layout}
    same = total = 0
    for step in range(2):
        batches = r1.batches(step)
        o1, o0 = r1.update(batches), r0.update(batches)
        pairs = [(n, o1[n], o0[n]) for n in o0 if n in o1] + [(n, r1.layout[n], t) for n, t in r0.layout.items()]
        for name, a, b in pairs:
            total += 1
            if torch.equal(a, b):
                same += 1
                continue
            kind = {"param": "new_params", "state": "new_state"}.get(roles.get(name, ""), _kind(name))
            err = rel_l2(a, b)
            assert err <= GATES_BF16.get(kind, GATES_BF16["new_state"]), (step, name, err)
        for c, p in copies.items():  # written by the update, bit for bit the rounding of the new weight
            assert torch.equal(r1.layout[c], r1.layout[p].to(torch.bfloat16)), (step, c)
    with capsys.disabled():
        print(f"\nweight copies {case}: {len(copies)} copies; {same} of {total} tensors bit-identical over 2 updates "
              f"with and without copies")


def test_gpu_gates_pass_with_copies(tmp_path):
    from latch_check.gpu import gpu_compare
    from latch_check.pipeline import compile_example

    c = compile_example(EXAMPLES / "transformer.py", build_dir=tmp_path / "b", cache=False)
    r = gpu_compare(c.example, c.build_dir, steps=2)
    assert r.passed, r.format()
    assert "weight_copies" in {g.group for t in r.tables for g in t.gates}


def test_runtime_creates_and_carries_the_copies(tmp_path):
    from latch_check.pipeline import compile_example
    from latch_codegen_h100 import Program
    from latch_codegen_h100.runtime import ProgramError, random_inputs

    c = compile_example(EXAMPLES / "transformer.py", build_dir=tmp_path / "b", cache=False)
    prog = Program.load(c.build_dir)
    assert prog.weight_copies
    data = random_inputs(prog, seed=1)
    for step in range(2):
        prog(data["params"], data["state"], data["batch"], data.get("hyper"))
        for cname, p in prog.weight_copies.items():
            assert torch.equal(data["state"][cname], data["params"][p].to(torch.bfloat16)), (step, cname)
    state = {k: v for k, v in data["state"].items() if k not in prog.weight_copies}
    with pytest.raises(ProgramError, match="initial_copies"):
        prog(data["params"], state, data["batch"], data.get("hyper"))
    state.update(prog.initial_copies(data["params"]))
    prog(data["params"], state, data["batch"], data.get("hyper"))
