"""Build an example's kernel libraries HERE, into a cache directory the H200 run then starts from.

A full-size TinyMoE-200M build is one nvcc run of ~3 minutes on the H200's machine (run 31's bench:
compile 222 s of a 304 s call) and it was paid again by every device call that built it (the
machine starts bare). The library depends only on the generated sources, the flags and the toolkit
(latch_codegen_h100.builder.build_key: the unit split does not follow the cores, codegen.units_for),
so a library compiled on the CPU machine with the same nvcc (13.0 on both) is the one the H200's
build would compile: seeded into the run's fresh cache it is fetched, after its sha256 is checked,
instead of compiled (the build line says ``cached: cache``).

    .venv/bin/python tools/seed_cache.py examples/tinymoe.py --set batch=2 --set seq=1024 --set microbatches=1
    .venv/bin/python tools/seed_cache.py examples/tinymoe.py --profile
    # then, on the device: carry .seed-cache, LATCH_GPU_SEED_CACHE=.seed-cache bash tools/gpu_check.sh

The cache directory (default .seed-cache, git-ignored) must be named in the device call's carry
(64 MiB in all: a TinyMoE-200M library is ~6 MB). Overrides must be the ones the GPU step builds
with (the bench builds each shape with batch, seq and microbatches set; the profile step with the
example's defaults): other shapes are other bodies, another key, and the seed is simply not used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("example")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--scheduler", default=None)
    ap.add_argument("--profile", action="store_true", help="the profiling build (-DLATCH_PROFILE=1)")
    ap.add_argument("--no-policy", dest="policy", action="store_false")
    ap.add_argument("--store-products", action="store_true", help="as compile's and bench's --store-products")
    ap.add_argument("--cache", default=str(ROOT / ".seed-cache"))
    ap.add_argument("--dir", default=None, help="build directory (default: one under $TMPDIR, so that only the "
                    "cache's <key>.so and <key>.json travel)")
    args = ap.parse_args(argv)
    cache = Path(args.cache).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["LATCH_CACHE_DIR"] = str(cache)  # before the builder reads it

    from latch_capture.examples import parse_overrides
    from latch_check.pipeline import compile_example
    from latch_codegen_h100 import build

    say = lambda m: print(f"  {m}", flush=True)  # noqa: E731
    c = compile_example(args.example, overrides=parse_overrides(args.overrides), scheduler=args.scheduler,
                        policy=args.policy, build=False, say=say, store_products=args.store_products)
    tag = (f"{Path(args.example).stem}-{c.doc.schedule.strategy}{'-profile' if args.profile else ''}"
           f"{'-store-products' if args.store_products else ''}")
    out = Path(args.dir) if args.dir else Path(tempfile.gettempdir()) / "latch-seed" / tag
    t0 = time.perf_counter()
    doc = build(c.doc, out, profile=args.profile)
    st = dict(doc.build.stats)
    key = json.loads((out / "build.key").read_text())["key"]
    print(f"seed_cache: {args.example} {c.doc.schedule.strategy}{' profile' if args.profile else ''}: "
          f"{time.perf_counter() - t0:.1f} s, cached: {st.get('cached') or 'no'}, key {key[:16]}, into {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
