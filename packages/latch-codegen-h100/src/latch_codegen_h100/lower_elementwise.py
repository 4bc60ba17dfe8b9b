"""Lowerings of the elementwise ops of the core vocabulary (latch_ops/elementwise.py): expression
forms only, so any chain of them fuses into one body (``bodies.render_body``).

An expression receives its operands in compute type (``float`` for f32/bf16/f16, ``double`` for
f64, ``long long`` for integers, ``bool``) and its result is converted to the output's compute type
by the fused body; the store rounds to the storage type (round-to-nearest-even for bf16/f16).
"""

from __future__ import annotations

from .lowering import Lowering, NodeInfo, c_literal, compute_type

HEADER = "latch_elementwise.cuh"


def _ct(n: NodeInfo, i: int = 0) -> str:
    d = n.in_dtypes[i] if n.in_dtypes and n.in_dtypes[i] is not None else n.out_dtypes[0]
    return compute_type(d)


def _unary(fn: str):
    def expr(a, n: NodeInfo) -> str:
        return f"latch::ew::{fn}(({_ct(n)})({a[0]}))"
    return expr


def _gelu(a, n: NodeInfo) -> str:
    fn = "gelu_tanh" if n.attr("approximate", "none") == "tanh" else "gelu_erf"
    return f"latch::ew::{fn}(({_ct(n)})({a[0]}))"


_UNARY = {
    "neg": lambda a, n: f"(-({a[0]}))",
    "abs": _unary("abs_"),
    "sign": _unary("sign_"),
    "relu": _unary("relu_"),
    "exp": _unary("exp_"),
    "log": _unary("log_"),
    "log1p": _unary("log1p_"),
    "expm1": _unary("expm1_"),
    "sqrt": _unary("sqrt_"),
    "rsqrt": _unary("rsqrt_"),
    "reciprocal": lambda a, n: (f"latch::ew::rcp_(({_ct(n)})({a[0]}))" if _ct(n) in ("float", "double")
                                else f"(({_ct(n)})1 / ({a[0]}))"),
    "sin": _unary("sin_"),
    "cos": _unary("cos_"),
    "tanh": _unary("tanh_"),
    "erf": _unary("erf_"),
    "sigmoid": _unary("sigmoid_"),
    "silu": _unary("silu_"),
    "gelu": _gelu,
    "logical_not": lambda a, n: f"(!({a[0]}))",
}


def _sides(a, n: NodeInfo) -> tuple[str, str]:
    """(left, right) C expressions of a binary op in its two-operand or scalar form."""
    if len(a) == 2:
        return a[0], a[1]
    dtype = n.in_dtypes[0]
    s = c_literal(n.attr("scalar"), dtype)
    s = f"(({compute_type(dtype)}){s})"
    return (s, a[0]) if n.attr("scalar_first", False) else (a[0], s)


def _binary(fmt: str):
    def expr(a, n: NodeInfo) -> str:
        x, y = _sides(a, n)
        return fmt.format(x=x, y=y, t=_ct(n))
    return expr


def _div(a, n: NodeInfo) -> str:
    x, y = _sides(a, n)
    rm = n.attr("rounding_mode")
    t = _ct(n)
    if rm == "floor":
        return f"latch::ew::div_floor(({t})({x}), ({t})({y}))"
    if rm == "trunc":
        return f"latch::ew::div_trunc(({t})({x}), ({t})({y}))"
    if t in ("float", "double") and compute_type(n.out_dtypes[0]) == t:
        # float: the branch-free 2-ulp division (latch_elementwise.cuh div_); double: IEEE
        return f"latch::ew::div_(({t})({x}), ({t})({y}))"
    return f"(({x}) / ({y}))"


def _pow(a, n: NodeInfo) -> str:
    t = _ct(n)
    if len(a) == 1 and not n.attr("scalar_first", False):
        s = n.attr("scalar")
        if s == 2:
            return f"(({a[0]}) * ({a[0]}))"
        if s == 1:
            return f"({a[0]})"
        if s == 0.5 and t != "long long":
            return f"latch::ew::sqrt_(({t})({a[0]}))"
    x, y = _sides(a, n)
    return f"latch::ew::pow_(({t})({x}), ({t})({y}))"


def _logical(op: str):
    def expr(a, n: NodeInfo) -> str:
        x, y = _sides(a, n)
        return f"((bool)({x}) {op} (bool)({y}))"
    return expr


