"""Log-space rules where a value may be -inf (issue 26), against plain NumPy.

- `log(c * exp(u + w)) = u + log(c * exp(w))` for a u that may be -inf (a
  masked row's logsumexp), where every term of the log's argument is a positive
  multiple of one exp: on an empty row both sides are -inf (log(0) on the left,
  -inf + log(Y) on the right, log(Y) never NaN nor +inf because Y >= 0 is
  finite). So `logsumexp(concat(A, A)) = logsumexp(A) + log(2)` with masked rows.
  It must not fire where Y may be negative or NaN (a negative coefficient, a
  factor that is not an exp): there -inf + log(Y) is NaN while the left side is
  -inf.
- `exp(log(F) + v) = F * exp(v)` leaves exp(v), constant along an axis v does
  not read, at index 0 there, as the same exp of a broadcast operand is:
  `exp(log(Z * Z) + s) == Z * Z * exp(s)` for s = sum(Q, axis=-1).

Expectations are computed here in NumPy (`numpy_claims`), at zeros (zero rows
of X: log(0) = -inf), negatives, ties, and key-padding masks that empty rows.
"""

from __future__ import annotations

import numpy as np

from numpy_claims import NEG_INF, Claim, Program, amax, check, logsumexp, matrix_level_proofs, rsum

ALL = "all sizes"


def _rows(v):
    n, m = v.X.shape[1], v.Y.shape[1]
    i, j = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    v["S"] = v.X @ np.swapaxes(v.Y, -1, -2)
    v["A"] = v.S + np.where(v.keep > 0, 0.0, NEG_INF)
    v["C"] = v.S + np.where(j <= i, 0.0, NEG_INF)
    v["L"] = logsumexp(v.A)
    with np.errstate(all="ignore"):
        v["Lq"] = np.log(v.X * v.X)


def _cat(*parts):
    return np.concatenate(parts, axis=-1)


