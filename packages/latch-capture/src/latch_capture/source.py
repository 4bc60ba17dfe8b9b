"""Which line of the user's code produced each traced op.

Forward (and objective, forward_state, optimizer) ops: a TorchFunctionMode sees every torch call the
user's code makes, finds the innermost frame that is the user's (not torch, not Latch, not the
standard library) and sets it as fx's current stack trace, which ``make_fx`` copies onto the nodes
it creates under ``fx.traceback.preserve_node_meta()``. The same mode tags the autograd node of each
result with that line.

Backward ops: before ``torch.autograd.grad`` runs, every autograd node reachable from the loss gets
a pre-hook that sets the line of the forward call that created it (nodes created inside a torch
function, e.g. the log_softmax inside cross_entropy, inherit the line of the node that consumes
them). So a backward node's ``source`` is the forward line it differentiates.

Source strings have the contract's form ``path/file.py:LINE in function`` (path relative to the
working directory when inside it).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from typing import Callable

import torch
import torch.fx.traceback as fx_traceback
from torch.overrides import TorchFunctionMode

import latch_ops

_KEY = "latch_source"


def _skip_roots() -> tuple[str, ...]:
    roots = {
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.abspath(__file__)),  # latch_capture
        os.path.dirname(os.path.abspath(latch_ops.__file__)),  # op wrappers (e.g. latch_ops.attention.sdpa)
    }
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(p)
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


_ROOTS = _skip_roots()
_IS_USER: dict[str, bool] = {}


def _is_user(filename: str) -> bool:
    r = _IS_USER.get(filename)
    if r is None:
        if filename.startswith("<"):
            r = False
        else:
            real = os.path.realpath(filename)
            r = not any(real.startswith(root) for root in _ROOTS)
        _IS_USER[filename] = r
    return r


def format_source(filename: str, line: int, function: str) -> str:
    path = filename
    try:
        rel = os.path.relpath(filename)
        if not rel.startswith(".."):
            path = rel
    except ValueError:  # another drive (Windows)
        pass
    return f"{path}:{line} in {function}"


def user_source(depth: int = 1) -> str | None:
    """The innermost user frame above the caller, formatted; None when there is none."""
    f = sys._getframe(depth)
    while f is not None:
        code = f.f_code
        if _is_user(code.co_filename):
            return format_source(code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return None


class SourceTracker(TorchFunctionMode):
    """Stamps the user's line on every node traced while the mode is active.

    ``last_source`` is the line of the most recent torch call, kept when that call raises, so a
    failure deep inside torch can be reported at the user's line. ``progress`` (optional) is called
    with a short message every few seconds on long traces.
    """

    def __init__(self, phase: str, progress: Callable[[str], None] | None = None):
        super().__init__()
        self.phase = phase
        self.last_source: str | None = None
        self.calls = 0
        self._progress = progress
        self._t0 = time.perf_counter()
        self._next_report = self._t0 + 2.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = user_source(2)
        outer = self.last_source
        if src is not None:
            self.last_source = src
            fx_traceback.set_stack_trace([src])
        out = func(*args, **kwargs)
        if src is not None:
            _tag_grad_fns(out, src)
        self.last_source = outer
        self.calls += 1
        if self._progress is not None and self.calls % 256 == 0:
            now = time.perf_counter()
            if now >= self._next_report:
                self._next_report = now + 2.0
                self._progress(f"  {self.phase}: {self.calls} torch calls traced ({now - self._t0:.1f} s)")
        return out


def _tag_grad_fns(out, src: str) -> None:
    if isinstance(out, torch.Tensor):
        fn = out.grad_fn
        if fn is not None and _KEY not in fn.metadata:
            fn.metadata[_KEY] = src
    elif isinstance(out, (tuple, list)):
        for o in out:
            _tag_grad_fns(o, src)


def clear_stack_trace() -> None:
    fx_traceback.set_stack_trace([])


def install_backward_sources(root: torch.Tensor, tracker: SourceTracker) -> None:
    """Pre-hooks on every autograd node reachable from ``root`` that set the forward line.

    Breadth-first from the root, so a node created inside a torch call (untagged) inherits the line
    of the nearest tagged node that consumes its output.
    """
    start = root.grad_fn
    if start is None:
        return
    inherited: dict = {start: start.metadata.get(_KEY)}
    queue = [start]
    i = 0
    while i < len(queue):
        node = queue[i]
        i += 1
        src = node.metadata.get(_KEY) or inherited.get(node)
        if src is not None:
            node.register_prehook(_make_prehook(src, tracker))
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in inherited:
                inherited[nxt] = src
                queue.append(nxt)


def _make_prehook(src: str, tracker: SourceTracker):
    def prehook(grad_outputs):
        tracker.last_source = src
        fx_traceback.set_stack_trace([src])

    return prehook


def node_source(fx_node) -> str | None:
    """The source stamped on an fx node (None for placeholders and untracked plumbing)."""
    st = fx_node.meta.get("stack_trace")
    return st or None
