"""Running ninja with its progress shown: ninja prints ``[done/total] description`` per edge; those
lines drive a progress bar (latch_core.progress) while the whole output is kept for build.log and
error messages, as ``subprocess.run(capture_output=True)`` would."""

from __future__ import annotations

import re
import subprocess

from latch_core import progress

_EDGE = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")


def run_ninja(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a ninja command line); stdout and stderr together in ``.stdout``, ``.stderr`` empty."""
    lines: list[str] = []
    with progress.task("build (nvcc)") as bar:
        # NINJA_STATUS is ninja's default "[%f/%t] " made explicit, so a user's setting cannot break parsing
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_env())
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = _EDGE.match(line.strip())
            if m:
                bar.update(completed=int(m.group(1)), total=int(m.group(2)), note=_short(m.group(3)))
        rc = proc.wait()
    return subprocess.CompletedProcess(cmd, rc, "".join(lines), "")


def _env():
    import os

    return {**os.environ, "NINJA_STATUS": "[%f/%t] "}


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else "..." + text[-(n - 3):]
