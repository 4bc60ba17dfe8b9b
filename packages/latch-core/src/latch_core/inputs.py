"""Run-time input checks, shared by the arena simulator (latch_check.simulator) and the GPU runtime
(latch_codegen_h100.runtime): one set of rules and one wording, whatever runs the program.

``check(specs, given, ...)`` raises :class:`InputError` naming the first problem:
- a name the program does not take (``accepted``: the program's inputs, or for the runtime every
  buffer of the build, since one layout serves several programs);
- a missing input;
- not a tensor, or a shape other than the declared one;
- a dtype other than the declared one: exactly (``exact_dtype``: the GPU reads the bytes) or of the
  same kind (the simulator computes in float64, so any float tensor may stand for an f32 value, but
  an integer tensor for a float input or a float tensor for integer targets, 3.7 read as 3, is an
  error);
- with ``finite=True`` (opt-in: it reads every element), a NaN or infinity in a float input, naming
  the first such tensor, how many elements and the first index.

Torch-free (latch-core never imports torch): tensors are duck-typed (``.shape``, ``.dtype``,
``.isfinite()``), dtypes compared by their torch names.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from .errors import UserError

# Latch dtype -> torch dtype name
TORCH_NAMES = {
    "f64": "torch.float64", "f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16",
    "i64": "torch.int64", "i32": "torch.int32", "i16": "torch.int16", "i8": "torch.int8", "u8": "torch.uint8",
    "bool": "torch.bool",
}
FLOAT = {"torch.float64", "torch.float32", "torch.bfloat16", "torch.float16"}
INT = {"torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8"}
FINITE_ENV = "LATCH_CHECK_FINITE"


class InputError(UserError, ValueError):
    """A program cannot run with the inputs it was given; the message names the input."""


def _kind(name: str) -> str:
    return "float" if name in FLOAT else "int" if name in INT else "bool" if name == "torch.bool" else name


def finite_by_default() -> bool:
    """The opt-in finiteness check, switched on for every run by ``LATCH_CHECK_FINITE=1``."""
    return os.environ.get(FINITE_ENV, "") not in ("", "0")


def check(specs: Mapping[str, Mapping[str, Any]], given: Mapping[str, Any], *, exact_dtype: bool,
          accepted: Iterable[str] | None = None, where: str = "the program", finite: bool = False) -> None:
    """``specs``: name -> {"role", "dtype" (Latch), "shape"} of every input the run needs, in order."""
    ok_names = set(specs) if accepted is None else set(accepted)
    extra = [n for n in given if n not in ok_names]
    if extra:
        raise InputError(f"{where} takes no input named {', '.join(repr(n) for n in extra[:5])}"
                         f"{' (and more)' if len(extra) > 5 else ''}; its inputs are "
                         f"{', '.join(sorted(ok_names)[:12])}{' ...' if len(ok_names) > 12 else ''}")
    for name, spec in specs.items():
        role = spec.get("role", "tensor")
        want = f"{spec['dtype']}{list(spec['shape'])}"
        if name not in given:
            raise InputError(f"{role} {name!r} ({want}) is missing; {where} needs it")
        t = given[name]
        what = f"{role} {name!r}"
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            raise InputError(f"{what}: expected a torch.Tensor ({want}), got {type(t).__name__}")
        if tuple(t.shape) != tuple(spec["shape"]):
            raise InputError(f"{what}: shape {list(t.shape)}, the program was built for {want}")
        have, need = str(t.dtype), TORCH_NAMES.get(spec["dtype"], spec["dtype"])
        if have != need and (exact_dtype or _kind(have) != _kind(need)):
            raise InputError(f"{what}: dtype {have}, the program was built for {want} ({need})"
                             + ("" if exact_dtype else f": a {_kind(have)} tensor cannot stand for a {_kind(need)} value"))
    if finite:
        require_finite(specs, given)


def require_finite(specs: Mapping[str, Mapping[str, Any]], given: Mapping[str, Any]) -> None:
    """Raise naming the first float input (in ``specs`` order) holding a NaN or an infinity."""
    for name, spec in specs.items():
        t = given.get(name)
        if t is None or str(getattr(t, "dtype", "")) not in FLOAT:
            continue
        bad = ~t.isfinite()
        if bool(bad.any()):
            count = int(bad.sum())
            first = [int(i) for i in bad.nonzero()[0].tolist()] if len(tuple(t.shape)) else []
            value = t[tuple(first)] if first else t
            raise InputError(f"{spec.get('role', 'tensor')} {name!r} holds {count} non-finite element(s) (the first "
                             f"at index {first}: {float(value)}); the update would carry it into the new parameters")
