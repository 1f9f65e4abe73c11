"""The evaluator's backends: what one operation does to the entries of an array.

Contract: a backend is one object with the methods the `Evaluator`
(`symattn.symbolic.evaluate`) calls per operation (`scalar`, `unary`,
`binary`, `compare`, `logical`, `apply`, `where`, `softmax`, `logsumexp`,
`extreme`, `array`, `number`):

- `SYMBOLIC`: NumPy object arrays of SymPy expressions (the element level:
  softmax written with exp, `-inf` masks giving exactly 0 weight, float64's
  answers at the edges: 1 / 0 is an infinity, 0 / 0 and comparisons with NaN
  as IEEE has them);
- `NUMERIC`: float64 arrays (the reference evaluator used by checks of
  generated code; stable softmax, a fully masked row gives zeros).

`reduce_lines` applies a function to every line of an object array (max and
min of exact or guarded entries); the case analysis
(`symattn.symbolic.guarded`) is a third backend built on it.
"""

from __future__ import annotations

import numpy as np
import sympy

from ..ir.functions import FUNCTIONS, OPERATIONS, table
from .lattice import lattice

__all__ = ["Backend", "SYMBOLIC", "NUMERIC", "reduce_lines"]


def reduce_lines(x, axis, line) -> np.ndarray:
    """`line(entries)` of every line of the object array `x` along `axis` (an int or a tuple of
    them), keeping the reduced axes with size 1: max and min of exact or guarded entries."""
    x = np.asarray(x, dtype=object)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0)))
    flat = moved.reshape(*moved.shape[:moved.ndim - len(axes)], -1)
    out = np.empty(flat.shape[:-1], dtype=object)
    for index in np.ndindex(*out.shape):
        out[index] = line(list(flat[index]))
    return np.expand_dims(out, tuple(a % x.ndim for a in axes))


class Backend:
    exact: bool

    def number(self, entry):
        """An entry as a number or SymPy expression (a backend that wraps its entries unwraps them)."""
        return entry


class _Numeric(Backend):
    exact = False
    dtype = np.float64

    def scalar(self, value: sympy.Expr):
        if value == sympy.oo:
            return np.inf
        if value == -sympy.oo:
            return -np.inf
        return float(value)

    def unary(self, fn: str, x):
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return -x if fn == "neg" else FUNCTIONS[fn].float64(x)

    def binary(self, op: str, a, b):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                    "pow": np.power}[op](a, b)

    def compare(self, op: str, a, b):
        return {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                "==": np.equal, "!=": np.not_equal}[op](a, b)

    def logical(self, op: str, *args):
        if op == "not":
            return np.logical_not(args[0])
        combine = np.logical_and if op == "and" else np.logical_or
        out = args[0]
        for a in args[1:]:
            out = combine(out, a)
        return out

    def apply(self, fn: str, *args):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return OPERATIONS[fn].float64(*args)

    def where(self, cond, a, b):
        return np.where(cond, a, b)

    def softmax(self, x, axis: int):
        """The stable formula of the generated code: exp(x - row max) / its sum. A fully masked row
        (all -inf) has weights 0; a row holding NaN or +inf is NaN (inf - inf), as in the generated
        NumPy and CUDA code and torch.softmax (not 0s, or [NaN, 0, ...])."""
        x = np.asarray(x, dtype=np.float64)
        top = np.max(x, axis=axis, keepdims=True)
        shift = np.where(top == -np.inf, 0.0, top)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(x - shift)
            total = np.sum(e, axis=axis, keepdims=True)
            return np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total))

    def logsumexp(self, x, axis):
        """log(sum(exp(x - row max))) + row max, as the generated code computes it: -inf for a fully
        masked row, NaN for a row holding NaN or +inf."""
        x = np.asarray(x, dtype=np.float64)
        top = np.max(x, axis=axis, keepdims=True)
        shift = np.where(top == -np.inf, 0.0, top)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift

    def extreme(self, kind: str, x, axis):
        """max or min along `axis`, keeping it; NaN anywhere in a row gives NaN, as np.max says."""
        x = np.asarray(x, dtype=np.float64)
        return (np.max if kind == "max" else np.min)(x, axis=axis, keepdims=True)

    def array(self, values):
        return np.asarray(values, dtype=np.float64)


def _elementwise(func):
    ufunc = np.frompyfunc(func, 1, 1)
    return lambda x: ufunc(np.asarray(x, dtype=object)) if np.ndim(x) else func(
        x.item() if isinstance(x, np.ndarray) else x)


def _ieee(value):
    """A SymPy number as float64 would have it: complex infinity, an imaginary part or an
    interval (sin(oo)) is NaN. Expressions are left alone."""
    if isinstance(value, sympy.Basic) and value.is_number and (
            value is sympy.zoo or value.has(sympy.I) or value.has(sympy.AccumBounds)):
        return sympy.nan
    return value


