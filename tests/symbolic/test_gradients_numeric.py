"""Derived gradients against three independent references, for every spec in derivations/.

(a) exactly, at the default sizes: symattn's own element-level chain rule
    (`verify_gradients`); test_element_chain_rule.py checks that chain rule against a
    naive `sympy.diff` of the expanded loss;
(b) in float64: central finite differences of L = sum(O * grad(O)), the
    forward computed op by op by the reference evaluator, for every input,
    param and intermediate (an intermediate is perturbed by overriding its
    value and recomputing everything downstream);
(c) with torch installed: torch autograd on hand-written torch versions of
    each spec, which share nothing with symattn but the spec's text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import symattn
from symattn.symbolic.evaluate import NUMERIC, Evaluator, random_leaves
from conftest import COSINE_SELF_ATTENTION, REPO, slow_params


# Beyond the examples: every elementwise function (relu, abs and where give piecewise
# gradients), logsumexp and mean, concat and its slices, heads split and merged, a
# scalar and a vector param, eye and ones.
BEYOND = """\
attention beyond
dim N = 2, d = 2
input X[N, d], Y[N, d]
param W[d, d], u[d], c
S = X @ W @ Y.T - logsumexp(X @ Y.T, axis=-1) * c
P = softmax(where(S > 0, S, S * 2), axis=-1)
C = concat(P @ Y, X, axis=-1)
H = C @ concat(W, eye(d), axis=-2)
A = H - mean(H, axis=-1)
O = (relu(A) + abs(A) * u + sigmoid(A) * tanh(A) + log(1 + A^2) + sqrt(2 + sin(A)) * cos(A) + exp(-A * A)
     + merge_heads(split_heads(X, 2)) @ ones(d, d) / N)
