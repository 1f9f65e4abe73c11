"""Adversarial review of the softmax family's rules for all sizes (round 26), against plain NumPy.

Each program is a spec head, its forward pass in NumPy and claims aimed at the
side conditions of the new matrix-level rules: reductions over an axis of size
1 whose entry may be +inf (the stable formula's inf - inf makes logsumexp([inf])
NaN), rows emptied by -inf masks, rows holding +inf or NaN, key blocks that are
empty or repeated, dims that coincide at the default sizes (a slice whose offset
is another dim), axis 0 against axis -1, rescale factors whose new max is -inf,
zero rows under a norm, divisions by sums that can be 0, rotations, `relative`
with masks and `check not`. Values that are non-finite only at 0.25 (which the
counterexample search never draws, but `numpy_claims` samples) hide a false
claim from the search, so only a sound rule keeps it from being proved.
Expectations are computed here in NumPy (`numpy_claims`): every "proved" must
hold at the sampled points (and, for all sizes, at the other sizes), every
"refuted" must carry a counterexample that reproduces in NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import numpy_claims
from numpy_claims import NEG_INF, Claim, Program, Values, amax, differs, logsumexp, rsum, sides, softmax

ALL = "all sizes"


# --- the harness: `numpy_claims.check`, sampling also where entries are 0.25 -------------------------

def _quarters(spec, rng):
    """Points where entries are 0.25 (the search never draws it): every entry, the first row of each
    given tensor, and entries that are 0.25 or a half at random."""
    given = [n for n, info in spec.tensors.items() if info.kind in ("input", "param", "buffer")]
    out = []
    for mode in ("all", "first row", "random", "random", "random", "random"):
        v = Values()
        for name in given:
            shape = spec.concrete_shape(name)
            a = rng.integers(-2, 3, size=shape) / 2.0
            if mode == "all":
                a = np.full(shape, 0.25)
            elif mode == "first row" and shape:
                a[0] = 0.25
            elif mode == "random":
                a = np.where(rng.random(shape) < 0.5, 0.25, a)
            v[name] = np.asarray(a, dtype=np.float64)
        for name in spec.outputs:
            v[f"grad({name})"] = rng.standard_normal(spec.concrete_shape(name))
        out.append((mode, v))
    return out


_SAMPLED = numpy_claims.first_difference


def first_difference(program, claim, spec, seed=0):
    """`numpy_claims.first_difference`, then at the points of `_quarters`."""
    found = _SAMPLED(program, claim, spec, seed)
    if found is not None:
        return found
    for mode, v in _quarters(spec, np.random.default_rng(seed + 26)):
        lhs, rhs = sides(program, claim, v)
        bad = differs(lhs, rhs)
        if bad.any():
            k = tuple(np.argwhere(bad)[0])
            return f"0.25 at {mode}: {np.broadcast_to(lhs, bad.shape)[k]!r} vs {np.broadcast_to(rhs, bad.shape)[k]!r}"
    return None


def check(program: Program, budget: float | None = None) -> list:
    """`numpy_claims.check` with `first_difference` sampling 0.25 too (every other rule the same)."""
    saved = numpy_claims.first_difference
    numpy_claims.first_difference = first_difference
    try:
        return numpy_claims.check(program, budget)
    finally:
        numpy_claims.first_difference = saved


def amin(x, axis=-1):
    return np.min(x, axis=axis, keepdims=True)


def _quarter(x):
    """-log((x - 0.25)^2): +inf exactly where x is 0.25, which the counterexample search never draws."""
    with np.errstate(all="ignore"):
        return -np.log((x - 0.25) * (x - 0.25))


# --- reductions over an axis of size 1 -------------------------------------------------------------

def _size_one(v):
    with np.errstate(all="ignore"):
        v["Pi0"] = _quarter(v.X[:, 0:1])
        v["Lm0"] = -v.Pi0
        v["Ln0"] = np.log(v.X[:, 0:1])
        v["R0"] = 1 / (v.X[:, 0:1] - 0.25)


SIZE_ONE = Program("size-one-reductions", """\
dim N = 3, d = 2
input X[N, d], Y[N, d]
Pi0 = -log((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25))
Lm0 = log((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25))
Ln0 = log(X[:, 0:1])
R0 = 1 / (X[:, 0:1] - 0.25)
O = X
output O
""", _size_one, (
    # logsumexp of one entry is that entry only where it is never +inf: [inf] gives NaN
    Claim("logsumexp(Pi0, axis=-1) == Pi0", lambda v: (logsumexp(v.Pi0), v.Pi0), False),
    Claim("logsumexp(R0, axis=-1) == R0", lambda v: (logsumexp(v.R0), v.R0), False),
    Claim("logsumexp(X[:, 0:1] + Pi0, axis=-1) == X[:, 0:1] + Pi0",
          lambda v: (logsumexp(v.X[:, 0:1] + v.Pi0), v.X[:, 0:1] + v.Pi0), False),
    Claim("logsumexp(transpose(Pi0), axis=0) == transpose(Pi0)", lambda v: (logsumexp(v.Pi0.T, 0), v.Pi0.T), False),
    Claim("logsumexp(Lm0, axis=-1) == Lm0", lambda v: (logsumexp(v.Lm0), v.Lm0), True, ALL),
    Claim("logsumexp(Y[:, 0:1], axis=-1) == Y[:, 0:1]", lambda v: (logsumexp(v.Y[:, 0:1]), v.Y[:, 0:1]), True, ALL),
    Claim("logsumexp(Ln0, axis=-1) == Ln0", lambda v: (logsumexp(v.Ln0), v.Ln0), True),   # NaN both, -inf both
    Claim("logsumexp(Pi0 + Lm0, axis=-1) == Pi0 + Lm0",                                    # NaN both ways
          lambda v: (logsumexp(v.Pi0 + v.Lm0), v.Pi0 + v.Lm0), True),
    # max and min of one entry are that entry, whatever it is
    Claim("max(Pi0, axis=-1) == Pi0", lambda v: (amax(v.Pi0), v.Pi0), True, ALL),
    Claim("min(R0, axis=-1) == R0", lambda v: (amin(v.R0), v.R0), True, ALL),
    Claim("max(Ln0, axis=-1) == Ln0", lambda v: (amax(v.Ln0), v.Ln0), True, ALL),
    # softmax of one entry: 1, 0 where it is -inf, NaN where it is +inf or NaN
    Claim("softmax(Pi0, axis=-1) == exp(Pi0 - Pi0)", lambda v: (softmax(v.Pi0), np.exp(v.Pi0 - v.Pi0)), True),
    Claim("softmax(Lm0, axis=-1) == exp(Lm0 - Lm0)", lambda v: (softmax(v.Lm0), np.exp(v.Lm0 - v.Lm0)), False),
    Claim("sum(softmax(Y[:, 0:1], axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(v.Y[:, 0:1])), 1 + 0 * v.Y[:, 0:1]), True),
    # blocks with a size-1 block that may be +inf: the merge needs values never NaN nor +inf
    Claim("logsumexp(concat(Pi0, X, axis=-1), axis=-1) == log(exp(Pi0) + exp(logsumexp(X, axis=-1)))",
          lambda v: (logsumexp(np.concatenate([v.Pi0, v.X], -1)), np.log(np.exp(v.Pi0) + np.exp(logsumexp(v.X)))),
          False),
    Claim("logsumexp(concat(Lm0, X, axis=-1), axis=-1) == log(exp(Lm0) + exp(logsumexp(X, axis=-1)))",
          lambda v: (logsumexp(np.concatenate([v.Lm0, v.X], -1)), np.log(np.exp(v.Lm0) + np.exp(logsumexp(v.X)))),
          True, ALL),
    Claim("max(concat(Pi0, X, axis=-1), axis=-1) == max(concat(X, Pi0, axis=-1), axis=-1)",
          lambda v: (amax(np.concatenate([v.Pi0, v.X], -1)), amax(np.concatenate([v.X, v.Pi0], -1))), True),
    Claim("logsumexp(concat(Pi0, Pi0, axis=-1), axis=-1) == Pi0 + log(2 + 0 * Pi0)",   # NaN both ways
          lambda v: (logsumexp(np.concatenate([v.Pi0, v.Pi0], -1)), v.Pi0 + np.log(2 + 0 * v.Pi0)), True),
    Claim("logsumexp(concat(Pi0, Pi0, axis=-1), axis=-1) == Pi0 + log(2 + 0 * Y[:, 0:1])",
          lambda v: (logsumexp(np.concatenate([v.Pi0, v.Pi0], -1)), v.Pi0 + np.log(2 + 0 * v.Y[:, 0:1])), False),
), other_sizes=({"N": 1, "d": 1}, {"N": 4, "d": 3}))


def test_size_one_reductions():
    check(SIZE_ONE, budget=60)
