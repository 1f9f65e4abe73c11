"""`check relative(B)`: B[..., i, j] == B[..., i + 1, j + 1] for all valid i, j and all values.

Proved cases at the spec's sizes (ALiBi's distance, a learned relative bias, the causal
mask with its -inf entries, a rotation product of fixed vectors), refuted cases whose
counterexample is re-evaluated here in plain NumPy (a sinusoidal absolute table, scores
that read X), and the located error for a rank-1 tensor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import symattn
from symattn.errors import SpecError

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
    assert "not shown for all sizes" in v.method


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
