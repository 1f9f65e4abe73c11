"""Rules over a core's score in entry form: its mask, its derivatives, its linear form.

Contract (every rule exact for all sizes, under IEEE float64 for finite
products and reads):

- `split_mask(score)` -> `(keep, value)` with score = where(keep, value, -inf):
  `where(c, x, -inf)`, `where(c, -inf, x)`, a mask added to the rest (`x +
  where(c, 0, -inf)`, a causal mask), and a scale by a positive constant of a
  masked score pass their conditions into `keep` (None: no mask);
- `derivative(expr, wrt)`: d expr / d `wrt` (the `ProductEntry`, or one
  `t.Entry` read) by forward-mode rules, the functions' own (`ir.functions`);
  None where expr does not depend on it; `Unfusable` for a power whose
  exponent depends on it;
- `positive_constant(node)`: a scalar of numbers and dims that is positive
  whenever every dim is at least 1 (a scale that keeps a mask's -inf -inf);
- `linear(value)` -> `Linear(scale, bias)` when value = scale * s + bias with a
  positive constant scale and a bias that does not read s (None otherwise):
  the kernels fold the scale into the queries or into the softmax's base-2
  exponent;
- `scaled(value)`: the node `s * c` or `s / c` (c a constant) when value reads
  the product s only through it (the NumPy and torch targets scale the queries
  once instead), else None;
- `integer(node, symbols)`: an integer-valued entry expression (coordinates,
  dims, integer literals, + - *) as a SymPy expression, None otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ...errors import Unfusable
from ...ir import build as b
from ...ir import typed as t
from ...symbolic.derive import UNARY_RULES
from .core import ProductEntry

__all__ = ["split_mask", "derivative", "positive_constant", "Linear", "linear", "scaled", "integer",
           "is_minus_infinity", "conjunction", "conditions", "depends_on", "constant"]


def is_minus_infinity(node: t.Node) -> bool:
    if isinstance(node, t.Scalar):
        return node.value == -sympy.oo
    return isinstance(node, t.Unary) and node.fn == "neg" and isinstance(node.x, t.Scalar) and node.x.value == sympy.oo


def _zero(node: t.Node) -> bool:
    return isinstance(node, t.Scalar) and node.value == 0


def depends_on(node: t.Node, leaf: t.Node) -> bool:
    return any(n == leaf for n in t.walk(node))


def conjunction(*conds: t.Node | None) -> t.Node | None:
    """The conditions joined by `&` (None: no condition), nested `and`s flattened."""
    parts: list[t.Node] = []
    for c in conds:
        if c is None:
            continue
        parts += list(c.args) if isinstance(c, t.Logical) and c.op == "and" else [c]
    parts = list(dict.fromkeys(parts))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else t.Logical("and", tuple(parts), ())


def conditions(keep: t.Node | None) -> list[t.Node]:
    """The conditions a `keep` joins with `&` (each a comparison or another combination)."""
    if keep is None:
        return []
    return list(keep.args) if isinstance(keep, t.Logical) and keep.op == "and" else [keep]


def _negated(cond: t.Node) -> t.Node:
    flip = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
    if isinstance(cond, t.Compare):
        return t.Compare(flip[cond.op], cond.a, cond.b, cond.shape)
    if isinstance(cond, t.Logical) and cond.op == "not":
        return cond.args[0]
    return t.Logical("not", (cond,), ())


def split_mask(score: t.Node) -> tuple[t.Node | None, t.Node]:
    """(keep, value) with score = where(keep, value, -inf) (see the module docstring)."""
    if isinstance(score, t.Where):
        if is_minus_infinity(score.b):
            keep, value = split_mask(score.a)
            return conjunction(score.cond, keep), value
        if is_minus_infinity(score.a):
            keep, value = split_mask(score.b)
            return conjunction(_negated(score.cond), keep), value
    if isinstance(score, t.Binary):
        if score.op == "add":
            (ka, va), (kb, vb) = split_mask(score.a), split_mask(score.b)
            if ka is None and kb is None:
                return None, score
            return conjunction(ka, kb), _plus(va, vb)
        if score.op == "sub":
            ka, va = split_mask(score.a)
            kb, _ = split_mask(score.b)
            if ka is not None and kb is None:  # (-inf - -inf would be NaN: a masked subtrahend stays whole)
                return ka, t.Binary("sub", va, score.b, ())
        if score.op in ("mul", "div") and positive_constant(score.b):
            ka, va = split_mask(score.a)
            if ka is not None:
                return ka, t.Binary(score.op, va, score.b, ())
        if score.op == "mul" and positive_constant(score.a):
            kb, vb = split_mask(score.b)
            if kb is not None:
                return kb, t.Binary("mul", score.a, vb, ())
    return None, score


def _plus(a: t.Node, b_: t.Node) -> t.Node:
    """a + b with a 0 that a mask left behind dropped (`x + where(c, 0, -inf)` keeps x where c holds)."""
    if _zero(b_):
        return a
    if _zero(a):
        return b_
    return t.Binary("add", a, b_, ())


def positive_constant(node: t.Node) -> bool:
    """A scalar of numbers and dims that is positive (and finite) whenever every dim is at least 1."""
    if node.shape != ():
        return False
    if isinstance(node, t.Scalar):
        return node.value.is_positive is True and node.value.is_finite is True
    if isinstance(node, t.DimValue):
        return node.dim.is_Symbol or node.dim.is_positive is True
    if isinstance(node, t.Unary):
        return (node.fn == "sqrt" and positive_constant(node.x)) or (node.fn == "exp" and constant(node.x))
    if isinstance(node, t.Binary):
        if node.op == "pow":
            return positive_constant(node.a) and constant(node.b)
        return node.op in ("mul", "div", "add") and positive_constant(node.a) and positive_constant(node.b)
    return False


def constant(node: t.Node) -> bool:
    """Numbers and dims only."""
    return node.shape == () and all(isinstance(n, (t.Scalar, t.DimValue, t.Unary, t.Binary)) for n in t.walk(node))


def derivative(expr: t.Node, wrt: t.Node) -> t.Node | None:
    """d expr / d wrt by forward-mode rules (see the module docstring)."""
    if expr == wrt:
        return b.scalar(1)
    if isinstance(expr, t.Unary):
        dx = derivative(expr.x, wrt)
        return None if dx is None else UNARY_RULES[expr.fn][1](expr.x, expr, dx, None)
    if isinstance(expr, t.Binary):
        u, v = expr.a, expr.b
        du, dv = derivative(u, wrt), derivative(v, wrt)
        if du is None and dv is None:
            return None
        zero = b.scalar(0)
        if expr.op == "add":
            return b.add(du, dv)
        if expr.op == "sub":
            return b.sub(du or zero, dv or zero)
        if expr.op == "mul":
            return b.add(b.mul(du, v) if du is not None else None, b.mul(u, dv) if dv is not None else None)
        if expr.op == "div":
            left = b.div(du, v) if du is not None else None
            right = b.neg(b.div(b.mul(u, dv), b.power(v, b.scalar(2)))) if dv is not None else None
            return b.add(left, right)
        if expr.op == "pow":
            if dv is not None:
                raise Unfusable("a power whose exponent depends on the scores")
            return b.mul(b.mul(v, b.power(u, b.sub(v, b.scalar(1)))), du)
    if isinstance(expr, t.Where):
        da, db = derivative(expr.a, wrt), derivative(expr.b, wrt)
        if da is None and db is None:
            return None
        zero = b.scalar(0)
        return b.where(expr.cond, da or zero, db or zero)
    return None


@dataclass(frozen=True)
class Linear:
    """value = scale * s + bias: `scale` a positive constant (None: 1), `bias` free of s (None: 0)."""

    scale: t.Node | None
    bias: t.Node | None


def linear(value: t.Node, s: t.Node = ProductEntry()) -> Linear | None:
    """The linear form of a score in its product s (see the module docstring), or None."""
    if value == s:
        return Linear(None, None)
    if not isinstance(value, t.Binary):
        return None
    a_has, b_has = depends_on(value.a, s), depends_on(value.b, s)
    if value.op in ("add", "sub"):
        if a_has and b_has:
            return None
        inner, other = (value.a, value.b) if a_has else (value.b, value.a)
        if value.op == "sub" and not a_has:
            return None
        found = linear(inner, s)
        if found is None:
            return None
        if value.op == "sub":
            other = t.Unary("neg", other, ())
        return Linear(found.scale, other if found.bias is None else t.Binary("add", found.bias, other, ()))
    if value.op in ("mul", "div"):
        if value.op == "div" and (b_has or not a_has):
            return None
        inner, factor = (value.a, value.b) if a_has else (value.b, value.a)
        if depends_on(factor, s) or not positive_constant(factor):
            return None
        found = linear(inner, s)
        if found is None:
            return None
        scale = factor if value.op == "mul" else t.Binary("div", t.Scalar(sympy.Integer(1)), factor, ())
        if found.scale is not None:
            scale = t.Binary(value.op, found.scale, factor, ())
        bias = None if found.bias is None else t.Binary(value.op, found.bias, factor, ())
        return Linear(scale, bias)
    return None


def scaled(value: t.Node) -> t.Binary | None:
    """`s * c` or `s / c` when it is the only way `value` reads the product s (see the module docstring)."""
    s = ProductEntry()
    parents = [n for n in t.walk(value) if s in n.children]
    if not parents or value == s:
        return None
    first = parents[0]
    if not (isinstance(first, t.Binary) and first.op in ("mul", "div") and first.a == s and constant(first.b)):
        return None
    return first if all(p == first for p in parents) else None


def integer(node: t.Node, symbols: dict[str, sympy.Expr]) -> sympy.Expr | None:
    """An integer-valued entry expression as SymPy over `symbols` (coordinate -> symbol; a dim d is D_d)."""
    if isinstance(node, t.IndexVar):
        return symbols.get(node.name)
    if isinstance(node, t.DimValue):
        dim = sympy.sympify(node.dim)
        num, den = sympy.fraction(sympy.together(dim))
        if den != 1:
            return None
        return dim.xreplace({s: sympy.Symbol(f"D_{s.name}", integer=True) for s in dim.free_symbols})
    if isinstance(node, t.Scalar):
        return node.value if node.value.is_Integer else None
    if isinstance(node, t.Unary) and node.fn == "neg":
        inner = integer(node.x, symbols)
        return None if inner is None else -inner
    if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
        x, y = integer(node.a, symbols), integer(node.b, symbols)
        if x is None or y is None:
            return None
        return {"add": x + y, "sub": x - y, "mul": x * y}[node.op]
    return None
