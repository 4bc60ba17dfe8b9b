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

import math
import re

from .bodies import IN, OUT, BodySpec, _ptr_decl
from .cgen import dot, strides
from .lowering import Lowering, LoweringError, NodeInfo, compute_type, load_expr, storage_type

CONCAT = "latch::concat"  # fused with its producers and consumers (latch_schedule.fusion): _Puller._concat
# The vector path pulls a concat's regions jointly (_IlpPuller._joint); False pulls each region on
# its own and selects (the same values per element: the tests build both and compare the bits)
JOINT_REGIONS = True


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
        n, low = self._producer_of(vi)
        if n.op == CONCAT:
            return self._concat(key, v, n, coords, self.pull)
        info = node_info(self.spec, n, coords)
        if low.view_map is not None:
            src = next(i for i in n.inputs if i is not None)
            in_coords = low.view_map(list(coords), info)
            name = self.pull(src, in_coords)
            self.memo[key] = name
            return name
        return self._elementwise(key, v, n, low, info,
                                 lambda i: self.pull(i, broadcast_coords(self.spec.values[i].shape, v.shape, coords)))

    def _concat(self, key, v, n, coords: list[str], pull) -> str:
        """A concatenation's element at ``coords``: only the operand whose region holds it is
        pulled, inside its own branch (``if (x_d < end_0) {...} else if ...``); values computed in a
        branch are scoped to it (the memo is restored after each), values pulled before it are
        shared. ``pull(value, coords)`` pulls an operand (the scalar or the lane puller's)."""
        dim = int(dict(n.attrs)["dim"]) % len(v.shape)
        ins = [i for i in n.inputs if i is not None]
        name = self._fresh("c")
        ct = compute_type(v.dtype)
        self.lines.append(f"{self.ind}{ct} {name};")
        off, ind = 0, self.ind
        for k, i in enumerate(ins):
            extent = self.spec.values[i].shape[dim]
            last = k == len(ins) - 1
            if k == 0:
                self.lines.append(f"{ind}if ({coords[dim]} < {off + extent}LL) {{")
            elif last:
                self.lines.append(f"{ind}}} else {{")
            else:
                self.lines.append(f"{ind}}} else if ({coords[dim]} < {off + extent}LL) {{")
            saved = dict(self.memo)
            self.ind = ind + "  "
            sub = list(coords)
            sub[dim] = coords[dim] if off == 0 else f"({coords[dim]} - {off}LL)"
            val = pull(i, sub)
            self.lines.append(f"{self.ind}{name} = {val};")
            self.memo = saved
            self.ind = ind
            off += extent
        self.lines.append(f"{ind}}}")
        self.memo[key] = name
        return name

    def _producer_of(self, vi: int):
        """The group node computing value ``vi`` and its lowering."""
        n = self.producer.get(vi)
        if n is None:
            raise LoweringError(f"group value {vi} is neither an input nor computed by a node of the group")
        return n, self.low[n.op]

    def _elementwise(self, key, v, n, low, info, pull_input) -> str:
        """``n``'s elementwise expression over its inputs (each from ``pull_input(value index)``, in
        input order), bound to a fresh register of ``v``'s compute type and memoised under ``key``."""
        if low.expr is None:
            raise LoweringError(f"{n.op} has no elementwise or view form")
        if len(n.outputs) != 1:
            raise LoweringError(f"{n.op} has {len(n.outputs)} outputs; the elementwise form computes one")
        args = ["" if i is None else pull_input(i) for i in n.inputs]
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
    from .cgen import contiguous_tile

    _, first, count = contiguous_tile(shape)
    lines = [f"{indent}const long long n = {count};",
             f"{indent}const long long base_ = {first};",
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
    if len(target) < 1:
        loop, coords = tile_loop_open(len(target))
        return decl + loop + loop_body(coords) + ["  }"]
    from .cgen import contiguous_tile

    full, first, _ = contiguous_tile(target)
    slow, scoords = tile_loop_open(len(target), "    ")
    ind = lambda lines: ["  " + x for x in lines]  # noqa: E731
    if flat is not None:  # contiguous tiles (row tiles among them) take the flat vector path (flat.py)
        return (decl + [f"  if ({full}) {{  // the tile spans every dim but the first: one flat range"]
                + vector_lines(flat, lowerings, names, inner, "    ", shape=tuple(target))
                + ["  } else {"] + slow + ind(loop_body(scoords)) + ["    }", "  }"])
    fast, fcoords = _const_loop(target, "    ")
    # row tiles take the vector/ILP path when its vector operands are aligned, else one element per
    # thread with the constant-extent decode; other tiles the general loop
    try:
        ilp, cond = ilp_lines(spec, lowerings, names, "    ")
    except NotLaneUniform:
        # a concat whose region changes inside a group of W lanes: one element per thread, the
        # concat branching per element (the constant-extent decode for row tiles)
        return (decl + [f"  if ({full}) {{  // row tiles: constant-extent decode"] + fast + ind(loop_body(fcoords))
                + ["    }", "  } else {"] + slow + ind(loop_body(scoords)) + ["    }", "  }"])
    if target[-1] % 4 == 0:  # groups of four start at multiples of four (a tile cut along the last dim)
        cond = f"({cond}) && ({first}) % 4 == 0"
    return (decl + [f"  if (({full}) && ({cond})) {{  // row tiles: U groups of W elements per thread"] + ilp
            + [f"  }} else if ({full}) {{  // row tiles, operands not aligned for the vector accesses"]
            + fast + ind(loop_body(fcoords))
            + ["    }", "  } else {"] + slow + ind(loop_body(scoords)) + ["    }", "  }"])


# --------------------------------------------------------------------------------------------
# The vector/ILP path of the general fused body (row tiles: the tile spans every dim but the first)
#
# Each thread takes U groups of W consecutive elements along the primary's innermost dim (W = 4 when
# that extent is a multiple of 4, else 1) per iteration: first every load of every group (so
# U x operands accesses are in flight per thread), then the arithmetic in registers, then the
# stores. Each group input read is classified by how its flat offset moves across the W lanes:
#   VEC    offset(lane j) = offset(lane 0) + j, offset(lane 0) a multiple of W: one ld4 (16 bytes
#          for FP32) per group (the output's own coordinates, a reshape, a slice of leading dims or
#          aligned columns, a broadcast of leading dims, a permute that keeps the last dim);
#   BCAST  the same element for every lane (a (T, 1) row statistic): one load per group;
#   GEN    anything else (a permute that moves the innermost dim): W loads, still before compute.
# The classification follows the pull chain from the output (VEC at its own coordinates) through
# each view's rule below; when unsure it answers GEN, which is correct for any index map.
# A concat keeps its state when its region is the same for the W lanes (its dim is not the innermost,
# or its boundaries are multiples of W): the region is chosen once per group (_IlpPuller._concat_lanes);
# else the group takes the element loop (NotLaneUniform).

VEC_, BCAST_, GEN_ = "vec", "bcast", "gen"
ILP_IN_FLIGHT, ILP_MIN_U, ILP_MAX_U = 192, 2, 12
# L2 prefetch distance of the row-tile path, in iterations: at least ILP_PREFETCH_AHEAD (0: none),
# at most ILP_PREFETCH_MAX (ilp_lines: enough for ~2 x ILP_IN_FLIGHT bytes per thread ahead)
ILP_PREFETCH_AHEAD, ILP_PREFETCH_MAX = 2, 8
# Ops whose accurate float forms carry a slow path with a local array (sinf/cosf/tanf's Payne-Hanek
# argument reduction, erff, powf's exact cases) take U = ILP_MIN_U: each group unrolls that code U x W
# times. TinyMoE-200M's RoPE tables (arange, exp, cos, sin; no loads) took U = 12: 9,504 SASS
# instructions, 303 LDL / 213 STL in one body, 53 us for 6.5k elements a task (run 29, phase 0).
ILP_HEAVY = frozenset({"latch::sin", "latch::cos", "latch::tan", "latch::erf", "latch::erfinv", "latch::pow",
                       "latch::gelu", "latch::gelu_backward", "latch::atan2", "latch::lgamma", "latch::digamma"})
_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1}
_LANE = re.compile(r"\bj_\b")
_REG = re.compile(r"\br\d+_(?!\w)")
_LONG = re.compile(r"(?<![\w.])(\d+)LL\b")


