"""What the runtime checks around a launch, kept out of runtime.py (which calls it in a few lines).

Inputs: :func:`check_inputs` applies latch_core.inputs (the rules the arena simulator applies too),
with exact dtypes (the kernel reads the bytes) and names checked against every buffer of the build
(one layout serves all its programs). The finiteness check is opt-in (``prog.check_finite = True``
or ``LATCH_CHECK_FINITE=1``): it reads every element of every float input.

Safe updates (opt-in: ``prog.safe = True`` or ``LATCH_SAFE_UPDATES=1``): the kernel updates
parameters and optimizer state in place, so a launch that fails part-way (a spin timeout, a body
error) would leave the caller's tensors half updated. In safe mode, before each launch the buffers
that launch writes in place (its in-place outputs and copy-back targets) are copied once per update,
the launches are checked before returning, and on a failure every copied buffer is restored before
the LaunchError is raised.

Why opt-in: the copy is one device-to-device pass over params + state per update (at 200M
parameters with AdamW, ~2.4 GB read and written: about 1 ms on an H200), which the benchmark path
cannot pay. The alternatives were weighed: writing new values out of place and swapping buffers on
success doubles the memory of params + state and breaks the in-place contract codegen and the
memory plan are built on; copying only what the failing launch had already written needs per-task
write tracking in the kernel. A failure is a bug or a corrupted build (the validator proves the
schedule), so paying for protection only where it is asked for (long unattended runs, debugging) is
the trade: the default path pays nothing, and ``safe`` is one attribute away.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from latch_core import inputs as input_rules

SAFE_ENV = "LATCH_SAFE_UPDATES"


def check_inputs(prog_obj, prog: str, specs: Mapping[str, dict], given: Mapping[str, Any],
                 hyper_given: Mapping[str, Any], *, finite: bool = False, error=ValueError) -> None:
    """Raise ``error`` (the runtime's ProgramError) for the first problem with the inputs."""
    accepted = [b["name"] for b in prog_obj.buffers]  # every buffer of the build (one layout, several programs)
    try:
        input_rules.check(specs, given, exact_dtype=True, accepted=accepted, where=f"program {prog!r}", finite=finite)
        input_rules.check({}, hyper_given, exact_dtype=True, accepted=[b["name"] for b in prog_obj.buffers
                                                                       if b["role"] == "hyper"],
                          where=f"program {prog!r} (hyper-parameters)")
    except input_rules.InputError as e:
        raise error(str(e)) from None


def finite_wanted(prog_obj) -> bool:
    return bool(getattr(prog_obj, "check_finite", False)) or input_rules.finite_by_default()


def safe_wanted(prog_obj) -> bool:
    return bool(getattr(prog_obj, "safe", False)) or os.environ.get(SAFE_ENV, "") not in ("", "0")


def written_in_place(info: dict, buffers: list[dict]) -> list[str]:
    """Names of the external buffers one program's launch writes (in-place outputs, copy-back)."""
    names = [buffers[o["buffer"] - 1]["name"] for o in info["outputs"] if o.get("inplace") and o["buffer"]]
    names += [cb["old"] for cb in info.get("copy_back", ())]
    return list(dict.fromkeys(names))


class Snapshot:
    """Copies of the caller's tensors a sequence of launches overwrites, taken before the first
    launch that writes each one; ``restore`` puts them back."""

    def __init__(self):
        self.saved: dict[str, tuple[Any, Any]] = {}  # name -> (the caller's tensor, its copy)

    def save(self, prog_obj, prog: str, bound: Mapping[str, Any]) -> None:
        for name in written_in_place(prog_obj.manifest["programs"][prog], prog_obj.buffers):
            t = bound.get(name)
            if t is not None and name not in self.saved:
                self.saved[name] = (t, t.clone())

    def restore(self) -> None:
        for t, copy in self.saved.values():
            t.copy_(copy)

    def explain(self, e: Exception) -> str:
        return (f"{e}\n(safe update: the {len(self.saved)} parameter/state tensor(s) the failed update wrote in "
                "place were restored to their values before it)")
