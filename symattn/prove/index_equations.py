"""Index equations: the rules for `Equation` factors, which computed subscripts bring.

Contract: `equation_rule(factors, sums, rng)` applies one rule to a term's
factors and contracted `sums` (token -> range; `rng(token)` is the range of
any token, None when unknown) and returns the new `(factors, sums)`, False
when the term is zero (it selects nothing), or None when no rule applies;
`equation_text(factor, name)` is the canonical text of an `Equation` with its
tokens named by `name`, the same whatever their order.

A gather `b[j - i + N - 1]` is `sum over m of [m - j + i - N + 1 == 0] b[m]`,
a scatter `grad(b)[k]` is `sum over (i, j) of [k - j + i - N + 1 == 0]
grad(B)[i, j]` (`symattn.prove.index_forms`). An equation selects: it is 1 at
the points that satisfy it and 0 elsewhere, with no arithmetic on the entries
it selects, so every rule holds for infinite and NaN entries too. Every token
ranges over 0 .. range - 1, every offset must be an integer polynomial in
the dims (an equation with another offset is left as it is), and every
decision about sizes is made for all sizes by `symattn.ir.affine.nonnegative`:

- normal form: ZERO_INDEX (the value 0) is dropped, a repeated token merged;
  `[a - b == 0]` is the Kronecker delta `[a == b]`, which the delta rule
  eliminates where it can.
- divisibility: with g > 1 dividing every coefficient, `[2 * c + p - 1 == 0]`
  at p = 0 has no integer solution (g does not divide the offset's constant
  part while it divides the rest of it): the term is zero; where g divides
  the whole offset, the equation is divided by g.
- a constant equation: `[0 == 0]` is dropped; `[c == 0]` with c >= 1 or
  c <= -1 at every size makes the term zero.
- the box: with e the equation's left side, its least and greatest values
  over the ranges of its tokens (at the corners) decide it: least >= 1 or
  greatest <= -1 at every size makes the term zero; least == 0 identically
  (or greatest == 0) means e == 0 only at that corner, each token at 0 or at
  its range - 1: `[j - i + N - 1 == 0]` is `[i == N - 1][j == 0]`, pins.
- elimination: a contracted token t with coefficient +-1 that no factor other
  than equations reads is solved for, `t = v(rest)`, substituted into the
  other equations, and its sum dropped, when v stays in t's range at every
  point of the box of the rest: then exactly one t satisfies the equation
  (`sum over k of grad(b)[k]` becomes `sum over (i, j) of grad(B)[i, j]`).
- a pin `[t == v]` is substituted into the other equations that read t; a pin
  no other equation reads is `Embed(v)` over `(t, ZERO_INDEX)`, the form a
  slice `X[v:v + 1]` has, so `grad(b)[0:1]` and `grad(S)[N - 1:N, 0:1]` meet.
- an `Embed` (`[m == c + offset]`, slices and concat) or a `Mix` of an
  integer block (`[m == a * k + b]`, merge_heads and split_heads) that shares
  a token with an equation becomes an equation, so the rules above see it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import sympy

from ..ir.affine import box_extremes, nonnegative
from .index_factors import ZERO_INDEX, Delta, Embed, Equation, Factor, Mix

__all__ = ["equation_rule", "equation_text"]


@dataclass(frozen=True)
class _Linear:
    """An equation's left side in normal form: token -> nonzero coefficient, and the offset."""

    terms: dict[str, int]
    offset: sympy.Expr

    def factor(self) -> Equation:
        return Equation(tuple(self.terms.values()), self.offset, tuple(self.terms))


def _linear(f: Equation) -> _Linear:
    terms: dict[str, int] = {}
    for token, c in zip(f.indices, f.coefficients):
        if token != ZERO_INDEX:
            terms[token] = terms.get(token, 0) + c
    return _Linear({x: c for x, c in terms.items() if c != 0}, sympy.expand(f.offset))


def _integral(expr) -> bool:
    """Whether expr is an integer polynomial in the dims, so an integer at every size (the rules
    count on it: an offset such as N / 2 has no integer solution at odd N)."""
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return True
    symbols = sorted(expr.free_symbols, key=str)
    if not symbols:
        return False
    try:
        poly = sympy.Poly(expr, *symbols)
    except sympy.PolynomialError:
        return False
    return all(c.is_Integer for c in poly.coeffs())


def _holds(expr) -> bool:
    """expr >= 0 at every size (a proof, not a search)."""
    return nonnegative(sympy.expand(expr)).holds is True


def _substitute(lin: _Linear, token: str, terms: dict[str, int], offset) -> _Linear:
    """`lin` with `token` replaced by sum(terms) + offset."""
    c = lin.terms.get(token, 0)
    out = {x: k for x, k in lin.terms.items() if x != token}
    for x, k in terms.items():
        out[x] = out.get(x, 0) + c * k
    return _Linear({x: k for x, k in out.items() if k != 0}, sympy.expand(lin.offset + c * offset))


def _replaced(factors: list[Factor], n: int, new: list[Factor]) -> list[Factor]:
    return factors[:n] + new + factors[n + 1:]


