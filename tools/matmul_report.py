#!/usr/bin/env python
"""Which body configuration the scheduler picks for each matrix product of TinyMoE-200M, on the CPU.

Captures examples/tinymoe.py on the meta device (no weights) at each workload, runs the BF16
policy (``memory.policy``), the layout fold (``schedule.matmul_layouts``) and the configuration
choice (``schedule.matmul_configs``, 132 SMs), and prints one row per distinct ``latch::matmul``
(node, batch*M x K x N, layout NN/TN/NT/TT for a and b as stored, configuration, split-K S,
tiles, waves, the cost model's estimate), grouped by the user's source line; ``--all`` prints
every node instead of one per distinct (shape, layout).

    python tools/matmul_report.py                      # 2 x 1024 and 32 x 1024 tokens
    python tools/matmul_report.py --batch 2 --all
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tinymoe.py"


def report(batch: int, seq: int, num_sms: int, every: bool) -> list[str]:
    from latch_capture.examples import load_example
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    passes = registries().passes
    t0 = time.perf_counter()
    doc = load_example(EXAMPLE, batch=batch, seq=seq, device="meta").capture(grads=True)
    doc = run_pass(passes.get("memory.policy"), doc)
    doc = run_pass(passes.get("schedule.matmul_layouts"), doc)
    from latch_schedule.matmul_configs import configs_document

    doc, rep = configs_document(doc, num_sms=num_sms)
    seconds = time.perf_counter() - t0
    lines = [f"TinyMoE-200M, {batch} x {seq} tokens, {num_sms} SMs ({seconds:.1f} s to capture and choose)",
             f"{'node':<34} {'shape (MxKxN)':<18} {'layout':<6} {'config':<18} {'S':>2} {'tiles':>6} "
             f"{'waves':>5} {'est us':>8}  source"]
    seen = set()
    for prog, rows in rep.items():
        for r in rows:
            key = (r["shape"], r["layout"], r["source"])
            if not every and key in seen:
                continue
            seen.add(key)
            src = r["source"].rsplit("/", 1)[-1]
            lines.append(f"{r['node']:<34} {r['shape']:<18} {r['layout']:<6} {r['config']:<18} {r['split_k']:>2} "
                         f"{r['tiles']:>6} {r['waves']:>5} {r['cost_us']:>8.1f}  {src}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, action="append", help="sequences per update (default: 2 and 32)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--all", action="store_true", help="every matmul node, not one per distinct product")
    a = ap.parse_args(argv)
    for b in a.batch or [2, 32]:
        print("\n".join(report(b, a.seq, a.num_sms, a.all)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
