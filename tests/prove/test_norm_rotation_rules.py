"""Norm and rotation algebra (issue 26): QK-norm with Q = X @ W_q, scale invariance, RoPE with shifted keys.

- `sqrt(sum(Q * Q, axis=-1))` is a norm whose zero set is "row i of Q is 0";
  with Q = X @ W_q the element level could not tell where that sum of squares
  is 0, so the QK-norm backward was unknown. The element level compares the
  claim with Q (K, V) as free tensors, a stronger claim, in every region (a zero
  row: both sides NaN).
- The matrix level proves the backward for all sizes (`symattn.prove.norm_rows`), with the row
  norm taken as > 0, each of its reciprocals read at the entry's own row, and
  both sides NaN on a zero row (0 / 0 reaches every entry). Its look-alikes are
  not proved: a side that is not NaN on a zero row (`Qn - Qn + Qz == Qz`), a norm
  read at another row (`sum(Qn, axis=0) * 0`), a missing factor, a perturbed
  constant, the wrong axis or the wrong norm.
- `(c * Q) / sqrt(sum((c * Q) * (c * Q)))` is Q's normalised row for every
  number c != 0, up to sign, for all sizes: sqrt(c^2 s) = |c| sqrt(s) and
  1 / (c * x) = (1 / c) / x, exact under IEEE semantics (0 / 0 is NaN both ways).
- RoPE's rotation products with the keys at shifted positions, cos((j + 3) t),
  are relative: the exact zero test writes j/100 + 1/25 as j/100 + 4 * (1/100),
  so the shifted angles share their base. For every number of rotation pairs h
  (head dim 2 h) too: the contraction over 2 h is written block by block (the
  two halves of the rotated concat), each block a sum over c < h whose summand,
  cos(i t_c) cos((j + 3) t_c) + ..., with t_c = 10000^(-c / h) symbolic, is
  compared by angle addition. Look-alikes (keys at 2 j + 3, halves swapped,
  another base for the keys' frequencies, one half not rotated) are not proved.

Against NumPy (`numpy_claims`), with zeros (zero rows), negatives and ties.
"""

from __future__ import annotations

import numpy as np
import pytest

import numpy_claims
import symattn
from numpy_claims import Claim, Program, check, matrix_level_proofs, rsum, softmax, softmax_backward

ALL = "all sizes"


def _qknorm(v):
    v["Q"], v["K"], v["V"] = v.X @ v.W_q, v.X @ v.W_k, v.X @ v.W_v
    with np.errstate(all="ignore"):
        v["r"], v["rk"] = np.sqrt(rsum(v.Q * v.Q)), np.sqrt(rsum(v.K * v.K))
        v["Qn"], v["Kn"] = v.Q / v.r, v.K / v.rk
        v["P"] = softmax(v.Qn @ v.Kn.T)
        v["O"] = v.P @ v.V
        gS = softmax_backward(v.P, v.g("O") @ v.V.T)
        v["gQn"] = gS @ v.Kn
        # the chain rule through Q / sqrt(sum(Q * Q)), written out: d/dQ of Q * s^(-1/2), s = sum(Q * Q)
        v["gQ"] = v.gQn / v.r - v.Q * rsum(v.gQn * v.Q) / v.r ** 3


def _scaled(c, q):
    with np.errstate(all="ignore"):
        return (c * q) / np.sqrt(rsum((c * q) * (c * q)))


