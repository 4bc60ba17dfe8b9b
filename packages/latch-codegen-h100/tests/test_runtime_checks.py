"""Runtime argument checks that need no GPU: every message names the tensor and what is wrong."""

from __future__ import annotations

import pytest
import torch

from latch_codegen_h100.runtime import ProgramError, _as_mapping, check_tensor

SPEC = {"name": "w1", "role": "param", "shape": [4, 8], "dtype": "f32"}
CUDA0 = torch.device("cuda", 0)


def test_shape_dtype_contiguity_and_device_are_checked_by_name():
    with pytest.raises(ProgramError, match=r"param 'w1': shape \[8, 4\], the program was built for f32\[4, 8\]"):
        check_tensor("w1", torch.zeros(8, 4), SPEC, CUDA0)
    with pytest.raises(ProgramError, match=r"param 'w1': dtype torch.float64, .* f32\[4, 8\]"):
        check_tensor("w1", torch.zeros(4, 8, dtype=torch.float64), SPEC, CUDA0)
    with pytest.raises(ProgramError, match=r"param 'w1': not contiguous \(strides \(1, 4\)\)"):
        check_tensor("w1", torch.zeros(8, 4).t(), SPEC, CUDA0)
    with pytest.raises(ProgramError, match=r"param 'w1': on cpu, the program runs on cuda:0; move it"):
        check_tensor("w1", torch.zeros(4, 8), SPEC, CUDA0)
    with pytest.raises(ProgramError, match=r"param 'w1': expected a torch.Tensor"):
        check_tensor("w1", [[0.0] * 8] * 4, SPEC, CUDA0)
    t = torch.zeros(4, 8)
    assert check_tensor("w1", t, SPEC, torch.device("cpu")) is t


def test_inputs_by_name_or_in_program_order():
    a, b = torch.zeros(1), torch.ones(1)
    assert _as_mapping({"x": a}, ["x"], "batch") == {"x": a}
    assert _as_mapping([a, b], ["x", "y"], "batch") == {"x": a, "y": b}
    with pytest.raises(ProgramError, match=r"batch: got 1 tensors, the program takes 2 \(x, y\)"):
        _as_mapping([a], ["x", "y"], "batch")
    with pytest.raises(ProgramError, match=r"params: expected a dict of tensors by name"):
        _as_mapping(a, ["x"], "params")


def _bare_program(device="cpu"):
    """A Program's binding state without a library or a GPU (binding is pure Python)."""
    from latch_codegen_h100.runtime import Program

    p = Program.__new__(Program)
    p.device = torch.device(device)
    p.manifest = {"programs": {"update": {"inputs": {"params": ["w"], "batch": ["x"], "hyper": ["lr"]}}}}
    p.buffers = [{"name": "w", "role": "param", "shape": [2], "dtype": "f32"},
                 {"name": "x", "role": "batch", "shape": [3], "dtype": "f32"},
                 {"name": "lr", "role": "hyper", "shape": [], "dtype": "f32"}]
    p._hyper_buffers = [p.buffers[2]]
    p._reset_bindings()
    p.hyper_defaults = {"lr": 0.1}
    return p


def test_binding_is_checked_once_per_set_of_tensors_and_rechecked_when_they_change():
    p = _bare_program()
    w, x = torch.zeros(2), torch.zeros(3)
    b1 = p._bind("update", {"w": w}, {}, {"x": x}, None)
    assert b1["w"] is w and b1["x"] is x and abs(b1["lr"].item() - 0.1) < 1e-7
    b2 = p._bind("update", {"w": w}, {}, {"x": x}, {"lr": 0.5})
    assert b2["w"] is w and b2["lr"].item() == 0.5
    with pytest.raises(ProgramError, match=r"batch 'x': shape \[4\]"):
        p._bind("update", {"w": w}, {}, {"x": torch.zeros(4)}, None)
    with pytest.raises(ProgramError, match=r"param 'w' \(f32\[2\]\) is missing"):
        p._bind("update", {}, {}, {"x": x}, None)
    del p.hyper_defaults["lr"]
    with pytest.raises(ProgramError, match=r"hyper-parameter 'lr' not given"):
        p._bind("update", {"w": w}, {}, {"x": x}, None)


def test_a_binding_is_reused_for_the_same_tensors_and_made_anew_when_one_changes():
    """The launch path's cache: the same tensors give the same binding (no checks, no new pointer
    table); another tensor, or the same tensor object with new storage (``.data = ...``), binds anew;
    two sets of tensors used in turn (double-buffered batches) both stay cached."""
    p = _bare_program()
    w, x, x2 = torch.zeros(2), torch.zeros(3), torch.ones(3)
    b1 = p._binding("update", {"w": w}, {}, {"x": x}, None)
    assert p._binding("update", {"w": w}, {}, {"x": x}, None) is b1
    b2 = p._binding("update", {"w": w}, {}, {"x": x2}, None)
    assert b2 is not b1 and b2.bound["x"] is x2
    assert p._binding("update", {"w": w}, {}, {"x": x}, None) is b1  # both kept
    w.data = torch.full((2,), 3.0)  # same object, new storage: must not reuse the old pointers
    b3 = p._binding("update", {"w": w}, {}, {"x": x}, None)
    assert b3 is not b1 and b3.bound["w"].data_ptr() == w.data_ptr()
    with pytest.raises(ProgramError, match=r"batch 'x': expected a torch.Tensor"):
        p._binding("update", {"w": w}, {}, {"x": [0.0, 0.0, 0.0]}, None)
    for i in range(20):  # a bounded cache
        p._binding("update", {"w": w}, {}, {"x": torch.zeros(3)}, None)
    from latch_codegen_h100.runtime import BINDINGS_KEPT
    assert len(p._bindings["update"]) == BINDINGS_KEPT


def test_a_changing_hyper_parameter_is_rewritten_in_place():
    """A learning-rate schedule: a new value is written into the same device tensor, so the pointer
    table and its tensor maps stay valid and the binding is reused."""
    p = _bare_program()
    w, x = torch.zeros(2), torch.zeros(3)
    b1 = p._binding("update", {"w": w}, {}, {"x": x}, {"lr": 0.1})
    t = b1.bound["lr"]
    for lr in (0.2, 0.05, 1, True):
        b = p._binding("update", {"w": w}, {}, {"x": x}, {"lr": lr})
        assert b is b1 and b.bound["lr"] is t and t.item() == pytest.approx(float(lr))
    own = torch.tensor(0.7)  # the caller's tensor is bound as it is (its own address)
    b4 = p._binding("update", {"w": w}, {}, {"x": x}, {"lr": own})
    assert b4 is not b1 and b4.bound["lr"] is own
