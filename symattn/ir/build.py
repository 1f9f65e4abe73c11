"""Smart constructors for typed-IR nodes, used by the symbolic passes.

Contract: each function returns a typed node with its shape inferred by the
rules of `symattn.ir.shapes`, after the local simplifications a person would
make without thinking (`-(-A) = A`, `(A.T).T = A`, `1 * A = A`, a scalar
divisor moved out of a matrix product: `(A / c) @ B = (A @ B) / c`). Each
simplification that fires is reported as a `Simplification(rule, before,
after)` to the `Recorder` the caller passed (`rec`), so that documents replay
exactly what was done; without one, nothing is recorded anywhere (there is no
shared recorder). `sum_to` and `expand_to` of a tensor that already has the
shape return it unchanged: that is no simplification, nothing was written.
"""

from __future__ import annotations

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
        return _note(rec, "A + (-B) = A - B", _binary("add", a, b), _binary("sub", a, b.x))
    return _binary("add", a, b)


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
    return _binary("sub", a, b)


def mul(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    if is_one(a) and len(b.shape) >= len(a.shape):
        return _note(rec, "1 * A = A", _binary("mul", a, b), b)
    if is_one(b) and len(a.shape) >= len(b.shape):
        return _note(rec, "A * 1 = A", _binary("mul", a, b), a)
    if _is_neg(a):
        return _minus_out("(-A) * B = -(A * B)", _binary("mul", a, b), mul(a.x, b, rec), rec)
    if _is_neg(b):
        return _minus_out("A * (-B) = -(A * B)", _binary("mul", a, b), mul(a, b.x, rec), rec)
    return _binary("mul", a, b)


def div(a: t.Node, b: t.Node, rec: Recorder | None = None) -> t.Node:
    if is_one(b) and len(a.shape) >= len(b.shape):
        return _note(rec, "A / 1 = A", _binary("div", a, b), a)
    if _is_neg(a):
        return _minus_out("(-A) / B = -(A / B)", _binary("div", a, b), div(a.x, b, rec), rec)
    return _binary("div", a, b)


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

