"""Computed subscripts: affine in the indices, with integer coefficients and dim terms.

Contract: a subscript of an entry in index notation is either a plain index
name (a `str`, the common case, read as it always was) or an `Affine`:
`sum of coefficient * index + offset`, each coefficient a nonzero integer and
the offset an integer polynomial in the dims (`j - i + N - 1`, `2 * c + 1`).
`affine(terms, offset)` builds the normal form: zero coefficients dropped,
and a subscript that is one index with coefficient 1 and no offset is that
index's name, so `b[i + 0]` and `b[i]` are the same entry.

For every subscript (name or `Affine`): `names(s)` are the indices it reads,
`renamed(s, mapping)` renames them (index -> index), `substituted(s, mapping)`
replaces them by subscripts (index -> name or `Affine`), `value(s, values,
offset)` computes it from index values (arrays or numbers) and the offset at
concrete sizes, `as_sympy(s, symbols)` writes it as a SymPy expression, and
`text(s, order)` is spec text (`j - i + N - 1`); `pieces(s)` are its signed
terms in printing order (indices first, then the offset's terms), which every
printer (spec text, typesetting, NumPy, CUDA) spells in its own syntax.

Range decisions, for all sizes of the dims (positive integers):
`extremes(s, ranges)` is the least and the greatest value over the index box
(attained at its corners: each index at 0 or at its range minus 1), and
`nonnegative(expr)` decides whether a dim expression is >= 0 at every size:
`SizeDecision.holds` is True (a proof: after substituting dim = 1 + u every
coefficient of the numerator polynomial in u >= 0 is >= 0, the denominator's
too; dim = u for a dim used only as a number, whose symbol is nonnegative and
which may be 0), False (with the sizes of a counterexample) or None (neither shown).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

import sympy

from .shapes import format_dim

__all__ = ["Affine", "affine", "names", "renamed", "substituted", "value", "as_sympy", "Piece", "pieces", "text", "signed_sum",
           "terms", "offset", "extremes", "box_extremes", "corner", "SizeDecision", "nonnegative"]


@dataclass(frozen=True, slots=True)
class Affine:
    """`sum(coefficients[k] * indices[k]) + offset`: a computed subscript (see the module docstring).

    `indices` in order of first appearance, each once, with a nonzero integer
    coefficient; `offset` an integer polynomial in the dim symbols.
    """

    indices: tuple[str, ...]
    coefficients: tuple[int, ...]
    offset: sympy.Expr

    def __str__(self) -> str:
        return text(self)


def affine(terms: Mapping[str, int] | Sequence[tuple[str, int]], offset=0) -> "str | Affine":
    """The normal form of `sum(c * index) + offset`: a plain name when it is one index, unscaled."""
    items = terms.items() if isinstance(terms, Mapping) else terms
    merged: dict[str, int] = {}
    for name, c in items:
        merged[name] = merged.get(name, 0) + int(c)
    kept = {n: c for n, c in merged.items() if c != 0}
    offset = sympy.expand(sympy.sympify(offset))
    if offset == 0 and len(kept) == 1 and next(iter(kept.values())) == 1:
        return next(iter(kept))
    return Affine(tuple(kept), tuple(kept.values()), offset)


def _is_node(s) -> bool:
    """A computed integer subscript that is not affine (a typed node: `table[j // S]`)."""
    return not isinstance(s, (str, Affine))


def _affine_only(s, what: str) -> None:
    if _is_node(s):
        raise TypeError(f"{what} of a subscript that is not affine ({type(s).__name__}): see symattn.ir.integers")


def terms(s) -> list[tuple[str, int]]:
    """(index, coefficient) of each index a subscript reads."""
    _affine_only(s, "terms")
    return [(s, 1)] if isinstance(s, str) else list(zip(s.indices, s.coefficients))


def offset(s) -> sympy.Expr:
    """The part of a subscript that reads no index (0 for a plain name)."""
    _affine_only(s, "offset")
    return sympy.Integer(0) if isinstance(s, str) else s.offset



def names(s) -> tuple[str, ...]:
    """The index names a subscript reads."""
    _affine_only(s, "names")
    return (s,) if isinstance(s, str) else s.indices


def renamed(s, mapping: Mapping[str, str]):
    """The subscript with its index names replaced through `mapping` (index -> index)."""
    _affine_only(s, "renamed")
    if isinstance(s, str):
        return mapping.get(s, s)
    return affine([(mapping.get(n, n), c) for n, c in terms(s)], s.offset)


def substituted(s, mapping: Mapping[str, "str | Affine"]):
    """The subscript with indices replaced by subscripts (index -> name or Affine)."""
    _affine_only(s, "substituted")
    read: list[tuple[str, int]] = []
    shift = offset(s)
    for name, c in terms(s):
        if name in mapping:
            new = mapping[name]
            read += [(n, c * k) for n, k in terms(new)]
            shift = shift + c * offset(new)
        else:
            read.append((name, c))
    return affine(read, shift)


def value(s, values: Mapping[str, object], offset_value=None):
    """The subscript computed from index values (ints or integer arrays that broadcast);
    `offset_value` is the offset at concrete sizes (needed when the offset reads dims)."""
    _affine_only(s, "value")
    if isinstance(s, str):
        return values[s]
    total = offset_value if offset_value is not None else int(s.offset)
    for name, c in terms(s):
        total = total + c * values[name]
    return total


def as_sympy(s, symbols: Mapping[str, sympy.Expr]) -> sympy.Expr:
    """The subscript as a SymPy expression, indices replaced through `symbols`."""
    _affine_only(s, "as_sympy")
    return sympy.Add(offset(s), *[c * symbols[n] for n, c in terms(s)])


@dataclass(frozen=True)
class Piece:
    """One signed term of a subscript: `coefficient * index` (a positive integer times an index
    name) or, with `index` None, `dims`, a positive term of the offset (`N`, `2 * h`, `1`)."""

    negative: bool
    coefficient: int = 1
    index: str | None = None
    dims: sympy.Expr | None = None


def pieces(s) -> list[Piece]:
    """The signed terms of a subscript in printing order: its indices, then the offset's terms
    (dims before numbers); empty for the subscript 0."""
    out = [Piece(c < 0, abs(c), name) for name, c in terms(s)]
    for term in sorted(sympy.Add.make_args(sympy.expand(offset(s))), key=lambda x: (x.is_Number, str(x))):
        if term != 0:
            coeff, rest = term.as_coeff_Mul()
            out.append(Piece(coeff < 0, dims=abs(coeff) * rest))
    return out


def text(s, order: Sequence[str] = ()) -> str:
    """Spec text: `j - i + N - 1`, `2 * c + 1`, `-i + N - 1`."""
    if isinstance(s, str):
        return s
    _affine_only(s, "text")
    parts = [(p.negative, format_dim(p.dims, order) if p.index is None else
              p.index if p.coefficient == 1 else f"{p.coefficient} * {p.index}") for p in pieces(s)]
    return signed_sum(parts) or "0"


def signed_sum(parts: Sequence[tuple[bool, str]]) -> str:
    """`a - b + c` from (negative, text) pairs; '' for none."""
    if not parts:
        return ""
    out = ("-" if parts[0][0] else "") + parts[0][1]
    for negative, magnitude in parts[1:]:
        out += f" {'-' if negative else '+'} {magnitude}"
    return out


def extremes(s, ranges: Mapping[str, sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
    """(least, greatest) value of the subscript with each index k in 0 .. ranges[k] - 1."""
    return box_extremes(terms(s), offset(s), ranges)


def box_extremes(pairs, start, ranges: Mapping[str, sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
    """(least, greatest) of start + sum(c * k) over the (name k, coefficient c) pairs, each k in
    0 .. ranges[k] - 1."""
    low = high = start
    for name, c in pairs:
        top = c * (ranges[name] - 1)
        if c < 0:
            low = low + top
        else:
            high = high + top
    return sympy.expand(low), sympy.expand(high)


def corner(s, ranges: Mapping[str, sympy.Expr], least: bool) -> dict[str, sympy.Expr]:
    """The index values at which the subscript takes its least (or greatest) value."""
    return {name: (ranges[name] - 1 if (c < 0) == least else sympy.Integer(0)) for name, c in terms(s)}


@dataclass(frozen=True)
class SizeDecision:
    """Whether a dim expression is >= 0 at every size: True, False (then `sizes` is a counterexample,
    dim name -> size, and `value` the expression there) or None (not decided)."""

    holds: bool | None
    sizes: dict[str, int] | None = None
    value: sympy.Expr | None = None


_SEARCH_SIZES = range(1, 9)
_SEARCH_LIMIT = 4096


def _least(symbol: sympy.Symbol) -> int:
    """The least size of a dim: 1, or 0 for a dim used only as a number (its symbol is nonnegative)."""
    return 1 if symbol.is_positive else 0


def _coefficients_nonnegative(poly_expr: sympy.Expr, symbols) -> bool:
    shifted = sympy.expand(poly_expr.xreplace({s: s + _least(s) for s in symbols}))
    if not symbols:
        return shifted.is_number and shifted >= 0
    try:
        poly = sympy.Poly(shifted, *symbols)
    except sympy.PolynomialError:
        return False
    return all(c.is_number and c >= 0 for c in poly.coeffs())


def nonnegative(expr: sympy.Expr) -> SizeDecision:
    """Decide `expr >= 0` for every positive integer value of the dims it reads (see the module docstring)."""
    expr = sympy.sympify(expr)
    symbols = sorted(expr.free_symbols, key=str)
    if not symbols:
        return SizeDecision(bool(expr >= 0), None if expr >= 0 else {}, expr)
    num, den = sympy.fraction(sympy.together(expr))
    den_positive = _coefficients_nonnegative(den, symbols) and sympy.expand(den).xreplace(
        {s: _least(s) for s in symbols}) > 0
    if den_positive and _coefficients_nonnegative(num, symbols):
        return SizeDecision(True)
    tries = 0
    for combo in itertools.product(range(0, _SEARCH_SIZES.stop), repeat=len(symbols)):
        if any(v < _least(s) for s, v in zip(symbols, combo)):
            continue
        tries += 1
        if tries > _SEARCH_LIMIT:
            break
        at = expr.xreplace({s: sympy.Integer(v) for s, v in zip(symbols, combo)})
        if at.is_number and at.is_finite and at < 0:
            return SizeDecision(False, {s.name: v for s, v in zip(symbols, combo)}, at)
    return SizeDecision(None)
