"""Smart constructors for typed-IR nodes, used by the symbolic passes.

Contract: each function returns a typed node with its shape inferred by the
rules of `symattn.ir.shapes`, after the local simplifications a person would
make without thinking (`-(-A) = A`, `(A.T).T = A`, `1 * A = A`, a scalar
divisor moved out of a matrix product: `(A / c) @ B = (A @ B) / c`, the
numbers of a product combined, `50 * A / 50 = A`, a `ones(...)` factor that
broadcasts nothing dropped, like terms of a sum collected, `A * B + B * A =
2 * A * B`). Every rule holds for every value, NaN and infinities included,
up to rounding (which is not modelled): a product or quotient chain is
reordered and its finite nonzero numbers combined, but no other factor is
ever cancelled and a factor 0 is never folded (`0 * A` is NaN where A is
infinite); like terms are collected only when their coefficients have the
same sign (`2 * A - A` is NaN where A is infinite, `A` is not). Each
simplification that fires is reported as a `Simplification(rule, before,
after)` to the `Recorder` the caller passed (`rec`), so that documents replay
exactly what was done; without one, nothing is recorded anywhere (there is no
shared recorder). `sum_to` and `expand_to` of a tensor that already has the
shape return it unchanged: that is no simplification, nothing was written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import sympy

from . import typed as t
from .shapes import broadcast, matmul_shape

__all__ = [
    "Recorder",
    "Simplification",
    "scalar",
    "is_scalar_constant",
    "is_zero",
    "is_one",
    "neg",
    "add",
    "sub",
    "mul",
    "div",
    "power",
    "matmul",
    "transpose",
    "unary",
    "reduce_sum",
    "softmax",
    "where",
    "compare",
    "sum_to",
    "expand_to",
    "ones",
    "zeros",
    "logical",
    "apply",
]


@dataclass(frozen=True)
class Simplification:
    """One simplification a builder made: `before` (the node it would have built) became `after`."""

    rule: str
    before: t.Node
    after: t.Node


@dataclass
class Recorder:
    """Collects the simplifications made by the builders it is passed to, in the order made.

    There is no shared recorder: a caller that wants the steps passes its own (one per
    gradient contribution in `derive`), and a builder called without one records nowhere.
    """

    steps: list[Simplification] = field(default_factory=list)

    def note(self, rule: str, before: t.Node, after: t.Node) -> t.Node:
        self.steps.append(Simplification(rule, before, after))
        return after


def _note(rec: Recorder | None, rule: str, before: t.Node, after: t.Node) -> t.Node:
    """`after`, with the step recorded in `rec` when the caller passed one."""
    return after if rec is None else rec.note(rule, before, after)


def scalar(value) -> t.Scalar:
    return t.Scalar(sympy.sympify(value))


def is_scalar_constant(node: t.Node) -> bool:
    """A value that does not depend on any tensor: a number, a dim, or arithmetic of them."""
    if isinstance(node, (t.Scalar, t.DimValue)):
        return True
    if isinstance(node, (t.Unary, t.Binary)) and node.shape == ():
        return all(is_scalar_constant(c) for c in node.children)
    return False


def is_zero(node: t.Node | None) -> bool:
    return node is None or (isinstance(node, t.Scalar) and node.value == 0)


def is_one(node: t.Node) -> bool:
    return isinstance(node, t.Scalar) and node.value == 1


def _is_neg(node: t.Node) -> bool:
    return isinstance(node, t.Unary) and node.fn == "neg"


def neg(x: t.Node, rec: Recorder | None = None) -> t.Node:
    before = t.Unary("neg", x, x.shape)
    if isinstance(x, t.Scalar):
        return _note(rec, "-(c) = -c for a number c", before, t.Scalar(-x.value))
    if _is_neg(x):
        return _note(rec, "-(-A) = A", before, x.x)
    return before


def _binary(op: str, a: t.Node, b: t.Node) -> t.Binary:
    return t.Binary(op, a, b, broadcast(a.shape, b.shape))


def _minus_out(rule: str, before: t.Node, inner: t.Node, rec: Recorder | None) -> t.Node:
    """`before` rewritten as -(inner) by `rule`, then that negation built (which may simplify)."""
    _note(rec, rule, before, t.Unary("neg", inner, inner.shape))
    return neg(inner, rec)


def add(a: t.Node | None, b: t.Node | None, rec: Recorder | None = None) -> t.Node | None:
    """a + b. None is "no term" (the start of a sum): adding it writes nothing, so records nothing."""
    if a is None:
        return b
    if b is None:
        return None if is_zero(a) else a
    if is_zero(a):
        return _note(rec, "0 + A = A", _binary("add", a, b), b)
    if is_zero(b):
        return _note(rec, "A + 0 = A", _binary("add", a, b), a)
    if _is_neg(b):
        written = _note(rec, "A + (-B) = A - B", _binary("add", a, b), _binary("sub", a, b.x))
        return _collect(written, rec)
    return _collect(_binary("add", a, b), rec)


def sub(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    if b is None:  # an absent term, as in `add`
        return a
    if a is None:
        return None if is_zero(b) else neg(b, rec)
    if is_zero(b):
        return _note(rec, "A - 0 = A", _binary("sub", a, b), a)
    if is_zero(a):
        _note(rec, "0 - A = -A", _binary("sub", a, b), t.Unary("neg", b, b.shape))
        return neg(b, rec)
    return _collect(_binary("sub", a, b), rec)


def mul(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    if is_one(a) and len(b.shape) >= len(a.shape):
        return _note(rec, "1 * A = A", _binary("mul", a, b), b)
    if is_one(b) and len(a.shape) >= len(b.shape):
        return _note(rec, "A * 1 = A", _binary("mul", a, b), a)
    if _is_neg(a):
        return _minus_out("(-A) * B = -(A * B)", _binary("mul", a, b), mul(a.x, b, rec), rec)
    if _is_neg(b):
        return _minus_out("A * (-B) = -(A * B)", _binary("mul", a, b), mul(a, b.x, rec), rec)
    return _simplify_chain(_binary("mul", a, b), rec)


def div(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    if is_one(b) and len(a.shape) >= len(b.shape):
        return _note(rec, "A / 1 = A", _binary("div", a, b), a)
    if _is_neg(a):
        return _minus_out("(-A) / B = -(A / B)", _binary("div", a, b), div(a.x, b, rec), rec)
    return _simplify_chain(_binary("div", a, b), rec)


def power(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    if is_one(b):
        return _note(rec, "A^1 = A", _binary("pow", a, b), a)
    return _binary("pow", a, b)


def matmul(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    before = t.MatMul(a, b, matmul_shape(a.shape, b.shape))
    # A scalar divisor or factor is moved out of the product, as on a whiteboard.
    for side in ("a", "b"):
        node = a if side == "a" else b
        if isinstance(node, t.Binary) and node.op in ("div", "mul") and node.b.shape == () \
                and is_scalar_constant(node.b):
            inner = matmul(node.a, b, rec) if side == "a" else matmul(a, node.a, rec)
            outer = t.Binary(node.op, inner, node.b, inner.shape)
            return _note(rec, f"(A {'/' if node.op == 'div' else '*'} c) @ B = (A @ B) "
                              f"{'/' if node.op == 'div' else '*'} c for a scalar c", before, outer)
        if _is_neg(node):
            inner = matmul(node.x, b, rec) if side == "a" else matmul(a, node.x, rec)
            rule = "(-A) @ B = -(A @ B)" if side == "a" else "A @ (-B) = -(A @ B)"
            return _minus_out(rule, before, inner, rec)
    return before


def transpose(x: t.Node, rec: Recorder | None = None) -> t.Node:
    shape = (*x.shape[:-2], x.shape[-1], x.shape[-2])
    before = t.Transpose(x, shape)
    if isinstance(x, t.Transpose):
        return _note(rec, "(A.T).T = A", before, x.x)
    if isinstance(x, t.Binary) and x.op in ("div", "mul") and x.b.shape == () and is_scalar_constant(x.b):
        inner = transpose(x.a, rec)
        return _note(rec, "(A / c).T = A.T / c", before, t.Binary(x.op, inner, x.b, inner.shape))
    if _is_neg(x):
        return _minus_out("(-A).T = -(A.T)", before, transpose(x.x, rec), rec)
    if isinstance(x, t.MatMul) and len(x.a.shape) >= 2 and len(x.b.shape) >= 2:
        after = matmul(transpose(x.b, rec), transpose(x.a, rec), rec)
        return _note(rec, "(A @ B).T = B.T @ A.T", before, after)
    return before


def unary(fn: str, x: t.Node) -> t.Node:
    return t.Unary(fn, x, x.shape)


def reduce_sum(x: t.Node, axis: int | None) -> t.Reduce:
    shape = tuple(sympy.Integer(1) if axis is None or k == axis else d for k, d in enumerate(x.shape))
    return t.Reduce("sum", x, axis, shape)


def softmax(x: t.Node, axis: int) -> t.Softmax:
    return t.Softmax(x, axis, x.shape)


def compare(op: str, a: t.Node, b: t.Node) -> t.Compare:
    return t.Compare(op, a, b, broadcast(a.shape, b.shape))


def where(cond: t.Compare, a: t.Node, b: t.Node) -> t.Where:
    return t.Where(cond, a, b, broadcast(cond.shape, a.shape, b.shape))


def ones(shape) -> t.Constant:
    return t.Constant("ones", tuple(shape), tuple(shape))


def zeros(shape) -> t.Node:
    """Zeros of `shape`, written as the spec language writes them: `0 * ones(...)` (0 for a scalar).
    The gradient of a piecewise-constant function (floor): exactly 0, even where G is infinite."""
    shape = tuple(shape)
    if not shape:
        return scalar(0)
    return t.Binary("mul", scalar(0), ones(shape), shape)


def logical(op: str, *args: t.Node) -> t.Logical:
    """`a & b`, `a | b` or `~a` of conditions."""
    return t.Logical(op, tuple(args), broadcast(*(a.shape for a in args)) if len(args) > 1 else args[0].shape)


def apply(fn: str, *args: t.Node) -> t.Apply:
    """An elementwise operation of several operands (`min(a, b)`, `a // b`), shape broadcast."""
    return t.Apply(fn, tuple(args), broadcast(*(a.shape for a in args)))


def sum_to(x: t.Node, shape) -> t.Node:
    """Undo broadcasting: sum `x` down to `shape`."""
    if tuple(x.shape) == tuple(shape):  # nothing was broadcast: no sum to write, so no step
        return x
    node = t.SumTo(x, tuple(shape))
    return node if node.axes else x


def expand_to(x: t.Node, shape, rec: Recorder | None = None) -> t.Node:
    """Broadcast `x` up to `shape` explicitly (as `x * ones(...)`)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return mul(x, ones(shape), rec)



