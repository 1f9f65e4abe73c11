"""Exact comparison of element-level entries under float64 semantics.

Contract: `zero_test(expr)` is True only if `expr` is identically zero as a
rational function of its symbols and function atoms (exp split into positive
atoms, tanh written through exp, sin and cos expanded by angle addition into
atoms s, c with s^2 + c^2 = 1, positive roots r with r^k = radicand made by
`symattn.symbolic.relations.root_atom`, where/relu/abs settled by cases;
cheapest first: a 40-digit random point of expr's own symbols that shows it
nonzero, the sparse-polynomial test of `symattn.symbolic.polyzero` with each
function application one generator, then on the atomized expression: a random
point that satisfies the relations, the sparse-polynomial test, expansion, the
common denominator, its numerator reduced by the relations).
`settled(entry)` says whether an entry is a number or free of infinities and
NaN; `same_entry(a, b)` is exact equality under float64 semantics (the same
non-finite value, or settled and identically equal), False meaning "not
shown". `mp_value` evaluates an entry at a point in mpmath with float64's
answers at the edges (log of a negative is NaN, 0**-1 is inf);
`shared_xreplace` substitutes into many entries sharing subtrees;
`entry_diff` is sympy.diff with the product rule written out, `extreme_diff` the
derivative of a max or min of distinct symbols with ties sharing equally. The element
model (`symattn.symbolic.element`) compares entries with these.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from typing import Callable, Iterable, Mapping

import mpmath
import numpy as np
import sympy
from sympy.functions.elementary.piecewise import ExprCondPair

from ..budget import checkpoint
from ..ir.functions import mpmath_table
from .polyzero import expands_to_zero
from .relations import angle_of, angle_sum, atom_values, reduces_to_zero, relations, root_of

__all__ = ["zero_test", "same_entry", "settled", "shared_xreplace", "entry_diff", "extreme_diff", "mp_value",
           "free_symbols", "holds"]


# SymPy's `free_symbols` and `has` visit every occurrence of a subtree: an element-level entry is a
# sum over softmax rows whose denominators, and after unfolding whose scores, are shared by every
# term, so they visit the same subtrees thousands of times. These walk each distinct subtree once.

_OWN_FREE_SYMBOLS: dict[type, bool] = {}


def _own_free_symbols(cls: type) -> bool:
    """Whether a class defines free_symbols otherwise than as the union over its args (Symbol
    itself, or a class binding variables, as Derivative and Lambda do)."""
    found = _OWN_FREE_SYMBOLS.get(cls)
    if found is None:
        owner = next(k for k in cls.__mro__ if "free_symbols" in k.__dict__)
        found = _OWN_FREE_SYMBOLS[cls] = owner is not sympy.Basic
    return found


def _subtrees(expr: sympy.Basic, descend=None):
    """Each distinct subtree of expr once (SymPy's walks visit every occurrence of a shared one); the
    arguments of a node are visited only where descend(node) is true (all when descend is None)."""
    seen = {expr}
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if descend is not None and not descend(node):
            continue
        for arg in node.args:
            if arg not in seen:
                seen.add(arg)
                stack.append(arg)


_NON_FINITE = (sympy.oo, -sympy.oo, sympy.nan, sympy.zoo)
_UNSETTLING = frozenset((*_NON_FINITE, sympy.I))


@dataclasses.dataclass(frozen=True)
class _Facts:
    """An entry's free symbols, whether it holds oo, NaN or I (`settled`), whether it has Piecewise or sign."""

    symbols: frozenset
    unsettling: bool
    cases: bool


@functools.lru_cache(maxsize=8192)
def _facts(expr: sympy.Basic) -> _Facts:
    """An entry's `_Facts` from one walk, kept: `same_entry`, `settled` and the unfolding stages ask alike."""
    symbols: set = set()
    unsettling = cases = binds = False
    for node in _subtrees(expr):  # every subtree, a Sum's body included
        if node.is_Symbol:
            symbols.add(node)
        elif _own_free_symbols(type(node)):  # a node binding variables: its symbols are its own
            binds = True
        unsettling = unsettling or node in _UNSETTLING or isinstance(node, sympy.AccumBounds)
        cases = cases or isinstance(node, (sympy.Piecewise, sympy.sign))
    if binds:  # a bound variable (a Sum's index) is not free: SymPy's own walk for such entries
        symbols = expr.free_symbols
    return _Facts(frozenset(symbols), unsettling, cases)


def free_symbols(expr: sympy.Basic) -> frozenset:
    """`expr.free_symbols`, the same set, in one walk over distinct subtrees (kept per expression)."""
    return _facts(expr).symbols


def holds(expr: sympy.Basic, *types: type) -> bool:
    """`expr.has(*types)` for classes (any subtree an instance of one), in one walk over distinct subtrees."""
    return any(isinstance(node, types) for node in _subtrees(expr))


# Atoms and atomized subtrees, shared by every _atomize call: the entries of one tensor, and the
# two sides of a comparison, share their exp(...) subtrees. Cleared together (never within a call)
# when they grow past _ATOM_CACHE, so that a long session does not hold every expression it saw.
_ATOMS: dict[sympy.Expr, sympy.Dummy] = {}
_ATOMIZED: dict[sympy.Expr, sympy.Expr] = {}
_ATOM_CACHE = 50_000


def _atomize(expr: sympy.Expr) -> sympy.Expr:
    """Replace every function application (and irrational power of a non-number) by a symbol.

    exp is split first, exp(2*s + t/2) = E_s^2 * E_t^(1/2) with E_s = exp(s) > 0, so that
    the exp(2*s) sympy.diff writes meets the exp(s)^2 of the other side as one atom; tanh
    is written through exp first (its argument is finite here), so it meets sigmoid. sin and
    cos of a sum of a few terms are expanded by angle addition (and n * x by repeated
    addition) into the atoms s, c of each base angle, bound by s^2 + c^2 = 1
    (`symattn.symbolic.relations`). The same application is the same symbol in every call
    (see _ATOMS).
    """
    if len(_ATOMIZED) > _ATOM_CACHE:
        _ATOMS.clear()
        _ATOMIZED.clear()
    atoms, done = _ATOMS, _ATOMIZED

    def atom(node: sympy.Expr, positive: bool = False) -> sympy.Dummy:
        if node not in atoms:
            # exp atoms are positive; any other atom is a real of unknown sign (positive=False would
            # tell SymPy it is <= 0, and Abs(atom) would become -atom)
            atoms[node] = sympy.Dummy(positive=True) if positive else sympy.Dummy(real=True)
        return atoms[node]

    def walk(node: sympy.Expr) -> sympy.Expr:
        if not node.args or node.is_Atom:
            return node
        if node not in done:
            done[node] = rewrite(node)
        return done[node]

    def rewrite(node: sympy.Expr) -> sympy.Expr:
        if isinstance(node, sympy.tanh):  # tanh(u) = (E^2 - 1) / (E^2 + 1), E = exp(u) > 0: meets sigmoid
            e2 = sympy.exp(2 * node.args[0])
            return walk((e2 - 1) / (e2 + 1))
        if isinstance(node, (sympy.sin, sympy.cos)):
            sine, cosine = angle_sum(walk(node.args[0]))
            return sine if isinstance(node, sympy.sin) else cosine
        if node.func is sympy.exp:
            result = sympy.Integer(1)
            for term in sympy.Add.make_args(sympy.expand(walk(node.args[0]))):
                coeff, rest = term.as_coeff_Mul()
                if term.is_number:
                    result *= sympy.exp(term)
                else:  # exp(c * r) = E_r ** c with E_r = exp(r) > 0, for rational c
                    result *= atom(sympy.exp(rest), True) ** coeff
            return result
        args = [walk(a) for a in node.args]
        rebuilt = node.func(*args) if args != list(node.args) else node
        if isinstance(rebuilt, sympy.Function) or (
            isinstance(rebuilt, sympy.Pow) and not rebuilt.exp.is_Integer and not rebuilt.base.is_Number
        ):
            return atom(rebuilt)
        return rebuilt

    return walk(expr)


def _mp_pow(base, exponent):
    """base**exponent as float64 has it: 0**-k is inf, a negative base with a fractional exponent NaN."""
    if mpmath.isnan(base) or mpmath.isnan(exponent):
        return mpmath.nan
    if base == 0 and exponent < 0:
        return mpmath.inf
    if base < 0 and not mpmath.isint(exponent):
        return mpmath.nan
    return base**exponent


def _mp_real(value):
    """A complex intermediate is NaN under float64 semantics."""
    if isinstance(value, mpmath.mpc):
        return value.real if value.imag == 0 else mpmath.nan
    return value


# SymPy functions in mpmath: each builtin function's own (its record's `mpmath`, read live), and
# sign, which SymPy writes for the derivative of abs.
_MP_SIGN = {sympy.sign: mpmath.sign}
# The conditions of where / relu / abs (sympy.Piecewise), evaluated to Python booleans.
_MP_RELATIONS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
                 ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _first_branch(pairs):
    for value, cond in pairs:
        if cond is None:
            return None
        if cond:
            return value
    return None


def mp_value(expr: sympy.Expr, subs: dict, memo: dict):
    """expr at a point, in mpmath at the working precision; shared subtrees evaluated once."""
    functions = {**_MP_SIGN, **mpmath_table()}
    stack = [(expr, False)]
    while stack:
        node, ready = stack.pop()
        if node in memo:
            continue
        if node in subs:
            memo[node] = subs[node]
            continue
        if node is sympy.true or node is sympy.false:
            memo[node] = bool(node)
            continue
        if node.is_Number or node.is_NumberSymbol:
            if node in (sympy.oo, -sympy.oo):
                memo[node] = mpmath.inf if node == sympy.oo else -mpmath.inf
            elif node is sympy.nan:
                memo[node] = mpmath.nan
            else:
                memo[node] = mpmath.mpf(node.evalf(mpmath.mp.dps + 5)) if node.is_finite else None
            continue
        if not ready:
            stack.append((node, True))
            stack.extend((a, False) for a in node.args if a not in memo)
            continue
        args = [memo[a] for a in node.args]
        if isinstance(node, sympy.Piecewise):  # the first branch whose condition holds; others may be undefined
            memo[node] = _first_branch(args)
        elif isinstance(node, ExprCondPair):
            memo[node] = tuple(args)
        elif any(a is None for a in args):
            memo[node] = None
        elif node.is_Add:
            memo[node] = mpmath.fsum(args)
        elif node.is_Mul:
            memo[node] = mpmath.fprod(args)
        elif node.is_Pow:
            memo[node] = _mp_real(_mp_pow(*args))
        elif isinstance(node, sympy.core.relational.Relational) and node.rel_op in _MP_RELATIONS:
            memo[node] = bool(_MP_RELATIONS[node.rel_op](*args))
        elif isinstance(node, (sympy.Max, sympy.Min)):  # a line holding NaN has NaN as its max (NumPy's rule)
            memo[node] = mpmath.nan if any(mpmath.isnan(a) for a in args) else (
                max(args) if isinstance(node, sympy.Max) else min(args))
        elif type(node) in functions:
            memo[node] = _mp_real(functions[type(node)](args[0]))
        else:
            memo[node] = None
    return memo[expr]


@dataclasses.dataclass
class _Point:
    """The random point of `_numerically_nonzero` for one set of symbols, with the value of every
    subtree computed there so far (at 40 digits)."""

    symbols: frozenset
    subs: dict | None  # None: no point satisfies the relations (a radicand was not positive)
    memo: dict
    largest: dict = dataclasses.field(default_factory=dict)  # node -> largest finite |value| in its subtrees


# The latest point: the entries of one gradient, compared at one stage of unfolding, mostly read
# the same symbols, so they meet the same point and share its values of their common subtrees
# (softmax denominators, unfolded scores). The point depends only on the set of symbols.
_LATEST: list[_Point] = []


def _value_of(sym, n: int):
    """A point's value for `sym` from a random integer n: in [0.5, 1.5) if positive, else [-1.03, 1.03)."""
    return mpmath.mpf(50 + n % 100) / 100 if sym.is_positive else mpmath.mpf(n % 200 - 100) / 97


def _point(symbols: frozenset) -> _Point:
    if _LATEST and _LATEST[0].symbols == symbols:
        if len(_LATEST[0].memo) > _ATOM_CACHE:  # values are recomputed alike; only memory is saved
            _LATEST[0].memo.clear()
            _LATEST[0].largest.clear()
        return _LATEST[0]
    rng = np.random.default_rng(len(symbols))

    def draw(sym):
        return _value_of(sym, int(rng.integers(0, 100 if sym.is_positive else 200)))

    def value(node, at):
        try:
            return mp_value(node, at, {})
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return None

    _LATEST[:] = [_Point(symbols, atom_values(symbols, draw, _atomize, value), {})]
    return _LATEST[0]


# The point of expressions as they stand (plain symbols only): each symbol's value fixed by its
# name, so one point and its values of shared subtrees serve every entry of every comparison.
_STABLE = _Point(frozenset(), {}, {})


def _stable_point(symbols: frozenset) -> _Point | None:
    """The shared point with values for `symbols`; None when one of them is an atom bound by a
    relation (a root or an angle), whose value must come from the others' (`_point`)."""
    if any(root_of(sym) is not None or angle_of(sym) is not None for sym in symbols):
        return None
    subs = _STABLE.subs
    for sym in symbols:
        if sym not in subs:
            # from the name: the same value in every process and call order
            subs[sym] = _value_of(sym, int.from_bytes(hashlib.blake2b(sym.name.encode(), digest_size=8).digest(),
                                                      "little"))
    if len(_STABLE.memo) > _ATOM_CACHE:
        _STABLE.memo.clear()
        _STABLE.largest.clear()
    return _STABLE


def _numerically_nonzero(expr: sympy.Expr, symbols: frozenset, stable: bool = False) -> bool:
    """True if `expr` is clearly nonzero at a random point (so it is not identically zero).

    The point (drawn from a generator seeded by the number of `symbols`, expr's free symbols)
    satisfies the atoms' relations (sin^2 + cos^2 = 1, r^k = radicand), so an expression that
    is zero only through them is not mistaken for a nonzero one. With `stable`, the point is
    `_stable_point`'s where it applies (symbols free of relations): any point shows a nonzero."""
    with mpmath.workdps(40):
        point = (stable and _stable_point(symbols)) or _point(symbols)
        if point.subs is None:
            return False
        memo = point.memo
        try:
            total = mp_value(expr, point.subs, memo)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return False
        if total is None or not mpmath.isfinite(total):
            return False
        terms = [memo.get(term) for term in sympy.Add.make_args(expr)]
        if any(v is None for v in terms):
            return False
        # At 40 digits a true zero leaves at most ~1e-35 of the largest value it was computed
        # from: a term, or a sum inside a product that is zero only by a relation (s^2 + c^2 - 1).
        scale = max([abs(v) for v in terms] + [_largest(expr, memo, point.largest)])
        return abs(total) > mpmath.mpf("1e-25") * max(scale, mpmath.mpf("1e-30"))


def _largest(expr: sympy.Expr, memo: dict, largest: dict):
    """The largest finite |value| over expr's subtrees (values from `memo`, every subtree of expr
    evaluated), each subtree's kept in `largest`: entries share most of their subtrees."""
    stack = [(expr, False)]
    while stack:
        node, ready = stack.pop()
        if node in largest:
            continue
        if ready or not node.args:
            value = memo[node]
            own = abs(value) if isinstance(value, mpmath.mpf) and mpmath.isfinite(value) else mpmath.mpf(0)
            largest[node] = max([own] + [largest[arg] for arg in node.args])
        else:
            stack.append((node, True))
            stack.extend((arg, False) for arg in node.args if arg not in largest)
    return largest[expr]


_MAX_CONDITIONS = 4


def zero_test(expr: sympy.Expr) -> bool:
    """True if `expr` is identically zero as a rational function of its symbols and function atoms.

    Cheapest first: a random point that shows it nonzero ends the test; then
    expansion in a sparse polynomial ring (`symattn.symbolic.polyzero`), first with each
    function application as it stands one generator (most entries compared are sums over
    the same exp subtrees on both sides), then on the atomized expression; then SymPy's
    expansion with denominators kept whole; then the common denominator, whose
    numerator is finally reduced by the relations of the atoms it reads (angle pairs,
    roots: `symattn.symbolic.relations`).
    """
    if expr == 0:
        return True
    expr = sympy.sympify(expr)
    facts = _facts(expr)
    return _zero_test(expr, facts.symbols, facts.cases)


def _zero_test(expr: sympy.Expr, symbols: frozenset, cases: bool) -> bool:
    """`zero_test`, given expr's free symbols (a superset does: only the random point drawn
    depends on them) and whether it may hold Piecewise or sign (False: it holds neither)."""
    if expr == 0:
        return True
    if cases and holds(expr, sympy.Piecewise, sympy.sign):  # where / relu / abs: zero if zero in every branch
        if holds(expr, sympy.sign):
            expr = expr.rewrite(sympy.Piecewise)
        # Split into cases: every truth assignment of the k conditions picks one branch of each
        # piece (2^k cases, so only for a few conditions; beyond that the pieces stay atoms).
        conditions = list(expr.atoms(sympy.core.relational.Relational))
        if len(conditions) <= _MAX_CONDITIONS:
            cases = itertools.product((sympy.true, sympy.false), repeat=len(conditions))
            return all(zero_test(expr.xreplace(dict(zip(conditions, case)))) for case in cases)
    checkpoint()
    if not expr.is_number:
        # First as it stands: its value at a point of its own symbols is its true value, and most
        # identities are between the same applications, which the polynomial test takes as generators.
        if _numerically_nonzero(expr, symbols, stable=True):
            return False
        if expands_to_zero(expr, atoms=True):
            return True
    atomized = _atomize(expr)
    if atomized.is_number:
        return atomized.equals(0) is True
    symbols = frozenset(free_symbols(atomized))
    if _numerically_nonzero(atomized, symbols):
        return False
    if expands_to_zero(atomized):  # exact, in a sparse polynomial ring: ~10x faster than expand
        return True
    if sympy.expand(atomized) == 0:
        return True
    checkpoint()
    numer, _ = sympy.fraction(sympy.together(atomized))
    if sympy.expand(numer) == 0:
        return True
    rels = relations(symbols, _atomize)
    if not rels:
        return False
    checkpoint()
    return reduces_to_zero(numer, rels)


def settled(entry) -> bool:
    """Whether an entry is a non-finite number or an expression free of infinities and NaN.

    An expression such as `-oo*x` or `exp(x - oo) + nan*y` is not settled: its value
    under float64 depends on signs and zeros SymPy does not track, so nothing about
    it is concluded.
    """
    entry = sympy.sympify(entry)
    if entry.is_number:
        return True
    return not _facts(entry).unsettling


def _non_finite_number(entry: sympy.Expr) -> bool:
    return entry.is_number and (entry in _NON_FINITE or entry.has(sympy.I) or entry.has(sympy.AccumBounds))


def same_entry(a, b) -> bool:
    """Exactly equal under float64 semantics: the same non-finite value (NaN counts as equal to
    NaN, complex infinity or an imaginary part as NaN), or finite and identically equal.
    False means not shown, never "different"."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    if not (settled(a) and settled(b)):
        return False
    if _non_finite_number(a) or _non_finite_number(b):
        def key(x):
            return x if x in (sympy.oo, -sympy.oo) else sympy.nan if _non_finite_number(x) else None
        return key(a) is not None and key(a) == key(b)
    fa, fb = _facts(a), _facts(b)
    return _zero_test(a - b, fa.symbols | fb.symbols, fa.cases or fb.cases)


_EXTREMES = (sympy.Max, sympy.Min)


def shared_xreplace(mapping: Mapping, known: Iterable[sympy.Basic] = ()) -> Callable[[sympy.Basic], sympy.Basic]:
    """A function giving `x.xreplace(mapping)` for many x that share subtrees (the entries of one
    tensor share its softmax denominators and projections): each distinct subtree is rebuilt
    once, where `xreplace` rebuilds it at every occurrence.

    A max or min whose new arguments are those of a max or min in `known` is that expression
    itself: SymPy keeps `e.func(*e.args) == e`, and building a Max compares every pair of its
    arguments symbolically (a permutation of the rows maps each row's max to another row's)."""
    memo: dict = dict(mapping)
    extremes = {(node.func, frozenset(node.args)): node
                for expr in known for node in _subtrees(expr) if isinstance(node, _EXTREMES)}

    def replace(node: sympy.Basic) -> sympy.Basic:
        found = memo.get(node)
        if found is not None:
            return found
        if node.args:
            args = tuple(replace(arg) for arg in node.args)
            if any(new is not old for new, old in zip(args, node.args)):
                found = extremes.get((node.func, frozenset(args))) if isinstance(node, _EXTREMES) else None
                if found is None:
                    found = node.func(*args)
            else:
                found = node
        else:
            found = node
        memo[node] = found
        return found

    return replace


def entry_diff(expr: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    """sympy.diff, with the product rule written out for the sums of products that matrix
    products and softmax write.

    Each term is differentiated factor by factor (the Leibniz rule); a factor that is `sym`
    itself has derivative 1, any other factor that contains `sym` goes to sympy.diff,
    memoized, since a softmax row's denominator is a factor of every entry of the row.
    """
    out = []
    for term in sympy.Add.make_args(expr):
        if sym not in _symbols_of(term):
            continue
        factors = sympy.Mul.make_args(term)
        for k, factor in enumerate(factors):
            if factor == sym:
                out.append(sympy.Mul(*factors[:k], *factors[k + 1:]))
            elif sym in _symbols_of(factor):
                out.append(sympy.Mul(*factors[:k], _factor_diff(factor, sym), *factors[k + 1:]))
    return sympy.Add(*out)


def extreme_diff(entry: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    """d max(x_1, ..., x_n) / d x_k (or min) with the gradient shared equally among tied entries
    (torch.amax's convention, the one the derivation states): [x_k == M] / #{l : x_l == M}, M the
    max, as Piecewise terms. Only for a Max or Min of distinct symbols (the entries of one tensor's
    line, so none was merged or dropped); anything else goes to `entry_diff` (SymPy's Heaviside)."""
    if not (isinstance(entry, (sympy.Max, sympy.Min)) and sym in entry.args
            and all(a.is_Symbol for a in entry.args)):
        return entry_diff(entry, sym)
    tied = [sympy.Piecewise((1, sympy.Eq(a, entry)), (0, True)) for a in entry.args]
    return sympy.Piecewise((1 / sympy.Add(*tied), sympy.Eq(sym, entry)), (0, True))


@functools.lru_cache(maxsize=65536)
def _symbols_of(term: sympy.Expr) -> frozenset:
    """The free symbols of a term, kept: `entry_diff` asks once per symbol of the entry."""
    return frozenset(free_symbols(term))


@functools.lru_cache(maxsize=16384)
def _factor_diff(factor: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    if factor.is_Pow and factor.exp.is_Integer:
        # SymPy's own power rule (Pow._eval_derivative) with the d(exponent) * log(base) term,
        # which is 0 here, left out: building log(base) of a softmax denominator costs SymPy
        # many assumption queries. The result is the very expression sympy.diff returns.
        return factor * (entry_diff(factor.base, sym) * factor.exp / factor.base)
    if factor.func is sympy.exp:
        # exp(u)' = exp(u) u' (Function._eval_derivative's product): u, a score, is a sum of
        # products that entry_diff takes term by term where sympy.diff asks assumptions of each
        return factor * entry_diff(factor.args[0], sym)
    if factor.is_Add:
        return entry_diff(factor, sym)
    return sympy.diff(factor, sym)
