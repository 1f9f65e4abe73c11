"""The softmax family's rules for all sizes (issue 26), each attacked where its side condition fails.

What a FlashAttention-style kernel relies on, proved for all sizes: shift by a
finite row statistic, logsumexp and softmax of a concat of key blocks (two and
three, nested), the running-max rescaling, recomputing the weights from the
row logsumexp, the D trick, max's tie-aware gradient. Every rule fires only
under its finiteness side condition; the programs below make it fail (masks
that empty rows, a strict causal mask whose first row is empty, a key block
that is empty for early queries, logs of values that may be 0 or negative,
ties, -inf entries), and the claims that become false there must not be proved:
each refutation carries the fully masked row. Expectations are plain NumPy
(`numpy_claims`), sampled at zeros, negatives, ties and masks that empty rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_claims import NEG_INF, Claim, Program, amax, check, logsumexp, rsum, softmax, softmax_backward

ALL = "all sizes"


def _blocks(v):
    d = v.Q.shape[1]
    for k in (1, 2, 3):
        v[f"S{k}"] = v.Q @ v[f"K{k}"].T / np.sqrt(d)
        v[f"l{k}"] = logsumexp(v[f"S{k}"])
        v[f"O{k}"] = softmax(v[f"S{k}"]) @ v[f"V{k}"]
        v[f"m{k}"] = amax(v[f"S{k}"])
        v[f"r{k}"] = rsum(np.exp(v[f"S{k}"] - v[f"m{k}"]))
    v["S"] = np.concatenate([v.S1, v.S2, v.S3], axis=-1)
    v["V"] = np.concatenate([v.V1, v.V2, v.V3], axis=0)
    v["P"] = softmax(v.S)
    v["O"] = v.P @ v.V
    v["L"] = logsumexp(v.S)
    v["l12"] = np.log(np.exp(v.l1) + np.exp(v.l2))
    v["O12"] = np.exp(v.l1 - v.l12) * v.O1 + np.exp(v.l2 - v.l12) * v.O2
    v["m12"] = np.maximum(v.m1, v.m2)
    v["r12"] = np.exp(v.m1 - v.m12) * v.r1 + np.exp(v.m2 - v.m12) * v.r2
    v["A12"] = (np.exp(v.m1 - v.m12) * v.r1 * v.O1 + np.exp(v.m2 - v.m12) * v.r2 * v.O2) / v.r12
    gP = v.g("O") @ v.V.T
    v["gP"], v["gS"] = gP, softmax_backward(v.P, gP)
    v["D"] = rsum(v.g("O") * v.O)


BLOCKS = Program("three-key-blocks", """\
dim N = 3, M1 = 2, M2 = 2, M3 = 2, d = 2
input Q[N, d], K1[M1, d], K2[M2, d], K3[M3, d], V1[M1, d], V2[M2, d], V3[M3, d]
S1 = Q @ K1.T / sqrt(d)
S2 = Q @ K2.T / sqrt(d)
S3 = Q @ K3.T / sqrt(d)
S = concat(S1, S2, S3, axis=-1)
V = concat(V1, V2, V3, axis=0)
P = softmax(S, axis=-1)
O = P @ V
L = logsumexp(S, axis=-1)
l1 = logsumexp(S1, axis=-1)
l2 = logsumexp(S2, axis=-1)
l3 = logsumexp(S3, axis=-1)
O1 = softmax(S1, axis=-1) @ V1
O2 = softmax(S2, axis=-1) @ V2
O3 = softmax(S3, axis=-1) @ V3
l12 = log(exp(l1) + exp(l2))
O12 = exp(l1 - l12) * O1 + exp(l2 - l12) * O2
m1 = max(S1, axis=-1)
m2 = max(S2, axis=-1)
m12 = max(concat(m1, m2, axis=-1), axis=-1)
r1 = sum(exp(S1 - m1), axis=-1)
r2 = sum(exp(S2 - m2), axis=-1)
r12 = exp(m1 - m12) * r1 + exp(m2 - m12) * r2
A12 = (exp(m1 - m12) * r1 * O1 + exp(m2 - m12) * r2 * O2) / r12
output O
""", _blocks, (
    Claim("softmax(S - max(S, axis=-1), axis=-1) == P", lambda v: (softmax(v.S - amax(v.S)), v.P), True, ALL),
    Claim("logsumexp(S - max(S, axis=-1), axis=-1) + max(S, axis=-1) == L",
          lambda v: (logsumexp(v.S - amax(v.S)) + amax(v.S), v.L), True, ALL),
    Claim("exp(S - L) == P", lambda v: (np.exp(v.S - v.L), v.P), True, ALL),
    Claim("L == log(exp(l1) + exp(l2) + exp(l3))", lambda v: (v.L, np.log(np.exp(v.l1) + np.exp(v.l2) + np.exp(v.l3))),
          True, ALL),
    Claim("L == log(exp(l12) + exp(l3))", lambda v: (v.L, np.log(np.exp(v.l12) + np.exp(v.l3))), True, ALL),
    Claim("O == exp(l1 - L) * O1 + exp(l2 - L) * O2 + exp(l3 - L) * O3",
          lambda v: (v.O, np.exp(v.l1 - v.L) * v.O1 + np.exp(v.l2 - v.L) * v.O2 + np.exp(v.l3 - v.L) * v.O3), True, ALL),
    Claim("O == exp(l12 - L) * O12 + exp(l3 - L) * O3",
          lambda v: (v.O, np.exp(v.l12 - v.L) * v.O12 + np.exp(v.l3 - v.L) * v.O3), True, ALL),
    Claim("logsumexp(concat(S2, S1, axis=-1), axis=-1) == l12",
          lambda v: (logsumexp(np.concatenate([v.S2, v.S1], axis=-1)), v.l12), True, ALL),
    Claim("m12 == max(concat(S2, S1, axis=-1), axis=-1)",
          lambda v: (v.m12, amax(np.concatenate([v.S2, v.S1], axis=-1))), True, ALL),
    Claim("r12 == sum(exp(concat(S1, S2, axis=-1) - m12), axis=-1)",
          lambda v: (v.r12, rsum(np.exp(np.concatenate([v.S1, v.S2], axis=-1) - v.m12))), True, ALL),
    Claim("m12 + log(r12) == l12", lambda v: (v.m12 + np.log(v.r12), v.l12), True, ALL),
    Claim("A12 == O12", lambda v: (v.A12, v.O12), True, ALL),
    Claim("sum(grad(P) * P, axis=-1) == sum(grad(O) * O, axis=-1)", lambda v: (rsum(v.gP * v.P), v.D), True, ALL),
    Claim("grad(S) == exp(S - L) * (grad(O) @ V.T - sum(grad(O) * O, axis=-1))",
          lambda v: (v.gS, np.exp(v.S - v.L) * (v.gP - v.D)), True, ALL),
    Claim("grad(V1) == exp(S1 - L).T @ grad(O)", lambda v: ((v.P.T @ v.g("O"))[:v.V1.shape[0]],
                                                          np.exp(v.S1 - v.L).T @ v.g("O")), True, ALL),
    Claim("sum(grad(S), axis=-1) == 0", lambda v: (rsum(v.gS), 0.0), True, ALL),
    # look-alikes: a block dropped, weights not rescaled, the wrong logsumexp, the running sum not rescaled
    Claim("L == log(exp(l1) + exp(l2))", lambda v: (v.L, np.log(np.exp(v.l1) + np.exp(v.l2))), False),
    Claim("O == O1 + O2 + O3", lambda v: (v.O, v.O1 + v.O2 + v.O3), False),
    Claim("O == exp(l1 - l12) * O1 + exp(l2 - l12) * O2 + exp(l3 - L) * O3",
          lambda v: (v.O, np.exp(v.l1 - v.l12) * v.O1 + np.exp(v.l2 - v.l12) * v.O2 + np.exp(v.l3 - v.L) * v.O3), False),
    Claim("r12 == r1 + r2", lambda v: (v.r12, v.r1 + v.r2), False),
    Claim("exp(S - max(S, axis=-1)) == P", lambda v: (np.exp(v.S - amax(v.S)), v.P), False),
    Claim("exp(S1 - l1) == exp(S1 - L)", lambda v: (np.exp(v.S1 - v.l1), np.exp(v.S1 - v.L)), False),
    Claim("m12 == max(S1, axis=-1)", lambda v: (v.m12, v.m1), False),
    Claim("A12 == exp(m1 - m12) * O1 + exp(m2 - m12) * O2",
          lambda v: (v.A12, np.exp(v.m1 - v.m12) * v.O1 + np.exp(v.m2 - v.m12) * v.O2), False),
), other_sizes=({"N": 2, "M1": 1, "M2": 3, "M3": 1, "d": 3}, {"N": 4, "M1": 3, "M2": 1, "M3": 2, "d": 1}))


def _causal_blocks(v):
    n, m1 = v.Q.shape[0], v.K1.shape[0]
    m2 = v.K2.shape[0]
    i = np.arange(n)[:, None]
    v["C1"] = np.where(np.arange(m1)[None, :] <= i, 0.0, NEG_INF)
    v["C2"] = np.where(np.arange(m2)[None, :] + m1 <= i, 0.0, NEG_INF)
    v["S1"] = v.Q @ v.K1.T + v.C1
    v["S2"] = v.Q @ v.K2.T + v.C2
    v["S"] = np.concatenate([v.S1, v.S2], axis=-1)
    v["V"] = np.concatenate([v.V1, v.V2], axis=0)
    v["P"] = softmax(v.S)
    v["O"] = v.P @ v.V
    v["L"] = logsumexp(v.S)
    v["l1"], v["l2"] = logsumexp(v.S1), logsumexp(v.S2)
    v["O1"], v["O2"] = softmax(v.S1) @ v.V1, softmax(v.S2) @ v.V2
    v["gP"] = v.g("O") @ v.V.T
    v["gS"] = softmax_backward(v.P, v.gP)


# Split-K of causal attention: the second key block is fully masked for the early queries (their
# row of S2 is empty), but no row of the whole S is, so the merge holds and the second block's
# own max-shift and recompute do not.
CAUSAL_BLOCKS = Program("causal-key-blocks", """\
dim N = 3, M1 = 2, M2 = 2, d = 2
input Q[N, d], K1[M1, d], K2[M2, d], V1[M1, d], V2[M2, d]
C1[i:N, j:M1] = where(j <= i, 0, -inf)
C2[i:N, j:M2] = where(j + M1 <= i, 0, -inf)
S1 = Q @ K1.T + C1
S2 = Q @ K2.T + C2
S = concat(S1, S2, axis=-1)
V = concat(V1, V2, axis=0)
P = softmax(S, axis=-1)
O = P @ V
L = logsumexp(S, axis=-1)
l1 = logsumexp(S1, axis=-1)
l2 = logsumexp(S2, axis=-1)
O1 = softmax(S1, axis=-1) @ V1
O2 = softmax(S2, axis=-1) @ V2
output O
""", _causal_blocks, (
    Claim("L == log(exp(l1) + exp(l2))", lambda v: (v.L, np.log(np.exp(v.l1) + np.exp(v.l2))), True, ALL),
    Claim("O == exp(l1 - L) * O1 + exp(l2 - L) * O2",
          lambda v: (v.O, np.exp(v.l1 - v.L) * v.O1 + np.exp(v.l2 - v.L) * v.O2), True, ALL),
    Claim("exp(S - L) == P", lambda v: (np.exp(v.S - v.L), v.P), True, ALL),
    Claim("softmax(S - max(S, axis=-1), axis=-1) == P", lambda v: (softmax(v.S - amax(v.S)), v.P), True, ALL),
    Claim("sum(P, axis=-1) == 1", lambda v: (rsum(v.P), 1.0), True, ALL),
    Claim("grad(S) == exp(S - L) * (grad(P) - sum(grad(O) * O, axis=-1))",
          lambda v: (v.gS, np.exp(v.S - v.L) * (v.gP - rsum(v.g("O") * v.O))), True, ALL),
    Claim("sum(grad(S), axis=-1) == 0", lambda v: (rsum(v.gS), 0.0), True, ALL),
    Claim("softmax(S2, axis=-1) * exp(l2 - L) == exp(S2 - L)",
          lambda v: (softmax(v.S2) * np.exp(v.l2 - v.L), np.exp(v.S2 - v.L)), True, ALL),
    # false on the queries whose row of S2 is empty (NaN against 0), or everywhere
    Claim("exp(S2 - l2) == softmax(S2, axis=-1)", lambda v: (np.exp(v.S2 - v.l2), softmax(v.S2)), False),
    Claim("softmax(S2 - max(S2, axis=-1), axis=-1) == softmax(S2, axis=-1)",
          lambda v: (softmax(v.S2 - amax(v.S2)), softmax(v.S2)), False),
    Claim("sum(softmax(S2, axis=-1), axis=-1) == 1", lambda v: (rsum(softmax(v.S2)), 1.0), False),
    Claim("logsumexp(S2 - max(S2, axis=-1), axis=-1) + max(S2, axis=-1) == l2",
          lambda v: (logsumexp(v.S2 - amax(v.S2)) + amax(v.S2), v.l2), False),
    Claim("O == exp(l1 - L) * O1 + exp(l2 - l1) * O2",
          lambda v: (v.O, np.exp(v.l1 - v.L) * v.O1 + np.exp(v.l2 - v.l1) * v.O2), False),
    Claim("O == O1", lambda v: (v.O, v.O1), False),
), other_sizes=({"N": 4, "M1": 1, "M2": 2, "d": 1}, {"N": 2, "M1": 3, "M2": 1, "d": 2}))


def _padded(v):
    v["Mk"] = np.where(v.keep > 0, 0.0, NEG_INF)
    v["S"] = v.Q @ v.K.T + v.Mk
    v["P"] = softmax(v.S)
    v["O"] = v.P @ v.V
    v["L"] = logsumexp(v.S)
    v["gP"] = v.g("O") @ v.V.T
    v["gS"] = softmax_backward(v.P, v.gP)


# Key padding: a query whose keys are all padding has an empty row (P = 0, L = -inf).
PADDED = Program("key-padding", """\
dim N = 3, M = 4, d = 2
input Q[N, d], K[M, d], V[M, d]
buffer keep[M], b[N, 1]
Mk = where(keep > 0, 0, -inf)
S = Q @ K.T + Mk
P = softmax(S, axis=-1)
O = P @ V
L = logsumexp(S, axis=-1)
output O
""", _padded, (
    Claim("sum(grad(S), axis=-1) == 0", lambda v: (rsum(v.gS), 0.0), True, ALL),
    Claim("grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1))", lambda v: (v.gS, softmax_backward(v.P, v.gP)),
          True, ALL),
    Claim("sum(grad(P) * P, axis=-1) == sum(grad(O) * O, axis=-1)",
          lambda v: (rsum(v.gP * v.P), rsum(v.g("O") * v.O)), True, ALL),
    Claim("sum(P, axis=-1) * P == P", lambda v: (rsum(v.P) * v.P, v.P), True, ALL),
    Claim("softmax(S + b, axis=-1) == P", lambda v: (softmax(v.S + v.b), v.P), True, ALL),
    Claim("logsumexp(S + b, axis=-1) == L + b", lambda v: (logsumexp(v.S + v.b), v.L + v.b), True, ALL),
    Claim("max(S - 2 * b, axis=-1) == max(S, axis=-1) - 2 * b", lambda v: (amax(v.S - 2 * v.b), amax(v.S) - 2 * v.b),
          True, ALL),
    Claim("sum(exp(S), axis=-1) == exp(L)", lambda v: (rsum(np.exp(v.S)), np.exp(v.L)), True, ALL),
    # false on a row whose keys are all padding
    Claim("softmax(S - max(S, axis=-1), axis=-1) == P", lambda v: (softmax(v.S - amax(v.S)), v.P), False),
    Claim("logsumexp(S - max(S, axis=-1), axis=-1) + max(S, axis=-1) == L",
          lambda v: (logsumexp(v.S - amax(v.S)) + amax(v.S), v.L), False),
    Claim("exp(S - L) == P", lambda v: (np.exp(v.S - v.L), v.P), False),
    Claim("sum(P, axis=-1) == 1", lambda v: (rsum(v.P), 1.0), False),
    Claim("grad(S) == exp(S - L) * (grad(P) - sum(grad(O) * O, axis=-1))",
          lambda v: (v.gS, np.exp(v.S - v.L) * (v.gP - rsum(v.g("O") * v.O))), False),
    Claim("exp(S - max(S, axis=-1)) / sum(exp(S - max(S, axis=-1)), axis=-1) == P",
          lambda v: (np.exp(v.S - amax(v.S)) / rsum(np.exp(v.S - amax(v.S))), v.P), False),
), other_sizes=({"N": 2, "M": 5, "d": 1},), masks=("keep",))


@pytest.mark.parametrize("program", [BLOCKS, CAUSAL_BLOCKS, PADDED], ids=lambda p: p.name)
def test_online_softmax_claims(program):
    check(program, budget=60)


def test_a_refuted_padding_claim_shows_the_empty_row():
    """The counterexample of a claim false only on a fully masked row has that row: keep <= 0
    everywhere, and the sides differ there as NaN against 0."""
    (verdict,) = [v for v, c in zip(check(PADDED, budget=60), PADDED.claims) if c.text == "exp(S - L) == P"]
    assert verdict.verdict == "refuted"
    ce = verdict.counterexample
    keep = np.asarray(ce.inputs["keep"], dtype=np.float64)
    assert (keep <= 0).all(), keep
    lhs, rhs = np.asarray(ce.lhs, dtype=np.float64), np.asarray(ce.rhs, dtype=np.float64)
    assert np.isnan(lhs).all() and (rhs == 0).all(), (lhs, rhs)
