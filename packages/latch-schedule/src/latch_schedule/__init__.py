"""Latch scheduling: Graph -> Schedule (barrier, dataflow), static hazard validator.

Imports without torch. Public API:
- ``barrier_scheduler(doc, options)``, ``dataflow_scheduler(doc, options)`` -> ScheduleSection;
- ``schedule(doc, scheduler=None, split_reductions=True, **options)`` -> Document (the passes
  ``schedule.split_reductions`` then ``schedule``, as the pipeline runs them);
- ``validate(doc) -> list[str]``, ``check(doc)`` (raises ValidationError);
- building blocks for other strategies: ``latch_schedule.tasks.build``, ``latch_schedule.tiling``.
"""

from .passes import SCHEDULE, SPLIT_REDUCTIONS, VALIDATE, VALIDATE_ORDER, scheduler_name
from .schedulers import barrier_scheduler, dataflow_scheduler, task_graphs
from .tasks import ScheduleError
from .tiling import CostModel, Tiling
from .validate import ValidationError, check, validate


def schedule(doc, scheduler=None, split_reductions=True, **options):
    """Run ``schedule.split_reductions`` (unless ``split_reductions=False``) and ``schedule`` on
    ``doc``, each with its provenance record."""
    from latch_core.passes import run_pass

    if split_reductions:
        split_opts = {k: v for k, v in options.items()
                      if k in ("num_sms", "split_factor", "ops", "matmul_tile") or k.startswith("cost_")}
        doc = run_pass(SPLIT_REDUCTIONS, doc, **split_opts)
    options.pop("split_factor", None)
    return run_pass(SCHEDULE, doc, scheduler=scheduler, **options)


__all__ = [
    "SCHEDULE", "SPLIT_REDUCTIONS", "VALIDATE", "VALIDATE_ORDER", "scheduler_name", "barrier_scheduler", "dataflow_scheduler",
    "task_graphs", "ScheduleError", "CostModel", "Tiling", "ValidationError", "check", "validate", "schedule",
]
