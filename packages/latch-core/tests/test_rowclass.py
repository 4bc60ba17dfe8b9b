"""The row-group value classes (latch_core.rowclass): one classifier for scheduler and code generator."""

from latch_core.rowclass import FULL, ROWVEC, SCALAR, STAT, value_class


def test_value_classes_of_an_rmsnorm_row_group():
    rows, R = 2 * 1024, 768
    assert value_class((2, 1024, 768), rows, R) == FULL       # x, y, dy
    assert value_class((2048, 768), rows, R) == FULL          # the same rows, flattened
    assert value_class((768,), rows, R) == ROWVEC             # the weight
    assert value_class((2, 1024, 1), rows, R) == STAT         # mean, rsqrt
    assert value_class((), rows, R) == SCALAR
    assert value_class((1,), rows, R) == SCALAR


def test_values_the_row_body_cannot_address_have_no_class():
    rows, R = 2048, 768
    assert value_class((768, 2048), rows, R) is None          # the rows' count but transposed
    assert value_class((2048, 384), rows, R) is None          # half rows
    assert value_class((1024, 1), rows, R) is None            # a statistic of other rows
