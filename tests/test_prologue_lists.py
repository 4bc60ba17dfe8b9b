"""The scheduler fuses elementwise prologues into exactly the reductions whose code generator
takes one (latch_schedule.fusion and latch_codegen_h100.lower_reduce list them separately, since
neither package imports the other)."""

from latch_codegen_h100.lower_reduce import PROLOGUE_REDUCTIONS as generated
from latch_schedule.fusion import PROLOGUE_REDUCTIONS as fused


def test_the_two_lists_agree():
    assert fused == generated
