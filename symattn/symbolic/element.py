"""The element level: explicit SymPy entries at concrete sizes, exact gradients.

Contract: `ElementModel(spec)` holds, at the spec's sizes,

- `leaf[X]`: a real symbol per entry of every input and param (`X_{1,2}`,
  `W^{q}_{2,1}`, 1-based as people write them);
- `slot[T]`: a symbol per entry of every defined tensor, and `local[T]`: its
  entries written in the slots of the tensors its definition reads (softmax
  with exp, masks with -oo giving exactly 0 weight);
- `upstream[T]`: a symbol per entry of grad(T) (`\\bar{O}_{1,1}`);
- `ground_truth(T)`: dL/dT entry by entry, by the chain rule node by node:
  grad(T)[t] = sum over consumers C, entries c of grad(C)[c] * d local[C][c] / d slot[T][t],
  each derivative taken by `sympy.diff` on the small local formula.

`identical(a, b)` decides exact equality of two arrays of entries: it tries
the slots as they are, then unfolds gradients and definitions one tensor at
a time, and at each stage replaces every function application (exp, tanh,
...) by an independent symbol and tests the rational function for zero, so
"identical" is an exact proof at these sizes. It never claims a difference;
`evaluate_at` supplies concrete values for counterexamples.

What "equal" means (the same everywhere in symattn, see `symattn.symbolic.finiteness`):
equal at every point of the domain (finite real values of every input, param
and upstream gradient) under IEEE float64 semantics, NaN and infinities
included, two entries being the same non-finite value counting as equal;
rounding and overflow are not modelled. The element level honours it so:

- a slot symbol stands for a finite real, so only tensors that the shared
  static analysis classifies FINITE get slots that may stay symbols; a tensor
  that may be -inf (a mask, scores plus a mask) is always replaced by its
  exact entries (`forward`: -inf as SymPy's -oo, a fully masked softmax row
  as 0, the generated code's convention) before two entries are compared;
- an entry that still holds an infinity or NaN inside an expression after
  that is not settled: it is never cancelled (SymPy would say -oo*x - -oo*x
  is 0), and the identity is not proved;
- values that may be NaN or +-inf for finite inputs (`log`, `sqrt`, division
  by a tensor, and what reads them) are never compared here at all: SymPy
  already rewrote exp(log(x)) to x and x/x to 1 when it built them. The
  caller (`symattn.prove.claims`) asks `Finiteness.deep` first.

An output that other tensors read has two gradients: `upstream[O]` is its
upstream gradient grad(O) (what a claim's `grad(O)` means), and the chain
rule into its definition uses the sum of that and every other path (`adjoint`).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable, Mapping

import mpmath
import numpy as np
import sympy
from sympy.functions.elementary.piecewise import ExprCondPair

from .. import progress
from ..ir import typed as t
from ..budget import checkpoint
from ..errors import SizeGuardError
from .evaluate import SYMBOLIC, Evaluator
from .finiteness import FINITE, Finiteness
from .polyzero import expands_to_zero

__all__ = ["ElementModel", "symbol_name", "guard", "zero_test", "same_entry", "settled", "shared_xreplace",
           "ELEMENT_BUDGET"]

def symbol_name(tensor: str, index: tuple[int, ...], grad: bool = False) -> str:
    """`X_{1,2}`, `W^{q}_{2,1}`, `\\bar{O}_{1,1}`: 1-based, LaTeX-friendly."""
    base, _, sup = tensor.partition("_")
    head = f"{base}^{{{sup}}}" if sup and base else tensor
    if grad:
        head = f"\\bar{{{head}}}"
    return f"{head}_{{{','.join(str(i + 1) for i in index)}}}" if index else head


def _symbols(tensor: str, shape: tuple[int, ...], grad: bool = False) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape) if shape else [()]:
        out[index] = sympy.Symbol(symbol_name(tensor, index, grad), real=True)
    return out


# Element-level work grows like (entries of every tensor) x (the largest dim):
# about 5,000 for self_attention at N = d = d_k = 8 (seconds); above the budget
# it takes minutes and is refused unless forced.
ELEMENT_BUDGET = 12_000


def cost(spec: t.TypedSpec) -> int:
    """A rough measure of element-level work: total entries times the largest dim."""
    entries = sum(math.prod(spec.concrete_shape(info.shape)) for info in spec.tensors.values())
    return entries * max(spec.sizes.values(), default=1)


def guard(spec: t.TypedSpec, force: bool = False) -> None:
    """Refuse element-level work that would take minutes, naming a size that works."""
    work = cost(spec)
    if force or work <= ELEMENT_BUDGET:
        return
    sizes = dict(spec.sizes)
    smaller = dict(sizes)
    while True:
        biggest = max(smaller, key=smaller.get)
        if smaller[biggest] <= 1:
            break
        smaller[biggest] = max(1, smaller[biggest] // 2)
        trial = t.TypedSpec(spec.name, spec.filename, spec.source, spec.dims, smaller, spec.tensors,
                            spec.outputs, spec.checks)
        try:
            if cost(trial) <= ELEMENT_BUDGET:
                break
        except (TypeError, ValueError):
            break
    shown = " ".join(f"--dim {k}={v}" for k, v in smaller.items() if v != sizes[k])
    now = ", ".join(f"{k}={v}" for k, v in sizes.items())
    raise SizeGuardError(f"element-level work at {now} would take minutes (size measure {work:,}, budget "
                         f"{ELEMENT_BUDGET:,}); try {shown}, or pass --force to run it anyway")


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
    is written through exp first (its argument is finite here), so it meets sigmoid. The
    same application is the same symbol in every call (see _ATOMS).
    """
    if len(_ATOMIZED) > _ATOM_CACHE:
        _ATOMS.clear()
        _ATOMIZED.clear()
    atoms, done = _ATOMS, _ATOMIZED

    def atom(node: sympy.Expr, positive: bool = False) -> sympy.Dummy:
        if node not in atoms:
            atoms[node] = sympy.Dummy(positive=positive)
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
        if isinstance(node, sympy.exp):
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


