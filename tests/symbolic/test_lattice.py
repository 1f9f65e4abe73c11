"""`symbolic.lattice`: sympy.Max / sympy.Min of a line, the same object SymPy's own evaluation builds.

The reference is SymPy's evaluated constructor itself, `fn(*values)` (an
independent implementation of the same contract: it compares every pair).
Lines where SymPy removes an argument (a pair it can order) must come back
exactly as SymPy builds them; lines of pairwise unordered entries take the
fast path, which is checked to be taken.
"""

from __future__ import annotations

import pytest
import sympy
from sympy.functions.elementary.miscellaneous import MinMaxBase

from symattn.symbolic.lattice import lattice

a, b, c, d = sympy.symbols("a b c d", real=True)
p = sympy.Symbol("p", positive=True)

# lines SymPy simplifies (an argument ordered against another), or that hold numbers, infinities,
# nested Max/Min, duplicates or symbols with other assumptions: the slow path, SymPy's own answer
ORDERED = [
    [a, a + 1], [a, a - 1, b], [a ** 2, -b ** 2 - 1], [a, b, 2], [a, -sympy.oo, b], [a, sympy.oo],
    [a, sympy.Max(b, c)], [a, sympy.Min(a, b)], [a, a], [p, -p], [sympy.exp(a), 0], [a * b, a * b + c ** 2],
    [sympy.sqrt(2) * a, sympy.sqrt(2) * a + sympy.Rational(1, 10 ** 12)], [a + b, b + a, a],
]
# lines whose pairs take both signs: the fast path
UNORDERED = [
    [a, b, c], [a * b, c * d, a + d], [sympy.exp(a), sympy.exp(b)], [a ** 2, b ** 2],
    [sympy.sqrt(2) * (a * b + c * d) / 2, sympy.sqrt(2) * (a * c + b * d) / 2, sympy.sqrt(2) * (a * d + b * c) / 2],
    [a, b, a],
]


def _same(x, y):
    return x == y and type(x) is type(y) and x.args == y.args


@pytest.mark.parametrize("fn", [sympy.Max, sympy.Min])
@pytest.mark.parametrize("values", ORDERED + UNORDERED, ids=lambda v: str(v)[:40])
def test_lattice_is_sympys_evaluated_max_or_min(fn, values):
    assert _same(lattice(fn, values), fn(*values))


@pytest.mark.parametrize("fn", [sympy.Max, sympy.Min])
@pytest.mark.parametrize("values", UNORDERED, ids=lambda v: str(v)[:40])
def test_unordered_lines_skip_the_pairwise_comparisons(fn, values, monkeypatch):
    want = fn(*values)
    sympy.core.cache.clear_cache()

    def refuse(*args, **kwargs):
        raise AssertionError("SymPy's pairwise comparison ran on a line the fast path should take")

    monkeypatch.setattr(MinMaxBase, "_find_localzeros", classmethod(refuse))
    assert _same(lattice(fn, values), want)


@pytest.mark.parametrize("fn", [sympy.Max, sympy.Min])
def test_a_pair_sympy_orders_is_never_taken_for_unordered(fn):
    """a and a + 1e-12 * sqrt(2) differ by a constant: ordered; the margin must not call it unordered."""
    values = [a, a + sympy.sqrt(2) / 10 ** 12, b]
    assert _same(lattice(fn, values), fn(*values))
    assert len(fn(*values).args) == 2
