"""Latch scheduling: Graph -> Schedule (barrier, dataflow), static hazard validator.

Imports without torch. Public API:
- ``barrier_scheduler(doc, options)``, ``dataflow_scheduler(doc, options)`` -> ScheduleSection;
- ``schedule(doc, scheduler=None, **options)`` -> Document (the ``schedule`` pass);
- ``validate(doc) -> list[str]``, ``check(doc)`` (raises ValidationError);
- building blocks for other strategies: ``latch_schedule.tasks.build``, ``latch_schedule.tiling``.
"""

from .passes import SCHEDULE, VALIDATE, VALIDATE_ORDER, scheduler_name
from .schedulers import barrier_scheduler, dataflow_scheduler, task_graphs
from .tasks import ScheduleError
from .tiling import CostModel, Tiling
from .validate import ValidationError, check, validate


def schedule(doc, scheduler=None, **options):
    """Run the ``schedule`` pass (with provenance) on ``doc``."""
    from latch_core.passes import run_pass

    return run_pass(SCHEDULE, doc, scheduler=scheduler, **options)


__all__ = [
    "SCHEDULE", "VALIDATE", "VALIDATE_ORDER", "scheduler_name", "barrier_scheduler", "dataflow_scheduler",
    "task_graphs", "ScheduleError", "CostModel", "Tiling", "ValidationError", "check", "validate", "schedule",
]
