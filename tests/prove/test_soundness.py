"""Soundness corpus: no "proved" that plain NumPy contradicts, no "refuted" that does not reproduce.

Every expectation here is computed independently of symattn: each case
carries a plain float64 NumPy program for its spec (forward values; gradients by
central finite differences of L = sum over outputs <O, grad(O)>, with grad(O) of an
output being its upstream gradient) and a NumPy function for both sides of the claim.
A claim is FALSE when some sampled point (zeros, negatives, masked positions
included) gives sides that differ: a NaN against a number differs, both NaN or the
same infinity agree, finite values agree within a relative tolerance. Otherwise it
is taken as true.

- A false claim must not be "proved". If it is "refuted", the reported counterexample
  is re-evaluated here: the two sides must really differ in NumPy, and the reported
  left and right sides must be the ones NumPy computes.
- A true claim must not be "refuted". Rows marked PROVE are true claims that an
  element-level prover should settle; they must be "proved".
- `check not ...` rows swap the roles (a proved negation must carry a witness that
  reproduces).

The equality each row expects is also written in the table (`holds`) and the
sampling must agree with it, so a wrong NumPy transcription fails loudly instead of
silently flipping a row.

The property test at the end builds random small specs (named intermediates, masks,
log / sqrt / division) and claims that are true by construction or false by a
perturbation; "proved" must agree with NumPy at 20 points and "refuted" must
reproduce in NumPy.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symattn

NEG_INF = -np.inf


# --- plain NumPy builtins (the project's conventions, written from LANGUAGE.md / DESIGN.md) ---------


def softmax(s, axis=-1):
    """Stable softmax; a fully masked row (all -inf) is 0, not NaN (DESIGN.md)."""
    s = np.asarray(s, dtype=np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    full = m == NEG_INF
    e = np.exp(s - np.where(full, 0.0, m))
    z = np.sum(e, axis=axis, keepdims=True)
    return np.where(full, 0.0, e / np.where(full, 1.0, z))


def logsumexp(s, axis=-1):
    s = np.asarray(s, dtype=np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(m), m, 0.0)
    return np.log(np.sum(np.exp(s - shift), axis=axis, keepdims=True)) + shift


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def relu(x):
    return np.maximum(x, 0.0)


def causal(n):
    return np.triu(np.full((n, n), NEG_INF), k=1)


def rowsum(x):
    return np.sum(x, axis=-1, keepdims=True)


def ones(*shape):
    return np.ones(shape)


# --- equality as LANGUAGE.md defines it -------------------------------------------------------------


def differs(a, b, rtol=1e-9) -> np.ndarray:
    """Entrywise: do a and b differ? NaN vs number differs; both NaN or the same inf agree."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    both_finite = np.isfinite(a) & np.isfinite(b)
    with np.errstate(all="ignore"):
        scale = np.maximum(1.0, np.maximum(np.abs(a), np.abs(b)))
        gap = both_finite & (np.abs(a - b) > rtol * scale)
    infinite = ~nan_a & ~nan_b & ~both_finite & (a != b)
    return (nan_a != nan_b) | infinite | gap


class Values(dict):
    """Forward values by name; `v.P` reads `v["P"]`."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Program:
    """A spec's text and the same computation in plain NumPy."""

    text: str
    leaves: dict[str, tuple[int, ...]]           # inputs and params with their concrete shapes
    steps: list[tuple[str, Callable[[Values], np.ndarray]]]
    outputs: tuple[str, ...]

    def forward(self, leaves: dict, override: dict | None = None) -> Values:
        override = override or {}
        v = Values({k: override.get(k, np.asarray(x, dtype=np.float64)) for k, x in leaves.items()})
        with np.errstate(all="ignore"):
            for name, fn in self.steps:
                v[name] = override[name] if name in override else np.asarray(fn(v), dtype=np.float64)
        return v

    def loss(self, leaves, upstream, override=None) -> float:
        v = self.forward(leaves, override)
        with np.errstate(all="ignore"):
            return float(sum(np.sum(v[o] * upstream[o]) for o in self.outputs))

    def gradient(self, leaves, upstream, name, h=1e-6) -> np.ndarray:
        """dL/d(name) by central differences; an output's grad is its upstream gradient."""
        if name in self.outputs:
            return upstream[name]
        base = self.forward(leaves)[name]
        out = np.zeros_like(base)
        for index in np.ndindex(*base.shape):
            up, down = base.copy(), base.copy()
            up[index] += h
            down[index] -= h
            out[index] = (self.loss(leaves, upstream, {name: up}) - self.loss(leaves, upstream, {name: down})) / (2 * h)
        return out

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        v = self.forward({k: np.zeros(s) for k, s in self.leaves.items()})
        return {o: v[o].shape for o in self.outputs}


VALUE_KINDS = ("halves", "normal", "zeros", "negative", "positive", "mixed", "ones", "small")


def sample(shape, kind, rng) -> np.ndarray:
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "ones":
        return np.ones(shape)
    if kind == "halves":      # what symattn's counterexample search uses: multiples of 1/2 in [-1, 1]
        return rng.integers(-2, 3, size=shape) / 2.0
    if kind == "negative":
        return -np.abs(rng.standard_normal(shape)) - 0.25
    if kind == "positive":
        return np.abs(rng.standard_normal(shape)) + 0.25
    if kind == "mixed":       # zeros, negatives and positives in one tensor
        return rng.choice([0.0, -1.0, -0.5, 0.5, 2.0, -2.0], size=shape)
    if kind == "small":
        return rng.integers(-4, 5, size=shape) / 4.0
    return rng.standard_normal(shape) * 1.5


def points(prog: Program, count: int, seed: int = 0):
    """(leaves, upstream) pairs: first every kind for all leaves at once, then kinds mixed across leaves."""
    rng = np.random.default_rng(seed)
    outs = prog.output_shapes()
    kinds = len(VALUE_KINDS)
    for k in range(count):
        leaves = {}
        for j, (name, shape) in enumerate(prog.leaves.items()):
            if k < kinds:
                kind = VALUE_KINDS[k]
            elif k < 2 * kinds:
                kind = VALUE_KINDS[(k + j) % kinds]
            else:
                kind = VALUE_KINDS[rng.integers(kinds)]
            leaves[name] = sample(shape, kind, rng)
        upstream = {o: sample(s, "normal" if k % 3 else "halves", rng) for o, s in outs.items()}
        yield leaves, upstream


def evaluate_sides(prog, sides, leaves, upstream):
    v = prog.forward(leaves)
    cache = {}

    def grad(name):
        if name not in cache:
            cache[name] = prog.gradient(leaves, upstream, name)
        return cache[name]

    with np.errstate(all="ignore"):
        lhs, rhs = sides(v, grad)
    return np.asarray(lhs, dtype=np.float64), np.asarray(rhs, dtype=np.float64)


# --- the NumPy programs ---------------------------------------------------------------------------

N3 = 3

MASKS = Program(
    """dim N = 3, d = 2
input X[N, d], Y[N, d]
M = causal_mask(N)
S = X @ Y.T
Ms = S + M
R = softmax(Ms, axis=-1)
O = R @ Y
output O
""",
    {"X": (3, 2), "Y": (3, 2)},
    [("M", lambda v: causal(N3)), ("S", lambda v: v.X @ v.Y.T), ("Ms", lambda v: v.S + v.M),
     ("R", lambda v: softmax(v.Ms)), ("O", lambda v: v.R @ v.Y)],
    ("O",),
)