def _mp_log(x):
    """log with float64's answers at the edges: -inf at 0, NaN below (not a complex number)."""
    if mpmath.isnan(x) or x < 0:
        return mpmath.nan
    return -mpmath.inf if x == 0 else mpmath.log(x)


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


_MP_FUNCS = {
    sympy.exp: mpmath.exp, sympy.log: _mp_log, sympy.tanh: mpmath.tanh, sympy.sin: mpmath.sin,
    sympy.cos: mpmath.cos, sympy.Abs: abs, sympy.sign: mpmath.sign,
}
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


def _mp_value(expr: sympy.Expr, subs: dict, memo: dict):
    """expr at a point, in mpmath at the working precision; shared subtrees evaluated once."""
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
        elif type(node) in _MP_FUNCS:
            memo[node] = _mp_real(_MP_FUNCS[type(node)](args[0]))
        else:
            memo[node] = None
    return memo[expr]


def _numerically_nonzero(expr: sympy.Expr, rng: np.random.Generator) -> bool:
    """True if `expr` is clearly nonzero at a random point (so it is not identically zero)."""
    with mpmath.workdps(40):
        subs = {}
        for sym in expr.free_symbols:
            if sym.is_positive:
                subs[sym] = mpmath.mpf(int(rng.integers(50, 150))) / 100
            else:
                subs[sym] = mpmath.mpf(int(rng.integers(-100, 100))) / 97
        memo: dict = {}
        try:
            total = _mp_value(expr, subs, memo)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return False
        if total is None or not mpmath.isfinite(total):
            return False
        terms = [memo.get(term) for term in sympy.Add.make_args(expr)]
        if any(v is None for v in terms):
            return False
        scale = max(abs(v) for v in terms)
        # At 40 digits a true zero leaves at most ~1e-35 of the largest term.
        return abs(total) > mpmath.mpf("1e-25") * max(scale, mpmath.mpf("1e-30"))


_MAX_CONDITIONS = 4


def zero_test(expr: sympy.Expr) -> bool:
    """True if `expr` is identically zero as a rational function of its symbols and function atoms.

    Cheapest first: a random point that shows it nonzero ends the test; then
    expansion in a sparse polynomial ring (`symattn.symbolic.polyzero`), then SymPy's
    expansion with denominators kept whole; then the common denominator.
    """
    if expr == 0:
        return True
    expr = sympy.sympify(expr)
    if expr.has(sympy.Piecewise, sympy.sign):  # where / relu / abs: zero if zero in every branch
        if expr.has(sympy.sign):
            expr = expr.rewrite(sympy.Piecewise)
        # Split into cases: every truth assignment of the k conditions picks one branch of each
        # piece (2^k cases, so only for a few conditions; beyond that the pieces stay atoms).
        conditions = list(expr.atoms(sympy.core.relational.Relational))
        if len(conditions) <= _MAX_CONDITIONS:
            cases = itertools.product((sympy.true, sympy.false), repeat=len(conditions))
            return all(zero_test(expr.xreplace(dict(zip(conditions, case)))) for case in cases)
    checkpoint()
    atomized = _atomize(expr)
    if atomized.is_number:
        return atomized.equals(0) is True
    if _numerically_nonzero(atomized, np.random.default_rng(len(atomized.free_symbols))):
        return False
    if expands_to_zero(atomized):  # exact, in a sparse polynomial ring: ~10x faster than expand
        return True
    if sympy.expand(atomized) == 0:
        return True
    checkpoint()
    numer, _ = sympy.fraction(sympy.together(atomized))
    return sympy.expand(numer) == 0


