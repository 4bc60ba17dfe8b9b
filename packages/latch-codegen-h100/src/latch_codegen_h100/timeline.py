"""The per-SM timeline of a profiling build's launches, as pictures: a Chrome/Perfetto trace, a PNG,
and the summary of busy and waiting time per SM and per op class.

    doc = trace(layout, launches, classes)          # dict: json.dump it, open in ui.perfetto.dev
    png = timeline_png(layout, launches, classes)   # bytes of a PNG: one row band per SM
    text, data = class_summary(report, layout, classes)

Trace (the Trace Event Format Perfetto and chrome://tracing read): one process per program, one
thread (track) per SM, named ``SM n``; every instruction an SM ran is a complete event (``ph: X``)
at its ``%globaltimer`` interval, in microseconds from the first block entry of the first launch:
a task is named by its op(s) and source line (``matmul @ model.py:41 in forward``), with its task
id, fusion group, body and nodes in ``args``; barrier waits (``barrier N``), counter waits
(``wait counter N``) and releases (``signal N``) are events of their own, category ``wait`` or
``signal``, so the waiting is visible on the track. Launch windows are events on a ``kernel`` track.

PNG: time runs left to right over the launches' span; each SM is a band of ``row_h`` pixels;
tasks are coloured by op class (``COLOURS``; the legend is :func:`legend`), barrier waits red,
counter waits orange, signals yellow, nothing (idle, dispatch gaps) light grey. The encoder is
our own (zlib + CRC, 8-bit RGB, filter 0): no imaging library.

Op classes: the first of ``CLASS_ORDER`` among the registered tags of a group's ops
(:func:`classes_from_registry`), else ``other``. No torch here: tested on the CPU from synthetic
records.
"""

from __future__ import annotations

import struct
import zlib
from collections import defaultdict
from typing import Mapping, Sequence

from .profile import LaunchRecords, ProfileError, ProgramLayout, ProgramReport, queue_events

CLASS_ORDER = ("attention", "matmul", "routing", "moe", "norm", "reduction", "indexing", "elementwise", "view")
COLOURS: dict[str, tuple[int, int, int]] = {
    "attention": (148, 103, 189), "matmul": (31, 119, 180), "routing": (140, 86, 75), "moe": (23, 190, 207),
    "norm": (44, 160, 44), "reduction": (188, 189, 34), "indexing": (227, 119, 194), "elementwise": (127, 127, 127),
    "view": (199, 199, 199), "other": (90, 90, 90),
}
WAIT_COLOURS = {"barrier": (214, 39, 40), "wait": (255, 127, 14), "signal": (255, 221, 0)}
BACKGROUND = (240, 240, 240)


def classes_from_registry(layout: ProgramLayout) -> dict[str, str]:
    """{group op string: op class} from the registered ops' tags (empty where nothing is registered)."""
    try:
        from latch_core.plugins import registries

        ops = registries().ops
    except Exception:  # no plugins: every group is "other"
        return {}
    out = {}
    for info in layout.groups.values():
        tags: set[str] = set()
        for op in info.op.split("+"):
            if op in ops:
                tags |= set(ops.get(op).tags)
        out[info.op] = next((c for c in CLASS_ORDER if c in tags), "other")
    return out


def _class(layout: ProgramLayout, classes: Mapping[str, str] | None, gid: int) -> str:
    return (classes or {}).get(layout.groups[gid].op, "other")


def _name(info) -> str:
    op = info.op.replace("latch::", "")
    return f"{op} @ {info.source}" if info.source else op