# Row 0 is masked everywhere: its softmax row is 0 by the project's convention.
FULL = Program(
    """dim N = 3, d = 2
input X[N, d], Y[N, d]
F[i:N, j:N] = where(i >= 1, 0, -inf)
S = X @ Y.T
R = softmax(S + F, axis=-1)
O = R @ Y
output O
""",
    {"X": (3, 2), "Y": (3, 2)},
    [("F", lambda v: np.where(np.arange(3)[:, None] >= 1, 0.0, NEG_INF) + np.zeros((3, 3))),
     ("S", lambda v: v.X @ v.Y.T), ("R", lambda v: softmax(v.S + v.F)), ("O", lambda v: v.R @ v.Y)],
    ("O",),
)


def _reuse(wide_first: bool) -> Program:
    """Sibling sums reusing the index name k over different ranges (k < a = 3, then k < b = 2)."""
    body = ("sum(k, X[i, k] * W1[k, j]) + sum(k, Y[i, k] * W2[k, j])" if wide_first
            else "sum(k, Y[i, k] * W2[k, j]) + sum(k, X[i, k] * W1[k, j])")
    return Program(
        f"""dim N = 2, d = 2, a = 3, b = 2
input X[N, a], Y[N, b]
param W1[a, d], W2[b, d]
H[i:N, j:d] = {body}
E[k:a, j:d] = where(k < b, W1[k, j], 0)
output H
""",
        {"X": (2, 3), "Y": (2, 2), "W1": (3, 2), "W2": (2, 2)},
        [("H", lambda v: v.X @ v.W1 + v.Y @ v.W2),
         ("E", lambda v: np.where(np.arange(3)[:, None] < 2, v.W1, 0.0))],
        ("H",),
    )


REUSE_XY, REUSE_YX = _reuse(True), _reuse(False)


def _reuse_const(wide_first: bool) -> Program:
    body = ("sum(k, X[i, k] * W1[k, j]) + sum(k, C[k, j])" if wide_first
            else "sum(k, C[k, j]) + sum(k, X[i, k] * W1[k, j])")
    return Program(
        f"""dim N = 3, d = 2, a = 3, b = 2
input X[N, a]
param W1[a, d], C[b, d]
H[i:N, j:d] = {body}
output H
""",
        {"X": (3, 3), "W1": (3, 2), "C": (2, 2)},
        [("H", lambda v: v.X @ v.W1 + np.sum(v.C, axis=0, keepdims=True))],
        ("H",),
    )


REUSE_C_XY, REUSE_C_YX = _reuse_const(True), _reuse_const(False)

ATTN_STEPS = [("Q", lambda v: v.X @ v.W_q), ("K", lambda v: v.X @ v.W_k), ("V", lambda v: v.X @ v.W_v),
              ("S", lambda v: v.Q @ v.K.T / np.sqrt(2)), ("P", lambda v: softmax(v.S)), ("O", lambda v: v.P @ v.V)]
ATTN_HEAD = """dim N = 3, d = 2, d_k = 2
input X[N, d]
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k]
Q = X @ W_q
K = X @ W_k
V = X @ W_v
"""
ATTN_LEAVES = {"X": (3, 2), "W_q": (2, 2), "W_k": (2, 2), "W_v": (2, 2)}

ATTN = Program(ATTN_HEAD + "S = Q @ K.T / sqrt(d_k)\nP = softmax(S, axis=-1)\nO = P @ V\noutput O\n",
               ATTN_LEAVES, ATTN_STEPS, ("O",))

# O reads P and both are outputs: grad(P) is P's upstream gradient, and grad(S) must include
# the path through O (L = <O, grad(O)> + <P, grad(P)>).
ATTN_OP = Program(ATTN_HEAD + "S = Q @ K.T / sqrt(d_k)\nP = softmax(S, axis=-1)\nO = P @ V\noutput O, P\n",
                  ATTN_LEAVES, ATTN_STEPS, ("O", "P"))

CAUSAL_NAMED = Program(
    ATTN_HEAD + "M = causal_mask(N)\nS = Q @ K.T / sqrt(d_k)\nP = softmax(S + M, axis=-1)\nO = P @ V\noutput O\n",
    ATTN_LEAVES,
    ATTN_STEPS[:3] + [("M", lambda v: causal(N3)), ("S", lambda v: v.Q @ v.K.T / np.sqrt(2)),
                      ("P", lambda v: softmax(v.S + v.M)), ("O", lambda v: v.P @ v.V)],
    ("O",),
)

CAUSAL_INDEX = Program(
    ATTN_HEAD + "M[i:N, j:N] = where(j <= i, 0, -inf)\nS = Q @ K.T / sqrt(d_k)\nP = softmax(S + M, axis=-1)\n"
                "O = P @ V\noutput O\n",
    ATTN_LEAVES, CAUSAL_NAMED.steps, ("O",),
)

# A = X @ W is an output and O reads it.
SQUARE_OUT = Program(
    """dim N = 3, d = 2
input X[N, d]
param W[d, d]
A = X @ W
O = A * A
output O, A
""",
    {"X": (3, 2), "W": (2, 2)},
    [("A", lambda v: v.X @ v.W), ("O", lambda v: v.A * v.A)],
    ("O", "A"),
)

POS = Program(
    """dim N = 2, d = 3
input X[N, d], Y[N, d]
O = X * Y
output O
""",
    {"X": (2, 3), "Y": (2, 3)},
    [("O", lambda v: v.X * v.Y)],
    ("O",),
)


# The same hazards behind names: a named tensor that may be NaN, -inf or 0 is no finite symbol.
NAMED = Program(
    """dim N = 2, d = 3
input X[N, d], Y[N, d]
L = log(X)
R = sqrt(X)
D = X / Y
O = L + R + D
output O
""",
    {"X": (2, 3), "Y": (2, 3)},
    [("L", lambda v: np.log(v.X)), ("R", lambda v: np.sqrt(v.X)), ("D", lambda v: v.X / v.Y),
     ("O", lambda v: v.L + v.R + v.D)],
    ("O",),
)

def _dS_full(v, g):
    """FlashAttention's grad(S) when P is also an output: dP = grad(P) + grad(O) @ V.T."""
    dp = g("P") + g("O") @ v.V.T
    return v.P * (dp - rowsum(dp * v.P))


def _dS_flash(v, g):
    return v.P * (g("P") - rowsum(g("P") * v.P))


FLASH_DS = "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1))"
FULL_DP = "(grad(P) + grad(O) @ V.T)"
FULL_DS = f"P * ({FULL_DP} - sum({FULL_DP} * P, axis=-1))"


# --- the table --------------------------------------------------------------------------------------
# (program, claim, NumPy sides (v, grad) -> (lhs, rhs), the equality holds?, must be proved?)

