"""Exact comparison of values that may be NaN or infinite, case by case under float64 semantics.

Contract: `compare_by_cases(spec, lhs, rhs, gradients)` decides whether two typed
nodes are equal entry by entry at the spec's sizes, at every point of the domain
(finite real inputs, params and upstream gradients) under IEEE float64 semantics,
NaN and infinities included, rounding and overflow aside. It returns a
`CaseProof`; `proved` is True only for an exact argument, and False means "not
shown", with a reason. `grad(T)` is what the derived matrix-level formulas
(`gradients`, name -> node or None) compute, as in the float64 evaluator and the
generated code.

How. Both sides are evaluated from the spec's nodes (no slots: every tensor by its
definition) with a backend whose entries are `Value`s: a finite SymPy expression,
NaN, an infinity (of either sign), -inf, "an infinity or NaN", or unknown. Every
operation that can leave the finite reals (a division by an expression, sqrt, log,
a power other than a natural one) is *guarded*: it is evaluated assuming its
argument is nonzero (for sqrt and rational powers also >= 0, which must be shown
from the argument's structure, `symattn.symbolic.signs`; otherwise the value is
unknown), a sqrt becoming the positive atom r with r^2 = s of
`symattn.symbolic.relations`. Each value records the guards it rests on. The
places where a guard's argument is 0 are its *events* (`signs.zero_events`: for
sum(Q * Q, axis=-1), "every entry of the row is 0"); where they cannot be told,
the value is unknown. An entry pair is then settled

- in the region where every guard it rests on holds: both sides NaN, both -inf,
  or both finite and `exact.zero_test` shows the difference is 0 (modulo the
  atoms' relations);
- and, recursively, for each event of those guards: the same comparison with the
  event's symbols set to 0, re-evaluated from the nodes, so that 0 / 0 is NaN,
  sqrt(0) is 0 and 1 / 0 an infinity, exactly as float64 has them.

The regions cover every point (a point where some guard fails lies in an event of
the innermost failing one), and an event sets at least one more symbol to 0, so
the recursion ends. Masks (-inf) are followed through exp, softmax and logsumexp;
anything the lattice cannot follow (exp of an infinity of unknown sign, a softmax
row holding NaN or +inf, which the float64 evaluator makes a NaN row) is unknown, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import sympy

from ..budget import checkpoint
from ..ir import typed as t
from ..ir.functions import FUNCTIONS, OPERATIONS
from .element import exact_integers, symbol_name
from .ieee_values import (FINITE, INF, INFINITE, NAN, NEG_INF, NONFINITE, UNKNOWN, Guard, Value, add, constant, finite,
                          multiply, negate, wrap)
from .evaluate import Evaluator, reduce_lines
from .exact import settled, zero_test
from .lattice import lattice
from .relations import root_atom
from .signs import nonnegative, positive, zero_events

__all__ = ["Value", "Guard", "CaseProof", "compare_by_cases", "MAX_CASES"]

MAX_CASES = 128     # regions (sets of symbols set to 0) evaluated per claim (QK-norm backward at N = 4: 80)
MAX_DENOMINATOR = 12  # x ^ (p/q) with a larger q is not followed


# The limits at -inf of the functions that absorb it (a mask through exp is a weight of 0).
_NAN_AT_INFINITY = {"sin", "cos"}  # sin(+-inf) is NaN
_RELATIONS = {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "==": sympy.Eq, "!=": sympy.Ne}


class _Guarded:
    """The Evaluator backend of `Value`s (see the module docstring); `guards` holds every guard
    met, `problems` why a value became unknown."""

    exact = True

    def __init__(self) -> None:
        self.guards: dict[tuple[str, sympy.Expr], Guard] = {}
        self.problems: list[str] = []

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def _guard(self, what: str, argument: sympy.Expr, shown: str) -> Guard | None:
        """The guard of an operation on `argument` (None when where it is 0 cannot be told)."""
        key = (what, argument)
        if key not in self.guards:
            events = zero_events(argument)
            if events is None or frozenset() in events:
                self._problem(f"where {argument} is 0 cannot be told ({shown})")
                return None
            self.guards[key] = Guard(what, argument, tuple(events))
        return self.guards[key]

    # --- the Evaluator's interface -------------------------------------------------
    def scalar(self, value):
        return constant(value)

    def array(self, values):
        return np.frompyfunc(wrap, 1, 1)(np.asarray(values, dtype=object))

    def unary(self, fn, x):
        return self._map(lambda u: self._unary(fn, wrap(u)), x)

    def binary(self, op, a, b):
        rule = {"add": add, "sub": lambda u, v: add(u, negate(v)), "mul": multiply, "div": self._divide,
                "pow": self._pow}[op]
        return self._map2(lambda u, v: rule(wrap(u), wrap(v)), a, b)

    def compare(self, op, a, b):
        return self._map2(lambda u, v: self._compare(op, wrap(u), wrap(v)), a, b)

    def number(self, entry):
        entry = wrap(entry)
        return entry.expr if entry.kind == FINITE else sympy.nan

    def logical(self, op, *args):
        join = {"and": sympy.And, "or": sympy.Or, "not": sympy.Not}[op]

        def combine(*conds):
            conds = [wrap(c) for c in conds]
            deps = frozenset().union(*(c.deps for c in conds))
            if any(c.kind != FINITE for c in conds):
                return Value(UNKNOWN, deps=deps)
            return Value(FINITE, join(*(c.expr for c in conds)), deps)
        return np.frompyfunc(combine, len(args), 1)(*(np.asarray(a, dtype=object) for a in args))

    def apply(self, fn, *args):
        """min, max, clamp, // and % of finite values (divisors are nonzero numbers); NaN propagates
        (through min, max and clamp as in NumPy); an infinity is not followed."""
        record = OPERATIONS[fn]

        def one(*values):
            values = [wrap(v) for v in values]
            deps = frozenset().union(*(v.deps for v in values))
            if any(v.kind == NAN for v in values):
                return Value(NAN, deps=deps)
            if all(v.kind == FINITE for v in values):
                return Value(FINITE, record.exact(*(v.expr for v in values)), deps)
            self._problem(f"{fn} of an entry that may be infinite")
            return Value(UNKNOWN, deps=deps)
        return np.frompyfunc(one, len(args), 1)(*(np.asarray(a, dtype=object) for a in args))

    def where(self, cond, a, b):
        return np.frompyfunc(lambda c, u, v: self._where(wrap(c), wrap(u), wrap(v)), 3, 1)(
            np.asarray(cond, dtype=object), np.asarray(a, dtype=object), np.asarray(b, dtype=object))

    def softmax(self, x, axis):
        e = self.unary("exp", x)
        total = np.sum(np.asarray(e, dtype=object), axis=axis, keepdims=True)
        return self._map2(self._weight, e, total)

    def logsumexp(self, x, axis):
        e = self.unary("exp", x)
        total = np.sum(np.asarray(e, dtype=object), axis=axis, keepdims=True)
        return self._map(self._log_of_total, total)

    def extreme(self, kind, x, axis):
        """max or min of a line of finite values; a line with an infinity or NaN is not modelled."""
        fn = sympy.Max if kind == "max" else sympy.Min

        def line(values):
            values = [wrap(v) for v in values]
            deps = frozenset().union(*(v.deps for v in values))
            if all(v.kind == FINITE for v in values):
                return Value(FINITE, lattice(fn, [v.expr for v in values]), deps)
            self._problem(f"{kind} of a line with an entry that may be infinite or NaN")
            return Value(UNKNOWN, deps=deps)

        return reduce_lines(x, axis, line)

    @staticmethod
    def _map(func, x):
        if np.ndim(x) == 0:
            return func(x.item() if isinstance(x, np.ndarray) else x)
        return np.frompyfunc(func, 1, 1)(np.asarray(x, dtype=object))

    @staticmethod
    def _map2(func, a, b):
        if np.ndim(a) == 0 and np.ndim(b) == 0:
            return func(a.item() if isinstance(a, np.ndarray) else a, b.item() if isinstance(b, np.ndarray) else b)
        return np.frompyfunc(func, 2, 1)(np.asarray(a, dtype=object), np.asarray(b, dtype=object))

    # --- rules -------------------------------------------------------------------------
    def _unary(self, fn: str, v: Value) -> Value:
        if fn == "neg":
            return negate(v)
        if v.kind == NAN:
            return Value(NAN, deps=v.deps)  # every builtin maps NaN to NaN
        if fn == "sqrt":
            return self._power(v, sympy.Rational(1, 2), "sqrt")
        if fn == "log":
            return self._log(v)
        function = FUNCTIONS.get(fn)
        if v.kind == FINITE and function is not None and function.total:
            return Value(FINITE, function.exact(v.expr), v.deps)
        if v.kind == NEG_INF and function is not None and function.absorbs_minus_inf:  # exp(-inf) = 0, ...
            return finite(function.exact(-sympy.oo), v.deps)
        if v.kind in INFINITE and fn in _NAN_AT_INFINITY:
            return Value(NAN, deps=v.deps)
        if v.kind in INFINITE and fn == "abs":
            return Value(INF if v.kind == NEG_INF else v.kind, deps=v.deps)
        if v.kind in INFINITE:
            self._problem(f"{fn} of an infinity whose sign is not followed")
        return Value(UNKNOWN, deps=v.deps)

    def _log(self, v: Value) -> Value:
        if v.kind == NEG_INF:
            return Value(NAN, deps=v.deps)
        if v.kind in (INF, NONFINITE):
            return Value(NONFINITE, deps=v.deps)  # log(inf) = inf, log(-inf) = NaN
        if v.kind != FINITE:
            return Value(UNKNOWN, deps=v.deps)
        e = v.expr
        if e.is_number:
            if e == 0:
                return Value(NEG_INF, deps=v.deps)
            if e.is_negative:
                return Value(NAN, deps=v.deps)
            return Value(FINITE, sympy.log(e), v.deps) if e.is_positive else Value(UNKNOWN, deps=v.deps)
        if positive(e):
            return Value(FINITE, sympy.log(e), v.deps)
        if not nonnegative(e):
            self._problem(f"log({e}): its argument is not shown to be >= 0")
            return Value(UNKNOWN, deps=v.deps)
        guard = self._guard("log", e, "the argument of log")
        if guard is None:
            return Value(UNKNOWN, deps=v.deps)
        return Value(FINITE, sympy.log(e), v.deps | {guard})  # e > 0 where the guard holds

    def _divide(self, a: Value, b: Value) -> Value:
        deps = a.deps | b.deps
        kinds = {a.kind, b.kind}
        if NAN in kinds:
            return Value(NAN, deps=deps)
        if UNKNOWN in kinds:
            return Value(UNKNOWN, deps=deps)
        if b.kind in (INF, NEG_INF):
            return finite(0, deps) if a.kind == FINITE else Value(NAN, deps=deps)  # x / inf = 0, inf / inf NaN
        if b.kind == NONFINITE:
            return Value(NAN, deps=deps) if a.kind != FINITE else Value(UNKNOWN, deps=deps)
        e = b.expr
        if e == 0:  # x / 0 is +-inf (the sign of 0 is not tracked), 0 / 0 is NaN
            if a.kind == FINITE:
                if a.expr == 0:
                    return Value(NAN, deps=deps)
                return Value(INF if a.expr.is_number and a.expr.is_zero is False else NONFINITE, deps=deps)
            return Value(INF if a.kind in (INF, NEG_INF) else NONFINITE, deps=deps)
        if e.is_number:
            if e.is_zero is not False:
                return Value(UNKNOWN, deps=deps)
            return multiply(a, finite(1 / e, deps))
        guard = self._guard("divisor", e, "a divisor")
        if guard is None:
            return Value(UNKNOWN, deps=deps)
        deps = deps | {guard}
        if a.kind == FINITE:
            return Value(FINITE, a.expr / e, deps)
        return Value(INF if a.kind in (INF, NEG_INF) else NONFINITE, deps=deps)  # inf / (x != 0)

    def _pow(self, a: Value, b: Value) -> Value:
        if b.kind != FINITE or not b.expr.is_number:
            return Value(UNKNOWN, deps=a.deps | b.deps)
        exponent = b.expr
        if not exponent.is_Rational:
            exponent = sympy.Rational(exponent) if exponent.is_Float else None
        if exponent is None or exponent.q > MAX_DENOMINATOR:
            return Value(UNKNOWN, deps=a.deps | b.deps)
        result = self._power(a, exponent, "a power")
        return Value(result.kind, result.expr, result.deps | b.deps)

    def _power(self, v: Value, exponent: sympy.Rational, what: str) -> Value:
        """v ** exponent as float64 has it (sqrt is exponent 1/2)."""
        deps = v.deps
        if exponent == 0:
            return finite(1, deps)  # pow(NaN, 0) is 1
        if v.kind == NAN:
            return Value(NAN, deps=deps)
        if v.kind == UNKNOWN:
            return Value(UNKNOWN, deps=deps)
        if v.kind in INFINITE:
            if not exponent.is_Integer:
                return Value(UNKNOWN, deps=deps)
            if exponent < 0:
                return finite(0, deps) if v.kind != NONFINITE else Value(UNKNOWN, deps=deps)
            return Value(INF if v.kind != NONFINITE else NONFINITE, deps=deps)
        e = v.expr
        if exponent.is_Integer and exponent > 0:
            return Value(FINITE, e ** exponent, deps)
        if e.is_number:
            if e == 0:
                return finite(0, deps) if exponent > 0 else Value(INF, deps=deps)
            if e.is_negative and not exponent.is_Integer:
                return Value(NAN, deps=deps)  # a negative base with a fractional exponent
            if e.is_zero is False and e.is_extended_real:
                return Value(FINITE, e ** exponent, deps)
            return Value(UNKNOWN, deps=deps)
        if exponent.is_Integer:  # a negative power: 1 / e ** n where e != 0
            guard = self._guard("divisor", e, "a negative power")
            if guard is None:
                return Value(UNKNOWN, deps=deps)
            return Value(FINITE, e ** exponent, deps | {guard})
        if not nonnegative(e):
            self._problem(f"{what} of {e}: its argument is not shown to be >= 0")
            return Value(UNKNOWN, deps=deps)
        if not positive(e):
            guard = self._guard("sqrt" if what == "sqrt" else "root", e, f"the argument of {what}")
            if guard is None:
                return Value(UNKNOWN, deps=deps)
            deps = deps | {guard}
        # e > 0 where the guard holds. SymPy's own rules for real bases first (sqrt(x^2) = |x|,
        # sqrt(exp(2 x)) = exp(x)); otherwise r = e^(1/q) > 0 with r^q = e.
        simple = e ** exponent
        if not any(n.is_Pow and not n.exp.is_Integer and not n.base.is_number
                   for n in sympy.preorder_traversal(simple)):
            return Value(FINITE, simple, deps)
        return Value(FINITE, root_atom(e, int(exponent.q)) ** int(exponent.p), deps)

    def _compare(self, op: str, a: Value, b: Value) -> Value:
        deps = a.deps | b.deps
        if NAN in (a.kind, b.kind):  # every comparison with NaN is false but !=
            return finite(sympy.true if op == "!=" else sympy.false, deps)
        if a.kind in (FINITE, NEG_INF) and b.kind in (FINITE, NEG_INF):
            left = a.expr if a.kind == FINITE else -sympy.oo
            right = b.expr if b.kind == FINITE else -sympy.oo
            return Value(FINITE, _RELATIONS[op](left, right), deps)
        return Value(UNKNOWN, deps=deps)

    @staticmethod
    def _where(c: Value, a: Value, b: Value) -> Value:
        deps = c.deps | a.deps | b.deps
        if c.kind != FINITE:
            return Value(UNKNOWN, deps=deps)
        if c.expr is sympy.true:
            return Value(a.kind, a.expr, deps)
        if c.expr is sympy.false:
            return Value(b.kind, b.expr, deps)
        if a.kind == b.kind == FINITE:
            return Value(FINITE, sympy.Piecewise((a.expr, c.expr), (b.expr, True)), deps)
        if a.kind == b.kind and a.kind in (NAN, NEG_INF):
            return Value(a.kind, deps=deps)
        return Value(UNKNOWN, deps=deps)

    @staticmethod
    def _weight(u, total) -> Value:
        """One softmax weight: exp(x) / (sum of exp over the row, > 0); a fully masked row is 0.
        A row holding NaN or +inf is unknown (the float64 evaluator makes such a row NaN)."""
        u, total = wrap(u), wrap(total)
        deps = u.deps | total.deps
        if u.kind != FINITE or total.kind != FINITE:
            return Value(UNKNOWN, deps=deps)
        if total.expr == 0:
            return finite(0, deps)
        return Value(FINITE, u.expr / total.expr, deps)

    @staticmethod
    def _log_of_total(total) -> Value:
        total = wrap(total)
        if total.kind != FINITE:
            return Value(UNKNOWN, deps=total.deps)
        if total.expr == 0:
            return Value(NEG_INF, deps=total.deps)
        return Value(FINITE, sympy.log(total.expr), total.deps)


# --- regions -----------------------------------------------------------------------------


@dataclass
class CaseProof:
    """The answer of `compare_by_cases`: `proved`, the number of regions compared (the whole
    domain, then each set of symbols set to 0 that some guard needed), the reason when not,
    and whether any operation was guarded at all (no divisor or sqrt argument that can be 0)."""

    proved: bool
    regions: int
    reason: str = ""
    zero_sets: list[frozenset] = field(default_factory=list)
    guarded: bool = True
    freed: tuple[str, ...] = ()  # intermediates compared as free tensors (`symattn.symbolic.element_cases`)


class _TooManyCases(Exception):
    pass


def _symbols(name: str, shape: tuple[int, ...], grad: bool = False) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape) if shape else [()]:
        out[index] = sympy.Symbol(symbol_name(name, index, grad), real=True)
    return out


def _where_zero(zero: frozenset) -> str:
    if not zero:
        return "where every divisor and every argument of sqrt and log is nonzero"
    return "where " + " = ".join(sorted(str(s) for s in zero)) + " = 0"


def _describe(v: Value) -> str:
    return {FINITE: "finite", NAN: "NaN", INF: "an infinity", NEG_INF: "-inf", NONFINITE: "an infinity or NaN",
            UNKNOWN: "not followed"}[v.kind]


def _same(a: Value, b: Value) -> bool:
    """Equal under float64 semantics in the whole region (False: not shown)."""
    if a.kind == b.kind and a.kind in (NAN, NEG_INF):
        return True
    if a.kind == b.kind == FINITE and isinstance(a.expr, sympy.Expr) and isinstance(b.expr, sympy.Expr):
        return settled(a.expr) and settled(b.expr) and zero_test(a.expr - b.expr)
    return False


class _Regions:
    """The two sides evaluated in each region (a set of symbols set to 0), and the recursion."""

    def __init__(self, spec: t.TypedSpec, lhs: t.Node, rhs: t.Node, shape: tuple[int, ...],
                 gradients: Mapping[str, t.Node | None], integers: Mapping) -> None:
        self.spec, self.lhs, self.rhs, self.shape, self.gradients = spec, lhs, rhs, shape, gradients
        self.leaf = {n: _symbols(n, spec.concrete_shape(spec.tensors[n].shape)) if n not in integers
                     else exact_integers(integers[n]) for n in spec.given}
        self.upstream = {n: _symbols(n, spec.concrete_shape(spec.tensors[n].shape), grad=True)
                         for n in spec.outputs}
        self.memo: dict[frozenset, tuple[np.ndarray, np.ndarray, _Guarded]] = {}
        self.done: dict[tuple, str | None] = {}

    def sides(self, zero: frozenset):
        if zero not in self.memo:
            if len(self.memo) >= MAX_CASES:
                raise _TooManyCases
            checkpoint()
            spec = self.spec
            backend = _Guarded()

            def entries(symbols):
                return np.frompyfunc(lambda s: finite(0 if s in zero else s), 1, 1)(symbols)

            ev = Evaluator(spec, backend)
            ev.run({n: entries(a) for n, a in self.leaf.items()}, {n: entries(a) for n, a in self.upstream.items()})
            for name in reversed(list(spec.tensors)):
                if name in spec.outputs or name not in self.gradients:
                    continue
                shape = spec.concrete_shape(spec.tensors[name].shape)
                expr = self.gradients[name]
                value = backend.array(np.zeros(shape, dtype=object)) if expr is None else ev.evaluate(expr)
                ev.grads[name] = np.broadcast_to(np.asarray(value, dtype=object), shape)
            left, right = (np.broadcast_to(backend.array(np.asarray(ev.evaluate(side), dtype=object)), self.shape)
                           for side in (self.lhs, self.rhs))
            self.memo[zero] = (left, right, backend)
        return self.memo[zero]

    def settle(self, index: tuple, zero: frozenset) -> str | None:
        """None when the entry pair is equal in the region `zero` and in every region its guards
        split off; otherwise why not."""
        key = (index, zero)
        if key in self.done:
            return self.done[key]
        left, right, backend = self.sides(zero)
        problems = backend.problems
        a, b = left[index], right[index]
        reason = None
        if not _same(a, b):
            where = f"at entry {list(index)}, {_where_zero(zero)}"
            if UNKNOWN in (a.kind, b.kind):
                shown = f" ({'; '.join(problems[:2])})" if problems else ""
                reason = f"{where}, a side could not be followed{shown}"
            elif a.kind == b.kind == FINITE:
                reason = f"{where}: the two sides are not shown equal"
            else:
                reason = f"{where}: the left side is {_describe(a)} and the right side {_describe(b)}"
        else:
            for guard in sorted(a.deps | b.deps, key=lambda g: (g.what, str(g.argument))):
                for event in guard.events:
                    if not event - zero:
                        reason = f"at entry {list(index)}, where {guard.argument} is 0 is not separated"
                    else:
                        reason = self.settle(index, zero | event)
                    if reason is not None:
                        break
                if reason is not None:
                    break
        self.done[key] = reason
        return reason


def compare_by_cases(spec: t.TypedSpec, lhs: t.Node, rhs: t.Node, shape: tuple[int, ...],
                     gradients: Mapping[str, t.Node | None], integers: Mapping | None = None) -> CaseProof:
    """Whether lhs == rhs entry by entry at the spec's sizes under float64 semantics (see the
    module docstring); `shape` is the claim's broadcast shape at these sizes, `gradients` the
    derived gradient of every tensor that is not an output (None: zero)."""
    regions = _Regions(spec, lhs, rhs, shape, gradients, integers or {})
    try:
        for index in np.ndindex(*shape) if shape else [()]:
            reason = regions.settle(index, frozenset())
            if reason is not None:
                return CaseProof(False, len(regions.memo), reason)
    except _TooManyCases:
        return CaseProof(False, len(regions.memo), f"more than {MAX_CASES} regions would be needed")
    guarded = bool(regions.sides(frozenset())[2].guards)
    return CaseProof(True, len(regions.memo), zero_sets=[z for z in regions.memo if z], guarded=guarded)
