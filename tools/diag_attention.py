"""Diagnose the attention bodies case by case: each case runs in its OWN process, so a case that
faults (an illegal instruction poisons its CUDA context) says nothing wrong about the next one.

  python tools/diag_attention.py build DIR [--bwd wgmma] CASE...     # builds DIR/d64, DIR/d128 (no GPU needed)
  python tools/diag_attention.py run DIR [--glse] CASE...            # one subprocess per case (GPU)

CASE is name:B:H:Hkv:T:D:causal, e.g. c77d64:2:4:2:77:64:1. ``run`` prints one line per case:
``DIAG <name> ok|FAIL|CRASH rc=.. out=.. dq=.. dk=.. dv=.. same=..`` (relative L2 against FP64; the
gate is bench_attention.REL_GATE). LATCH_DIAG_SANITIZE=memcheck runs each case's process under
compute-sanitizer (its report goes to stdout: the faulting instruction's PC and function).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def parse(spec: str):
    from latch_check import bench_attention as BA

    try:
        name, b, h, hkv, t, d, causal = spec.split(":")
        return BA.Case(name, int(b), int(h), int(hkv), int(t), int(d), causal not in ("0", "n", "false"))
    except ValueError:
        raise SystemExit(f"diag_attention: case {spec!r} is not name:B:H:Hkv:T:D:causal (e.g. c77d64:2:4:2:77:64:1)")


def build(out: Path, specs: list[str], fwd: str, bwd: str, glse: bool, sms: int) -> None:
    from latch_core.document import Document
    from latch_core.ir import GraphSection
    from latch_check import bench_attention as BA
    from latch_codegen_h100 import build as cbuild

    cases = [parse(s) for s in specs]
    for d in sorted({c.head_dim for c in cases}):
        progs = [p for c in cases if c.head_dim == d
                 for p in BA._programs(c, "bf16", glse, None, None, fwd_body=fwd, bwd_body=bwd)]
        doc = Document(graph=GraphSection(progs, (), {"example": "diag_attention"}))
        cbuild(BA.plan_document(doc, sms), out / f"d{d}")
        print(f"built {out / f'd{d}'}: {len(progs)} programs", flush=True)


def one(out: Path, spec: str, glse: bool) -> int:
    import torch
    from latch_check import bench_attention as BA
    from latch_codegen_h100 import Program

    c = parse(spec)
    prog = Program.load(out / f"d{c.head_dim}")
    ins = BA.make_inputs(c, prog.device, seed=0, dtype=torch.bfloat16)
    ref = BA.reference(c, ins, glse=glse)
    errs, same = BA.check_case(prog, c, ins, ref, glse=glse)
    ok = same and all(e <= BA.REL_GATE for e in errs.values())
    print(f"DIAG {c.name} {'ok' if ok else 'FAIL'} " + " ".join(f"{k}={v:.2e}" for k, v in errs.items())
          + f" same={same}", flush=True)
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("build", "run", "one"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, out, rest = argv[0], Path(argv[1]), argv[2:]
    glse = "--glse" in rest
    rest = [a for a in rest if a != "--glse"]
    if mode == "build":
        bwd = "wgmma"
        if "--bwd" in rest:
            i = rest.index("--bwd")
            if i + 1 >= len(rest):
                print("diag_attention: --bwd needs a backward body (wgmma, wgmma2, mma)", file=sys.stderr)
                return 2
            bwd = rest[i + 1]
            del rest[i:i + 2]
        build(out, rest, "wgmma", bwd, glse, int(os.environ.get("LATCH_DIAG_SMS", "132")))
        return 0
    if mode == "one":
        return one(out, rest[0], glse)
    tool = os.environ.get("LATCH_DIAG_SANITIZE")
    worst = 0
    for spec in rest:
        cmd = [sys.executable, __file__, "one", str(out), spec] + (["--glse"] if glse else [])
        if tool:
            cmd = ["compute-sanitizer", "--tool", tool, "--kernel-name", "kns=latch_kernel", "--show-backtrace", "device"] + cmd
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=float(os.environ.get("LATCH_DIAG_S", "60")))
            text, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
        lines = [ln for ln in text.splitlines() if ln.startswith("DIAG ")]
        if not lines:
            tail = [ln for ln in text.splitlines() if ln.strip()][-25:]
            print(f"DIAG {spec.split(':')[0]} CRASH rc={rc}")
            print("\n".join("    " + ln for ln in tail))
        else:
            print(lines[-1] + f" rc={rc}")
            if tool:
                print("\n".join("    " + ln for ln in text.splitlines() if "=====" in ln or "Invalid" in ln
                                or "Illegal" in ln or "at 0x" in ln or "ERROR SUMMARY" in ln)[:4000])
        sys.stdout.flush()
        worst = max(worst, rc)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
