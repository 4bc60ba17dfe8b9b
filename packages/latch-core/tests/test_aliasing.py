"""latch_core.aliasing.contiguous_offset against brute-force index maps (no torch)."""

from __future__ import annotations

import itertools
import math

import pytest

from latch_core.aliasing import contiguous_offset


def _flat(shape, idx):
    f = 0
    for d, i in zip(shape, idx):
        f = f * d + i
    return f


def _source(op, attrs, x, out, idx):
    """The operand index output element ``idx`` reads (latch_ops.views' index maps)."""
    if op == "latch::reshape":
        f = _flat(out, idx)
        res = []
        for d in reversed(x):
            res.append(f % d)
            f //= d
        return tuple(reversed(res))
    if op == "latch::permute":
        src = [0] * len(x)
        for k, p in enumerate(attrs["perm"]):
            src[p] = idx[k]
        return tuple(src)
    if op == "latch::expand":
        lead = len(out) - len(x)
        return tuple(0 if x[d] == 1 else idx[d + lead] for d in range(len(x)))
    if op == "latch::slice":
        i = list(idx)
        i[attrs["dim"]] = attrs["start"] + i[attrs["dim"]] * attrs["step"]
        return tuple(i)
    if op == "latch::select":
        return tuple(idx[:attrs["dim"]]) + (attrs["index"],) + tuple(idx[attrs["dim"]:])
    raise AssertionError(op)


def _truth(op, attrs, x, out):
    """The offset if output element i is operand element offset + i for every i, else None."""
    offs = {_flat(x, _source(op, attrs, x, out, idx)) - k
            for k, idx in enumerate(itertools.product(*(range(d) for d in out)))}
    return offs.pop() if len(offs) == 1 else None


def _cases():
    for shape in [(3, 4), (1, 4, 2), (2, 1, 3), (1, 1, 5), (4,)]:
        n = math.prod(shape)
        yield "latch::reshape", {}, shape, (n,)
        for perm in itertools.permutations(range(len(shape))):
            yield "latch::permute", {"perm": perm}, shape, tuple(shape[p] for p in perm)
        for dim in range(len(shape)):
            for index in range(shape[dim]):
                yield "latch::select", {"dim": dim, "index": index}, shape, shape[:dim] + shape[dim + 1:]
            size = shape[dim]
            for start in range(size):
                for end in range(start + 1, size + 1):
                    for step in (1, 2):
                        out = list(shape)
                        out[dim] = (end - start + step - 1) // step
                        yield "latch::slice", {"dim": dim, "start": start, "end": end, "step": step}, shape, tuple(out)
    yield "latch::expand", {"shape": (1, 3, 4)}, (3, 4), (1, 3, 4)
    yield "latch::expand", {"shape": (2, 3, 4)}, (1, 3, 4), (2, 3, 4)
    yield "latch::expand", {"shape": (3, 4)}, (3, 1), (3, 4)


@pytest.mark.parametrize("op,attrs,x,out", list(_cases()))
def test_contiguous_offset_matches_the_index_map(op, attrs, x, out):
    assert contiguous_offset(op, attrs, x, out) == _truth(op, attrs, x, out)


def test_the_cases_cover_both_answers():
    answers = [contiguous_offset(*c) is None for c in _cases()]
    assert any(answers) and not all(answers)
    assert contiguous_offset("latch::concat", {"dim": 0}, (2, 3), (2, 3)) is None
