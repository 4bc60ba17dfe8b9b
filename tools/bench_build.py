#!/usr/bin/env python
"""Build benchmark: cold build and cached rebuild of one example (default TinyMoE-200M at 2 x 1024).

Captures the example (model on the meta device: no weights are allocated), runs ``memory.policy``,
``schedule`` and ``memory.plan``, then times ``latch_codegen_h100.build(doc, dir)`` three ways:

- cold:    an empty build directory and an empty cache (``LATCH_CACHE_DIR`` under the work dir);
- cached:  the same document into the same directory again (what a re-run of a pipeline does);
- copied:  the same document into a fresh directory, the library found in the cache.

    python tools/bench_build.py                          # TinyMoE-200M, barrier strategy
    python tools/bench_build.py --example mlp --small    # any example; --small uses its SMALL config
    python tools/bench_build.py --doc planned.latch.json # a planned document saved before (--save-doc)
    python tools/bench_build.py --profile cached.prof    # cProfile of the cached rebuild

Times are wall-clock seconds of this process on this machine (say how many cores when quoting them).
``--keep DIR`` keeps the work directory, so a later run with ``--warm`` skips the cold build.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def planned_document(example: str, small: bool, strategy: str, num_sms: int, say):
    from latch_capture import load_example
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    path = ROOT / "examples" / f"{example}.py"
    overrides: dict = {"device": "meta"}
    if small:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_bench_example", path)
        sys.path.insert(0, str(path.parent))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        overrides = dict(getattr(mod, "SMALL", {}))
    elif example == "tinymoe":
        overrides.update(batch=2, seq=1024, microbatches=1)
    t0 = time.perf_counter()
    doc = load_example(path, **overrides).capture()
    say(f"capture          {time.perf_counter() - t0:7.2f} s")
    passes = registries().passes
    for name, opts in (("memory.policy", {}), ("schedule.split_reductions", {"num_sms": num_sms}),
                       ("schedule", {"scheduler": strategy, "num_sms": num_sms}), ("memory.plan", {})):
        t0 = time.perf_counter()
        doc = run_pass(passes.get(name), doc, **opts)
        say(f"{name:<16s} {time.perf_counter() - t0:7.2f} s")
    return doc


def timed_build(doc, out: Path, profile: str | None = None):
    from latch_codegen_h100 import build

    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    res = build(doc, out)
    if prof:
        prof.disable()
    secs = time.perf_counter() - t0
    if prof:
        prof.dump_stats(profile)
    return res, secs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--example", default="tinymoe")
    ap.add_argument("--small", action="store_true", help="the example's SMALL configuration")
    ap.add_argument("--strategy", default="barrier")
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--doc", help="a planned document (skips capture and planning)")
    ap.add_argument("--save-doc", help="save the planned document here")
    ap.add_argument("--keep", help="work directory to use and keep (build dir and cache inside)")
    ap.add_argument("--warm", action="store_true", help="skip the cold build (the --keep dir holds one)")
    ap.add_argument("--profile", help="write a cProfile of the cached rebuild here (and print its top)")
    args = ap.parse_args(argv)

    def say(m):
        print(m, file=sys.stderr, flush=True)

    from latch_core import document

    if args.doc:
        t0 = time.perf_counter()
        doc = document.load(args.doc)
        say(f"load document    {time.perf_counter() - t0:7.2f} s  {args.doc}")
    else:
        doc = planned_document(args.example, args.small, args.strategy, args.num_sms, say)
    if args.save_doc:
        document.save(doc, args.save_doc)
    tasks = sum(len(p.tasks) for p in doc.schedule.programs)
    # Plugins load once per process (a pipeline has loaded them before it builds): not timed here.
    from latch_core.plugins import registries

    t0 = time.perf_counter()
    registries()
    say(f"load plugins     {time.perf_counter() - t0:7.2f} s")

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="latch-bench-build-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["LATCH_CACHE_DIR"] = str(work / "cache")
    out = work / "build"
    rows = []
    try:
        if not args.warm:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(work / "cache", ignore_errors=True)
            res, secs = timed_build(doc, out)
            rows.append(("cold", secs, dict(res.build.stats)))
        res, secs = timed_build(doc, out, args.profile)
        rows.append(("cached", secs, dict(res.build.stats)))
        other = work / "build-copy"
        shutil.rmtree(other, ignore_errors=True)
        res, secs = timed_build(doc, other)
        rows.append(("copied", secs, dict(res.build.stats)))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"# build times: {args.doc or args.example} ({args.strategy}, {tasks} tasks), "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"{'build':<8s} {'seconds':>9s}  cached  bodies")
    for name, secs, st in rows:
        print(f"{name:<8s} {secs:9.3f}  {st.get('cached', '?'):<6s}  {st.get('bodies', '?')}")
    if args.profile:
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
