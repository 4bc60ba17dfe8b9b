"""tools/trace_phases.py on a synthetic two-SM trace (CPU, no torch): intervals, wait, replays."""

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("trace_phases", ROOT / "tools" / "trace_phases.py")
tp = importlib.util.module_from_spec(spec)
sys.modules.setdefault("trace_phases", tp)  # dataclasses look their module up
spec.loader.exec_module(tp)


def _doc():
    # interval 0: tasks 0, 1 on SM 0 and task 2 on SM 1 (one phase); barrier; interval 1: task 3 on SM 1
    tasks = [dict(id=i, group=0, cost=c * 1e-6, phase=p) for i, (c, p) in enumerate([(10, 0), (10, 0), (10, 0), (5, 1)])]
    return {"schedule": {"num_sms": 2, "programs": [{
        "program": "update", "groups": [{"id": 0, "nodes": ["n"], "body": "b/0"}], "tasks": tasks,
        "sms": [[["task", 0], ["task", 1], ["barrier", 0]], [["task", 2], ["barrier", 0], ["task", 3]]],
        "counters": [], "num_barriers": 1}]}}


def _trace(d):
    ev = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": s + 1, "args": {"name": f"SM {s}"}} for s in range(2)]
    x = lambda tid, ts, du, **a: {"ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": du, "cat": "matmul", "args": a}
    ev += [x(1, 0, d[0], task=0), x(1, d[0] + 1, d[1], task=1), x(2, 0, d[2], task=2)]
    end = d[0] + 1 + d[1]
    w = {"ph": "X", "pid": 0, "tid": 2, "ts": d[2], "dur": end - d[2], "cat": "wait", "args": {"barrier": 0}}
    ev += [w, x(2, end + 2, d[3], task=3)]
    return {"traceEvents": ev}


def test_intervals_wait_and_replays():
    plan, tr = tp.read_plan(_doc()), tp.read_trace(_trace([20.0, 20.0, 4.0, 5.0]))
    tp.check(plan, tr)
    rows = tp.phase_rows(plan, tr)
    r0 = rows[0]
    assert (r0["tasks"], r0["max_us"], r0["mean_us"]) == (3, 40.0, 22.0)
    assert r0["wait_sm_us"] == pytest.approx(36.0)  # SM 1 busy 4 of 40
    assert r0["oracle_us"] == pytest.approx(24.0)  # 20 | 20 + 4
    gap, bar = tp.fit_overheads(plan, tr)
    assert gap == pytest.approx(1.0)
    # the plan's own replay reproduces the traced kernel time; the oracle saves 16 us of interval 0 (42 -> 26 with the gaps)
    assert tp.replay(plan, tr.dur, gap=gap, barrier=bar) == pytest.approx(tr.kernel_us)
    best = tp.replay(plan, tr.dur, gap=gap, barrier=bar, assign=lambda ts: tp.lpt(ts, tr.dur.__getitem__, 2))
    assert best == pytest.approx(tr.kernel_us - 16.0)
    bd = tp.breakdown(rows, 2)
    assert sum(b["wait_sm_us"] for b in bd.values()) == pytest.approx(36.0 + 5.0)  # interval 1: SM 0 idle 5


def test_a_trace_of_another_plan_is_refused():
    plan, tr = tp.read_plan(_doc()), tp.read_trace(_trace([1.0, 1.0, 1.0, 1.0]))
    del tr.dur[3]
    with pytest.raises(SystemExit, match="disagree"):
        tp.check(plan, tr)


def test_the_queue_can_be_kept_to_data_dependent_intervals():
    d = _doc()
    d["schedule"]["programs"][0]["groups"] = [{"id": 0, "nodes": ["n"], "body": "ragged_mm_grad_w/0"},
                                              {"id": 1, "nodes": ["m"], "body": "b/1"}]
    d["schedule"]["programs"][0]["tasks"][3]["group"] = 1
    plan, tr = tp.read_plan(d), tp.read_trace(_trace([20.0, 20.0, 4.0, 5.0]))
    assert tp.data_intervals(plan) == {0}  # interval 1 holds one task of another body
    gap, bar = tp.fit_overheads(plan, tr)
    # as a queue the 20 us tasks go to both SMs first, the 4 us one after: 21 | 26 instead of 42
    q = tp.replay(plan, tr.dur, gap=gap, barrier=bar, queue_grab=0.0, queued=tp.data_intervals(plan))
    assert q < tp.replay(plan, tr.dur, gap=gap, barrier=bar)
    names = [n for n, _ in tp.replays(plan, tr, [0.0])]
    assert any("data-dependent" in n for n in names)
    plan.body.update({t: "b/0" for t in plan.body})
    assert tp.data_intervals(plan) == set()


def test_profile_report_writes_the_analysis_of_its_trace(tmp_path, monkeypatch):
    """tools/profile_report.py --phases: the planned document saved beside the trace and
    trace_phases' tables written to the file named (loading trace_phases itself, as on the GPU
    machine: not the module this test file registered)."""
    import json

    monkeypatch.delitem(sys.modules, "trace_phases")

    spec2 = importlib.util.spec_from_file_location("profile_report", ROOT / "tools" / "profile_report.py")
    pr = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(pr)
    (tmp_path / "trace.json").write_text(json.dumps(_trace([20.0, 20.0, 4.0, 5.0])))
    pr.write_phases(_doc(), tmp_path, tmp_path / "out" / "phases.txt")
    text = (tmp_path / "out" / "phases.txt").read_text()
    assert (tmp_path / "planned.latch.json").exists()
    assert text.startswith("4 tasks, 1 barriers, 2 SMs") and "total wait caused" in text, text
    tables = json.loads((tmp_path / "out" / "phases.json").read_text())
    assert [r["interval"] for r in tables["intervals"]] == [0, 1]
