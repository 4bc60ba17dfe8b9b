"""latch_core.inputs without torch: the shared rules on duck-typed tensors (the finiteness rule needs
real tensors: packages/latch-check/tests/test_simulator_inputs.py)."""

import pytest

from latch_core.inputs import InputError, check


class Fake:
    def __init__(self, shape, dtype, bad=()):
        self.shape, self.dtype, self.bad = tuple(shape), dtype, set(bad)


SPECS = {"w": {"role": "param", "dtype": "f32", "shape": (2, 3)}, "t": {"role": "batch", "dtype": "i64", "shape": (2,)}}


def test_good_inputs_pass():
    check(SPECS, {"w": Fake((2, 3), "torch.float32"), "t": Fake((2,), "torch.int64")}, exact_dtype=True)
    # by kind: the simulator's float64 stands for f32, an int32 for i64
    check(SPECS, {"w": Fake((2, 3), "torch.float64"), "t": Fake((2,), "torch.int32")}, exact_dtype=False)


@pytest.mark.parametrize("given,exact,message", [
    ({"w": Fake((2, 3), "torch.float32")}, True, r"batch 't' \(i64\[2\]\) is missing; the program needs it"),
    ({"w": Fake((2, 3), "torch.float32"), "t": Fake((2,), "torch.int64"), "z": Fake((1,), "torch.float32")}, True,
     r"the program takes no input named 'z'"),
    ({"w": Fake((3, 2), "torch.float32"), "t": Fake((2,), "torch.int64")}, True, r"param 'w': shape \[3, 2\]"),
    ({"w": Fake((2, 3), "torch.float64"), "t": Fake((2,), "torch.int64")}, True, r"param 'w': dtype torch.float64"),
    ({"w": Fake((2, 3), "torch.int64"), "t": Fake((2,), "torch.int64")}, False, r"a int tensor cannot stand for a float"),
    ({"w": Fake((2, 3), "torch.float32"), "t": Fake((2,), "torch.float32")}, False, r"batch 't': dtype torch.float32"),
    ({"w": [1.0], "t": Fake((2,), "torch.int64")}, False, r"param 'w': expected a torch.Tensor"),
])
def test_each_rule_names_the_input(given, exact, message):
    with pytest.raises(InputError, match=message):
        check(SPECS, given, exact_dtype=exact)
