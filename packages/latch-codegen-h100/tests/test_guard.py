"""guard.py on the CPU: which buffers a launch writes in place, and a snapshot restores exactly them
(the GPU test forcing a failed launch: test_gpu_safe.py)."""

import pytest

torch = pytest.importorskip("torch")

from latch_codegen_h100 import guard  # noqa: E402


class FakeProgram:
    buffers = [{"name": "w", "role": "param"}, {"name": "m", "role": "state"}, {"name": "x", "role": "batch"}]
    manifest = {"programs": {
        "accumulate": {"outputs": [{"buffer": 2, "inplace": True}, {"buffer": 0, "inplace": False}], "copy_back": []},
        "accumulate_and_update": {"outputs": [{"buffer": 1, "inplace": True}], "copy_back": [{"old": "m"}]},
    }}


def test_written_in_place_names_inplace_outputs_and_copy_back_targets():
    p = FakeProgram()
    assert guard.written_in_place(p.manifest["programs"]["accumulate"], p.buffers) == ["m"]
    assert guard.written_in_place(p.manifest["programs"]["accumulate_and_update"], p.buffers) == ["w", "m"]


def test_a_snapshot_is_taken_before_the_first_write_and_restores_it():
    p = FakeProgram()
    w, m, x = torch.ones(3), torch.zeros(3), torch.arange(3.0)
    bound = {"w": w, "m": m, "x": x}
    snap = guard.Snapshot()
    snap.save(p, "accumulate", bound)
    m += 5  # the first launch writes m
    snap.save(p, "accumulate_and_update", bound)  # m already saved: its value before the update is kept
    w -= 1
    snap.restore()
    assert torch.equal(w, torch.ones(3)) and torch.equal(m, torch.zeros(3)) and torch.equal(x, torch.arange(3.0))
    assert "restored" in snap.explain(RuntimeError("spin timeout"))


def test_safe_mode_is_opt_in(monkeypatch):
    p = FakeProgram()
    monkeypatch.delenv(guard.SAFE_ENV, raising=False)
    assert not guard.safe_wanted(p)
    p.safe = True
    assert guard.safe_wanted(p)
    q = FakeProgram()
    monkeypatch.setenv(guard.SAFE_ENV, "1")
    assert guard.safe_wanted(q)


def _bare_program():
    """A Program's binding state without a library or a GPU (as test_runtime_checks.py builds it)."""
    from latch_codegen_h100.runtime import Program

    p = Program.__new__(Program)
    p.device = torch.device("cpu")
    p.manifest = {"programs": {"update": {"inputs": {"params": ["w"], "batch": ["x"], "hyper": ["lr"]}}}}
    p.buffers = [{"name": "w", "role": "param", "shape": [2], "dtype": "f32"},
                 {"name": "x", "role": "batch", "shape": [3], "dtype": "f32"},
                 {"name": "lr", "role": "hyper", "shape": [], "dtype": "f32"}]
    p._hyper_buffers = [p.buffers[2]]
    p._reset_bindings()
    p.hyper_defaults = {"lr": 0.1}
    return p


def test_the_runtime_binds_through_the_shared_input_checks(monkeypatch):
    from latch_codegen_h100.runtime import ProgramError

    monkeypatch.delenv("LATCH_CHECK_FINITE", raising=False)
    p = _bare_program()
    w, x = torch.zeros(2), torch.zeros(3)
    with pytest.raises(ProgramError, match=r"program 'update' takes no input named 'y'"):
        p._bind("update", {"w": w}, {}, {"x": x, "y": x}, None)
    with pytest.raises(ProgramError, match=r"takes no input named 'beta'"):
        p._bind("update", {"w": w}, {}, {"x": x}, {"beta": 1.0})
    with pytest.raises(ProgramError, match=r"batch 'x': dtype torch.int64, the program was built for f32\[3\]"):
        p._bind("update", {"w": w}, {}, {"x": x.long()}, None)
    bad = torch.tensor([0.0, float("inf"), 1.0])
    p._bind("update", {"w": w}, {}, {"x": bad}, None)  # opt-in: off by default
    p.check_finite = True
    with pytest.raises(ProgramError, match=r"batch 'x' holds 1 non-finite element\(s\) \(the first at index \[1\]: inf\)"):
        p._bind("update", {"w": w}, {}, {"x": bad}, None)  # also on the cached fast path
