"""Computed subscripts in index notation and slices in matrix notation: typing and range checks.

Contract, for the validator `v` (`symattn.front.validate`):

- `subscript(v, node, scope)` types one subscript of an entry `X[...]` in
  index notation: a plain index name (returned as the name), or an affine
  expression in the indices with integer coefficients and dim terms
  (`j - i + N - 1`, `2 * c + 1`), returned as a `symattn.ir.affine.Affine`.
  A product of two indices, a non-integer coefficient (`c / 2`), a power, a
  function or a tensor in a subscript is a located error naming it.
- How an index's range is known: from a plain-name subscript (`Q[i, c]`
  binds c to the range of axis 1 of Q), or given explicitly on the left
  (`T[i:N, c:h] = ...`) or in a sum (`sum(c:h, ...)`). A computed subscript
  never binds a range, so an index that appears only inside arithmetic needs
  an explicit one.
- `Pending` records a computed subscript; `check_subscript(v, pending)`, run
  once every range is known, requires it to stay within its axis for every
  index value and every size of the dims: its least and greatest values
  over the index box (corners) are compared with the axis symbolically
  (`symattn.ir.affine.nonnegative`). Out of range at some sizes, or not
  shown for all, is a `SpecShapeError` naming the subscript, the indices
  with their ranges, and the axis's range.
- `sliced(v, x, items, pos)` types `X[:, 0:h]` in matrix notation: one
  `typed.Slice` per sliced axis (bounds are dim expressions, end exclusive,
  no step, a missing bound is 0 or the axis's size, fewer items than axes
  leave the rest whole), after checking `0 <= start <= stop <= size` for
  every size and that the slice is not empty at the spec's sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from . import syntax as ir
from ..errors import SpecShapeError
from ..ir import typed as t
from ..ir.affine import Affine, affine, corner, extremes, nonnegative, text
from ..ir.integers import as_affine, at_least, at_most, integer_valued
from ..ir.printing import to_spec
from ..ir.shapes import format_dim

from .real_subscripts import nonfinite

__all__ = ["Pending", "subscript", "check_subscript", "sliced", "slice_range"]


def err(cls, message: str, pos: ir.Pos, hint: str | None = None):
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


def _number(v, node: ir.Number) -> sympy.Rational:
    return v.expr(node, None).value  # the validator's reading of a literal, with its limits


@dataclass
class Pending:
    """A computed subscript whose range check waits until every index's range is known."""

    value: "Affine | t.Node"
    tensor: str
    axis: int
    size: sympy.Expr
    pos: ir.Pos
    ranges: dict[str, sympy.Expr] = field(default_factory=dict)  # of summed indices, as their sums close

    def check(self, v, ranges: dict[str, sympy.Expr]) -> None:
        check_subscript(v, self, ranges)


@dataclass
class _Linear:
    """An affine value while it is parsed: index -> integer coefficient, and an integer dim offset."""

    terms: dict[str, int]
    offset: sympy.Expr

    @property
    def constant(self) -> bool:
        return not any(self.terms.values())


_FORM = "a subscript is made of indices, dims and integers joined by + - *"


