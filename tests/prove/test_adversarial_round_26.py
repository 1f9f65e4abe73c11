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

import symattn
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


# --- -inf where the data say: a log of a value that may be 0, a mask computed from inputs ----------

def _data_masks(v):
    q = v.X[:, 0:1] - 0.25
    with np.errstate(all="ignore"):
        v["Lm0"] = np.log(q * q)                              # -inf on the rows where X[i, 0] = 0.25
        v["Lm"] = np.log((v.X - 0.25) * (v.X - 0.25))
    v["Mq"] = np.where(q * q > 0, 0.0, NEG_INF)               # a mask computed from an input
    v["Mq2"] = np.where((v.X - 0.25) * (v.X - 0.25) > 0, 0.0, NEG_INF)
    v["Mb"] = np.where((v.keep - 0.25) * (v.keep - 0.25) > 0, 0.0, NEG_INF)
    v["T"] = v.Y + v.Mq2


DATA_MASKS = Program("data-dependent-minus-inf", """\
dim N = 3, d = 2
input X[N, d], Y[N, d]
buffer keep[d]
Lm0 = log((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25))
Lm = log((X - 0.25) * (X - 0.25))
Mq = where((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25) > 0, 0, -inf)
Mq2 = where((X - 0.25) * (X - 0.25) > 0, 0, -inf)
Mb = where((keep - 0.25) * (keep - 0.25) > 0, 0, -inf)
T = Y + Mq2
O = X
output O
""", _data_masks, (
    # the element level wrote softmax's weight exp(m) / exp(m) as 1 where m is -inf: a row it empties
    Claim("sum(softmax(Lm0, axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(v.Lm0)), 1 + 0 * v.Y[:, 0:1]), False),
    Claim("sum(softmax(Lm, axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(v.Lm)), 1 + 0 * v.Y[:, 0:1]), False),
    Claim("sum(softmax(Mq, axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(v.Mq)), 1 + 0 * v.Y[:, 0:1]), False),
    Claim("sum(softmax(T, axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(v.T)), 1 + 0 * v.Y[:, 0:1]), False),
    Claim("sum(softmax(Y + Mb, axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(v.Y + v.Mb)), 1 + 0 * v.Y[:, 0:1]), False),
    Claim("softmax(Lm - max(Lm, axis=-1), axis=-1) == softmax(Lm, axis=-1)",
          lambda v: (softmax(v.Lm - amax(v.Lm)), softmax(v.Lm)), False),
    Claim("exp(T - logsumexp(T, axis=-1)) == softmax(T, axis=-1)",
          lambda v: (np.exp(v.T - logsumexp(v.T)), softmax(v.T)), False),
    Claim("exp(Lm) * exp(0 - Lm) == 1 + 0 * X", lambda v: (np.exp(v.Lm) * np.exp(0 - v.Lm), 1 + 0 * v.X), False),
    Claim("0 * Lm == 0 * X", lambda v: (0 * v.Lm, 0 * v.X), False),
    Claim("Mq2 - Mq2 == 0 * X", lambda v: (v.Mq2 - v.Mq2, 0 * v.X), False),
    # true ones: every row holds a finite entry, or both sides are 0 on an emptied row
    Claim("sum(softmax(concat(Lm, Y, axis=-1), axis=-1), axis=-1) == 1 + 0 * Y[:, 0:1]",
          lambda v: (rsum(softmax(np.concatenate([v.Lm, v.Y], -1))), 1 + 0 * v.Y[:, 0:1]), True),
    Claim("softmax(T + Y[:, 0:1], axis=-1) == softmax(T, axis=-1)",
          lambda v: (softmax(v.T + v.Y[:, 0:1]), softmax(v.T)), True),
    Claim("exp(Lm) == (X - 0.25) * (X - 0.25)", lambda v: (np.exp(v.Lm), (v.X - 0.25) * (v.X - 0.25)), True, ALL),
    Claim("softmax(Lm0, axis=-1) * exp(Lm0) == exp(Lm0) * exp(Lm0 - Lm0) * 0 + exp(Lm0)",   # 0 * NaN at -inf
          lambda v: (softmax(v.Lm0) * np.exp(v.Lm0), np.exp(v.Lm0) * np.exp(v.Lm0 - v.Lm0) * 0 + np.exp(v.Lm0)),
          False),
    Claim("sum(exp(T), axis=-1) == exp(logsumexp(T, axis=-1))",
          lambda v: (rsum(np.exp(v.T)), np.exp(logsumexp(v.T))), True, ALL),
    Claim("log(sum(exp(Lm), axis=-1)) == logsumexp(Lm, axis=-1)",
          lambda v: (np.log(rsum(np.exp(v.Lm))), logsumexp(v.Lm)), True),
), other_sizes=({"N": 1, "d": 1}, {"N": 4, "d": 3}), masks=("keep",))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_minus_inf_where_the_data_say():
    check(DATA_MASKS, budget=60)


# --- online softmax over padded key blocks: running maxima that are -inf, rescale factors ----------

def _rescale(v):
    v["Mk1"] = np.where(v.keep1 > 0, 0.0, NEG_INF)
    v["Mk2"] = np.where(v.keep2 > 0, 0.0, NEG_INF)
    v["S1"] = v.Q @ v.K1.T + v.Mk1
    v["S2"] = v.Q @ v.K2.T + v.Mk2
    v["S"] = np.concatenate([v.S1, v.S2], axis=-1)
    v["V"] = np.concatenate([v.V1, v.V2], axis=0)
    v["P"] = softmax(v.S)
    v["O"] = v.P @ v.V
    v["L"] = logsumexp(v.S)
    v["l1"], v["l2"] = logsumexp(v.S1), logsumexp(v.S2)
    v["O1"], v["O2"] = softmax(v.S1) @ v.V1, softmax(v.S2) @ v.V2
    v["m1"], v["m2"] = amax(v.S1), amax(v.S2)
    v["m"] = amax(np.concatenate([v.m1, v.m2], axis=-1))
    with np.errstate(all="ignore"):
        v["r1"] = rsum(np.exp(v.S1 - v.m1))
        v["r2"] = rsum(np.exp(v.S2 - v.m2))
        v["a1"], v["a2"] = np.exp(v.m1 - v.m), np.exp(v.m2 - v.m)
        v["r"] = v.a1 * v.r1 + v.a2 * v.r2
    gP = v.g("O") @ v.V.T
    v["gS"] = v.P * (gP - rsum(gP * v.P))


RESCALE = Program("running-max-rescale", """\
dim N = 3, M1 = 2, M2 = 2, d = 2
input Q[N, d], K1[M1, d], K2[M2, d], V1[M1, d], V2[M2, d]
buffer keep1[M1], keep2[M2]
Mk1 = where(keep1 > 0, 0, -inf)
Mk2 = where(keep2 > 0, 0, -inf)
S1 = Q @ K1.T + Mk1
S2 = Q @ K2.T + Mk2
S = concat(S1, S2, axis=-1)
V = concat(V1, V2, axis=0)
P = softmax(S, axis=-1)
O = P @ V
L = logsumexp(S, axis=-1)
l1 = logsumexp(S1, axis=-1)
l2 = logsumexp(S2, axis=-1)
O1 = softmax(S1, axis=-1) @ V1
O2 = softmax(S2, axis=-1) @ V2
m1 = max(S1, axis=-1)
m2 = max(S2, axis=-1)
m = max(concat(m1, m2, axis=-1), axis=-1)
r1 = sum(exp(S1 - m1), axis=-1)
r2 = sum(exp(S2 - m2), axis=-1)
a1 = exp(m1 - m)
a2 = exp(m2 - m)
r = a1 * r1 + a2 * r2
output O
""", _rescale, (
    # the running max and the merged logsumexp hold on every row, empty ones included
    Claim("m == max(S, axis=-1)", lambda v: (v.m, amax(v.S)), True, ALL),
    Claim("max(concat(m, m1, axis=-1), axis=-1) == m", lambda v: (amax(np.concatenate([v.m, v.m1], -1)), v.m),
          True, ALL),
    Claim("max(concat(m1, S2, axis=-1), axis=-1) == m", lambda v: (amax(np.concatenate([v.m1, v.S2], -1)), v.m),
          True, ALL),
    Claim("max(concat(m2, m1, axis=-1), axis=-1) == m", lambda v: (amax(np.concatenate([v.m2, v.m1], -1)), v.m),
          True, ALL),
    Claim("min(concat(m1, m2, axis=-1), axis=-1) == min(concat(m2, m1, axis=-1), axis=-1)",
          lambda v: (amin(np.concatenate([v.m1, v.m2], -1)), amin(np.concatenate([v.m2, v.m1], -1))), True, ALL),
    Claim("min(concat(m1, m2, axis=-1), axis=-1) == m", lambda v: (amin(np.concatenate([v.m1, v.m2], -1)), v.m),
          False),
    Claim("L == log(exp(l1) + exp(l2))", lambda v: (v.L, np.log(np.exp(v.l1) + np.exp(v.l2))), True, ALL),
    Claim("logsumexp(concat(l1, l2, axis=-1), axis=-1) == L",
          lambda v: (logsumexp(np.concatenate([v.l1, v.l2], -1)), v.L), True, ALL),
    Claim("logsumexp(concat(l2, S1, axis=-1), axis=-1) == L",
          lambda v: (logsumexp(np.concatenate([v.l2, v.S1], -1)), v.L), True, ALL),
    Claim("max(concat(l1, l2, axis=-1), axis=-1) == max(concat(m1, m2, axis=-1), axis=-1)",
          lambda v: (amax(np.concatenate([v.l1, v.l2], -1)), v.m), False),
    Claim("sum(exp(S), axis=-1) == exp(l1) + exp(l2)", lambda v: (rsum(np.exp(v.S)), np.exp(v.l1) + np.exp(v.l2)),
          True, ALL),
    # rescale factors: exp(m1 - m) is NaN where block 1 and the whole row are empty (-inf - -inf)
    Claim("a1 * r1 == sum(exp(S1 - m), axis=-1)", lambda v: (v.a1 * v.r1, rsum(np.exp(v.S1 - v.m))), False),
    Claim("r == sum(exp(S - m), axis=-1)", lambda v: (v.r, rsum(np.exp(v.S - v.m))), False),
    Claim("m + log(r) == L", lambda v: (v.m + np.log(v.r), v.L), False),
    Claim("m + log(sum(exp(S - m), axis=-1)) == L", lambda v: (v.m + np.log(rsum(np.exp(v.S - v.m))), v.L), False),
    Claim("sum(exp(S - m), axis=-1) == exp(L - m)", lambda v: (rsum(np.exp(v.S - v.m)), np.exp(v.L - v.m)), True),
    Claim("a1 * exp(m - m1) == 1 + 0 * sum(Q, axis=-1)", lambda v: (v.a1 * np.exp(v.m - v.m1), 1 + 0 * rsum(v.Q)),
          False),
    Claim("exp(m1 - m) == exp(m1 - max(S, axis=-1))", lambda v: (v.a1, np.exp(v.m1 - amax(v.S))), True),
    Claim("exp(l1 - L) * O1 + exp(l2 - L) * O2 == O",
          lambda v: (np.exp(v.l1 - v.L) * v.O1 + np.exp(v.l2 - v.L) * v.O2, v.O), False),
    Claim("P[:, 0:M1] == exp(l1 - L) * softmax(S1, axis=-1)",
          lambda v: (v.P[:, :v.S1.shape[1]], np.exp(v.l1 - v.L) * softmax(v.S1)), False),
    Claim("P[:, 0:M1] == exp(S1 - L)", lambda v: (v.P[:, :v.S1.shape[1]], np.exp(v.S1 - v.L)), False),
    Claim("sum(P, axis=-1) * P[:, M1:M1 + M2] == P[:, M1:M1 + M2]",
          lambda v: (rsum(v.P) * v.P[:, v.S1.shape[1]:], v.P[:, v.S1.shape[1]:]), True, ALL),
    Claim("softmax(concat(S1, S2 - 1000, axis=-1), axis=-1)[:, 0:M1] == P[:, 0:M1]",
          lambda v: (softmax(np.concatenate([v.S1, v.S2 - 1000], -1))[:, :v.S1.shape[1]], v.P[:, :v.S1.shape[1]]),
          False),
    Claim("softmax(S + l1, axis=-1) == P", lambda v: (softmax(v.S + v.l1), v.P), False),
    Claim("softmax(S + exp(l1), axis=-1) == P", lambda v: (softmax(v.S + np.exp(v.l1)), v.P), True, ALL),
    Claim("logsumexp(S - exp(m1), axis=-1) == L - exp(m1)",
          lambda v: (logsumexp(v.S - np.exp(v.m1)), v.L - np.exp(v.m1)), True, ALL),
    Claim("sum(grad(S), axis=-1) == 0", lambda v: (rsum(v.gS), 0.0), True, ALL),
    Claim("sum(grad(S1), axis=-1) + sum(grad(S2), axis=-1) == 0 * sum(Q, axis=-1)",
          lambda v: (rsum(v.gS), 0 * rsum(v.Q)), True),
    Claim("grad(S1) == P[:, 0:M1] * (grad(O) @ V1.T - sum(grad(O) * O, axis=-1))",
          lambda v: (v.gS[:, :v.S1.shape[1]],
                     v.P[:, :v.S1.shape[1]] * (v.g("O") @ v.V1.T - rsum(v.g("O") * v.O))), True),
), other_sizes=({"N": 1, "M1": 1, "M2": 3, "d": 1}, {"N": 4, "M1": 3, "M2": 1, "d": 2}), masks=("keep1", "keep2"))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_running_max_rescale():
    check(RESCALE, budget=60)


# --- rows emptied by masks, along either axis; rows that hold +inf or NaN ---------------------------

def _rows(v):
    n, m = v.X.shape[0], v.Y.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    v["S"] = v.X @ v.Y.T
    v["A"] = v.S + np.where(v.keep > 0, 0.0, NEG_INF)
    v["C"] = v.S + np.where(j <= i, 0.0, NEG_INF)
    v["B"] = v.S + np.where(j < i, 0.0, NEG_INF)
    v["U"] = v.S + np.where(j >= i, 0.0, NEG_INF)       # row i is empty when i >= M
    v["W"] = v.S + np.where(j + n >= i + m, 0.0, NEG_INF)  # bottom-right aligned: row i empty when i < N - M... never
    with np.errstate(all="ignore"):
        v["Pi"] = v.S + _quarter(v.X[:, 0:1])           # a row of +inf where X[i, 0] = 0.25
        v["Nn"] = v.S + (_quarter(v.X[:, 0:1]) - _quarter(v.X[:, 0:1]))   # a row of NaN there
        v["Lm"] = v.S - _quarter(v.X[:, 0:1])           # a row of -inf there (a log of a square: never NaN)


ROWS = Program("masked-and-nonfinite-rows", """\
dim N = 3, M = 3, d = 2
input X[N, d], Y[M, d]
buffer keep[M], b[N, 1], c[1, M]
Mk = where(keep > 0, 0, -inf)
Mc[i:N, j:M] = where(j <= i, 0, -inf)
Ms[i:N, j:M] = where(j < i, 0, -inf)
Mu[i:N, j:M] = where(j >= i, 0, -inf)
Mw[i:N, j:M] = where(j + N >= i + M, 0, -inf)
Pi0 = -log((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25))
S = X @ Y.T
A = S + Mk
C = S + Mc
B = S + Ms
U = S + Mu
W = S + Mw
Pi = S + Pi0
Nn = S + (Pi0 - Pi0)
Lm = S + log((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25))
O = X
output O
""", _rows, (
    # U's rows are all nonempty at N = M (the default), not when N > M: never "for all sizes"
    Claim("sum(softmax(U, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.U)), 1 + 0 * v.b), True),
    Claim("softmax(U - max(U, axis=-1), axis=-1) == softmax(U, axis=-1)",
          lambda v: (softmax(v.U - amax(v.U)), softmax(v.U)), True),
    Claim("exp(U - logsumexp(U, axis=-1)) == softmax(U, axis=-1)",
          lambda v: (np.exp(v.U - logsumexp(v.U)), softmax(v.U)), True),
    Claim("logsumexp(U, axis=-1) - logsumexp(U, axis=-1) == 0 * b",
          lambda v: (logsumexp(v.U) - logsumexp(v.U), 0 * v.b), True),
    # ... but its columns are never empty (i = 0 <= j), and W's rows are never empty (j = M - 1)
    Claim("sum(softmax(U, axis=0), axis=0) == 1 + 0 * c", lambda v: (rsum(softmax(v.U, 0), 0), 1 + 0 * v.c), True, ALL),
    Claim("softmax(U - max(U, axis=0), axis=0) == softmax(U, axis=0)",
          lambda v: (softmax(v.U - amax(v.U, 0), 0), softmax(v.U, 0)), True, ALL),
    Claim("sum(softmax(W, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.W)), 1 + 0 * v.b), True, ALL),
    Claim("sum(softmax(W, axis=0), axis=0) == 1 + 0 * c", lambda v: (rsum(softmax(v.W, 0), 0), 1 + 0 * v.c), True),
    # C's columns: column j is empty where j >= N (only when M > N); B's last column is always empty
    Claim("sum(softmax(C, axis=0), axis=0) == 1 + 0 * c", lambda v: (rsum(softmax(v.C, 0), 0), 1 + 0 * v.c), True),
    Claim("softmax(C - max(C, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(v.C)), softmax(v.C)), True, ALL),
    Claim("softmax(B - max(B, axis=0), axis=0) == softmax(B, axis=0)",
          lambda v: (softmax(v.B - amax(v.B, 0), 0), softmax(v.B, 0)), False),
    Claim("sum(softmax(B, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.B)), 1 + 0 * v.b), False),
    # the last row of the strictly causal mask holds a key only when N >= 2
    Claim("sum(softmax(B[N - 1:N, :], axis=-1), axis=-1) == 1 + 0 * b[0:1, :]",
          lambda v: (rsum(softmax(v.B[-1:])), 1 + 0 * v.b[:1]), True),
    Claim("max(A, axis=0) - max(A, axis=0) == 0 * c", lambda v: (amax(v.A, 0) - amax(v.A, 0), 0 * v.c), False),
    Claim("max(A, axis=-1) - max(A, axis=-1) == 0 * b", lambda v: (amax(v.A) - amax(v.A), 0 * v.b), False),
    Claim("max(C, axis=0) - max(C, axis=0) == 0 * c", lambda v: (amax(v.C, 0) - amax(v.C, 0), 0 * v.c), True),
    # shifts by a row statistic that may be -inf, or is not one (a column statistic)
    Claim("softmax(C - max(A, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(v.A)), softmax(v.C)), False),
    Claim("softmax(A - max(C, axis=-1), axis=-1) == softmax(A, axis=-1)",
          lambda v: (softmax(v.A - amax(v.C)), softmax(v.A)), True, ALL),
    Claim("softmax(C - min(C, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amin(v.C)), softmax(v.C)), False),
    Claim("softmax(C - mean(C, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - np.mean(v.C, -1, keepdims=True)), softmax(v.C)), False),
    Claim("softmax(C - max(C, axis=0), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(v.C, 0)), softmax(v.C)), False),
    Claim("softmax(C - logsumexp(C, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - logsumexp(v.C)), softmax(v.C)), True, ALL),
    Claim("softmax(A + max(S, axis=0), axis=-1) == softmax(A, axis=-1)",
          lambda v: (softmax(v.A + amax(v.S, 0)), softmax(v.A)), False),
    Claim("softmax(A + c, axis=0) == softmax(A, axis=0)", lambda v: (softmax(v.A + v.c, 0), softmax(v.A, 0)), True, ALL),
    Claim("logsumexp(A + c, axis=0) == logsumexp(A, axis=0) + c",
          lambda v: (logsumexp(v.A + v.c, 0), logsumexp(v.A, 0) + v.c), True, ALL),
    Claim("logsumexp(A + b, axis=0) == logsumexp(A, axis=0) + max(b, axis=0)",
          lambda v: (logsumexp(v.A + v.b, 0), logsumexp(v.A, 0) + amax(v.b, 0)), False),
    # rows of +inf or NaN: softmax and logsumexp are NaN there, max is +inf or NaN
    Claim("softmax(Pi + b, axis=-1) == softmax(Pi, axis=-1)", lambda v: (softmax(v.Pi + v.b), softmax(v.Pi)), True),
    Claim("softmax(Pi - max(Pi, axis=-1), axis=-1) == softmax(Pi, axis=-1)",
          lambda v: (softmax(v.Pi - amax(v.Pi)), softmax(v.Pi)), True),
    Claim("sum(softmax(Pi, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.Pi)), 1 + 0 * v.b), False),
    Claim("sum(softmax(Nn, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.Nn)), 1 + 0 * v.b), False),
    Claim("sum(softmax(Lm, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.Lm)), 1 + 0 * v.b), False),
    Claim("logsumexp(Pi, axis=-1) == max(Pi, axis=-1)", lambda v: (logsumexp(v.Pi), amax(v.Pi)), False),
    Claim("sum(exp(Pi), axis=-1) == exp(logsumexp(Pi, axis=-1))",
          lambda v: (rsum(np.exp(v.Pi)), np.exp(logsumexp(v.Pi))), False),
    Claim("sum(exp(Lm), axis=-1) == exp(logsumexp(Lm, axis=-1))",
          lambda v: (rsum(np.exp(v.Lm)), np.exp(logsumexp(v.Lm))), True, ALL),
    Claim("log(exp(Pi)) == Pi", lambda v: (np.log(np.exp(v.Pi)), v.Pi), True),
    Claim("log(exp(Lm)) == Lm", lambda v: (np.log(np.exp(v.Lm)), v.Lm), True, ALL),
    Claim("exp(Lm - logsumexp(Lm, axis=-1)) == softmax(Lm, axis=-1)",
          lambda v: (np.exp(v.Lm - logsumexp(v.Lm)), softmax(v.Lm)), False),
    Claim("softmax(Lm, axis=-1) * exp(logsumexp(Lm, axis=-1)) == exp(Lm)",
          lambda v: (softmax(v.Lm) * np.exp(logsumexp(v.Lm)), np.exp(v.Lm)), True, ALL),
    Claim("softmax(Pi, axis=-1) * exp(logsumexp(Pi, axis=-1)) == exp(Pi)",
          lambda v: (softmax(v.Pi) * np.exp(logsumexp(v.Pi)), np.exp(v.Pi)), False),
    Claim("max(Nn + b, axis=-1) == max(Nn, axis=-1) + b", lambda v: (amax(v.Nn + v.b), amax(v.Nn) + v.b), True),
    Claim("exp(Pi) * exp(0 - Pi) == 1 + 0 * S", lambda v: (np.exp(v.Pi) * np.exp(0 - v.Pi), 1 + 0 * v.S), False),
    Claim("exp(Lm) * exp(S) == exp(Lm + S)", lambda v: (np.exp(v.Lm) * np.exp(v.S), np.exp(v.Lm + v.S)), True, ALL),
), other_sizes=({"N": 1, "M": 1, "d": 1}, {"N": 4, "M": 2, "d": 2}, {"N": 2, "M": 4, "d": 3}), masks=("keep",))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_masked_and_nonfinite_rows():
    check(ROWS, budget=60)


# --- key blocks: empty, repeated, of one key, along other axes, with heads ---------------------------

def _blocks(v):
    n, m = v.X.shape[1], v.Y.shape[1]
    i, j = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    v["S"] = v.X @ np.swapaxes(v.Y, -1, -2)
    v["A"] = v.S + np.where(v.keep > 0, 0.0, NEG_INF)
    v["C"] = v.S + np.where(j <= i, 0.0, NEG_INF)
    v["B"] = v.S + np.where(j < i, 0.0, NEG_INF)
    v["CA"] = np.concatenate([v.C, v.A], axis=-1)
    v["AA"] = np.concatenate([v.A, v.A], axis=-1)
    v["Ab"] = np.concatenate([v.A, v.b], axis=-1)
    v["BC"] = np.concatenate([v.B, v.C], axis=-2)


def _lse(x, axis=-1):
    return logsumexp(x, axis)


BLOCKS = Program("key-blocks", """\
dim h = 2, N = 3, M = 3, d = 2
input X[h, N, d], Y[h, M, d], V[h, M, d]
buffer keep[M], b[h, N, 1]
Mk = where(keep > 0, 0, -inf)
Mc[i:N, j:M] = where(j <= i, 0, -inf)
Ms[i:N, j:M] = where(j < i, 0, -inf)
S = X @ transpose(Y)
A = S + Mk
C = S + Mc
B = S + Ms
CA = concat(C, A, axis=-1)
AA = concat(A, A, axis=-1)
Ab = concat(A, b, axis=-1)
BC = concat(B, C, axis=-2)
O = X
output O
""", _blocks, (
    # a block that may be empty beside one that never is: the concat's rows hold a key
    Claim("sum(softmax(CA, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.CA)), 1 + 0 * v.b), True, ALL),
    Claim("softmax(CA, axis=-1)[:, :, M:2 * M] == exp(logsumexp(A, axis=-1) - logsumexp(CA, axis=-1)) * softmax(A, axis=-1)",
          lambda v: (softmax(v.CA)[..., v.C.shape[-1]:], np.exp(_lse(v.A) - _lse(v.CA)) * softmax(v.A)), True, ALL),
    Claim("softmax(CA, axis=-1)[:, :, M:2 * M] == exp(A - logsumexp(CA, axis=-1))",
          lambda v: (softmax(v.CA)[..., v.C.shape[-1]:], np.exp(v.A - _lse(v.CA))), True, ALL),
    Claim("softmax(CA, axis=-1) @ concat(V, V, axis=-2) == exp(logsumexp(C, axis=-1) - logsumexp(CA, axis=-1)) * (softmax(C, axis=-1) @ V) + exp(logsumexp(A, axis=-1) - logsumexp(CA, axis=-1)) * (softmax(A, axis=-1) @ V)",
          lambda v: (softmax(v.CA) @ np.concatenate([v.V, v.V], -2),
                     np.exp(_lse(v.C) - _lse(v.CA)) * (softmax(v.C) @ v.V)
                     + np.exp(_lse(v.A) - _lse(v.CA)) * (softmax(v.A) @ v.V)), True, ALL),
    # the same block twice: a row of A that is empty stays empty
    Claim("sum(softmax(AA, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.AA)), 1 + 0 * v.b), False),
    Claim("softmax(AA, axis=-1)[:, :, 0:M] == exp(logsumexp(A, axis=-1) - logsumexp(AA, axis=-1)) * softmax(A, axis=-1)",
          lambda v: (softmax(v.AA)[..., :v.A.shape[-1]], np.exp(_lse(v.A) - _lse(v.AA)) * softmax(v.A)), False),
    Claim("softmax(AA, axis=-1)[:, :, 0:M] == 0.5 * softmax(A, axis=-1)",
          lambda v: (softmax(v.AA)[..., :v.A.shape[-1]], 0.5 * softmax(v.A)), True),
    # the repeated block: log(exp(l) + exp(l)) = l + log(2), an empty row -inf on both sides (log(0) on
    # the left, -inf + log(2) on the right), so a logsumexp that may be -inf comes out of the log
    Claim("logsumexp(AA, axis=-1) == logsumexp(A, axis=-1) + log(2 + 0 * b)",
          lambda v: (_lse(v.AA), _lse(v.A) + np.log(2 + 0 * v.b)), True, ALL),
    Claim("max(AA, axis=-1) == max(A, axis=-1)", lambda v: (amax(v.AA), amax(v.A)), True, ALL),
    Claim("max(AA, axis=-1) - max(A, axis=-1) == 0 * b", lambda v: (amax(v.AA) - amax(v.A), 0 * v.b), False),
    # a block of one key (a finite column): every row holds a key
    Claim("sum(softmax(Ab, axis=-1), axis=-1) == 1 + 0 * b", lambda v: (rsum(softmax(v.Ab)), 1 + 0 * v.b), True, ALL),
    Claim("softmax(Ab, axis=-1)[:, :, M:M + 1] == exp(b - logsumexp(Ab, axis=-1))",
          lambda v: (softmax(v.Ab)[..., -1:], np.exp(v.b - _lse(v.Ab))), True, ALL),
    Claim("logsumexp(Ab, axis=-1) == log(exp(logsumexp(A, axis=-1)) + exp(b))",
          lambda v: (_lse(v.Ab), np.log(np.exp(_lse(v.A)) + np.exp(v.b))), True, ALL),
    Claim("max(Ab, axis=-1) == max(concat(b, A, axis=-1), axis=-1)",
          lambda v: (amax(v.Ab), amax(np.concatenate([v.b, v.A], -1))), True, ALL),
    Claim("softmax(Ab - max(Ab, axis=-1), axis=-1) == softmax(Ab, axis=-1)",
          lambda v: (softmax(v.Ab - amax(v.Ab)), softmax(v.Ab)), True, ALL),
    Claim("max(Ab, axis=-1) == b", lambda v: (amax(v.Ab), v.b), False),
    # blocks along the query axis: reductions along the keys do not merge them, along the queries they do
    Claim("logsumexp(BC, axis=-2) == log(exp(logsumexp(B, axis=-2)) + exp(logsumexp(C, axis=-2)))",
          lambda v: (_lse(v.BC, -2), np.log(np.exp(_lse(v.B, -2)) + np.exp(_lse(v.C, -2)))), True, ALL),
    Claim("max(BC, axis=-2) == max(concat(C, B, axis=-2), axis=-2)",
          lambda v: (amax(v.BC, -2), amax(np.concatenate([v.C, v.B], -2), -2)), True, ALL),
    Claim("sum(softmax(BC, axis=-2), axis=-2) == 1 + 0 * sum(S, axis=-2)",
          lambda v: (rsum(softmax(v.BC, -2), -2), 1 + 0 * rsum(v.S, -2)), True, ALL),
    Claim("sum(softmax(BC, axis=-1), axis=-1) == 1 + 0 * concat(b, b, axis=-2)",
          lambda v: (rsum(softmax(v.BC)), 1 + 0 * np.concatenate([v.b, v.b], -2)), False),
    Claim("logsumexp(BC, axis=-1) == concat(logsumexp(B, axis=-1), logsumexp(C, axis=-1), axis=-2)",
          lambda v: (_lse(v.BC), np.concatenate([_lse(v.B), _lse(v.C)], -2)), True),
    Claim("logsumexp(CA, axis=-2) == concat(logsumexp(C, axis=-2), logsumexp(A, axis=-2), axis=-1)",
          lambda v: (_lse(v.CA, -2), np.concatenate([_lse(v.C, -2), _lse(v.A, -2)], -1)), True),
    Claim("logsumexp(concat(C, A, axis=0), axis=0) == log(exp(logsumexp(C, axis=0)) + exp(logsumexp(A, axis=0)))",
          lambda v: (_lse(np.concatenate([v.C, v.A], 0), 0), np.log(np.exp(_lse(v.C, 0)) + np.exp(_lse(v.A, 0)))),
          True, ALL),
    Claim("logsumexp(CA, axis=0) == concat(logsumexp(C, axis=0), logsumexp(A, axis=0), axis=-1)",
          lambda v: (_lse(v.CA, 0), np.concatenate([_lse(v.C, 0), _lse(v.A, 0)], -1)), True),
    Claim("logsumexp(CA, axis=0) == concat(logsumexp(A, axis=0), logsumexp(C, axis=0), axis=-1)",
          lambda v: (_lse(v.CA, 0), np.concatenate([_lse(v.A, 0), _lse(v.C, 0)], -1)), False),
    Claim("max(concat(C, A, axis=0), axis=0) == max(concat(A, C, axis=0), axis=0)",
          lambda v: (amax(np.concatenate([v.C, v.A], 0), 0), amax(np.concatenate([v.A, v.C], 0), 0)), True, ALL),
    # shifts over heads or columns are not row statistics; one over both is
    Claim("softmax(C - max(C, axis=0), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(v.C, 0)), softmax(v.C)), False),
    Claim("softmax(C - max(max(C, axis=-1), axis=0), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(amax(v.C), 0)), softmax(v.C)), True, ALL),
    Claim("softmax(A - max(max(A, axis=-1), axis=0), axis=-1) == softmax(A, axis=-1)",
          lambda v: (softmax(v.A - amax(amax(v.A), 0)), softmax(v.A)), False),
    Claim("softmax(transpose(C), axis=-2) == transpose(softmax(C, axis=-1))",
          lambda v: (softmax(np.swapaxes(v.C, -1, -2), -2), np.swapaxes(softmax(v.C), -1, -2)), True, ALL),
    Claim("sum(softmax(transpose(B), axis=-2), axis=-2) == 1 + 0 * transpose(b)",
          lambda v: (rsum(softmax(np.swapaxes(v.B, -1, -2), -2), -2), 1 + 0 * np.swapaxes(v.b, -1, -2)), False),
    Claim("merge_heads(softmax(C, axis=-1) @ V) == merge_heads(softmax(C - max(C, axis=-1), axis=-1) @ V)",
          lambda v: (softmax(v.C) @ v.V, softmax(v.C - amax(v.C)) @ v.V), True, ALL),
), other_sizes=({"h": 1, "N": 1, "M": 1, "d": 1}, {"h": 3, "N": 4, "M": 2, "d": 2}, {"h": 1, "N": 2, "M": 4, "d": 3}),
    masks=("keep",))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_key_blocks():
    check(BLOCKS, budget=60)


# --- dims that coincide at the default sizes: true there, false where they differ -------------------

def _dims(v):
    v["XY"] = np.concatenate([v.X, v.Y], axis=-1)
    n, m = v.X.shape[0], v.K.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    v["S"] = v.X @ v.K.T
    v["U"] = v.S + np.where(j >= i, 0.0, NEG_INF)
    v["D"] = v.S + np.where(j == i, 0.0, NEG_INF)      # one key per query, while i < M
    v["E"] = v.S + np.where(j != i, 0.0, NEG_INF)      # empty at N = M = 1


DIMS = Program("coinciding-dims", """\
dim N = 3, M = 3, d = 2, e = 2
input X[N, d], Y[N, e], K[M, d]
Mu[i:N, j:M] = where(j >= i, 0, -inf)
Md[i:N, j:M] = where(j == i, 0, -inf)
Me[i:N, j:M] = where(j != i, 0, -inf)
XY = concat(X, Y, axis=-1)
S = X @ K.T
U = S + Mu
D = S + Md
E = S + Me
O = X
output O
""", _dims, (
    # a slice whose bounds are another dim: the block it names is X's only when d = e
    Claim("sum(XY[:, 0:e], axis=-1) == sum(X, axis=-1)", lambda v: (rsum(v.XY[:, :v.Y.shape[1]]), rsum(v.X)), True),
    Claim("sum(XY[:, e:d + e], axis=-1) == sum(Y, axis=-1)", lambda v: (rsum(v.XY[:, v.Y.shape[1]:]), rsum(v.Y)), True),
    Claim("sum(XY[:, d:d + e], axis=-1) == sum(Y, axis=-1)", lambda v: (rsum(v.XY[:, v.X.shape[1]:]), rsum(v.Y)),
          True, ALL),
    Claim("max(XY[:, 0:e], axis=-1) == max(X, axis=-1)", lambda v: (amax(v.XY[:, :v.Y.shape[1]]), amax(v.X)), True),
    Claim("logsumexp(XY[:, 0:e], axis=-1) == logsumexp(X, axis=-1)",
          lambda v: (logsumexp(v.XY[:, :v.Y.shape[1]]), logsumexp(v.X)), True),
    Claim("logsumexp(XY[:, 0:d], axis=-1) == logsumexp(X, axis=-1)",
          lambda v: (logsumexp(v.XY[:, :v.X.shape[1]]), logsumexp(v.X)), True, ALL),
    Claim("softmax(XY[:, 0:d], axis=-1) == softmax(X, axis=-1)",
          lambda v: (softmax(v.XY[:, :v.X.shape[1]]), softmax(v.X)), True, ALL),
    Claim("logsumexp(XY, axis=-1) == log(exp(logsumexp(XY[:, 0:e], axis=-1)) + exp(logsumexp(Y, axis=-1)))",
          lambda v: (logsumexp(v.XY), np.log(np.exp(logsumexp(v.XY[:, :v.Y.shape[1]])) + np.exp(logsumexp(v.Y)))),
          True),
    Claim("logsumexp(XY, axis=-1) == log(exp(logsumexp(XY[:, 0:e], axis=-1)) + exp(logsumexp(XY[:, e:d + e], axis=-1)))",
          lambda v: (logsumexp(v.XY), np.log(np.exp(logsumexp(v.XY[:, :v.Y.shape[1]]))
                                             + np.exp(logsumexp(v.XY[:, v.Y.shape[1]:])))), True, ALL),
    Claim("max(XY, axis=-1) == max(concat(XY[:, 0:e], XY[:, e:d + e], axis=-1), axis=-1)",
          lambda v: (amax(v.XY), amax(v.XY)), True, ALL),
    Claim("concat(XY[:, 0:e], XY[:, e:d + e], axis=-1) == XY", lambda v: (v.XY, v.XY), True, ALL),
    Claim("mean(X, axis=-1) * e == sum(X, axis=-1)", lambda v: (np.mean(v.X, -1, keepdims=True) * v.Y.shape[1],
                                                                rsum(v.X)), True),
    Claim("mean(X, axis=-1) * d == sum(X, axis=-1)", lambda v: (np.mean(v.X, -1, keepdims=True) * v.X.shape[1],
                                                                rsum(v.X)), True, ALL),
    Claim("sum(X, axis=-1) * (N - M) == 0 * sum(X, axis=-1)", lambda v: (rsum(v.X) * (v.X.shape[0] - v.K.shape[0]),
                                                                         0 * rsum(v.X)), True),
    Claim("X * (d / e) == X", lambda v: (v.X * (v.X.shape[1] / v.Y.shape[1]), v.X), True),
    Claim("X * (d / d) == X", lambda v: (v.X * 1.0, v.X), True, ALL),
    # masks whose rows hold a key only while N <= M, or only while N >= 2
    Claim("sum(softmax(U, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)",
          lambda v: (rsum(softmax(v.U)), 1 + 0 * rsum(v.X)), True),
    Claim("sum(softmax(D, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)",
          lambda v: (rsum(softmax(v.D)), 1 + 0 * rsum(v.X)), True),
    Claim("softmax(D, axis=-1) * (K @ X.T).T == softmax(D, axis=-1) * S", lambda v: (softmax(v.D) * v.S,
                                                                                   softmax(v.D) * v.S), True, ALL),
    Claim("softmax(D - max(D, axis=-1), axis=-1) == softmax(D, axis=-1)",
          lambda v: (softmax(v.D - amax(v.D)), softmax(v.D)), True),
    Claim("sum(softmax(E, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)",
          lambda v: (rsum(softmax(v.E)), 1 + 0 * rsum(v.X)), True),
    Claim("softmax(E - max(E, axis=-1), axis=-1) == softmax(E, axis=-1)",
          lambda v: (softmax(v.E - amax(v.E)), softmax(v.E)), True),
    Claim("sum(softmax(D, axis=0), axis=0) == 1 + 0 * sum(K, axis=-1).T",
          lambda v: (rsum(softmax(v.D, 0), 0), 1 + 0 * rsum(v.K).T), True),
    Claim("max(D, axis=-1) == max(S + Md, axis=-1)", lambda v: (amax(v.D), amax(v.D)), True, ALL),
), other_sizes=({"N": 1, "M": 1, "d": 1, "e": 1}, {"N": 4, "M": 2, "d": 1, "e": 3}, {"N": 2, "M": 4, "d": 3, "e": 1}))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_coinciding_dims():
    check(DIMS, budget=60)


# --- norms of rows that may be 0, divisions by sums that may be 0, logs and roots of negatives -------

def _norms(v):
    with np.errstate(all="ignore"):
        v["r"] = np.sqrt(rsum(v.Q * v.Q))
        v["Qn"] = v.Q / v.r
        v["s"] = rsum(v.Q)
        v["P"] = softmax((v.Q / v.r) @ (v.K / np.sqrt(rsum(v.K * v.K))).T)
        v["Z"] = v.Q - 0.25                           # a zero row where Q's row is 0.25


NORMS = Program("norms-and-divisions", """\
dim N = 3, d = 2
input Q[N, d], K[N, d]
param c
r = sqrt(sum(Q * Q, axis=-1))
Qn = Q / r
s = sum(Q, axis=-1)
P = softmax(Qn @ (K / sqrt(sum(K * K, axis=-1))).T, axis=-1)
Z = Q - 0.25
O = Q
output O
""", _norms, (
    Claim("(3 * Q) / sqrt(sum((3 * Q) * (3 * Q), axis=-1)) == Qn",
          lambda v: ((3 * v.Q) / np.sqrt(rsum(9 * v.Q * v.Q)), v.Qn), True, ALL),
    Claim("(-3 * Q) / sqrt(sum((-3 * Q) * (-3 * Q), axis=-1)) == 0 - Qn",
          lambda v: ((-3 * v.Q) / np.sqrt(rsum(9 * v.Q * v.Q)), 0 - v.Qn), True, ALL),
    Claim("(c * Q) / sqrt(sum((c * Q) * (c * Q), axis=-1)) == Qn",
          lambda v: ((v.c * v.Q) / np.sqrt(rsum((v.c * v.Q) ** 2)), v.Qn), False),
    Claim("(c * c * Q + Q) / sqrt(sum((c * c * Q + Q) * (c * c * Q + Q), axis=-1)) == Qn",
          lambda v: (((v.c ** 2 + 1) * v.Q) / np.sqrt(rsum(((v.c ** 2 + 1) * v.Q) ** 2)), v.Qn), True),
    Claim("Qn * r == Q", lambda v: (v.Qn * v.r, v.Q), False),
    Claim("sum(Qn * Qn, axis=-1) == 1 + 0 * r", lambda v: (rsum(v.Qn * v.Qn), 1 + 0 * v.r), False),
    Claim("sum(Qn * Qn, axis=-1) * r == r", lambda v: (rsum(v.Qn * v.Qn) * v.r, v.r), False),
    Claim("Z / sqrt(sum(Z * Z, axis=-1)) * sqrt(sum(Z * Z, axis=-1)) == Z",
          lambda v: (v.Z / np.sqrt(rsum(v.Z * v.Z)) * np.sqrt(rsum(v.Z * v.Z)), v.Z), False),
    Claim("sqrt(4 * sum(Q * Q, axis=-1)) == 2 * r", lambda v: (np.sqrt(4 * rsum(v.Q * v.Q)), 2 * v.r), True, ALL),
    Claim("sqrt(sum(Q * Q, axis=-1) / 4) == r / 2", lambda v: (np.sqrt(rsum(v.Q * v.Q) / 4), v.r / 2), True),
    Claim("1 / (2 * r) == 0.5 / r", lambda v: (1 / (2 * v.r), 0.5 / v.r), True, ALL),
    Claim("1 / (0 - s) == -1 / s", lambda v: (1 / (0 - v.s), -1 / v.s), False),
    Claim("1 / (2 * s) == 0.5 / s", lambda v: (1 / (2 * v.s), 0.5 / v.s), True),
    Claim("Q / s * s == Q", lambda v: (v.Q / v.s * v.s, v.Q), False),
    Claim("Q / s * s == Q * (s / s)", lambda v: (v.Q / v.s * v.s, v.Q * (v.s / v.s)), True),
    Claim("s / s == 1 + 0 * s", lambda v: (v.s / v.s, 1 + 0 * v.s), False),
    Claim("Q / (Z * Z + 1) * (Z * Z + 1) == Q", lambda v: (v.Q / (v.Z * v.Z + 1) * (v.Z * v.Z + 1), v.Q), True),
    Claim("exp(log(r)) == r", lambda v: (np.exp(np.log(v.r)), v.r), True, ALL),
    Claim("exp(log(s)) == s", lambda v: (np.exp(np.log(v.s)), v.s), False),
    Claim("log(exp(s) * s) == s + log(s)", lambda v: (np.log(np.exp(v.s) * v.s), v.s + np.log(v.s)), True, ALL),
    Claim("log(exp(s) * (0 - s)) == s + log(0 - s)", lambda v: (np.log(np.exp(v.s) * (0 - v.s)), v.s + np.log(0 - v.s)),
          True, ALL),
    Claim("log(s * s) == 2 * log(abs(s))", lambda v: (np.log(v.s * v.s), 2 * np.log(np.abs(v.s))), True),
    Claim("log(s * s) == 2 * log(s)", lambda v: (np.log(v.s * v.s), 2 * np.log(v.s)), False),
    Claim("sqrt(s) * sqrt(s) == s", lambda v: (np.sqrt(v.s) * np.sqrt(v.s), v.s), False),
    Claim("sqrt(s * s) == abs(s)", lambda v: (np.sqrt(v.s * v.s), np.abs(v.s)), True),
    # true (log(0) = -inf, exp(-inf + s) = 0 for the finite s): exp(log(F) + v) = F * exp(v) for F >= 0, the
    # exp(s) it leaves constant along the columns, as exp(s) of s [N, 1] is
    Claim("exp(log(Z * Z) + s) == Z * Z * exp(s)", lambda v: (np.exp(np.log(v.Z * v.Z) + v.s), v.Z * v.Z * np.exp(v.s)),
          True, ALL),
    Claim("exp(log(Z * Z) - log(Z * Z)) == 1 + 0 * Z", lambda v: (np.exp(np.log(v.Z * v.Z) - np.log(v.Z * v.Z)),
                                                                 1 + 0 * v.Z), False),
    Claim("sum(P, axis=-1) == 1 + 0 * s", lambda v: (rsum(v.P), 1 + 0 * v.s), False),
    Claim("sum(P, axis=-1) * P == P", lambda v: (rsum(v.P) * v.P, v.P), True),
    Claim("1 / sum(exp(Q), axis=-1) == exp(0 - logsumexp(Q, axis=-1))",
          lambda v: (1 / rsum(np.exp(v.Q)), np.exp(0 - logsumexp(v.Q))), True, ALL),
    Claim("Q / sum(exp(Z), axis=-1) * sum(exp(Z), axis=-1) == Q",
          lambda v: (v.Q / rsum(np.exp(v.Z)) * rsum(np.exp(v.Z)), v.Q), True),
), other_sizes=({"N": 1, "d": 1}, {"N": 4, "d": 3}))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_norms_and_divisions():
    check(NORMS, budget=60)


# --- rotations and `relative(B)`, with masks, at sizes other than the default ------------------------

def _shift_sides(b):
    return b[..., :-1, :-1], b[..., 1:, 1:]


def _rotations(v):
    n, h = v.Cq.shape[0], v.W_q.shape[1] // 2
    i = np.arange(n)[:, None]
    theta = 10000.0 ** (-np.arange(h)[None, :] / h)
    v["Cos"], v["Sin"] = np.cos(i * theta), np.sin(i * theta)
    v["G"] = v.Cos @ v.Cos.T + v.Sin @ v.Sin.T
    v["H"] = v.Cos @ v.Cos.T - v.Sin @ v.Sin.T
    v["F"] = v.Sin @ v.Cos.T - v.Cos @ v.Sin.T
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v["Mc"] = np.where(jj <= ii, 0.0, NEG_INF)
    v["Pos"] = (jj - ii).astype(np.float64)
    v["Mk"] = np.where(v.keep > 0, 0.0, NEG_INF)
    v["Q"] = v.Cq @ v.W_q


ROTATIONS = Program("rotations-and-relative", """\
dim N = 4, h = 2, d = 3
input Cq[N, d]
param W_q[d, 2 * h]
buffer keep[N]
Cos[i:N, c:h] = cos(i * 10000^(-c / h))
Sin[i:N, c:h] = sin(i * 10000^(-c / h))
G = Cos @ Cos.T + Sin @ Sin.T
H = Cos @ Cos.T - Sin @ Sin.T
F = Sin @ Cos.T - Cos @ Sin.T
Mc[i:N, j:N] = where(j <= i, 0, -inf)
Pos[i:N, j:N] = j - i
Mk = where(keep > 0, 0, -inf)
Q = Cq @ W_q
O = Q
output O
""", _rotations, (
    Claim("relative(G)", lambda v: _shift_sides(v.G), True),
    Claim("relative(F)", lambda v: _shift_sides(v.F), True),
    Claim("relative(H)", lambda v: _shift_sides(v.H), False),
    Claim("relative(Cos @ Cos.T)", lambda v: _shift_sides(v.Cos @ v.Cos.T), False),
    Claim("relative(Cos @ Sin.T + Sin @ Cos.T)", lambda v: _shift_sides(v.Cos @ v.Sin.T + v.Sin @ v.Cos.T), False),
    Claim("relative(G + Mc)", lambda v: _shift_sides(v.G + v.Mc), True),
    Claim("relative(exp(G + Mc))", lambda v: _shift_sides(np.exp(v.G + v.Mc)), True),
    Claim("relative(G + causal_mask(N))", lambda v: _shift_sides(v.G + v.Mc), True),
    Claim("relative(softmax(G + Mc, axis=-1))", lambda v: _shift_sides(softmax(v.G + v.Mc)), False),
    Claim("relative(G + Mk)", lambda v: _shift_sides(v.G + v.Mk), False),
    Claim("relative(Mc + Pos * Pos)", lambda v: _shift_sides(v.Mc + v.Pos * v.Pos), True),
    Claim("relative(Mc - Mc)", lambda v: _shift_sides(v.Mc - v.Mc), True),
    Claim("relative(Q @ Q.T)", lambda v: _shift_sides(v.Q @ v.Q.T), False),
    Claim("relative(G[0:N - 1, 1:N])", lambda v: _shift_sides(v.G[:-1, 1:]), True),
    # d = 3 is odd: the last column is a sine without its cosine, so the table's Gram matrix is not relative
    Claim("relative(sinusoidal(N, d) @ sinusoidal(N, d).T)", lambda v: _shift_sides(_sin_table(v.Cq.shape) @
                                                                                    _sin_table(v.Cq.shape).T), False),
    Claim("relative(sinusoidal(N, 2 * h) @ sinusoidal(N, 2 * h).T)",
          lambda v: _shift_sides(_sin_table((v.Cq.shape[0], v.W_q.shape[1])) @
                                 _sin_table((v.Cq.shape[0], v.W_q.shape[1])).T), True),
    # rotations as equalities
    Claim("Cos * Cos + Sin * Sin == 1 + 0 * Cos", lambda v: (v.Cos * v.Cos + v.Sin * v.Sin, 1 + 0 * v.Cos), True, ALL),
    Claim("G[0:1, 0:1] == h + 0 * G[0:1, 0:1]", lambda v: (v.G[:1, :1], v.W_q.shape[1] // 2 + 0 * v.G[:1, :1]),
          True, ALL),
    Claim("G[0:N - 1, 0:N - 1] == G[1:N, 1:N]", lambda v: _shift_sides(v.G), True),
    Claim("H[0:N - 1, 0:N - 1] == H[1:N, 1:N]", lambda v: _shift_sides(v.H), False),
    Claim("G == G.T", lambda v: (v.G, v.G.T), True),
    Claim("F == 0 - F.T", lambda v: (v.F, 0 - v.F.T), True),
    Claim("F == F.T", lambda v: (v.F, v.F.T), False),
), other_sizes=({"N": 3}, {"N": 6}), masks=("keep",))


def _sin_table(shape):
    n, d = shape
    i = np.arange(n)[:, None]
    c = np.arange(d)[None, :]
    angle = i / 10000.0 ** ((c - c % 2) / d)
    return np.where(c % 2 == 0, np.sin(angle), np.cos(angle))


@pytest.mark.slow  # about 5 s of SymPy each: the slow step runs it
def test_rotations_and_relative():
    verdicts = check(ROTATIONS, budget=60)
    # "for all N" (the other dims at the spec's sizes) must hold at other N as well
    spec = symattn.load(ROTATIONS.head + "".join(f"check {c.text}\n" for c in ROTATIONS.claims))
    for claim, verdict in zip(ROTATIONS.claims, verdicts):
        if verdict.verdict == "proved" and "for all" in verdict.method and "not shown for all" not in verdict.method:
            for sizes in ROTATIONS.other_sizes:
                assert first_difference(ROTATIONS, claim, spec.with_dims(**sizes)) is None, (claim.text, sizes)


# --- `check not ...`: proved only with a counterexample NumPy reproduces, refuted only when it holds ---

def _negations(v):
    _rows(v)
    v["Pi0"] = _quarter(v.X[:, 0:1])


NEGATIONS = Program("negations", """\
dim N = 3, M = 3, d = 2
input X[N, d], Y[M, d]
buffer keep[M]
Mk = where(keep > 0, 0, -inf)
Mc[i:N, j:M] = where(j <= i, 0, -inf)
Mu[i:N, j:M] = where(j >= i, 0, -inf)
Pi0 = -log((X[:, 0:1] - 0.25) * (X[:, 0:1] - 0.25))
S = X @ Y.T
A = S + Mk
C = S + Mc
U = S + Mu
O = X
output O
""", _negations, (
    Claim("not softmax(A - max(A, axis=-1), axis=-1) == softmax(A, axis=-1)",
          lambda v: (softmax(v.A - amax(v.A)), softmax(v.A)), False),
    Claim("not softmax(C - max(C, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(v.C)), softmax(v.C)), True),
    Claim("not sum(softmax(A, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)",
          lambda v: (rsum(softmax(v.A)), 1 + 0 * rsum(v.X)), False),
    Claim("not logsumexp(Pi0, axis=-1) == Pi0",
          lambda v: (logsumexp(v.Pi0), v.Pi0), False),       # true (the claim is false), but only at 0.25
    Claim("not logsumexp(concat(A, S, axis=-1), axis=-1) == log(exp(logsumexp(A, axis=-1)) + exp(logsumexp(S, axis=-1)))",
          lambda v: (logsumexp(np.concatenate([v.A, v.S], -1)),
                     np.log(np.exp(logsumexp(v.A)) + np.exp(logsumexp(v.S)))), True),
    Claim("not exp(A - logsumexp(A, axis=-1)) == softmax(A, axis=-1)",
          lambda v: (np.exp(v.A - logsumexp(v.A)), softmax(v.A)), False),
    Claim("not sum(softmax(U, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)",   # no counterexample at N = M
          lambda v: (rsum(softmax(v.U)), 1 + 0 * rsum(v.X)), True),
    Claim("not max(A, axis=-1) - max(A, axis=-1) == 0 * sum(X, axis=-1)",
          lambda v: (amax(v.A) - amax(v.A), 0 * rsum(v.X)), False),
    Claim("not relative(Mc)", lambda v: _shift_sides(np.broadcast_to(v.C - v.S, v.S.shape)), True),
    Claim("not relative(S)", lambda v: _shift_sides(v.S), False),
    Claim("not relative(A - S)", lambda v: _shift_sides(v.A - v.S), False),
))


def test_negations():
    text = NEGATIONS.head + "".join(f"check {c.text}\n" for c in NEGATIONS.claims)
    spec = symattn.load(text)
    verdicts = spec.check(budget=60)
    problems = []
    for claim, verdict in zip(NEGATIONS.claims, verdicts):
        inner = Claim(claim.text[len("not "):], claim.sides, claim.holds)
        difference = first_difference(NEGATIONS, inner, spec)
        shown = f"check {claim.text}: {verdict.verdict} ({verdict.method[:160]})"
        if (difference is None) != claim.holds:
            problems.append(f"{shown}: the table says the negated claim holds={claim.holds}, NumPy says {difference}")
        elif verdict.verdict == "refuted" and not claim.holds:
            problems.append(f"{shown}: refuted, but NumPy finds a counterexample ({difference})")
        elif verdict.verdict == "proved":
            if claim.holds:
                problems.append(f"{shown}: proved, but the negated claim holds in NumPy")
            elif verdict.counterexample is None:
                problems.append(f"{shown}: proved without a counterexample")
            else:
                why = numpy_claims.reproduces(NEGATIONS, inner, spec, verdict.counterexample)
                if why is not None:
                    problems.append(f"{shown}: {why}")
    assert not problems, "\n".join(problems)