QKNORM = Program("qk-norm", """\
dim N = 3, d = 3, d_k = 2
input X[N, d]
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k], tau
Q = X @ W_q
K = X @ W_k
V = X @ W_v
Qn = Q / sqrt(sum(Q * Q, axis=-1))
Kn = K / sqrt(sum(K * K, axis=-1))
P = softmax(Qn @ Kn.T, axis=-1)
O = P @ V
output O
""", _qknorm, (
    Claim("grad(Q) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Q * Q, axis=-1))",
          lambda v: (v.gQ, (v.gQn - v.Qn * rsum(v.gQn * v.Qn)) / v.r), True, ALL),
    Claim("(2 * Q) / sqrt(sum((2 * Q) * (2 * Q), axis=-1)) == Qn", lambda v: (_scaled(2, v.Q), v.Qn), True, ALL),
    Claim("(0.5 * Q) / sqrt(sum((0.5 * Q) * (0.5 * Q), axis=-1)) == Qn", lambda v: (_scaled(0.5, v.Q), v.Qn), True, ALL),
    Claim("(-3 * Q) / sqrt(sum((-3 * Q) * (-3 * Q), axis=-1)) == -Qn", lambda v: (_scaled(-3, v.Q), -v.Qn), True, ALL),
    Claim("sum(Qn * Qn, axis=-1) == sum(Q * Q, axis=-1) / sum(Q * Q, axis=-1)",
          lambda v: (rsum(v.Qn * v.Qn), rsum(v.Q * v.Q) / rsum(v.Q * v.Q)), True, "proved"),
    # false: on a zero row (NaN against a number), for a negative tau, or everywhere
    Claim("(2 * Q) / sqrt(sum(Q * Q, axis=-1)) == Qn", lambda v: (2 * v.Q / v.r, v.Qn), False),
    Claim("(tau * Q) / sqrt(sum((tau * Q) * (tau * Q), axis=-1)) == Qn", lambda v: (_scaled(v.tau, v.Q), v.Qn), False),
    Claim("sum(Qn * Qn, axis=-1) == 1", lambda v: (rsum(v.Qn * v.Qn), 1.0), False),
    Claim("Qn * sqrt(sum(Q * Q, axis=-1)) == Q", lambda v: (v.Qn * v.r, v.Q), False),
    Claim("grad(Q) == grad(Qn) / sqrt(sum(Q * Q, axis=-1))", lambda v: (v.gQ, v.gQn / v.r), False),
), other_sizes=({"N": 2, "d": 2, "d_k": 3},))


def _rel(b):
    return b[..., :-1, :-1], b[..., 1:, 1:]


def _rope(v):
    n, h = v.X.shape[0], v.W_q.shape[1] // 2
    theta = 10000.0 ** (-np.arange(h) / h)
    i = np.arange(n)[:, None]
    v["Cos"], v["Sin"] = np.cos(i * theta), np.sin(i * theta)
    v["CosK"], v["SinK"] = np.cos((i + 3) * theta), np.sin((i + 3) * theta)
    v["CosD"], v["SinD"] = np.cos((2 * i + 3) * theta), np.sin((2 * i + 3) * theta)
    q, k = v.W_q[0:1], v.W_k[0:1]
    v["Rq"] = np.concatenate([q[:, :h] * v.Cos - q[:, h:] * v.Sin, q[:, h:] * v.Cos + q[:, :h] * v.Sin], axis=-1)
    v["Rk"] = np.concatenate([k[:, :h] * v.CosK - k[:, h:] * v.SinK, k[:, h:] * v.CosK + k[:, :h] * v.SinK], axis=-1)
    v["Rd"] = np.concatenate([k[:, :h] * v.CosD - k[:, h:] * v.SinD, k[:, h:] * v.CosD + k[:, :h] * v.SinD], axis=-1)


