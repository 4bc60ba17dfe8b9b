"""latch-schedule's registrations with Latch (entry point group latch.plugins): the ``barrier``
and ``dataflow`` schedulers, the ``schedule`` pass and validators, and the ``schedule`` command."""

from __future__ import annotations


import click

from latch_core.hookspecs import hookimpl

from .passes import ALIAS_VIEWS, FUSE_VIEWS, MATMUL_CONFIGS, MATMUL_LAYOUTS, SCHEDULE, SPLIT_REDUCTIONS, VALIDATE, VALIDATE_ORDER, scheduler_name


@hookimpl
def latch_register_schedulers(register):
    from .schedulers import barrier_scheduler, dataflow_scheduler, tickets_data_scheduler, tickets_scheduler

    register("barrier", barrier_scheduler)
    register("dataflow", dataflow_scheduler)
    register("tickets", tickets_scheduler)
    register("tickets_data", tickets_data_scheduler)


@hookimpl
def latch_register_passes(register):
    register(SPLIT_REDUCTIONS)
    register(SCHEDULE)
    register(MATMUL_LAYOUTS)
    register(MATMUL_CONFIGS)
    register(ALIAS_VIEWS)
    register(FUSE_VIEWS)
    register(VALIDATE)
    register(VALIDATE_ORDER)


def summary(doc) -> list[str]:
    s = doc.schedule
    stats = dict(s.stats)
    lines = [f"schedule: strategy {s.strategy}, {s.num_sms} SMs, fuse={stats.get('fuse')}"]
    for ps in s.programs:
        st = dict(stats.get(f"program.{ps.program}", ()))
        parts = [f"{k} {v}" for k, v in st.items()]
        lines.append(f"  {ps.program}: " + ", ".join(parts))
        from .matmul_configs import format_choice

        for row in dict(doc.graph.meta("matmul_configs", ()) or ()).get(ps.program, ()):
            lines.append("    " + format_choice(dict(row)))
    return lines


@click.command("schedule")
@click.option("-i", "--input", "inp", required=True, type=click.Path(dir_okay=False), help="document with a graph")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="document to write")
@click.option("--scheduler", default=None, help="strategy name (default: $LATCH_SCHEDULER, else barrier)")
@click.option("--num-sms", default=132, show_default=True, help="SMs of the target GPU")
@click.option("--fuse/--no-fuse", default=True, show_default=True, help="fuse elementwise/view chains")
@click.option("--split-reductions/--no-split-reductions", default=True, show_default=True,
              help="run schedule.split_reductions first: big full reductions in two levels (changes the graph section)")
@click.option("--matmul-layouts/--no-matmul-layouts", default=True, show_default=True,
              help="run schedule.matmul_layouts first: transposes feeding matmuls become trans flags")
@click.option("--matmul-configs/--no-matmul-configs", default=True, show_default=True,
              help="run schedule.matmul_configs first: each matmul's body configuration and split-K factor")
@click.option("--validate/--no-validate", "check", default=True, show_default=True,
              help="run the static validator (without memory) on the result")
def schedule_cmd(inp, out, scheduler, num_sms, fuse, split_reductions, matmul_layouts, matmul_configs, check):
    """Schedule every program: fusion, tiles, SM assignment, barriers or counters."""
    from latch_core.cli import transform_file

    steps = [(MATMUL_LAYOUTS, {})] if matmul_layouts else []
    if split_reductions:
        steps.append((SPLIT_REDUCTIONS, {"num_sms": num_sms}))
    if matmul_configs:
        steps.append((MATMUL_CONFIGS, {"num_sms": num_sms}))
    steps.append((SCHEDULE, {"scheduler": scheduler_name(scheduler), "num_sms": num_sms, "fuse": fuse}))
    if check:
        steps.append((VALIDATE_ORDER, {}))
    transform_file(inp, out, steps, summary)


@hookimpl
def latch_register_commands(register):
    register(schedule_cmd)