_NON_FINITE = (sympy.oo, -sympy.oo, sympy.nan, sympy.zoo)


def settled(entry) -> bool:
    """Whether an entry is a non-finite number or an expression free of infinities and NaN.

    An expression such as `-oo*x` or `exp(x - oo) + nan*y` is not settled: its value
    under float64 depends on signs and zeros SymPy does not track, so nothing about
    it is concluded.
    """
    entry = sympy.sympify(entry)
    if entry.is_number:
        return True
    return not _holds_non_finite(entry)


_UNSETTLING = frozenset((*_NON_FINITE, sympy.I))


def _holds_non_finite(entry: sympy.Expr) -> bool:
    """entry.has(oo, -oo, nan, zoo, I, AccumBounds) in one walk over shared subtrees
    (`has` walks the whole tree once per pattern)."""
    seen = {entry}
    stack = [entry]
    while stack:
        node = stack.pop()
        if node in _UNSETTLING or isinstance(node, sympy.AccumBounds):
            return True
        for arg in node.args:
            if arg not in seen:
                seen.add(arg)
                stack.append(arg)
    return False


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
    return zero_test(a - b)


def shared_xreplace(mapping: Mapping) -> Callable[[sympy.Basic], sympy.Basic]:
    """A function giving `x.xreplace(mapping)` for many x that share subtrees (the entries of one
    tensor share its softmax denominators and projections): each distinct subtree is rebuilt
    once, where `xreplace` rebuilds it at every occurrence."""
    memo: dict = dict(mapping)

    def replace(node: sympy.Basic) -> sympy.Basic:
        found = memo.get(node)
        if found is not None:
            return found
        if node.args:
            args = tuple(replace(arg) for arg in node.args)
            found = node.func(*args) if any(new is not old for new, old in zip(args, node.args)) else node
        else:
            found = node
        memo[node] = found
        return found

    return replace