def _view_state(op: str, st: str, info: NodeInfo, W: int) -> str:
    """The state of a view's input given its output's (module comment above)."""
    if st != VEC_:
        return st  # BCAST stays BCAST (coordinates independent of the lane), GEN stays GEN
    so, si = tuple(info.out_shapes[0]), tuple(info.in_shapes[0])
    if op == "latch::reshape":  # flat order is kept: the input's flat offset is the output's
        return VEC_ if si and si[-1] % W == 0 else GEN_
    if not si:
        return BCAST_
    last = len(si) - 1
    if op == "latch::permute":
        return VEC_ if tuple(info.attr("perm"))[-1] % len(si) == last else GEN_
    if op == "latch::expand":
        if si[-1] == 1 and so[-1] != 1:
            return BCAST_
        return VEC_ if si[-1] == so[-1] else GEN_
    if op == "latch::slice":
        if info.attr("dim") % len(si) != last:
            return VEC_
        ok = info.attr("step") == 1 and info.attr("start") % W == 0 and si[-1] % W == 0
        return VEC_ if ok else GEN_
    if op == "latch::select":
        return GEN_ if info.attr("dim") % len(si) == last else VEC_
    return GEN_


def _operand_state(st: str, shape, out_shape) -> str:
    """The state of an elementwise node's (broadcast) operand given its output's."""
    if st != VEC_:
        return st
    if len(shape) == 0 or (shape[-1] == 1 and out_shape[-1] != 1):
        return BCAST_
    return VEC_


