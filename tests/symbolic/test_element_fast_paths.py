"""The element level's fast paths against SymPy's own, slower routines.

`polyzero.expands_to_zero` may only say True for expressions that are zero; it
is compared here with SymPy's own expansion (an independent implementation of
polynomial arithmetic) and with evaluation at random points in mpmath. The
element level's `_diff` is compared with `sympy.diff` applied to the whole
term, `shared_xreplace` with `xreplace`, `settled` with `has`.
"""

from __future__ import annotations

import random

import mpmath
import pytest
import sympy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from symattn.symbolic.exact import entry_diff as _diff, free_symbols, settled, shared_xreplace, zero_test
from symattn.symbolic.polyzero import expands_to_zero

x, y, z = sympy.symbols("x y z", real=True)
K = sympy.Symbol("K", integer=True)
e1, e2, e3 = sympy.symbols("e1 e2 e3", positive=True)


@pytest.mark.parametrize("expr", [
    (x + y) ** 2 - x**2 - 2 * x * y - y**2,
    (1 + sympy.sqrt(2)) ** 2 - 3 - 2 * sympy.sqrt(2),              # needs sqrt(2)**2 = 2
    (sympy.sqrt(e1) + sympy.sqrt(e2)) ** 2 - e1 - e2 - 2 * sympy.sqrt(e1) * sympy.sqrt(e2),
    (sympy.sqrt(e1) + 1) * (sympy.cbrt(e1) + 1) - e1 ** sympy.Rational(5, 6) - sympy.sqrt(e1) - sympy.cbrt(e1) - 1,
    x / (y + z) ** 2 + x * y / (y + z) ** 2 - x * (1 + y) / (y + z) ** 2,    # one denominator, kept whole
    (x + 1) / sympy.sqrt(e1) * (1 + x) - (x**2 + 2 * x + 1) * e1 ** sympy.Rational(-1, 2),
    sympy.Integer(0),
], ids=["square", "sqrt2", "radicals", "mixed-roots", "shared-denominator", "negative-root", "zero"])
def test_shows_identities_zero(expr):
    assert expr != 0 or expr is sympy.S.Zero, "SymPy simplified the case away; it tests nothing"
    assert expands_to_zero(expr)


@pytest.mark.parametrize("expr", [
    x + y,
    (x + y) ** 2 - x**2 - y**2,
    sympy.sqrt(2) * x - x,
    sympy.sqrt(e1) - e1,
    x / (x + y) + y / (x + y) - 1,        # zero, but only after cancelling (x + y) / (x + y): not shown here
    sympy.sqrt(e1) * (x + 1) - (e1 * x + e1) / sympy.sqrt(e1),   # zero, but needs e1**(-1/2) * e1**(1/2) = 1
    sympy.exp(x) - sympy.exp(x) * (1 + x) + x * sympy.exp(x),      # functions are left to the complete test
    sympy.Float(0.5) * x,
    sympy.I * x,
], ids=["sum", "missing-term", "sqrt2", "root", "needs-cancelling", "needs-inverse-root", "function", "float",
        "imaginary"])
def test_never_claims_what_it_cannot_show(expr):
    assert not expands_to_zero(expr)


def test_the_complete_test_still_settles_what_the_fast_one_cannot():
    assert zero_test(x / (x + y) + y / (x + y) - 1)
    assert zero_test(e1 / (e1 + e2) * (x - (x * e1 + y * e2) / (e1 + e2))
                     - (x * e1 * (e1 + e2) - e1 * (x * e1 + y * e2)) / (e1 + e2) ** 2)
    assert not zero_test(e1 / (e1 + e2) - e2 / (e1 + e2))


# --- random polynomials: the fast test agrees with SymPy's expansion -------------------

ATOMS = [x, y, z, sympy.sqrt(2), sympy.sqrt(e1), e1 ** sympy.Rational(1, 3), e2, sympy.Rational(3, 2)]


