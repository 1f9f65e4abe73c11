"""`check relative(B)`: B[..., i, j] == B[..., i + 1, j + 1] for all valid i, j and all values.

Proved cases for all sizes, at symbolic positions (ALiBi's distance, a learned relative
bias, the causal mask with its -inf entries, a rotation product of fixed vectors), each
re-checked here in plain NumPy at other sizes (N = 2, 3, 7) with random, zero and negative
values; refuted cases whose counterexample is re-evaluated here in plain NumPy (a
sinusoidal absolute table, scores that read X); claims built to fool the all-sizes
argument (a table read at j, masks that read i alone, N-dependent terms, cancellations
of -inf) never proved; and the located error for a rank-1 tensor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import symattn
from symattn.errors import SpecError
from conftest import REPO

BASE = """
dim N = 4, d = 3, d_k = 2
input X[N, d]
param W_q[d, d_k], W_k[d, d_k], b[2 * N - 1], u[1, 2], w[1, 2]
D[i:N, j:N] = j - i
M[i:N, j:N] = where(j <= i, 0, -inf)
B[i:N, j:N] = b[j - i + N - 1]
Cos[i:N, c:2] = cos(i * (c + 1))
Sin[i:N, c:2] = sin(i * (c + 1))
E = sinusoidal(N, d)
S = (X + E) @ W_q @ ((X + E) @ W_k).T
Z = (X @ W_q) @ (X @ W_k).T
O = softmax(Z + B + D + M, axis=-1)
output O
"""


def verdict(claim: str):
    (v,) = symattn.load(BASE + f"check {claim}\n", filename="rel.attn").check()
    return v


@pytest.mark.parametrize("claim", ["relative(D)", "relative(B)", "relative(M)", "relative(D + M + B)",
                                   # u, w rotated by angle i * (c + 1): cos((j - i)(c + 1)) summed
                                   "relative((u * Cos - w * Sin) @ (u * Cos - w * Sin).T"
                                   " + (w * Cos + u * Sin) @ (w * Cos + u * Sin).T)"])
def test_relative_tables_are_proved(claim):
    v = verdict(claim)
    assert v.verdict == "proved", v.method
    assert v.method.startswith("for all sizes: at symbolic positions"), v.method


def _sinusoidal(n, d):
    E = np.zeros((n, d))
    for i in range(n):
        for col in range(d):
            angle = i / 10000 ** (2 * (col // 2) / d)
            E[i, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return E


@pytest.mark.parametrize("claim,table", [
    ("relative(S)", lambda X, W_q, W_k: (X + _sinusoidal(*X.shape)) @ W_q @ ((X + _sinusoidal(*X.shape)) @ W_k).T),
    ("relative(Z)", lambda X, W_q, W_k: (X @ W_q) @ (X @ W_k).T),
])
def test_absolute_tables_are_refuted_with_a_numpy_counterexample(claim, table):
    v = verdict(claim)
    assert v.verdict == "refuted", v.method
    counter = v.counterexample
    (i, j), (i1, j1) = counter.extra["pair"]
    assert (i1, j1) == (i + 1, j + 1)
    inputs = {k: np.array(x, dtype=np.float64) for k, x in counter.inputs.items()}
    B = table(inputs["X"], inputs["W_q"], inputs["W_k"])
    assert abs(B[i, j] - B[i + 1, j + 1]) > 1e-6
    negated = verdict("not " + claim)
    assert negated.verdict == "proved"


def test_relative_of_a_rank_one_tensor_is_a_located_error():
    with pytest.raises(SpecError) as err:
        symattn.load(BASE + "check relative(b)\n", filename="rel.attn")
    text = str(err.value)
    assert "rank >= 2" in text and "rel.attn:" in text


# --- all sizes, re-checked in NumPy at other sizes -----------------------------------------------

def _numpy_tables(n: int, rng: np.random.Generator, kind: str) -> dict:
    """The proved tables of BASE at size N = n, in plain NumPy, with values of one kind."""
    def draw(*shape):
        if kind == "zeros":
            return np.zeros(shape)
        if kind == "negative":
            return -np.abs(rng.standard_normal(shape)) - 0.5
        return rng.standard_normal(shape)
    b, u, w = draw(2 * n - 1), draw(1, 2), draw(1, 2)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    D = (j - i).astype(float)
    M = np.where(j <= i, 0.0, -np.inf)
    B = b[j - i + n - 1]
    angle = np.arange(n)[:, None] * np.arange(1, 3)[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    rot = (u * cos - w * sin) @ (u * cos - w * sin).T + (w * cos + u * sin) @ (w * cos + u * sin).T
    return {"relative(D)": D, "relative(B)": B, "relative(M)": M, "relative(D + M + B)": D + M + B, "rotation": rot}


@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("kind", ["random", "zeros", "negative"])
def test_what_is_proved_for_all_sizes_holds_in_numpy_at_other_sizes(n, kind):
    rng = np.random.default_rng(n)
    with np.errstate(invalid="ignore"):
        tables = _numpy_tables(n, rng, kind)
    for name, table in tables.items():
        left, right = table[:-1, :-1], table[1:, 1:]
        same = (left == right) | (np.isnan(left) & np.isnan(right)) | np.isclose(left, right, rtol=1e-12, atol=1e-12)
        assert same.all(), (name, n, kind)


ATTACK_BASE = """
dim N = 4, d = 3, h = 2
input X[N, d]
param c[N], b[2 * N - 1], v[N, N], m[h, 1, 1]
Bj[i:N, j:N] = c[j]
Bd[i:N, j:N] = b[i + j]
Mi[i:N, j:N] = where(i == 0, -inf, 0)
Wi[i:N, j:N] = where(i == 0, 1, 0)
Nd[i:N, j:N] = i + j - N
Sq[i:N, j:N] = (j - i) * (j - i) + i
Pm[i:N, j:N] = where(j <= i, 0, -inf)
Cl[i:N, j:N] = where(j - i > 1, 1, j - i)
Cos[i:N, k:2] = cos(i * (k + 1))
Sin[i:N, k:2] = sin(i * (k + 1))
Cq[i:N, k:2] = cos(i * i * (k + 1))
Sm = softmax(Pm, axis=-1)
O = softmax(X @ X.T, axis=-1)
output O
"""

# Each is false: never proved (the counterexample search refutes them).
FOOLS = {
    "relative(Bj)": lambda t: t["c"][None, :] + 0 * t["i"],                   # a table read at j, not j - i
    "relative(Bd)": lambda t: t["b"][t["i"] + t["j"]],                        # i + j
    "relative(Mi)": lambda t: np.where(t["i"] == 0, -np.inf, 0.0),            # a mask that reads i alone
    "relative(Mi * 0)": lambda t: np.where(t["i"] == 0, -np.inf, 0.0) * 0,    # NaN on row 0 only
    "relative(Mi - Mi)": lambda t: np.where(t["i"] == 0, -np.inf, 0.0) - np.where(t["i"] == 0, -np.inf, 0.0),
    "relative(Wi)": lambda t: np.where(t["i"] == 0, 1.0, 0.0),
    "relative(Nd)": lambda t: (t["i"] + t["j"] - t["n"]).astype(float),       # N-dependent and i + j
    "relative(Sq)": lambda t: ((t["j"] - t["i"]) ** 2 + t["i"]).astype(float),
    "relative(Sm)": None,                                                     # softmax over a row of a mask
    "relative(v)": lambda t: t["v"],
    "relative(v[0:N - 1, 1:N])": lambda t: t["v"][:-1, 1:],
    "relative(Cos @ Cos.T)": None,                                            # half a rotation product
    "relative(Cos @ Sin.T + Sin @ Cos.T)": None,                              # sin((i + j) t)
    "relative(Cq @ Cq.T + Sin @ Sin.T)": None,                                # angle i^2 t, not affine
    "relative(m * Pm + Mi)": None,
}


def _attack_tables(inputs: dict, n: int) -> dict:
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return {**{k: np.array(x, dtype=np.float64) for k, x in inputs.items()}, "i": i, "j": j, "n": n}


@pytest.mark.parametrize("claim", list(FOOLS))
def test_claims_built_to_fool_the_all_sizes_argument_are_not_proved(claim):
    (v,) = symattn.load(ATTACK_BASE + f"check {claim}\n", filename="fool.attn").check()
    assert v.verdict != "proved", v.method
    assert v.verdict == "refuted", v.method
    table = FOOLS[claim]
    if table is None:
        return
    counter = v.counterexample
    (i, j), (i1, j1) = counter.extra["pair"]
    with np.errstate(invalid="ignore"):
        B = table(_attack_tables(counter.inputs, counter.sizes["N"]))
    a, b = B[i, j], B[i1, j1]
    assert not (a == b or (np.isnan(a) and np.isnan(b))), (claim, a, b)


# True claims of the same shapes: proved for all sizes (the others at the spec's sizes where read).
TRUE_ONES = ["relative(Cl)", "relative(Cl + Pm)", "relative(Pm * 0)", "relative(Pm - Pm)",
             "relative(exp(Pm))", "relative(eye(N))", "relative(Pm[1:N, 0:N - 1])", "relative(m * Pm)",
             "relative(Cos @ Cos.T + Sin @ Sin.T)", "relative(Cos @ Sin.T - Sin @ Cos.T)"]


@pytest.mark.parametrize("claim", TRUE_ONES)
def test_true_claims_of_the_same_shapes_are_proved_for_all_sizes(claim):
    (v,) = symattn.load(ATTACK_BASE + f"check {claim}\n", filename="fool.attn").check()
    assert v.verdict == "proved", v.method
    assert v.method.startswith("for all"), v.method


def test_the_rope_rotation_product_is_proved_for_all_sizes_and_its_opposite_refuted():
    verdicts = {v.claim: v for v in symattn.load(REPO / "derivations" / "rope_half.attn").check()}
    proved = [v for c, v in verdicts.items() if c.startswith("relative(concat(")]
    refuted = [v for c, v in verdicts.items() if c.startswith("not relative(concat(")]
    assert len(proved) == 1 and proved[0].verdict == "proved"
    assert proved[0].method.startswith("for all sizes"), proved[0].method  # every number of pairs h
    assert len(refuted) == 1 and refuted[0].verdict == "proved"  # the negation of a refuted claim
    # independent NumPy: the same product at N = 9, theta_c = 10000^(-c / h), for several h
    rng = np.random.default_rng(3)
    for h in (1, 2, 3, 6):
        wq, wk = rng.standard_normal(2 * h), rng.standard_normal(2 * h)
        theta = 10000.0 ** (-np.arange(h) / h)
        angle = np.arange(9)[:, None] * theta[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        qr = np.concatenate([wq[:h] * cos - wq[h:] * sin, wq[h:] * cos + wq[:h] * sin], axis=-1)
        kr = np.concatenate([wk[:h] * cos - wk[h:] * sin, wk[h:] * cos + wk[:h] * sin], axis=-1)
        kr_opposite = np.concatenate([wk[:h] * cos + wk[h:] * sin, wk[h:] * cos - wk[:h] * sin], axis=-1)
        scores, opposite = qr @ kr.T, qr @ kr_opposite.T
        assert np.allclose(scores[:-1, :-1], scores[1:, 1:], atol=1e-12)
        assert not np.allclose(opposite[:-1, :-1], opposite[1:, 1:], atol=1e-6)


SIZES_BASE = """
dim N = 4, T = 4, d = 2
param b[N + T - 1], c[T]
Small[i:N, j:T] = where(i < 4, 0, 1) + b[j - i + N - 1]
Same[i:N, j:T] = where(N == T, j - i, i)
Rel[i:N, j:T] = b[j - i + N - 1] + where(j <= i, 0, -inf)
O[i:N, j:T] = c[j]
output O
"""


@pytest.mark.parametrize("claim", ["relative(Small)", "relative(Same)"])
def test_claims_true_only_at_the_spec_sizes_are_not_proved_for_all_sizes(claim):
    # at N = T = 4 both hold (i < 4 always; N == T), but not for every size: N = 6 has row 5
    (v,) = symattn.load(SIZES_BASE + f"check {claim}\n", filename="sizes.attn").check()
    assert v.verdict == "proved", v.method
    assert "not shown for all sizes" in v.method, v.method
    n, t = 6, 5  # independent NumPy at other sizes: the claim fails there
    i, j = np.meshgrid(np.arange(n), np.arange(t), indexing="ij")
    table = np.where(i < 4, 0, 1) if claim == "relative(Small)" else np.where(n == t, j - i, i)
    assert not np.array_equal(table[:-1, :-1], table[1:, 1:])


def test_rows_and_columns_of_different_dims_are_proved_for_all_sizes():
    (v,) = symattn.load(SIZES_BASE + "check relative(Rel)\n", filename="sizes.attn").check()
    assert v.verdict == "proved" and v.method.startswith("for all sizes"), v.method
    (w,) = symattn.load(SIZES_BASE + "check not relative(O)\n", filename="sizes.attn").check()
    assert w.verdict == "proved", w.method  # c[j] is not relative: refuted, so its negation holds
