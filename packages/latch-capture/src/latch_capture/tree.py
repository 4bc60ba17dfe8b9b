"""Nested containers of tensors <-> flat, named lists.

Names join the path with '.': a tensor at ``inputs[1]`` under prefix ``input`` is ``input.1``; a
state entry ``{"exp_avg": {"l1.weight": t}}`` is ``exp_avg.l1.weight``. Rebuilding uses the
recorded structure, never by parsing names, so keys may themselves contain dots. Non-tensor
leaves (None, numbers, strings) are static: they are passed through unchanged and are not inputs.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .errors import CaptureError

_STATIC = (type(None), bool, int, float, str)


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def flatten(obj: Any, prefix: str, what: str) -> tuple[list[tuple[str, torch.Tensor]], Callable[[list], Any]]:
    """(named tensor leaves in order, rebuild(list of new leaves) -> same structure)."""
    leaves: list[tuple[str, torch.Tensor]] = []

    def walk(o: Any, name: str) -> Callable[[list], Any]:
        if isinstance(o, torch.Tensor):
            idx = len(leaves)
            leaves.append((name or what, o))
            return lambda new: new[idx]
        if isinstance(o, dict):
            subs = []
            for k, v in o.items():
                if not isinstance(k, str):
                    raise CaptureError(f"{what} has a non-string key {k!r}", hint="use string keys in dicts of tensors")
                subs.append((k, walk(v, _join(name, k))))
            return lambda new: {k: f(new) for k, f in subs}
        if isinstance(o, (tuple, list)):
            subs2 = [walk(v, _join(name, i)) for i, v in enumerate(o)]
            kind = type(o) if type(o) in (tuple, list) else tuple
            return lambda new: kind(f(new) for f in subs2)
        if isinstance(o, _STATIC):
            return lambda new: o
        raise CaptureError(
            f"{what} contains a {type(o).__name__} at {name or what!r}",
            hint="pass tensors in (nested) dicts, tuples or lists; other leaves may only be None, numbers or strings",
        )

    rebuild = walk(obj, prefix)
    return leaves, rebuild


def check_unique(groups: dict[str, list[str]]) -> None:
    """Every flat name must be unique across params, state, batch and hyper-parameters."""
    owner: dict[str, str] = {}
    for group, names in groups.items():
        for n in names:
            if n in owner:
                raise CaptureError(
                    f"the name {n!r} is used by both {owner[n]} and {group}",
                    hint="rename the state entry, hyper-parameter or input so every tensor has its own name",
                )
            owner[n] = group
