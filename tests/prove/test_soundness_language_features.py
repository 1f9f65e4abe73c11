"""Soundness corpus for the language beyond plain attention: buffers, subscripts, scans, max / min, groups.

Buffers (masks computed from them, permuted only when a claim names them), affine
subscripts, slices, cumsum (reverse too), max / min (ties, -inf rows), grouped
equivariance, relative(B), the exact zero test's algebra (roots, rational powers,
tanh / sigmoid through exp, sin / cos) and the region-by-region comparison of values
that may be NaN or infinite.

Every expectation is computed here in plain float64 NumPy, independently of symattn:
each program is a spec and the same computation written with NumPy, each claim a
NumPy function of both sides (gradients written out by hand from the chain rule and
the documented conventions: a fully masked softmax row is 0, the gradient of max is
shared equally among tied entries). Sample points include zeros, negatives, values
above 1 and the value 0.25, which the counterexample search (multiples of 1/2 in
[-1, 1]) never draws, so a claim false only there can only be caught by the prover
being right.

- A claim that NumPy contradicts at some point must not be "proved"; a claim proved
  "for all sizes" must also hold at the other sizes listed (N = 1 included, where a
  slice X[1:N] is empty).
- A "refuted" must carry inputs at which the NumPy sides differ, with the reported
  sides equal to NumPy's.
- Rows marked PROVE are true claims whose argument is sound; they must stay proved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

import symattn

NEG_INF = -np.inf
PROVE = True


# --- plain NumPy, written from docs/language.md ------------------------------------------------------


def softmax(s, axis=-1):
    s = np.asarray(s, dtype=np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    full = m == NEG_INF
    e = np.exp(s - np.where(full, 0.0, m))
    return np.where(full, 0.0, e / np.where(full, 1.0, np.sum(e, axis=axis, keepdims=True)))


def logsumexp(s, axis=-1):
    """The stable formula: -inf for a fully masked row, NaN for a row holding NaN or +inf."""
    s = np.asarray(s, dtype=np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    shift = np.where(m == NEG_INF, 0.0, m)
    return np.log(np.sum(np.exp(s - shift), axis=axis, keepdims=True)) + shift


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def relu(x):
    return np.maximum(x, 0.0)


def cumsum(x, axis, reverse=False):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis=axis), axis=axis), axis=axis)
    return np.cumsum(x, axis=axis)


def amax(x, axis=-1):
    return np.max(x, axis=axis, keepdims=True)


def amin(x, axis=-1):
    return np.min(x, axis=axis, keepdims=True)


def rsum(x, axis=-1):
    return np.sum(x, axis=axis, keepdims=True)


def mean(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    if x.shape[axis] == 0:           # the mean of no entries is 0 / 0
        shape = list(x.shape)
        shape[axis] = 1
        return np.full(shape, np.nan)
    return np.mean(x, axis=axis, keepdims=True)


def tie_share(a, c, g, axis=-1):
    """The gradient of c = max(a) (or min) into a: g shared equally among the entries equal to c."""
    hit = (a == c).astype(np.float64)
    return hit * g / rsum(hit, axis)


def differs(a, b, rtol=1e-9) -> np.ndarray:
    """Entrywise difference under float64 semantics: NaN vs a number differs, both NaN agree."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    both_finite = np.isfinite(a) & np.isfinite(b)
    with np.errstate(all="ignore"):
        gap = both_finite & (np.abs(a - b) > rtol * np.maximum(1.0, np.maximum(np.abs(a), np.abs(b))))
    return (nan_a != nan_b) | (~nan_a & ~nan_b & ~both_finite & (a != b)) | gap