# --- products and quotients: one chain of factors ------------------------------------


@dataclass(frozen=True)
class _Factor:
    """One factor of a product/quotient chain: the chain multiplies by `node`, or divides by it."""

    node: t.Node
    divides: bool = False


def _factors(node: t.Node, divides: bool = False) -> list[_Factor]:
    """`A * B / (C * D)` as [A, B, /C, /D]. Reordering these is exact in IEEE arithmetic up to
    rounding and overflow, infinities and NaN included: the product is NaN when a factor is
    NaN or one is 0 and another infinite (a divisor 0 counting as an infinite factor), whatever
    the order, and `x / y` is `x * (1 / y)` at every extended real."""
    if isinstance(node, t.Binary) and node.op == "mul":
        return _factors(node.a, divides) + _factors(node.b, divides)
    if isinstance(node, t.Binary) and node.op == "div":
        return _factors(node.a, divides) + _factors(node.b, not divides)
    return [_Factor(node, divides)]


def _number(node: t.Node) -> sympy.Expr | None:
    """The value of a finite, nonzero number: the only factors the chain rules combine."""
    if isinstance(node, t.Scalar):
        value = sympy.sympify(node.value)
        if value.is_Number and value.is_finite and not value.is_zero:
            return value
    return None


def _chain(factors: list[_Factor]) -> t.Node:
    """The factors multiplied and divided left to right (a leading divisor as `1 / X`)."""
    out: t.Node | None = None
    for f in factors:
        if out is None:
            out = _binary("div", scalar(1), f.node) if f.divides else f.node
        else:
            out = _binary("div" if f.divides else "mul", out, f.node)
    return scalar(1) if out is None else out