def _instructions(layout: ProgramLayout, rec: LaunchRecords):
    """(sm, kind, arg, begin, end) of every instruction of one launch, checked against the layout."""
    if rec.program != layout.program:
        raise ProfileError(f"records of program {rec.program!r} given with the layout of {layout.program!r}")
    if len(rec.instrs) != layout.num_instrs:
        raise ProfileError(f"program {layout.program!r}: {len(rec.instrs)} instruction records, the schedule has "
                           f"{layout.num_instrs}: the build and the document disagree")
    pc = 0
    for sm, instrs in enumerate(layout.sms):
        for kind, arg in instrs:
            b, e = rec.instrs[pc]
            pc += 1
            if kind != "ticket" and b and e and e >= b:  # (a ticket has no record: its queue's tasks do)
                yield sm, kind, arg, b, e
    if layout.queues:
        for sm, t, b, e in queue_events(layout, rec):
            yield sm, "task", t, b, e


def _origin(launches: Sequence[LaunchRecords]) -> int:
    starts = [b for rec in launches for b, _ in rec.blocks if b]
    if not starts:
        raise ProfileError("no block entry records: nothing to draw")
    return min(starts)


def trace(layouts: Mapping[str, ProgramLayout], launches: Sequence[LaunchRecords],
          classes: Mapping[str, str] | None = None) -> dict:
    """The Chrome/Perfetto trace of ``launches`` (module docstring); ``layouts`` by program name."""
    t0 = _origin(launches)
    us = lambda ns: (ns - t0) / 1000.0  # noqa: E731
    events: list[dict] = []
    pids: dict[str, int] = {}
    for rec in launches:
        layout = layouts.get(rec.program)
        if layout is None:
            raise ProfileError(f"no schedule layout for program {rec.program!r}")
        if rec.program not in pids:
            pid = pids[rec.program] = len(pids)
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"program {rec.program}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "kernel"}})
            for sm in range(len(rec.blocks)):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": sm + 1, "args": {"name": f"SM {sm}"}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": sm + 1,
                               "args": {"sort_index": sm + 1}})
        pid = pids[rec.program]
        begins = [b for b, _ in rec.blocks if b]
        ends = [e for _, e in rec.blocks if e]
        if begins and ends:
            events.append({"ph": "X", "name": f"launch {rec.program}", "cat": "kernel", "pid": pid, "tid": 0,
                           "ts": us(min(begins)), "dur": (max(ends) - min(begins)) / 1000.0,
                           "args": {"event_ms": rec.event_ms}})
        for sm, kind, arg, b, e in _instructions(layout, rec):
            ev = {"ph": "X", "pid": pid, "tid": sm + 1, "ts": us(b), "dur": (e - b) / 1000.0}
            if kind == "task":
                gid = layout.task_group[arg]
                info = layout.groups[gid]
                ev.update(name=_name(info), cat=_class(layout, classes, gid),
                          args={"task": arg, "group": gid, "body": info.body, "nodes": list(info.nodes[:8]),
                                "source": info.source})
            elif kind == "barrier":
                ev.update(name=f"barrier {arg}", cat="wait", args={"barrier": arg})
            elif kind == "wait":
                ev.update(name=f"wait counter {arg}", cat="wait", args={"counter": arg})
            else:
                ev.update(name=f"signal {arg}", cat="signal", args={"counter": arg})
            events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock": "%globaltimer, microseconds from the first block entry"}}


# ------------------------------------------------------------------------------------------
# PNG


