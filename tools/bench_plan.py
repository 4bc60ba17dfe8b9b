"""Planning benchmark (issue 14): memory.plan on the dense transformer at d_model 128 and 16, 32 and
64 layers, both strategies, on this machine; time (wall and CPU) and the planner's peak traced
memory, so growth with depth is visible. ``--quadratic`` also times the previous, quadratic arena
(latch_memory.testing.quadratic_assign_offsets) at the deepest size, for the before/after ratio.

    .venv/bin/python tools/bench_plan.py [--layers 16,32,64] [--quadratic]
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="16,32,64")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--quadratic", action="store_true")
    args = ap.parse_args()

    import latch_capture
    from latch_core.plugins import registries
    from latch_memory.testing import quadratic_assign_offsets

    plan_mod = importlib.import_module("latch_memory.plan")
    fast_arena = plan_mod.assign_offsets
    passes = registries().passes
    layers = [int(x) for x in args.layers.split(",")]
    load = os.getloadavg()[0]
    print(f"memory.plan benchmark, transformer d_model {args.d_model}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs (load {load:.1f})")
    print(f"{'layers':>6}  {'strategy':8}  {'tasks':>6}  {'arena values':>12}  {'plan s':>7}  {'plan CPU s':>10}  "
          f"{'arena s':>7}  {'peak MiB':>8}  {'arena MiB':>9}  {'<= 5 s':>6}")
    for L in layers:
        t0 = time.perf_counter()
        doc = latch_capture.load_example(ROOT / "examples" / "transformer.py", layers=L, d_model=args.d_model).capture()
        cap = time.perf_counter() - t0
        for strategy in ("barrier", "dataflow"):
            d = passes.get("schedule").run(passes.get("memory.policy").run(doc), scheduler=strategy, num_sms=132)
            from latch_core.order import Order

            for ps in d.schedule.programs:
                Order.from_schedule(ps)  # built once per schedule and shared; the schedule stage pays it
            w, c = time.perf_counter(), time.process_time()
            planned = plan_mod.plan(d)
            wall, cpu = time.perf_counter() - w, time.process_time() - c
            st = dict(dict(dict(planned.memory.stats)["programs"])["update"])
            tracemalloc.start()
            plan_mod.plan(d)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"{L:>6}  {strategy:8}  {len(d.schedule.programs[0].tasks):>6}  {st['arena_values']:>12}  {wall:>7.2f}  "
                  f"{cpu:>10.2f}  {st['seconds_arena']:>7.2f}  {peak / 2**20:>8.1f}  "
                  f"{planned.memory.arena_bytes / 2**20:>9.2f}  {'PASS' if wall <= 5 else 'FAIL':>6}")
            if args.quadratic and L == max(layers):
                plan_mod.assign_offsets = quadratic_assign_offsets
                w, c = time.perf_counter(), time.process_time()
                slow = plan_mod.plan(d)
                print(f"{'':>6}  {'(quadratic arena, the version replaced)':44}  {time.perf_counter() - w:>7.2f}  "
                      f"{time.process_time() - c:>10.2f}  same arena: {slow.memory.arena_bytes == planned.memory.arena_bytes}")
                plan_mod.assign_offsets = fast_arena
        print(f"        (capture of {L} layers: {cap:.1f} s)")


if __name__ == "__main__":
    main()
