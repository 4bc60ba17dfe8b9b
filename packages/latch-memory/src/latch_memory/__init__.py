"""Latch memory: numerical policy, recomputation, liveness, arena planning.

Passes (registered in :mod:`latch_memory.plugin`): ``memory.policy`` and ``memory.remat`` on the
graph before scheduling, ``memory.plan`` on graph + schedule after it. This package never imports
torch. The names below load on first use, so the plugin module stays cheap.
"""

_LAZY = {
    "assign_offsets": "arena", "Liveness": "liveness", "LivenessError": "liveness", "PlanError": "plan",
    "plan": "plan", "plan_program": "plan", "DEFAULT_TABLE": "policy", "PolicyError": "policy",
    "apply_policy": "policy", "RematError": "remat", "estimate": "remat", "remat_program": "remat",
}

__all__ = sorted(_LAZY)

# ``plan`` names both a submodule and its function: importing the submodule (as anything may, at
# any time) would set the package attribute to the module, so the function is bound eagerly here.
from .plan import plan  # noqa: E402

del _LAZY["plan"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'latch_memory' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
