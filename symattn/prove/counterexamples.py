"""Counterexamples: concrete inputs at which the two sides of a claim differ in plain float64.

Contract: `search_counterexample(session, check, points, special)` returns a
`Counterexample` or None. It draws small exact inputs (`rational_point`:
multiples of 1/2 in [-1, 1], zeros and negatives included; with `special`,
the points where log, sqrt and division by a tensor leave the reals: zeros,
negatives, zero scalars, sparse tensors), evaluates both sides with the
float64 evaluator (independent of SymPy, gradients from the matrix-level
derivation) and confirms a difference by the same evaluation at 30 digits, so
rounding never refutes; a difference in which a side is NaN or infinite must
show at 30 digits as the same kind of difference. `float64_contradicts` is the
defence in depth of an element-level proof: both sides in float64 at three
points (zeros and negatives included). `session` is a `symattn.prove.claims`
session (the spec, its derivation, `at_point`). `refuted` words the verdict.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
import sympy

from ..errors import SymAttnError
from ..ir import typed as t
from ..ir.shapes import broadcast
from .verdicts import Counterexample, Verdict

__all__ = ["POINTS", "SPECIAL_POINTS", "MASKED_POINTS", "DIGITS", "tolist", "number", "rational_point", "same_float", "float_of",
           "search_counterexample", "reads_grads", "refuted", "float64_contradicts"]

POINTS = 4          # random rational points tried for a counterexample
# Where log, sqrt and division by a tensor leave the reals: tried too when a claim's values may be NaN.
SPECIAL_POINTS = ["zeros", "negative", "zero scalars", "sparse", "sparse", "sparse", "sparse"]
MASKED_POINTS = ["zeros", "negative"]
DIGITS = 30         # precision of the values compared at a point
SEPARATION = 1e-12  # relative gap that counts as a difference at 30 digits
FLOAT64_GAP = 1e-8  # relative gap that counts as a difference in float64 (rounding is ~1e-15)

def tolist(array) -> Any:
    array = np.asarray(array, dtype=object)
    if array.shape == ():
        return number(array.item())
    return [tolist(a) for a in array]


def number(value):
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (mpmath.mpf, mpmath.mpc)):
        return float(value.real) if isinstance(value, mpmath.mpc) else float(value)
    value = sympy.sympify(value)
    if value.is_Integer:
        return int(value)
    return float(value)


def rational_point(session, rng: np.random.Generator, kind: str = "random") -> tuple[dict, dict]:
    """Small exact inputs: multiples of 1/2 in [-1, 1] (zeros and negatives included), so softmax
    stays far from saturation; `zeros` and `negative` are the points where log, sqrt and
    division by a tensor leave the reals."""
    spec = session.spec
    halves = np.array([sympy.Rational(k, 2) for k in range(-2, 3)], dtype=object)
    fixed = {"zeros": sympy.Integer(0), "negative": sympy.Rational(-1, 2)}

    def leaf(name):
        shape = spec.concrete_shape(spec.tensors[name].shape)
        bounds = spec.integer_range(name)
        if bounds is not None:  # an integer buffer: integers of its range (the least at `negative`)
            low, high = bounds
            if kind == "negative":
                values = np.full(shape, low, dtype=np.int64)
            elif kind == "zeros":
                values = np.full(shape, min(max(0, low), high - 1), dtype=np.int64)
            else:
                values = rng.integers(low, high, size=shape)
            return np.vectorize(sympy.Integer, otypes=[object])(values) if values.size else values.astype(object)
        if kind in fixed:
            return np.full(shape, fixed[kind], dtype=object)
        if kind == "sparse":  # half the entries 0: divisions by 0 meet numerators that are not
            return np.where(rng.random(shape) < 0.5, sympy.Integer(0), rng.choice(halves, size=shape))
        if kind == "zero scalars" and not shape:
            return np.array(sympy.Integer(0), dtype=object)
        return rng.choice(halves, size=shape)

    values = {n: leaf(n) for n in spec.given}
    nonzero = np.array([sympy.Rational(k, 2) for k in (-2, -1, 1, 2)], dtype=object)
    upstream = {n: rng.choice(nonzero, size=spec.concrete_shape(spec.tensors[n].shape)) for n in spec.outputs}
    return values, upstream


def same_float(a: float, b: float, gap: float) -> bool:
    """Equal under float64 semantics: the same non-finite value, or finite and within `gap` (relative)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return abs(a - b) <= gap * max(1.0, abs(a), abs(b))


def float_of(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):  # a complex or symbolic leftover is NaN under float64
        return math.nan