ROPE = Program("rope-shifted-keys", """\
dim N = 4, d = 3, h = 2
input X[N, d]
param W_q[d, 2 * h], W_k[d, 2 * h]
Cos[i:N, c:h] = cos(i * 10000^(-c / h))
Sin[i:N, c:h] = sin(i * 10000^(-c / h))
CosK[j:N, c:h] = cos((j + 3) * 10000^(-c / h))
SinK[j:N, c:h] = sin((j + 3) * 10000^(-c / h))
CosD[j:N, c:h] = cos((2 * j + 3) * 10000^(-c / h))
SinD[j:N, c:h] = sin((2 * j + 3) * 10000^(-c / h))
Rq = concat(W_q[0:1, 0:h] * Cos - W_q[0:1, h:2 * h] * Sin, W_q[0:1, h:2 * h] * Cos + W_q[0:1, 0:h] * Sin, axis=-1)
Rk = concat(W_k[0:1, 0:h] * CosK - W_k[0:1, h:2 * h] * SinK, W_k[0:1, h:2 * h] * CosK + W_k[0:1, 0:h] * SinK, axis=-1)
Rd = concat(W_k[0:1, 0:h] * CosD - W_k[0:1, h:2 * h] * SinD, W_k[0:1, h:2 * h] * CosD + W_k[0:1, 0:h] * SinD, axis=-1)
O = X
output O
""", _rope, (
    Claim("relative(Rq @ Rk.T)", lambda v: _rel(v.Rq @ v.Rk.T), True, "proved"),
    Claim("relative(Cos @ CosK.T + Sin @ SinK.T)", lambda v: _rel(v.Cos @ v.CosK.T + v.Sin @ v.SinK.T), True, "proved"),
    Claim("CosK * CosK + SinK * SinK == ones(N, h)", lambda v: (v.CosK ** 2 + v.SinK ** 2, 1.0), True, ALL),
    # keys at positions 2 j + 3 (a stride), or rotated the other way: not relative
    Claim("relative(Rq @ Rd.T)", lambda v: _rel(v.Rq @ v.Rd.T), False),
    Claim("relative(Cos @ CosK.T - Sin @ SinK.T)", lambda v: _rel(v.Cos @ v.CosK.T - v.Sin @ v.SinK.T), False),
), other_sizes=({"N": 3},))


def _zero_rows(v):
    v["Qz"] = np.where(v.keep > 0, 1.0, 0.0) * v.Q          # the rows whose keep is <= 0 are zero
    with np.errstate(all="ignore"):
        v["r"], v["rk"] = np.sqrt(rsum(v.Qz * v.Qz)), np.sqrt(rsum(v.K * v.K))
        v["Qn"], v["Kn"] = v.Qz / v.r, v.K / v.rk
        v["P"] = softmax(v.Qn @ v.Kn.T)
        gS = softmax_backward(v.P, v.g("O") @ v.V.T)
        v["gQn"], v["gKn"] = gS @ v.Kn, gS.T @ v.Qn
        v["gQz"] = v.gQn / v.r - v.Qz * rsum(v.gQn * v.Qz) / v.r ** 3   # the chain rule, written out
        v["gK"] = v.gKn / v.rk - v.K * rsum(v.gKn * v.K) / v.rk ** 3


def _backward(v, g, n, r):
    return (g - n * rsum(g * n)) / r