class NotLaneUniform(LoweringError):
    """A concat whose operand region can change inside one group of W lanes: the vector path does
    not apply (the caller takes the one-element-per-thread loop, which branches per element)."""


class _IlpPuller(_Puller):
    """The fused puller for one lane ``j_`` of one group ``u_``: group inputs come from registers
    that the load phase fills (``self.loads``, one entry per distinct access, register ``r{k}_``;
    :func:`ilp_lines` renames them to the shared registers :func:`_slots` assigns).

    A concat is evaluated per group, not per element: its region is the same for the W lanes (its
    dim is not the innermost, or every boundary is a multiple of W; else :class:`NotLaneUniform`),
    so the region test reads lane 0's coordinate. Each operand is pulled under a guard (the
    regions of the concats entered, ``self.guard``): its accesses are loaded only when the guard
    holds, and accesses under different regions of one concat share registers (one region holds
    per group). The arithmetic of every region runs (a few register operations) and a select picks
    the region's value, so the lanes run straight-line code; values computed in a region are scoped
    to it (the memo is restored after each), as in the scalar puller."""

    def __init__(self, spec, lowerings, names, indent, W: int, concats: bool = False):
        super().__init__(spec, lowerings, names, indent)
        self.W = W
        self.allow_concat = concats  # only ilp_lines reads the guards (flat.py's prologue loads do not)
        self.loads: dict[tuple, tuple[str, str, int, str]] = {}  # key -> (kind, register, value, offset)
        self.guards: dict[tuple, set[frozenset]] = {}  # key -> the guards it is read under (any one)
        self.guard: frozenset = frozenset()  # atoms (concat instance, region, predicate) entered
        self.concats = 0
        self.units = 0  # joint accesses made (_joint_access)
        self.unit_of: list[list[tuple]] = []  # the keys of each joint access: one register
        self.base_memo: dict = {}  # the memo where the concat being pulled was entered
        self.jmemo: dict = {}  # joint values of that concat's regions

    def _coord_vars(self, coords):
        # no temporaries: the load phase evaluates the same expressions outside the lane loop
        return [c if c.isidentifier() or c.endswith("LL") else f"({c})" for c in coords]

    def _access(self, vi: int, offset: str, st: str) -> str:
        if st in (VEC_, BCAST_):
            offset = _LANE.sub("0", offset)
        key = (vi, st, offset)
        if key not in self.loads:
            self.loads[key] = (st, f"r{len(self.loads)}_", vi, offset)
            self.guards[key] = set()
        self.guards[key].add(self.guard)
        kind, reg, _, _ = self.loads[key]
        return f"{reg}[u_]" if kind == BCAST_ else f"{reg}[u_][j_]"

    def _concat_lanes(self, key, v, n, coords: list[str], st: str) -> str:
        base = self.guard
        items = self._regions((key[0], tuple(coords), st, base))
        saved = (self.memo, self.base_memo, self.jmemo)
        self.base_memo, self.jmemo = dict(self.memo), {}
        name = self._joint(items, base)
        self.memo, self.base_memo, self.jmemo = saved
        self.guard = base
        self.memo[key] = name
        return name

    def _regions(self, item) -> list[tuple]:
        """The regions of the concat computing ``item``'s value: one item (value, coordinates,
        state, guard) per operand, its guard extended by the region's atom (concat instance,
        region, predicate on lane 0's coordinate)."""
        vi, coords, st, guard = item
        v = self.spec.values[vi]
        n, _ = self._producer_of(vi)
        if not self.allow_concat:
            raise NotLaneUniform("a concat in a row reduction's prologue: the vector loads do not read its guards")
        dim = int(dict(n.attrs)["dim"]) % len(v.shape)
        ins = [i for i in n.inputs if i is not None]
        ext = [self.spec.values[i].shape[dim] for i in ins]
        ends = [sum(ext[:k + 1]) for k in range(len(ins))]
        if st == VEC_ and (v.shape[-1] % self.W or dim == len(v.shape) - 1 and any(e % self.W for e in ends)):
            raise NotLaneUniform(f"a concat: a region boundary along dim {dim} is not a multiple of {self.W}")
        if st == GEN_ and _LANE.search(coords[dim]):
            raise NotLaneUniform(f"a concat: its dim {dim} moves with the lane")
        c = _LANE.sub("0", coords[dim])  # lane 0's coordinate: every lane's region (checked above)
        self.concats += 1
        out = []
        for k, i in enumerate(ins):
            off = ends[k] - ext[k]
            pred = " && ".join(([f"{c} >= {off}LL"] if k else []) + ([f"{c} < {ends[k]}LL"] if k < len(ins) - 1 else []))
            sub = list(coords)
            sub[dim] = coords[dim] if off == 0 else f"({coords[dim]} - {off}LL)"
            out.append((i, tuple(sub), st, guard | {(self.concats, k, pred)} if pred else guard))
        return out

    def _head(self, item):
        """``item`` followed through its views: (signature, resolved item, payload); the resolved
        item pulls (:meth:`pull_st`) to the same value. Items of one signature compute the same
        expression: a concat ("concat"), a group input read with one kind of access and storage
        type (payload: the input and the offset), an elementwise node of one op, attributes and
        expression (payload: the node, its lowering and NodeInfo)."""
        vi, coords, st, guard = item
        while True:
            coords = tuple(self._coord_vars(list(coords)))
            v = self.spec.values[vi]
            if v.kind == IN:
                return ("in", st, storage_type(v.dtype)), (vi, coords, st, guard), (vi, dot(list(coords), strides(v.shape)))
            n, low = self._producer_of(vi)
            if n.op == CONCAT:
                return ("concat",), (vi, coords, st, guard), None
            info = node_info(self.spec, n, coords)
            if low.view_map is None:
                break
            src = next(i for i in n.inputs if i is not None)
            if n.op == "latch::reshape" and self.spec.values[src].kind == IN:
                # a reshape of a group input: its element is at the output's flat offset
                s = self.spec.values[src]
                return (("in", st, storage_type(s.dtype)), (vi, coords, st, guard),
                        (src, dot(list(coords), strides(v.shape))))
            st = _view_state(n.op, st, info, self.W)
            vi, coords = src, tuple(low.view_map(list(coords), info))
        if low.expr is None or len(n.outputs) != 1:
            return ("opaque", vi, coords), (vi, coords, st, guard), None
        try:  # the expression over placeholders (an op reading its coordinates shows them in it)
            text = low.expr([f"@{k}@" for k in range(len(n.inputs))], info)
        except (IndexError, KeyError):
            return ("opaque", vi, coords), (vi, coords, st, guard), None
        sig = ("node", n.op, repr(sorted(dict(n.attrs).items())), v.dtype, tuple(v.shape),
               tuple(None if i is None else (self.spec.values[i].shape, self.spec.values[i].dtype) for i in n.inputs),
               text)
        return sig, (vi, coords, st, guard), (n, low, info)

    def _cond(self, guard: frozenset, base: frozenset) -> str:
        atoms = sorted(guard - base)
        return " && ".join(f"({a[2]})" for a in atoms) or "true"

    def _pick(self, guards: list[list[frozenset]], vals: list[str], vi: int, base: frozenset) -> str:
        """A select among ``vals``: the k-th where one of ``guards[k]`` holds, the last otherwise."""
        if len(vals) == 1:
            return vals[0]
        ct = compute_type(self.spec.values[vi].dtype)
        expr = f"({ct}){vals[-1]}"
        for gs, val in reversed(list(zip(guards, vals))[:-1]):
            cond = " || ".join(f"({self._cond(g, base)})" for g in gs) if len(gs) > 1 else self._cond(gs[0], base)
            expr = f"({cond}) ? ({ct}){val} : {expr}"
        name = self._fresh("c")
        self.lines.append(f"{self.ind}const {ct} {name} = {expr};")
        return name

    def _joint(self, items: list[tuple], base: frozenset) -> str:
        """One value for ``items`` (regions of one value, exclusive guards; each item is (value,
        coordinates, state, guard)): where their expressions agree the expression is emitted once
        over joint operands (:meth:`_joint_class`), where they differ each is computed and a
        select on the regions' predicates picks the lane's own. A concat met on the way is
        flattened into its regions, so regions of nested concats (q | k, each lo | hi) join too."""
        mkey = tuple(items)
        if mkey in self.jmemo:
            return self.jmemo[mkey]
        if len(items) == 1:
            vi, coords, st, guard = items[0]
            saved = (self.memo, self.guard)
            self.memo, self.guard = dict(self.base_memo), guard
            name = self.pull_st(vi, list(coords), st)
            self.memo, self.guard = saved
        elif not JOINT_REGIONS:  # every region on its own, then a select (the tests' reference form)
            name = self._pick([[it[3]] for it in items], [self._joint([it], base) for it in items], items[0][0], base)
        else:
            classes: dict = {}
            for it in items:
                sig, res, pay = self._head(it)
                if sig[0] == "concat":
                    for sub in self._regions(res):
                        s2, r2, p2 = self._head(sub)
                        classes.setdefault(s2, []).append((r2, p2))
                    continue
                classes.setdefault(sig, []).append((res, pay))
            vals = [self._joint_class(sig, members, base) for sig, members in classes.items()]
            name = self._pick([[r[3] for r, _ in m] for m in classes.values()], vals, items[0][0], base)
        self.jmemo[mkey] = name
        return name

    def _joint_class(self, sig, members, base: frozenset) -> str:
        """The value of regions of one signature (:meth:`_head`)."""
        if len(members) == 1:
            return self._joint([members[0][0]], base)
        if sig[0] == "opaque" or sig[0] == "in" and sig[1] == GEN_:
            # lane-strided accesses, nodes without an expression: each region's own value, a select
            return self._pick([[r[3]] for r, _ in members], [self._joint([r], base) for r, _ in members],
                              members[0][0][0], base)
        if sig[0] == "in":
            return self._joint_access([(r, off) for r, off in members])
        # one elementwise node: its operands pulled jointly, the expression emitted once
        (vi, coords, st, _), (n, low, info) = members[0]
        v = self.spec.values[vi]
        args = []
        for pos, i in enumerate(n.inputs):
            if i is None:
                args.append("")
                continue
            sub = []
            for (mvi, mco, mst, mg), (mn, _, _) in members:
                shp = self.spec.values[mn.inputs[pos]].shape
                sub.append((mn.inputs[pos], tuple(broadcast_coords(shp, self.spec.values[mvi].shape, list(mco))),
                            _operand_state(mst, shp, self.spec.values[mvi].shape), mg))
            args.append(self._joint(sub, base))
        expr = low.expr(args, info)
        name = self._fresh("v")
        ct = compute_type(v.dtype)
        self.lines.append(f"{self.ind}const {ct} {name} = ({ct})({expr});")
        return name

    def _joint_access(self, members) -> str:
        """Group-input accesses of one kind and storage type, one per region: one register,
        loaded through a pointer chosen per group among the regions' (source, offset)."""
        self.units += 1
        keys = []
        for (_, _, st, guard), (vi, offset) in members:
            if st in (VEC_, BCAST_):
                offset = _LANE.sub("0", offset)
            key = (vi, st, offset, self.units)
            if key not in self.loads:
                self.loads[key] = (st, f"r{len(self.loads)}_", vi, offset)
                self.guards[key] = set()
            self.guards[key].add(guard)
            keys.append(key)
        self.unit_of.append(list(dict.fromkeys(keys)))
        kind, reg, _, _ = self.loads[keys[0]]
        return f"{reg}[u_]" if kind == BCAST_ else f"{reg}[u_][j_]"

    def pull_st(self, vi: int, coords: list[str], st: str) -> str:
        coords = self._coord_vars(list(coords))
        key = (vi, tuple(coords), st)
        if key in self.memo:
            return self.memo[key]
        v = self.spec.values[vi]
        if v.kind == IN:
            name = self._access(vi, dot(coords, strides(v.shape)), st)
            self.memo[key] = name
            return name
        n, low = self._producer_of(vi)
        if n.op == CONCAT:
            return self._concat_lanes(key, v, n, coords, st)
        info = node_info(self.spec, n, coords)
        if low.view_map is not None:
            src = next(i for i in n.inputs if i is not None)
            sst = _view_state(n.op, st, info, self.W)
            if n.op == "latch::reshape" and self.spec.values[src].kind == IN:
                # a reshape of a group input: its element is at the output's flat offset
                name = self._access(src, dot(coords, strides(v.shape)), st)
            else:
                name = self.pull_st(src, low.view_map(list(coords), info), sst)
            self.memo[key] = name
            return name

        def pull_input(i: int) -> str:
            shp = self.spec.values[i].shape
            return self.pull_st(i, broadcast_coords(shp, v.shape, coords), _operand_state(st, shp, v.shape))

        return self._elementwise(key, v, n, low, info, pull_input)