PROVE = True
ROWS = [
    # 1. named intermediates that may be -inf: masks
    ("mask-named-where-ones", MASKS, "where(M > -inf, 1, 0) == ones(N, N)",
     lambda v, g: (np.where(v.M > NEG_INF, 1.0, 0.0), ones(3, 3)), False, False),
    ("mask-inline-where-ones", MASKS, "where(causal_mask(N) > -inf, 1, 0) == ones(N, N)",
     lambda v, g: (np.where(causal(3) > NEG_INF, 1.0, 0.0), ones(3, 3)), False, False),
    ("mask-named-where-tril", MASKS, "where(M > -inf, 1, 0) == where(M == 0, 1, 0)",
     lambda v, g: (np.where(v.M > NEG_INF, 1.0, 0.0), np.where(v.M == 0, 1.0, 0.0)), True, False),
    ("mask-named-minus-self", MASKS, "M - M == 0 * S",
     lambda v, g: (v.M - v.M, 0 * v.S), False, False),
    ("mask-inline-minus-self", MASKS, "causal_mask(N) - causal_mask(N) == 0 * S",
     lambda v, g: (causal(3) - causal(3), 0 * v.S), False, False),
    ("mask-named-times-zero", MASKS, "0 * M == 0 * S",
     lambda v, g: (0 * v.M, 0 * v.S), False, False),
    ("mask-named-double", MASKS, "M + M == 2 * M",
     lambda v, g: (v.M + v.M, 2 * v.M), True, False),
    ("mask-exp-cancel", MASKS, "exp(Ms) * exp(-Ms) == ones(N, N)",
     lambda v, g: (np.exp(v.Ms) * np.exp(-v.Ms), ones(3, 3)), False, False),
    ("mask-exp-cancel-scalar", MASKS, "exp(Ms) * exp(-Ms) == 1",
     lambda v, g: (np.exp(v.Ms) * np.exp(-v.Ms), 1.0), False, False),
    ("mask-exp-named", MASKS, "exp(M) == where(M == 0, 1, 0)",
     lambda v, g: (np.exp(v.M), np.where(v.M == 0, 1.0, 0.0)), True, False),
    ("mask-ms-minus-s", MASKS, "Ms - S == M",
     lambda v, g: (v.Ms - v.S, v.M), True, False),
    ("mask-ms-minus-m", MASKS, "Ms - M == S",
     lambda v, g: (v.Ms - v.M, v.S), False, False),
    ("mask-softmax-zero-where-masked", MASKS, "R * where(M == 0, 0, 1) == 0 * S",
     lambda v, g: (v.R * np.where(v.M == 0, 0.0, 1.0), 0 * v.S), True, False),
    ("mask-causal-rows-sum-to-one", MASKS, "sum(R, axis=-1) == ones(N, 1)",
     lambda v, g: (rowsum(v.R), ones(3, 1)), True, PROVE),
    ("mask-not-minus-self", MASKS, "not M - M == 0 * S",
     lambda v, g: (v.M - v.M, 0 * v.S), False, False),
    # distributing a product over a sum is not an IEEE identity once a factor may be -inf
    ("mask-distribute-named", MASKS, "M * (M + S) == M * M + M * S",
     lambda v, g: (v.M * (v.M + v.S), v.M * v.M + v.M * v.S), False, False),
    ("mask-distribute-inline", MASKS,
     "causal_mask(N) * (causal_mask(N) + S) == causal_mask(N) * causal_mask(N) + causal_mask(N) * S",
     lambda v, g: (causal(3) * (causal(3) + v.S), causal(3) * causal(3) + causal(3) * v.S), False, False),
    ("mask-distribute-scores", MASKS, "Ms * (S + 1) == Ms * S + Ms",
     lambda v, g: (v.Ms * (v.S + 1), v.Ms * v.S + v.Ms), False, False),
    ("mask-distribute-exp-of-mask", MASKS, "exp(M) * (S + 1) == exp(M) * S + exp(M)",
     lambda v, g: (np.exp(v.M) * (v.S + 1), np.exp(v.M) * v.S + np.exp(v.M)), True, False),
    # 1b. a fully masked softmax row is 0
    ("full-rowsum-ones", FULL, "sum(R, axis=-1) == ones(N, 1)",
     lambda v, g: (rowsum(v.R), ones(3, 1)), False, False),
    ("full-rowsum-count", FULL, "sum(R, axis=-1) == mean(where(F > -inf, 1, 0), axis=-1)",
     lambda v, g: (rowsum(v.R), np.mean(np.where(v.F > NEG_INF, 1.0, 0.0), axis=-1, keepdims=True)), True, False),
    ("full-row-zero", FULL, "R == R * mean(where(F > -inf, 1, 0), axis=-1)",
     lambda v, g: (v.R, v.R * np.mean(np.where(v.F > NEG_INF, 1.0, 0.0), axis=-1, keepdims=True)), True, False),
    ("full-softmax-as-exp-lse", FULL, "softmax(S + F, axis=-1) == exp(S + F - logsumexp(S + F, axis=-1))",
     lambda v, g: (softmax(v.S + v.F), np.exp(v.S + v.F - logsumexp(v.S + v.F))), False, False),
    ("full-logsumexp-def", FULL, "logsumexp(S + F, axis=-1) == log(sum(exp(S + F), axis=-1))",
     lambda v, g: (logsumexp(v.S + v.F), np.log(rowsum(np.exp(v.S + v.F)))), True, False),
    ("full-grad-S", FULL, "grad(S) == R * (grad(R) - sum(grad(R) * R, axis=-1))",
     lambda v, g: (g("S"), v.R * (g("R") - rowsum(g("R") * v.R))), True, False),
    ("full-distribute-square", FULL, "(S + F) * (S + F) == S * (S + F) + F * (S + F)",
     lambda v, g: ((v.S + v.F) * (v.S + v.F), v.S * (v.S + v.F) + v.F * (v.S + v.F)), False, False),
    ("full-output-doubled", FULL, "O == 2 * O", lambda v, g: (v.O, 2 * v.O), False, False),
    ("full-weights-tanh", FULL, "R == tanh(R)", lambda v, g: (v.R, np.tanh(v.R)), False, False),
    ("full-weights-doubled-rows", FULL, "sum(R, axis=-1) == 2 * sum(R, axis=-1)",
     lambda v, g: (rowsum(v.R), 2 * rowsum(v.R)), False, False),
    # 2. sibling sums reusing an index name over different ranges
    ("reuse-wide-first-matrix", REUSE_XY, "H == X @ W1 + Y @ W2",
     lambda v, g: (v.H, v.X @ v.W1 + v.Y @ v.W2), True, PROVE),
    ("reuse-wide-first-truncated", REUSE_XY, "H == X @ E + Y @ W2",
     lambda v, g: (v.H, v.X @ v.E + v.Y @ v.W2), False, False),
    ("reuse-wide-first-rowsum-truncated", REUSE_XY, "sum(H, axis=-1) == sum(X @ E + Y @ W2, axis=-1)",
     lambda v, g: (rowsum(v.H), rowsum(v.X @ v.E + v.Y @ v.W2)), False, False),
    ("reuse-wide-first-grad-W1", REUSE_XY, "grad(W1) == X.T @ grad(H)",
     lambda v, g: (g("W1"), v.X.T @ g("H")), True, PROVE),
    ("reuse-wide-last-matrix", REUSE_YX, "H == X @ W1 + Y @ W2",
     lambda v, g: (v.H, v.X @ v.W1 + v.Y @ v.W2), True, PROVE),
    ("reuse-wide-last-truncated", REUSE_YX, "H == X @ E + Y @ W2",
     lambda v, g: (v.H, v.X @ v.E + v.Y @ v.W2), False, False),
    ("reuse-wide-last-grad-Y", REUSE_YX, "grad(Y) == grad(H) @ W2.T",
     lambda v, g: (g("Y"), g("H") @ v.W2.T), True, PROVE),
    ("reuse-wide-last-square", REUSE_YX, "H * H == (X @ W1 + Y @ W2) * (X @ E + Y @ W2)",
     lambda v, g: (v.H * v.H, (v.X @ v.W1 + v.Y @ v.W2) * (v.X @ v.E + v.Y @ v.W2)), False, False),
    # 3. an output that feeds another output
    ("outputs-flash-dS-upstream-only", ATTN_OP, FLASH_DS,
     lambda v, g: (g("S"), _dS_flash(v, g)), False, False),
    ("outputs-flash-dS-all-paths", ATTN_OP, f"grad(S) == {FULL_DS}",
     lambda v, g: (g("S"), _dS_full(v, g)), True, False),
    ("outputs-grad-P-is-upstream", ATTN_OP, "grad(P) == grad(O) @ V.T",
     lambda v, g: (g("P"), g("O") @ v.V.T), False, False),
    ("outputs-grad-V", ATTN_OP, "grad(V) == P.T @ grad(O)",
     lambda v, g: (g("V"), v.P.T @ g("O")), True, False),
    ("outputs-grad-Q-all-paths", ATTN_OP, f"grad(Q) == ({FULL_DS}) @ K / sqrt(d_k)",
     lambda v, g: (g("Q"), _dS_full(v, g) @ v.K / np.sqrt(2)), True, False),
    ("outputs-grad-Q-upstream-only", ATTN_OP,
     "grad(Q) == P * (grad(P) - sum(grad(P) * P, axis=-1)) @ K / sqrt(d_k)",
     lambda v, g: (g("Q"), v.P * (g("P") - rowsum(g("P") * v.P)) @ v.K / np.sqrt(2)), False, False),
    ("outputs-square-one-path", SQUARE_OUT, "grad(X) == (2 * A * grad(O)) @ W.T",
     lambda v, g: (g("X"), (2 * v.A * g("O")) @ v.W.T), False, False),
    ("outputs-square-all-paths", SQUARE_OUT, "grad(X) == (2 * A * grad(O) + grad(A)) @ W.T",
     lambda v, g: (g("X"), (2 * v.A * g("O") + g("A")) @ v.W.T), True, False),
    ("outputs-square-grad-W", SQUARE_OUT, "grad(W) == X.T @ (2 * A * grad(O) + grad(A))",
     lambda v, g: (g("W"), v.X.T @ (2 * v.A * g("O") + g("A"))), True, False),
    # 4. SymPy identities that need positivity (or finiteness)
    ("pos-exp-log", POS, "exp(log(X)) == X", lambda v, g: (np.exp(np.log(v.X)), v.X), False, False),
    ("pos-sqrt-squared", POS, "sqrt(X)^2 == X", lambda v, g: (np.sqrt(v.X) ** 2, v.X), False, False),
    ("pos-log-minus-log", POS, "log(X) - log(X) == 0 * X",
     lambda v, g: (np.log(v.X) - np.log(v.X), 0 * v.X), False, False),
    ("pos-div-self", POS, "X / X == ones(N, d)", lambda v, g: (v.X / v.X, ones(2, 3)), False, False),
    ("pos-log-square", POS, "log(X * X) == 2 * log(X)",
     lambda v, g: (np.log(v.X * v.X), 2 * np.log(v.X)), False, False),
    ("pos-sqrt-of-square-is-abs", POS, "sqrt(X * X) == abs(X)",
     lambda v, g: (np.sqrt(v.X * v.X), np.abs(v.X)), True, False),
    ("pos-exp-log-exp", POS, "exp(log(exp(X))) == exp(X)",
     lambda v, g: (np.exp(np.log(np.exp(v.X))), np.exp(v.X)), True, False),
    ("pos-sqrt-times-sqrt", POS, "sqrt(X) * sqrt(X) == X",
     lambda v, g: (np.sqrt(v.X) * np.sqrt(v.X), v.X), False, False),
    ("pos-sqrt-product", POS, "sqrt(X) * sqrt(Y) == sqrt(X * Y)",
     lambda v, g: (np.sqrt(v.X) * np.sqrt(v.Y), np.sqrt(v.X * v.Y)), False, False),
    ("pos-square-over-self", POS, "X ^ 2 / X == X", lambda v, g: (v.X ** 2 / v.X, v.X), False, False),
    ("pos-cancel-Y", POS, "X * Y / Y == X", lambda v, g: (v.X * v.Y / v.Y, v.X), False, False),
    ("pos-log-exp-sum", POS, "log(exp(X) * exp(Y)) == X + Y",
     lambda v, g: (np.log(np.exp(v.X) * np.exp(v.Y)), v.X + v.Y), True, False),
    ("pos-sign-both-ways", POS, "abs(X) / X == X / abs(X)",
     lambda v, g: (np.abs(v.X) / v.X, v.X / np.abs(v.X)), True, False),
    ("pos-sqrt-squared-abs", POS, "sqrt(X)^2 == abs(X)",
     lambda v, g: (np.sqrt(v.X) ** 2, np.abs(v.X)), False, False),
    ("pos-relu-abs", POS, "relu(X) + relu(-X) == abs(X)",
     lambda v, g: (relu(v.X) + relu(-v.X), np.abs(v.X)), True, False),
    ("pos-pow-half", POS, "X ^ 0.5 == sqrt(X)", lambda v, g: (v.X ** 0.5, np.sqrt(v.X)), True, False),
    ("pos-recip-recip", POS, "1 / (1 / X) == X", lambda v, g: (1 / (1 / v.X), v.X), True, False),
    ("pos-times-recip", POS, "X * (1 / X) == ones(N, d)",
     lambda v, g: (v.X * (1 / v.X), ones(2, 3)), False, False),
    ("pos-log-product", POS, "log(X) + log(Y) == log(X * Y)",
     lambda v, g: (np.log(v.X) + np.log(v.Y), np.log(v.X * v.Y)), False, False),
    ("pos-log-sqrt", POS, "log(sqrt(X)) == log(X) / 2",
     lambda v, g: (np.log(np.sqrt(v.X)), np.log(v.X) / 2), True, False),
    ("pos-sqrt-quotient", POS, "sqrt(X / Y) == sqrt(X) / sqrt(Y)",
     lambda v, g: (np.sqrt(v.X / v.Y), np.sqrt(v.X) / np.sqrt(v.Y)), False, False),
    ("pos-abs-squared", POS, "abs(X)^2 == X * X", lambda v, g: (np.abs(v.X) ** 2, v.X * v.X), True, False),
    ("pos-not-exp-log", POS, "not exp(log(X)) == X", lambda v, g: (np.exp(np.log(v.X)), v.X), False, False),
    ("pos-not-sqrt-of-square", POS, "not sqrt(X * X) == abs(X)",
     lambda v, g: (np.sqrt(v.X * v.X), np.abs(v.X)), True, False),
    ("named-exp-log", NAMED, "exp(L) == X", lambda v, g: (np.exp(v.L), v.X), False, False),
    ("named-log-minus-self", NAMED, "L - L == 0 * Y", lambda v, g: (v.L - v.L, 0 * v.Y), False, False),
    ("named-sqrt-squared", NAMED, "R * R == X", lambda v, g: (v.R * v.R, v.X), False, False),
    ("named-quotient-times-denominator", NAMED, "D * Y == X", lambda v, g: (v.D * v.Y, v.X), False, False),
    ("named-quotient-over-itself", NAMED, "D / D == ones(N, d)", lambda v, g: (v.D / v.D, ones(2, 3)), False, False),
    ("named-quotient-unfolded", NAMED, "D == X / Y", lambda v, g: (v.D, v.X / v.Y), True, PROVE),
    ("named-log-unfolded-twice", NAMED, "L + L == 2 * log(X)", lambda v, g: (v.L + v.L, 2 * np.log(v.X)), True, PROVE),
    # 5. true claims that must still be proved
    ("true-tanh-sigmoid", POS, "tanh(X) == 2 * sigmoid(2 * X) - 1",
     lambda v, g: (np.tanh(v.X), 2 * sigmoid(2 * v.X) - 1), True, PROVE),
    ("true-sigmoid-symmetry", POS, "sigmoid(X) + sigmoid(-X) == ones(N, d)",
     lambda v, g: (sigmoid(v.X) + sigmoid(-v.X), ones(2, 3)), True, PROVE),
    ("true-sqrt-exp", POS, "sqrt(exp(X)) == exp(X / 2)",
     lambda v, g: (np.sqrt(np.exp(v.X)), np.exp(v.X / 2)), True, False),
    ("flash-dV", ATTN, "grad(V) == P.T @ grad(O)", lambda v, g: (g("V"), v.P.T @ g("O")), True, PROVE),
    ("flash-dP", ATTN, "grad(P) == grad(O) @ V.T", lambda v, g: (g("P"), g("O") @ v.V.T), True, PROVE),
    ("flash-dS", ATTN, FLASH_DS, lambda v, g: (g("S"), _dS_flash(v, g)), True, PROVE),
    ("flash-dQ", ATTN, "grad(Q) == grad(S) @ K / sqrt(d_k)",
     lambda v, g: (g("Q"), g("S") @ v.K / np.sqrt(2)), True, PROVE),
    ("flash-dK", ATTN, "grad(K) == grad(S).T @ Q / sqrt(d_k)",
     lambda v, g: (g("K"), g("S").T @ v.Q / np.sqrt(2)), True, PROVE),
    ("flash-delta", ATTN, "sum(grad(P) * P, axis=-1) == sum(grad(O) * O, axis=-1)",
     lambda v, g: (rowsum(g("P") * v.P), rowsum(g("O") * v.O)), True, PROVE),
    ("flash-rows-sum-to-one", ATTN, "sum(softmax(S, axis=-1), axis=-1) == ones(N, 1)",
     lambda v, g: (rowsum(softmax(v.S)), ones(3, 1)), True, PROVE),
    ("flash-dS-without-row-term", ATTN, "grad(S) == P * grad(P)",
     lambda v, g: (g("S"), v.P * g("P")), False, False),
    ("softmax-shift", ATTN, "softmax(S + 1, axis=-1) == softmax(S, axis=-1)",
     lambda v, g: (softmax(v.S + 1), softmax(v.S)), True, False),
    ("logsumexp-def", ATTN, "logsumexp(S, axis=-1) == log(sum(exp(S), axis=-1))",
     lambda v, g: (logsumexp(v.S), np.log(rowsum(np.exp(v.S)))), True, False),
    ("causal-named-dS", CAUSAL_NAMED, FLASH_DS, lambda v, g: (g("S"), _dS_flash(v, g)), True, PROVE),
    ("causal-named-dV", CAUSAL_NAMED, "grad(V) == P.T @ grad(O)",
     lambda v, g: (g("V"), v.P.T @ g("O")), True, PROVE),
    ("causal-named-dQ", CAUSAL_NAMED, "grad(Q) == grad(S) @ K / sqrt(d_k)",
     lambda v, g: (g("Q"), g("S") @ v.K / np.sqrt(2)), True, PROVE),
    ("causal-named-delta", CAUSAL_NAMED, "sum(grad(P) * P, axis=-1) == sum(grad(O) * O, axis=-1)",
     lambda v, g: (rowsum(g("P") * v.P), rowsum(g("O") * v.O)), True, PROVE),
    ("causal-named-dS-without-row-term", CAUSAL_NAMED, "grad(S) == P * grad(P)",
     lambda v, g: (g("S"), v.P * g("P")), False, False),
    ("causal-named-dS-wrong-mask-term", CAUSAL_NAMED, "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1)) + M",
     lambda v, g: (g("S"), _dS_flash(v, g) + v.M), False, False),
    ("causal-index-dS", CAUSAL_INDEX, FLASH_DS, lambda v, g: (g("S"), _dS_flash(v, g)), True, PROVE),
    ("causal-index-dK", CAUSAL_INDEX, "grad(K) == grad(S).T @ Q / sqrt(d_k)",
     lambda v, g: (g("K"), g("S").T @ v.Q / np.sqrt(2)), True, PROVE),
]

