"""Latch scheduling: Graph -> Schedule (barrier, dataflow), static hazard validator.

Imports without torch. Public API (each name loads on first use, so the plugin module stays cheap):
- ``barrier_scheduler(doc, options)``, ``dataflow_scheduler(doc, options)`` -> ScheduleSection;
- ``schedule(doc, scheduler=None, split_reductions=True, **options)`` -> Document (the passes
  ``schedule.split_reductions`` then ``schedule``, as the pipeline runs them);
- ``validate(doc) -> list[str]``, ``check(doc)`` (raises ValidationError);
- building blocks for other strategies: ``latch_schedule.tasks.build``, ``latch_schedule.tiling``.
"""

_LAZY = {
    "SCHEDULE": "passes", "SPLIT_REDUCTIONS": "passes", "VALIDATE": "passes", "VALIDATE_ORDER": "passes",
    "scheduler_name": "passes", "barrier_scheduler": "schedulers", "dataflow_scheduler": "schedulers",
    "task_graphs": "schedulers", "ScheduleError": "tasks", "CostModel": "tiling", "Tiling": "tiling",
    "ValidationError": "validate", "check": "validate", "validate": "validate",
}


def schedule(doc, scheduler=None, split_reductions=True, **options):
    """Run ``schedule.split_reductions`` (unless ``split_reductions=False``) and ``schedule`` on
    ``doc``, each with its provenance record."""
    from latch_core.passes import run_pass

    from .passes import SCHEDULE, SPLIT_REDUCTIONS

    if split_reductions:
        split_opts = {k: v for k, v in options.items()
                      if k in ("num_sms", "split_factor", "ops", "matmul_tile") or k.startswith("cost_")}
        doc = run_pass(SPLIT_REDUCTIONS, doc, **split_opts)
    options.pop("split_factor", None)
    return run_pass(SCHEDULE, doc, scheduler=scheduler, **options)


__all__ = sorted([*_LAZY, "schedule"])

# ``validate`` names both a submodule and its function: importing the submodule (as anything may, at
# any time) would set the package attribute to the module, so the function is bound eagerly here.
from .validate import validate  # noqa: E402

del _LAZY["validate"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'latch_schedule' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