def _random_sum(rng: random.Random) -> sympy.Expr:
    return sympy.Add(*[rng.choice(ATOMS) * rng.choice([1, -1, 2, sympy.Rational(1, 3)])
                       for _ in range(rng.randint(2, 3))])


def _random_expr(rng: random.Random) -> tuple[sympy.Expr, sympy.Expr]:
    """(numerator, denominator): products of powers of sums plus a sum, unexpanded, over 1 or a
    denominator that stays whole."""
    product = sympy.Mul(*[_random_sum(rng) ** rng.randint(1, 3) for _ in range(rng.randint(1, 3))])
    denominator = 1 + x**2 + e2 + _random_sum(rng) ** 2 if rng.random() < 0.4 else sympy.Integer(1)
    return product + _random_sum(rng), denominator


def _value(expr: sympy.Expr, point: dict):
    with mpmath.workdps(50):
        return sympy.N(expr.xreplace(point), 40)


POINT = {x: sympy.Rational(3, 7), y: sympy.Rational(-5, 11), z: sympy.Rational(2, 13),
         e1: sympy.Rational(7, 5), e2: sympy.Rational(4, 9)}


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10**9))
def test_random_expressions_agree_with_sympy_expand_and_with_values(seed):
    rng = random.Random(seed)
    numerator, denominator = _random_expr(rng)
    # The same function written two ways (the numerator expanded by SymPy) is shown zero...
    difference = numerator / denominator - sympy.expand(numerator) / denominator
    assume(difference != 0)  # already expanded: nothing to show
    assert expands_to_zero(difference)
    # ... and a nonzero change to it never is: the fast test agrees with evaluation.
    changed = difference + rng.choice([x * y, sympy.sqrt(2) * z, sympy.Rational(1, 7),
                                                      sympy.sqrt(e1) * e2 / (1 + x**2 + e2)])
    assert abs(_value(changed, POINT)) > 1e-20
    assert not expands_to_zero(changed)


# Monomials are packed into one integer, a field of bits per generator: exponents at the top
# of a field, products that reach the bound, and hundreds of generators must neither carry into
# the next generator nor be lost. SymPy's expansion says what is zero.
MANY = sympy.symbols("m0:300", real=True)


@pytest.mark.parametrize("expr", [
    (x + y) ** 7 * (x - z) ** 8 - sympy.expand((x + y) ** 7 * (x - z) ** 8),
    (x**15 + 1) * (x + 1) - x**16 - x**15 - x - y,                # 1 - y: x**16 must not reach y's field
    (x**15 + 1) * (x + 1) - x**16 - x**15 - x - 1,
    x**31 * y - y * x**31 + x**32 - x**16 * x**16,
    (sympy.sqrt(2) + x) ** 9 - sympy.expand((sympy.sqrt(2) + x) ** 9),
    (sympy.sqrt(2) + x) ** 9 - sympy.expand((sympy.sqrt(2) + x) ** 9) + sympy.sqrt(2) ** 3 - 2,
    sympy.Add(*MANY) ** 2 - sympy.expand(sympy.Add(*MANY) ** 2),
    sympy.Add(*MANY) ** 2 - sympy.expand(sympy.Add(*MANY) ** 2) + MANY[0] * MANY[299] / 3,
    (x / 3 + y / 5) ** 4 - sympy.expand((x / 3 + y / 5) ** 4) + sympy.Rational(1, 10**30) * x,
], ids=["binomials", "high-power", "high-power-zero", "field-top", "sqrt2-powers", "sqrt2-leftover",
        "many-generators", "many-generators-leftover", "tiny-coefficient"])
@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_packed_monomials_agree_with_sympy_expand(expr):
    assert expands_to_zero(expr) == (sympy.expand(expr) == 0)


