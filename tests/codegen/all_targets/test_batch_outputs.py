"""Several outputs with different batch axes: refused, never summed wrongly.

A gradient path from an output carries that output's batch axes. With a weight
penalty `P = sum(W_q * W_q)` beside batched attention `O`, the path from P has
none and the one from O has the inputs' batch; the generated modules added the
two and summed over the batch at the leaf, counting 2 * W_q * grad(P) once per
batch entry (3x at batch 3). Until such sums are reduced path by path, the NumPy
and torch modules raise a ValueError when a spec's outputs and their upstream
gradients do not share their batch axes (leading axes of size 1 aside). These
tests check the refusal, and the gradients against NumPy written here where all
share them.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.codegen.numpy.emit import load_module

PENALTY = """
attention penalty
dim N = 8, d = 4
input X[N, d]
param W_q[d, d], W_k[d, d], W_v[d, d]
Q = X @ W_q
K = X @ W_k
V = X @ W_v
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
P = sum(sum(W_q * W_q, axis=-1), axis=-2)
output O, P
"""


def _leaves(batch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(batch + (5, 4))
    return {"X": x, **{n: rng.standard_normal((4, 4)) for n in ("W_q", "W_k", "W_v")}}, rng


def _textbook(x, w_q, w_k, w_v, g_o, g_p):
    """grad(W_q) of sum(O * g_o) + P * g_p, unbatched, in float64."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    s = q @ k.T / 2
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = g_o @ v.T
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / 2
    return x.T @ (ds @ k) + 2 * g_p * w_q


@pytest.mark.parametrize("tiled", [False, True])
def test_numpy_refuses_outputs_of_different_batch_axes(tiled):
    module = load_module(symattn.load(PENALTY).emit("numpy"))
    module.TILED_ABOVE = 0 if tiled else 1 << 62
    leaves, rng = _leaves((3,))
    with pytest.raises(ValueError, match="different batch axes"):
        module.forward_backward(**leaves, grad_O=rng.standard_normal((3, 5, 4)), grad_P=np.ones((1, 1)))


@pytest.mark.parametrize("batch", [(), (1,)])
def test_numpy_gradients_where_all_share_their_batch_axes(batch):
    """No batch, or a leading axis of size 1: the penalty's gradient counted once."""
    module = load_module(symattn.load(PENALTY).emit("numpy"))
    leaves, rng = _leaves(batch)
    g_o, g_p = rng.standard_normal(batch + (5, 4)), 1.7
    _, grads = module.forward_backward(**leaves, grad_O=g_o, grad_P=np.full((1, 1), g_p))
    want = _textbook(leaves["X"].reshape(5, 4), leaves["W_q"], leaves["W_k"], leaves["W_v"], g_o.reshape(5, 4), g_p)
    np.testing.assert_allclose(grads["W_q"], want, rtol=1e-10, atol=1e-12)


def test_torch_refuses_outputs_of_different_batch_axes():
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    module = load_torch_module(symattn.load(PENALTY).emit("torch"), "penalty")
    leaves, _ = _leaves((3,))
    tensors = {n: torch.from_numpy(a).requires_grad_() for n, a in leaves.items()}
    outputs = module.forward(**tensors)
    with pytest.raises(ValueError, match="different batch axes"):
        (outputs["O"].sum() + outputs["P"].sum()).backward()
    leaves, rng = _leaves(())
    tensors = {n: torch.from_numpy(a).requires_grad_() for n, a in leaves.items()}
    outputs = module.forward(**tensors)
    g_o = rng.standard_normal((5, 4))
    ((outputs["O"] * torch.from_numpy(g_o)).sum() + 1.7 * outputs["P"].sum()).backward()
    want = _textbook(leaves["X"], leaves["W_q"], leaves["W_k"], leaves["W_v"], g_o, 1.7)
    np.testing.assert_allclose(tensors["W_q"].grad.numpy(), want, rtol=1e-10, atol=1e-12)


def test_verify_reports_the_refused_configurations():
    from symattn.check.numpy import verify_numpy

    report = verify_numpy(symattn.load(PENALTY).typed)
    assert all(row.ok for row in report.rows)
    assert {row.phase for row in report.rows if "batch" in row.config} == {"forward"}
    assert sum("backward pass not run" in note for note in report.notes) == 2
