"""A fast, exact sufficient test that an expression is identically zero.

Contract: `expands_to_zero(expr)` is True only if `expr` is zero as a rational
function of its symbols: it maps the expression into a sparse polynomial ring
over the rationals and checks that the image is the zero polynomial. The map
is a ring homomorphism, so a zero image means a zero value wherever the
expression is defined:

- each symbol is a generator, a symbol under a fractional power `x**(p/q)`
  is a power of one generator standing for `x**(1/L)` (L the lcm of the
  denominators seen for x), so `sqrt(x)**2` is `x` exactly;
- each base under a negative integer power (a softmax denominator `1/(a+b)`)
  is an independent generator standing for its inverse;
- a root of a positive integer (`sqrt(2)`) is a generator r reduced by
  `r**L = b` at the end, which is true arithmetic;
- with `atoms=True`, a function application is a generator too, and
  exp(c * u) for rational c is the power c of exp(u)'s generator (exp(u) > 0,
  so its roots are real), a negative c through an inverse generator.

False means "not shown", never "nonzero": a base and its inverse are not
cancelled, so a caller falls back to a complete test (as `exact.zero_test`
does). Anything outside these cases (floats, I, pi, Piecewise, and functions
outside atom mode) is not handled and gives False.

The ring is written out here rather than taken from SymPy's `PolyRing`, whose
monomials are tuples as long as the number of generators: after unfolding two
softmax maps an entry reads about a thousand generators (one per exp atom of
each score term), and every product of two terms added two such tuples
element by element. Here a monomial is one Python integer holding every
exponent in a field of `width` bits (Kronecker's packing: generator k's
exponent is bits [k * width, (k + 1) * width)), so the product of two
monomials is one integer addition. `width` comes from a bound on every
exponent that any subexpression's image can hold (`_degree`), so a field never
carries into the next and the packing is exact. A polynomial is a dict from
monomial to integer coefficient over one positive integer denominator
(`_Poly`), so coefficients are multiplied and added as integers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import sympy

__all__ = ["expands_to_zero"]


class _Unhandled(Exception):
    """A node outside the polynomial map; the caller uses its complete test instead."""


@dataclass(slots=True)
class _Poly:
    """sum(coeff * monomial) / den: packed monomials (see the module docstring), integer
    coefficients, none of them zero, and a positive integer denominator."""

    terms: dict[int, int]
    den: int = 1


@dataclass(frozen=True, slots=True)
class _ExpOf:
    """The generator key of exp(u) in atom mode: never equal to a symbol or expression key."""

    argument: sympy.Expr
    is_Integer = False


@functools.lru_cache(maxsize=16384)
def _exp_power(node: sympy.Expr) -> tuple[_ExpOf, sympy.Rational]:
    """exp(c * u) as (exp(u)'s key, c): c the rational content of the argument's top level (the
    gcd of a sum's coefficients, a product's coefficient), u the rest with the sign a minus can
    be taken out of moved into c, so that exp(2u), exp(-u) and exp(u) are powers of one generator."""
    argument = node.args[0]
    content, primitive = argument.primitive() if argument.is_Add else argument.as_coeff_Mul(rational=True)
    if primitive.could_extract_minus_sign():
        content, primitive = -content, -primitive
    return _ExpOf(primitive), sympy.Rational(content)


def _is_atom(node: sympy.Expr) -> bool:
    """A function application, one generator of its own in atom mode (see `expands_to_zero`)."""
    return isinstance(node, sympy.core.function.Application) and not node.is_Piecewise


def _scan(expr: sympy.Expr, atoms: bool = False) -> tuple[list, dict, list]:
    """(symbols in first-seen order, {radical base: lcm of exponent denominators}, inverted bases).
    In atom mode a function application is a symbol, and exp(c * u) the power c of the symbol u
    (`_exp_power`), whose arguments are not read."""
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
        if atoms and node.func is sympy.exp:
            base, power = _exp_power(node)
            if base not in seen:
                seen.add(base)
                symbols.append(base)
            roots[base] = math.lcm(roots.get(base, 1), int(power.q))
            continue
        if node.is_Symbol or (atoms and _is_atom(node)):
            symbols.append(node)
            continue
        if node.is_Pow and node.exp.is_Rational and not node.exp.is_Integer:
            base = node.base
            if not (base.is_Symbol or (base.is_Integer and base.is_positive and node.exp.is_positive)):
                raise _Unhandled(node)
            roots[base] = math.lcm(roots.get(base, 1), int(node.exp.q))
        elif node.is_Pow and node.exp.is_Integer and node.exp.is_negative and node.base not in inverses:
            inverses.append(node.base)
        stack.extend(node.args)
    return symbols, roots, inverses


def _add(polys: list[_Poly]) -> _Poly:
    den = math.lcm(*(p.den for p in polys))
    terms: dict[int, int] = {}
    get = terms.get
    for p in polys:
        scale = den // p.den
        for monom, coeff in p.terms.items():
            terms[monom] = get(monom, 0) + coeff * scale
    return _Poly({m: c for m, c in terms.items() if c}, den)


def _mul(a: _Poly, b: _Poly) -> _Poly:
    if len(a.terms) < len(b.terms):
        a, b = b, a
    if len(b.terms) == 1:  # a monomial times a polynomial: no two products meet
        (monom, coeff), = b.terms.items()
        return _Poly({m + monom: c * coeff for m, c in a.terms.items()}, a.den * b.den)
    terms: dict[int, int] = {}
    get = terms.get
    right = list(b.terms.items())
    for m1, c1 in a.terms.items():
        for m2, c2 in right:
            m = m1 + m2
            terms[m] = get(m, 0) + c1 * c2
    return _Poly({m: c for m, c in terms.items() if c}, a.den * b.den)


def _power(base: _Poly, n: int) -> _Poly:
    result = _Poly({0: 1})
    for _ in range(n):
        result = _mul(result, base)
    return result


def expands_to_zero(expr: sympy.Expr, atoms: bool = False) -> bool:
    """True if `expr` is shown to be identically zero (see the module docstring); False if not shown.

    With `atoms`, every function application is a generator of its own, so the test needs no
    atomized copy of the expression (`exact._atomize`): exp(c * u) for rational c is the power c
    of one generator standing for exp(u) > 0 (a negative or fractional c through the roots'
    generators), any other application f(u) one generator. Different applications that are
    equal in value (exp(a + b) and exp(a) exp(b)) are different generators, so such an
    identity is not shown; what is shown holds for every value of the generators, the true
    ones among them."""
    expr = sympy.sympify(expr)
    try:
        symbols, roots, inverses = _scan(expr, atoms)
    except _Unhandled:
        return False
    numbers = [b for b in roots if b.is_Integer]
    # x**(-p/q) needs the inverse of x**(1/L); so does exp(-c u)
    negative_roots = [s for s in symbols if s in roots]
    names = iter(range(len(symbols) + len(numbers) + len(inverses) + len(negative_roots)))
    of_symbol = {s: next(names) for s in symbols}
    of_number = {b: next(names) for b in numbers}
    of_inverse = {b: next(names) for b in inverses}
    of_inverse_root = {s: next(names) for s in negative_roots}

    def exponents(node) -> tuple[int, int] | None:
        """(generator, exponent) of a node that maps to one power of one generator, else None."""
        if atoms and node.func is sympy.exp:  # exp(u)**(p/q) = (exp(u)**(1/L))**(p*L/q)
            base, power = _exp_power(node)
            p, step = int(power.p), roots[base] // int(power.q)
            return (of_symbol[base], step * p) if p > 0 else (of_inverse_root[base], step * -p)
        if node.is_Symbol or (atoms and _is_atom(node)):
            return of_symbol[node], roots.get(node, 1)
        if node.is_Pow and node.exp.is_Integer and node.exp.is_negative:
            return of_inverse[node.base], -int(node.exp)
        if node.is_Pow and node.exp.is_Rational and not node.exp.is_Integer:
            p, q = int(node.exp.p), int(node.exp.q)
            base = node.base
            step = roots[base] // q  # x**(p/q) = (x**(1/L))**(p*L/q)
            if base.is_Integer:
                return of_number[base], step * p
            return (of_symbol[base], step * p) if p > 0 else (of_inverse_root[base], step * -p)
        return None

    degrees: dict = {}

    def degree(node) -> int:
        """A bound on every exponent of every monomial of the node's image."""
        found = degrees.get(node)
        if found is not None:
            return found
        power = exponents(node)
        if power is not None:
            found = power[1]
        elif node.is_Rational:
            found = 0
        elif node.is_Add:
            found = max(degree(arg) for arg in node.args)
        elif node.is_Mul:
            found = sum(degree(arg) for arg in node.args)
        elif node.is_Pow and node.exp.is_Integer:
            found = int(node.exp) * degree(node.base)
        else:
            raise _Unhandled(node)
        degrees[node] = found
        return found

    try:
        width = max(1, degree(expr).bit_length())
    except _Unhandled:
        return False
    memo: dict = {}

    def walk(node) -> _Poly:
        value = memo.get(node)
        if value is not None:
            return value
        power = exponents(node)
        if power is not None:
            value = _Poly({power[1] << (power[0] * width): 1})
        elif node.is_Rational:
            value = _Poly({0: int(node.p)} if node.p else {}, int(node.q))
        elif node.is_Add:
            value = _add([walk(arg) for arg in node.args])
        elif node.is_Mul:
            value = _Poly({0: 1})
            for arg in node.args:
                value = _mul(value, walk(arg))
        else:  # a non-negative integer power (degree() let nothing else through)
            value = _power(walk(node.base), int(node.exp))
        memo[node] = value
        return value

    image = walk(expr)
    mask = (1 << width) - 1
    for base, index in of_number.items():  # r**L = b: reduce every power of r below L
        period, shift = roots[base], index * width
        reduced: dict[int, int] = {}
        for monom, coeff in image.terms.items():
            e = (monom >> shift) & mask
            key = monom - ((e - e % period) << shift)
            reduced[key] = reduced.get(key, 0) + coeff * int(base) ** (e // period)
        image = _Poly({m: c for m, c in reduced.items() if c}, image.den)
    return not image.terms