# Random trees, built with and without SymPy's evaluation, of what the packing maps: symbols,
# roots and negative rational powers of positive symbols, roots of integers (r**L = b), negative
# integer powers (inverse generators), powers whose exponents sit at a field's top (2**k - 1) or
# just past it (2**k), huge and tiny rationals, zero. "Zero" must agree with SymPy's exact
# expansion (over the common denominator when the tree has one); a tree minus its own expansion,
# plus a monomial that a carry between fields or a lost sign would cancel, must never be "zero".
REALS = sympy.symbols("r0:3", real=True)
POSITIVES = sympy.symbols("q0:2", positive=True)
FAR = sympy.symbols("f0:40", real=True)    # generators far up the packed integer
EDGE_EXPONENTS = [1, 2, 3, 4, 7, 8, 15, 16, 31, 32]


@st.composite
def _leaves(draw, inverses=True):
    evaluate = draw(st.booleans())
    kind = draw(st.integers(min_value=0, max_value=7))
    if not inverses and kind in (1, 3):
        kind = 4
    if kind == 0:
        return draw(st.sampled_from(REALS + POSITIVES + FAR[-2:]))
    if kind == 1:
        exponent = sympy.Rational(draw(st.sampled_from([1, -1, 2, -3, 5])), draw(st.sampled_from([2, 3, 4, 6])))
        return sympy.Pow(draw(st.sampled_from(POSITIVES)), exponent, evaluate=evaluate)
    if kind == 2:
        exponent = sympy.Rational(draw(st.sampled_from([1, 2, 3, 5])), draw(st.sampled_from([2, 3, 4])))
        return sympy.Pow(sympy.Integer(draw(st.sampled_from([2, 3, 4, 8, 12]))), exponent, evaluate=evaluate)
    if kind == 3:
        return sympy.Pow(draw(st.sampled_from(REALS + POSITIVES)), -draw(st.integers(1, 3)), evaluate=evaluate)
    if kind == 4:
        return sympy.Pow(draw(st.sampled_from(REALS)), draw(st.sampled_from(EDGE_EXPONENTS)), evaluate=evaluate)
    if kind == 5:
        return sympy.Rational(draw(st.sampled_from([0, 1, -1, 3, -7, 10**30, -10**25])),
                              draw(st.sampled_from([1, 2, 3, 97, 10**20])))
    return draw(st.sampled_from(REALS))


@st.composite
def _trees(draw, depth=3, inverses=True):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(_leaves(inverses))
    evaluate = draw(st.booleans())
    kind = draw(st.integers(0, 4))
    if kind < 2:
        return sympy.Add(*draw(st.lists(_trees(depth - 1, inverses), min_size=2, max_size=3)), evaluate=evaluate)
    if kind < 4:
        return sympy.Mul(*draw(st.lists(_trees(depth - 1, inverses), min_size=2, max_size=3)), evaluate=evaluate)
    exponents = [2, 3, -1, -2] if inverses else [2, 3]
    return sympy.Pow(draw(_trees(depth - 1, inverses)), draw(st.sampled_from(exponents)), evaluate=evaluate)


@st.composite
def _sums(draw, inverses=True):
    """A sum of two or three leaves with signed and fractional coefficients: products of these
    meet in many monomials, so cancellation (and a lost sign) reaches the coefficients."""
    terms = draw(st.lists(st.tuples(_leaves(inverses), st.sampled_from([1, -1, 2, -3, sympy.Rational(-1, 3)])),
                          min_size=2, max_size=3))
    return sympy.Add(*[leaf * coeff for leaf, coeff in terms])


def _sympy_says_zero(expr: sympy.Expr) -> bool:
    return sympy.expand(expr) == 0 or sympy.expand(sympy.fraction(sympy.together(expr))[0]) == 0


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.booleans().flatmap(lambda inverses: st.tuples(_trees(3, inverses), _trees(2, inverses), _sums(inverses),
                                                        _sums(inverses), st.integers(1, 3))), st.sampled_from(REALS + POSITIVES + FAR[-1:]), st.sampled_from(EDGE_EXPONENTS),
       st.sampled_from([1, -1, sympy.Rational(1, 10**30)]))