ZERO_ROWS = Program("qk-norm-zero-rows", """\
dim N = 3, d = 2
input Q[N, d], K[N, d], V[N, d]
buffer keep[N, 1]
Qz = where(keep > 0, 1, 0) * Q
Qn = Qz / sqrt(sum(Qz * Qz, axis=-1))
Kn = K / sqrt(sum(K * K, axis=-1))
P = softmax(Qn @ Kn.T, axis=-1)
O = P @ V
output O
""", _zero_rows, (
    Claim("grad(Qz) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Qz * Qz, axis=-1))",
          lambda v: (v.gQz, _backward(v, v.gQn, v.Qn, v.r)), True, ALL),
    Claim("grad(K) == (grad(Kn) - Kn * sum(grad(Kn) * Kn, axis=-1)) / sqrt(sum(K * K, axis=-1))",
          lambda v: (v.gK, _backward(v, v.gKn, v.Kn, v.rk)), True, ALL),
    Claim("grad(Qz) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Qz * Qz, axis=-1)) + 0 * Qz",
          lambda v: (v.gQz, _backward(v, v.gQn, v.Qn, v.r) + 0 * v.Qz), True, ALL),
    Claim("Qn - Qn == 0 * Qn", lambda v: (v.Qn - v.Qn, 0 * v.Qn), True, ALL),
    # not NaN on a zero row on one side: the zero row is the counterexample
    Claim("Qn - Qn + Qz == Qz", lambda v: (v.Qn - v.Qn + v.Qz, v.Qz), False),
    Claim("Qn - Qn == 0 * Qz", lambda v: (v.Qn - v.Qn, 0 * v.Qz), False),
    Claim("Qn * sqrt(sum(Qz * Qz, axis=-1)) == Qz", lambda v: (v.Qn * v.r, v.Qz), False),
    # the norm read at another row: a zero row there makes the left side NaN on every row
    Claim("Qn - Qn + sum(Qn, axis=0) * 0 == 0 * Qn", lambda v: (v.Qn - v.Qn + rsum(v.Qn, 0) * 0, 0 * v.Qn), False),
    # a missing factor, a perturbed constant, the wrong axis, the wrong norm, a norm that is never 0
    Claim("grad(Qz) == (grad(Qn) - sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Qz * Qz, axis=-1))",
          lambda v: (v.gQz, (v.gQn - rsum(v.gQn * v.Qn)) / v.r), False),
    Claim("grad(Qz) == (grad(Qn) - 2 * Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Qz * Qz, axis=-1))",
          lambda v: (v.gQz, (v.gQn - 2 * v.Qn * rsum(v.gQn * v.Qn)) / v.r), False),
    Claim("grad(Qz) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=0)) / sqrt(sum(Qz * Qz, axis=-1))",
          lambda v: (v.gQz, (v.gQn - v.Qn * rsum(v.gQn * v.Qn, 0)) / v.r), False),
    Claim("grad(Qz) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(K * K, axis=-1))",
          lambda v: (v.gQz, _backward(v, v.gQn, v.Qn, v.rk)), False),
    Claim("grad(Qz) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Qz * Qz, axis=-1) + 1)",
          lambda v: (v.gQz, _backward(v, v.gQn, v.Qn, np.sqrt(v.r * v.r + 1))), False),
    Claim("grad(Qz) == grad(Qn) / sqrt(sum(Qz * Qz, axis=-1))", lambda v: (v.gQz, v.gQn / v.r), False),
), other_sizes=({"N": 1, "d": 1}, {"N": 4, "d": 3}, {"N": 2, "d": 5}), masks=("keep",))


def _heads(v):
    v["Qz"] = np.where(v.keep > 0, 1.0, 0.0) * v.Q
    with np.errstate(all="ignore"):
        v["r"] = np.sqrt(rsum(v.Qz * v.Qz))
        v["Qn"] = v.Qz / v.r


def _t(x):
    return np.swapaxes(x, -1, -2)


