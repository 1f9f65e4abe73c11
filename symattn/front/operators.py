"""The operators of conditions and integers: `& | ~`, `//` and `%`, and integer buffers' ranges.

Contract, for the validator `v` (`symattn.front.validate`): `value_range(v, kind,
item)` types `in low:high` of an integer buffer (a buffer only; bounds are dim
arithmetic of either sign; nonempty at every size); `integer_operand(v, node, op)`
requires an operand of `//` or `%` to be an integer (`symattn.ir.integers`),
naming it; `divisor(v, node, op)` requires a divisor that is a dim expression or
an integer, nonzero at every size (naming the sizes where it is 0), and marks its
dims as sizes (so that none of them may be 0); `condition(v, node, op)` requires
an operand of `&`, `|` or `~` to be a condition, with the hint that each
comparison they join needs brackets. Each raises a located `SpecShapeError`.
"""

from __future__ import annotations

import sympy

from . import syntax as ir
from ..errors import SpecShapeError, SpecSyntaxError
from ..ir import integers
from ..ir import typed as t
from ..ir.affine import nonnegative
from ..ir.printing import to_spec
from ..ir.shapes import ShapeMismatch, broadcast, format_dim

__all__ = ["value_range", "bound_expr", "integer_operand", "divisor", "condition", "logical", "integer_binary",
           "comparison_operands", "CONDITION_HINT", "LOGICAL", "INTEGER_BINARY"]

LOGICAL = {"&": "and", "|": "or"}
INTEGER_BINARY = {"//": "floordiv", "%": "mod"}

CONDITION_HINT = ("as in NumPy, & and | bind tighter than a comparison: put each comparison in brackets, "
                  "as in (j <= i) & (doc[i] == doc[j])")


def err(cls, message: str, pos: ir.Pos, hint: str | None = None):
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


def value_range(v, kind: str, item: ir.TensorItem) -> tuple[sympy.Expr, sympy.Expr]:
    """`in low:high` of an integer buffer: bounds are dim arithmetic (negative allowed), low < high."""
    if kind != "buffer":
        raise err(SpecShapeError, f"only a buffer can hold integers: '{item.name.id}' is {'an' if kind == 'input' else 'a'} {kind}, "
                   "which is differentiated", item.values.pos, f"declare it `buffer {item.name.id}... in low:high`")
    low, high = (bound_expr(v, e, f"the values of {item.name.id}") for e in (item.values.low, item.values.high))
    decision = nonnegative(sympy.expand(high - low - 1))
    if not decision.holds:
        at = "" if not decision.sizes else " (at " + ", ".join(f"{k}={n}" for k, n in decision.sizes.items()) + ")"
        raise err(SpecShapeError, f"the range {format_dim(low, v.order)}:{format_dim(high, v.order)} of "
                   f"{item.name.id} {'is empty' + at if decision.holds is False else 'is not shown to be nonempty for every size'}",
                   item.values.pos, "an integer buffer's range low:high holds low .. high - 1, so high > low")
    return low, high

def bound_expr(v, node: ir.Expr, what: str) -> sympy.Expr:
    """Dim arithmetic with integers of either sign (the bounds of an integer buffer's values)."""
    if isinstance(node, ir.Number):
        value = v.expr(node, None).value
        if not value.is_integer:
            raise err(SpecShapeError, f"{node.text} is not an integer; {what} are dims and integers", node.pos)
        return sympy.Integer(value)
    if isinstance(node, ir.UnaryOp) and node.op in "+-":
        inner = bound_expr(v, node.operand, what)
        return inner if node.op == "+" else -inner
    if isinstance(node, ir.BinOp) and node.op in "+-*":
        a, b = bound_expr(v, node.left, what), bound_expr(v, node.right, what)
        return sympy.expand({"+": a + b, "-": a - b, "*": a * b}[node.op])
    return v.dim_expr(node, what)

