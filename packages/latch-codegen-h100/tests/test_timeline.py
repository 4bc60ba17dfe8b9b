"""The per-SM timeline (latch_codegen_h100.timeline) from synthetic records: the trace's events sit
where the records say, the PNG decodes to the right pixels, the summary adds up. CPU only."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from latch_codegen_h100.profile import GroupInfo, LaunchRecords, ProfileError, ProgramLayout, aggregate
from latch_codegen_h100.timeline import (
    BACKGROUND, COLOURS, WAIT_COLOURS, class_summary, encode_png, timeline_png, trace,
)

# SM 0: task 0 [10, 40]  barrier [40, 60]  task 2 [62, 92];  SM 1: task 1 [12, 22]  barrier [23, 60]
# wait [60, 70]  task 3 [70, 85]  signal [85, 86];  a spare block 2.  Window [5, 95].
LAYOUT = ProgramLayout(
    "update",
    ((("task", 0), ("barrier", 0), ("task", 2)),
     (("task", 1), ("barrier", 0), ("wait", 0), ("task", 3), ("signal", 0))),
    (0, 0, 1, 1),
    {0: GroupInfo("latch::matmul", "mm_bf16", ("m",), "model.py:41 in forward"),
     1: GroupInfo("latch::add+latch::relu", "add_relu", ("a", "r"), None)},
)
CLASSES = {"latch::matmul": "matmul", "latch::add+latch::relu": "elementwise"}
REC = LaunchRecords("update", [(10, 40), (40, 60), (62, 92), (12, 22), (23, 60), (60, 70), (70, 85), (85, 86)],
                    [(5, 95), (8, 90), (6, 61)])


def test_trace_has_one_track_per_sm_and_every_instruction_at_its_time():
    doc = json.loads(json.dumps(trace({"update": LAYOUT}, [REC], CLASSES)))  # JSON-clean
    ev = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "kernel", 1: "SM 0", 2: "SM 1", 3: "SM 2"}
    x = [e for e in ev if e["ph"] == "X" and e["tid"] > 0]
    assert len(x) == 8
    first = next(e for e in x if e["tid"] == 1)
    assert first["name"] == "matmul @ model.py:41 in forward" and first["cat"] == "matmul"
    assert first["ts"] == pytest.approx((10 - 5) / 1000) and first["dur"] == pytest.approx(30 / 1000)
    assert first["args"]["task"] == 0 and first["args"]["body"] == "mm_bf16"
    waits = sorted((e["tid"], e["name"], e["dur"] * 1000) for e in x if e["cat"] in ("wait", "signal"))
    assert waits == [(1, "barrier 0", pytest.approx(20)), (2, "barrier 0", pytest.approx(37)),
                     (2, "signal 0", pytest.approx(1)), (2, "wait counter 0", pytest.approx(10))]
    kernel = [e for e in ev if e["ph"] == "X" and e["tid"] == 0]
    assert kernel[0]["dur"] == pytest.approx(90 / 1000)


def test_trace_refuses_records_of_another_build():
    with pytest.raises(ProfileError, match="instruction records"):
        trace({"update": LAYOUT}, [LaunchRecords("update", REC.instrs[:-1], REC.blocks)])


def _decode(png: bytes):
    """Our own minimal reader (8-bit RGB, filter 0 only: what encode_png writes), CRCs checked."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(png):
        n, = struct.unpack(">I", png[pos:pos + 4])
        kind, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        crc, = struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        chunks[kind] = chunks.get(kind, b"") + data
        pos += 12 + n
    w, h, depth, colour, _, _, _ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    rows = [raw[y * (3 * w + 1):(y + 1) * (3 * w + 1)] for y in range(h)]
    assert all(r[0] == 0 for r in rows)
    return w, h, lambda x, y: tuple(rows[y][1 + 3 * x:4 + 3 * x])


def test_encode_png_round_trips_and_checks_its_size():
    w, h, px = _decode(encode_png(2, 1, bytes([1, 2, 3, 4, 5, 6])))
    assert (w, h) == (2, 1) and px(0, 0) == (1, 2, 3) and px(1, 0) == (4, 5, 6)
    with pytest.raises(ValueError):
        encode_png(2, 2, b"\x00" * 3)


def test_png_colours_tasks_by_class_and_waits_red():
    # 90 ns over 90 pixels: pixel x covers ns [5 + x, 6 + x)
    w, h, px = _decode(timeline_png({"update": LAYOUT}, [REC], CLASSES, width=90, row_h=4))
    assert (w, h) == (90, 12)
    assert px(20, 0) == COLOURS["matmul"]          # SM 0, ns 25: task 0
    assert px(45, 1) == WAIT_COLOURS["barrier"]    # SM 0, ns 50: the barrier
    assert px(56, 0) == BACKGROUND                 # SM 0, ns 61: the gap before task 2
    assert px(70, 0) == COLOURS["elementwise"]     # SM 0, ns 75: task 2 (group 1)
    assert px(10, 4) == COLOURS["matmul"]          # SM 1, ns 15: task 1 (group 0)
    assert px(60, 5) == WAIT_COLOURS["wait"]       # SM 1, ns 65: the counter wait
    assert px(20, 3) == BACKGROUND                 # the line between SM bands
    assert px(30, 9) == BACKGROUND                 # the spare block draws nothing


def test_class_summary_adds_up_per_class_and_per_sm():
    rep = aggregate(LAYOUT, [REC])
    text, data = class_summary(rep, LAYOUT, CLASSES)
    cls = {c["class"]: c for c in data["classes"]}
    assert cls["matmul"]["ms_per_launch"] == pytest.approx(40e-6) and cls["matmul"]["tasks"] == 2
    assert cls["elementwise"]["ms_per_launch"] == pytest.approx(45e-6)
    assert data["waiting_fraction"] == pytest.approx(67 / 270)
    sm1 = data["sms"][1]
    assert sm1["busy_ms"] == pytest.approx(25e-6) and sm1["waiting_ms"] == pytest.approx(47e-6)
    assert "matmul" in text and "SM   1" in text and "waiting 24.8%" in text
