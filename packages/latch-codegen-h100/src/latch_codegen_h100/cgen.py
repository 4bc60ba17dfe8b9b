"""Small helpers that write index arithmetic in C++ for body lowerings.

Every value is contiguous row-major, so an element offset is a dot product of coordinates with
constant strides; these helpers write that arithmetic with the constants inlined.
"""

from __future__ import annotations

import math


def strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def contiguous_tile(shape, itype: str = "long long") -> tuple[str, str, str]:
    """(condition, first, count) for the task's tile of a row-major ``shape``: the condition holds
    when the tile is ONE contiguous range of memory (extent 1 in the dims before some dim k, the
    whole of every dim after it: a row tile is k = 0, and a (1, 16, 768) tile of a (2, 1024, 768)
    output is k = 1), ``first`` is its first element's flat offset and ``count`` its elements.
    The fast bodies take every contiguous tile, not only row tiles: the elementwise tiling splits a
    (2, 1024, 768) activation into (1, 16, 768) tiles, which the row-tile test sent to the general
    loop."""
    r = len(shape)
    if r == 0:
        return "true", "0", "1"
    ext = lambda d: f"((long long)c.t->hi[{d}] - c.t->lo[{d}])"  # noqa: E731
    st = strides(shape)
    conds = []
    for k in range(r):
        parts = [f"{ext(d)} == 1" for d in range(k)] + \
                [f"c.t->lo[{d}] == 0 && c.t->hi[{d}] == {shape[d]}" for d in range(k + 1, r)]
        conds.append("(" + (" && ".join(parts) or "true") + ")")
    first = " + ".join(f"({itype})c.t->lo[{d}] * ({itype}){st[d]}" for d in range(r))
    count = " * ".join(f"({itype}){ext(d)}" for d in range(r))
    return " || ".join(conds), f"({first})", f"({count})"


def dot(coords, strides_) -> str:
    terms = []
    for c, s in zip(coords, strides_):
        if c in ("0", "0LL") or s == 0:
            continue
        terms.append(c if s == 1 else f"{c} * {s}LL")
    return " + ".join(terms) if terms else "0LL"


def tile_decode(var: str, rank: int, prefix: str = "y", indent: str = "") -> list[str]:
    """Statements decoding ``var`` (a linear index into the task's tile, row-major over the tile's
    extents) into absolute coordinates ``{prefix}0 ..`` of the primary output."""
    if rank == 0:
        return []
    lines = [f"{indent}long long q_{prefix} = {var};"]
    for d in reversed(range(rank)):
        ext = f"((long long)c.t->hi[{d}] - c.t->lo[{d}])"
        if d == 0:
            lines.append(f"{indent}const long long {prefix}0 = c.t->lo[0] + q_{prefix};")
        else:
            lines.append(f"{indent}const long long {prefix}{d} = c.t->lo[{d}] + q_{prefix} % {ext}; q_{prefix} /= {ext};")
    return lines


def tile_count(rank: int) -> str:
    if rank == 0:
        return "1LL"
    return " * ".join(f"((long long)c.t->hi[{d}] - c.t->lo[{d}])" for d in range(rank))


def const_decode(var: str, sizes, prefix: str, indent: str = "") -> list[str]:
    """Decode ``var`` (linear, row-major over constant ``sizes``) into ``{prefix}0..``."""
    if not sizes:
        return []
    lines = [f"{indent}long long q_{prefix} = {var};"]
    for d in reversed(range(len(sizes))):
        if d == 0:
            lines.append(f"{indent}const long long {prefix}0 = q_{prefix};")
        else:
            lines.append(f"{indent}const long long {prefix}{d} = q_{prefix} % {sizes[d]}LL; q_{prefix} /= {sizes[d]}LL;")
    return lines


def merge_dims(dims, shape) -> list[tuple[int, int]]:
    """Merge runs of consecutive dims into (size, stride) pairs of the contiguous ``shape``."""
    st = strides(shape)
    out: list[tuple[int, int]] = []
    run: list[int] = []
    for d in sorted(dims):
        if run and d == run[-1] + 1:
            run.append(d)
        else:
            if run:
                out.append((math.prod(shape[x] for x in run), st[run[-1]]))
            run = [d]
    if run:
        out.append((math.prod(shape[x] for x in run), st[run[-1]]))
    return out


def lambda_offset(var: str, groups: list[tuple[int, int]], name: str) -> list[str]:
    """A device lambda ``name(var) -> long long`` mapping a linear index over merged groups
    (size, stride) to an element offset."""
    if not groups:
        return [f"auto {name} = [&](long long {var}) -> long long {{ return 0LL; }};"]
    if len(groups) == 1:
        size, st = groups[0]
        body = var if st == 1 else f"{var} * {st}LL"
        return [f"auto {name} = [&](long long {var}) -> long long {{ return {body}; }};"]
    lines = [f"auto {name} = [&](long long {var}) -> long long {{"]
    sizes = [g[0] for g in groups]
    lines += const_decode(var, sizes, f"{name}_", "  ")
    lines.append("  return " + dot([f"{name}_{k}" for k in range(len(groups))], [g[1] for g in groups]) + ";")
    lines.append("};")
    return lines
