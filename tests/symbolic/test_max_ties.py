"""The element level's gradient of max shares it among tied entries (torch.amax's convention).

stable_softmax subtracts each row's max before exp; grad(S) is compared exactly with the
derived formula at the element level (no longer unsettled), and the element level's exact
chain rule, evaluated at points where scores tie (zero inputs: every score ties; equal rows
of X: two keys tie), matches a plain NumPy backward pass written here with the tie rule.
"""

from __future__ import annotations


import numpy as np
import pytest
import sympy

import symattn
from symattn.symbolic.element import ElementModel
from conftest import REPO

SPEC = REPO / "derivations" / "stable_softmax.attn"


def numpy_grad_s(X, W_q, W_k, W_v, gO):
    """grad(S) of stable_softmax by hand: amax's gradient split equally among ties."""
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = Q @ K.T / np.sqrt(W_q.shape[1])
    top = S.max(axis=-1, keepdims=True)
    E = np.exp(S - top)
    Z = E.sum(axis=-1, keepdims=True)
    P = E / Z
    gP = gO @ V.T
    gE = (gP - (gP * P).sum(axis=-1, keepdims=True)) / Z
    gtop = -(gE * E).sum(axis=-1, keepdims=True)
    tied = S == top
    return gE * E + tied * gtop / tied.sum(axis=-1, keepdims=True), tied


def test_grad_s_is_settled_at_the_element_level():
    checks = {c.tensor: c for c in symattn.load(SPEC).verify_gradients()}
    assert checks["S"].ok, checks["S"].method


@pytest.mark.parametrize("kind", ["zeros", "tied rows", "negative", "random"])
def test_the_exact_chain_rule_shares_max_among_ties_as_numpy_does(kind):
    spec = symattn.load(SPEC)
    rng = np.random.default_rng(5)
    half = lambda *shape: rng.integers(-2, 3, size=shape) / 2  # noqa: E731
    X, W_q, W_k, W_v, gO = half(4, 3), half(3, 2), half(3, 2), half(3, 2), half(4, 2)
    if kind == "zeros":
        X = np.zeros((4, 3))
    elif kind == "tied rows":
        X[2] = X[0]  # keys 0 and 2 are the same: every query's scores tie there
        W_q[:, 0] = np.array([1.0, 0.5, -0.5])
    elif kind == "negative":
        X = -np.abs(X) - 0.5
    want, tied = numpy_grad_s(X, W_q, W_k, W_v, gO)
    if kind in ("zeros", "tied rows"):
        assert (tied.sum(axis=-1) > 1).any()  # the point has ties
    model = ElementModel(spec.typed)
    values = {n: np.vectorize(sympy.Rational, otypes=[object])(v)
              for n, v in {"X": X, "W_q": W_q, "W_k": W_k, "W_v": W_v}.items()}
    upstream = {"O": np.vectorize(sympy.Rational, otypes=[object])(gO)}
    subs = model.point(values, upstream)
    got = model.evaluate_at(model.ground_truth("S"), subs).astype(float)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