def _diff(expr: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    """sympy.diff, with the product rule written out for the sums of products that matrix
    products and softmax write.

    Each term is differentiated factor by factor (the Leibniz rule); a factor that is `sym`
    itself has derivative 1, any other factor that contains `sym` goes to sympy.diff,
    memoized, since a softmax row's denominator is a factor of every entry of the row.
    """
    out = []
    for term in sympy.Add.make_args(expr):
        if sym not in term.free_symbols:
            continue
        factors = sympy.Mul.make_args(term)
        for k, factor in enumerate(factors):
            if factor == sym:
                out.append(sympy.Mul(*factors[:k], *factors[k + 1:]))
            elif sym in factor.free_symbols:
                out.append(sympy.Mul(*factors[:k], _factor_diff(factor, sym), *factors[k + 1:]))
    return sympy.Add(*out)


@functools.lru_cache(maxsize=16384)
def _factor_diff(factor: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    if factor.is_Pow and factor.exp.is_Integer:
        # SymPy's own power rule (Pow._eval_derivative) with the d(exponent) * log(base) term,
        # which is 0 here, left out: building log(base) of a softmax denominator costs SymPy
        # many assumption queries. The result is the very expression sympy.diff returns.
        return factor * (_diff(factor.base, sym) * factor.exp / factor.base)
    return sympy.diff(factor, sym)


class ElementModel:
    """Explicit entries of every tensor of a spec at its concrete sizes."""

    def __init__(self, spec: t.TypedSpec, force: bool = False, progress: bool | None = None) -> None:
        guard(spec, force)
        self.spec = spec
        self.progress = progress is not False  # report steps to symattn.progress (silent outside a task)
        self.leaf = {n: _symbols(n, spec.concrete_shape(spec.tensors[n].shape)) for n in spec.leaves}
        self.slot = {n: _symbols(n, spec.concrete_shape(i.shape)) for n, i in spec.tensors.items()
                     if i.expr is not None}
        self.upstream = {n: _symbols(n, spec.concrete_shape(i.shape), grad=True) for n, i in spec.tensors.items()}
        # Tensors that may be -inf or NaN never stand as finite slot symbols in a comparison.
        finiteness = Finiteness(spec, {n: i.expr for n, i in spec.tensors.items() if i.expr is not None})
        self.risky = tuple(n for n in self.slot if finiteness.tensor(n) != FINITE)
        # local: entries in the slots of the tensors a definition reads (for the chain rule);
        # forward: the same with every risky tensor replaced by its exact entries (for values).
        self.local: dict[str, np.ndarray] = {}
        self.forward: dict[str, np.ndarray] = {}
        slotted = Evaluator(spec, SYMBOLIC)
        slotted.values = {**self.leaf, **self.slot}
        exact = Evaluator(spec, SYMBOLIC)
        exact.values = dict(slotted.values)
        for name, info in spec.tensors.items():
            if info.expr is None:
                continue
            shape = spec.concrete_shape(info.shape)
            checkpoint()
            self.local[name] = np.asarray(slotted.evaluate(info.expr), dtype=object).reshape(shape)
            reads_risky = any(r in self.risky for r in t.tensors_read(info.expr))
            self.forward[name] = (np.asarray(exact.evaluate(info.expr), dtype=object).reshape(shape)
                                  if reads_risky else self.local[name])
            if name in self.risky:
                exact.values[name] = self.forward[name]
        self.exact_values = {s: v for n in self.risky for s, v in zip(self.slot[n].flat, self.forward[n].flat)}
        self.consumers = {n: [c for c, e in self.local.items() if self._reads(e, n)] for n in spec.tensors}
        self.live = set(spec.outputs)  # tensors with a path to an output
        for name in reversed(list(spec.tensors)):
            if any(c in self.live for c in self.consumers[name]):
                self.live.add(name)
        self._truth: dict[str, np.ndarray] = {}
        self._adjoint: dict[str, np.ndarray] = {}

    def _reads(self, entries: np.ndarray, name: str) -> bool:
        own = set(self.values_of(name).flat)
        return any(own & e.free_symbols for e in entries.flat if isinstance(e, sympy.Basic))

    def values_of(self, name: str) -> np.ndarray:
        """The symbols standing for a tensor's entries (leaf symbols or slots)."""
        return self.leaf[name] if name in self.leaf else self.slot[name]

    def _tick(self, what: str) -> None:
        checkpoint()
        if self.progress:
            progress.detail(f"element level: {what}")

    # --- exact gradients ----------------------------------------------------------------

    def ground_truth(self, name: str) -> np.ndarray:
        """grad(T) entry by entry, in the gradient symbols of T's consumers and forward slots.

        For an output this is its upstream gradient grad(O), as claims write it; see `adjoint`.
        """
        if name in self.spec.outputs:
            return self.upstream[name]
        if name not in self._truth:
            self._truth[name] = self._paths(name)
        return self._truth[name]

    def adjoint(self, name: str) -> np.ndarray:
        """dL/dT: what the chain rule carries into T's definition. For an output that other
        tensors read, its upstream gradient plus every path through them."""
        if name not in self.spec.outputs:
            if name not in self.live:  # no path to an output: L does not depend on it
                return np.zeros(self.upstream[name].shape, dtype=object) + sympy.Integer(0)
            return self.upstream[name]
        if name not in self._adjoint:
            paths = self._paths(name) if self.consumers[name] else None
            self._adjoint[name] = self.upstream[name] if paths is None else self.upstream[name] + paths
        return self._adjoint[name]

    def _paths(self, name: str) -> np.ndarray:
        """Sum over consumers C of T, entries c: grad(C)[c] * d local[C][c] / d slot[T]."""
        shape = self.spec.concrete_shape(self.spec.tensors[name].shape)
        result = np.zeros(shape, dtype=object) if shape else np.array(sympy.Integer(0), dtype=object)
        own = self.values_of(name)
        position = {s: idx for idx, s in np.ndenumerate(own)}
        for consumer in self.consumers[name]:
            self._tick(f"d{consumer}/d{name}")
            bars = np.broadcast_to(np.asarray(self.adjoint(consumer), dtype=object), self.local[consumer].shape)
            for c_index, entry in np.ndenumerate(self.local[consumer]):
                if not isinstance(entry, sympy.Basic):
                    continue
                for sym in entry.free_symbols & position.keys():
                    result[position[sym]] += bars[c_index] * _diff(entry, sym)
        return np.asarray(result, dtype=object)

    # --- exact comparison ------------------------------------------------------------------

    def _grad_unfolding(self) -> list[tuple[dict, str]]:
        """Substitutions grad(T) -> ground truth, earliest tensor first (outputs stay symbols)."""
        out = []
        for name in self.spec.tensors:
            if name in self.spec.outputs:
                continue
            truth = self.ground_truth(name)
            out.append(({s: v for s, v in zip(self.upstream[name].flat, truth.flat)}, f"grad({name})"))
        return out

    def _forward_unfolding(self) -> list[tuple[dict, str]]:
        """Substitutions slot -> local formula, latest tensor first (risky tensors are always
        substituted by their exact entries, so they are not a stage of their own)."""
        return [({s: v for s, v in zip(self.slot[n].flat, self.forward[n].flat)}, n)
                for n in reversed(list(self.local)) if n not in self.risky]

    def _exact(self, entry):
        """An entry with every risky slot replaced by its exact value (-oo where masked)."""
        entry = sympy.sympify(entry)
        if self.exact_values and entry.free_symbols & self.exact_values.keys():
            return entry.xreplace(self.exact_values)
        return entry

    def identical(self, a: np.ndarray, b: np.ndarray, unfold_grads: bool = True) -> tuple[bool, list[str]]:
        """(True, unfolded) if a == b entry by entry, exactly, under float64 semantics
        (see the module docstring); (False, ...) if not shown."""
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        unfolded: list[str] = []
        stages = (self._grad_unfolding() if unfold_grads else []) + self._forward_unfolding()
        pending = [(self._exact(x), self._exact(y)) for x, y in zip(a.flat, b.flat)]
        pending = [(x, y) for x, y in pending if not same_entry(x, y)]
        for mapping, label in stages:
            if not pending:
                break
            keys = set(mapping)
            if not any(keys & (x.free_symbols | y.free_symbols) for x, y in pending):
                continue
            self._tick(f"unfolding {label}")
            unfolded.append(label)
            replace = shared_xreplace(mapping)
            pending = [(self._exact(replace(x)), self._exact(replace(y))) for x, y in pending]
            pending = [(x, y) for x, y in pending if not same_entry(x, y)]
        return (not pending), unfolded

    # --- concrete values -------------------------------------------------------------------

    def point(self, values: Mapping[str, np.ndarray], upstream: Mapping[str, np.ndarray],
              digits: int = 30) -> dict:
        """Every slot and gradient symbol at concrete inputs, in mpmath at `digits` digits,
        with float64's answers for -inf, NaN and division by zero.

        Forward slots are computed in definition order from the exact formulas,
        then gradient symbols in reverse order from the exact chain rule.
        """
        with mpmath.workdps(digits + 10):
            subs: dict = {}
            for name, array in values.items():
                for sym, v in zip(self.leaf[name].flat, np.asarray(array, dtype=object).flat):
                    subs[sym] = mpmath.mpf(sympy.Rational(v).p) / sympy.Rational(v).q
            for name, array in upstream.items():
                for sym, v in zip(self.upstream[name].flat, np.asarray(array, dtype=object).flat):
                    subs[sym] = mpmath.mpf(sympy.Rational(v).p) / sympy.Rational(v).q
            for name, entries in self.forward.items():
                memo: dict = {}
                for sym, entry in zip(self.slot[name].flat, entries.flat):
                    subs[sym] = _mp_value(sympy.sympify(entry), subs, memo)
            for name in reversed(list(self.spec.tensors)):
                if name in self.spec.outputs:
                    continue
                memo = {}
                for sym, entry in zip(self.upstream[name].flat, self.ground_truth(name).flat):
                    subs[sym] = _mp_value(sympy.sympify(entry), subs, memo)
        return subs

    def evaluate_at(self, entries: np.ndarray, subs: Mapping, digits: int = 30) -> np.ndarray:
        """Entries (written in any slots and gradient symbols) at a point from `point`."""
        out = np.asarray(entries, dtype=object)
        with mpmath.workdps(digits + 10):
            memo: dict = {}
            values = [_mp_value(sympy.sympify(e), dict(subs), memo) for e in out.flat]
        return np.array(values, dtype=object).reshape(out.shape)
