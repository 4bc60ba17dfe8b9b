"""latch-schedule's passes.

- ``schedule`` (requires graph, ensures schedule): runs the scheduler named by option
  ``scheduler``, else ``LATCH_SCHEDULER``, else ``barrier``; other options go to the scheduler
  (``num_sms`` default 132, ``fuse``, ...). First, unless ``split_reductions=False``, full
  reductions costing more than ``split_factor`` (4) minimum tasks become two-level ones (:mod:`latch_schedule.split`; the graph section changes, the
  schedule's stats list the nodes). A new schedule invalidates any memory plan and build, so the
  result drops those sections.
- ``schedule.validate`` (validator; requires graph, schedule, memory): the full static hazard
  check (:mod:`latch_schedule.validate`), run by ``latch-pipeline validate`` and by the pipeline
  before code generation.
- ``schedule.validate_order`` (validator; requires graph, schedule): the same checks without the
  memory plan, for a document that has not been planned yet (a no-op when memory exists, since
  ``schedule.validate`` then covers it).
"""

from __future__ import annotations

import os

import attrs

from latch_core.document import Document
from latch_core.passes import Pass

from latch_core.gcpause import gc_paused
from .validate import ValidationError, validate

ENV = "LATCH_SCHEDULER"
DEFAULT = "barrier"


def scheduler_name(option: str | None = None) -> str:
    if option:
        return option
    env = os.environ.get(ENV, "").strip()
    return env or DEFAULT


@gc_paused  # allocation-heavy: see latch_core.gcpause
def _schedule(doc: Document, scheduler: str | None = None, split_reductions: bool = True, split_factor: float = 4.0,
              **options) -> Document:
    from latch_core.plugins import registries

    from .schedulers import DEFAULT_NUM_SMS, _bool, _ops
    from .split import split_document
    from .tasks import options_cost

    name = scheduler_name(scheduler)
    fn = registries().schedulers.get(name)  # unknown name: RegistryError listing the registered ones
    split = {}
    if _bool(split_reductions) and doc.graph is not None:
        doc, split = split_document(doc, _ops(options), cost=options_cost(options),
                                    num_sms=int(options.get("num_sms", DEFAULT_NUM_SMS)), factor=float(split_factor))
    section = fn(doc, dict(options))
    if split:
        section = attrs.evolve(section, stats=dict(section.stats, split_reductions=split))
    return attrs.evolve(doc, schedule=section, memory=None, build=None)


def _validate(doc: Document, **options) -> Document:
    problems = validate(doc, **options)
    if problems:
        raise ValidationError(problems)
    return doc


def _validate_order(doc: Document, **options) -> Document:
    if doc.memory is not None:
        return doc
    problems = validate(doc, check_memory=False, **options)
    if problems:
        raise ValidationError(problems)
    return doc


SCHEDULE = Pass("schedule", _schedule, requires={"graph"}, ensures={"schedule"},
                doc="fusion, tiling, SM assignment and synchronisation (option scheduler, else LATCH_SCHEDULER, "
                    "else barrier; num_sms, fuse)")
VALIDATE = Pass("schedule.validate", _validate, requires={"graph", "schedule", "memory"},
                ensures={"graph", "schedule", "memory"}, validator=True,
                doc="static hazard validator: read-after-write, write races, byte reuse, deadlock")
VALIDATE_ORDER = Pass("schedule.validate_order", _validate_order, requires={"graph", "schedule"},
                      ensures={"graph", "schedule"}, validator=True,
                      doc="static hazard validator without a memory plan (footprints, order, deadlock)")