def _coefficient(factors: list[_Factor]) -> sympy.Expr:
    value = sympy.Integer(1)
    for f in factors:
        number = _number(f.node)
        if number is not None:
            value = value / number if f.divides else value * number
    return value


def _scaled(coeff: sympy.Expr, rest: list[_Factor]) -> t.Node:
    """`p * rest / q` for a positive coefficient p / q (a float coefficient written in front)."""
    if not rest:
        return scalar(coeff)
    if (coeff - 1).is_zero:  # also 1.0, which SymPy does not count == 1
        return _chain(rest)
    if coeff.is_Rational:
        p, q = sympy.fraction(coeff)
        front = [_Factor(scalar(p))] if p != 1 else []
        back = [_Factor(scalar(q), divides=True)] if q != 1 else []
        return _chain(front + rest + back)
    return _chain([_Factor(scalar(coeff))] + rest)


def _same_shape(x, y) -> bool:
    return len(x) == len(y) and all(a == b or sympy.expand(a - b) == 0 for a, b in zip(x, y))


def _simplify_chain(node: t.Binary, rec: Recorder | None) -> t.Node:
    """The chain rules, each recorded: `ones(...)` factors that broadcast nothing dropped, then
    the finite nonzero numbers combined (`50 * A * B / 50 = A * B`)."""
    factors = _factors(node)
    kept = list(factors)
    for f in factors:
        if isinstance(f.node, t.Constant) and f.node.kind == "ones":
            others = [g.node.shape for g in kept if g is not f]
            if others and _same_shape(broadcast(*others), node.shape):
                kept.remove(f)  # x * 1 and x / 1 are x for every x, -inf and NaN included
    current: t.Node = node
    if len(kept) < len(factors):
        current = _note(rec, "A * ones(shape) = A where the product has that shape anyway", current, _chain(kept))
    numbers = [f for f in kept if _number(f.node) is not None]
    if len(numbers) < 2:
        return current
    rest = [f for f in kept if _number(f.node) is None]
    coeff = _coefficient(kept)
    rule = "numbers of a product combined: c1 * A / c2 = (c1 / c2) * A"
    if coeff < 0:
        positive = _scaled(-coeff, rest)
        _note(rec, rule, current, t.Unary("neg", positive, positive.shape))
        return neg(positive, rec)
    after = _scaled(coeff, rest)
    return current if after == current else _note(rec, rule, current, after)


