"""Latch memory: numerical policy, recomputation, liveness, arena planning.

Passes (registered in :mod:`latch_memory.plugin`): ``memory.policy`` and ``memory.remat`` on the
graph before scheduling, ``memory.plan`` on graph + schedule after it. This package never imports
torch.
"""

from .arena import assign_offsets
from .liveness import Liveness, LivenessError
from .plan import PlanError, plan, plan_program
from .policy import DEFAULT_TABLE, PolicyError, apply_policy
from .remat import RematError, estimate, remat_program

__all__ = [
    "assign_offsets", "Liveness", "LivenessError", "PlanError", "plan",
    "plan_program", "DEFAULT_TABLE", "PolicyError", "apply_policy", "RematError", "estimate", "remat_program",
]
