"""latch-schedule's passes.

- ``schedule.split_reductions`` (graph rewrite; requires and ensures graph): full reductions
  costing more than ``split_factor`` (4) minimum tasks on ``num_sms`` SMs become two-level ones
  (:mod:`latch_schedule.split`); the graph section changes by rounding only, the provenance
  detail lists the nodes. It runs before ``schedule`` in the pipeline (``latch_core.pipeline``).
  A changed graph invalidates any schedule, memory plan and build: the result drops them.
- ``schedule`` (requires graph, ensures schedule): runs the scheduler named by option
  ``scheduler``, else ``LATCH_SCHEDULER``, else ``barrier``; other options go to the scheduler
  (``num_sms`` default 132, ``fuse``, ...). It never changes the graph section. A new schedule
  invalidates any memory plan and build, so the result drops those sections.
- ``schedule.matmul_layouts`` (graph rewrite; requires and ensures graph): transposes feeding matmuls
  become operand layouts (:mod:`latch_schedule.layouts`). Runs before ``schedule.split_reductions``.
- ``schedule.matmul_configs`` (graph rewrite): every matmul gets its body configuration and split-K
  factor from the cost model (:mod:`latch_schedule.matmul_configs`). Runs right before ``schedule``.
- ``schedule.alias_views`` (graph rewrite): a contiguous view read by several nodes is cloned per
  reader (:mod:`latch_schedule.aliases`), so each copy folds into its reader's group (the
  scheduler's alias prefixes, option ``alias_views``). Runs right before ``schedule``.
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

ENV = "LATCH_SCHEDULER"
DEFAULT = "barrier"


def scheduler_name(option: str | None = None) -> str:
    if option:
        return option
    env = os.environ.get(ENV, "").strip()
    return env or DEFAULT


def _split(doc: Document, split_factor: float = 4.0, **options):
    from .schedulers import DEFAULT_NUM_SMS, _ops
    from .split import split_document
    from .tasks import options_cost

    out, split = split_document(doc, _ops(options), cost=options_cost(options),
                                num_sms=int(options.get("num_sms", DEFAULT_NUM_SMS)), factor=float(split_factor))
    if not split:
        return doc, "nothing to split"
    detail = "split " + "; ".join(f"{prog}: {', '.join(names)}" for prog, names in split.items())
    return attrs.evolve(out, schedule=None, memory=None, build=None), detail


@gc_paused  # allocation-heavy: see latch_core.gcpause
def _schedule(doc: Document, scheduler: str | None = None, **options) -> Document:
    from latch_core.plugins import registries

    if "split_reductions" in options or "split_factor" in options:
        raise ValueError("the schedule pass no longer splits reductions: run the pass schedule.split_reductions "
                         "before it (latch_core.pipeline does), with its options num_sms and split_factor")
    name = scheduler_name(scheduler)
    fn = registries().schedulers.get(name)  # unknown name: RegistryError listing the registered ones
    section = fn(doc, dict(options))
    return attrs.evolve(doc, schedule=section, memory=None, build=None)


def _layouts(doc: Document, **options) -> Document:
    from .layouts import layouts_pass

    return layouts_pass(doc, **options)


def _configs(doc: Document, **options) -> Document:
    from .matmul_configs import configs_pass

    return configs_pass(doc, **options)


def _alias_views(doc: Document, **options):
    from .aliases import alias_views_pass

    return alias_views_pass(doc, **options)


def _fuse_views(doc: Document, **options):
    from .fuse_views import fuse_views_pass

    return fuse_views_pass(doc, **options)


def _validate(doc: Document, **options) -> Document:
    from .validate import ValidationError, validate

    problems = validate(doc, **options)
    if problems:
        raise ValidationError(problems)
    return doc


def _validate_order(doc: Document, **options) -> Document:
    from .validate import ValidationError, validate

    if doc.memory is not None:
        return doc
    problems = validate(doc, check_memory=False, **options)
    if problems:
        raise ValidationError(problems)
    return doc


SPLIT_REDUCTIONS = Pass("schedule.split_reductions", _split, requires={"graph"}, ensures={"graph"},
                        doc="graph rewrite: full reductions too big for one task become <node>.partial then <node> "
                            "(options num_sms, split_factor)")
MATMUL_LAYOUTS = Pass("schedule.matmul_layouts", _layouts, requires={"graph"}, ensures={"graph"},
                      doc="fold last-two-dim transposes feeding matmuls into their trans_a/trans_b flags")
MATMUL_CONFIGS = Pass("schedule.matmul_configs", _configs, requires={"graph"}, ensures={"graph"},
                      doc="record each matmul's body configuration (and split-K rewrite) from the cost model "
                          "(options num_sms, cost_<field>)")
ALIAS_VIEWS = Pass("schedule.alias_views", _alias_views, requires={"graph"}, ensures={"graph"},
                   doc="graph rewrite: a contiguous view read by several nodes is cloned per reader, so every "
                       "copy folds into its reader (the scheduler's alias prefixes)")
FUSE_VIEWS = Pass("schedule.fuse_views", _fuse_views, requires={"graph"}, ensures={"graph"},
                  doc="graph rewrite: a fusable view read by several nodes is cloned per reader that fuses it "
                      "(pointwise, concat, a view that does), so no view materialises inside elementwise chains")
SCHEDULE = Pass("schedule", _schedule, requires={"graph"}, ensures={"schedule"},
                doc="fusion, tiling, SM assignment and synchronisation (option scheduler, else LATCH_SCHEDULER, "
                    "else barrier; num_sms, fuse)")
VALIDATE = Pass("schedule.validate", _validate, requires={"graph", "schedule", "memory"},
                ensures={"graph", "schedule", "memory"}, validator=True,
                doc="static hazard validator: read-after-write, write races, byte reuse, deadlock")
VALIDATE_ORDER = Pass("schedule.validate_order", _validate_order, requires={"graph", "schedule"},
                      ensures={"graph", "schedule"}, validator=True,
                      doc="static hazard validator without a memory plan (footprints, order, deadlock)")
