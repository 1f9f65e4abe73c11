"""A fast, exact sufficient test that an expression is identically zero.

Contract: `expands_to_zero(expr)` is True only if `expr` is zero as a rational
function of its symbols: it maps the expression into a sparse polynomial ring
over the rationals (SymPy's `PolyRing`, dict-based and much faster than
`sympy.expand` on large sums) and checks that the image is the zero
polynomial. The map is a ring homomorphism, so a zero image means a zero
value wherever the expression is defined:

- each symbol is a generator, a symbol under a fractional power `x**(p/q)`
  is a power of one generator standing for `x**(1/L)` (L the lcm of the
  denominators seen for x), so `sqrt(x)**2` is `x` exactly;
- each base under a negative integer power (a softmax denominator `1/(a+b)`)
  is an independent generator standing for its inverse;
- a root of a positive integer (`sqrt(2)`) is a generator r reduced by
  `r**L = b` at the end, which is true arithmetic.

False means "not shown", never "nonzero": a base and its inverse are not
cancelled, so a caller falls back to a complete test (as `exact.zero_test`
does). Anything outside these cases (floats, I, pi, functions, Piecewise) is
not handled and gives False.
"""

from __future__ import annotations

import math

import sympy
from sympy import QQ
from sympy.polys.rings import PolyRing

__all__ = ["expands_to_zero"]


class _Unhandled(Exception):
    """A node outside the polynomial map; the caller uses its complete test instead."""


def _scan(expr: sympy.Expr) -> tuple[list, dict, list]:
    """(symbols in first-seen order, {radical base: lcm of exponent denominators}, inverted bases)."""
    symbols: list = []
    roots: dict = {}
    inverses: list = []
    seen: set = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.is_Symbol:
            symbols.append(node)
        elif node.is_Pow and node.exp.is_Rational and not node.exp.is_Integer:
            base = node.base
            if not (base.is_Symbol or (base.is_Integer and base.is_positive and node.exp.is_positive)):
                raise _Unhandled(node)
            roots[base] = math.lcm(roots.get(base, 1), int(node.exp.q))
        elif node.is_Pow and node.exp.is_Integer and node.exp.is_negative and node.base not in inverses:
            inverses.append(node.base)
        stack.extend(node.args)
    return symbols, roots, inverses


def expands_to_zero(expr: sympy.Expr) -> bool:
    """True if `expr` is shown to be identically zero (see the module docstring); False if not shown."""
    expr = sympy.sympify(expr)
    try:
        symbols, roots, inverses = _scan(expr)
    except _Unhandled:
        return False
    numbers = [b for b in roots if b.is_Integer]
    negative_roots = [s for s in symbols if s in roots]  # x**(-p/q) needs the inverse of x**(1/L)
    names = max(1, len(symbols) + len(numbers) + len(inverses) + len(negative_roots))
    ring = PolyRing([f"g{k}" for k in range(names)], QQ)
    gens = iter(ring.gens)
    of_symbol = {s: next(gens) for s in symbols}
    of_number = {b: next(gens) for b in numbers}
    of_inverse = {b: next(gens) for b in inverses}
    of_inverse_root = {s: next(gens) for s in negative_roots}
    memo: dict = {}

    def walk(node):
        value = memo.get(node)
        if value is not None:
            return value
        if node.is_Symbol:
            value = of_symbol[node] ** roots.get(node, 1)
        elif node.is_Rational:
            value = ring(QQ(int(node.p), int(node.q)))
        elif node.is_Add:
            value = ring.zero
            for arg in node.args:
                value += walk(arg)
        elif node.is_Mul:
            value = ring.one
            for arg in node.args:
                value *= walk(arg)
        elif node.is_Pow and node.exp.is_Integer:
            n = int(node.exp)
            value = walk(node.base) ** n if n >= 0 else of_inverse[node.base] ** (-n)
        elif node.is_Pow and node.exp.is_Rational:
            p, q = int(node.exp.p), int(node.exp.q)
            base = node.base
            step = roots[base] // q  # x**(p/q) = (x**(1/L))**(p*L/q)
            if base.is_Integer:
                value = of_number[base] ** (step * p)
            elif p > 0:
                value = of_symbol[base] ** (step * p)
            else:
                value = of_inverse_root[base] ** (step * -p)
        else:
            raise _Unhandled(node)
        memo[node] = value
        return value

    try:
        image = walk(expr)
    except _Unhandled:
        return False
    for base, root in of_number.items():  # r**L = b: reduce every power of r below L
        index = ring.gens.index(root)
        period = roots[base]
        reduced: dict = {}
        for monom, coeff in image.items():
            e = monom[index]
            key = monom[:index] + (e % period,) + monom[index + 1:]
            reduced[key] = reduced.get(key, QQ(0)) + coeff * QQ(int(base)) ** (e // period)
        image = ring({m: c for m, c in reduced.items() if c})
    return not image
