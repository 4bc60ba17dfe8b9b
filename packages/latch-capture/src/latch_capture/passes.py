"""The ``capture`` pass: the first stage of ``latch_core.pipeline``, an example file -> graph section.

    capture(doc, example="examples/mlp.py", overrides={}, grads=True, routing="auto",
            microbatches=None, cache=True, progress=None)

It starts a document: the input must have no graph section (its provenance is kept). ``example``
is a file defining ``build(**overrides)`` (``latch_capture.examples``); ``grads`` adds the
gradients as outputs, ``routing`` the routing decisions ("auto": exactly when the update routes),
``microbatches`` overrides the example's K. The result is cached (``latch_capture.cache``): an
unchanged example with unchanged options is read back, not traced (provenance detail ``cached``).
Importing this module imports no torch; a miss imports it.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import attrs

from latch_core.document import Document, dumps, load
from latch_core.passes import Pass

_LOWERED = re.compile(r"(\d+)/(\d+) torch nodes")


def _capture(doc: Document, example: str | None = None, overrides: Mapping[str, Any] | None = None,
             grads: bool = True, routing: bool | str = "auto", microbatches: int | None = None, cache: bool = True,
             progress: Callable[[str], None] | None = None):
    from pathlib import Path

    from latch_core import progress as bars

    from . import cache as _cache
    from .errors import CaptureError

    if not example:
        raise CaptureError("the capture pass needs the option example=PATH (the file defining build())",
                           hint="latch-pipeline passes -o out.latch.json capture -O capture.example=examples/mlp.py")
    if doc.graph is not None:
        raise CaptureError("the capture pass starts a document, but the one given already has a graph section",
                           hint="run capture on an empty document (latch-pipeline passes without -i)")
    if not Path(example).is_file():
        raise CaptureError(f"example file {str(example)!r} does not exist", hint="give the path of a Python file defining build()")
    overrides = dict(overrides or {})
    options = {"grads": bool(grads), "routing": routing, "microbatches": microbatches}
    key = _cache.key(example, overrides, options) if cache else None
    hit = _cache.lookup(key) if key else None
    if hit is not None:
        captured = load(hit)
        return attrs.evolve(captured, provenance=doc.provenance), f"cached ({_sizes(captured)})"

    from .examples import load_example_once

    say = progress or (lambda m: None)
    with bars.task("capture") as bar:
        def tell(msg: str) -> None:
            m = _LOWERED.search(msg)
            if m:
                bar.update(completed=int(m.group(1)), total=int(m.group(2)))
            bar.note(msg.strip().removeprefix("capture: "))
            if not bar.drawn:
                say(msg)

        tell(f"capture: loading {example}")
        ex = load_example_once(example, **overrides)
        kw: dict[str, Any] = {"grads": bool(grads), "routing": routing, "progress": tell}
        if microbatches is not None:
            kw["microbatches"] = int(microbatches)
        captured = ex.capture(**kw)
    captured = attrs.evolve(captured, provenance=())
    if key:
        _cache.store(key, dumps(captured), _cache.local_imports(example))
    return attrs.evolve(captured, provenance=doc.provenance), _sizes(captured)


def _sizes(doc: Document) -> str:
    return ", ".join(f"{g.name} {len(g.nodes)} nodes" for g in doc.graph.programs)


CAPTURE = Pass("capture", _capture, requires=set(), ensures={"graph"},
               doc="example file -> graph section (options example, overrides, grads, routing, microbatches, "
                   "cache); cached by what it reads (latch_capture.cache)")