HEADS = Program("norm-rows-with-heads", """\
dim h = 2, N = 3, d = 2
input Q[h, N, d]
buffer keep[h, N, 1]
Qz = where(keep > 0, 1, 0) * Q
Qn = Qz / sqrt(sum(Qz * Qz, axis=-1))
O = Qn
output O
""", _heads, (
    Claim("grad(Qz) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Qz * Qz, axis=-1))",
          lambda v: (_backward(v, v.g("O"), v.Qn, v.r), _backward(v, v.g("O"), v.Qn, v.r)), True, ALL),
    Claim("sum(Qn, axis=-1) - sum(Qn, axis=-1) == 0 * sum(Qn, axis=-1)", lambda v: (rsum(v.Qn) * 0, 0 * rsum(v.Qn)),
          True, ALL),
    # true, but each entry reads other rows' norms (a sum over rows, a product of rows): not by this rule
    Claim("Qn @ transpose(Qn) - Qn @ transpose(Qn) == 0 * (Qn @ transpose(Qn))",
          lambda v: (v.Qn @ _t(v.Qn) - v.Qn @ _t(v.Qn), 0 * (v.Qn @ _t(v.Qn))), True),
    # false: another row's zero makes the left side NaN (over the queries, over the heads), a side not NaN
    # on a zero row, a division by a value that is 0 off the zero rows
    Claim("sum(Qn, axis=-2) * 0 + Qn - Qn == 0 * Qn", lambda v: (rsum(v.Qn, -2) * 0 + v.Qn - v.Qn, 0 * v.Qn), False),
    Claim("Qn - Qn + 0 * sum(Qn, axis=0) == 0 * Qn",
          lambda v: (v.Qn - v.Qn + 0 * np.sum(v.Qn, axis=0, keepdims=True), 0 * v.Qn), False),
    Claim("Qn * 0 == 0 * Qz", lambda v: (v.Qn * 0, 0 * v.Qz), False),
    Claim("exp(Qn - Qn) * Qz == Qz", lambda v: (np.exp(v.Qn - v.Qn) * v.Qz, v.Qz), False),
    Claim("(Qn - Qn) / Qn == 0 * Qn", lambda v: ((v.Qn - v.Qn) / v.Qn, 0 * v.Qn), False),
), other_sizes=({"h": 1, "N": 2, "d": 3}, {"h": 3, "N": 1, "d": 1}), masks=("keep",))


def test_qk_norm_claims():
    verdicts = check(QKNORM, budget=60)
    backward = verdicts[0].method
    assert "matrix level" in backward and "on a row where it is 0 both sides are NaN" in backward, backward


def test_qk_norm_backward_with_zero_rows():
    for program in (ZERO_ROWS, HEADS):
        check(program, budget=60)
        proved = matrix_level_proofs(program)  # the matrix level alone, no counterexample search first
        assert set(proved) == {c.text for c in program.claims if c.proof == ALL}, proved


def _rope_pairs(v):
    _rope(v)
    n, h = v.X.shape[0], v.W_q.shape[1] // 2
    i = np.arange(n)[:, None]
    phi = 1000.0 ** (-np.arange(h) / h)
    v["CosF"], v["SinF"] = np.cos((i + 3) * phi), np.sin((i + 3) * phi)
    k = v.W_k[0:1]
    v["Rs"] = np.concatenate([k[:, h:] * v.CosK + k[:, :h] * v.SinK, k[:, :h] * v.CosK - k[:, h:] * v.SinK], axis=-1)
    v["Rf"] = np.concatenate([k[:, :h] * v.CosF - k[:, h:] * v.SinF, k[:, h:] * v.CosF + k[:, :h] * v.SinF], axis=-1)
    v["Rh"] = np.concatenate([k[:, :h] * v.CosK - k[:, h:] * v.SinK, k[:, h:] + 0 * v.CosK], axis=-1)


