"""Algebraic and trigonometric atoms, and the relations the exact zero test reduces by.

Contract: an atom is a SymPy Dummy standing for a value the zero test cannot
expand, with one polynomial relation that holds wherever the atom is defined:

- `root_atom(radicand, degree)`: r > 0 with r**degree = radicand. Only a caller
  that has shown radicand > 0 where the atom is used may create it (the guarded
  evaluator of `symattn.symbolic.guarded` does, case by case); the relation is
  then true arithmetic: r is the float64 value of sqrt / the rational power;
- `angle_atoms(angle)`: (s, c) = (sin(angle), cos(angle)) with s**2 + c**2 = 1,
  true for every real angle; `angle_sum(angle)` is (sin(angle), cos(angle)) as
  polynomials in the atoms of its base angles (angle addition, n * x by repeated
  addition, a number p/q as p times 1/q with q sharing the other terms'
  denominators).

`relations(symbols)` lists the relations of the atoms among `symbols` (and the
atoms their radicands read), each as a `Relation` whose head is the atom of
highest rank in it. With the heads ordered first (outer roots, then sines, then
cosines) and every other variable after them, each relation's leading monomial
under lex order is a pure power of its head, and the heads are distinct, so the
leading monomials are pairwise coprime and the relations are a Groebner basis
(Buchberger's first criterion). `reduces_to_zero(poly, relations)` is then
ideal membership: True only if `poly` lies in the ideal, so that it is zero at
every point where the relations hold (sound; complete for the circle relations,
whose ideal is prime). `atom_values(symbols, draw)` gives a random point that
satisfies the relations, for the zero test's numeric pre-filter.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import mpmath
import sympy
from sympy.polys.polyerrors import BasePolynomialError

__all__ = ["radicals_as_roots", "Root", "Angle", "Relation", "root_atom", "angle_atoms", "angle_of", "angle_sum", "root_of", "relations", "reduces_to_zero",
           "atom_values"]


@dataclass(frozen=True)
class Root:
    """atom = radicand ** (1 / degree) > 0; `rank` orders nested roots (an outer one is created later)."""

    atom: sympy.Dummy
    radicand: sympy.Expr
    degree: int
    rank: int


@dataclass(frozen=True)
class Angle:
    """sine = sin(angle), cosine = cos(angle)."""

    angle: sympy.Expr
    sine: sympy.Dummy
    cosine: sympy.Dummy


@dataclass(frozen=True)
class Relation:
    """polynomial == 0 wherever the atoms are defined; `head` is its leading variable."""

    head: sympy.Dummy
    polynomial: sympy.Expr


# Registries shared by every call (the same radicand or angle is the same atom everywhere); they only
# grow by what the specs in one session use.
_ROOTS: dict[tuple[sympy.Expr, int], Root] = {}
_ROOT_OF: dict[sympy.Dummy, Root] = {}
_ANGLES: dict[sympy.Expr, Angle] = {}
_ANGLE_OF: dict[sympy.Dummy, Angle] = {}
_RANK = itertools.count()


def root_atom(radicand: sympy.Expr, degree: int) -> sympy.Dummy:
    """The positive atom r with r**degree == radicand (the caller has shown radicand > 0 there)."""
    key = (radicand, degree)
    if key not in _ROOTS:
        atom = sympy.Dummy("r", positive=True)
        _ROOTS[key] = root = Root(atom, radicand, degree, next(_RANK))
        _ROOT_OF[atom] = root
    return _ROOTS[key].atom


def radicals_as_roots(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with every rational power b^(p/q) of a non-number (q > 1) written r^p, r = root_atom(b, q).

    Only for comparisons *as rational functions* (the caller says so in its verdict): it takes
    every radicand as positive, which is where float64's sqrt is a number; where a radicand is
    negative or 0 the values are NaN or infinite and are not compared."""
    def is_radical(node) -> bool:
        return (isinstance(node, sympy.Pow) and node.exp.is_Rational and not node.exp.is_Integer
                and not node.base.is_Number)

    def as_root(node: sympy.Pow) -> sympy.Expr:
        return root_atom(node.base, int(node.exp.q)) ** int(node.exp.p)

    return expr.replace(is_radical, as_root) if expr.has(sympy.Pow) else expr


def root_of(symbol) -> Root | None:
    """The root a symbol stands for, or None."""
    return _ROOT_OF.get(symbol)


def angle_of(symbol) -> Angle | None:
    """The angle pair a symbol is the sine or cosine of, or None."""
    return _ANGLE_OF.get(symbol)


def angle_atoms(angle: sympy.Expr) -> tuple[sympy.Dummy, sympy.Dummy]:
    """(sin(angle), cos(angle)) as two real atoms bound by s**2 + c**2 == 1."""
    if angle not in _ANGLES:
        pair = Angle(angle, sympy.Dummy("s", real=True), sympy.Dummy("c", real=True))
        _ANGLES[angle] = pair
        _ANGLE_OF[pair.sine] = _ANGLE_OF[pair.cosine] = pair
    found = _ANGLES[angle]
    return found.sine, found.cosine


# sin(a + b) is expanded by angle addition only for angles of a few terms (sin of a matrix product's
# entry would expand into 2^d terms), and n * x by repeated addition, at most _MAX_MULTIPLE base
# angles in all; a larger angle is one base angle of its own. A rational angle p/q is p times 1/q.
_MAX_ANGLE_TERMS = 4
_MAX_MULTIPLE = 6


