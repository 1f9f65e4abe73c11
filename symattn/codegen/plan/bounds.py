"""Which blocks of a core's scores are fully masked, read off its mask: loop bounds for every target.

Contract: `tile_bounds(core)` reads the conditions of `core.keep` (the
comparisons it joins with `&`) and keeps those that are linear in the query
row i and key j with a unit coefficient on the bounded coordinate and integer
otherwise (`j <= i`, `i - j < w`, `j <= i + M - N`). It returns a `Bounds`:
SymPy expressions over a query block's first and last row (`I0`, `I1`) for
the keys that block must visit, and over a key block's first and last key
(`J0`, `J1`) for the queries it must visit, each as lower bounds (inclusive)
and upper bounds (exclusive); a dim d is the symbol `D_d`. Skipping the
blocks outside them is exact: every entry there is -inf, weight 0.
Conditions it cannot read (a padding buffer, `%`) give no bound: those blocks
are visited and masked entry by entry.

It also gives, over I0 and I1, the keys that every row of a query block sees
at every bounding condition (`key_in_lo`, `key_in_hi`: the opposite corner of
each bound), and `rest`, the conditions of `keep` that are not bounding ones
(None: none): on a block inside that range the score is where(rest, value,
-inf), with no test of the bounding conditions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ...ir import typed as t
from .core import KEY, ROW, AttentionCore
from .entry import conditions, conjunction, integer

__all__ = ["Bounds", "tile_bounds", "I", "J", "I0", "I1", "J0", "J1"]

I, J = sympy.Symbol("i", integer=True), sympy.Symbol("j", integer=True)
I0, I1 = sympy.Symbol("I0_", integer=True), sympy.Symbol("I1_", integer=True)
J0, J1 = sympy.Symbol("J0_", integer=True), sympy.Symbol("J1_", integer=True)

# Compare op -> E(a, b) with the condition equivalent to E <= 0 over the integers
_AS_LE = {
    "<=": lambda a, b: a - b,
    "<": lambda a, b: a - b + 1,
    ">=": lambda a, b: b - a,
    ">": lambda a, b: b - a + 1,
}


@dataclass
class Bounds:
    """Loop bounds (lower bounds combine by max, upper bounds by min)."""

    key_lo: list[sympy.Expr] = field(default_factory=list)    # over I0, I1
    key_hi: list[sympy.Expr] = field(default_factory=list)
    query_lo: list[sympy.Expr] = field(default_factory=list)  # over J0, J1
    query_hi: list[sympy.Expr] = field(default_factory=list)
    key_in_lo: list[sympy.Expr] = field(default_factory=list)  # over I0, I1: keys every row of the block sees
    key_in_hi: list[sympy.Expr] = field(default_factory=list)
    rest: t.Node | None = None  # the conditions of keep that bound no keys

    @property
    def bounded(self) -> bool:
        return bool(self.key_lo or self.key_hi)


def _as_le(cond: t.Node) -> sympy.Expr | None:
    """A comparison of integer coordinate arithmetic as E, with the condition E <= 0; else None."""
    if not isinstance(cond, t.Compare) or cond.op not in _AS_LE:
        return None
    symbols = {ROW: I, KEY: J}
    a, b = integer(cond.a, symbols), integer(cond.b, symbols)
    if a is None or b is None:
        return None
    return sympy.expand(_AS_LE[cond.op](a, b))


def tile_bounds(core: AttentionCore) -> Bounds:
    bounds = Bounds()
    rest = []
    for cond in conditions(core.keep):
        expr = _as_le(cond)
        bounding = False
        if expr is not None and expr.free_symbols & {I, J} and expr.is_polynomial(I, J):
            a, b = expr.coeff(I), expr.coeff(J)
            remainder = expr - a * I - b * J
            if not ({I, J} & (a.free_symbols | b.free_symbols | remainder.free_symbols)) and a.is_Integer \
                    and b.is_Integer:
                # keys for a query block: b * j <= -(a * i + remainder)
                if b in (1, -1):
                    limit = -(a * I + remainder) * b          # j <= limit (b = 1) or j >= limit (b = -1)
                    at_max, at_min = (I1, I0) if -a * b >= 0 else (I0, I1)
                    if b == 1:
                        bounds.key_hi.append(limit.subs(I, at_max) + 1)
                        bounds.key_in_hi.append(limit.subs(I, at_min) + 1)
                    else:
                        bounds.key_lo.append(limit.subs(I, at_min))
                        bounds.key_in_lo.append(limit.subs(I, at_max))
                    bounding = True
                # queries for a key block: a * i <= -(b * j + remainder)
                if a in (1, -1):
                    limit = -(b * J + remainder) * a
                    at_max, at_min = (J1, J0) if -b * a >= 0 else (J0, J1)
                    if a == 1:
                        bounds.query_hi.append(limit.subs(J, at_max) + 1)
                    else:
                        bounds.query_lo.append(limit.subs(J, at_min))
        if not bounding:
            rest.append(cond)
    bounds.rest = conjunction(*rest)
    return bounds