def _ieee_divide(a, b):
    """a / b with float64's answers when b is exactly 0: +-inf, or NaN for 0 / 0."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    if b.is_zero and a.is_number:
        if a.is_zero or a is sympy.nan:
            return sympy.nan
        return sympy.oo if a.is_positive else -sympy.oo if a.is_negative else sympy.nan
    return _ieee(a / b)


def _non_finite_number(value) -> bool:
    """NaN or an infinity (a row holding NaN or +inf, summed)."""
    value = sympy.sympify(value)
    return value is sympy.nan or value in (sympy.oo, sympy.zoo) or (value.is_number and value.has(sympy.nan))


def _weight(u, total):
    """One softmax weight exp(x) / total at 30 digits or exactly (see `_Symbolic.softmax`)."""
    total = sympy.sympify(total)
    if total.is_zero:
        return sympy.Integer(0)
    if _non_finite_number(total):
        return sympy.nan
    return u / total


class _Symbolic(Backend):
    exact = True

    _FUNCS = table("exact", {"neg": lambda x: -x})
    _REL = {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "==": sympy.Eq, "!=": sympy.Ne}

    def scalar(self, value):
        return value

    def unary(self, fn, x):
        func = self._FUNCS[fn]
        return _elementwise(lambda u: _ieee(func(u)))(x)

    def binary(self, op, a, b):
        a, b = self._obj(a), self._obj(b)
        if op == "pow":
            return np.frompyfunc(lambda u, v: _ieee(u**v) if not (sympy.sympify(u).is_zero and
                                                                  sympy.sympify(v).is_negative)
                                 else sympy.oo, 2, 1)(a, b)
        if op == "div":
            return np.frompyfunc(_ieee_divide, 2, 1)(a, b)
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a, b)

    def compare(self, op, a, b):
        rel = self._REL[op]

        def compare(u, v):
            u, v = sympy.sympify(u), sympy.sympify(v)
            if u is sympy.nan or v is sympy.nan:  # every comparison with NaN is false but !=
                return sympy.true if op == "!=" else sympy.false
            return rel(u, v)

        return np.frompyfunc(compare, 2, 1)(self._obj(a), self._obj(b))

    def logical(self, op, *args):
        join = {"and": sympy.And, "or": sympy.Or, "not": sympy.Not}[op]
        return np.frompyfunc(lambda *c: join(*(sympy.sympify(x) for x in c)), len(args), 1)(
            *(self._obj(a) for a in args))

    def apply(self, fn, *args):
        exact = OPERATIONS[fn].exact
        return np.frompyfunc(lambda *u: _ieee(exact(*(sympy.sympify(x) for x in u))), len(args), 1)(
            *(self._obj(a) for a in args))

    def where(self, cond, a, b):
        def pick(c, u, v):
            if c is sympy.true or c is True:
                return u
            if c is sympy.false or c is False:
                return v
            return sympy.Piecewise((u, c), (v, True))

        return np.frompyfunc(pick, 3, 1)(cond, self._obj(a), self._obj(b))

    def softmax(self, x, axis):
        e = self.unary("exp", x)
        total = np.sum(e, axis=axis, keepdims=True)
        # A fully masked row (every entry -oo) sums to exactly 0: its weights are 0, as in
        # the numeric backend and the generated code, not 0 / 0. A row holding NaN or +oo sums to
        # NaN or +oo: every weight is NaN, as the stable formula (x - row max) gives.
        return np.frompyfunc(_weight, 2, 1)(e, total)

    def logsumexp(self, x, axis):
        total = np.sum(self.unary("exp", x), axis=axis, keepdims=True)
        return np.frompyfunc(lambda s: sympy.nan if _non_finite_number(s) else s, 1, 1)(
            self.unary("log", total))

    def extreme(self, kind: str, x, axis):
        """sympy.Max or sympy.Min of each line along `axis`, keeping it; a NaN entry makes the line NaN."""
        fn = sympy.Max if kind == "max" else sympy.Min

        def line(values):
            values = tuple(sympy.sympify(v) for v in values)
            if any(v is sympy.nan for v in values):
                return sympy.nan
            key = (fn, values)
            if key not in _EXTREMES:
                if len(_EXTREMES) > _EXTREMES_KEPT:
                    _EXTREMES.clear()
                _EXTREMES[key] = lattice(fn, values)
            return _EXTREMES[key]

        return reduce_lines(x, axis, line)

    def array(self, values):
        return np.asarray(values, dtype=object)

    @staticmethod
    def _obj(x):
        return np.asarray(x, dtype=object) if np.ndim(x) else x


# Max and Min of the same entries, in the same order, built once per process: SymPy compares every
# pair of arguments symbolically when it builds one (a softmax row's scores: a tenth of a second),
# and the element model, the claims and the symmetry witness each evaluate the same rows. The
# result is the very expression another call would build.
_EXTREMES: dict[tuple, sympy.Expr] = {}
_EXTREMES_KEPT = 4096

SYMBOLIC = _Symbolic()
NUMERIC = _Numeric()