def encode_png(width: int, height: int, rgb: bytes | bytearray) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (row-major, 3 bytes a pixel), every row with filter 0."""
    if width < 1 or height < 1 or len(rgb) != width * height * 3:
        raise ValueError(f"encode_png: {len(rgb)} bytes for {width} x {height} RGB pixels")
    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[y * stride:(y + 1) * stride]) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def timeline_png(layouts: Mapping[str, ProgramLayout], launches: Sequence[LaunchRecords],
                 classes: Mapping[str, str] | None = None, *, width: int = 1600, row_h: int = 4) -> bytes:
    """The PNG of the launches' per-SM timeline (module docstring): SM bands top to bottom."""
    t0 = _origin(launches)
    t1 = max(e for rec in launches for _, e in rec.blocks if e)
    span = max(1, t1 - t0)
    sms = max(len(rec.blocks) for rec in launches)
    height = sms * row_h
    img = bytearray(bytes(BACKGROUND) * (width * height))

    def fill(sm: int, b: int, e: int, colour) -> None:
        x0 = min(width - 1, (b - t0) * width // span)
        x1 = max(x0 + 1, min(width, -(-(e - t0) * width // span)))  # at least one pixel
        px = bytes(colour) * (x1 - x0)
        for y in range(sm * row_h, sm * row_h + max(1, row_h - 1)):  # one pixel line between SMs
            o = (y * width + x0) * 3
            img[o:o + len(px)] = px

    for rec in launches:
        layout = layouts[rec.program]
        for sm, kind, arg, b, e in _instructions(layout, rec):
            colour = COLOURS[_class(layout, classes, layout.task_group[arg])] if kind == "task" else WAIT_COLOURS[kind]
            fill(sm, b, e, colour)
    return encode_png(width, height, img)


def legend() -> str:
    named = [f"{k} rgb{v}" for k, v in COLOURS.items()]
    waits = [f"{k} rgb{v}" for k, v in WAIT_COLOURS.items()]
    return ("timeline colours: tasks by op class: " + ", ".join(named) + "; waits: " + ", ".join(waits)
            + f"; idle/dispatch rgb{BACKGROUND}")


# ------------------------------------------------------------------------------------------
# Summary per SM and per op class


def class_summary(rep: ProgramReport, layout: ProgramLayout, classes: Mapping[str, str] | None = None
                  ) -> tuple[str, dict]:
    """Busy and waiting time per SM and per op class of one program's report: (text, JSON data)."""
    per = rep.launches
    by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rep.by_op:
        c = (classes or {}).get(row.name, "other")
        by_class[c][0] += row.tasks
        by_class[c][1] += row.total_ns
    denom = rep.sm_time_ns or 1
    cls_rows = sorted(by_class.items(), key=lambda kv: (-kv[1][1], kv[0]))
    sms = [{"sm": s.sm, "tasks": s.tasks // per, "busy_ms": s.times["busy"] / per / 1e6,
            "waiting_ms": s.waiting() / per / 1e6, "barrier_ms": s.times["barrier"] / per / 1e6,
            "counter_ms": s.times["counter"] / per / 1e6,
            "idle_ms": (s.times["idle_start"] + s.times["idle_end"] + s.times["spare"]) / per / 1e6,
            "other_ms": s.times["other"] / per / 1e6} for s in rep.sms]
    data = {"program": rep.program, "launches": per, "kernel_ms": rep.kernel_ns / per / 1e6, "grid": rep.grid,
            "busy_fraction": rep.fraction("busy"), "waiting_fraction": rep.waiting_fraction,
            "classes": [{"class": c, "tasks": v[0] // per, "ms_per_launch": v[1] / per / 1e6, "share": v[1] / denom}
                        for c, v in cls_rows],
            "sms": sms}
    lines = [f"TIMELINE program {rep.program}: busy {100 * rep.fraction('busy'):.1f}% and waiting "
             f"{100 * rep.waiting_fraction:.1f}% of {rep.grid} SMs x {rep.kernel_ns / per / 1e6:.4f} ms per launch",
             "  per op class (SM-time share, ms summed over the SMs per launch, tasks):"]
    lines += [f"    {c:<12s} {100 * v[1] / denom:6.2f}% {v[1] / per / 1e6:10.4f} ms {v[0] // per:7d}" for c, v in cls_rows]
    lines.append("  per SM, ms per launch: busy / waiting (barrier + counter) / idle")
    for s in sms:
        lines.append(f"    SM {s['sm']:3d}: {s['busy_ms']:.4f} / {s['waiting_ms']:.4f} ({s['barrier_ms']:.4f} + "
                     f"{s['counter_ms']:.4f}) / {s['idle_ms']:.4f}  [{s['tasks']} tasks]")
    return "\n".join(lines), data


__all__ = ["trace", "timeline_png", "encode_png", "class_summary", "classes_from_registry", "legend", "COLOURS",
           "WAIT_COLOURS", "CLASS_ORDER"]