def _base_angles(angle: sympy.Expr) -> list[tuple[sympy.Expr, int]]:
    """angle = sum of count * base, or the angle itself as one base when that would be too long."""
    out, terms = [], [term for term in sympy.Add.make_args(sympy.expand(angle)) if term != 0]
    # with the other terms' denominators: j/100 + 1/25 is j/100 + 4 * (1/100), so a key position shifted by
    # one, sin(j/100 + 1/25), and sin(j/100 + 3/100) share the base 1/100
    common = sympy.ilcm(1, 1, *[c.q for c, _ in (t.as_coeff_Mul() for t in terms if not t.is_number) if c.is_Rational])
    for term in terms:
        coeff, rest = term.as_coeff_Mul()
        if term.is_Rational:  # p/q = p * (1/q): cos(2) and cos(1) share the base 1, as cos(3/100) and cos(1/100)
            q = sympy.ilcm(term.q, common)
            out.append((sympy.Rational(1, q), int(term * q)))
        elif term.is_number or not coeff.is_Integer:
            out.append((term, 1))
        else:
            out.append((rest, int(coeff)))
    if len(out) > _MAX_ANGLE_TERMS or sum(abs(count) for _, count in out) > _MAX_MULTIPLE:
        return [(angle, 1)]
    return out


def angle_sum(angle: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """(sin(angle), cos(angle)) as polynomials in the atoms of its base angles."""
    sine, cosine = sympy.Integer(0), sympy.Integer(1)
    for base, count in _base_angles(angle):
        s, c = angle_atoms(base)
        if count < 0:  # sin(-x) = -sin(x), cos(-x) = cos(x)
            s, count = -s, -count
        for _ in range(count):  # cos + i sin of a sum is the product of cos + i sin of its terms
            sine, cosine = sine * c + cosine * s, cosine * c - sine * s
    return sympy.expand(sine), sympy.expand(cosine)


def _roots_among(symbols) -> list[Root]:
    """The roots among `symbols` and every root their radicands read, outer (latest) first."""
    found: dict[sympy.Dummy, Root] = {}
    stack = [s for s in symbols if s in _ROOT_OF]
    while stack:
        root = _ROOT_OF[stack.pop()]
        if root.atom not in found:
            found[root.atom] = root
            stack.extend(s for s in root.radicand.free_symbols if s in _ROOT_OF)
    return sorted(found.values(), key=lambda r: -r.rank)


def relations(symbols, atomize: Callable[[sympy.Expr], sympy.Expr]) -> list[Relation]:
    """The relations of the atoms among `symbols`, heads in Groebner order (see the module
    docstring). Radicands are written through `atomize` (the zero test's atoms), so a radicand
    that reads sin(x) reads the same atoms as the expression."""
    out = []
    roots = _roots_among(symbols)
    seen = set(symbols)
    for root in roots:
        radicand = atomize(root.radicand)
        seen |= radicand.free_symbols
        out.append(Relation(root.atom, root.atom ** root.degree - radicand))
    angles = {_ANGLE_OF[s].angle: _ANGLE_OF[s] for s in seen if s in _ANGLE_OF}
    pairs = sorted(angles.values(), key=lambda a: sympy.default_sort_key(a.angle))
    out += [Relation(a.sine, a.sine ** 2 + a.cosine ** 2 - 1) for a in pairs]
    return out


def reduces_to_zero(poly: sympy.Expr, rels: list[Relation]) -> bool:
    """Whether `poly` is in the ideal of `rels` (so zero wherever they hold); False if not shown."""
    if not rels:
        return sympy.expand(poly) == 0
    heads = [r.head for r in rels]
    sines = [r.head for r in rels if r.head in _ANGLE_OF]
    cosines = [_ANGLE_OF[s].cosine for s in sines]
    lead = [h for h in heads if h not in _ANGLE_OF] + sines + cosines
    others: set = set()
    try:
        for expr in [poly] + [r.polynomial for r in rels]:
            others |= set(sympy.Poly(expr).gens)
        gens = lead + sorted(others - set(lead), key=sympy.default_sort_key)
        _, remainder = sympy.reduced(poly, [r.polynomial for r in rels], *gens, order="lex")
    except BasePolynomialError:  # not a polynomial in these generators, or a domain without division
        return False  # not shown
    return remainder == 0


def atom_values(symbols, draw: Callable[[sympy.Symbol], object],
                atomize: Callable[[sympy.Expr], sympy.Expr], value: Callable) -> dict | None:
    """Values for `symbols` at which every relation holds: free symbols from `draw`, each angle
    pair from one random angle, each root from its radicand's value there (`value(expr, subs)`,
    in mpmath). None when a radicand is not positive at the point drawn."""
    subs: dict = {}
    roots = _roots_among(symbols)
    wanted = set(symbols)
    radicands = {}
    for root in roots:
        radicands[root.atom] = atomize(root.radicand)
        wanted |= radicands[root.atom].free_symbols
    for sym in sorted(wanted - {r.atom for r in roots}, key=str):
        if sym in subs:
            continue
        pair = _ANGLE_OF.get(sym)
        if pair is not None:
            theta = draw(sympy.Dummy(real=True))
            subs[pair.sine], subs[pair.cosine] = mpmath.sin(theta), mpmath.cos(theta)
        else:
            subs[sym] = draw(sym)
    for root in reversed(roots):  # inner roots first
        radicand = value(radicands[root.atom], subs)
        if radicand is None or not mpmath.isfinite(radicand) or radicand <= 0:
            return None
        subs[root.atom] = mpmath.root(radicand, root.degree)
    return subs
