"""Masks as structure at the element level (issue 26): cases of the comparisons that mask entries.

A mask computed from a buffer, `where(keep > 0, 0, -inf)`, left the element
level with entries holding -oo inside Piecewise expressions, which it never
settles; so key-padding documents printed "Unknown" under the most basic
step, grad(S) = P * (grad(P) - sum(grad(P) * P)). Split into the cases of
`keep_j > 0`, every entry is exact (masked: -oo, weight 0; an empty row:
softmax 0, logsumexp -oo, gradient 0) and each case is settled exactly.

The tests: the derived gradients of key padding (and of a masked multi-query
spec with a learned bias) are checked in every case; claims false only on an
empty row or on a masked entry are not proved by the cases (NumPy shows each
difference); the chain rule of a case agrees with NumPy's gradient of the
same computation, written out by hand, at points of that case (rows empty
included), so the cases' ground truth is not taken on trust.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.prove.claims import open_session
from symattn.symbolic.element_cases import mask_atoms, mask_cases

from numpy_claims import NEG_INF, Claim, Program, check, rsum, softmax, softmax_backward

REPO_SPEC = "derivations/key_padding.attn"


def test_key_padding_gradients_are_checked_in_every_mask_case():
    checks = {c.tensor: c for c in symattn.load(REPO_SPEC).verify_gradients()}
    assert all(c.ok for c in checks.values()), {k: c.method for k, c in checks.items() if not c.ok}
    assert "in each of the 16 cases of the masks" in checks["S"].method


MQA = """\
dim N = 3, d = 2, h = 2, d_k = 2
input X[N, d]
param W_q[h, d, d_k], W_k[d, d_k], W_v[d, d_k], B[N, N]
buffer keep[N]
Mk = where(keep > 0, 0, -inf)
Q = X @ W_q
K = X @ W_k
V = X @ W_v
S = Q @ K.T / sqrt(d_k) + B + Mk
P = softmax(S, axis=-1)
O = P @ V
output O
"""


def test_masked_multi_query_gradients_are_checked_in_every_mask_case():
    checks = {c.tensor: c for c in symattn.load(MQA).verify_gradients()}
    assert all(c.ok for c in checks.values()), {k: c.method for k, c in checks.items() if not c.ok}
    assert "cases of the masks" in checks["S"].method and checks["B"].ok


def _case_point(keep, rng):
    """Leaves at a point where keep has the given signs (so one mask case), and an upstream gradient."""
    spec = symattn.load(REPO_SPEC)
    values = {name: rng.integers(-2, 3, size=spec.concrete_shape(name)) / 2.0 for name in ("X", "W_q", "W_k", "W_v")}
    values["keep"] = np.asarray(keep, dtype=np.float64)
    upstream = rng.integers(-2, 3, size=spec.concrete_shape("O")) / 2.0
    return values, upstream


def _numpy_grad_s(values, upstream):
    """grad(S) of key padding in NumPy, from the chain rule and the empty-row convention."""
    q, k, v = values["X"] @ values["W_q"], values["X"] @ values["W_k"], values["X"] @ values["W_v"]
    mask = np.where(values["keep"] > 0, 0.0, NEG_INF)
    p = softmax(q @ k.T / np.sqrt(q.shape[1]) + mask)
    return softmax_backward(p, upstream @ v.T)


@pytest.mark.parametrize("keep", [[1.0, 1.0, 1.0, 1.0], [1.0, -0.5, 0.5, 0.0], [-1.0, -1.0, -1.0, 0.0],
                                  [0.0, 0.0, 0.0, 0.5]])
def test_a_case_chain_rule_agrees_with_numpy_at_points_of_that_case(keep):
    """The exact gradient of a mask case, valued at a point of that case (all keys padding included),
    is NumPy's grad(S): the cases read a masked score as a constant, as the convention says."""
    spec = symattn.load(REPO_SPEC)
    model = open_session(spec.typed).model
    position = {symbol: k for k, symbol in enumerate(model.leaf["keep"].flat)}
    (case,) = [m for m in mask_cases(model) if all(bool(truth) == (keep[position[atom.lhs]] > 0)
                                                    for atom, truth in m.case.items())]
    rng = np.random.default_rng(int(sum(keep) * 10) % 97)
    values, upstream = _case_point(keep, rng)
    subs = case.point(values, {"O": upstream})
    truth = np.asarray(case.evaluate_at(case.ground_truth("S"), subs), dtype=object).astype(np.float64)
    assert not np.isnan(truth).any()
    np.testing.assert_allclose(truth, _numpy_grad_s(values, upstream), rtol=1e-9, atol=1e-12)


def test_mask_atoms_are_comparisons_of_buffers_only():
    model = open_session(symattn.load(REPO_SPEC).typed).model
    atoms = mask_atoms(model)
    assert [str(a) for a in atoms] == [f"keep_{{{j}}} > 0" for j in range(1, 5)]
    causal = open_session(symattn.load("derivations/causal.attn").typed).model
    assert mask_atoms(causal) == [] and mask_cases(causal) == []


def _padded(v):
    v["Mk"] = np.where(v.keep > 0, 0.0, NEG_INF)
    v["S"] = v.X @ v.Y.T + v.Mk
    v["P"] = softmax(v.S)
    v["O"] = v.P @ v.X
    v["gP"] = v.g("O") @ v.X.T
    v["gS"] = softmax_backward(v.P, v.gP)


# claims the matrix level leaves to the element level: exact in each case, or false in one
PADDED = Program("mask-cases", """\
dim N = 3, d = 2
input X[N, d], Y[N, d]
buffer keep[N]
Mk = where(keep > 0, 0, -inf)
S = X @ Y.T + Mk
P = softmax(S, axis=-1)
O = P @ X
output O
""", _padded, (
    # angle addition: the element level's algebra, which needs every entry of softmax(S) settled
    Claim("sin(P + P) == 2 * sin(softmax(S, axis=-1)) * cos(P)",
          lambda v: (np.sin(2 * v.P), 2 * np.sin(softmax(v.S)) * np.cos(v.P)), True, "proved"),
    Claim("sin(P + P) == 2 * sin(softmax(X @ Y.T, axis=-1)) * cos(P)",
          lambda v: (np.sin(2 * v.P), 2 * np.sin(softmax(v.X @ v.Y.T)) * np.cos(v.P)), False),
    Claim("sin(sum(P, axis=-1)) == sin(1 + 0 * sum(P, axis=-1))", lambda v: (np.sin(rsum(v.P)), np.sin(1 + 0 * rsum(v.P))),
          False),
    Claim("sin(P) == sin(softmax(X @ Y.T, axis=-1))", lambda v: (np.sin(v.P), np.sin(softmax(v.X @ v.Y.T))), False),
    Claim("sin(grad(S)) == sin(grad(P) * P)", lambda v: (np.sin(v.gS), np.sin(v.gP * v.P)), False),
), masks=("keep",))


def test_mask_cases_prove_only_what_holds_in_every_case():
    verdicts = check(PADDED, budget=60)
    assert "in each of the 8 cases of the masks" in verdicts[0].method, verdicts[0].method
