"""Symbolic shapes: dims as SymPy expressions, NumPy's shape rules on them.

Contract: a shape is a tuple of SymPy expressions over positive-integer dim
symbols. `broadcast` and `matmul_shape` follow numpy.broadcast_shapes and
numpy.matmul exactly, except that two dims are equal only when they are equal
as expressions (so `[N, d] + [M, d]` is an error even if N and M happen to
have the same default size). A rule that does not fit raises `ShapeMismatch`
with a message naming both shapes; the validator attaches the position.
"""

from __future__ import annotations

from typing import Sequence

import sympy

__all__ = [
    "ShapeMismatch",
    "ONE",
    "dim_symbol",
    "same_dim",
    "format_dim",
    "format_shape",
    "broadcast",
    "matmul_shape",
    "normalize_axis",
]

ONE = sympy.Integer(1)


class ShapeMismatch(ValueError):
    """Shapes that do not fit together (message only; no position)."""


def dim_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


def same_dim(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.expand(a - b) == 0


def format_dim(dim: sympy.Expr, order: Sequence[str] = ()) -> str:
    """`h * d_k`, with factors in declaration order and spaces like the specs."""
    dim = sympy.sympify(dim)
    rank = {name: i for i, name in enumerate(order)}

    def key(factor: sympy.Expr):
        names = sorted(str(s) for s in factor.free_symbols)
        return (0 if factor.is_Number else 1, min((rank.get(n, len(rank)) for n in names), default=0), str(factor))

    def term(t: sympy.Expr) -> str:
        factors = sorted(sympy.Mul.make_args(t), key=key)
        coeff = [f for f in factors if f.is_Number]
        rest = [f for f in factors if not f.is_Number]
        parts = [str(c) for c in coeff if c != 1] + [_power(f) for f in rest]
        return " * ".join(parts) if parts else "1"

    def _power(f: sympy.Expr) -> str:
        if f.is_Pow:
            return f"{f.base}^{f.exp}"
        return str(f)

    num, den = sympy.fraction(sympy.together(dim))
    if dim.is_Add and den == 1:
        terms = sorted(sympy.Add.make_args(dim), key=lambda t: (t.is_Number, key(t)))
        out = term(terms[0])
        for t in terms[1:]:
            text = term(t)
            out += f" - {text[1:]}" if text.startswith("-") else f" + {text}"
        return out
    if den != 1:
        def group(part: sympy.Expr) -> str:
            text = format_dim(part, order)
            return f"({text})" if len(sympy.Add.make_args(part)) > 1 or len(sympy.Mul.make_args(part)) > 1 else text
        return f"{group(num)} / {group(den)}"
    return term(dim)


def format_shape(shape: Sequence[sympy.Expr], order: Sequence[str] = ()) -> str:
    return "[" + ", ".join(format_dim(d, order) for d in shape) + "]"


def broadcast(*shapes: Sequence[sympy.Expr], op: str = "+", order: Sequence[str] = ()) -> tuple:
    """numpy.broadcast_shapes over symbolic dims."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(1, rank + 1):
        dim = ONE
        for shape in shapes:
            if k > len(shape):
                continue
            this = shape[-k]
            if this == ONE or same_dim(this, dim):
                continue
            if dim == ONE:
                dim = this
                continue
            shown = f" {op} ".join(format_shape(s, order) for s in shapes)
            raise ShapeMismatch(
                f"{shown}: cannot broadcast {format_dim(dim, order)} and {format_dim(this, order)}"
            )
        out.append(dim)
    return tuple(reversed(out))


def matmul_shape(a: Sequence[sympy.Expr], b: Sequence[sympy.Expr], order: Sequence[str] = ()) -> tuple:
    """numpy.matmul's result shape: 1-D operands promoted, batch axes broadcast."""
    def shown() -> str:  # only formatted on failure: formatting costs more than the rule
        return f"{format_shape(a, order)} @ {format_shape(b, order)}"

    if len(a) == 0 or len(b) == 0:
        raise ShapeMismatch(f"{shown()}: @ needs tensors with at least one axis; use * for scalars")
    a2 = (ONE, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, ONE) if len(b) == 1 else tuple(b)
    inner_a, inner_b = a2[-1], b2[-2]
    if not same_dim(inner_a, inner_b):
        raise ShapeMismatch(
            f"{shown()}: inner dims {format_dim(inner_a, order)} and {format_dim(inner_b, order)} differ"
        )
    try:
        batch = broadcast(a2[:-2], b2[:-2], op="@", order=order)
    except ShapeMismatch:
        raise ShapeMismatch(
            f"{shown()}: batch axes {format_shape(a2[:-2], order)} and {format_shape(b2[:-2], order)} do not broadcast"
        ) from None
    out = list(batch)
    if len(a) > 1:
        out.append(a2[-2])
    if len(b) > 1:
        out.append(b2[-1])
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    """Map a possibly negative axis into range(rank); raise ShapeMismatch if out of range."""
    if not -rank <= axis < rank:
        raise ShapeMismatch(f"axis {axis} is out of range for a tensor with {rank} ax{'is' if rank == 1 else 'es'}")
    return axis % rank