@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_random_trees_zero_only_where_sympy_expands_to_zero(factors, base, exponent, coeff):
    a, b, s, t, k = factors
    product = sympy.Mul(a, b, sympy.Pow(s, k, evaluate=False), t, evaluate=False)
    rewritten = sympy.Add(product, -sympy.expand(a * b * s**k * t), evaluate=False)
    for expr in (a, product, rewritten):
        if expands_to_zero(expr):
            assert _sympy_says_zero(expr), expr
    # plus a nonzero monomial (a power at a field's top, a far generator, a tiny or negative coefficient)
    changed = sympy.Add(rewritten, coeff * sympy.Pow(base, exponent, evaluate=False) * FAR[0], evaluate=False)
    assert not expands_to_zero(changed), changed
    # ... or minus another generator: base**(2**k) carried out of a k-bit field would be the next one
    for other in sorted(changed.free_symbols - {base}, key=str):
        changed = sympy.Add(rewritten, coeff * (sympy.Pow(base, exponent, evaluate=False) - other), evaluate=False)
        assert not expands_to_zero(changed), changed
    # a tree without inverses is a polynomial in its generators: its rewriting is always shown zero,
    # given at most one integer radicand, one SymPy would not rewrite (here sqrt(4) is a root r with
    # r**2 = 4, not 2, and sqrt(2) * sqrt(3) is not the generator of sqrt(6))
    powers = product.atoms(sympy.Pow)
    radicands = {p.base for p in powers if p.base.is_Integer}
    if not any(p.exp.is_negative for p in powers) and len(radicands) <= 1 and all(
            sympy.root(r, 2) == sympy.Pow(r, sympy.S.Half, evaluate=False) for r in radicands):
        assert expands_to_zero(rewritten), rewritten


# --- atom mode: function applications as generators, without an atomized copy -----------------
# Whatever atom mode calls zero must be zero in value (mpmath at random points is the independent
# judge); the identities element-level entries rely on (the same exp on both sides, exp(2u) against
# exp(u)**2, exp(u/2)**2 against exp(u)) must be shown; a symbol and exp of it are different generators.

def _pow(base, exponent):
    return sympy.Pow(base, exponent, evaluate=False)


@pytest.mark.parametrize("expr", [
    _pow(sympy.exp(x + y), 2) - sympy.exp(2 * x + 2 * y),
    _pow(sympy.exp(x / 2), 2) - sympy.exp(x),
    sympy.Mul(_pow(sympy.exp(-x), 3), sympy.exp(-x / 3), evaluate=False) - _pow(sympy.exp(-x / 3), 10),
    sympy.exp(x) * (x + y) / (sympy.exp(x) + sympy.exp(y)) - (x * sympy.exp(x) + y * sympy.exp(x))
    * _pow(sympy.exp(x) + sympy.exp(y), -1),
    sympy.tanh(x) ** 2 * (1 + y) - sympy.tanh(x) ** 2 - y * _pow(sympy.tanh(x), 2),
    _pow(sympy.Max(x, y), 2) * (1 + y) - _pow(sympy.Max(x, y), 2) - y * _pow(sympy.Max(y, x), 2),
], ids=["square", "half", "negative-fractional", "softmax-entry", "tanh", "max"])
def test_atom_mode_shows_identities_between_the_same_applications(expr):
    assert expr != 0, "SymPy simplified the case away; it tests nothing"
    assert expands_to_zero(expr, atoms=True)
    assert not expands_to_zero(expr)  # the plain mode leaves functions alone