def _exclusive(g: frozenset, h: frozenset) -> bool:
    """Guards ``g`` and ``h`` never hold together: they enter different regions of one concat."""
    return any(a[0] == b[0] and a[1] != b[1] for a in g for b in h)


def _slots(p: _IlpPuller, spec: BodySpec) -> list[list[tuple]]:
    """The accesses grouped into registers: greedy, in order of first access; a joint access's keys
    (``p.unit_of``) stay together; an access (or joint access) joins a register whose accesses it
    excludes (every guard of each against every guard of the other) and whose array has its kind
    (per lane, one per group, or lane-strided) and storage type, so that one pointer chosen per
    group serves every access of a register."""
    unit = {k: tuple(u) for u in p.unit_of for k in u}
    slots: list[tuple[tuple, list[tuple]]] = []
    done: set = set()
    for key, (kind, _, vi, _) in p.loads.items():
        if key in done:
            continue
        keys = list(unit.get(key, (key,)))
        done.update(keys)
        pool = (kind, storage_type(spec.values[vi].dtype))
        for sp, have in slots:
            if sp == pool and all(_exclusive(g, h) for k1 in keys for k2 in have
                                  for g in p.guards[k1] for h in p.guards[k2]):
                have.extend(keys)
                break
        else:
            slots.append((pool, keys))
    return [keys for _, keys in slots]


