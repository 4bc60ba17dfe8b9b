"""latch-schedule's passes.

- ``schedule`` (requires graph, ensures schedule): runs the scheduler named by option
  ``scheduler``, else ``LATCH_SCHEDULER``, else ``barrier``; other options go to the scheduler
  (``num_sms`` default 132, ``fuse``, ...). First three graph rewrites (the graph section changes;
  the schedule's stats list what each did): unless ``matmul_layouts=False``, transposes feeding
  matmuls become operand layouts (``schedule.matmul_layouts``, :mod:`latch_schedule.layouts`);
  unless ``split_reductions=False``, full reductions costing more than ``split_factor`` (4) minimum
  tasks become two-level ones (:mod:`latch_schedule.split`); unless ``matmul_configs=False`` or a
  fixed ``matmul_tile`` is given, every matmul gets its body configuration and split-K factor
  (``schedule.matmul_configs``, :mod:`latch_schedule.matmul_configs`). A new schedule invalidates
  any memory plan and build, so the result drops those sections.
- ``schedule.matmul_layouts``, ``schedule.matmul_configs`` (graph -> graph): those rewrites as
  passes of their own.
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
              matmul_layouts: bool = True, matmul_configs: bool = True, **options) -> Document:
    from latch_core.plugins import registries

    from .layouts import layouts_document
    from .matmul_configs import configs_document
    from .schedulers import DEFAULT_NUM_SMS, _bool, _ops
    from .split import split_document
    from .tasks import options_cost

    name = scheduler_name(scheduler)
    fn = registries().schedulers.get(name)  # unknown name: RegistryError listing the registered ones
    split, layouts, configs = {}, {}, {}
    num_sms = int(options.get("num_sms", DEFAULT_NUM_SMS))
    if _bool(matmul_layouts) and doc.graph is not None:
        doc, layouts = layouts_document(doc)
    if _bool(split_reductions) and doc.graph is not None:
        doc, split = split_document(doc, _ops(options), cost=options_cost(options),
                                    num_sms=num_sms, factor=float(split_factor))
    # A fixed matmul tile (option matmul_tile) is the user's choice: no configuration is chosen then.
    if _bool(matmul_configs) and "matmul_tile" not in options and doc.graph is not None:
        doc, configs = configs_document(doc, cost=options_cost(options), num_sms=num_sms)
    section = fn(doc, dict(options))
    extra = {}
    if split:
        extra["split_reductions"] = split
    if layouts:
        extra["matmul_layouts"] = {p: {"folds": len(r["folds"]), "removed": len(r["removed"])}
                                   for p, r in layouts.items()}
    if configs:
        extra["matmul_configs"] = configs
    if extra:
        section = attrs.evolve(section, stats=dict(section.stats, **extra))
    return attrs.evolve(doc, schedule=section, memory=None, build=None)


def _layouts(doc: Document, **options) -> Document:
    from .layouts import layouts_pass

    return layouts_pass(doc, **options)


def _configs(doc: Document, **options) -> Document:
    from .matmul_configs import configs_pass

    return configs_pass(doc, **options)


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


MATMUL_LAYOUTS = Pass("schedule.matmul_layouts", _layouts, requires={"graph"}, ensures={"graph"},
                      doc="fold last-two-dim transposes feeding matmuls into their trans_a/trans_b flags")
MATMUL_CONFIGS = Pass("schedule.matmul_configs", _configs, requires={"graph"}, ensures={"graph"},
                      doc="record each matmul's body configuration (and split-K rewrite) from the cost model "
                          "(options num_sms, cost_<field>)")
SCHEDULE = Pass("schedule", _schedule, requires={"graph"}, ensures={"schedule"},
                doc="fusion, tiling, SM assignment and synchronisation (option scheduler, else LATCH_SCHEDULER, "
                    "else barrier; num_sms, fuse)")
VALIDATE = Pass("schedule.validate", _validate, requires={"graph", "schedule", "memory"},
                ensures={"graph", "schedule", "memory"}, validator=True,
                doc="static hazard validator: read-after-write, write races, byte reuse, deadlock")
VALIDATE_ORDER = Pass("schedule.validate_order", _validate_order, requires={"graph", "schedule"},
                      ensures={"graph", "schedule"}, validator=True,
                      doc="static hazard validator without a memory plan (footprints, order, deadlock)")