output O
"""
SPECS = sorted((REPO / "derivations").glob("*.attn")) + [BEYOND]
IDS = [p.stem for p in SPECS[:-1]] + ["beyond"]
# Cosine attention as self-attention: its QK-norm gradient exercises the simplifications of
# issue 12 (numbers cancelled, ones folded, like terms collected), so it must match finite differences too.


def load(spec):
    return symattn.load(spec) if isinstance(spec, Path) else symattn.load(spec, filename="beyond.attn")

STEP = 1e-5      # central differences: truncation ~STEP^2, rounding ~1e-16 / STEP
RTOL = 1e-6
ATOL = 1e-8


def derived_gradients(spec, leaves: dict, upstream: dict) -> dict[str, np.ndarray]:
    """Every matrix-level grad(T) in float64, evaluated from the outputs backwards."""
    typed = spec.typed
    ev = Evaluator(typed, NUMERIC)
    ev.run(leaves, upstream)
    for name, grad in spec.derive().gradients.items():
        shape = typed.concrete_shape(typed.tensors[name].shape)
        if grad.expr is None:
            ev.grads[name] = np.zeros(shape)
        else:
            value = np.asarray(ev.evaluate(grad.expr), dtype=np.float64)
            assert value.shape == shape, f"grad({name}) has shape {value.shape}, expected {shape}"
            ev.grads[name] = value
    return ev.grads


def forward_values(spec, leaves: dict, override: dict | None = None) -> dict[str, np.ndarray]:
    """Every tensor in float64; a tensor in `override` takes that value instead of its definition."""
    typed = spec.typed
    override = override or {}
    ev = Evaluator(typed, NUMERIC)
    ev.values = {name: override.get(name, leaves[name]) for name in typed.given}
    for name, info in typed.tensors.items():
        if info.expr is not None:
            ev.values[name] = override[name] if name in override else np.asarray(ev.evaluate(info.expr))
    return ev.values


def loss(spec, leaves: dict, upstream: dict, override: dict | None = None) -> float:
    values = forward_values(spec, leaves, override)
    return float(sum(np.sum(values[o] * upstream[o]) for o in spec.outputs))


def finite_differences(spec, leaves: dict, upstream: dict, name: str) -> np.ndarray:
    base = np.asarray(forward_values(spec, leaves)[name], dtype=np.float64)
    grad = np.zeros_like(base)
    for index in np.ndindex(*base.shape):
        if not np.isfinite(base[index]):      # a -inf mask entry: no direction to move in
            continue
        up, down = base.copy(), base.copy()
        up[index] += STEP
        down[index] -= STEP
        grad[index] = (loss(spec, leaves, upstream, {name: up}) - loss(spec, leaves, upstream, {name: down})) / (
            2 * STEP)
    return grad


def sample(spec, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    leaves = random_leaves(spec.typed, rng)
    upstream = {o: rng.standard_normal(spec.concrete_shape(o)) for o in spec.outputs}
    return leaves, upstream


# --- (a) exact, element level --------------------------------------------------------

# Gradients the element level leaves unsettled (never wrong): none. A mask computed from a buffer
# is settled in each case of its comparisons (`symattn.symbolic.element_cases`: key_padding's grad(S)),
# and stable_softmax's grad(S), through max(S, axis=-1), by differentiating a max of one tensor's
# entries with ties sharing equally (tests/symbolic/test_max_ties.py).
UNSETTLED: dict[str, set[str]] = {}


@pytest.mark.parametrize("path", slow_params(SPECS, IDS, {"differential", "flamingo_intervals", "natten_2d",
                                                          "padding_qk", "document_offsets"}))
def test_every_gradient_equals_the_element_level_chain_rule_exactly(path):
    spec = load(path)
    checks = spec.verify_gradients()
    assert [c.tensor for c in checks] == list(spec.derive().gradients)
    assert set(c.tensor for c in checks) == {n for n, info in spec.tensors.items() if info.has_gradient}
    failed = {c.tensor: c.method for c in checks if not c.ok}
    assert set(failed) == UNSETTLED.get(spec.name, set()), failed
    for c in checks:
        assert c.method.startswith("exact identity of every entry at " if c.ok else "not shown equal at ")


# --- (b) float64 central finite differences ------------------------------------------


@pytest.mark.parametrize("path", SPECS + [COSINE_SELF_ATTENTION], ids=IDS + ["cosine_self_attention"])
def test_every_gradient_matches_central_finite_differences(path):
    spec = load(path)
    leaves, upstream = sample(spec)
    derived = derived_gradients(spec, leaves, upstream)
    for name, info in spec.tensors.items():
        if name in spec.outputs or not info.has_gradient:  # a buffer has no gradient
            continue
        numeric = finite_differences(spec, leaves, upstream, name)
        np.testing.assert_allclose(derived[name], numeric, rtol=RTOL, atol=ATOL, err_msg=f"grad({name})")


def test_finite_differences_catch_a_wrong_gradient():
    """The comparison has teeth: grad(V) with P where P.T belongs is told apart."""
    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    leaves, upstream = sample(spec)
    values = forward_values(spec, leaves)
    wrong = values["P"] @ upstream["O"]
    numeric = finite_differences(spec, leaves, upstream, "V")
    assert not np.allclose(wrong, numeric, rtol=RTOL, atol=ATOL)


# --- (c) torch autograd on independent torch implementations --------------------------


def _torch_forwards():
    import math

    import torch

    def softmax_attention(q, k, v, mask=None):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    def self_attention(X, W_q, W_k, W_v):
        return softmax_attention(X @ W_q, X @ W_k, X @ W_v)

    def causal(X, W_q, W_k, W_v):
        n = X.shape[0]
        above = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)   # j > i: not visible
        return softmax_attention(X @ W_q, X @ W_k, X @ W_v, mask=above)

    def cross_attention(X, Y, W_q, W_k, W_v):
        return softmax_attention(X @ W_q, Y @ W_k, Y @ W_v)

    def multi_head(X, W_q, W_k, W_v, W_o):
        heads = torch.stack([softmax_attention(X @ W_q[c], X @ W_k[c], X @ W_v[c]) for c in range(W_q.shape[0])])
        n = X.shape[0]
        merged = heads.permute(1, 0, 2).reshape(n, -1)                       # head-major [N, h * d_k]
        return merged @ W_o

    def positional(X, W_q, W_k, W_v):
        n, d = X.shape
        E = torch.zeros(n, d, dtype=X.dtype)
        for i in range(n):
            for col in range(d):
                angle = i / 10000 ** (2 * (col // 2) / d)
                E[i, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
        H = X + E
        return softmax_attention(H @ W_q, H @ W_k, H @ W_v)

    def key_padding(X, W_q, W_k, W_v, keep):
        # A padded key (keep <= 0) gets weight 0; a row with every key padded gives zeros (the
        # language's convention, where torch.softmax over -inf would give NaN).
        s = (X @ W_q) @ (X @ W_k).T / math.sqrt(W_q.shape[-1])
        e = torch.exp(s - s.max(dim=-1, keepdim=True).values) * (keep > 0).to(X.dtype)
        total = e.sum(dim=-1, keepdim=True)
        return e / torch.where(total > 0, total, torch.ones_like(total)) @ (X @ W_v)

    def additive(X, W_1, W_2, w, W_v):
        a, b = X @ W_1, X @ W_2                                              # [N, d_a]
        S = (w * torch.tanh(a[:, None, :] + b[None, :, :])).sum(-1)          # S[i, j]
        return torch.softmax(S, dim=-1) @ (X @ W_v)

    def beyond(X, Y, W, u, c):
        n, d = X.shape
        S = X @ W @ Y.T - torch.logsumexp(X @ Y.T, dim=-1, keepdim=True) * c
        P = torch.softmax(torch.where(S > 0, S, S * 2), dim=-1)
        C = torch.cat([P @ Y, X], dim=-1)
        H = C @ torch.cat([W, torch.eye(d, dtype=X.dtype)], dim=-2)
        A = H - H.mean(dim=-1, keepdim=True)
        # merge_heads(split_heads(X, 2)) is X itself
        return (torch.relu(A) + A.abs() * u + torch.sigmoid(A) * torch.tanh(A) + torch.log(1 + A ** 2)
                + torch.sqrt(2 + torch.sin(A)) * torch.cos(A) + torch.exp(-A * A)
                + X @ torch.ones(d, d, dtype=X.dtype) / n)

    from torch_variants import FORWARDS as variants      # alibi, ..., relative_bias, rope_*, kv_cache_decode

    return {f.__name__: f for f in (self_attention, causal, cross_attention, multi_head, positional, key_padding,
                                    additive, beyond)} | variants


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_leaf_gradients_match_torch_autograd(path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch autograd cross-check is skipped")
    forwards = _torch_forwards()
    spec = load(path)
    if spec.name not in forwards:
        pytest.fail(f"no hand-written torch version of {spec.name}: add one to _torch_forwards")
    leaves, upstream = sample(spec, seed=7)
    tensors = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in leaves.items()}
    from torch_variants import EXTRA_OUTPUTS

    first, *others = spec.outputs
    assert tuple(others) == EXTRA_OUTPUTS.get(spec.name, ()), "the hand-written version returns the first output"
    kept: dict = {}
    output = forwards[spec.name](**tensors, **({"keep": kept} if others else {}))
    outputs = {first: output, **{o: kept[o] for o in others}}
    values = forward_values(spec, leaves)
    total = 0
    for name, value in outputs.items():
        np.testing.assert_allclose(value.detach().numpy(), values[name], rtol=1e-12, atol=1e-12,
                                   err_msg=f"the torch forward and the spec disagree on {name}")
        total = total + (value * torch.tensor(upstream[name])).sum()
    total.backward()
    derived = derived_gradients(spec, leaves, upstream)
    for name in spec.typed.differentiable:
        np.testing.assert_allclose(derived[name], tensors[name].grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=f"grad({name})")