def _linear(v, node: ir.Expr, scope) -> _Linear:
    if isinstance(node, ir.Number):
        value = _number(v, node)
        if not value.is_integer:
            raise err(SpecShapeError, f"{node.text} is not an integer; {_FORM}", node.pos)
        return _Linear({}, sympy.Integer(value))
    if isinstance(node, ir.Name):
        if scope is not None and node.id in scope.ranges:
            return _Linear({node.id: 1}, sympy.Integer(0))
        if node.id in v.dims:
            return _Linear({}, v.dims[node.id].symbol)
        if node.id in v.tensors:
            raise err(SpecShapeError, f"'{node.id}' is a tensor; {_FORM}", node.pos)
        raise err(SpecShapeError, f"unknown index '{node.id}'", node.pos,
                  f"an index must appear on the left (T[{node.id}, ...] = ...) or be summed: sum({node.id}, ...)")
    if isinstance(node, ir.UnaryOp):
        inner = _linear(v, node.operand, scope)
        if node.op == "+":
            return inner
        return _Linear({k: -c for k, c in inner.terms.items()}, -inner.offset)
    if isinstance(node, ir.BinOp) and node.op in "+-":
        a, b = _linear(v, node.left, scope), _linear(v, node.right, scope)
        sign = 1 if node.op == "+" else -1
        terms = dict(a.terms)
        for k, c in b.terms.items():
            terms[k] = terms.get(k, 0) + sign * c
        return _Linear(terms, a.offset + sign * b.offset)
    if isinstance(node, ir.BinOp) and node.op == "*":
        a, b = _linear(v, node.left, scope), _linear(v, node.right, scope)
        if not a.constant and not b.constant:
            raise err(SpecShapeError, "a subscript is affine in the indices: this multiplies two indices",
                      node.op_pos, "write a product of indices as a sum with where(...), or as another tensor")
        if a.constant and b.constant:
            return _Linear({}, sympy.expand(a.offset * b.offset))
        factor, scaled = (a, b) if a.constant else (b, a)
        if not factor.offset.is_Integer:
            raise err(SpecShapeError, f"the coefficient of an index in a subscript must be an integer, not "
                      f"{format_dim(factor.offset, v.order)}", node.op_pos)
        k = int(factor.offset)
        return _Linear({n: k * c for n, c in scaled.terms.items()}, k * scaled.offset)
    if isinstance(node, ir.BinOp) and node.op == "/":
        raise err(SpecShapeError, "a subscript cannot divide: the coefficients of its indices are integers",
                  node.op_pos, "for the block an index falls in write // (Q[i, j // W]); or give the index a "
                  "range of its own, as in Q[i, 2 * c] with c:h")
    if isinstance(node, ir.BinOp) and node.op == "^":
        raise err(SpecShapeError, "a subscript is affine in the indices: it cannot take a power", node.op_pos)
    if isinstance(node, ir.SliceItem):
        raise err(SpecShapeError, "a slice start:stop works on whole tensors (matrix notation); in index "
                  "notation write the subscript itself, as X[i, c + h]", node.pos)
    raise err(SpecShapeError, _FORM, node.pos)


def _affine_syntax(node: ir.Expr) -> bool:
    """Whether a subscript is written with numbers, names and + - * / ^ only (the affine forms, whose
    mistakes `_linear` explains); anything else is an integer expression typed as a value."""
    if isinstance(node, (ir.Number, ir.Name, ir.SliceItem)):
        return True
    if isinstance(node, ir.UnaryOp):
        return node.op in "+-" and _affine_syntax(node.operand)
    if isinstance(node, ir.BinOp):
        return node.op in ("+", "-", "*", "/", "^") and _affine_syntax(node.left) and _affine_syntax(node.right)
    return False


def subscript(v, node: ir.Expr, scope) -> "str | Affine | t.Node":
    """One subscript of an entry in index notation: an index name, an Affine, or an integer node
    (see the module docstring)."""
    if _affine_syntax(node):
        linear = _linear(v, node, scope)
        return affine(linear.terms, linear.offset)
    value = v.expr(node, scope)
    if isinstance(value, (t.Compare, t.Logical)):
        raise err(SpecShapeError, "a subscript is an integer, not a condition", node.pos)
    if not integer_valued(value, v.tensors):
        raise err(SpecShapeError, f"a subscript is an integer, but {to_spec(value, v.order)} is real", node.pos,
                  "integers are indices, dims, integer literals, integer buffers (`buffer doc[N] in 0:D`), "
                  "floor(...) and ceil(...), and + - * // % min max clamp abs of those")
    real = [n for n in t.tensors_read(value) if not v.tensors[n].integer]
    if real:
        raise err(SpecShapeError, f"a subscript reads only indices, dims and integer buffers, but this one reads "
                  f"'{real[0]}'", node.pos, "declare an integer tensor as `buffer NAME[...] in low:high`")
    simple = as_affine(value)
    return simple if simple is not None else value


