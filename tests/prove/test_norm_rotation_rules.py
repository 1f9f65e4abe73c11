"""Norm and rotation algebra (issue 26): QK-norm with Q = X @ W_q, scale invariance, RoPE with shifted keys.

- `sqrt(sum(Q * Q, axis=-1))` is a norm whose zero set is "row i of Q is 0";
  with Q = X @ W_q the element level could not tell where that sum of squares
  is 0, so the QK-norm backward was unknown. It now compares the claim with Q
  (K, V) as free tensors, a stronger claim, in every region (a zero row: both
  sides NaN), and says which rule the matrix level lacks for all sizes.
- `(c * Q) / sqrt(sum((c * Q) * (c * Q)))` is Q's normalised row for every
  number c != 0, up to sign, for all sizes: sqrt(c^2 s) = |c| sqrt(s) and
  1 / (c * x) = (1 / c) / x, exact under IEEE semantics (0 / 0 is NaN both ways).
- RoPE's rotation products with the keys at shifted positions, cos((j + 3) t),
  are relative: the exact zero test writes j/100 + 1/25 as j/100 + 4 * (1/100),
  so the shifted angles share their base.

Against NumPy (`numpy_claims`), with zeros (zero rows), negatives and ties.
"""

from __future__ import annotations

import numpy as np

from numpy_claims import Claim, Program, check, rsum, softmax, softmax_backward

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
          lambda v: (v.gQ, (v.gQn - v.Qn * rsum(v.gQn * v.Qn)) / v.r), True, "proved"),
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


def test_qk_norm_claims():
    verdicts = check(QKNORM, budget=60)
    backward = verdicts[0].method
    assert "as free tensors" in backward and "division by sqrt(sum(Q * Q, axis=-1))" in backward, backward


def test_rope_with_shifted_key_positions():
    verdicts = check(ROPE, budget=60)
    assert verdicts[0].method.startswith("for all N"), verdicts[0].method