# --- sums: like terms collected -----------------------------------------------------


@dataclass(frozen=True)
class _Term:
    """One term of a sum: `sign * node`, with its chain split into a number and the other factors."""

    node: t.Node
    sign: int

    @property
    def coefficient(self) -> sympy.Expr:
        return self.sign * _coefficient(_factors(self.node))

    @property
    def rest(self) -> list[_Factor]:
        return [f for f in _factors(self.node) if _number(f.node) is None]

    @property
    def key(self) -> tuple | None:
        """What makes two terms like terms: the same other factors, whatever their order, and
        coefficients of the same sign. None: a bare number, never collected."""
        rest = self.rest
        if not rest:
            return None
        return frozenset(Counter(rest).items()), self.coefficient > 0


def _terms(node: t.Node, sign: int = 1) -> list[_Term]:
    if isinstance(node, t.Binary) and node.op in ("add", "sub"):
        return _terms(node.a, sign) + _terms(node.b, sign if node.op == "add" else -sign)
    if _is_neg(node):
        return _terms(node.x, -sign)
    return [_Term(node, sign)]


def _collect(node: t.Binary, rec: Recorder | None) -> t.Node:
    """Like terms of a sum collected: `c1 * T + c2 * T = (c1 + c2) * T` when c1 and c2 have
    the same sign. Exact up to rounding for every T, infinities and NaN included; with
    opposite signs it is not (`2 * T - T` is NaN where T is infinite), and `T - T` is never 0."""
    if node.op not in ("add", "sub"):
        return node
    terms = _terms(node)
    groups: dict[tuple, list[_Term]] = {}
    for term in terms:
        key = term.key
        groups.setdefault(key if key is not None else (id(term),), []).append(term)
    if all(len(group) == 1 for group in groups.values()):
        return node
    out: t.Node | None = None
    for group in groups.values():
        if len(group) == 1:
            term, sign = group[0].node, group[0].sign
        else:
            total = sum((g.coefficient for g in group), sympy.Integer(0))
            sign = 1 if total > 0 else -1
            term = _scaled(abs(total), group[0].rest)
        if out is None:
            out = term if sign > 0 else t.Unary("neg", term, term.shape)
        else:
            out = _binary("add" if sign > 0 else "sub", out, term)
    return _note(rec, "like terms collected: c1 * A + c2 * A = (c1 + c2) * A for c1, c2 of one sign", node, out)
