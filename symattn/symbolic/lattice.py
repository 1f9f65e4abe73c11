"""sympy.Max and sympy.Min of a line of entries, without SymPy's pairwise comparisons where they cannot succeed.

Contract: `lattice(fn, values)` is `fn(*values)` for fn in (sympy.Max,
sympy.Min), the very same object SymPy's evaluation builds. SymPy's
evaluation compares every pair of arguments (`MinMaxBase._find_localzeros`:
`x >= y`, `x <= y`, then again after `factor_terms(x - y)`: assumption
queries on symbolic expressions, the costly part of a max over symbolic
entries) and removes an argument only when one pair is decided. A pair whose difference takes both signs on the
symbols' domain cannot be decided by any sound reasoning, so where every
pair of distinct values is seen to take both signs at random real points
(the symbols plain real ones, the values real and finite there in 30-digit
mpmath, each sign by a margin far above that rounding), no argument would be
removed, and the result is built directly: `fn(*values, evaluate=False)`
keeps the same frozenset of arguments in the same canonical order.
Otherwise (numbers, infinities, nested Max or Min, symbols with other
assumptions, a pair not seen to change sign) SymPy evaluates as usual.
"""

from __future__ import annotations

import random
from typing import Sequence

import mpmath
import sympy

from .exact import mp_value

__all__ = ["lattice"]

_POINTS = 12          # random points at which every value is evaluated
_MARGIN = 1e-6        # a sign counts when |x - y| exceeds this times (|x| + |y| + 1)
_PLAIN = sympy.Symbol("plain", real=True).assumptions0


def lattice(fn, values: Sequence[sympy.Expr]) -> sympy.Expr:
    """fn(*values), fn sympy.Max or sympy.Min (see the module docstring)."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) > 1 and _undecidable_pairs(distinct):
        return fn(*values, evaluate=False)
    return fn(*values)


def _undecidable_pairs(values: list) -> bool:
    """Whether every pair of `values` is seen to differ in both directions at random real points."""
    for v in values:
        if not isinstance(v, sympy.Expr) or v.is_number or isinstance(v, (sympy.Max, sympy.Min)):
            return False
    symbols = sorted(set().union(*(v.free_symbols for v in values)), key=sympy.default_sort_key)
    if any(not isinstance(s, sympy.Symbol) or s.assumptions0 != _PLAIN for s in symbols):
        return False
    rng = random.Random(len(symbols) * 7919 + len(values))
    table = []
    with mpmath.workdps(30):
        for _ in range(_POINTS):
            subs = {s: mpmath.mpf(rng.gauss(0.0, 1.0)) for s in symbols}
            memo: dict = {}  # the values share subtrees (one query's projections): each evaluated once
            row = []
            for v in values:
                x = mp_value(v, subs, memo)
                if not isinstance(x, mpmath.mpf) or not mpmath.isfinite(x):
                    return False
                row.append(float(x))
            table.append(row)
    for a in range(len(values)):
        for b in range(a + 1, len(values)):
            above = below = False
            for row in table:
                x, y = row[a], row[b]
                margin = _MARGIN * (abs(x) + abs(y) + 1.0)
                above = above or x - y > margin
                below = below or y - x > margin
            if not (above and below):
                return False
    return True
