"""A profiling run of the MLP on the GPU: records for every task, the globaltimer kernel time close to
the CUDA-event time of the same launch, fractions that make sense; a normal build refuses profile()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from latch_codegen_h100 import build
from latch_codegen_h100.profile import CATEGORIES, layout_from_document, report

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("scheduler", ["barrier", "dataflow"])
def test_profiling_run_of_the_mlp(tmp_path, scheduler):
    # the whole pipeline and the example runner are latch-check's (not a dependency of this package)
    GpuRun = pytest.importorskip("latch_check.gpu").GpuRun
    compile_example = pytest.importorskip("latch_check.pipeline").compile_example
    from latch_codegen_h100.runtime import ProgramError

    c = compile_example(ROOT / "examples" / "mlp.py", scheduler=scheduler, build=False)
    doc = build(c.doc, tmp_path / "prof", profile=True)
    run = GpuRun(c.example, tmp_path / "prof")
    prog = run.prog
    assert prog.profiling
    run.update(run.batches(0))  # warm-up
    prog.profile()
    for step in range(1, 4):
        run.update(run.batches(step))
    prog.check()
    records = prog.profile()
    assert len(records) == 3 and {r.program for r in records} == {"update"}
    assert prog.profile() == []  # read once

    lay = layout_from_document(doc, "update")
    for rec in records:
        assert len(rec.instrs) == lay.num_instrs and len(rec.blocks) == prog.num_sms
        assert all(b > 0 and e >= b for b, e in rec.instrs)  # every instruction, every task, recorded
        kernel_ms = (max(e for _, e in rec.blocks) - min(b for b, _ in rec.blocks)) / 1e6
        # The CUDA events bracket exactly this launch; they also hold the launch latency.
        assert rec.event_ms is not None and abs(kernel_ms - rec.event_ms) <= 0.10 * rec.event_ms, (kernel_ms,
                                                                                                   rec.event_ms)
    (rep,) = report(doc, records)
    tasks = len(doc.schedule.program("update").tasks)
    assert sum(s.tasks for s in rep.sms) == 3 * tasks
    assert sum(r.tasks for r in rep.by_op) == 3 * tasks
    assert 0.0 <= rep.waiting_fraction <= 1.0 and 0.0 < rep.fraction("busy") <= 1.0
    assert sum(rep.fraction(c) for c in CATEGORIES) == pytest.approx(1.0)
    if scheduler == "barrier":
        assert rep.totals["barrier"] > 0 and rep.totals["counter"] == 0
    else:
        assert rep.totals["barrier"] == 0

    normal = build(c.doc, tmp_path / "normal")
    from latch_codegen_h100.runtime import Program

    p = Program.load(normal.build.directory)
    assert not p.profiling
    with pytest.raises(ProgramError, match="not a profiling build"):
        p.profile()
