"""The value classes of a row group: what the row body needs to know of each value.

A row group (latch-schedule ``rowgroups``) computes whole rows of ``R`` elements: a row reduction
over the innermost dim, the pointwise chain on its per-row statistic and the consumer at the rows'
shape. Each value it touches is one of four classes, decided from its shape alone, given the
group's ``rows`` (how many rows the group covers) and ``R`` (the row length):

- FULL: one element per (row, column), ``rows * R`` elements with the innermost extent ``R``
  (element ``(row, j)`` at flat offset ``row * R + j``);
- ROWVEC: one element per column, ``R`` elements along the innermost dim (a norm's weight);
- STAT: one element per row, ``rows`` elements with innermost extent 1;
- SCALAR: one element.

Anything else is ``None``: the group cannot be a row group. The scheduler (which decides the
groups) and the code generator (which writes the row body) both classify with this one function,
so the two can never disagree about a value.
"""

from __future__ import annotations

import math

FULL, ROWVEC, STAT, SCALAR = "full", "rowvec", "stat", "scalar"


def value_class(shape, rows: int, R: int) -> str | None:
    """FULL, ROWVEC, STAT, SCALAR or None (module docstring) for a value of ``shape`` in a row group
    of ``rows`` rows of ``R`` elements."""
    n = math.prod(shape)
    last = shape[-1] if shape else 1
    if n == rows * R and last == R:
        return FULL
    if n == R and last == R:
        return ROWVEC
    if n == rows and last == 1:
        return STAT
    if n == 1:
        return SCALAR
    return None
