"""A mutation generator over every field of a document's schedule and memory sections (test support;
never on a production path).

The sections are walked as the records they are (attrs classes, tuples, ints, floats, strings):
every attrs field of every record, every element of every tuple, at any depth, is a *site*; its
*kind* is its path with the indices left out (``schedule.programs[].tasks[].tile[][]``,
``memory.programs[].placements[].buffer``, ``schedule.programs[].sms[][][]``, ...). A field added to
a record later is mutated without any change here. ``mutants`` picks a kind (so rare fields are hit
as often as the thousands of tile bounds), a site of that kind, and an operator for its type (kinds take turns in a shuffled round, so ``count`` >= the number of kinds mutates each):

- an int: +1, -1, + or - the alignment, doubled, 0, -1, or the value of another site of its kind;
- a float: doubled, + 1, 0;
- a string: another string of its kind, another of the document's value names, or a fresh name;
- a tuple: an element dropped, repeated, swapped with its neighbour, or moved to the front.

A mutant that the records themselves cannot represent (a converter raises) is skipped: such a
document could not be loaded. Whether a mutant is a hazard is decided elsewhere
(:mod:`latch_schedule.oracle`), not by how it was made.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import attrs

from latch_core.document import Document

Path = tuple  # of ("attr", name) / ("idx", i) steps


@attrs.frozen
class Mutation:
    kind: str  # the site's kind (its path without indices)
    path: str  # the site itself
    op: str  # what was done
    doc: Document


def _walk(obj: Any, path: Path, out: dict[str, list]) -> None:
    kind = _kind(path)
    out.setdefault(kind, []).append((path, obj))
    if attrs.has(type(obj)):
        for f in attrs.fields(type(obj)):
            _walk(getattr(obj, f.name), path + (("attr", f.name),), out)
    elif isinstance(obj, tuple):
        for i, x in enumerate(obj):
            _walk(x, path + (("idx", i),), out)


def _kind(path: Path) -> str:
    return "".join(f".{name}" if step == "attr" else "[]" for step, name in path).lstrip(".")


def _fmt(path: Path) -> str:
    return "".join(f".{name}" if step == "attr" else f"[{name}]" for step, name in path).lstrip(".")


def sites(doc: Document) -> dict[str, list[tuple[Path, Any]]]:
    """kind -> [(path, current value)] over the schedule and memory sections."""
    out: dict[str, list] = {}
    for name in ("schedule", "memory"):
        section = getattr(doc, name)
        if section is not None:
            _walk(section, (("attr", name),), out)
    return out


def _replace(obj: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    (step, key), rest = path[0], path[1:]
    if step == "attr":
        return attrs.evolve(obj, **{key: _replace(getattr(obj, key), rest, new)})
    items = list(obj)
    items[key] = _replace(items[key], rest, new)
    return tuple(items)


def _candidates(value: Any, kind: str, pool: dict[str, list], names: list[str], alignment: int,
                rng: random.Random):
    """(operator name, new value) pairs for one site."""
    if isinstance(value, bool):
        return [("flip", not value)]
    if isinstance(value, int):
        others = sorted({v for _, v in pool.get(kind, ()) if type(v) is int and v != value})
        out = [("+1", value + 1), ("-1", value - 1), ("+align", value + alignment), ("-align", value - alignment),
               ("x2", value * 2), ("=0", 0), ("=-1", -1)]
        if others:
            out.append(("=other", rng.choice(others)))
            out.append(("=max", others[-1]))
        return [(o, v) for o, v in out if v != value]
    if isinstance(value, float):
        return [("x2", value * 2 + 1e-9), ("+1", value + 1.0), ("=0", 0.0)]
    if isinstance(value, str):
        others = sorted({v for _, v in pool.get(kind, ()) if isinstance(v, str) and v != value})
        out = [("=fresh", value + "_x")]
        if others:
            out.append(("=other", rng.choice(others)))
        if names:
            out.append(("=name", rng.choice(names)))
        return [(o, v) for o, v in out if v != value]
    if isinstance(value, tuple) and value:
        out = [("drop", 0), ("repeat", 0), ("swap", 0), ("front", 0)]
        return out
    return []


def _structural(op: str, value: tuple, rng: random.Random) -> tuple | None:
    n = len(value)
    i = rng.randrange(n)
    items = list(value)
    if op == "drop":
        del items[i]
    elif op == "repeat":
        items.insert(i, items[i])
    elif op == "swap":
        if n < 2:
            return None
        j = i + 1 if i + 1 < n else i - 1
        items[i], items[j] = items[j], items[i]
    elif op == "front":
        if i == 0:
            return None
        items.insert(0, items.pop(i))
    return tuple(items)


def mutants(doc: Document, rng: random.Random, count: int) -> Iterator[Mutation]:
    """``count`` representable mutants of ``doc``, one site changed in each."""
    pool = sites(doc)
    kinds = sorted(pool)
    names = sorted({v.name for g in doc.graph.programs for v in g.values}) if doc.graph is not None else []
    alignment = doc.memory.alignment if doc.memory is not None else 256
    made = tries = 0
    turn: list[str] = []
    while made < count and tries < 50 * count:
        if not turn:  # every kind has a turn before any has a second (coverage with few mutants)
            turn = list(kinds)
            rng.shuffle(turn)
        kind = turn.pop()
        for _ in range(20):  # a kind's turn ends with a mutant, or after 20 unrepresentable tries
            tries += 1
            m = _one(doc, kind, pool, names, alignment, rng)
            if m is not None:
                made += 1
                yield m
                break


def _one(doc: Document, kind: str, pool, names, alignment, rng) -> Mutation | None:
    path, value = rng.choice(pool[kind])
    cands = _candidates(value, kind, pool, names, alignment, rng)
    if not cands:
        return None
    op, new = rng.choice(cands)
    if isinstance(value, tuple) and value and op in ("drop", "repeat", "swap", "front"):
        new = _structural(op, value, rng)
        if new is None or new == value:
            return None
    section = path[0][1]
    try:
        mutated = _replace(getattr(doc, section), path[1:], new)
    except (TypeError, ValueError, IndexError):
        return None  # not representable in the records (a converter refused it)
    if mutated == getattr(doc, section):
        return None
    return Mutation(kind, _fmt(path), op, attrs.evolve(doc, **{section: mutated}))
