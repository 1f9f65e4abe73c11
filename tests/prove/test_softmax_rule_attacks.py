"""Each new matrix-level rule of the softmax family (issue 26) where its side condition fails.

One claim per rule and way it can go wrong: a row statistic that may be -inf
(a masked row max, a logsumexp of an empty row), one that is not constant along
the row (a column max), one that is a log of values that may be 0 (a whole row
of -inf) or negative (NaN); exp and log of values that may be 0, negative or
-inf; products of exps that would cancel -inf terms; the weights of a row that
may be empty; ties of a max. True claims are proved for all sizes (each rule
fires where it should), false ones are refuted with a counterexample NumPy
reproduces, and nothing false is proved (`numpy_claims.check`).
"""

from __future__ import annotations

import numpy as np

from numpy_claims import NEG_INF, Claim, Program, amax, check, logsumexp, rsum, softmax

ALL = "all sizes"


def _forward(v):
    n = v.X.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v["Mk"] = np.where(v.keep > 0, 0.0, NEG_INF)
    v["S"] = v.X @ v.Y.T
    v["A"] = v.S + v.Mk                                  # a row may be empty (all keys padding)
    v["B"] = v.S + np.where(j < i, 0.0, NEG_INF)         # row 0 is always empty
    v["C"] = v.S + np.where(j <= i, 0.0, NEG_INF)        # no row is empty
    with np.errstate(all="ignore"):
        v["L"] = np.log(v.X * v.X)                       # -inf where X is 0
        v["Ln"] = np.log(v.X)                            # NaN where X < 0


def _where_ties(s, g):
    hit = (s == amax(s)).astype(np.float64)
    with np.errstate(all="ignore"):
        return np.where(hit > 0, g / rsum(hit), 0.0)