POINTS = 40


def _rtol(claim: str) -> float:
    return 1e-6 if "grad(" in claim else 1e-9    # finite differences are good to ~1e-9 here


def _equality_holds(prog, sides, rtol) -> tuple[bool, str]:
    for n, (leaves, upstream) in enumerate(points(prog, POINTS)):
        lhs, rhs = evaluate_sides(prog, sides, leaves, upstream)
        bad = differs(lhs, rhs, rtol)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            l, r = np.broadcast_arrays(lhs, rhs)
            return False, f"point {n}, entry {list(index)}: {l[index]!r} vs {r[index]!r}"
    return True, ""


def _ce_arrays(prog: Program, ce) -> tuple[dict, dict]:
    inputs = ce.inputs
    assert set(inputs) == set(prog.leaves) | {f"grad({o})" for o in prog.outputs}, sorted(inputs)
    leaves = {k: np.array(inputs[k], dtype=np.float64).reshape(s) for k, s in prog.leaves.items()}
    shapes = prog.output_shapes()
    upstream = {o: np.array(inputs[f"grad({o})"], dtype=np.float64).reshape(shapes[o]) for o in prog.outputs}
    return leaves, upstream


def _assert_reproduces(prog, sides, ce, rtol, *, compare_reported=True):
    assert ce is not None, "a refutation without a counterexample"
    leaves, upstream = _ce_arrays(prog, ce)
    lhs, rhs = evaluate_sides(prog, sides, leaves, upstream)
    assert differs(lhs, rhs, rtol).any(), (
        f"the counterexample does not reproduce in NumPy: lhs {lhs.tolist()} rhs {rhs.tolist()}; "
        f"symattn reported lhs {ce.lhs} rhs {ce.rhs} ({ce.note})")
    if compare_reported and ce.lhs is not None and ce.rhs is not None:
        for label, reported, mine in (("left", ce.lhs, lhs), ("right", ce.rhs, rhs)):
            reported = np.array(reported, dtype=np.float64)
            wrong = differs(reported, mine, max(rtol, 1e-9))
            assert not wrong.any(), (f"reported {label} side {reported.tolist()} is not what NumPy computes at the "
                                     f"counterexample: {mine.tolist()} ({ce.note})")


