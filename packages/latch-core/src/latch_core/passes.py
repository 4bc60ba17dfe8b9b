"""Passes and the pipeline runner.

A pass is a pure function of the document (``Document -> Document``, never mutating its input) with
a name, the sections it ``requires`` and the sections it ``ensures``. The runner checks both sides
of the contract and appends a provenance record (name, start time, duration, detail) to the result.
A pass may return ``(document, detail)`` to say something in its provenance record (e.g. capture's
``cached``); the runner's ``detail`` argument, when given, comes first.
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import Any, Callable, Iterable, Sequence

import attrs

from .document import Document, Provenance
from .errors import UserError

SECTIONS = ("graph", "schedule", "memory", "build")


class PassError(UserError, RuntimeError):
    pass


@attrs.frozen
class Pass:
    name: str
    run: Callable[..., Document]  # run(doc, **options) -> Document
    requires: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    ensures: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    doc: str = ""
    validator: bool = False  # a check only: ``latch-pipeline validate`` runs every validator pass

    @requires.validator
    @ensures.validator
    def _sections(self, attribute, value):
        bad = set(value) - set(SECTIONS)
        if bad:
            raise ValueError(f"pass {self.name!r}: {attribute.name} names unknown sections {sorted(bad)}; known: {SECTIONS}")

    def __call__(self, doc: Document, **options: Any) -> Document:
        return run_pass(self, doc, **options)


def run_pass(p: Pass, doc: Document, *, detail: str = "", **options: Any) -> Document:
    missing = set(p.requires) - doc.sections()
    if missing:
        raise PassError(
            f"pass {p.name!r} requires section(s) {sorted(missing)}, which the document lacks "
            f"(it has {sorted(doc.sections()) or 'none'}); run the stage that produces them first"
        )
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    out = p.run(doc, **options)
    seconds = time.perf_counter() - t0
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], str):
        out, said = out
        detail = f"{detail}; {said}" if detail and said else detail or said
    if not isinstance(out, Document):
        raise PassError(f"pass {p.name!r} returned {type(out).__name__}, not a Document")
    lost = set(p.ensures) - out.sections()
    if lost:
        raise PassError(f"pass {p.name!r} ensures section(s) {sorted(lost)} but its result lacks them")
    return attrs.evolve(out, provenance=out.provenance + (Provenance(p.name, started, round(seconds, 6), detail),))


def run_pipeline(passes: Sequence[Pass], doc: Document, options: dict[str, dict] | None = None,
                 on_pass: Callable[[Pass, Document], None] | None = None) -> Document:
    """Run passes in order; ``options[pass_name]`` are keyword options for that pass."""
    options = options or {}
    for p in passes:
        doc = run_pass(p, doc, **options.get(p.name, {}))
        if on_pass is not None:
            on_pass(p, doc)
    return doc


def resolve(names: Iterable[str], registry) -> list[Pass]:
    return [registry.get(n) for n in names]
