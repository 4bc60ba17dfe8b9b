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
