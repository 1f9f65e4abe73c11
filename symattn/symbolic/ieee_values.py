"""One entry under float64 semantics: a finite SymPy expression, NaN, an infinity, or unknown.

Contract: a `Value` has a `kind` (FINITE with `expr`, NAN, INF for an infinity of
either sign, NEG_INF, NONFINITE for an infinity or NaN, UNKNOWN) and the guards
(`Guard`: an operation evaluated as if its argument were nonzero) it rests on.
`add`, `negate` and `multiply` follow IEEE: inf - inf and inf * 0 are NaN, NaN
absorbs everything, a finite sum or product is SymPy's. `constant` reads a SymPy
number, `wrap` anything an array may hold, `finite` builds a finite value. The case
analysis (`symattn.symbolic.guarded`) evaluates whole specs with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

__all__ = ["FINITE", "NAN", "INF", "NEG_INF", "NONFINITE", "UNKNOWN", "INFINITE", "Guard", "Value", "finite",
           "constant", "wrap", "negate", "add", "multiply"]

FINITE, NAN, INF, NEG_INF, NONFINITE, UNKNOWN = "finite", "nan", "inf", "-inf", "inf or nan", "unknown"
INFINITE = (INF, NEG_INF, NONFINITE)


@dataclass(frozen=True)
class Guard:
    """An operation evaluated as if `argument` were nonzero: `what` is "divisor", "sqrt", "log" or
    "root"; `events` says where the argument is 0 (see `symattn.symbolic.signs.zero_events`)."""

    what: str
    argument: sympy.Expr
    events: tuple[frozenset, ...]


@dataclass(frozen=True)
class Value:
    """One entry under float64 semantics in one region: `kind` (FINITE with `expr`, NAN, INF for an
    infinity of either sign, NEG_INF, NONFINITE for an infinity or NaN, UNKNOWN) and the guards
    it rests on."""

    kind: str
    expr: sympy.Basic | None = None
    deps: frozenset = frozenset()

    def __add__(self, other):
        return add(self, wrap(other))

    def __radd__(self, other):
        return add(wrap(other), self)

    def __sub__(self, other):
        return add(self, negate(wrap(other)))

    def __rsub__(self, other):
        return add(wrap(other), negate(self))

    def __mul__(self, other):
        return multiply(self, wrap(other))

    def __rmul__(self, other):
        return multiply(wrap(other), self)

    def __neg__(self):
        return negate(self)

    def __truediv__(self, other):  # only `mean` divides directly, by a count
        other = wrap(other)
        if other.kind == FINITE and other.expr.is_number and other.expr.is_zero is False:
            return multiply(self, Value(FINITE, 1 / other.expr, other.deps))
        return Value(UNKNOWN, deps=self.deps | other.deps)


def finite(expr, deps=frozenset()) -> Value:
    return Value(FINITE, sympy.sympify(expr), deps)


def constant(value) -> Value:
    value = sympy.sympify(value)
    if value is sympy.nan:
        return Value(NAN)
    if value == -sympy.oo:
        return Value(NEG_INF)
    if value in (sympy.oo, sympy.zoo):
        return Value(INF)
    if isinstance(value, sympy.logic.boolalg.BooleanAtom) or (value.is_finite and value.is_extended_real):
        return Value(FINITE, value)
    return Value(UNKNOWN)


def wrap(x) -> Value:
    if isinstance(x, Value):
        return x
    return constant(x)


def negate(a: Value) -> Value:
    if a.kind == FINITE:
        return Value(FINITE, -a.expr, a.deps)
    return Value(INF if a.kind == NEG_INF else a.kind, deps=a.deps)


def add(a: Value, b: Value) -> Value:
    deps = a.deps | b.deps
    kinds = {a.kind, b.kind}
    if NAN in kinds:
        return Value(NAN, deps=deps)
    if UNKNOWN in kinds:
        return Value(UNKNOWN, deps=deps)
    if kinds == {FINITE}:
        return Value(FINITE, a.expr + b.expr, deps)
    if FINITE in kinds:  # inf + x is inf, NaN + x is NaN
        return Value(a.kind if a.kind != FINITE else b.kind, deps=deps)
    if kinds == {NEG_INF}:
        return Value(NEG_INF, deps=deps)
    return Value(NONFINITE, deps=deps)  # inf - inf is NaN, inf + inf is inf


def multiply(a: Value, b: Value) -> Value:
    deps = a.deps | b.deps
    kinds = {a.kind, b.kind}
    if NAN in kinds:
        return Value(NAN, deps=deps)
    if UNKNOWN in kinds:
        return Value(UNKNOWN, deps=deps)
    if kinds == {FINITE}:
        return Value(FINITE, a.expr * b.expr, deps)
    if FINITE in kinds:
        c, x = (a, b) if a.kind == FINITE else (b, a)
        if c.expr == 0:
            return Value(NAN, deps=deps)  # inf * 0 and NaN * 0 are NaN
        if c.expr.is_number and c.expr.is_zero is False:
            if x.kind == NEG_INF and c.expr.is_positive:
                return Value(NEG_INF, deps=deps)
            return Value(INF if x.kind in (INF, NEG_INF) else NONFINITE, deps=deps)
        return Value(NONFINITE, deps=deps)  # an infinity times what may be 0
    if kinds <= {INF, NEG_INF}:
        return Value(INF, deps=deps)
    return Value(NONFINITE, deps=deps)