ATTACKS = Program("softmax-rule-attacks", """\
dim N = 3, d = 2
input X[N, d], Y[N, d]
buffer keep[N], b[N, 1]
Mk = where(keep > 0, 0, -inf)
Ms[i:N, j:N] = where(j < i, 0, -inf)
Mc[i:N, j:N] = where(j <= i, 0, -inf)
S = X @ Y.T
A = S + Mk
B = S + Ms
C = S + Mc
L = log(X * X)
Ln = log(X)
O = X
output O
""", _forward, (
    # shift by a row statistic: finite (proved), -inf on some row, or not a row statistic (refuted)
    Claim("softmax(C - max(C, axis=-1), axis=-1) == softmax(C, axis=-1)",
          lambda v: (softmax(v.C - amax(v.C)), softmax(v.C)), True, ALL),
    Claim("softmax(B - max(B, axis=-1), axis=-1) == softmax(B, axis=-1)",
          lambda v: (softmax(v.B - amax(v.B)), softmax(v.B)), False),
    Claim("softmax(A - max(A, axis=-1), axis=-1) == softmax(A, axis=-1)",
          lambda v: (softmax(v.A - amax(v.A)), softmax(v.A)), False),
    Claim("softmax(S - max(S, axis=0), axis=-1) == softmax(S, axis=-1)",
          lambda v: (softmax(v.S - amax(v.S, 0)), softmax(v.S)), False),
    Claim("softmax(S + log(b * b), axis=-1) == softmax(S, axis=-1)",
          lambda v: (softmax(v.S + np.log(v.b * v.b)), softmax(v.S)), False),
    Claim("softmax(A + b, axis=-1) == softmax(A, axis=-1)", lambda v: (softmax(v.A + v.b), softmax(v.A)), True, ALL),
    Claim("logsumexp(A + b, axis=-1) == logsumexp(A, axis=-1) + b",
          lambda v: (logsumexp(v.A + v.b), logsumexp(v.A) + v.b), True, ALL),
    Claim("logsumexp(A - max(A, axis=-1), axis=-1) + max(A, axis=-1) == logsumexp(A, axis=-1)",
          lambda v: (logsumexp(v.A - amax(v.A)) + amax(v.A), logsumexp(v.A)), False),
    Claim("logsumexp(B - logsumexp(B, axis=-1), axis=-1) == 0 * max(S, axis=-1)",
          lambda v: (logsumexp(v.B - logsumexp(v.B)), 0 * amax(v.S)), False),
    Claim("max(A + b, axis=-1) == max(A, axis=-1) + b", lambda v: (amax(v.A + v.b), amax(v.A) + v.b), True, ALL),
    # max of blocks: the order of the blocks does not matter, dropping one does
    Claim("max(concat(X, Y, axis=-1), axis=-1) == max(concat(Y, X, axis=-1), axis=-1)",
          lambda v: (amax(np.concatenate([v.X, v.Y], -1)), amax(np.concatenate([v.Y, v.X], -1))), True, ALL),
    Claim("max(concat(X, Y, axis=-1), axis=-1) == max(X, axis=-1)",
          lambda v: (amax(np.concatenate([v.X, v.Y], -1)), amax(v.X)), False),
    # exp and log of values that may be negative, 0 or -inf
    Claim("exp(log(X)) == X", lambda v: (np.exp(np.log(v.X)), v.X), False),
    Claim("exp(log(X * X)) == X * X", lambda v: (np.exp(np.log(v.X * v.X)), v.X * v.X), True, ALL),
    Claim("log(exp(X)) == X", lambda v: (np.log(np.exp(v.X)), v.X), True, ALL),
    Claim("exp(log(X * X) + Y) == X * X * exp(Y)", lambda v: (np.exp(np.log(v.X * v.X) + v.Y), v.X * v.X * np.exp(v.Y)),
          True, ALL),
    Claim("exp(log(X) + Y) == X * exp(Y)", lambda v: (np.exp(np.log(v.X) + v.Y), v.X * np.exp(v.Y)), False),
    Claim("sum(exp(A), axis=-1) == exp(logsumexp(A, axis=-1))", lambda v: (rsum(np.exp(v.A)), np.exp(logsumexp(v.A))),
          True, ALL),
    Claim("log(sum(exp(Ln), axis=-1)) == logsumexp(Ln, axis=-1) + 0 * sum(X, axis=-1)",
          lambda v: (np.log(rsum(np.exp(v.Ln))), logsumexp(v.Ln) + 0 * rsum(v.X)), True),  # NaN rows both ways
    # products of exps
    Claim("exp(X) * exp(Y) == exp(X + Y)", lambda v: (np.exp(v.X) * np.exp(v.Y), np.exp(v.X + v.Y)), True, ALL),
    Claim("exp(X) * exp(-X) == 1 + 0 * X", lambda v: (np.exp(v.X) * np.exp(-v.X), 1 + 0 * v.X), True, ALL),
    Claim("exp(Mk) * exp(S) == exp(Mk + S)", lambda v: (np.exp(v.Mk) * np.exp(v.S), np.exp(v.Mk + v.S)), True, ALL),
    Claim("exp(L) * exp(0 - L) == 1 + 0 * X", lambda v: (np.exp(v.L) * np.exp(0 - v.L), 1 + 0 * v.X), False),
    Claim("exp(A) / sum(exp(A), axis=-1) == softmax(A, axis=-1)",
          lambda v: (np.exp(v.A) / rsum(np.exp(v.A)), softmax(v.A)), False),
    Claim("exp(C) / sum(exp(C), axis=-1) == softmax(C, axis=-1)",
          lambda v: (np.exp(v.C) / rsum(np.exp(v.C)), softmax(v.C)), True, ALL),
    # a softmax weight with the exp of its row's logsumexp, the weights' row sum beside a weight
    Claim("softmax(A, axis=-1) * exp(logsumexp(A, axis=-1) + b) == exp(A + b)",
          lambda v: (softmax(v.A) * np.exp(logsumexp(v.A) + v.b), np.exp(v.A + v.b)), True, ALL),
    Claim("softmax(A, axis=-1) * exp(logsumexp(C, axis=-1)) == exp(A)",
          lambda v: (softmax(v.A) * np.exp(logsumexp(v.C)), np.exp(v.A)), False),
    Claim("exp(B - logsumexp(B, axis=-1)) == softmax(B, axis=-1)",
          lambda v: (np.exp(v.B - logsumexp(v.B)), softmax(v.B)), False),
    Claim("sum(softmax(A, axis=-1), axis=-1) * softmax(A, axis=-1) == softmax(A, axis=-1)",
          lambda v: (rsum(softmax(v.A)) * softmax(v.A), softmax(v.A)), True, ALL),
    Claim("sum(softmax(A, axis=-1), axis=-1) * softmax(S, axis=-1) == softmax(S, axis=-1)",
          lambda v: (rsum(softmax(v.A)) * softmax(v.S), softmax(v.S)), False),
    Claim("sum(softmax(C, axis=-1), axis=-1) == 1", lambda v: (rsum(softmax(v.C)), 1.0), True, ALL),
    Claim("sum(softmax(B, axis=-1), axis=-1) == 1", lambda v: (rsum(softmax(v.B)), 1.0), False),
    Claim("sum(softmax(L, axis=-1), axis=-1) == 1", lambda v: (rsum(softmax(v.L)), 1.0), False),
    # the tie share of a max's gradient: 0 shared among ties is 0; a nonzero share is not
    Claim("where(S == max(S, axis=-1), (X[:, 0:1] - X[:, 0:1]) / sum(where(S == max(S, axis=-1), 1, 0), axis=-1), 0)"
          " == 0 * S", lambda v: (_where_ties(v.S, v.X[:, 0:1] - v.X[:, 0:1]), 0 * v.S), True, ALL),
    Claim("where(C == max(C, axis=-1), X[:, 0:1] / sum(where(C == max(C, axis=-1), 1, 0), axis=-1), 0) == 0 * S",
          lambda v: (_where_ties(v.C, v.X[:, 0:1]), 0 * v.S), False),
    Claim("sum(where(S == max(S, axis=-1), 1, 0), axis=-1) == 1 + 0 * sum(S, axis=-1)",
          lambda v: (rsum((v.S == amax(v.S)).astype(float)), 1 + 0 * rsum(v.S)), False),
), other_sizes=({"N": 2, "d": 3}, {"N": 5, "d": 1}), masks=("keep",))