def _verdict(prog: Program, claim: str):
    (verdict,) = symattn.load(prog.text + f"check {claim}\n").check()
    return verdict


@pytest.mark.parametrize("prog, claim, sides, holds, must_prove",
                         [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_verdict_agrees_with_numpy(prog, claim, sides, holds, must_prove):
    negated = claim.startswith("not ")
    rtol = _rtol(claim)
    equal, where = _equality_holds(prog, sides, rtol)
    assert equal == holds, f"the table says the equality {'holds' if holds else 'fails'}, NumPy: {where or 'holds'}"
    claim_true = equal != negated
    verdict = _verdict(prog, claim)
    shown = f"{verdict.verdict}: {verdict.method}"
    if not claim_true:
        assert verdict.verdict != "proved", f"FALSE claim proved ({where or 'the equality holds'}) -- {shown}"
    else:
        assert verdict.verdict != "refuted", f"TRUE claim refuted -- {shown}; counterexample " \
                                             f"{verdict.counterexample.to_json() if verdict.counterexample else None}"
    # a counterexample offered as evidence that the equality fails must reproduce
    evidence = verdict.verdict == ("proved" if negated else "refuted")
    if evidence and verdict.counterexample is not None:
        _assert_reproduces(prog, sides, verdict.counterexample, rtol)
    elif verdict.verdict == "refuted" and not negated:
        pytest.fail(f"refuted without a counterexample -- {shown}")
    if must_prove:
        assert verdict.verdict == "proved", f"a true claim that should be proved -- {shown}"


def test_the_finite_difference_gradients_match_textbook_backprop():
    """The table's gradients come from central differences; check them on attention by hand."""
    for prog in (ATTN, CAUSAL_NAMED, ATTN_OP):
        for leaves, upstream in itertools.islice(points(prog, 12, seed=5), 12):
            v = prog.forward(leaves)
            dP = upstream["O"] @ v.V.T + (upstream["P"] if "P" in prog.outputs else 0)
            dS = v.P * (dP - rowsum(dP * v.P))
            dQ, dK, dV = dS @ v.K / np.sqrt(2), dS.T @ v.Q / np.sqrt(2), v.P.T @ upstream["O"]
            dX = dQ @ v.W_q.T + dK @ v.W_k.T + dV @ v.W_v.T
            for name, hand in (("S", dS), ("Q", dQ), ("K", dK), ("V", dV), ("X", dX)):
                np.testing.assert_allclose(prog.gradient(leaves, upstream, name), hand, rtol=1e-6, atol=1e-7,
                                           err_msg=name)


# --- equivariance claims over reused index names ---------------------------------------------------------
# (program, claim, output, source, source axis, output axes permuted (empty: invariant), holds, must_prove)

SYM_ROWS = [
    ("reuse-wide-first-equivariant-X-alone", REUSE_XY, "equivariant(H, X)", "H", "X", 0, [0], False, False),
    ("reuse-wide-last-equivariant-X-alone", REUSE_YX, "equivariant(H, X)", "H", "X", 0, [0], False, False),
    ("reuse-wide-last-invariant-W1", REUSE_YX, "invariant(H, W1, a)", "H", "W1", 0, [], False, False),
    ("reuse-const-wide-first-equivariant", REUSE_C_XY, "equivariant(H, X)", "H", "X", 0, [0], True, PROVE),
    ("reuse-const-wide-last-equivariant", REUSE_C_YX, "equivariant(H, X)", "H", "X", 0, [0], True, PROVE),
    ("reuse-const-wide-last-invariant-C", REUSE_C_YX, "invariant(H, C, b)", "H", "C", 0, [], True, PROVE),
]


def _permutation_gap(prog, output, source, axis, out_axes, leaves, perm) -> np.ndarray:
    base = prog.forward(leaves)[output]
    moved = dict(leaves)
    moved[source] = np.take(leaves[source], perm, axis=axis)
    left = prog.forward(moved)[output]
    right = base
    for a in out_axes:
        right = np.take(right, perm, axis=a)
    return differs(left, right, 1e-9)


@pytest.mark.parametrize("prog, claim, output, source, axis, out_axes, holds, must_prove",
                         [pytest.param(*row[1:], id=row[0]) for row in SYM_ROWS])
def test_symmetry_verdict_agrees_with_numpy(prog, claim, output, source, axis, out_axes, holds, must_prove):
    n = prog.leaves[source][axis]
    equal = all(not _permutation_gap(prog, output, source, axis, out_axes, leaves, list(perm)).any()
                for leaves, _ in points(prog, 12) for perm in itertools.permutations(range(n)))
    assert equal == holds
    verdict = _verdict(prog, claim)
    shown = f"{verdict.verdict}: {verdict.method}"
    if holds:
        assert verdict.verdict != "refuted", f"TRUE claim refuted -- {shown}"
    else:
        assert verdict.verdict != "proved", f"FALSE claim proved -- {shown}"
    if verdict.verdict == "refuted":
        ce = verdict.counterexample
        assert ce is not None and "permutation" in ce.extra, shown
        leaves = {k: np.array(ce.inputs[k], dtype=np.float64).reshape(s) for k, s in prog.leaves.items()}
        assert _permutation_gap(prog, output, source, axis, out_axes, leaves, ce.extra["permutation"]).any(), \
            f"the permutation counterexample does not reproduce in NumPy ({ce.note})"
    if must_prove:
        assert verdict.verdict == "proved", f"a true claim that should be proved -- {shown}"


# --- property test: random small specs, claims true by construction or false by a perturbation ----------
# Expressions are trees rendered both as spec text and as plain NumPy. Leaves are dyadic (multiples of 1/2 in
# [-2, 2], zeros and negatives included), so + - * @ and masks are exact in float64; exp / log / sqrt and the
# denominator of / only take exact, bounded arguments, so the only rounding is a few ulps of a known bound
# (`Expr.bound`) and a gap above that bound is a real difference, not float noise.


@dataclass(frozen=True)
class Expr:
    op: str                       # a leaf name, "const", a function name, "neg", + - * /, "@T", "@", "smx@"
    args: tuple = ()
    kind: str = "nd"              # "nd": [N, d]; "nn": [N, N]
    exact: bool = True            # float64 value is the exact real (or -inf / NaN) value
    bound: float = 2.0            # bound on finite magnitudes of this node and everything under it
    value: float = 0.0            # for "const"

    def text(self) -> str:
        a = [x.text() for x in self.args]
        op = self.op
        if op == "const":
            return repr(self.value)
        if not self.args:
            return op
        if op == "neg":
            return f"(-{a[0]})"
        if op in "+-*/":
            return f"({a[0]} {op} {a[1]})"
        if op == "@T":
            return f"({a[0]} @ {a[1]}.T)"
        if op == "@":
            return f"({a[0]} @ {a[1]})"
        if op == ".T":
            return f"{a[0]}.T"
        if op == "smx@":
            return f"(softmax({a[0]}, axis=-1) @ {a[1]})"
        return f"{op}({a[0]})"

    def eval(self, env: dict) -> np.ndarray:
        op = self.op
        if op == "const":
            return np.float64(self.value)
        if not self.args:
            return env[op]
        a = [x.eval(env) for x in self.args]
        with np.errstate(all="ignore"):
            return {
                "neg": lambda: -a[0], "+": lambda: a[0] + a[1], "-": lambda: a[0] - a[1],
                "*": lambda: a[0] * a[1], "/": lambda: a[0] / a[1], "@T": lambda: a[0] @ a[1].T,
                "@": lambda: a[0] @ a[1], ".T": lambda: a[0].T, "smx@": lambda: softmax(a[0]) @ a[1],
                "exp": lambda: np.exp(a[0]), "log": lambda: np.log(a[0]), "sqrt": lambda: np.sqrt(a[0]),
                "abs": lambda: np.abs(a[0]), "tanh": lambda: np.tanh(a[0]), "sigmoid": lambda: sigmoid(a[0]),
                "relu": lambda: relu(a[0]),
            }[op]()

    def replace(self, old: str, new: str) -> "Expr":
        """The first `old` node (function or leaf) replaced by `new`, depth first."""
        if self.op == old:
            return Expr(new, self.args, self.kind, False, self.bound, self.value)
        for k, arg in enumerate(self.args):
            changed = arg.replace(old, new)
            if changed is not arg:
                args = self.args[:k] + (changed,) + self.args[k + 1:]
                return Expr(self.op, args, self.kind, False, self.bound, self.value)
        return self

    def inline(self, name: str, definition: "Expr") -> "Expr":
        if self.op == name and not self.args:
            return definition
        return Expr(self.op, tuple(a.inline(name, definition) for a in self.args), self.kind, self.exact,
                    self.bound, self.value)

    def names(self) -> set:
        return {self.op} if not self.args and self.op != "const" else set().union(*(a.names() for a in self.args))


def leaf(name, kind, exact=True, bound=2.0) -> Expr:
    return Expr(name, (), kind, exact, bound)


def const(value) -> Expr:
    return Expr("const", (), "scalar", True, abs(value), value)


def binary(op, x, y, kind=None) -> Expr:
    exact = x.exact and y.exact and op != "/"
    bound = {"+": x.bound + y.bound, "-": x.bound + y.bound, "*": x.bound * y.bound, "@T": 3 * x.bound * y.bound,
             "/": x.bound * 16}[op]     # a nonzero exact denominator is at least 1/16 here
    return Expr(op, (x, y), kind or (x.kind if x.kind != "scalar" else y.kind), exact, max(bound, x.bound, y.bound))


def unary(op, x) -> Expr:
    if op in ("neg", "abs", "relu"):
        return Expr(op, (x,), x.kind, x.exact, x.bound)
    if op in ("tanh", "sigmoid"):
        return Expr(op, (x,), x.kind, False, max(1.0, x.bound))
    bound = {"exp": float(np.exp(min(x.bound, 700))), "log": x.bound + 40, "sqrt": x.bound + 1}[op]
    return Expr(op, (x,), x.kind, False, max(bound, x.bound))


def exp_ok(x: Expr) -> bool:
    return x.exact and x.bound <= 8


@st.composite
def expr(draw, kind, depth, names):
    """A random expression of shape kind ("nd" or "nn") over the leaves and named tensors in `names`."""
    leaves = [leaf(n, k, e, b) for n, (k, e, b) in names.items() if k == kind]
    if kind == "nn":
        leaves.append(leaf("causal_mask(N)", "nn", True, 0.0))
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if kind == "nn" and draw(st.booleans()):
            return binary("@T", draw(expr("nd", 0, names)), draw(expr("nd", 0, names)), "nn")
        return draw(st.sampled_from(leaves))
    choice = draw(st.sampled_from(["unary", "binary", "binary", "scalar", "matrix"]))
    if choice == "unary":
        x = draw(expr(kind, depth - 1, names))
        ops = ["neg", "abs", "relu", "tanh", "sigmoid"] + (["exp", "log", "sqrt"] if exp_ok(x) else
                                                          ["log", "sqrt"] if x.exact else [])
        return unary(draw(st.sampled_from(ops)), x)
    if choice == "binary":
        x, y = draw(expr(kind, depth - 1, names)), draw(expr(kind, depth - 1, names))
        return binary(draw(st.sampled_from(["+", "-", "*"] + (["/"] if y.exact else []))), x, y)
    if choice == "scalar":
        x = draw(expr(kind, depth - 1, names))
        op, c = draw(st.sampled_from([("*", 2.0), ("+", 0.5), ("/", 2.0), ("-", 1.0)]))
        return binary(op, x, const(c)) if op != "*" else binary(op, const(c), x)
    if kind == "nn":     # nd x nd -> nn, possibly masked
        s = binary("@T", draw(expr("nd", depth - 1, names)), draw(expr("nd", 0, names)), "nn")
        mask = draw(st.sampled_from([None, "M", "F", "causal_mask(N)"]))
        return s if mask is None else binary("+", s, leaf(mask, "nn", True, 0.0))
    scores, values = draw(expr("nn", depth - 1, names)), draw(expr("nd", 0, names))
    if draw(st.booleans()):
        return Expr("smx@", (scores, values), "nd", False, values.bound)
    return Expr("@", (scores, values), "nd", scores.exact and values.exact, scores.bound * values.bound * 3)


def _max_bound(e: Expr) -> float:
    return max([e.bound] + [_max_bound(a) for a in e.args])


REWRITES = ["commute+", "commute*", "double", "distribute", "transpose", "minus", "half", "exp-sum", "self-minus",
            "inline", "self-div"]


@st.composite
def claim(draw):
    n, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    names = {"A": ("nd", True, 2.0), "B": ("nd", True, 2.0), "C": ("nd", True, 2.0),
             "M": ("nn", True, 0.0), "F": ("nn", True, 0.0)}
    defs = {}
    for t in ("T1", "T2")[: draw(st.integers(1, 2))]:
        kind = draw(st.sampled_from(["nd", "nn"]))
        e = draw(expr(kind, 2, names))
        defs[t] = e
        names[t] = (kind, e.exact, _max_bound(e))
    kind = draw(st.sampled_from(["nd", "nn"]))
    e1, e2, e3 = (draw(expr(kind, 1, names)) for _ in range(3))
    rule = draw(st.sampled_from(REWRITES))
    if rule == "commute+":
        lhs, rhs = binary("+", e1, e2), binary("+", e2, e1)
    elif rule == "commute*":
        lhs, rhs = binary("*", e1, e2), binary("*", e2, e1)
    elif rule == "double":
        lhs, rhs = binary("*", const(2.0), e1), binary("+", e1, e1)
    elif rule == "distribute":
        lhs, rhs = binary("*", e1, binary("+", e2, e3)), binary("+", binary("*", e1, e2), binary("*", e1, e3))
    elif rule == "transpose":
        if kind == "nd":   # (e1 @ e2.T).T == e2 @ e1.T
            lhs = Expr(".T", (binary("@T", e1, e2, "nn"),), "nn", e1.exact and e2.exact, 3 * e1.bound * e2.bound)
            rhs = binary("@T", e2, e1, "nn")
        else:              # (e1 @ e2).T == e2.T @ e1.T
            b = 3 * e1.bound * e2.bound
            lhs = Expr(".T", (Expr("@", (e1, e2), "nn", e1.exact and e2.exact, b),), "nn", e1.exact and e2.exact, b)
            rhs = Expr("@", (Expr(".T", (e2,), "nn", e2.exact, e2.bound), Expr(".T", (e1,), "nn", e1.exact, e1.bound)),
                       "nn", e1.exact and e2.exact, b)
    elif rule == "minus":
        lhs, rhs = binary("-", e1, e2), unary("neg", binary("-", e2, e1))
    elif rule == "half":
        lhs, rhs = binary("/", e1, const(2.0)), binary("*", const(0.5), e1)
    elif rule == "exp-sum" and exp_ok(binary("+", e1, e2)):
        lhs, rhs = binary("*", unary("exp", e1), unary("exp", e2)), unary("exp", binary("+", e1, e2))
    elif rule == "self-minus":
        lhs, rhs = binary("-", e1, e1), binary("*", const(0.0), e2)       # true only where e1 is finite
    elif rule == "self-div" and e1.exact:
        lhs, rhs = binary("/", e1, e1), binary("+", binary("*", const(0.0), e2), const(1.0))  # false at e1 = 0
    else:                  # "inline": a named tensor against its definition written out
        used = [t for t in defs if t in e1.names()]
        if used:
            lhs, rhs = e1, e1.inline(used[0], defs[used[0]])
        else:
            t = draw(st.sampled_from(sorted(defs)))
            lhs, rhs = leaf(t, names[t][0], names[t][1], names[t][2]), defs[t]
            kind = lhs.kind
    kind = lhs.kind
    perturb = draw(st.sampled_from([None, None, "add", "swap", "exp"]))
    if perturb == "add":
        small = leaf("A", "nd") if kind == "nd" else binary("@T", leaf("A", "nd"), leaf("B", "nd"), "nn")
        rhs = binary("+", rhs, binary("*", const(0.5), small))
    elif perturb == "swap":
        swapped = _swap_minus(rhs)
        rhs = swapped if swapped is not rhs else binary("-", const(0.5), rhs)
    elif perturb == "exp":
        replaced = rhs.replace("exp", "sigmoid")
        rhs = replaced if replaced is not rhs else unary("tanh", rhs)
    return n, m, defs, lhs, rhs, rule, perturb


def _swap_minus(e: Expr) -> Expr:
    if e.op == "-" and e.args[0] != e.args[1]:
        return Expr("-", (e.args[1], e.args[0]), e.kind, e.exact, e.bound)
    for k, arg in enumerate(e.args):
        changed = _swap_minus(arg)
        if changed is not arg:
            return Expr(e.op, e.args[:k] + (changed,) + e.args[k + 1:], e.kind, e.exact, e.bound, e.value)
    return e


def _spec_text(n, m, defs, lhs, rhs) -> str:
    lines = [f"dim N = {n}, d = {m}", "input A[N, d], B[N, d], C[N, d]", "M = causal_mask(N)",
             "F[i:N, j:N] = where(i >= 1, 0, -inf)"]
    lines += [f"{t} = {e.text()}" for t, e in defs.items()]
    lines += ["O = A + B", "output O", f"check {lhs.text()} == {rhs.text()}"]
    return "\n".join(lines) + "\n"


def _env(n, m, defs, leaves) -> dict:
    env = dict(leaves)
    env["M"] = causal(n)
    env["F"] = np.where(np.arange(n)[:, None] >= 1, 0.0, NEG_INF) + np.zeros((n, n))
    env["causal_mask(N)"] = causal(n)
    for t, e in defs.items():
        env[t] = np.asarray(e.eval(env), dtype=np.float64)
    return env


def _used_bound(e: Expr, defs: dict) -> float:
    """Largest finite magnitude bound over every node the expression evaluates (named tensors unfolded)."""
    own = _used_bound(defs[e.op], defs) if not e.args and e.op in defs else e.bound
    return max([own] + [_used_bound(a, defs) for a in e.args])


def _sides(n, m, defs, lhs, rhs, leaves):
    env = _env(n, m, defs, leaves)
    return np.broadcast_arrays(np.asarray(lhs.eval(env), dtype=np.float64), np.asarray(rhs.eval(env), dtype=np.float64))


def _property_points(n, m, rng, count=20):
    kinds = ["halves", "zeros", "negative", "positive", "halves"]
    for k in range(count):
        kind = kinds[k] if k < len(kinds) else "halves"
        values = {}
        for name in ("A", "B", "C"):
            if kind == "halves":
                values[name] = rng.integers(-4, 5, size=(n, m)) / 2.0
            elif kind == "zeros":
                values[name] = np.zeros((n, m))
            else:
                magnitude = rng.integers(1, 5, size=(n, m)) / 2.0
                values[name] = -magnitude if kind == "negative" else magnitude
        yield values


PROPERTY = settings(max_examples=50, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@PROPERTY
@given(claim())
def test_random_claims_proved_agree_with_numpy_and_refuted_reproduce(case):
    """Two thresholds, so float noise can fail neither direction: "proved" fails only on a gap far above the
    rounding of the largest intermediate (or a NaN / infinity mismatch); "refuted" fails only when NumPy
    finds the two sides equal to 12 digits (or both NaN / the same infinity) at the counterexample."""
    n, m, defs, lhs, rhs, rule, perturb = case
    noise = 1e-10 * max(1.0, _used_bound(lhs, defs), _used_bound(rhs, defs))
    text = _spec_text(n, m, defs, lhs, rhs)
    (verdict,) = symattn.load(text).check()
    shown = f"{verdict.verdict}: {verdict.method}\n{text}"
    if verdict.verdict == "proved":
        rng = np.random.default_rng(7)
        for leaves in _property_points(n, m, rng):
            a, b = _sides(n, m, defs, lhs, rhs, leaves)
            bad = differs(a, b, noise)
            if bad.any():
                k = tuple(np.argwhere(bad)[0])
                pytest.fail(f"proved, but at A, B, C = { {k: v.tolist() for k, v in leaves.items()} } NumPy gives "
                            f"{a[k]!r} vs {b[k]!r} at entry {list(map(int, k))} -- {shown}")
    elif verdict.verdict == "refuted":
        ce = verdict.counterexample
        assert ce is not None, shown
        assert set(ce.inputs) >= {"A", "B", "C"}, shown
        leaves = {k: np.array(ce.inputs[k], dtype=np.float64).reshape(n, m) for k in ("A", "B", "C")}
        a, b = _sides(n, m, defs, lhs, rhs, leaves)
        assert differs(a, b, 1e-12).any(), \
            f"refuted, but NumPy finds the sides equal at the counterexample ({ce.note}) -- {shown}"


IEEE_EXACT = {"commute+", "commute*", "double", "transpose", "minus", "half", "inline"}


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(claim())
def test_the_property_oracle_calls_ieee_exact_rewrites_equal(case):
    """The oracle itself: rewrites that are exact in IEEE float64 (a + b = b + a, 2a = a + a, a - b = -(b - a),
    a / 2 = 0.5 a, transposed products, a named tensor against its definition) never look different, so a
    "proved" failure above is symattn's, not float noise."""
    n, m, defs, lhs, rhs, rule, perturb = case
    if perturb is not None or rule not in IEEE_EXACT:
        return
    noise = 1e-10 * max(1.0, _used_bound(lhs, defs), _used_bound(rhs, defs))
    for leaves in _property_points(n, m, np.random.default_rng(7)):
        a, b = _sides(n, m, defs, lhs, rhs, leaves)
        assert not differs(a, b, noise).any(), _spec_text(n, m, defs, lhs, rhs)