def _interval(size: sympy.Expr, order) -> str:
    return f"[0, {format_dim(size, order)})"


def _signed(value: sympy.Expr, order) -> str:
    return text(Affine((), (), sympy.expand(value)), order)


def check_subscript(v, pending: Pending, ranges: dict[str, sympy.Expr]) -> None:
    """Require a computed subscript to stay within its axis for every index value and every size."""
    order = v.order
    ranges = {**ranges, **pending.ranges}
    s = pending.value
    if isinstance(s, t.Node):
        _check_integer_subscript(v, pending, ranges)
        return
    low, high = extremes(s, ranges)
    shown = text(s, order)
    where = f"axis {pending.axis} of {pending.tensor}, {_interval(pending.size, order)}"
    over = ", ".join(f"{n} in {_interval(ranges[n], order)}" for n in s.indices)
    for least, bound, decision in ((True, low, nonnegative(low)), (False, high, nonnegative(pending.size - 1 - high))):
        if decision.holds:
            continue
        at = ", ".join(f"{n} = {_signed(x, order)}" for n, x in corner(s, ranges, least).items())
        extreme = f"it is {_signed(bound, order)} at {at}" if at else f"it is {_signed(bound, order)}"
        if decision.holds is False:
            sizes = ", ".join(f"{k}={n}" for k, n in decision.sizes.items())
            message = (f"subscript {shown} of {pending.tensor} leaves its range: {extreme} ({over}), outside "
                       f"{where}" + (f"; at {sizes} that is {decision.value}" if sizes else ""))
        else:
            message = (f"cannot show that subscript {shown} of {pending.tensor} stays in {where} for every "
                       f"size: {extreme} ({over})")
        raise err(SpecShapeError, message, pending.pos,
                  "a subscript must stay within its axis for every index value and every size of the dims")


def _check_integer_subscript(v, pending: Pending, ranges: dict[str, sympy.Expr]) -> None:
    """`check_subscript` for a subscript that is not affine: `symattn.ir.integers`' interval rules."""
    order = v.order
    s = pending.value
    shown = to_spec(s, order)
    where = f"axis {pending.axis} of {pending.tensor}, {_interval(pending.size, order)}"
    over = ", ".join(f"{n} in {_interval(ranges[n], order)}" for n in t.subscript_names(s))
    found = nonfinite(s, ranges, {info.symbol: v.sizes[name] for name, info in v.dims.items()})
    if found is not None:  # clamp bounds a value, not NaN: floor(log2(j - i)) is NaN wherever j < i
        node, at = found
        point = ", ".join(f"{n} = {k}" for n, k in at.items())
        raise err(SpecShapeError, f"subscript {shown} of {pending.tensor} is not a number where {to_spec(node.x, order)} "
                  f"is NaN or infinite ({point}, at the default sizes): {node.fn} of it is no position", pending.pos,
                  "keep the argument finite over the index ranges, e.g. log2(abs(j - i) + 1) for a distance")
    checks = ((at_least(s, 0, ranges, v.tensors), "below 0"),
              (at_most(s, pending.size - 1, ranges, v.tensors), f"above {format_dim(pending.size - 1, order)}"))
    for decision, side in checks:
        if decision.holds:
            continue
        if decision.holds is False:
            sizes = ", ".join(f"{k}={n}" for k, n in (decision.sizes or {}).items())
            message = (f"subscript {shown} of {pending.tensor} leaves its range: it can be {side} ({over}), outside "
                       f"{where}" + (f"; at {sizes}" if sizes else ""))
        else:
            message = (f"cannot show that subscript {shown} of {pending.tensor} stays in {where} for every index "
                       f"value and size ({over}): it may be {side}")
        raise err(SpecShapeError, message, pending.pos,
                  "bound it with clamp(..., 0, size - 1), or give its parts ranges that keep it in")


# --- slices ---------------------------------------------------------------------------