def equation_rule(factors: list[Factor], sums: dict, rng: Callable[[str], sympy.Expr | None]):
    """One rule of the module docstring applied: (factors, sums), False (the term is zero) or None."""
    equations = [n for n, f in enumerate(factors) if isinstance(f, Equation)]
    if not equations:
        return None
    read = {x for n in equations for x in factors[n].indices} - {ZERO_INDEX}
    for n, f in enumerate(factors):
        if isinstance(f, Embed) and read & set(f.indices) and _integral(f.offset):
            m, c = f.indices
            return _replaced(factors, n, [Equation((1, -1), -f.offset, (m, c))]), sums
        if isinstance(f, Mix) and read & set(f.indices) and sympy.sympify(f.block).is_Integer:
            m, a, b = f.indices
            return _replaced(factors, n, [Equation((1, -int(f.block), -1), sympy.Integer(0), (m, a, b))]), sums
    for n in equations:
        step = _one_equation(factors, n, sums, rng)
        if step is not None:
            return step
    return _pins(factors, equations, sums)


def _one_equation(factors, n, sums, rng):
    f = factors[n]
    lin = _linear(f)
    if not _integral(lin.offset):
        return None
    if lin.factor() != f:
        return _replaced(factors, n, [lin.factor()]), sums
    if not lin.terms:
        if lin.offset == 0:
            return _replaced(factors, n, []), sums
        if _holds(lin.offset - 1) or _holds(-lin.offset - 1):
            return False
        return None
    divided = _divided(lin)
    if divided is False:
        return False
    if divided is not None:
        return _replaced(factors, n, [divided.factor()]), sums
    if len(lin.terms) == 2 and sorted(lin.terms.values()) == [-1, 1] and lin.offset == 0:
        return _replaced(factors, n, [Delta(tuple(lin.terms))]), sums
    box = {x: rng(x) for x in lin.terms}
    if any(r is None for r in box.values()):
        return None
    low, high = box_extremes(lin.terms.items(), lin.offset, box)
    if _holds(low - 1) or _holds(-high - 1):
        return False  # no point of the box satisfies it
    for extreme, least in ((low, True), (high, False)):
        if extreme == 0:
            # e - least is a sum of nonnegative parts, one per token: each is 0 only at its end
            pins = [Equation((1,), sympy.expand(1 - box[x]) if (c < 0) == least else sympy.Integer(0), (x,))
                    for x, c in lin.terms.items()]
            if [_linear(p) for p in pins] != [lin]:
                return _replaced(factors, n, pins), sums
    others = [g for k, g in enumerate(factors) if k != n]
    for token, c in lin.terms.items():
        if abs(c) != 1 or token not in sums:
            continue
        if any(token in g.indices for g in others if not isinstance(g, Equation)):
            continue
        # token = sum(-c * k * x) - c * offset over the other tokens
        terms = {x: -c * k for x, k in lin.terms.items() if x != token}
        offset = sympy.expand(-c * lin.offset)
        v_low, v_high = box_extremes(terms.items(), offset, box)
        if not (_holds(v_low) and _holds(sums[token] - 1 - v_high)):
            continue
        rest = [_substitute(_linear(g), token, terms, offset).factor() if isinstance(g, Equation) and token in g.indices
                else g for g in others]
        return rest, {x: r for x, r in sums.items() if x != token}
    return None


def _divided(lin: _Linear):
    """With g > 1 the gcd of the coefficients: the equation divided by g when g divides the offset
    (at every size: each coefficient of the offset's polynomial), False when the offset is g * (an
    integer polynomial) plus a remainder g does not divide (no integer solution), else None."""
    g = math.gcd(*lin.terms.values())
    if g <= 1:
        return None
    symbols = sorted(lin.offset.free_symbols, key=str)
    poly = sympy.Poly(lin.offset, *symbols) if symbols else None
    constant = lin.offset if poly is None else poly.coeff_monomial(1)
    others = [] if poly is None else [c for m, c in poly.terms() if any(m)]
    if any(c % g for c in others):
        return None
    if constant % g:
        return False
    return _Linear({x: c // g for x, c in lin.terms.items()}, sympy.expand(lin.offset / g))


def _pins(factors, equations, sums):
    """A pin [t == v] substituted into another equation, or made an Embed when no other reads t."""
    for n in equations:
        lin = _linear(factors[n])
        if len(lin.terms) != 1 or not _integral(lin.offset):
            continue
        (token, c), = lin.terms.items()
        if abs(c) != 1:
            continue
        value = sympy.expand(-c * lin.offset)
        readers = [k for k in equations if k != n and token in factors[k].indices]
        if readers:
            out = list(factors)
            for k in readers:
                out[k] = _substitute(_linear(factors[k]), token, {}, value).factor()
            return out, sums
        return _replaced(factors, n, [Embed(value, (token, ZERO_INDEX))]), sums
    return None


def equation_text(f: Equation, name: Callable[[str], str]) -> str:
    """`$eq[b0 - b1 + p0 + N - 1]`: the tokens by name, the sign fixed by the first, then the offset."""
    terms: dict[str, int] = {}
    for token, c in zip(f.indices, f.coefficients):
        if token != ZERO_INDEX:
            terms[name(token)] = terms.get(name(token), 0) + c
    ordered = sorted((x, c) for x, c in terms.items() if c != 0)
    offset = sympy.expand(f.offset)
    if (ordered and ordered[0][1] < 0) or (not ordered and offset.could_extract_minus_sign()):
        ordered = [(x, -c) for x, c in ordered]
        offset = -offset
    parts = [f"{c}*{x}" for x, c in ordered] + ([str(offset)] if offset != 0 or not ordered else [])
    return f"$eq[{' + '.join(parts)}]"
