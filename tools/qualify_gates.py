#!/usr/bin/env python
"""What PyTorch's own BF16 update scores on Latch's gates, on the CPU (docs/GATES.md).

    python tools/qualify_gates.py examples/transformer.py [--set k=v ...] [--trained 200] [--no-simulate]

Captures the example, applies the BF16 policy (and, unless --no-simulate, schedules and plans it
for the arena simulator), then prints latch_check.qualify.cpu_tables: one update at the fresh
state and one at the state after --trained eager FP32 updates, of the program as the BF16 policy
computes it (operands rounded to BF16, math in FP64) and of PyTorch's own BF16 autocast update
(the torch column), both against Latch's FP64 interpreter, with the GPU's BF16 thresholds.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="qualify_gates.py", description=__doc__.splitlines()[0])
    ap.add_argument("example")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--trained", type=int, default=200, help="eager FP32 updates before the trained-state table")
    ap.add_argument("--store-products", action="store_true",
                    help="memory.policy option products: products feeding only BF16 consumers write BF16")
    ap.add_argument("--no-simulate", action="store_true", help="the FP64 interpreter instead of the arena simulator")
    args = ap.parse_args(argv)

    from latch_capture.examples import parse_overrides
    from latch_check.pipeline import compile_example
    from latch_check.qualify import cpu_tables

    c = compile_example(args.example, overrides=parse_overrides(args.overrides), build=False,
                        split_reductions=not args.no_simulate, store_products=args.store_products)
    tables = cpu_tables(c.example, c.doc, trained=args.trained, simulate=not args.no_simulate)
    for t in tables:
        print(t.format())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
