"""Dims in the spec language: number literals, dim arithmetic, and sizes.

Contract, for the validator `v` (`symattn.front.validate`): `number_value(node)`
is a literal's exact value (absurdly long or large ones are refused);
`dim_expr(v, node, what)` types dim arithmetic (`h * d_k`, `N + 1`, `2`) as a
SymPy expression, recording each dim it reads as used as a size (`v.size_uses`:
only a dim used as a number alone may be 0); `check_size(v, dim, pos)` requires a
dim expression to be a positive integer at the spec's sizes. Each raises a
located `SpecError`.
"""

from __future__ import annotations

import sympy

from . import syntax as ir
from ..errors import SpecShapeError, SpecSyntaxError
from ..ir.shapes import format_dim

__all__ = ["number_value", "dim_expr", "check_size"]


def err(cls, message: str, pos: ir.Pos, hint: str | None = None):
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


# Bounds that keep exact arithmetic on literals and dims instantaneous; a
# spec beyond them is refused with an error rather than hanging the tool.
_MAX_DIGITS = 1000        # digits of a number literal
_MAX_EXPONENT = 1000      # |e| in 1e-6 style literals
_MAX_DIM_POWER = 64       # exponent of a dim in dim arithmetic
_MAX_DIM_BITS = 4096      # size of an integer in dim arithmetic


def number_value(node: ir.Number) -> sympy.Rational:
    """The exact value of a number literal; absurdly long or large ones are refused."""
    mantissa, _, exponent = node.text.lower().partition("e")
    digits = len(mantissa.replace(".", "").lstrip("0"))
    exponent_digits = exponent.lstrip("+-").lstrip("0")
    if digits > _MAX_DIGITS or len(exponent_digits) > 4 or (exponent and abs(int(exponent)) > _MAX_EXPONENT):
        raise err(SpecSyntaxError, f"the number {node.text[:20]}{'...' if len(node.text) > 20 else ''} is out "
                   f"of range: at most {_MAX_DIGITS} digits and an exponent of at most {_MAX_EXPONENT}", node.pos)
    return sympy.Rational(node.text)



def dim_expr(v, node: ir.Expr, what: str = "a shape") -> sympy.Expr:
    """Dim arithmetic (`h * d_k`, `N + 1`, `2`) as a SymPy expression."""
    if isinstance(node, ir.Name):
        if node.id in v.dims:
            v.size_uses.setdefault(node.id, node.pos)
            return v.dims[node.id].symbol
        if node.id in v.tensors:
            raise err(SpecShapeError, f"'{node.id}' is a tensor, not a dim; {what} is made of dims and integers",
                       node.pos)
        raise v.unknown(node.id, node.pos, dim=True)
    if isinstance(node, ir.Number):
        value = number_value(node)
        if not value.is_integer or value <= 0:
            raise err(SpecShapeError, f"{node.text} is not a positive integer; {what} is made of dims and "
                       "positive integers", node.pos)
        return sympy.Integer(value)
    if isinstance(node, ir.BinOp) and node.op in "+-*/^":
        a, b = dim_expr(v, node.left, what), dim_expr(v, node.right, what)
        if node.op == "^" and not b.is_Integer:
            raise err(SpecShapeError, "a dim can only be raised to an integer power", node.op_pos)
        if node.op == "^" and abs(b) > _MAX_DIM_POWER:
            raise err(SpecShapeError, f"a dim power of {b} is too large (at most {_MAX_DIM_POWER})", node.op_pos)
        result = {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "^": a**b}[node.op]
        too_high = any(p.exp.is_Integer and abs(p.exp) > _MAX_DIM_POWER for p in result.atoms(sympy.Pow))
        too_big = any(max(abs(r.p), r.q).bit_length() > _MAX_DIM_BITS for r in result.atoms(sympy.Rational))
        if too_high or too_big:
            raise err(SpecShapeError, f"{what} is too large to work with (a power above {_MAX_DIM_POWER} "
                       f"or an integer above 2^{_MAX_DIM_BITS})", node.pos)
        return result
    if isinstance(node, ir.UnaryOp) and node.op == "+":
        return dim_expr(v, node.operand, what)
    raise err(SpecShapeError, f"{what} is made of dims and integers joined by + - * /", node.pos)

def check_size(v, dim: sympy.Expr, pos: ir.Pos) -> None:
    """A dim expression must be a positive integer at the spec's sizes."""
    if dim.is_Symbol and any(dim == info.symbol and info.symbol.is_positive for info in v.dims.values()):
        return  # a declared dim used as a size: positive
    sizes = v.sizes
    value = dim.xreplace({info.symbol: sympy.Integer(sizes[name]) for name, info in v.dims.items()})
    if not (value.is_integer and value > 0):
        shown = ", ".join(f"{n}={v.sizes[n]}" for n in v.dims)
        raise err(SpecShapeError, f"{format_dim(dim, v.order)} is {value} at {shown}, not a positive integer",
                   pos)