def search_counterexample(session, check: t.CheckInfo, points: int = POINTS,
                          special: bool = False, masked: bool = False) -> Counterexample | None:
    """Inputs at which plain float64 (the float64 evaluator on the spec's nodes, independent of
    SymPy's algebra) shows the sides differ, confirmed by the same evaluation at 30 digits so
    that rounding never refutes; None when no such point turns up. A difference in which side is
    NaN or infinite must show at 30 digits as the same kind of difference."""
    spec = session.spec
    rng = np.random.default_rng(20261129)
    # a claim whose values may be -inf (masks from buffers) also at zeros and negatives: every buffer
    # entry <= 0, so every key is padding and every row empty, where the row rules fail
    kinds = ["random"] * points + (SPECIAL_POINTS if special else MASKED_POINTS if masked else [])
    shape = spec.concrete_shape(broadcast(check.lhs.shape, check.rhs.shape))
    grads = reads_grads(check)
    # the same seed draws the same points for every claim of a spec: each is evaluated once
    cache = session.__dict__.setdefault("points_evaluated", {})
    for number, kind in enumerate(kinds):
        values, upstream = rational_point(session, rng, kind)
        subs = None
        if session.derivation is None and grads:
            subs = session.model.point(values, upstream, DIGITS)
        key = (tuple(kinds[:number + 1]), grads)
        if subs is not None or key not in cache:
            cache[key] = session.at_point(values, upstream, subs=subs, grads=grads)
        ev = cache[key]
        left64 = np.broadcast_to(np.asarray(ev.evaluate(check.lhs), dtype=np.float64), shape)
        right64 = np.broadcast_to(np.asarray(ev.evaluate(check.rhs), dtype=np.float64), shape)
        indices = list(np.ndindex(*shape) if shape else [()])
        candidates = [i for i in indices if not same_float(float(left64[i]), float(right64[i]), FLOAT64_GAP)]
        if not candidates:
            continue
        exact = session.at_point(values, upstream, DIGITS, subs=subs, grads=grads)
        left = np.broadcast_to(np.asarray(exact.evaluate(check.lhs), dtype=object), shape)
        right = np.broadcast_to(np.asarray(exact.evaluate(check.rhs), dtype=object), shape)
        gaps = [i for i in candidates if not same_float(float_of(left[i]), float_of(right[i]), SEPARATION)]
        if not gaps:
            i = candidates[0]
            session.unreproduced = (f"float64 gives {float(left64[i]):.6g} and {float(right64[i]):.6g} at entry "
                                    f"{list(i)}, but at {DIGITS} digits the sides agree there (rounding)")
            continue

        def size(i):
            a, b = float(left64[i]), float(right64[i])
            return math.inf if not (math.isfinite(a) and math.isfinite(b)) else abs(a - b)

        index = max(gaps, key=size)
        inputs = {n: tolist(v) for n, v in values.items()}
        inputs.update({f"grad({n})": tolist(v) for n, v in upstream.items()})
        where = "[" + ", ".join(str(i) for i in index) + "]"
        return Counterexample(
            sizes=dict(spec.sizes), inputs=inputs, lhs=tolist(left64), rhs=tolist(right64),
            note=f"largest gap at entry {where} (0-based): left side {float(left64[index]):.6g}, "
                 f"right side {float(right64[index]):.6g} in float64",
        )
    return None


def reads_grads(check: t.CheckInfo) -> bool:
    return any(isinstance(n, t.Grad) or (isinstance(n, t.Entry) and n.grad)
               for side in (check.lhs, check.rhs) for n in t.walk(side))


def refuted(check: t.CheckInfo, search, counter: Counterexample) -> Verdict:
    where = search.size_note or f"at {_sizes_text(search.spec)}"
    return Verdict(check.line, check.text, "refuted",
                   f"counterexample {where}: inputs that are multiples of 1/2, at which the "
                   f"sides differ in plain float64 (and at {DIGITS} digits where both are finite)", counter)


def float64_contradicts(session, check: t.CheckInfo) -> str | None:
    """Defence in depth for an element-level proof: evaluate both sides in float64 at three
    points (zeros and negatives included) and say where they disagree, if they do."""
    rng = np.random.default_rng(7)
    for kind in ("random", "zeros", "negative"):
        values, upstream = rational_point(session, rng, kind)
        try:
            ev = session.at_point(values, upstream, grads=reads_grads(check))
            if ev is None:
                return None
            left = np.asarray(ev.evaluate(check.lhs), dtype=np.float64)
            right = np.asarray(ev.evaluate(check.rhs), dtype=np.float64)
        except SymAttnError:
            return None  # a gradient the float64 evaluator cannot produce: nothing to compare
        left, right = np.broadcast_arrays(left, right)
        for index in np.ndindex(*left.shape):
            if not same_float(float(left[index]), float(right[index]), 1e-6):
                return f"float64 gives {left[index]} and {right[index]} at entry {list(index)} ({kind} inputs)"
    return None


def _sizes_text(spec: t.TypedSpec) -> str:
    return ", ".join(f"{k}={v}" for k, v in spec.sizes.items())