def _bound(v, node: ir.Expr, what: str) -> sympy.Expr:
    """A slice bound: dim arithmetic with integers, 0 included."""
    if isinstance(node, ir.Number):
        value = _number(v, node)
        if not value.is_integer or value < 0:
            raise err(SpecShapeError, f"{node.text} is not a whole number; {what} is made of dims and integers",
                      node.pos)
        return sympy.Integer(value)
    if isinstance(node, ir.BinOp) and node.op in "+-*/":
        a, b = _bound(v, node.left, what), _bound(v, node.right, what)
        return sympy.expand({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[node.op])
    return v.dim_expr(node, what)


def slice_range(v, item: ir.SliceItem, size: sympy.Expr, what: str) -> tuple[sympy.Expr, sympy.Expr]:
    """(start, stop) of one slice item along an axis of `size`, checked for every size."""
    order = v.order
    start = _bound(v, item.start, f"the start of {what}") if item.start is not None else sympy.Integer(0)
    stop = _bound(v, item.stop, f"the end of {what}") if item.stop is not None else size
    text_of = f"{format_dim(start, order)}:{format_dim(stop, order)}"
    checks = ((start, item.start, f"its start {format_dim(start, order)} is negative"),
              (stop - start, item, f"its start {format_dim(start, order)} is after its end {format_dim(stop, order)}"),
              (size - stop, item.stop, f"it ends after {format_dim(size, order)}, the size of {what}"))
    for value, node, problem in checks:
        decision = nonnegative(value)
        pos = (node or item).pos
        if decision.holds is False:
            sizes = ", ".join(f"{k}={n}" for k, n in decision.sizes.items())
            raise err(SpecShapeError, f"the slice {text_of} of {what} is out of bounds: {problem}"
                      + (f" (at {sizes})" if sizes else ""), pos, "a slice start:stop needs 0 <= start <= stop "
                      "<= size, end exclusive")
        if decision.holds is None:
            raise err(SpecShapeError, f"cannot show that the slice {text_of} of {what} is within bounds for "
                      f"every size (0 <= start <= stop <= {format_dim(size, order)})", pos)
    values = {name: v.dims[name].symbol for name in v.dims}
    at = {values[n]: sympy.Integer(s) for n, s in v.sizes.items()}
    for bound in (start, stop):
        if not sympy.sympify(bound).xreplace(at).is_integer:
            shown = ", ".join(f"{n}={s}" for n, s in v.sizes.items())
            raise err(SpecShapeError, f"the slice bound {format_dim(bound, order)} is not a whole number at "
                      f"{shown}", item.pos)
    if (stop - start).xreplace(at) < 1:
        shown = ", ".join(f"{n}={s}" for n, s in v.sizes.items())
        raise err(SpecShapeError, f"the slice {text_of} of {what} is empty at {shown}", item.pos,
                  "every axis of a tensor has at least one entry")
    return start, stop


def sliced(v, x: t.Node, items: tuple[ir.Expr, ...], name: str, pos: ir.Pos) -> t.Node:
    """`x[items]` in matrix notation: a `Slice` per sliced axis (see the module docstring)."""
    rank = len(x.shape)
    if len(items) > rank:
        raise err(SpecShapeError, f"{name} has shape {v.shape_text(x.shape)}: it takes at most {rank} "
                  f"slice{'s' if rank != 1 else ''}, not {len(items)}", pos)
    for item in items:
        if not isinstance(item, ir.SliceItem):
            raise err(SpecShapeError, "in matrix notation a subscript is a slice, start:stop or :", item.pos,
                      f"to pick entries, define a tensor in index notation: T[i, j] = ... {name}[i, j] ...")
    out = x
    for axis, item in enumerate(items):
        size = x.shape[axis]
        start, stop = slice_range(v, item, size, f"axis {axis} of {name}")
        if start == 0 and sympy.expand(stop - size) == 0:
            continue  # the whole axis
        shape = tuple(sympy.expand(stop - start) if k == axis else d for k, d in enumerate(out.shape))
        out = t.Slice(out, axis, start, stop, shape, pos=pos)
    return out