@pytest.mark.parametrize("expr", [
    sympy.exp(x) - x,                                   # exp(x)'s generator is not x's
    sympy.exp(x) * x - x**2,
    sympy.exp(2 * x) - sympy.exp(x),
    sympy.exp(-x) - sympy.exp(x),                        # the sign goes into the exponent, not lost
    sympy.Mul(sympy.exp(x), sympy.exp(-x), evaluate=False) - 1,  # zero, but exp(x) exp(-x) needs cancelling: not shown
    sympy.exp(x + y) - sympy.exp(x) * sympy.exp(y),      # zero, but different applications: not shown
    sympy.tanh(x) - sympy.tanh(y),
    sympy.sin(x) ** 2 + sympy.cos(x) ** 2 - 1,           # zero only by a relation: left to the complete test
    sympy.exp(x / 2) - sympy.exp(x / 3),
], ids=["symbol", "symbol-product", "double", "sign", "inverse", "split", "arguments", "relation", "roots"])
def test_atom_mode_never_claims_what_it_cannot_show(expr):
    assert not expands_to_zero(expr, atoms=True)


def test_an_unevaluated_power_of_e_is_not_taken_for_exp():
    """SymPy's isinstance(Pow(E, u, evaluate=False), exp) is True, but its args are (E, u): read
    as exp(args[0]) it would be exp(E), a constant (found by an adversarial review)."""
    power = sympy.Pow(sympy.E, x, evaluate=False)
    f = sympy.Function("f")
    assert not expands_to_zero(power - sympy.exp(sympy.E), atoms=True)
    assert not zero_test(f(x) * (power - sympy.exp(sympy.E)))
    for expr in (power, y * (power + 1)):
        assert _value(_diff(expr, x) - sympy.diff(expr, x), {x: sympy.Rational(1, 3), y: 2}) == 0


_APPLICATIONS = [sympy.exp(x), sympy.exp(-x), sympy.exp(2 * x), sympy.exp(x / 2), sympy.exp(x - y),
                 sympy.exp(y - x), sympy.exp(x + y), sympy.tanh(x), sympy.tanh(y), sympy.Max(x, y), x, y,
                 e1, sympy.sqrt(e1)]


@st.composite
def _function_trees(draw, depth=3):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(_APPLICATIONS + [sympy.Rational(-3, 2), sympy.Integer(2)]))
    kind = draw(st.integers(0, 4))
    evaluate = draw(st.booleans())
    if kind < 2:
        return sympy.Add(*draw(st.lists(_function_trees(depth - 1), min_size=2, max_size=3)), evaluate=evaluate)
    if kind < 4:
        return sympy.Mul(*draw(st.lists(_function_trees(depth - 1), min_size=2, max_size=3)), evaluate=evaluate)
    return sympy.Pow(draw(_function_trees(depth - 1)), draw(st.sampled_from([2, 3, -1])), evaluate=evaluate)


def _values_at_random_points(expr: sympy.Expr) -> list:
    points = [{x: sympy.Rational(3, 7), y: sympy.Rational(-5, 11), e1: sympy.Rational(7, 5)},
              {x: sympy.Rational(-13, 17), y: sympy.Rational(2, 3), e1: sympy.Rational(1, 9)}]
    return [_value(expr, point) for point in points]


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@settings(max_examples=150, deadline=None, derandomize=True)
@given(_function_trees(), _function_trees(), st.sampled_from(_APPLICATIONS))
def test_atom_mode_zero_only_where_the_value_is_zero(a, b, extra):
    """A product rewritten by SymPy's expansion is zero; what atom mode calls zero is zero at
    random points; a leftover application (a different generator) is never cancelled."""
    for expr in (a - b, a * b - sympy.expand(a * b), sympy.expand(a) - a):
        if expands_to_zero(expr, atoms=True):
            assert all(abs(v) < 1e-25 for v in _values_at_random_points(expr)), expr
    rewritten = sympy.Add(sympy.Mul(a, b, evaluate=False), -sympy.expand(a * b), evaluate=False)
    changed = sympy.Add(rewritten, extra * sympy.Rational(1, 7), evaluate=False)
    if any(abs(v) > 1e-20 for v in _values_at_random_points(changed)):
        assert not expands_to_zero(changed, atoms=True), changed


