"""The arena simulator runs programs whose views are alias prefixes (issue 11): the view's reader
reads the operand's bytes through the view, and every program run matches the FP64 interpreter."""

from pathlib import Path

import pytest

pytest.importorskip("latch_memory")
pytest.importorskip("latch_schedule")
pytest.importorskip("latch_capture")

from latch_capture.examples import load_example  # noqa: E402
from latch_core.passes import run_pass  # noqa: E402
from latch_core.plugins import registries  # noqa: E402
from latch_check.simulator import check_example, prepare  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CASES = {
    "transformer": ("transformer.py", dict(vocab=64, d_model=32, layers=2, heads=4, mlp_hidden=48, batch=2, seq=8)),
    "tinymoe": ("tinymoe.py", dict(vocab=64, d_model=32, layers=2, heads=4, experts=4, expert_hidden=16, batch=2,
                                   seq=8)),
}


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_aliased_programs_match_fp64(case, strategy):
    path, kw = CASES[case]
    ex = load_example(EXAMPLES / path, **kw)
    passes = registries().passes
    # attention=False: attention reads FP32 q/k/v, so v is an alias of the q/k/v product past q and k
    # (with attention stored in BF16, v's select is read by its cast, which fuse_views clones instead)
    doc = run_pass(passes.get("memory.policy"), ex.capture(grads=True), attention=False)
    doc = run_pass(passes.get("schedule.alias_views"), doc)
    doc = prepare(doc, scheduler=strategy, num_sms=4)
    stats = dict(doc.schedule.stats)
    prog = doc.schedule.programs[0].program
    rows = dict(stats["aliases"])[prog]
    assert len(rows) >= 4 and any(off > 0 for _, _, off, _ in rows)  # the v of q/k/v sits past q and k
    run_pass(passes.get("schedule.validate"), doc)
    result = check_example(ex, doc, steps=2, seed=5)
    assert result.passed, result.format()
