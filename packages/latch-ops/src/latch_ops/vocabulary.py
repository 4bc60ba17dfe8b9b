"""The core vocabulary: every OpSpec latch-ops defines outside the custom-op modules, in one list.

``latch_ops.plugin`` registers :data:`SPECS` (plus ``latch_ops.attention.SPECS`` when that module is
present); the MoE ops register through their own entry point (``latch_ops.moe.plugin``).
"""

from __future__ import annotations

from latch_core.registry import OpSpec

from . import cross_entropy, elementwise, indexing, matmul, nn, reduction, views

SPECS: list[OpSpec] = [
    *elementwise.SPECS, *reduction.SPECS, *matmul.SPECS, *views.SPECS, *indexing.SPECS, *nn.SPECS,
    *cross_entropy.SPECS,
]


def _check_unique() -> None:
    seen: set[str] = set()
    for s in SPECS:
        if s.name in seen:
            raise RuntimeError(f"latch-ops defines {s.name!r} twice")
        seen.add(s.name)


_check_unique()
