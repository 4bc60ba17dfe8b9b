"""The fused body generator: elementwise ops and views of one group, one element at a time.

Pull model: for each element of the task's tile of the primary output (coordinates ``x0..``), each
group output is *pulled*: a value computed by an elementwise node is pulled at the same coordinates
(broadcast to its own shape) and its operands recursively; a value computed by a view is pulled by
pulling its input at the coordinates the view's index map gives; a group input is loaded. Each
(value, coordinates) pair is computed once per element (memoised), intermediates live in
registers, and only group inputs are read from memory.

Invariant: every group output has the primary's shape (an elementwise body writes every output at
the primary's index); anything else is refused with the output named.
"""

from __future__ import annotations

from .bodies import IN, OUT, BodySpec, _ptr_decl
from .cgen import dot, strides
from .lowering import Lowering, LoweringError, NodeInfo, compute_type, load_expr, storage_type


def tile_loop_open(rank: int, indent: str = "  ") -> tuple[list[str], list[str]]:
    """Open a block-strided loop over the task's tile; returns (lines, coordinate names).
    Coordinates ``x0..x{r-1}`` are absolute (the tile's offset included), of type long long."""
    lines = []
    if rank == 0:
        lines.append(f"{indent}for (long long i = threadIdx.x; i < 1; i += LATCH_THREADS) {{")
        return lines, []
    for d in range(rank):
        lines.append(f"{indent}const long long e{d} = (long long)c.t->hi[{d}] - c.t->lo[{d}];")
    lines.append(f"{indent}const long long n = {' * '.join(f'e{d}' for d in range(rank))};")
    lines.append(f"{indent}for (long long i = threadIdx.x; i < n; i += LATCH_THREADS) {{")
    if rank == 1:
        lines.append(f"{indent}  const long long x0 = c.t->lo[0] + i;")
    else:
        lines.append(f"{indent}  long long q = i;")
        for d in reversed(range(rank)):
            if d == 0:
                lines.append(f"{indent}  const long long x0 = c.t->lo[0] + q;")
            else:
                lines.append(f"{indent}  const long long x{d} = c.t->lo[{d}] + q % e{d}; q /= e{d};")
    return lines, [f"x{d}" for d in range(rank)]