def _guard_text(guards: set[frozenset]) -> str:
    """The condition of an access read under any of ``guards`` ("" when one is unconditional)."""
    if frozenset() in guards:
        return ""
    conj = sorted(" && ".join(f"({a[2]})" for a in sorted(g)) for g in guards)
    return conj[0] if len(conj) == 1 else " || ".join(f"({x})" for x in conj)


def _decode(shape, var: str, ind: str, itype: str) -> tuple[list[str], list[str]]:
    """Coordinates ``x0..`` of flat element ``var`` of the contiguous ``shape`` (constant extents:
    the divisions become multiplies)."""
    r = len(shape)
    lines, coords, acc = [], [""] * r, 1
    for d in reversed(range(1, r)):
        div = f"{var} / {acc}" if acc != 1 else var
        lines.append(f"{ind}const {itype} x{d} = ({div}) % {shape[d]};")
        coords[d] = f"x{d}"
        acc *= shape[d]
    lines.append(f"{ind}const {itype} x0 = {var} / {acc};" if acc != 1 else f"{ind}const {itype} x0 = {var};")
    coords[0] = "x0"
    return lines, coords


def ilp_lines(spec: BodySpec, lowerings: dict[str, Lowering], names: dict[int, str], ind: str = "    ") -> list[str]:
    """Statements of the vector/ILP path over the task's rows [lo[0], hi[0]) (the tile must span every
    dim but the first; the caller checks). Every element of the tile is computed and stored once."""
    target = tuple(spec.values[spec.primary].shape)
    inner = math.prod(target[1:])
    W = 4 if target[-1] % 4 == 0 else 1
    wide = math.prod(target) >= 2**31 or any(math.prod(v.shape) >= 2**31 for v in spec.values)
    itype = "long long" if wide else "int"
    lane = [f"x{d}" for d in range(len(target) - 1)] + [f"(x{len(target) - 1} + j_)" if W > 1 else f"x{len(target) - 1}"]
    p = _IlpPuller(spec, lowerings, names, ind + "      ", W, concats=True)
    outs = [i for i, v in enumerate(spec.values) if v.kind == OUT]
    stores = [f"{ind}      o{i}_[u_][j_] = {p.pull_st(i, lane, VEC_ if W > 1 else GEN_)};" for i in outs]
    slots = _slots(p, spec)
    reg = {p.loads[key][1]: f"r{s}_" for s, keys in enumerate(slots) for key in keys}
    lines = [_REG.sub(lambda m: reg[m[0]], x) for x in p.lines + stores]  # one pass: names swap safely

    def nbytes(key):
        kind, _, vi, _ = p.loads[key]
        return (1 if kind == BCAST_ else W) * _BYTES.get(spec.values[vi].dtype, 4)

    per_group = sum(max(nbytes(k) for k in keys) for keys in slots) or 4 * W  # one region's loads per register
    U = max(ILP_MIN_U, min(ILP_MAX_U, -(-ILP_IN_FLIGHT // per_group)))
    if not slots or ILP_HEAVY.intersection(spec.ops):  # nothing to keep in flight / long unrolled code
        U = ILP_MIN_U
    dec, _ = _decode(target, "l_", ind + "    ", itype)
    step = W * U
    from .cgen import contiguous_tile

    _, first, count = contiguous_tile(target, itype)
    L = [f"{ind}const {itype} n_ = {count};",
         f"{ind}const {itype} base_ = {first};"]
    for s, keys in enumerate(slots):
        kind, _, vi, _ = p.loads[keys[0]]
        L.append(f"{ind}{compute_type(spec.values[vi].dtype)} r{s}_[{U}]" + ("" if kind == BCAST_ else f"[{W}]") + " = {};")
    for i in outs:
        L.append(f"{ind}{compute_type(spec.values[i].dtype)} o{i}_[{U}][{W}];")
    i2 = ind + "  "

    def load(kind, r, vi, off, src=None):
        st = storage_type(spec.values[vi].dtype)
        src = names[vi] if src is None else src
        if kind == VEC_ and W == 4:
            return f"latch::gld4({src}, {off}, {r}[u_]);"
        if kind == BCAST_:
            return f"{r}[u_] = latch::ld<{st}>({src}, {off});"
        return f"for (int j_ = 0; j_ < {W}; ++j_) {r}[u_][j_] = latch::ld<{st}>({src}, {off});"

    loads = []
    for s, keys in enumerate(slots):
        r, acc = f"r{s}_", [(p.loads[k], _guard_text(p.guards[k])) for k in keys]
        (kind, _, vi, off), g = acc[0]
        if len(acc) == 1 and not g:
            text = load(kind, r, vi, off)
            loads += ([f"{i2}    #pragma unroll"] if text.startswith("for") else []) + [f"{i2}    {text}"]
            continue
        if kind != GEN_:
            # the region's source chosen once per group: one pointer, one access; where no guard
            # holds, the first source's base (a valid, aligned address: the value is not used), so
            # the load is unconditional (no branch around it)
            srcs: dict = {}
            for a, g in acc:
                srcs.setdefault((a[2], a[3]), []).append(g)
            st = storage_type(spec.values[vi].dtype)
            if len(srcs) == 1 and any(not g for gs in srcs.values() for g in gs):
                loads.append(f"{i2}    {load(kind, r, vi, off)}")
                continue
            # candidates and conditions as plain values first, then a select among them (not a
            # branch tree with each candidate's address math in its own arm)
            cand = [f"{i2}    {{"]
            for k, ((svi, soff), gs) in enumerate(srcs.items()):
                cond = " || ".join(f"({x})" if x else "true" for x in gs)
                cand += [f"{i2}      const {st}* const s{k}_ = {names[svi]} + ({soff});",
                         f"{i2}      const bool g{k}_ = {cond};"]
            sel = " : ".join(f"g{k}_ ? s{k}_" for k in range(len(srcs))) + f" : {names[vi]}"
            loads += cand + [f"{i2}      const {st}* s_ = {sel};",
                             f"{i2}      {load(kind, r, vi, '0', 's_')} }}"]
        else:
            for k, (a, g) in enumerate(acc):
                loads.append(f"{i2}    {'} else ' if k else ''}if ({g or 'true'}) {{ {load(a[0], r, a[2], a[3])}")
            loads.append(f"{i2}    }}")

    # L2 prefetch ahead (flat.py's, for the row-tile path): the lines of each 16-byte access whose
    # every source is a full-size input (at least lower_reduce.PREFETCH_MIN_BYTES: a small table
    # such as RoPE's cos/sin stays in L2), for the groups ILP_PREFETCH_AHEAD iterations ahead (at
    # least two; more where the iteration moves few bytes, so that ~2 x ILP_IN_FLIGHT bytes per
    # thread are requested ahead of the register loads), never past the tile. TinyMoE-200M's RoPE
    # backward (U = 4 groups of four bf16, 8 bytes from HBM each: 8 KiB in flight per SM) ran at
    # 39% of its bytes floor without it (run 53).
    from .lower_reduce import PREFETCH_MIN_BYTES

    def big(vi):
        return math.prod(spec.values[vi].shape) * _BYTES.get(spec.values[vi].dtype, 4) >= PREFETCH_MIN_BYTES

    # no slot whose source inputs are among an earlier prefetched slot's: two accesses of the same inputs in one group are at the
    # same output coordinates through views (RoPE's element and its rotate-half partner, 32
    # elements apart in one 128-byte row), so the first's lines are, as a rule, the second's too;
    # the address math of each prefetched slot costs as much as its load's (a hint: a line left out
    # is still read by the register load)
    pf_slots, seen = [], set()
    for keys in slots:
        ins = frozenset(p.loads[k][2] for k in keys)
        if W == 4 and p.loads[keys[0]][0] == VEC_ and all(big(vi) for vi in ins) \
                and not any(ins <= had for had in seen):
            seen.add(ins)
            pf_slots.append(keys)
    pf_bytes = sum(W * _BYTES.get(spec.values[p.loads[keys[0]][2]].dtype, 4) for keys in pf_slots) * U
    ahead = 0 if not pf_slots or ILP_PREFETCH_AHEAD <= 0 else \
        max(ILP_PREFETCH_AHEAD, min(ILP_PREFETCH_MAX, -(-2 * ILP_IN_FLIGHT // pf_bytes)))
    pf = []
    for keys in pf_slots:
        srcs: dict = {}
        for k in keys:
            srcs.setdefault((p.loads[k][2], p.loads[k][3]), []).append(_guard_text(p.guards[k]))
        if len(srcs) == 1:
            (svi, soff), = srcs
            pf.append(f"{i2}    latch::gpf4({names[svi]}, {soff});")
            continue
        vi0 = p.loads[keys[0]][2]
        st = storage_type(spec.values[vi0].dtype)
        pf.append(f"{i2}    {{")
        for k, ((svi, soff), gs) in enumerate(srcs.items()):
            cond = " || ".join(f"({x})" if x else "true" for x in gs)
            pf += [f"{i2}      const {st}* const s{k}_ = {names[svi]} + ({soff});",
                   f"{i2}      const bool g{k}_ = {cond};"]
        sel = " : ".join(f"g{k}_ ? s{k}_" for k in range(len(srcs))) + " : nullptr"
        pf += [f"{i2}      const {st}* s_ = {sel};", f"{i2}      if (s_) latch::gpf4(s_, 0); }}"]

    def prefetch() -> list[str]:
        if not ahead:
            return []
        return ([f"{i2}// L2 prefetch of iteration +{ahead}'s lines (gpf4: one thread per 128-byte line)",
                 f"{i2}#pragma unroll", f"{i2}for (int u_ = 0; u_ < {U}; ++u_) {{",
                 f"{i2}  if (q_ + {ahead * step} * LATCH_THREADS + u_ * {W} * LATCH_THREADS < n_) {{",
                 f"{i2}    const {itype} l_ = base_ + q_ + {ahead * step} * LATCH_THREADS + u_ * {W} * LATCH_THREADS;"]
                + dec + pf + [f"{i2}  }}", f"{i2}}}"])

    def iteration(guarded: bool) -> list[str]:
        """One iteration over the thread's U groups: the load phase (every access of every group,
        nothing computed yet), the arithmetic lane by lane in registers, the stores. Unguarded
        (every group inside the tile: the main loop) the index math and region predicates sit in
        one straight line that the two phases share; guarded (the last, partial iteration) each
        group past the tile's end is skipped."""
        cur = f"base_ + q_ + u_ * {W} * LATCH_THREADS"
        inside = f"q_ + u_ * {W} * LATCH_THREADS < n_"
        it = [f"{i2}#pragma unroll", f"{i2}for (int u_ = 0; u_ < {U}; ++u_) {{",
              f"{i2}  if ({inside}) {{" if guarded else f"{i2}  {{",
              f"{i2}    const {itype} l_ = {cur};"]
        it += dec + loads + [f"{i2}  }}", f"{i2}}}"]
        it += [f"{i2}#pragma unroll", f"{i2}for (int u_ = 0; u_ < {U}; ++u_) {{",
               f"{i2}  const {itype} l_ = {cur};"]
        it += dec + [f"{i2}  #pragma unroll", f"{i2}  for (int j_ = 0; j_ < {W}; ++j_) {{"]
        it += lines + [f"{i2}  }}", f"{i2}}}"]
        # the stores (the output's flat offset is l_)
        it += [f"{i2}#pragma unroll", f"{i2}for (int u_ = 0; u_ < {U}; ++u_) {{",
               f"{i2}  if ({inside}) {{" if guarded else f"{i2}  {{",
               f"{i2}    const {itype} l_ = {cur};"]
        for i in outs:
            if W == 4:
                it.append(f"{i2}    latch::gst4({names[i]}, l_, o{i}_[u_]);")
            else:
                it.append(f"{i2}    latch::st<{storage_type(spec.values[i].dtype)}>({names[i]}, l_, o{i}_[u_][0]);")
        return it + [f"{i2}  }}", f"{i2}}}"]

    if p.concats:
        # a concat's predicates and selects read the coordinates in both phases: the full
        # iterations run without guards (shared index math), the partial one after them guarded
        L.append(f"{ind}{itype} q_ = {W} * ({itype})threadIdx.x;")
        L.append(f"{ind}for (; q_ + {(U - 1) * W} * LATCH_THREADS < n_; q_ += {step} * LATCH_THREADS) {{")
        L += prefetch() + iteration(False) + [f"{ind}}}", f"{ind}if (q_ < n_) {{"] + iteration(True) + [f"{ind}}}"]
    else:
        L.append(f"{ind}for ({itype} q_ = {W} * ({itype})threadIdx.x; q_ < n_; q_ += {step} * LATCH_THREADS) {{")
        L += prefetch() + iteration(True) + [f"{ind}}}"]
    if not wide:  # every index fits in 32 bits: the view maps' 64-bit constants would widen the math
        L = [_LONG.sub(r"\1", x) for x in L]
    vec = [(names[vi], "0") for k, _, vi, _ in p.loads.values() if k == VEC_] + [(names[i], "0") for i in outs]
    cond = " && ".join(f"latch::aligned4({p_}, {o})" for p_, o in dict.fromkeys(vec)) if W == 4 else "true"
    return L, cond
