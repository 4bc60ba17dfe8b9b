"""Body configurations: the ways a backend's op body can run, for the scheduler to choose from.

A backend registers, per op, a function that lists the configurations its body supports for one
node (``latch_register_configs``: ``register(op_name, fn)``, one function per op; a second
registration for the same op is refused naming both registrants)::

    fn(in_types: list[TensorType | None], out_types: list[TensorType], attrs: dict) -> list[BodyConfig]

The scheduler (``latch_schedule.matmul_configs``) prices each legal configuration with its cost
model, records the winner's ``name`` on the node (attribute ``config``), and tiles the node with
the winner's ``tile``; code generation looks the name up again to instantiate that body. The
function must therefore be deterministic, and a configuration's name must identify it among the
ones returned for that node. An empty list means "no configuration": the scheduler keeps its
own tile rule and records nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs

from .ir import TensorType

KINDS = ("wgmma", "simt")

ConfigFn = Callable[[Sequence[TensorType | None], Sequence[TensorType], dict], list["BodyConfig"]]


class ConfigError(ValueError):
    """A registered configuration function misbehaved, or a recorded configuration is unknown."""


def _positive(inst, attribute, value):
    if not value or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value):
        raise ConfigError(f"BodyConfig {inst.name!r}: {attribute.name} must be positive ints, got {value!r}")


@attrs.frozen
class BodyConfig:
    """One way to run an op body.

    ``tile``: extents of the output's last dims one task computes (``(BM, BN)`` for a matmul);
    ``k_tile``: the contraction step one pipeline stage holds; ``stage_bytes``: shared memory of one
    stage; ``kind``: ``"wgmma"`` (tensor cores, TMA-fed) or ``"simt"`` (CUDA cores)."""

    name: str
    tile: tuple[int, ...] = attrs.field(converter=tuple, validator=_positive)
    k_tile: int
    stage_bytes: int
    kind: str
    notes: str = ""

    def __attrs_post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"BodyConfig: name must be a non-empty string, got {self.name!r}")
        if self.kind not in KINDS:
            raise ConfigError(f"BodyConfig {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        for key in ("k_tile", "stage_bytes"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (key == "k_tile" and v == 0):
                raise ConfigError(f"BodyConfig {self.name!r}: {key} must be a {'positive' if key == 'k_tile' else 'non-negative'} int, got {v!r}")


def _registry(registry):
    if registry is not None:
        return registry
    from .plugins import registries

    return registries().configs


def configs_for(op: str, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType],
                attrs_: dict[str, Any], registry=None) -> list[BodyConfig]:
    """The configurations registered for ``op`` that fit this node (``[]`` when none are registered).

    ``registry``: a configs registry (default: the installed plugins')."""
    reg = _registry(registry)
    if op not in reg:
        return []
    fn = reg.get(op)
    got = fn(list(in_types), list(out_types), dict(attrs_))
    if not isinstance(got, (list, tuple)) or not all(isinstance(c, BodyConfig) for c in got):
        raise ConfigError(f"configurations of {op} (registered by {reg.owner(op)!r}) must be a list of "
                          f"latch_core.configs.BodyConfig, got {got!r}")
    names = [c.name for c in got]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"configurations of {op} (registered by {reg.owner(op)!r}) repeat the names {dup}")
    return list(got)


def find_config(op: str, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType],
                attrs_: dict[str, Any], name: str, registry=None) -> BodyConfig:
    """The configuration ``name`` among those registered for this node; ConfigError naming the op,
    the configuration and the ones that fit when it is not there (a document scheduled with other
    plugins installed, or a node changed after scheduling)."""
    cands = configs_for(op, in_types, out_types, attrs_, registry)
    for c in cands:
        if c.name == name:
            return c
    shapes = ", ".join(str(t) for t in in_types if t is not None)
    known = ", ".join(c.name for c in cands) or "(none registered)"
    raise ConfigError(f"{op}({shapes}) records body configuration {name!r}, which the installed plugins do not "
                      f"offer for it (they offer: {known}); re-run the schedule pass with these plugins")