_BINARY = {
    "add": _binary("(({x}) + ({y}))"),
    "sub": _binary("(({x}) - ({y}))"),
    "mul": _binary("(({x}) * ({y}))"),
    "div": _div,
    "pow": _pow,
    "maximum": _binary("latch::ew::maximum_(({t})({x}), ({t})({y}))"),
    "minimum": _binary("latch::ew::minimum_(({t})({x}), ({t})({y}))"),
    "eq": _binary("(({x}) == ({y}))"),
    "ne": _binary("(({x}) != ({y}))"),
    "lt": _binary("(({x}) < ({y}))"),
    "le": _binary("(({x}) <= ({y}))"),
    "gt": _binary("(({x}) > ({y}))"),
    "ge": _binary("(({x}) >= ({y}))"),
    "logical_and": _logical("&&"),
    "logical_or": _logical("||"),
    "logical_xor": _logical("!="),
}


def _where(a, n: NodeInfo) -> str:
    t = compute_type(n.out_dtypes[0])
    x = a[1] if a[1] else c_literal(n.attr("scalar_a"), n.out_dtypes[0])
    y = a[2] if a[2] else c_literal(n.attr("scalar_b"), n.out_dtypes[0])
    return f"(({a[0]}) ? ({t})({x}) : ({t})({y}))"


def _clamp(a, n: NodeInfo) -> str:
    t = _ct(n)
    e = f"({t})({a[0]})"
    lo, hi = n.attr("min"), n.attr("max")
    if lo is not None:
        e = f"latch::ew::clamp_min({e}, ({t}){c_literal(lo, n.in_dtypes[0])})"
    if hi is not None:
        e = f"latch::ew::clamp_max({e}, ({t}){c_literal(hi, n.in_dtypes[0])})"
    return e


def _cast(a, n: NodeInfo) -> str:
    # The fused body converts to the output's compute type: float->int truncates toward zero (C and
    # torch agree), x->bool is x != 0, and the store rounds to bf16/f16 to nearest even.
    src, dst = n.in_dtypes[0], n.out_dtypes[0]
    if dst == "bool":
        return f"(({a[0]}) != 0)"
    return f"({a[0]})"


def _tri(lower: bool):
    def expr(a, n: NodeInfo) -> str:
        i, j = n.coords[-2], n.coords[-1]
        d = int(n.attr("diagonal", 0))
        keep = f"({j} <= {i} + {d}LL)" if lower else f"({j} >= {i} + {d}LL)"
        t = _ct(n)
        return f"({keep} ? ({t})({a[0]}) : ({t})0)"
    return expr


def _full(a, n: NodeInfo) -> str:
    return c_literal(n.attr("value"), n.out_dtypes[0])


def _arange(a, n: NodeInfo) -> str:
    t = compute_type(n.out_dtypes[0])
    start = c_literal(n.attr("start"), n.out_dtypes[0])
    step = c_literal(n.attr("step"), n.out_dtypes[0])
    return f"(({t}){start} + ({t})({n.coords[0]}) * ({t}){step})"


def _gelu_backward(a, n: NodeInfo) -> str:
    fn = "gelu_tanh_backward" if n.attr("approximate", "none") == "tanh" else "gelu_erf_backward"
    t = _ct(n)
    return f"latch::ew::{fn}(({t})({a[0]}), ({t})({a[1]}))"


_OTHER = {
    "where": _where,
    "clamp": _clamp,
    "cast": _cast,
    "tril": _tri(True),
    "triu": _tri(False),
    "full": _full,
    "arange": _arange,
    "gelu_backward": _gelu_backward,
    "silu_backward": lambda a, n: f"latch::ew::silu_backward(({_ct(n)})({a[0]}), ({_ct(n)})({a[1]}))",
    "sigmoid_backward": lambda a, n: f"(({a[0]}) * ({a[1]}) * (({_ct(n)})1 - ({a[1]})))",
    "tanh_backward": lambda a, n: f"(({a[0]}) * (({_ct(n)})1 - ({a[1]}) * ({a[1]})))",
    "threshold_backward": lambda a, n: (
        f"(({a[1]}) <= ({_ct(n)}){c_literal(n.attr('threshold'), n.in_dtypes[1])} ? ({_ct(n)})0 : ({a[0]}))"),
}


def lowerings() -> list[Lowering]:
    out = []
    for table in (_UNARY, _BINARY, _OTHER):
        for name, fn in table.items():
            op = f"latch::{name}"
            out.append(Lowering(op, expr=fn, headers=(HEADER,), doc=f"elementwise expression of {op}"))
    return out