def integer_operand(v, node: t.Node, op: str, pos: ir.Pos) -> None:
    if not integers.integer_valued(node, v.tensors):
        raise err(SpecShapeError, f"{op} works on integers, but {to_spec(node, v.order)} is real", node.pos,
                   "integers are indices, dims, integer literals, integer buffers (`buffer doc[N] in 0:D`), "
                   "floor(...) and ceil(...), and + - * // % min max clamp abs of those")

def divisor(v, node: t.Node, op: str) -> None:
    """The divisor of // or %: a dim expression or an integer, nonzero at every size."""
    form = integers.as_affine(node)
    constant = None if form is None or isinstance(form, str) or form.indices else form.offset
    if constant is None:
        raise err(SpecShapeError, f"the divisor of {op} must be a dim expression or an integer, not "
                   f"{to_spec(node, v.order)}", node.pos)
    for symbol in sympy.sympify(constant).free_symbols:  # a divisor is a size: it may not be 0
        name = str(symbol)
        if name in v.dims:
            v.size_uses.setdefault(name, node.pos)
    sign, decision = integers.divisor_sign(constant)
    if sign is None:
        shown = format_dim(constant, v.order)
        if decision.holds is False and decision.sizes is not None:
            at = ", ".join(f"{k}={n}" for k, n in decision.sizes.items())
            where = f"at {at}" if at else "at every size"
            raise err(SpecShapeError, f"the divisor {to_spec(node, v.order)} of {op} is {shown} {where}", node.pos)
        raise err(SpecShapeError, f"cannot show that the divisor {shown} of {op} is nonzero at every size",
                   node.pos)

def condition(v, node: t.Node, op: str, pos: ir.Pos) -> None:
    if not isinstance(node, (t.Compare, t.Logical)):
        if op == "~":
            raise err(SpecShapeError, f"~ negates a condition, but {to_spec(node, v.order)} is a value",
                       node.pos, "write the condition in brackets, as in ~(j <= i)")
        raise err(SpecShapeError, f"{op} joins conditions, but {to_spec(node, v.order)} is a value", node.pos,
                   CONDITION_HINT)


def logical(v, node: ir.BinOp, a: t.Node, b: t.Node) -> t.Logical:
    """`a & b` or `a | b` of conditions; a chain of one operator is one node (`(a) & (b) & (c)`)."""
    for side in (a, b):
        condition(v, side, node.op, node.op_pos)
    try:
        shape = broadcast(a.shape, b.shape, op=node.op, order=v.order)
    except ShapeMismatch as exc:
        raise v.shape_error(exc, node.op_pos) from None
    op = LOGICAL[node.op]
    args = tuple(x for side in (a, b) for x in (side.args if isinstance(side, t.Logical) and side.op == op else (side,)))
    return t.Logical(op, args, shape, pos=node.pos)


def integer_binary(v, node: ir.BinOp, a: t.Node, b: t.Node) -> t.Apply:
    """`a // b` or `a % b` of integers, the divisor nonzero at every size."""
    integer_operand(v, a, node.op, node.op_pos)
    integer_operand(v, b, node.op, node.op_pos)
    divisor(v, b, node.op)
    try:
        shape = broadcast(a.shape, b.shape, op=node.op, order=v.order)
    except ShapeMismatch as exc:
        raise v.shape_error(exc, node.op_pos) from None
    return t.Apply(INTEGER_BINARY[node.op], (a, b), shape, pos=node.pos)


def comparison_operands(v, node: ir.Compare) -> None:
    """A comparison beside `&` or `|` without brackets (`j <= i & k`): the error that says to bracket it."""
    for side in (node.left, node.right):
        if isinstance(side, ir.BinOp) and side.op in LOGICAL:
            raise err(SpecSyntaxError, f"a comparison beside {side.op} needs brackets: this reads as "
                      f"a {node.op} (... {side.op} ...)", side.op_pos, CONDITION_HINT)