MASKED_LOG = Program("masked-log-space", """\
dim h = 2, N = 3, M = 3, d = 2
input X[h, N, d], Y[h, M, d]
buffer keep[M], b[h, N, 1]
Mk = where(keep > 0, 0, -inf)
Mc[i:N, j:M] = where(j <= i, 0, -inf)
S = X @ transpose(Y)
A = S + Mk
C = S + Mc
L = logsumexp(A, axis=-1)
Lq = log(X * X)
O = X
output O
""", _rows, (
    # a block repeated: its logsumexp plus log(k), -inf on both sides of an empty row
    Claim("logsumexp(concat(A, A, axis=-1), axis=-1) == L + log(2 + 0 * b)",
          lambda v: (logsumexp(_cat(v.A, v.A)), v.L + np.log(2 + 0 * v.b)), True, ALL),
    Claim("logsumexp(concat(A, A, A, axis=-1), axis=-1) == L + log(3 + 0 * b)",
          lambda v: (logsumexp(_cat(v.A, v.A, v.A)), v.L + np.log(3 + 0 * v.b)), True, ALL),
    Claim("log(exp(L) + exp(L)) == L + log(2 + 0 * b)", lambda v: (np.log(2 * np.exp(v.L)), v.L + np.log(2.0)),
          True, ALL),
    Claim("log(exp(L + b) + exp(L)) == L + log(exp(b) + 1)",
          lambda v: (np.log(np.exp(v.L + v.b) + np.exp(v.L)), v.L + np.log(np.exp(v.b) + 1)), True, ALL),
    Claim("log(2 * exp(logsumexp(Lq, axis=-1))) == logsumexp(Lq, axis=-1) + log(2 + 0 * b)",
          lambda v: (np.log(2 * np.exp(logsumexp(v.Lq))), logsumexp(v.Lq) + np.log(2.0)), True, ALL),
    # look-alikes: a perturbed constant, a block missing or another block, max for logsumexp
    Claim("logsumexp(concat(A, A, axis=-1), axis=-1) == L + log(2.5 + 0 * b)",
          lambda v: (logsumexp(_cat(v.A, v.A)), v.L + np.log(2.5)), False),
    Claim("logsumexp(concat(A, A, A, axis=-1), axis=-1) == L + log(2 + 0 * b)",
          lambda v: (logsumexp(_cat(v.A, v.A, v.A)), v.L + np.log(2.0)), False),
    Claim("logsumexp(concat(A, C, axis=-1), axis=-1) == L + log(2 + 0 * b)",
          lambda v: (logsumexp(_cat(v.A, v.C)), v.L + np.log(2.0)), False),
    Claim("log(2 * exp(max(Lq, axis=-1))) == logsumexp(Lq, axis=-1) + log(2 + 0 * b)",
          lambda v: (np.log(2 * np.exp(amax(v.Lq))), logsumexp(v.Lq) + np.log(2.0)), False),
    # what is left may be negative or NaN: on an empty row -inf on the left, NaN on the right
    Claim("log(exp(L) - 2 * exp(L + b)) == L + log(1 - 2 * exp(b))",
          lambda v: (np.log(np.exp(v.L) - 2 * np.exp(v.L + v.b)), v.L + np.log(1 - 2 * np.exp(v.b))), False),
    Claim("log(exp(L) * b) == L + log(b)", lambda v: (np.log(np.exp(v.L) * v.b), v.L + np.log(v.b)), False),
    Claim("log(exp(L) * (b - 1)) == L + log(b - 1)",
          lambda v: (np.log(np.exp(v.L) * (v.b - 1)), v.L + np.log(v.b - 1)), False),
    Claim("log(exp(L) + exp(logsumexp(C, axis=-1))) == L + log(1 + exp(logsumexp(C, axis=-1) - L))",
          lambda v: (np.log(np.exp(v.L) + np.exp(logsumexp(v.C))), v.L + np.log(1 + np.exp(logsumexp(v.C) - v.L))),
          False),
    # exp(log(F) + v) = F * exp(v), F >= 0: exp(v) constant along the axis v does not read
    Claim("exp(log(X * X) + sum(X, axis=-1)) == X * X * exp(sum(X, axis=-1))",
          lambda v: (np.exp(v.Lq + rsum(v.X)), v.X * v.X * np.exp(rsum(v.X))), True, ALL),
    Claim("exp(Lq + max(A, axis=-1)) == X * X * exp(max(A, axis=-1))",
          lambda v: (np.exp(v.Lq + amax(v.A)), v.X * v.X * np.exp(amax(v.A))), True, ALL),
    Claim("exp(log(X * X) + sum(X, axis=-1)) == X * X * exp(sum(X, axis=-2))",
          lambda v: (np.exp(v.Lq + rsum(v.X)), v.X * v.X * np.exp(rsum(v.X, -2))), False),
    Claim("exp(log(X * X) + sum(X, axis=-1)) == X * X * exp(sum(X, axis=-1) + 0.5)",
          lambda v: (np.exp(v.Lq + rsum(v.X)), v.X * v.X * np.exp(rsum(v.X) + 0.5)), False),
    Claim("exp(log(X * X) + X) == X * X * exp(sum(X, axis=-1))",
          lambda v: (np.exp(v.Lq + v.X), v.X * v.X * np.exp(rsum(v.X))), False),
    Claim("exp(log(X) + sum(X, axis=-1)) == X * exp(sum(X, axis=-1))",
          lambda v: (np.exp(np.log(v.X) + rsum(v.X)), v.X * np.exp(rsum(v.X))), False),
    Claim("exp(log(X * X - 0.25) + sum(X, axis=-1)) == (X * X - 0.25) * exp(sum(X, axis=-1))",
          lambda v: (np.exp(np.log(v.X * v.X - 0.25) + rsum(v.X)), (v.X * v.X - 0.25) * np.exp(rsum(v.X))), False),
    Claim("exp(Lq - Lq + sum(X, axis=-1)) == exp(sum(X, axis=-1)) + 0 * X",
          lambda v: (np.exp(v.Lq - v.Lq + rsum(v.X)), np.exp(rsum(v.X)) + 0 * v.X), False),
), other_sizes=({"h": 1, "N": 1, "M": 1, "d": 1}, {"h": 3, "N": 4, "M": 2, "d": 2}, {"h": 1, "N": 2, "M": 4, "d": 3}),
    masks=("keep",))


def test_log_space_with_masked_rows():
    check(MASKED_LOG, budget=60)


def test_no_matrix_level_proof_of_the_false_look_alikes():
    proved = matrix_level_proofs(MASKED_LOG)
    false = [c.text for c in MASKED_LOG.claims if not c.holds]
    assert not set(proved) & set(false), set(proved) & set(false)
    assert set(proved) == {c.text for c in MASKED_LOG.claims if c.proof == ALL}
