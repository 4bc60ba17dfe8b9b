"""Which line of the user's code produced each traced op.

Forward (and objective, forward_state, optimizer) ops: a TorchFunctionMode sees every torch call the
user's code makes, finds the innermost frame that is the user's (not torch, not a Latch or Latch
plugin package, not the standard library; installed libraries such as transformers ARE user code,
so a model from site-packages reports its own file, e.g. ``modeling_llama.py``) and sets it as fx's current stack trace, which ``make_fx`` copies onto the nodes
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

import importlib.util
import os
import sys
import sysconfig
import time
from typing import Callable

import torch
import torch.fx.traceback as fx_traceback
from torch.overrides import TorchFunctionMode

_KEY = "latch_source"

# Latch's own packages: their frames are plumbing (the CLI, the pipeline, op wrappers), never the
# line a user wrote. Third-party plugin packages (entry point group latch.plugins) are skipped too:
# a plugin's op wrapper is called from the user's line, which is the one to report.
LATCH_PACKAGES = ("latch_core", "latch_capture", "latch_ops", "latch_check", "latch_schedule", "latch_memory",
                  "latch_codegen_h100")


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _plugin_packages() -> set[str]:
    try:
        from importlib.metadata import entry_points

        eps = entry_points(group="latch.plugins")
    except Exception:  # broken metadata: only the built-in packages are skipped
        return set()
    return {ep.value.split(":")[0].split(".")[0] for ep in eps}


def _skip_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(roots whose frames are skipped, roots inside them that hold user code again).

    Skipped: torch, every Latch package and plugin package, and the standard library. The standard
    library's folder can contain site-packages (a virtual environment's ``platstdlib`` is
    ``.venv/lib/pythonX.Y``): installed libraries such as transformers are user code, the model's
    own file is the line to report, so site-/dist-packages folders are exempt from the stdlib rule.
    """
    roots = {os.path.dirname(torch.__file__)}
    for name in set(LATCH_PACKAGES) | _plugin_packages():
        d = _package_dir(name)
        if d and name != "torch":
            roots.add(d)
    keep = set()
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(p)
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            keep.add(p)
    for p in sys.path:
        if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            keep.add(p)

    def norm(paths):
        return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in paths}))

    return norm(roots), norm(keep)


_ROOTS, _KEEP = _skip_roots()
_IS_USER: dict[str, bool] = {}


def _is_user(filename: str) -> bool:
    """True for a frame of user code: the longest root containing the file decides (a skipped root,
    or a kept site-packages folder inside a skipped one); a file under no skipped root is user code."""
    r = _IS_USER.get(filename)
    if r is None:
        if filename.startswith("<"):
            r = False
        else:
            real = os.path.realpath(filename)
            best, r = -1, True
            for roots, user in ((_ROOTS, False), (_KEEP, True)):
                for root in roots:
                    if real.startswith(root) and len(root) > best:
                        best, r = len(root), user
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


_CAPTURE_DIR = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(__file__))), "")
_IS_CAPTURE: dict[str, bool] = {}


def _is_capture(filename: str) -> bool:
    r = _IS_CAPTURE.get(filename)
    if r is None:
        r = _IS_CAPTURE[filename] = os.path.realpath(filename).startswith(_CAPTURE_DIR)
    return r


_NN_DIR = os.path.join(os.path.realpath(os.path.dirname(torch.nn.__file__)), "")
_IS_NN: dict[str, bool] = {}


def _is_nn(filename: str) -> bool:
    r = _IS_NN.get(filename)
    if r is None:
        r = _IS_NN[filename] = os.path.realpath(filename).startswith(_NN_DIR)
    return r


def user_source(depth: int = 1) -> str | None:
    """The innermost user frame above the caller, formatted; None when there is none.

    The walk stops at the first frame of latch-capture itself: frames outside it are the code that
    called capture (the CLI, a pipeline, click), never the line that produced a traced op. A model
    made only of torch.nn layers (``nn.Sequential(nn.Linear(...), ...)``) has no frame of its own:
    then the innermost torch.nn frame (the layer's ``forward``) is the model's line.
    """
    f = sys._getframe(depth)
    layer = None
    while f is not None:
        name = f.f_code.co_filename
        if _is_user(name):
            return format_source(name, f.f_lineno, f.f_code.co_name)
        if _is_capture(name):
            break
        if layer is None and _is_nn(name) and f.f_code.co_name == "forward":
            layer = format_source(name, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return layer


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
        from .substitute import substitutes

        self.substitutes = substitutes()  # library calls traced as Latch ops (substitute.py)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = user_source(2)
        outer = self.last_source
        if src is not None:
            self.last_source = src
            fx_traceback.set_stack_trace([src])
        out = None
        sub = self.substitutes.get(func) if self.substitutes else None
        if sub is not None:
            out = sub(*args, **kwargs)
        if out is None:
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
