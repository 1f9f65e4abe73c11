"""Smart constructors for typed-IR nodes, used by the symbolic passes.

Contract: each function returns a typed node with its shape inferred by the
rules of `symattn.ir.shapes`, after the local simplifications a person would
make without thinking (`-(-A) = A`, `(A.T).T = A`, `1 * A = A`, a scalar
divisor moved out of a matrix product: `(A / c) @ B = (A @ B) / c`). Each
simplification that fires is reported to an optional `Recorder` as a
(rule, before, after) step, so that documents replay exactly what was done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from . import typed as t
from .shapes import broadcast, matmul_shape

__all__ = [
    "Recorder",
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


@dataclass
class Recorder:
    """Collects simplification steps: (rule, before, after)."""

    steps: list[tuple[str, t.Node, t.Node]] = field(default_factory=list)

    def note(self, rule: str, before: t.Node, after: t.Node) -> t.Node:
        self.steps.append((rule, before, after))
        return after


class _Discard(Recorder):
    """The recorder of callers that keep no steps: `note` returns the result and keeps nothing
    (a shared default Recorder would collect every step of the process, forever)."""

    def note(self, rule: str, before: t.Node, after: t.Node) -> t.Node:
        return after


_NULL = _Discard()


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


def neg(x: t.Node, rec: Recorder = _NULL) -> t.Node:
    if isinstance(x, t.Scalar):
        return t.Scalar(-x.value)
    if isinstance(x, t.Unary) and x.fn == "neg":
        return rec.note("-(-A) = A", t.Unary("neg", x, x.shape), x.x)
    return t.Unary("neg", x, x.shape)


def _binary(op: str, a: t.Node, b: t.Node) -> t.Binary:
    return t.Binary(op, a, b, broadcast(a.shape, b.shape))


def add(a: t.Node | None, b: t.Node | None, rec: Recorder = _NULL) -> t.Node | None:
    if is_zero(a):
        return b
    if is_zero(b):
        return a
    if isinstance(b, t.Unary) and b.fn == "neg":
        return _binary("sub", a, b.x)
    return _binary("add", a, b)


def sub(a: t.Node, b: t.Node, rec: Recorder = _NULL) -> t.Node:
    if is_zero(b):
        return a
    if is_zero(a):
        return neg(b, rec)
    return _binary("sub", a, b)


def mul(a: t.Node, b: t.Node, rec: Recorder = _NULL) -> t.Node:
    if is_one(a) and len(b.shape) >= len(a.shape):
        return b
    if is_one(b) and len(a.shape) >= len(b.shape):
        return a
    if isinstance(a, t.Unary) and a.fn == "neg":
        return neg(mul(a.x, b, rec), rec)
    if isinstance(b, t.Unary) and b.fn == "neg":
        return neg(mul(a, b.x, rec), rec)
    return _binary("mul", a, b)


def div(a: t.Node, b: t.Node, rec: Recorder = _NULL) -> t.Node:
    if is_one(b) and len(a.shape) >= len(b.shape):
        return a
    if isinstance(a, t.Unary) and a.fn == "neg":
        return neg(div(a.x, b, rec), rec)
    return _binary("div", a, b)


def power(a: t.Node, b: t.Node, rec: Recorder = _NULL) -> t.Node:
    if is_one(b):
        return a
    return _binary("pow", a, b)


def matmul(a: t.Node, b: t.Node, rec: Recorder = _NULL) -> t.Node:
    # A scalar divisor or factor is moved out of the product, as on a whiteboard.
    for side in ("a", "b"):
        node = a if side == "a" else b
        if isinstance(node, t.Binary) and node.op in ("div", "mul") and node.b.shape == () \
                and is_scalar_constant(node.b):
            inner = matmul(node.a, b, rec) if side == "a" else matmul(a, node.a, rec)
            outer = t.Binary(node.op, inner, node.b, inner.shape)
            before = t.MatMul(a, b, matmul_shape(a.shape, b.shape))
            return rec.note(f"(A {'/' if node.op == 'div' else '*'} c) @ B = (A @ B) "
                            f"{'/' if node.op == 'div' else '*'} c for a scalar c", before, outer)
        if isinstance(node, t.Unary) and node.fn == "neg":
            inner = matmul(node.x, b, rec) if side == "a" else matmul(a, node.x, rec)
            return neg(inner, rec)
    return t.MatMul(a, b, matmul_shape(a.shape, b.shape))


def transpose(x: t.Node, rec: Recorder = _NULL) -> t.Node:
    shape = (*x.shape[:-2], x.shape[-1], x.shape[-2])
    if isinstance(x, t.Transpose):
        return rec.note("(A.T).T = A", t.Transpose(x, shape), x.x)
    if isinstance(x, t.Binary) and x.op in ("div", "mul") and x.b.shape == () and is_scalar_constant(x.b):
        inner = transpose(x.a, rec)
        return rec.note("(A / c).T = A.T / c", t.Transpose(x, shape), t.Binary(x.op, inner, x.b, inner.shape))
    if isinstance(x, t.Unary) and x.fn == "neg":
        return neg(transpose(x.x, rec), rec)
    if isinstance(x, t.MatMul) and len(x.a.shape) >= 2 and len(x.b.shape) >= 2:
        after = matmul(transpose(x.b, rec), transpose(x.a, rec), rec)
        return rec.note("(A @ B).T = B.T @ A.T", t.Transpose(x, shape), after)
    return t.Transpose(x, shape)


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
    if tuple(x.shape) == tuple(shape):
        return x
    node = t.SumTo(x, tuple(shape))
    return node if node.axes else x


def expand_to(x: t.Node, shape) -> t.Node:
    """Broadcast `x` up to `shape` explicitly (as `x * ones(...)`)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return mul(x, ones(shape))

