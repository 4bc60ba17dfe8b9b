"""Loading an example file by path: ``build(**overrides)`` -> :class:`~latch_capture.api.Example`.

The example's folder is put on ``sys.path`` while it loads, so examples can import shared helpers
next to them (``examples/_optim.py``). ``build`` may return an ``Example`` or a dict of its fields.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping

from latch_core.cli import parse_value

from .api import Example
from .errors import CaptureError


MODULES: dict[str, Any] = {}  # resolved example path -> the module last loaded from it
_LOADS = 0  # example modules loaded in this process (each gets its own module name)


def load_module(path: str | Path):
    p = Path(path)
    if not p.is_file():
        raise CaptureError(f"example file {str(p)!r} does not exist", hint="give the path of a Python file defining build()")
    folder = str(p.resolve().parent)
    # one name per load: torch.compile imports the module of every function it inlines BY NAME and
    # caches the import (dynamo's _import_module is functools.cache'd), so a second load under the
    # first one's name made a later compile guard on the first load's module (run 35: both compiled
    # controls of a bench's second shape, 32 x 1024, failed with "'NoneType' object is not subscriptable")
    global _LOADS
    _LOADS += 1
    name = f"latch_example_{p.stem}_{abs(hash(str(p.resolve())))}_{_LOADS}"
    spec = importlib.util.spec_from_file_location(name, p)
    module = importlib.util.module_from_spec(spec)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise CaptureError(f"example {str(p)!r} does not parse: {e.msg}", source=f"{e.filename or p}:{e.lineno}",
                           hint="fix the syntax error in the example file") from None
    except CaptureError:
        raise
    except Exception as e:
        raise CaptureError(f"example {str(p)!r} raised {type(e).__name__} while loading: {e}",
                           source=_user_frame(e, p), hint="fix the example file (it must import cleanly)") from None
    finally:
        if added:
            sys.path.remove(folder)
    MODULES[str(p.resolve())] = module
    return module


def _user_frame(exc: BaseException, path: str | Path) -> str | None:
    """``file:LINE in function`` of the innermost traceback frame in the example's own folder."""
    import traceback

    folder = Path(path).resolve().parent
    best = None
    for fr in traceback.extract_tb(exc.__traceback__):
        try:
            inside = Path(fr.filename).resolve().is_relative_to(folder)
        except (OSError, ValueError):
            inside = False
        if inside:
            best = f"{fr.filename}:{fr.lineno} in {fr.name}"
    return best


def _check_overrides(build, overrides: Mapping[str, Any], path) -> None:
    """Unknown --set keys, named with the ones build() takes (when its signature says)."""
    import inspect

    try:
        sig = inspect.signature(build)
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return  # build(**overrides): the example checks its own keys
    known = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise CaptureError(f"example {str(path)!r}: unknown --set key(s) {unknown}",
                           hint=f"build() takes {', '.join(known) if known else 'no arguments'}")


def load_example(path: str | Path, **overrides: Any) -> Example:
    module = load_module(path)
    build = getattr(module, "build", None)
    if not callable(build):
        raise CaptureError(f"example {str(path)!r} has no build() function",
                           hint="define build(**overrides) returning a latch_capture.Example or a dict of its fields")
    folder = str(Path(path).resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    _check_overrides(build, overrides, path)
    try:
        ex = build(**overrides)
    except CaptureError:
        raise
    except Exception as e:  # the user's code: their message, their line, no traceback (--debug shows it)
        hint = "fix the example or the --set values"
        if isinstance(e, TypeError) and "unexpected keyword argument" in str(e):
            hint = "one of the --set keys is not an argument the example accepts"
        raise CaptureError(f"example {str(path)!r}: build() raised {type(e).__name__}: {e}",
                           source=_user_frame(e, path), hint=hint) from e
    finally:
        if added:
            sys.path.remove(folder)
    if isinstance(ex, Mapping):
        try:
            ex = Example(**ex)
        except TypeError as e:
            raise CaptureError(f"example {str(path)!r}: build() returned a dict Example does not accept",
                               hint=str(e)) from None
    if not isinstance(ex, Example):
        raise CaptureError(f"example {str(path)!r}: build() returned a {type(ex).__name__}",
                           hint="return a latch_capture.Example or a dict of its fields")
    if not ex.name:
        ex.name = Path(path).stem
    return ex


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["d=64", "lr=0.1", "device=meta"]`` -> {"d": 64, "lr": 0.1, "device": "meta"}."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise CaptureError(f"override {item!r} is not KEY=VALUE", hint="write e.g. --set d_model=64")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(v.strip())
    return out


_LOADED: dict[tuple[str, str, str], Example] = {}


def load_example_once(path: str | Path, **overrides: Any) -> Example:
    """:func:`load_example`, memoised for the process by (file, its content, overrides): the capture
    pass and the checks after it share one Example (one model, one set of initial weights)."""
    import json

    from .cache import file_digest

    p = Path(path)
    if not p.is_file():
        raise CaptureError(f"example file {str(p)!r} does not exist", hint="give the path of a Python file defining build()")
    memo = (str(p.resolve()), file_digest(p.resolve()), json.dumps(overrides, sort_keys=True, default=repr))
    if memo not in _LOADED:
        _LOADED[memo] = load_example(p, **overrides)
    return _LOADED[memo]