ROPE_PAIRS = Program("rope-pairs", ROPE.head.replace("h = 2", "h = 3").replace("O = X\n", """\
CosF[j:N, c:h] = cos((j + 3) * 1000^(-c / h))
SinF[j:N, c:h] = sin((j + 3) * 1000^(-c / h))
Rs = concat(W_k[0:1, h:2 * h] * CosK + W_k[0:1, 0:h] * SinK, W_k[0:1, 0:h] * CosK - W_k[0:1, h:2 * h] * SinK, axis=-1)
Rf = concat(W_k[0:1, 0:h] * CosF - W_k[0:1, h:2 * h] * SinF, W_k[0:1, h:2 * h] * CosF + W_k[0:1, 0:h] * SinF, axis=-1)
Rh = concat(W_k[0:1, 0:h] * CosK - W_k[0:1, h:2 * h] * SinK, W_k[0:1, h:2 * h] + 0 * CosK, axis=-1)
O = X
"""), _rope_pairs, (
    Claim("relative(Rq @ Rk.T)", lambda v: _rel(v.Rq @ v.Rk.T), True, "proved"),
    Claim("relative(Cos @ CosK.T + Sin @ SinK.T)", lambda v: _rel(v.Cos @ v.CosK.T + v.Sin @ v.SinK.T), True, "proved"),
    Claim("relative(Rq @ Rk.T - 2 * (Cos @ CosK.T + Sin @ SinK.T))",
          lambda v: _rel(v.Rq @ v.Rk.T - 2 * (v.Cos @ v.CosK.T + v.Sin @ v.SinK.T)), True, "proved"),
    Claim("relative(Rq @ Rk.T + Cos @ CosK.T)", lambda v: _rel(v.Rq @ v.Rk.T + v.Cos @ v.CosK.T), False),
    # not relative: a stride, the halves swapped (angles i + j), another base for the keys, a half not rotated,
    # a term at the query's position where the key's belongs
    Claim("relative(Rq @ Rd.T)", lambda v: _rel(v.Rq @ v.Rd.T), False),
    Claim("relative(Rq @ Rs.T)", lambda v: _rel(v.Rq @ v.Rs.T), False),
    Claim("relative(Rq @ Rf.T)", lambda v: _rel(v.Rq @ v.Rf.T), False),
    Claim("relative(Rq @ Rh.T)", lambda v: _rel(v.Rq @ v.Rh.T), False),
    Claim("relative(Cos @ CosK.T + Sin @ Sin.T)", lambda v: _rel(v.Cos @ v.CosK.T + v.Sin @ v.Sin.T), False),
    Claim("relative(Cos @ CosF.T + Sin @ SinF.T)", lambda v: _rel(v.Cos @ v.CosF.T + v.Sin @ v.SinF.T), False),
), other_sizes=({"N": 3, "h": 1}, {"N": 5, "h": 2}, {"N": 2, "h": 4}))


def _relative_for_all_sizes(program: Program, verdicts) -> None:
    """A `relative` proof "for all sizes" holds at the program's other sizes too, in NumPy."""
    spec = symattn.load(program.head + "".join(f"check {c.text}\n" for c in program.claims))
    for claim, verdict in zip(program.claims, verdicts):
        if claim.holds:
            assert verdict.method.startswith("for all sizes"), (claim.text, verdict.method)
            for sizes in program.other_sizes:
                assert numpy_claims.first_difference(program, claim, spec.with_dims(**sizes)) is None, (claim, sizes)


def test_rope_with_shifted_key_positions():
    _relative_for_all_sizes(ROPE, check(ROPE, budget=60)[:2])


def test_rope_for_every_number_of_rotation_pairs():
    _relative_for_all_sizes(ROPE_PAIRS, check(ROPE_PAIRS, budget=60))


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_no_proof_at_symbolic_positions_of_the_look_alikes():
    """The prover of `relative` alone (no counterexample search first) proves the true claims and none of
    the false ones, at every number of pairs."""
    from symattn.prove.relative import prove_relative
    from symattn.symbolic.finiteness import Finiteness

    program = ROPE_PAIRS
    for h in (1, 2, 3, 5):
        loaded = symattn.load(program.head.replace("h = 3", f"h = {h}")
                              + "".join(f"check {c.text}\n" for c in program.claims))
        spec = loaded.typed
        risk = Finiteness(spec, {})
        for claim, check_ in zip(program.claims, spec.checks):
            proof = prove_relative(check_.lhs.x.x, spec, risk)
            holds = numpy_claims.first_difference(program, claim, loaded) is None  # at h = 1 one base is 1
            assert holds == claim.holds or h == 1, (h, claim.text)  # at h = 1 both bases give angle 1
            assert proof is None or holds, (h, claim.text, proof.method)
            # for all sizes only where it holds at every h (at h = 1 the two bases agree, at h = 2 not)
            assert proof is None or claim.holds or not proof.method.startswith("for all sizes"), (h, claim.text)
            assert proof is not None or not claim.holds, (h, claim.text)
