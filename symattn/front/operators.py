"""The operators of conditions and integers: `& | ~`, `//` and `%`, and integer buffers' ranges.

Contract, for the validator `v` (`symattn.front.validate`): `value_range(v, kind,
item)` types `in low:high` of an integer buffer (a buffer only; bounds are dim
arithmetic of either sign; nonempty at every size); `integer_operand(v, node, op)`
requires an operand of `//` or `%` to be an integer (`symattn.ir.integers`),
naming it; `divisor(v, node, op, scope)` requires a divisor that is nonzero for
every index value and size: a dim expression or an integer exactly (naming the
sizes where it is 0), any other integer (an entry of an integer buffer, `w[i] + 1`,
`i + 1`) by being shown >= 1 or <= -1 by `symattn.ir.integers`' interval rules,
at once or, where it reads an index, as a `PendingDivisor` checked when the index
definition closes (a divisor that can be 0 is an error saying why: a buffer range
that holds 0, the index values where it is 0); it marks the divisor's dims as
sizes (so that none of them may be 0); `condition(v, node, op)` requires
an operand of `&`, `|` or `~` to be a condition, with the hint that each
comparison they join needs brackets. Each raises a located `SpecShapeError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from . import syntax as ir
from ..errors import SpecShapeError, SpecSyntaxError
from ..ir import integers
from ..ir import typed as t
from ..ir.affine import nonnegative
from ..ir.printing import to_spec
from ..ir.shapes import ShapeMismatch, broadcast, format_dim
from .real_subscripts import zero_point

__all__ = ["value_range", "bound_expr", "integer_operand", "divisor", "PendingDivisor", "condition", "logical",
           "integer_binary", "comparison_operands", "CONDITION_HINT", "LOGICAL", "INTEGER_BINARY"]

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

@dataclass
class PendingDivisor:
    """A divisor that reads indices (`j // (i + 1)`): shown nonzero once every index's range is known."""

    value: t.Node
    op: str
    pos: ir.Pos
    ranges: dict[str, sympy.Expr] = field(default_factory=dict)  # of summed indices, as their sums close

    def check(self, v, ranges: dict[str, sympy.Expr]) -> None:
        _nonzero(v, self.value, self.op, {**ranges, **self.ranges})


def divisor(v, node: t.Node, op: str, scope=None) -> None:
    """The divisor of // or %: nonzero for every index value and size. A dim expression or an integer is
    decided exactly (naming the sizes where it is 0); any other integer divisor by the interval rules of
    `symattn.ir.integers`, at once, or, where it reads an index, when the index definition closes
    (`scope.pending`). Its dims are sizes (none of them may be 0)."""
    for symbol in _dims_read(node):  # a divisor is a size: it may not be 0
        name = str(symbol)
        if name in v.dims:
            v.size_uses.setdefault(name, node.pos)
    form = integers.as_affine(node)
    constant = None if form is None or isinstance(form, str) or form.indices else form.offset
    if constant is None:
        if any(isinstance(n, t.IndexVar) for n in _outside_subscripts(node)):
            scope.pending.append(PendingDivisor(node, op, node.pos))
        else:  # entries of buffers: their values do not depend on the indices' ranges
            _nonzero(v, node, op, {})
        return
    sign, decision = integers.divisor_sign(constant)
    if sign is None:
        shown = format_dim(constant, v.order)
        if decision.holds is False and decision.sizes is not None:
            at = ", ".join(f"{k}={n}" for k, n in decision.sizes.items())
            where = f"at {at}" if at else "at every size"
            raise err(SpecShapeError, f"the divisor {to_spec(node, v.order)} of {op} is {shown} {where}", node.pos)
        raise err(SpecShapeError, f"cannot show that the divisor {shown} of {op} is nonzero at every size",
                   node.pos)


def _outside_subscripts(node: t.Node):
    """The nodes of a value, not descending into the subscripts of the entries it reads."""
    yield node
    if not isinstance(node, t.Entry):
        for child in node.children:
            yield from _outside_subscripts(child)


def _dims_read(node: t.Node) -> set:
    symbols = set()
    for n in _outside_subscripts(node):
        if isinstance(n, t.DimValue):
            symbols |= sympy.sympify(n.dim).free_symbols
    return symbols


_DIVISOR_HINT = ("a divisor must be >= 1 (or <= -1) for every index value and size, e.g. an integer buffer "
                 "declared `in 1:W`, or max(..., 1)")


def _nonzero(v, node: t.Node, op: str, ranges: dict[str, sympy.Expr]) -> None:
    """Require an integer divisor that is not a constant to be >= 1, or <= -1, for every index value and size."""
    if integers.at_least(node, 1, ranges, v.tensors).holds or integers.at_most(node, -1, ranges, v.tensors).holds:
        return
    shown = to_spec(node, v.order)
    names = [n for n in t.subscript_names(node) if n in ranges]
    over = ", ".join(f"{n} in [0, {format_dim(ranges[n], v.order)})" for n in names)
    reason = _zero_reason(v, node, ranges)
    if reason is not None:
        raise err(SpecShapeError, f"the divisor {shown} of {op} can be 0: {reason}", node.pos, _DIVISOR_HINT)
    low = integers.bound(node, ranges, v.tensors, upper=False)
    high = integers.bound(node, ranges, v.tensors, upper=True)
    span = ""
    if low is not None and high is not None and nonnegative(-low).holds and nonnegative(high).holds:
        span = f": the bounds shown for it, {format_dim(low, v.order)} .. {format_dim(high, v.order)}, include 0"
    raise err(SpecShapeError, f"cannot show that the divisor {shown} of {op} is nonzero for every index value and "
               f"size{' (' + over + ')' if over else ''}{span}", node.pos, _DIVISOR_HINT)


def _zero_reason(v, node: t.Node, ranges: dict[str, sympy.Expr]) -> str | None:
    """Why a divisor can be 0, where that is plain: an integer buffer whose range holds 0, or a point of the
    index box where the divisor, reading no tensor, is 0 at the default sizes."""
    inner = node.x if isinstance(node, t.Unary) and node.fn == "neg" else node
    if isinstance(inner, (t.Entry, t.Tensor)):
        name = inner.tensor if isinstance(inner, t.Entry) else inner.name
        low, high = v.tensors[name].values
        if nonnegative(-sympy.sympify(low)).holds and nonnegative(sympy.expand(high - 1)).holds:
            return (f"{name} holds the values {format_dim(low, v.order)} to "
                    f"{format_dim(sympy.expand(high - 1), v.order)} (`in {format_dim(low, v.order)}:"
                    f"{format_dim(high, v.order)}`), 0 among them")
        return None
    found = zero_point(node, ranges, {info.symbol: v.sizes[name] for name, info in v.dims.items()})
    if found is None:
        return None
    point = ", ".join(f"{n} = {found[n]}" for n in sorted(found, key=list(ranges).index))  # the definition's order
    read = _dims_read(node).union(*(sympy.sympify(ranges[n]).free_symbols for n in found))
    sizes = ", ".join(f"{n}={k}" for n, k in v.sizes.items() if v.dims[n].symbol in read)
    return f"it is 0 at {point}" + (f" (at {sizes})" if sizes else "")


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


def integer_binary(v, node: ir.BinOp, a: t.Node, b: t.Node, scope=None) -> t.Apply:
    """`a // b` or `a % b` of integers, the divisor nonzero for every index value and size."""
    integer_operand(v, a, node.op, node.op_pos)
    integer_operand(v, b, node.op, node.op_pos)
    divisor(v, b, node.op, scope)
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