# --- the product rule against sympy.diff of the whole term ----------------------------------

@pytest.mark.parametrize("expr", [
    x * y * z,
    x**2 * y,
    sympy.exp(x * y) / (sympy.exp(x * y) + sympy.exp(x * z)),
    3 * x * sympy.exp(x) * y / (1 + x**2),
    sympy.tanh(x + y) * x + y * z,
    z * y,                                   # no x: derivative 0
], ids=["product", "power", "softmax", "mixed", "function", "constant"])
def test_diff_matches_sympy_diff(expr):
    mine = _diff(expr, x)
    reference = sympy.diff(expr, x)
    assert sympy.simplify(mine - reference) == 0


def test_diff_of_a_softmax_entry_is_sympys_expression_itself():
    """The ground truth of documents stays the very expression sympy.diff writes (no new form)."""
    a, b, c = sympy.symbols("a b c", real=True)
    scores = [x * a + y * b, x * b + z * c, x * c]
    denominator = sum(sympy.exp(s) for s in scores)
    for s in scores:
        entry = sympy.exp(s) / denominator
        for sym in (x, a, b):
            assert _diff(entry, sym) == sympy.diff(entry, sym)


# --- shared-subtree substitution and the one-walk finiteness test ----------------------------

def test_shared_xreplace_is_xreplace():
    softmax = [sympy.exp(x * y) / (sympy.exp(x * y) + sympy.exp(x * z)),
               sympy.exp(x * z) / (sympy.exp(x * y) + sympy.exp(x * z)),
               sympy.Piecewise((x, y > 0), (z, True)) + sympy.tanh(x)]
    mapping = {x: y + z, y: sympy.Rational(1, 2), e1: e2}
    replace = shared_xreplace(mapping)
    assert [replace(e) for e in softmax] == [e.xreplace(mapping) for e in softmax]
    assert replace(z) is z


def test_shared_xreplace_reuses_only_an_extreme_of_the_same_kind_and_arguments():
    """The symmetry witness's substitution with `known` extremes: a swap of x and y maps
    Max(x, y) to the known Max(x, y), never to the Min of the same arguments, and a max whose
    new arguments are not a known one's is built afresh; the result is always xreplace's."""
    known = [sympy.Max(x, y), sympy.Min(x, y), sympy.Max(x, y, z), sympy.Min(x, -y)]
    entries = [sympy.Min(y, x) + 2 * sympy.Max(y, x), sympy.Max(z, y, x) - sympy.Min(y, -x),
               sympy.Max(x, z), sympy.Min(x, y) * sympy.Min(y, z)]
    mapping = {x: y, y: x}
    replace = shared_xreplace(mapping, known=known)
    for entry in entries:
        assert replace(entry) == entry.xreplace(mapping)
    swapped = replace(sympy.Min(x, y) - sympy.Max(x, y))
    assert swapped.has(sympy.Min) and swapped.has(sympy.Max) and swapped.xreplace({x: 1, y: 2}) == -1


@pytest.mark.parametrize("expr", [
    x * sympy.oo, -sympy.oo * x + y, sympy.exp(x - sympy.oo) + y, x + sympy.I * y,
    sympy.AccumBounds(-1, 1) * x, sympy.zoo * x, x + y, sympy.exp(x) / (1 + y), sympy.oo, sympy.nan,
    sympy.Sum(sympy.oo * x * K, (K, 1, 3)), y + sympy.Sum(x * K, (K, 1, 3)),   # under a node binding variables
    K * y + sympy.Sum(x * K, (K, 1, 3)),                                       # K both bound and free
])
def test_settled_and_free_symbols_match_sympy(expr):
    expected = bool(expr.is_number) or not (expr.has(sympy.oo, -sympy.oo, sympy.nan, sympy.zoo)
                                            or expr.has(sympy.I) or expr.has(sympy.AccumBounds))
    assert settled(expr) == expected
    assert free_symbols(expr) == expr.free_symbols