class Values(dict):
    """Leaves and NumPy intermediates by name (`v.X`); `v.g("O")` is O's upstream gradient."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def g(self, name):
        return self[f"grad({name})"]


@dataclass(frozen=True)
class Claim:
    text: str
    sides: Callable[[Values], tuple]
    holds: bool
    prove: bool = False


@dataclass(frozen=True)
class Program:
    """A spec head (no checks), its forward pass in NumPy, and claims about it."""

    name: str
    head: str
    forward: Callable[[Values], None]
    claims: tuple[Claim, ...]
    other_sizes: tuple[dict, ...] = ()     # where a proof "for all sizes" is evaluated as well
    special: tuple[float, ...] = (0.25,)   # values a point fills whole tensors with
    budget: float | None = None
    extra: dict = field(default_factory=dict)


KINDS = ("halves", "zeros", "negative", "positive", "mixed", "normal", "big", "special", "halves", "mixed",
         "normal", "halves")


def _sample(shape, kind, rng, special):
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "halves":
        return rng.integers(-2, 3, size=shape) / 2.0
    if kind == "negative":
        return -np.abs(rng.standard_normal(shape)) - 0.25
    if kind == "positive":
        return np.abs(rng.standard_normal(shape)) + 0.25
    if kind == "mixed":
        return rng.choice([0.0, -1.0, -0.5, 0.25, 0.5, 2.0, -2.0, 3.0], size=shape)
    if kind == "big":
        return rng.choice([1.5, 2.0, 3.0, -1.5, -3.0], size=shape)
    if kind == "special":
        return np.full(shape, rng.choice(special)) if special else np.zeros(shape)
    return rng.standard_normal(shape) * 1.5


def _leaves(spec, kind, rng, special, shift=None) -> Values:
    """Every given tensor of one kind; with `shift`, the k-th given tensor of kind KINDS[shift + k]."""
    v = Values()
    given = [name for name, info in spec.tensors.items() if info.kind in ("input", "param", "buffer")]
    for k, name in enumerate(given):
        mine = kind if shift is None else KINDS[(shift + k) % len(KINDS)]
        v[name] = _sample(spec.concrete_shape(name), mine, rng, special)
    for name in spec.outputs:
        v[f"grad({name})"] = _sample(spec.concrete_shape(name), "halves" if kind == "zeros" else "normal", rng, ())
    return v


def _sides(program: Program, claim: Claim, v: Values):
    v = Values(v)
    with np.errstate(all="ignore"):
        program.forward(v)
        lhs, rhs = claim.sides(v)
    return np.asarray(lhs, dtype=np.float64), np.asarray(rhs, dtype=np.float64)


def _first_difference(program: Program, claim: Claim, spec, seed=0):
    """A sampled point at which the NumPy sides differ, or None."""
    rng = np.random.default_rng(seed)
    points = [(kind, None) for kind in KINDS] + [("mixed kinds", shift) for shift in range(len(KINDS))]
    for kind, shift in points:
        v = _leaves(spec, kind, rng, program.special, shift)
        lhs, rhs = _sides(program, claim, v)
        bad = differs(lhs, rhs)
        if bad.any():
            k = tuple(np.argwhere(bad)[0])
            return f"{kind} inputs: {np.broadcast_to(lhs, bad.shape)[k]!r} vs {np.broadcast_to(rhs, bad.shape)[k]!r}"
    return None


def _reproduces(program: Program, claim: Claim, spec, ce) -> str | None:
    """Why a counterexample does not reproduce in NumPy, or None when it does."""
    at = spec.with_dims(**ce.sizes) if ce.sizes != spec.dims else spec
    v = Values()
    for name, value in ce.inputs.items():
        value = np.asarray(value, dtype=np.float64)
        key = name if name.startswith("grad(") else name
        shape = at.concrete_shape(name[5:-1] if name.startswith("grad(") else name)
        v[key] = value.reshape(shape)
    lhs, rhs = _sides(program, claim, v)
    if not differs(lhs, rhs).any():
        return "NumPy finds the two sides equal at the counterexample"
    for shown, mine in ((ce.lhs, lhs), (ce.rhs, rhs)):
        if shown is not None and differs(np.asarray(shown, dtype=np.float64), mine, 1e-7).any():
            return f"the reported side {shown} is not NumPy's {mine.tolist()}"
    return None


def _check(program: Program):
    text = program.head + "".join(f"check {c.text}\n" for c in program.claims)
    spec = symattn.load(text)
    verdicts = spec.check(budget=program.budget)
    assert len(verdicts) == len(program.claims)
    problems = []
    for claim, verdict in zip(program.claims, verdicts):
        shown = f"[{program.name}] check {claim.text}: {verdict.verdict} ({verdict.method[:160]})"
        difference = _first_difference(program, claim, spec)
        if (difference is None) != claim.holds:  # the table and the sampling must agree
            problems.append(f"{shown}: the table says holds={claim.holds}, NumPy sampling says "
                            f"{'no difference' if difference is None else difference}")
            continue
        if verdict.verdict == "proved":
            if not claim.holds:
                problems.append(f"{shown}: FALSE PROOF, NumPy gives {difference}")
                continue
            if verdict.method.startswith("matrix level"):  # "for all sizes"
                for sizes in program.other_sizes:
                    other = _first_difference(program, claim, spec.with_dims(**sizes))
                    if other is not None:
                        problems.append(f"{shown}: proved for all sizes, but at {sizes} NumPy gives {other}")
        elif verdict.verdict == "refuted":
            if verdict.counterexample is None:
                problems.append(f"{shown}: refuted without a counterexample")
            else:
                why = _reproduces(program, claim, spec, verdict.counterexample)
                if why is not None:
                    problems.append(f"{shown}: {why}")
        if claim.prove and verdict.verdict != "proved":
            problems.append(f"{shown}: a true claim with a sound argument is no longer proved")
    assert not problems, "\n".join(problems)


# --- the programs -------------------------------------------------------------------------------------


def _mask_forward(v):
    n = v.X.shape[0]
    v["Mk"] = np.broadcast_to(np.where(v.keep[None, :] == 0.25, NEG_INF, 0.0), (n, n)).copy()
    v["Mx"] = np.broadcast_to(np.where(v.X[None, :, 0] == 0.25, NEG_INF, 0.0), (n, n)).copy()
    v["S"] = v.X @ v.X.T
    v["C"] = softmax(v.S + v.Mk)
    v["O"] = v.C @ v.X


def _zeros_nn(v):
    return np.zeros((v.X.shape[0],) * 2)


# Masks that are -inf only where an input or buffer is 0.25: never at the search's points.
RARE_MASKS = Program("rare-masks", """dim N = 3, d = 2
input X[N, d]
buffer keep[N]
Mk[i:N, j:N] = where(keep[j] == 0.25, -inf, 0)
Mx[i:N, j:N] = where(X[j, 0] == 0.25, -inf, 0)
S = X @ X.T
C = softmax(S + Mk, axis=-1)
O = C @ X
output O
""", _mask_forward, (
    Claim("Mk - Mk == 0 * S", lambda v: (v.Mk - v.Mk, 0 * v.S), False),
    Claim("Mx - Mx == 0 * S", lambda v: (v.Mx - v.Mx, 0 * v.S), False),
    Claim("0 * Mk == 0 * S", lambda v: (0 * v.Mk, 0 * v.S), False),
    Claim("(Mk + S) - Mk == S", lambda v: ((v.Mk + v.S) - v.Mk, v.S), False),
    Claim("exp(Mk) * exp(-Mk) == ones(N, N)", lambda v: (np.exp(v.Mk) * np.exp(-v.Mk), 1.0), False),
    Claim("Mk * (S + 1) == Mk * S + Mk", lambda v: (v.Mk * (v.S + 1), v.Mk * v.S + v.Mk), False),
    Claim("max(S + Mk, axis=-1) - max(S + Mk, axis=-1) == 0 * sum(S, axis=-1)",
          lambda v: (amax(v.S + v.Mk) - amax(v.S + v.Mk), 0 * rsum(v.S)), False),
    Claim("cumsum(Mk, axis=0) - cumsum(Mk, axis=0) == 0 * S",
          lambda v: (cumsum(v.Mk, 0) - cumsum(v.Mk, 0), 0 * v.S), False),
    Claim("sum(C, axis=-1) == ones(N, 1)", lambda v: (rsum(v.C), 1.0), False),
    Claim("tanh(Mk) == 0 * S", lambda v: (np.tanh(v.Mk), 0 * v.S), False),
    Claim("where(Mk < 0, 1, 0) == 0 * S", lambda v: (np.where(v.Mk < 0, 1.0, 0.0), 0 * v.S), False),
    Claim("abs(Mk) == -Mk", lambda v: (np.abs(v.Mk), -v.Mk), True),
    Claim("Mk * Mk == -Mk * -Mk", lambda v: (v.Mk * v.Mk, -v.Mk * -v.Mk), True, PROVE),
    Claim("max(Mk, axis=-1) == max(Mk, axis=-1) + 0 * sum(S, axis=-1)",
          lambda v: (amax(v.Mk), amax(v.Mk) + 0 * rsum(v.S)), True, PROVE),
    Claim("relu(Mk) == 0 * S", lambda v: (relu(v.Mk), 0 * v.S), True, PROVE),
    Claim("where(Mk == Mk, 1, 0) == ones(N, N)", lambda v: (np.where(v.Mk == v.Mk, 1.0, 0.0), 1.0), True, PROVE),
    Claim("exp(Mk + Mk) == exp(Mk) * exp(Mk)", lambda v: (np.exp(v.Mk + v.Mk), np.exp(v.Mk) ** 2), True),
))


def _max_forward(v):
    v["A"] = v.X @ v.W
    v["C"] = amax(v.A, -1)
    v["Mn"] = amin(v.A, 0)
    v["O"] = v.C * 2 + rsum(v.Mn)


def _max_grad_a(v):
    g_c = 2 * v.g("O")
    g_mn = np.broadcast_to(np.sum(v.g("O")), v.Mn.shape)
    return tie_share(v.A, v.C, g_c, -1) + tie_share(v.A, v.Mn, g_mn, 0)


# max along rows and min along columns, with ties at the search's points; a -inf row of max.
MAX_MIN = Program("max-min", """dim N = 3, d = 3
input X[N, d]
param W[d, d]
A = X @ W
C = max(A, axis=-1)
Mn = min(A, axis=0)
O = C * 2 + sum(Mn, axis=-1)
output O
""", _max_forward, (
    Claim("grad(A) == where(A == C, grad(C), 0) + where(A == Mn, grad(Mn) / sum(where(A == Mn, 1, 0), axis=0), 0)",
          lambda v: (_max_grad_a(v), np.where(v.A == v.C, 2 * v.g("O"), 0.0)
                     + tie_share(v.A, v.Mn, np.sum(v.g("O")), 0)), False),
    Claim("grad(A) == where(A == C, grad(C) / sum(where(A == C, 1, 0), axis=-1), 0)"
          " + where(A == Mn, grad(Mn) / sum(where(A == Mn, 1, 0), axis=0), 0)",
          lambda v: (_max_grad_a(v), _max_grad_a(v)), True, PROVE),
    Claim("grad(W) == X.T @ grad(A)", lambda v: (v.X.T @ _max_grad_a(v), v.X.T @ _max_grad_a(v)), True, PROVE),
    Claim("grad(C) == 2 * grad(O)", lambda v: (2 * v.g("O"), 2 * v.g("O")), True, PROVE),
    Claim("sum(where(A == C, 1, 0), axis=-1) == ones(N, 1)",
          lambda v: (rsum(np.where(v.A == v.C, 1.0, 0.0)), 1.0), False),
    Claim("max(A, axis=-1) == -min(-A, axis=-1)", lambda v: (amax(v.A), -amin(-v.A)), True),
    Claim("max(X * 0, axis=-1) == 0 * ones(N, 1)", lambda v: (amax(v.X * 0), 0.0), True, PROVE),
    Claim("max(X @ X.T, axis=-1) == max(X @ X.T, axis=0).T",
          lambda v: (amax(v.X @ v.X.T, -1), amax(v.X @ v.X.T, 0).T), True, PROVE),
    Claim("max(abs(X), axis=-1) == max(X * X, axis=-1)", lambda v: (amax(np.abs(v.X)), amax(v.X * v.X)), False),
    Claim("relu(max(X - 1, axis=-1)) == 0 * ones(N, 1)", lambda v: (relu(amax(v.X - 1)), 0.0), False),
))


def _cumsum_forward(v):
    v["C"] = cumsum(v.X, 0)
    v["O"] = v.C * v.C


# C = cumsum(X) is an output that O reads: grad(X) takes both paths, through a reverse scan.
CUMSUM = Program("cumsum", """dim N = 3, d = 3
input X[N, d]
C = cumsum(X, axis=0)
O = C * C
output O, C
""", _cumsum_forward, (
    Claim("grad(X) == cumsum(2 * C * grad(O), axis=0, reverse=1)",
          lambda v: (cumsum(2 * v.C * v.g("O") + v.g("C"), 0, True), cumsum(2 * v.C * v.g("O"), 0, True)), False),
    Claim("grad(X) == cumsum(2 * C * grad(O) + grad(C), axis=0, reverse=1)",
          lambda v: (cumsum(2 * v.C * v.g("O") + v.g("C"), 0, True),) * 2, True, PROVE),
    Claim("grad(X) == cumsum(2 * C * grad(O) + grad(C), axis=0)",
          lambda v: (cumsum(2 * v.C * v.g("O") + v.g("C"), 0, True), cumsum(2 * v.C * v.g("O") + v.g("C"), 0)),
          False),
    Claim("cumsum(X, axis=0) + cumsum(X, axis=0, reverse=1) == X + sum(X, axis=0)",
          lambda v: (cumsum(v.X, 0) + cumsum(v.X, 0, True), v.X + rsum(v.X, 0)), True, PROVE),
    Claim("cumsum(X, axis=0)[N - 1:N] == sum(X, axis=0)", lambda v: (cumsum(v.X, 0)[-1:], rsum(v.X, 0)), True, PROVE),
    Claim("cumsum(X, axis=0, reverse=1)[0:1] == sum(X, axis=0)",
          lambda v: (cumsum(v.X, 0, True)[:1], rsum(v.X, 0)), True, PROVE),
    Claim("cumsum(X, axis=0, reverse=1)[0:1] == X[0:1]", lambda v: (cumsum(v.X, 0, True)[:1], v.X[:1]), False),
    Claim("cumsum(X, axis=0)[1:N] - cumsum(X, axis=0)[0:N - 1] == X[1:N]",
          lambda v: (cumsum(v.X, 0)[1:] - cumsum(v.X, 0)[:-1], v.X[1:]), True, PROVE),
    Claim("cumsum(X, axis=0)[1:N] - cumsum(X, axis=0)[0:N - 1] == X[0:N - 1]",
          lambda v: (cumsum(v.X, 0)[1:] - cumsum(v.X, 0)[:-1], v.X[:-1]), False),
    Claim("cumsum(X, axis=-1) == cumsum(X.T, axis=0).T", lambda v: (cumsum(v.X, 1), cumsum(v.X.T, 0).T), True, PROVE),
    Claim("cumsum(X, axis=-1) == cumsum(X, axis=0)", lambda v: (cumsum(v.X, 1), cumsum(v.X, 0)), False),
), other_sizes=({"N": 2}, {"N": 4, "d": 2}))


# Slices of N - 1 and d - 1 entries: proved for all sizes by scaling with 1 / (N - 1) and summing a
# softmax over an axis of N - 1 entries to 1. At N = 1 the slice would be empty (its mean NaN, its
# softmax summing to 0), but that is no size of the spec: every axis has at least one entry, and a
# spec whose slice is empty at its sizes is an error (test_empty_slices_are_no_sizes_of_the_spec).
EMPTY = Program("empty-at-some-sizes", """dim N = 3, d = 2
input X[N, d]
O = X
output O
""", lambda v: None, (
    Claim("mean(X[1:N], axis=0) * (N - 1) == sum(X[1:N], axis=0)",
          lambda v: (mean(v.X[1:], 0) * (v.X.shape[0] - 1), rsum(v.X[1:], 0)), True, PROVE),
    Claim("sum(softmax(X[1:N], axis=0), axis=0) == ones(1, d)",
          lambda v: (rsum(softmax(v.X[1:], 0), 0), np.ones((1, v.X.shape[1]))), True, PROVE),
    Claim("sum(softmax(X[:, 1:d], axis=-1), axis=-1) == ones(N, 1)",
          lambda v: (rsum(softmax(v.X[:, 1:])), np.ones((v.X.shape[0], 1))), True, PROVE),
    Claim("mean(X[:, 1:], axis=-1) * (d - 1) == sum(X[:, 1:], axis=-1)",
          lambda v: (mean(v.X[:, 1:]) * (v.X.shape[1] - 1), rsum(v.X[:, 1:])), True, PROVE),
    Claim("mean(X, axis=0) * N == sum(X, axis=0)", lambda v: (mean(v.X, 0) * v.X.shape[0], rsum(v.X, 0)), True, PROVE),
    Claim("sum(softmax(X, axis=0), axis=0) == ones(1, d)",
          lambda v: (rsum(softmax(v.X, 0), 0), np.ones((1, v.X.shape[1]))), True, PROVE),
    Claim("mean(X, axis=0) * d == sum(X, axis=0)", lambda v: (mean(v.X, 0) * v.X.shape[1], rsum(v.X, 0)), False),
), other_sizes=({"N": 2}, {"N": 5, "d": 3}, {"N": 2, "d": 5}))


def _affine_forward(v):
    n = v.Q.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v["B"] = v.b[j - i + n - 1]
    v["E"] = v.Q[:, 0::2] * v.Q[:, 1::2]
    v["S"] = v.Q @ v.Q.T + v.B
    v["P"] = softmax(v.S)
    v["O"] = v.P @ v.Q


def _affine_grad_s(v):
    g_p = v.g("O") @ v.Q.T
    return v.P * (g_p - rsum(g_p * v.P))


def _affine_grad_b(v):
    n = v.Q.shape[0]
    out = np.zeros(2 * n - 1)
    g = _affine_grad_s(v)
    for i in range(n):
        for j in range(n):
            out[j - i + n - 1] += g[i, j]
    return out


# A relative-position table read at j - i + N - 1, interleaved columns Q[i, 2 c] and Q[i, 2 c + 1].
AFFINE = Program("affine", """dim N = 3, h = 2
input Q[N, 2 * h]
param b[2 * N - 1]
B[i:N, j:N] = b[j - i + N - 1]
E[i:N, c:h] = Q[i, 2 * c] * Q[i, 2 * c + 1]
S = Q @ Q.T + B
P = softmax(S, axis=-1)
O = P @ Q
output O, E
""", _affine_forward, (
    Claim("sum(E, axis=-1) == sum(Q[:, 0:h] * Q[:, h:], axis=-1)",
          lambda v: (rsum(v.E), rsum(v.Q[:, :2] * v.Q[:, 2:])), False),
    Claim("grad(b)[0:1] == grad(S)[N - 1:N, 0:1]",
          lambda v: (_affine_grad_b(v)[:1], _affine_grad_s(v)[-1:, :1]), True, PROVE),
    Claim("grad(b)[0:1] == grad(S)[0:1, N - 1:N]",
          lambda v: (_affine_grad_b(v)[:1], _affine_grad_s(v)[:1, -1:]), False),
    Claim("grad(b)[2 * N - 2:2 * N - 1] == grad(S)[0:1, N - 1:N]",
          lambda v: (_affine_grad_b(v)[-1:], _affine_grad_s(v)[:1, -1:]), True, PROVE),
    Claim("sum(grad(b), axis=0) == sum(sum(grad(S), axis=-1), axis=0)",
          lambda v: (np.sum(_affine_grad_b(v), keepdims=True), np.sum(_affine_grad_s(v)).reshape(1, 1)), True, PROVE),
    Claim("B[0:N - 1, 0:N - 1] == B[1:N, 1:N]", lambda v: (v.B[:-1, :-1], v.B[1:, 1:]), True, PROVE),
    Claim("B[0:N - 1, 1:N] == B[1:N, 0:N - 1]", lambda v: (v.B[:-1, 1:], v.B[1:, :-1]), False),
    Claim("B == B.T", lambda v: (v.B, v.B.T), False),
    Claim("relative(B)", lambda v: (v.B[:-1, :-1], v.B[1:, 1:]), True, PROVE),
    Claim("relative(Q @ Q.T)", lambda v: ((v.Q @ v.Q.T)[:-1, :-1], (v.Q @ v.Q.T)[1:, 1:]), False),
))


def _pos_forward(v):
    pass


# The exact zero test's algebra on finite inputs; several claims fail only outside [-1, 1].
ALGEBRA = Program("algebra", """dim N = 2, d = 2
input X[N, d], Y[N, d]
O = X + Y
output O
""", _pos_forward, (
    Claim("relu(X - 1) == 0 * X", lambda v: (relu(v.X - 1), 0 * v.X), False),
    Claim("abs(X + 1) == X + 1", lambda v: (np.abs(v.X + 1), v.X + 1), False),
    Claim("abs(X - 1) + abs(X + 1) == 2 + 0 * X", lambda v: (np.abs(v.X - 1) + np.abs(v.X + 1), 2 + 0 * v.X), False),
    Claim("where(X > 1, 1, X) == X", lambda v: (np.where(v.X > 1, 1.0, v.X), v.X), False),
    Claim("sqrt((X - 1) * (X - 1)) == 1 - X", lambda v: (np.sqrt((v.X - 1) ** 2), 1 - v.X), False),
    Claim("sqrt(1 - sin(X)^2) == cos(X)", lambda v: (np.sqrt(1 - np.sin(v.X) ** 2), np.cos(v.X)), False),
    Claim("sqrt(cos(X)^2) == cos(X)", lambda v: (np.sqrt(np.cos(v.X) ** 2), np.cos(v.X)), False),
    Claim("abs(cos(X)) == cos(X)", lambda v: (np.abs(np.cos(v.X)), np.cos(v.X)), False),
    Claim("sin(X)^2 + cos(X)^2 == 1 + 0 * X", lambda v: (np.sin(v.X) ** 2 + np.cos(v.X) ** 2, 1.0), True, PROVE),
    Claim("sin(2 * X) == 2 * sin(X) * cos(X)", lambda v: (np.sin(2 * v.X), 2 * np.sin(v.X) * np.cos(v.X)), True, PROVE),
    Claim("sin(X + Y) == sin(X) * cos(Y) + cos(X) * sin(Y)",
          lambda v: (np.sin(v.X + v.Y), np.sin(v.X) * np.cos(v.Y) + np.cos(v.X) * np.sin(v.Y)), True, PROVE),
    Claim("tanh(X) == 2 * sigmoid(2 * X) - 1", lambda v: (np.tanh(v.X), 2 * sigmoid(2 * v.X) - 1), True, PROVE),
    Claim("sqrt(X * X + 1) * sqrt(X * X + 1) == X * X + 1",
          lambda v: (np.sqrt(v.X ** 2 + 1) ** 2, v.X ** 2 + 1), True, PROVE),
    Claim("sqrt(X ^ 4) == X ^ 2", lambda v: (np.sqrt(v.X ** 4), v.X ** 2), True, PROVE),
    Claim("(X * X) ^ 1.5 == abs(X) ^ 3", lambda v: ((v.X * v.X) ** 1.5, np.abs(v.X) ** 3), True, PROVE),
    Claim("(X ^ 0.5) ^ 2 == X", lambda v: ((v.X ** 0.5) ** 2, v.X), False),
    Claim("X ^ 0.5 * X ^ 0.5 == X", lambda v: (v.X ** 0.5 * v.X ** 0.5, v.X), False),
    Claim("sqrt(X * X * Y * Y) == X * Y", lambda v: (np.sqrt(v.X ** 2 * v.Y ** 2), v.X * v.Y), False),
    Claim("sqrt(abs(X)) * sqrt(abs(X)) == abs(X)", lambda v: (np.sqrt(np.abs(v.X)) ** 2, np.abs(v.X)), True, PROVE),
    Claim("abs(X) / sqrt(X * X) == 1 + 0 * X", lambda v: (np.abs(v.X) / np.sqrt(v.X ** 2), 1.0), False),
    Claim("sqrt(X * X + Y * Y) / sqrt(X * X + Y * Y) == 1 + 0 * X",
          lambda v: (np.sqrt(v.X ** 2 + v.Y ** 2) / np.sqrt(v.X ** 2 + v.Y ** 2), 1.0), False),
    Claim("sqrt(2 - 2 * cos(X)) == 2 * sin(X / 2)", lambda v: (np.sqrt(2 - 2 * np.cos(v.X)), 2 * np.sin(v.X / 2)), False),
    Claim("log(X * X) == 2 * log(abs(X))", lambda v: (np.log(v.X * v.X), 2 * np.log(np.abs(v.X))), True),
), special=(0.25, 3.0, -3.0))


def _guarded_forward(v):
    v["L"] = np.log(v.X * v.X)
    v["R"] = np.sqrt(v.X * v.X + v.Y * v.Y)


# Values that may be NaN or +-inf, compared region by region: logs of squares through cumsum and
# max, divisions by a norm guarded by where.
GUARDED = Program("guarded", """dim N = 3, d = 2
input X[N, d], Y[N, d]
L = log(X * X)
R = sqrt(X * X + Y * Y)
O = X
output O
""", _guarded_forward, (
    Claim("cumsum(L, axis=0) - cumsum(L, axis=0) == 0 * X", lambda v: (cumsum(v.L, 0) - cumsum(v.L, 0), 0 * v.X), False),
    Claim("cumsum(L, axis=0)[0:1] == L[0:1]", lambda v: (cumsum(v.L, 0)[:1], v.L[:1]), True, PROVE),
    Claim("cumsum(L, axis=0)[1:N] - cumsum(L, axis=0)[0:N - 1] == L[1:N]",
          lambda v: (cumsum(v.L, 0)[1:] - cumsum(v.L, 0)[:-1], v.L[1:]), False),
    Claim("exp(cumsum(L / 2, axis=0))[0:1] == abs(X[0:1])",
          lambda v: (np.exp(cumsum(v.L / 2, 0))[:1], np.abs(v.X[:1])), True, PROVE),
    Claim("max(X / R, axis=-1) * 0 == 0 * sum(X, axis=-1)", lambda v: (amax(v.X / v.R) * 0, 0 * rsum(v.X)), False),
    Claim("R / R == ones(N, d)", lambda v: (v.R / v.R, 1.0), False),
    Claim("where(R > 0, R / R, 1) == ones(N, d)", lambda v: (np.where(v.R > 0, v.R / v.R, 1.0), 1.0), True, PROVE),
    Claim("where(R > 0, X / R, 0) * R == X", lambda v: (np.where(v.R > 0, v.X / v.R, 0.0) * v.R, v.X), True, PROVE),
    Claim("where(R != 0, X / R, 0) * R == where(R != 0, X, 0)",
          lambda v: (np.where(v.R != 0, v.X / v.R, 0.0) * v.R, np.where(v.R != 0, v.X, 0.0)), True, PROVE),
    Claim("(X / R)[:, 0:1] == X[:, 0:1] / R[:, 0:1]", lambda v: ((v.X / v.R)[:, :1], v.X[:, :1] / v.R[:, :1]),
          True, PROVE),
    Claim("X / R * (X / R) + Y / R * (Y / R) == ones(N, d)",
          lambda v: ((v.X / v.R) ** 2 + (v.Y / v.R) ** 2, 1.0), False),
    Claim("min(exp(L), axis=-1) == min(X * X, axis=-1)", lambda v: (amin(np.exp(v.L)), amin(v.X * v.X)), True, PROVE),
    Claim("exp(L / 2) == abs(X)", lambda v: (np.exp(v.L / 2), np.abs(v.X)), True, PROVE),
    Claim("max(L, axis=-1) == log(max(X * X, axis=-1))", lambda v: (amax(v.L), np.log(amax(v.X * v.X))), True),
))


def _relative_forward(v):
    n = v.X.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v["Cm"] = np.where(j <= i, 0.0, NEG_INF)
    v["Mk"] = np.broadcast_to(np.where(v.keep[None, :] > 0, 0.0, NEG_INF), (n, n)).copy()
    v["A"] = np.where(j - i >= 1, NEG_INF, (j - i) * 0.5)
    v["V"] = np.log(v.X[0, 0]) * (j - i)
    v["Z"] = np.where(i + j == 1, 5.0, 0.0) + v.X[0, 0] * 0


def _rel(t):
    return t[..., :-1, :-1], t[..., 1:, 1:]


RELATIVE = Program("relative", """dim N = 3, d = 2
input X[N, d]
buffer keep[N]
Cm[i:N, j:N] = where(j <= i, 0, -inf)
Mk[i:N, j:N] = where(keep[j] > 0, 0, -inf)
A[i:N, j:N] = where(j - i >= 1, -inf, (j - i) * 0.5)
V[i:N, j:N] = log(X[0, 0]) * (j - i)
Z[i:N, j:N] = where(i + j == 1, 5, 0) + X[0, 0] * 0
O = X
output O
""", _relative_forward, (
    Claim("relative(Cm)", lambda v: _rel(v.Cm), True, PROVE),
    Claim("relative(Mk)", lambda v: _rel(v.Mk), False),
    Claim("relative(A)", lambda v: _rel(v.A), True, PROVE),
    Claim("relative(Cm + Cm)", lambda v: _rel(v.Cm + v.Cm), True, PROVE),
    Claim("relative(Cm - Cm)", lambda v: _rel(v.Cm - v.Cm), True),
    Claim("relative(exp(Cm) * 0 + 1)", lambda v: _rel(np.exp(v.Cm) * 0 + 1), True, PROVE),
    Claim("relative(V)", lambda v: _rel(v.V), True),
    Claim("relative(X @ X.T)", lambda v: _rel(v.X @ v.X.T), False),
    # anti-diagonal where(i + j == 1): relative at N = 2 (only the pair [0, 0], [1, 1]), not at N = 3
    Claim("relative(Z)", lambda v: _rel(v.Z), False),
))

def _rows_forward(v):
    v["Z"] = -np.log(v.X * v.X)
    v["L"] = np.log(v.X * v.X)


# Softmax and logsumexp of rows holding +inf (-log(0)) or NaN (log(0) - log(0)). The stable formula
# (the generated NumPy and CUDA code, torch.softmax) makes such a softmax row NaN and its logsumexp
# NaN; the float64 evaluator used to give [NaN, 0] for a row with +inf and 0s for a row with NaN,
# so the first two claims, true for the generated code, were refuted, and the third was refuted with
# a left side of 0 where NumPy computes NaN.
ROWS = Program("nan-and-inf-rows", """dim N = 2, d = 2
input X[N, d]
Z = -log(X * X)
L = log(X * X)
O = X
output O
""", _rows_forward, (
    Claim("softmax(Z, axis=-1) == softmax(Z, axis=-1) * (1 + 0 * sum(Z, axis=-1))",
          lambda v: (softmax(v.Z), softmax(v.Z) * (1 + 0 * rsum(v.Z))), True),
    Claim("logsumexp(Z, axis=-1) == logsumexp(Z, axis=-1) + 0 * max(Z, axis=-1)",
          lambda v: (logsumexp(v.Z), logsumexp(v.Z) + 0 * amax(v.Z)), True),
    Claim("sum(softmax(L - L, axis=-1), axis=-1) == ones(N, 1)", lambda v: (rsum(softmax(v.L - v.L)), 1.0), False),
    Claim("softmax(L - L, axis=-1) == (L - L) * 0 + softmax(L - L, axis=-1)",
          lambda v: (softmax(v.L - v.L), (v.L - v.L) * 0 + softmax(v.L - v.L)), True),
    Claim("logsumexp(Z, axis=-1) == max(Z, axis=-1) + log(sum(exp(Z - max(Z, axis=-1)), axis=-1))",
          lambda v: (logsumexp(v.Z), amax(v.Z) + np.log(rsum(np.exp(v.Z - amax(v.Z))))), True),
    Claim("sum(softmax(Z, axis=-1), axis=-1) == ones(N, 1)", lambda v: (rsum(softmax(v.Z)), 1.0), False),
))

# Signed zeros: 0 * X is -0 where X < 0, X - X is +0, and 1 / (+0) = inf, 1 / (-0) = -inf. The
# matrix level keyed a divisor by its canonical form, which is the same for 0 * X, 0 * Y and X - X,
# so the first seven claims were "proved for all sizes"; a divisor whose zeros are all +0 (exp, abs,
# sums of such) keeps its canonical key.
SIGNED_ZERO = Program("signed-zero", """dim N = 2, d = 2
input X[N, d], Y[N, d]
Zx = 0 * X
O = X
output O
""", lambda v: v.update(Zx=0 * v.X), (
    Claim("1 / (0 * X) == 1 / (0 * Y)", lambda v: (1 / (0 * v.X), 1 / (0 * v.Y)), False),
    Claim("1 / (X - X) == 1 / (0 * X)", lambda v: (1 / (v.X - v.X), 1 / (0 * v.X)), False),
    Claim("1 / (-(X * 0)) == 1 / (X * 0)", lambda v: (1 / (-(v.X * 0)), 1 / (v.X * 0)), False),
    Claim("1 / Zx == 1 / (0 * Y)", lambda v: (1 / v.Zx, 1 / (0 * v.Y)), False),
    Claim("(0 * X) ^ -1 == (0 * Y) ^ -1", lambda v: ((0 * v.X) ** -1.0, (0 * v.Y) ** -1.0), False),
    Claim("X / (0 * Y) == X / (0 * X)", lambda v: (v.X / (0 * v.Y), v.X / (0 * v.X)), False),
    Claim("1 / (X * 0 + Y * 0) == 1 / (X * 0)", lambda v: (1 / (v.X * 0 + v.Y * 0), 1 / (v.X * 0)), False),
    Claim("1 / tanh(0 * X) == 1 / tanh(0 * Y)", lambda v: (1 / np.tanh(0 * v.X), 1 / np.tanh(0 * v.Y)), False),
    # a transpose only moves entries, so a divisor under transposes is keyed by the tensor it moves
    Claim("(X / Y).T == X.T / Y.T", lambda v: ((v.X / v.Y).T, v.X.T / v.Y.T), True, PROVE),
    Claim("(X / Zx.T.T).T == X.T / Zx.T", lambda v: ((v.X / v.Zx).T, v.X.T / v.Zx.T), True, PROVE),
    Claim("(X / Y).T == X.T / X.T", lambda v: ((v.X / v.Y).T, v.X.T / v.X.T), False),
    Claim("(X / Y).T == X.T / (0 * Y).T", lambda v: ((v.X / v.Y).T, v.X.T / (0 * v.Y).T), False),
    Claim("(X / Zx).T == X.T / (0 * Y).T", lambda v: ((v.X / v.Zx).T, v.X.T / (0 * v.Y).T), False),
    Claim("log(0 * X) == log(0 * Y)", lambda v: (np.log(0 * v.X), np.log(0 * v.Y)), True, PROVE),
    Claim("sqrt(0 * X) == sqrt(0 * Y)", lambda v: (np.sqrt(0 * v.X), np.sqrt(0 * v.Y)), True, PROVE),
    Claim("1 / abs(X - X) == 1 / abs(0 * X)", lambda v: (1 / np.abs(v.X - v.X), 1 / np.abs(0 * v.X)), True, PROVE),
    Claim("1 / exp(0 * X) == 1 / exp(0 * Y)", lambda v: (1 / np.exp(0 * v.X), 1 / np.exp(0 * v.Y)), True, PROVE),
    Claim("X / (1 + exp(Y)) == X / (exp(Y) + 1)", lambda v: (v.X / (1 + np.exp(v.Y)), v.X / (np.exp(v.Y) + 1)),
          True, PROVE),
    Claim("1 / Zx == 1 / (0 * X)", lambda v: (1 / v.Zx, 1 / (0 * v.X)), True, PROVE),
    Claim("0 * X / (0 * Y) == 0 * X / (0 * X)", lambda v: (0 * v.X / (0 * v.Y), 0 * v.X / (0 * v.X)), True),
))

PROGRAMS = [RARE_MASKS, MAX_MIN, CUMSUM, EMPTY, AFFINE, ALGEBRA, GUARDED, RELATIVE, ROWS, SIGNED_ZERO]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_verdicts_agree_with_numpy(program):
    _check(program)


def test_relative_at_the_one_size_where_it_holds_says_so():
    """where(i + j == 1) is relative at N = 2 only: proved there, at that size, never for all sizes."""
    text = RELATIVE.head.replace("dim N = 3", "dim N = 2") + "check relative(Z)\n"
    (verdict,) = symattn.load(text).check()
    assert verdict.verdict != "refuted", verdict.method
    if verdict.verdict == "proved":
        assert "N=2" in verdict.method and not verdict.method.startswith("matrix level"), verdict.method


def test_empty_slices_are_no_sizes_of_the_spec():
    """Why "for all sizes" may divide by N - 1 for a slice X[1:N]: at N = 1 the spec is an error."""
    spec = symattn.load(EMPTY.head + "check mean(X[1:N], axis=0) * (N - 1) == sum(X[1:N], axis=0)\n")
    with pytest.raises(symattn.SymAttnError, match="empty at N=1"):
        spec.with_dims(N=1)


def test_the_float64_evaluator_computes_softmax_rows_as_the_generated_code_does():
    """Counterexamples are computed by the float64 evaluator and must reproduce in the generated
    NumPy code: rows holding NaN, +inf, only -inf, or some -inf."""
    from symattn.codegen.arrays.numpy_runtime import _logsumexp, _softmax
    from symattn.symbolic.evaluate import NUMERIC

    rows = np.array([[np.nan, 1.0, 2.0], [np.inf, 1.0, 2.0], [NEG_INF] * 3, [NEG_INF, 0.0, 1.0], [0.5, -1.0, 2.0],
                     [np.inf, NEG_INF, 0.0]])
    with np.errstate(all="ignore"):
        for mine, generated, plain in ((NUMERIC.softmax, _softmax, softmax), (NUMERIC.logsumexp, _logsumexp, logsumexp)):
            a, b, c = mine(rows, -1), generated(rows, -1), plain(rows, -1)
            assert not differs(a, b).any(), (a, b)
            assert not differs(a, c).any(), (a, c)
