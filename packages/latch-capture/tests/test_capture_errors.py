"""Errors a user can cause name the op, the user's source line and what to do."""

import inspect
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latch_capture import CaptureError, capture_module, tensor_update

HERE = os.path.basename(__file__)


def _line(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise AssertionError(marker)


def sgd(params, grads, state, hyper):
    return {n: p - 0.1 * grads[n] for n, p in params.items()}, state


SGD = tensor_update(sgd)


def mse(out, target):
    return ((out - target) ** 2).mean()


class Sort(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return torch.sort(h, dim=-1).values[:, :2]  # MARK-sort


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return F.dropout(self.lin(x), 0.1, training=True)  # MARK-dropout


class Split(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, counts):
        parts = torch.split(self.lin(x), counts.tolist())  # MARK-split
        return torch.cat([p * (i + 1) for i, p in enumerate(parts)])


class Mask(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return h[h > 0].sum()  # MARK-mask


class Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:  # MARK-branch
            h = h * 2
        return h


def _x():
    return torch.randn(4, 8)


def test_unsupported_op_names_op_line_and_alternative():
    with pytest.raises(CaptureError) as e:
        capture_module(Sort(), mse, _x(), torch.randn(4, 2), optimizer=SGD)
    msg = str(e.value)
    assert "aten.sort" in msg
    assert f"{HERE}:{_line(Sort.forward, 'MARK-sort')} in forward" in msg
    assert "route_order" in msg


def test_random_op_is_unsupported_with_advice():
    with pytest.raises(CaptureError) as e:
        capture_module(Dropout(), mse, _x(), torch.randn(4, 8), optimizer=SGD)
    msg = str(e.value)
    assert "unsupported op aten.bernoulli" in msg or "unsupported op aten.native_dropout" in msg
    assert f"{HERE}:{_line(Dropout.forward, 'MARK-dropout')} in forward" in msg
    assert "eval()" in msg and "seed/offset" in msg


def test_data_dependent_split_is_an_error_at_the_users_line():
    with pytest.raises(CaptureError) as e:
        capture_module(Split(), lambda o, t: o.sum(), (_x(), torch.tensor([1, 3, 4])), None, optimizer=SGD)
    msg = str(e.value)
    assert "data-dependent value read by aten._local_scalar_dense" in msg
    assert f"{HERE}:{_line(Split.forward, 'MARK-split')} in forward" in msg
    assert "static" in msg


def test_boolean_mask_indexing_is_a_data_dependent_shape():
    with pytest.raises(CaptureError) as e:
        capture_module(Mask(), lambda o, t: o, _x(), None, optimizer=SGD)
    msg = str(e.value)
    assert "data-dependent shape from aten.nonzero" in msg
    assert f"{HERE}:{_line(Mask.forward, 'MARK-mask')} in forward" in msg
    assert "torch.where" in msg


def test_python_branch_on_a_tensor_is_data_dependent():
    with pytest.raises(CaptureError) as e:
        capture_module(Branch(), mse, _x(), torch.randn(4, 8), optimizer=SGD)
    msg = str(e.value)
    assert "data-dependent value" in msg
    assert f"{HERE}:{_line(Branch.forward, 'MARK-branch')} in forward" in msg


def test_in_place_update_of_state_is_rejected():
    def init(params):
        return {"m": {n: torch.zeros_like(p) for n, p in params.items()}}

    def update(params, grads, state, hyper):
        for n in params:
            state["m"][n].mul_(0.9)
        return params, state

    with pytest.raises(CaptureError) as e:
        capture_module(nn.Linear(8, 8), mse, _x(), torch.randn(4, 8), optimizer=tensor_update(update, init_state=init))
    assert "modifies its input 'm.weight' in place" in str(e.value)
    assert "x = x * b" in str(e.value)


def test_loss_must_be_a_scalar():
    with pytest.raises(CaptureError) as e:
        capture_module(nn.Linear(8, 8), lambda o, t: (o - t).pow(2).mean(0), _x(), torch.randn(4, 8), optimizer=SGD)
    assert "loss of shape [8]" in str(e.value) and ".mean()" in str(e.value)


def test_update_must_keep_keys_and_shapes():
    def drop(params, grads, state, hyper):
        return {k: v for k, v in list(params.items())[:1]}, state

    with pytest.raises(CaptureError) as e:
        capture_module(nn.Linear(8, 8), mse, _x(), torch.randn(4, 8), optimizer=tensor_update(drop))
    assert "new_params does not match" in str(e.value) and "'bias'" in str(e.value)

    def reshape(params, grads, state, hyper):
        return {k: v.reshape(-1) for k, v in params.items()}, state

    with pytest.raises(CaptureError) as e:
        capture_module(nn.Linear(8, 8), mse, _x(), torch.randn(4, 8), optimizer=tensor_update(reshape))
    assert "new_params['weight']" in str(e.value) and "in place" in str(e.value)


def test_forward_state_must_name_parameters_or_buffers():
    def fs(params, state, hyper):
        return {"nonexistent": params["weight"]}

    with pytest.raises(CaptureError) as e:
        capture_module(nn.Linear(8, 8), mse, _x(), torch.randn(4, 8), optimizer=tensor_update(sgd, forward_state=fs))
    assert "'nonexistent'" in str(e.value) and "weight" in str(e.value)


def test_meta_buffer_without_data_is_named():
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8, device="meta")
            self.register_buffer("scale", torch.empty(8, device="meta"))

        def forward(self, x):
            return self.lin(x) * self.scale

    with pytest.raises(CaptureError) as e:
        capture_module(WithBuffer(), mse, _x(), torch.randn(4, 8), optimizer=SGD)
    assert "'scale' is on the meta device" in str(e.value) and "forward_state" in str(e.value)


def test_bad_arguments_are_named():
    with pytest.raises(CaptureError, match="optimizer is a function"):
        capture_module(nn.Linear(8, 8), mse, _x(), torch.randn(4, 8), optimizer=sgd)
    with pytest.raises(CaptureError, match="microbatches=0"):
        capture_module(nn.Linear(8, 8), mse, _x(), torch.randn(4, 8), optimizer=SGD, microbatches=0)
    with pytest.raises(CaptureError, match="objective returned a str"):
        capture_module(nn.Linear(8, 8), lambda o, t: "loss", _x(), torch.randn(4, 8), optimizer=SGD)