def broadcast_coords(shape, out_shape, coords) -> list[str]:
    """Coordinates in ``shape`` of the element at ``coords`` of ``out_shape`` (NumPy broadcasting)."""
    r, ri = len(out_shape), len(shape)
    if ri > r:
        raise LoweringError(f"operand shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    out = []
    for d in range(ri):
        od = d + r - ri
        if shape[d] == 1:
            out.append("0LL")
        elif shape[d] != out_shape[od]:
            raise LoweringError(f"operand shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
        else:
            out.append(coords[od])
    return out


def node_info(spec: BodySpec, n, coords=()) -> NodeInfo:
    return NodeInfo(
        op=n.op,
        attrs=dict(n.attrs),
        in_dtypes=tuple(None if i is None else spec.values[i].dtype for i in n.inputs),
        out_dtypes=tuple(spec.values[o].dtype for o in n.outputs),
        in_shapes=tuple(None if i is None else spec.values[i].shape for i in n.inputs),
        out_shapes=tuple(spec.values[o].shape for o in n.outputs),
        coords=tuple(coords),
    )


class _Puller:
    def __init__(self, spec: BodySpec, lowerings: dict[str, Lowering], names: dict[int, str], indent: str):
        self.spec = spec
        self.low = lowerings
        self.names = names
        self.ind = indent
        self.lines: list[str] = []
        self.memo: dict[tuple, str] = {}
        self.producer = {o: n for n in spec.nodes for o in n.outputs}
        self.count = 0

    def _fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _coord_vars(self, coords: list[str]) -> list[str]:
        """Bind compound coordinate expressions to named temporaries (keeps the code readable)."""
        out = []
        for cexpr in coords:
            if cexpr.isidentifier() or cexpr.endswith("LL") and cexpr[:-2].lstrip("-").isdigit():
                out.append(cexpr)
                continue
            key = ("coord", cexpr)
            if key not in self.memo:
                name = self._fresh("k")
                self.lines.append(f"{self.ind}const long long {name} = {cexpr};")
                self.memo[key] = name
            out.append(self.memo[key])
        return out

    def load(self, vi: int, coords: list[str]) -> str:
        """A group input's element at ``coords``: a load from memory (the vector path overrides it)."""
        v = self.spec.values[vi]
        name = self._fresh("a")
        idx = dot(coords, strides(v.shape))
        self.lines.append(f"{self.ind}const {compute_type(v.dtype)} {name} = "
                          f"{load_expr(v.dtype, self.names[vi], idx)};")
        return name

    def pull(self, vi: int, coords: list[str]) -> str:
        coords = self._coord_vars(list(coords))
        key = (vi, tuple(coords))
        if key in self.memo:
            return self.memo[key]
        v = self.spec.values[vi]
        if v.kind == IN:
            name = self.load(vi, coords)
            self.memo[key] = name
            return name
        n = self.producer.get(vi)
        if n is None:
            raise LoweringError(f"group value {vi} is neither an input nor computed by a node of the group")
        low = self.low[n.op]
        info = node_info(self.spec, n, coords)
        if low.view_map is not None:
            src = next(i for i in n.inputs if i is not None)
            in_coords = low.view_map(list(coords), info)
            name = self.pull(src, in_coords)
            self.memo[key] = name
            return name
        if low.expr is None:
            raise LoweringError(f"{n.op} has no elementwise or view form")
        if len(n.outputs) != 1:
            raise LoweringError(f"{n.op} has {len(n.outputs)} outputs; the elementwise form computes one")
        args = []
        for i in n.inputs:
            if i is None:
                args.append("")
                continue
            args.append(self.pull(i, broadcast_coords(self.spec.values[i].shape, v.shape, coords)))
        expr = low.expr(args, info)
        name = self._fresh("v")
        ct = compute_type(v.dtype)
        self.lines.append(f"{self.ind}const {ct} {name} = ({ct})({expr});")
        self.memo[key] = name
        return name


def _const_loop(shape, indent: str = "  ") -> tuple[list[str], list[str]]:
    """The loop of a tile that spans every dim but the first: coordinates decoded with the shape's
    constant extents (the compiler turns the divisions into multiplies) and the element offset of
    the first coordinate known, so the common case (row tiles) avoids 64-bit run-time divisions."""
    r = len(shape)
    inner = 1
    for d in shape[1:]:
        inner *= d
    lines = [f"{indent}const long long n = ((long long)c.t->hi[0] - c.t->lo[0]) * {inner}LL;",
             f"{indent}const long long base_ = (long long)c.t->lo[0] * {inner}LL;",
             f"{indent}for (long long i = threadIdx.x; i < n; i += LATCH_THREADS) {{",
             f"{indent}  const long long l_ = base_ + i;"]
    acc = 1
    coords = [""] * r
    for d in reversed(range(1, r)):
        div = f"l_ / {acc}LL" if acc != 1 else "l_"
        lines.append(f"{indent}  const long long x{d} = ({div}) % {shape[d]}LL;")
        coords[d] = f"x{d}"
        acc *= shape[d]
    lines.append(f"{indent}  const long long x0 = l_ / {acc}LL;" if acc != 1 else f"{indent}  const long long x0 = l_;")
    coords[0] = "x0"
    return lines, coords


def fused_body(spec: BodySpec, lowerings: dict[str, Lowering]) -> list[str]:
    target = spec.values[spec.primary].shape
    decl, names = _ptr_decl(spec)
    for i, v in enumerate(spec.values):
        if v.kind == OUT and v.shape != target:
            raise LoweringError(
                f"fused group: output {v.index} has shape {v.shape}, the primary output {target}; "
                "a fused elementwise body writes every output at the primary's index"
            )

    def loop_body(coords: list[str]) -> list[str]:
        p = _Puller(spec, lowerings, names, "    ")
        stores = []
        for i, v in enumerate(spec.values):
            if v.kind == OUT:
                val = p.pull(i, coords)
                stores.append(f"    latch::st<{storage_type(v.dtype)}>({names[i]}, "
                              f"{dot(coords, strides(v.shape))}, {val});")
        return p.lines + stores

    from .flat import flat_spec, vector_lines

    flat = flat_spec(spec, lowerings)
    inner = 1
    for d in target[1:]:
        inner *= d
    if flat is not None and len(target) < 2:  # a 1-d tile is the flat range
        return decl + vector_lines(flat, lowerings, names, inner)
    if len(target) < 2:
        loop, coords = tile_loop_open(len(target))
        return decl + loop + loop_body(coords) + ["  }"]
    full = " && ".join(f"c.t->lo[{d}] == 0 && c.t->hi[{d}] == {n}" for d, n in enumerate(target) if d > 0)
    slow, scoords = tile_loop_open(len(target), "    ")
    ind = lambda lines: ["  " + x for x in lines]  # noqa: E731
    if flat is not None:  # row tiles take the flat vector path (flat.py)
        return (decl + [f"  if ({full}) {{  // the tile spans every dim but the first: one flat range"]
                + vector_lines(flat, lowerings, names, inner, "    ")
                + ["  } else {"] + slow + ind(loop_body(scoords)) + ["    }", "  }"])
    fast, fcoords = _const_loop(target, "    ")
    return (decl + [f"  if ({full}) {{  // the tile spans every dim but the first"] + fast + ind(loop_body(fcoords))
            + ["    }", "  } else {"] + slow + ind(loop_body(scoords)) + ["    }", "  }"])