def test_each_rule_where_its_side_condition_fails():
    check(ATTACKS, budget=60)


def _blocks_forward(v):
    v["XY"] = np.concatenate([v.X, v.Y], axis=-1)


# Sums over a concat or a slice (a block summed out only where it lies whole inside the axis), claims
# compared broadcast, the merge of a block with itself (twice the weight: log 2), max of a block twice.
BLOCKS = Program("blocks-and-broadcasts", """\
dim N = 3, d = 3
input X[N, d], Y[N, d]
XY = concat(X, Y, axis=-1)
O = X
output O
""", _blocks_forward, (
    Claim("sum(XY, axis=-1) == sum(X, axis=-1) + sum(Y, axis=-1)", lambda v: (rsum(v.XY), rsum(v.X) + rsum(v.Y)),
          True, ALL),
    Claim("sum(XY[:, 0:d], axis=-1) == sum(X, axis=-1)", lambda v: (rsum(v.XY[:, :v.X.shape[1]]), rsum(v.X)), True, ALL),
    Claim("sum(XY[:, 1:d + 1], axis=-1) == sum(X, axis=-1)", lambda v: (rsum(v.XY[:, 1:v.X.shape[1] + 1]), rsum(v.X)), False),
    Claim("sum(X[:, 1:d], axis=-1) == sum(X, axis=-1)", lambda v: (rsum(v.X[:, 1:]), rsum(v.X)), False),
    Claim("0 == sum(X, axis=-1) - sum(X, axis=-1)", lambda v: (0.0, rsum(v.X) - rsum(v.X)), True, ALL),
    Claim("1 == sum(softmax(X, axis=-1), axis=-1)", lambda v: (1.0, rsum(softmax(v.X))), True, ALL),
    Claim("0 * X[:, 0:1] == sum(X, axis=-1) - max(X, axis=-1)", lambda v: (0 * v.X[:, 0:1], rsum(v.X) - amax(v.X)),
          False),
    Claim("logsumexp(concat(X, X, axis=-1), axis=-1) == logsumexp(X, axis=-1) + log(2 + 0 * X[:, 0:1])",
          lambda v: (logsumexp(np.concatenate([v.X, v.X], -1)), logsumexp(v.X) + np.log(2 + 0 * v.X[:, 0:1])),
          True, ALL),
    Claim("logsumexp(concat(X, X, axis=-1), axis=-1) == logsumexp(X, axis=-1)",
          lambda v: (logsumexp(np.concatenate([v.X, v.X], -1)), logsumexp(v.X)), False),
    Claim("max(concat(X, X, axis=-1), axis=-1) == max(X, axis=-1)",
          lambda v: (amax(np.concatenate([v.X, v.X], -1)), amax(v.X)), True, ALL),
    Claim("max(concat(X, Y, axis=-1), axis=-1) == max(concat(X, X, axis=-1), axis=-1)",
          lambda v: (amax(v.XY), amax(np.concatenate([v.X, v.X], -1))), False),
), other_sizes=({"N": 2, "d": 4},))


def test_blocks_slices_and_broadcast_sides():
    check(BLOCKS, budget=60)
