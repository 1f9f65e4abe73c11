"""Permutation equivariance and invariance: verdicts, proofs, counterexamples.

- The verdicts for every spec in derivations/, with the proof steps that end in
  the conclusion, or stop at the tensor that breaks it.
- Every counterexample is re-evaluated here with plain NumPy, by forward
  passes written independently of symattn (the sinusoidal encoding from its
  formula in docs/language.md): O(Pi X) differs from Pi O(X) by the reported amount.
- Hypothesis property tests: random permutations, sizes and float64 inputs,
  through the same independent NumPy forwards, agree with the verdicts.
- Specs a new user would try (biases, shared keys, feature maps, index
  notation, pooling, the dim argument), and the rule that a failed proof with
  no counterexample is `unknown`, never `refuted`.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symattn
import symattn.prove.equivariance as eq
from conftest import REPO, run_cli
from symattn.errors import UsageError

DERIV = REPO / "derivations"
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


# --- independent NumPy forwards ----------------------------------------------------------


def softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    z = s - np.max(s, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def self_attention(X, W_q, W_k, W_v, bias=None):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = Q @ K.T / np.sqrt(W_q.shape[1])
    if bias is not None:
        S = S + bias
    return softmax(S) @ V


def causal(X, W_q, W_k, W_v):
    n = X.shape[0]
    mask = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, -np.inf)  # j <= i: 0
    return self_attention(X, W_q, W_k, W_v, bias=mask)


def sinusoidal(n: int, d: int) -> np.ndarray:
    """E[i, 2c] = sin(i / 10000^(2c/d)), E[i, 2c+1] = cos(i / 10000^(2c/d)), i from 0."""
    E = np.zeros((n, d))
    for i in range(n):
        for col in range(d):
            c = col // 2
            angle = i / 10000 ** (2 * c / d)
            E[i, col] = np.sin(angle) if col % 2 == 0 else np.cos(angle)
    return E


def positional(X, W_q, W_k, W_v):
    return self_attention(X + sinusoidal(*X.shape), W_q, W_k, W_v)


def alibi(X, W_q, W_k, W_v):
    n = X.shape[0]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return self_attention(X, W_q, W_k, W_v, bias=-np.abs(i - j).astype(float))


def learned_bias(X, W_q, W_k, W_v, B):
    return self_attention(X, W_q, W_k, W_v, bias=B)


def multi_head(X, W_q, W_k, W_v, W_o):
    h, _, d_k = W_q.shape
    Q = np.einsum("nd,hdk->hnk", X, W_q)
    K = np.einsum("nd,hdk->hnk", X, W_k)
    V = np.einsum("nd,hdk->hnk", X, W_v)
    P = softmax(np.einsum("hik,hjk->hij", Q, K) / np.sqrt(d_k))
    Z = np.einsum("hij,hjk->hik", P, V)
    merged = np.concatenate([Z[k] for k in range(h)], axis=1)  # head-major [N, h * d_k]
    return merged @ W_o


def additive(X, W_1, W_2, w, W_v):
    n = X.shape[0]
    A, B = X @ W_1, X @ W_2
    S = np.array([[np.sum(w * np.tanh(A[i] + B[j])) for j in range(n)] for i in range(n)])
    return softmax(S) @ (X @ W_v)


def cross_attention(X, Y, W_q, W_k, W_v):
    Q, K, V = X @ W_q, Y @ W_k, Y @ W_v
    return softmax(Q @ K.T / np.sqrt(W_q.shape[1])) @ V


def linear_attention(X, W_q, W_k, W_v):
    F, G, V = np.exp(X @ W_q), np.exp(X @ W_k), X @ W_v
    return (F @ (G.T @ V)) / (F @ G.sum(axis=0)[:, None])


# --- verdicts, computed once -------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def spec(name: str, **dims):
    return symattn.load(DERIV / f"{name}.attn", dims=dims or None)


@functools.lru_cache(maxsize=None)
def verdict(name: str, output: str = "O", source: str = "X", invariant: bool = False):
    return spec(name).equivariance(output, source, invariant=invariant)


@functools.lru_cache(maxsize=None)
def text_verdict(text: str, output: str = "O", source: str = "X", dim=None, invariant: bool = False, **dims):
    return symattn.load(text, dims=dims or None).equivariance(output, source, dim=dim, invariant=invariant)


def steps_of(v) -> list[tuple[str, str, str]]:
    return [tuple(s) for s in v.steps]


EXPECTED = [  # (spec, output, source, invariant, verdict, conclusion)
    ("self_attention", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("multi_head", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("additive", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("cross_attention", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("cross_attention", "O", "Y", True, "proved", "O(Pi Y) = O(Y)"),
    ("causal", "O", "X", False, "refuted", None),
    ("positional", "O", "X", False, "refuted", None),
    ("key_padding", "O", "X", False, "refuted", None),  # keep stays put; the group (X, keep): tests/features/test_buffers.py
    ("relative_bias", "O", "X", False, "refuted", None),
    ("rope_interleaved", "O", "X", False, "refuted", None),
    ("rope_half", "O", "X", False, "refuted", None),
    # The variants. Masks and biases indexed by position (causal, sliding window, ALiBi's j - i)
    # and prefix sums (causal linear) tie outputs to positions: refuted. Elementwise changes
    # to the scores (tanh cap, sigmoid with a constant shift, a second softmax map subtracted),
    # a row max subtracted (stable softmax) and heads sharing K and V (GQA) keep the chain.
    ("alibi", "O", "X", False, "refuted", None),
    ("causal_linear", "O", "X", False, "refuted", None),
    ("cosine", "O", "Q", False, "proved", "O(Pi Q) = Pi O(Q)"),  # row norms of Q permute with Q
    ("cosine", "O", "K", True, "refuted", None),   # K alone: P's columns move, V's rows don't (the group
                                                   # (K, V) is invariant: cosine.attn's own check)
    ("differential", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("gqa", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("sigmoid", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("sliding_window", "O", "X", False, "refuted", None),
    ("softcap", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("stable_softmax", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("kv_cache_decode", "O", "K_cache", True, "refuted", None),  # keys reordered without their values
    # online softmax: the queries permute the outputs; a block's keys moved without their values do not
    ("online_softmax", "O", "Q", False, "proved", "O(Pi Q) = Pi O(Q)"),
    ("online_softmax", "O", "K1", True, "refuted", None),
    ("online_softmax_masked", "O", "V1", True, "refuted", None),  # values reordered without their weights
    # the attention plan's peer variants: positions in a bias or a mask tie the outputs to them; a key and
    # value head shared by every query head (MQA) and two products summed (MLA) keep the chain
    ("mqa", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("mla", "O", "X", False, "proved", "O(Pi X) = Pi O(X)"),
    ("t5_bias", "O", "X", False, "refuted", None),
    ("alibi_learned", "O", "X", False, "refuted", None),
    ("padding_qk", "O", "X", False, "refuted", None),  # real stays put; the group (X, real) is the spec's check
    ("lse_output", "O", "Q", False, "proved", "O(Pi Q) = Pi O(Q)"),
    ("dropout_mask", "O", "X", False, "refuted", None),  # Z stays put
    ("attention_dropout", "O", "Q", False, "refuted", None),  # the causal mask, and the drawn mask stays put
    ("prefix_lm", "O", "X", False, "refuted", None),
    ("causal_bottom_right", "O", "K", True, "refuted", None),  # keys reordered without their values
    # the mask language: positions in every one of these masks and biases (a document's own positions, a
    # dilation, a window, log buckets, image intervals), and a page pool reordered without its table
    ("document_offsets", "O", "Q", False, "refuted", None),
    ("dilated_window", "O", "Q", False, "refuted", None),
    ("window_zero_side", "O", "K", True, "refuted", None),
    ("alibi_exp2", "O", "V", True, "refuted", None),  # V's first axis is the heads: moved alone, O is not fixed
    ("t5_buckets", "O", "Q", False, "refuted", None),
    ("flamingo_intervals", "O", "Y", True, "refuted", None),
    ("paged_decode", "O", "Kc", True, "refuted", None),
]
# Specs with no single dim for a claim to permute: NATTEN's tokens are an H x W grid (axis H * W).
NO_SINGLE_DIM = {"natten_2d"}


def test_every_example_spec_is_covered():
    assert {e[0] for e in EXPECTED} | NO_SINGLE_DIM == {p.stem for p in DERIV.glob("*.attn")}
    for name in NO_SINGLE_DIM:
        with pytest.raises(symattn.SymAttnError, match="not a single dim"):
            verdict(name, "O", "Q")


@pytest.mark.parametrize("name,output,source,invariant,expected,conclusion", EXPECTED,
                         ids=[f"{e[0]}-{e[2]}" for e in EXPECTED])
def test_verdicts_of_the_examples(name, output, source, invariant, expected, conclusion):
    v = verdict(name, output, source, invariant)
    assert v.verdict == expected, v.method
    steps = steps_of(v)
    assert steps[0] in (("leaf", source, f"{source} -> Pi {source}"),  # a matrix, or a 3-D tensor's first axis
                        ("leaf", source, f"{source} -> {source} permuted along axis 0"))
    if expected == "proved":
        assert v.counterexample is None
        assert steps[-1] == ("conclusion", output, conclusion)
        assert all(lemma in eq.LEMMAS for lemma, _, _ in steps[:-1])
        assert "for every" in v.method and "element-level witness: exact identity" in v.method
    else:
        assert v.counterexample is not None
        assert steps[-1][0] == "none"
        assert not any(lemma == "conclusion" for lemma, _, _ in steps)


def test_the_proof_is_a_chain_over_every_tensor():
    """Each tensor the output reads gets its own step, in definition order, before the conclusion."""
    steps = steps_of(verdict("self_attention"))
    assert [s[1] for s in steps] == ["X", "Q", "K", "V", "S", "P", "O", "O"]
    assert [s[0] for s in steps] == ["leaf", "matmul", "matmul", "matmul", "elementwise", "softmax", "matmul",
                                     "conclusion"]
    assert steps[4][2] == "S = Q @ K.T / sqrt(d_k) -> Pi S Pi^T"
    assert steps[5][2] == "P = softmax(S, axis=-1) -> Pi P Pi^T"
    invariant = steps_of(verdict("cross_attention", "O", "Y", True))
    assert ("softmax", "P", "P = softmax(Q @ K.T / sqrt(d_k), axis=-1) -> P Pi^T") in invariant
    assert ("matmul", "Q", "Q = X @ W_q -> Q") in invariant


@pytest.mark.parametrize("name,tensor,mentions", [
    ("causal", "P", ["M", "where(j <= i, 0, -inf)", "positions"]),
    ("positional", "H", ["E", "sinusoidal(N, d)", "position"]),
])
def test_the_proof_stops_at_the_right_tensor(name, tensor, mentions):
    typed = spec(name).typed
    proof = eq.prove_symmetry(typed, "O", "X", "N", False)
    assert not proof.holds and proof.broken_at == tensor
    v = verdict(name)
    lemma, at, statement = steps_of(v)[-1]
    assert (lemma, at) == ("none", tensor)
    for word in mentions:
        assert word in proof.reason, proof.reason
        assert word in v.method
    assert f"the proof stops at {tensor}" in v.method


def test_the_checks_in_the_example_specs():
    """`check not equivariant` in causal / positional is proved; the positive claims are proved."""
    for name in ("causal", "positional", "self_attention", "multi_head", "additive", "cross_attention",
                 "key_padding"):
        for v in spec(name).check():
            if "variant" in v.claim:
                assert v.verdict == "proved", (name, v.claim, v.method)
                if v.claim.startswith("not "):
                    assert v.counterexample is not None


# --- counterexamples, re-evaluated with plain NumPy --------------------------------------


def reevaluate(counter, forward, names):
    """Both sides recomputed from the counterexample's inputs and permutation; the largest gap."""
    inputs = {k: np.array(v, dtype=float) for k, v in counter.inputs.items()}
    perm, axis = counter.extra["permutation"], counter.extra["axis"]
    assert axis == 0 and sorted(perm) == list(range(len(perm))) and perm != sorted(perm)
    args = [inputs[n] for n in names]
    moved = [np.take(args[0], perm, axis=0), *args[1:]]
    left = forward(*moved)
    right = np.take(forward(*args), perm, axis=0)
    return left, right


def reported_gap(note: str) -> float:
    match = re.search(r"differ by ([0-9.e+-]+)", note)
    assert match, note
    return float(match.group(1))


@pytest.mark.parametrize("name,forward", [("causal", causal), ("positional", positional)])
def test_counterexample_reruns_in_numpy(name, forward):
    v = verdict(name)
    counter = v.counterexample
    assert counter.sizes == spec(name).dims
    assert set(counter.inputs) == {"X", "W_q", "W_k", "W_v"}
    left, right = reevaluate(counter, forward, ["X", "W_q", "W_k", "W_v"])
    np.testing.assert_allclose(left, np.array(counter.lhs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(right, np.array(counter.rhs), rtol=1e-12, atol=1e-12)
    gap = np.abs(left - right)
    assert gap.max() == pytest.approx(reported_gap(counter.note), rel=5e-3)
    assert gap.max() > 1e-2  # clearly separated, not rounding
    where = re.search(r"at entry \[([0-9, ]+)\]", counter.note).group(1)
    assert tuple(int(k) for k in where.split(",")) == np.unravel_index(np.argmax(gap), gap.shape)
    one_based = [p + 1 for p in counter.extra["permutation"]]
    assert f"Pi = {one_based}" in counter.note
    # the same inputs, unpermuted: no difference (the gap is the permutation's doing)
    left_id, right_id = reevaluate_identity(counter, forward, ["X", "W_q", "W_k", "W_v"])
    np.testing.assert_allclose(left_id, right_id, rtol=0, atol=0)


def reevaluate_identity(counter, forward, names):
    args = [np.array(counter.inputs[n], dtype=float) for n in names]
    return forward(*args), forward(*args)


# --- property tests: random permutations and inputs, independent NumPy -------------------


@st.composite
def case(draw, n_min=2, n_max=6):
    n = draw(st.integers(n_min, n_max))
    perm = draw(st.permutations(list(range(n))))
    seed = draw(st.integers(0, 2**32 - 1))
    return n, list(perm), np.random.default_rng(seed)


def rand(rng, *shape):
    return rng.standard_normal(shape)


@PROPERTY
@given(case(), st.integers(1, 4), st.integers(1, 3))
def test_self_attention_is_equivariant_numerically(c, d, d_k):
    assert verdict("self_attention").verdict == "proved"
    n, perm, rng = c
    X, W_q, W_k, W_v = rand(rng, n, d), rand(rng, d, d_k), rand(rng, d, d_k), rand(rng, d, d_k)
    np.testing.assert_allclose(self_attention(X[perm], W_q, W_k, W_v), self_attention(X, W_q, W_k, W_v)[perm],
                               rtol=1e-10, atol=1e-12)


@PROPERTY
@given(case(), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_multi_head_is_equivariant_numerically(c, d, h, d_k):
    assert verdict("multi_head").verdict == "proved"
    n, perm, rng = c
    W = [rand(rng, h, d, d_k) for _ in range(3)]
    X, W_o = rand(rng, n, d), rand(rng, h * d_k, d)
    np.testing.assert_allclose(multi_head(X[perm], *W, W_o), multi_head(X, *W, W_o)[perm], rtol=1e-10, atol=1e-12)


@PROPERTY
@given(case(), st.integers(1, 4), st.integers(1, 4))
def test_additive_is_equivariant_numerically(c, d, d_a):
    assert verdict("additive").verdict == "proved"
    n, perm, rng = c
    X, W_1, W_2, w, W_v = rand(rng, n, d), rand(rng, d, d_a), rand(rng, d, d_a), rand(rng, d_a), rand(rng, d, d)
    np.testing.assert_allclose(additive(X[perm], W_1, W_2, w, W_v), additive(X, W_1, W_2, w, W_v)[perm],
                               rtol=1e-10, atol=1e-12)


@PROPERTY
@given(case(), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3), st.data())
def test_cross_attention_numerically(c, m, d, d_k, data):
    assert verdict("cross_attention", "O", "X").verdict == "proved"
    assert verdict("cross_attention", "O", "Y", True).verdict == "proved"
    n, perm, rng = c
    sigma = list(data.draw(st.permutations(list(range(m)))))
    X, Y = rand(rng, n, d), rand(rng, m, d)
    W = [rand(rng, d, d_k) for _ in range(3)]
    base = cross_attention(X, Y, *W)
    np.testing.assert_allclose(cross_attention(X[perm], Y, *W), base[perm], rtol=1e-10, atol=1e-12)  # equivariant in X
    np.testing.assert_allclose(cross_attention(X, Y[sigma], *W), base, rtol=1e-10, atol=1e-12)       # invariant in Y


@PROPERTY
@given(case(), st.integers(1, 4), st.integers(1, 3))
def test_linear_attention_is_equivariant_numerically(c, d, d_k):
    assert text_verdict(LINEAR).verdict == "proved"
    n, perm, rng = c
    X, W = rand(rng, n, d) / 2, [rand(rng, d, d_k) / 2 for _ in range(3)]
    np.testing.assert_allclose(linear_attention(X[perm], *W), linear_attention(X, *W)[perm], rtol=1e-10, atol=1e-12)


@PROPERTY
@given(case(), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["causal", "positional"]))
def test_refuted_specs_hold_only_for_the_identity(c, d, d_k, name):
    """Sanity: the identity permutation always 'holds'; a non-identity one breaks it (generic inputs)."""
    assert verdict(name).verdict == "refuted"
    forward = {"causal": causal, "positional": positional}[name]
    n, perm, rng = c
    X, W = rand(rng, n, d), [rand(rng, d, d_k) for _ in range(3)]
    base = forward(X, *W)
    np.testing.assert_allclose(forward(X[list(range(n))], *W), base, rtol=0, atol=0)
    if perm != list(range(n)):
        assert np.max(np.abs(forward(X[perm], *W) - base[perm])) > 1e-8


# --- specs a new user would try ----------------------------------------------------------

HEAD = """
dim N = 4, d = 3, d_k = 2
input X[N, d]
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k]
"""

ALIBI = HEAD + """
B[i:N, j:N] = -abs(i - j)          # ALiBi-style distance bias
Q = X @ W_q
K = X @ W_k
V = X @ W_v
S = Q @ K.T / sqrt(d_k) + B
O = softmax(S, axis=-1) @ V
output O
"""

ALIBI_INLINE = HEAD + """
Q = X @ W_q
K = X @ W_k
S[i, j] = sum(k, Q[i, k] * K[j, k]) / sqrt(d_k) - abs(i - j)
O = softmax(S, axis=-1) @ (X @ W_v)
output O
"""

LEARNED = """
dim N = 4, d = 3, d_k = 2
input X[N, d]
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k], B[N, N]
S = (X @ W_q) @ (X @ W_k).T / sqrt(d_k) + B
O = softmax(S, axis=-1) @ (X @ W_v)
output O
"""

SHARED = """
dim N = 4, d = 3
input X[N, d]
param W_q[d, d], W[d, d]
K = X @ W
V = K                               # shared keys and values
O = softmax((X @ W_q) @ K.T, axis=-1) @ V
output O
check equivariant(O, X)
"""

LINEAR = HEAD + """
F = exp(X @ W_q)                    # feature maps phi(q), phi(k)
G = exp(X @ W_k)
V = X @ W_v
O = (F @ (G.T @ V)) / (F @ sum(G.T, axis=-1))
output O
"""

INDEX = HEAD + """
Q = X @ W_q
K = X @ W_k
S[i, j] = sum(k, Q[i, k] * K[j, k]) / sqrt(d_k)
P[i, j] = exp(S[i, j]) / sum(m, exp(S[i, m]))
O[i, c] = sum(j, P[i, j] * sum(e, X[j, e] * W_v[e, c]))
output O
"""

POOLED = HEAD + """
P = softmax((X @ W_q) @ (X @ W_k).T, axis=-1)
O = P @ (X @ W_v)
R = sum(O, axis=-2)                 # summed over tokens
output R, O
check invariant(R, X)
check not invariant(O, X)
"""

QUERY_POOL = """
dim N = 4, d = 3
input X[N, d]
param w[d]
a = softmax(X @ w, axis=-1)         # one score per token: a 1-D @
O = a @ X                           # attention pooling
output O
check invariant(O, X)
"""

TRANSPOSED = """
dim N = 4, d = 3, d_k = 2
input X[d, N]                       # tokens are columns
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k]
A = X.T
O = softmax((A @ W_q) @ (A @ W_k).T, axis=-1) @ (A @ W_v)
output O
check equivariant(O, X, N)
"""

DIAGONAL = """
dim N = 3, d = 2
input X[N, d]
S[i, j] = sum(k, X[i, k] * X[j, k]) * where(i == j, 1, 0)    # uses index values, yet is equivariant
O = S @ X
output O
check equivariant(O, X)
"""


def test_alibi_bias_is_refuted_where_the_bias_enters():
    v = text_verdict(ALIBI)
    assert v.verdict == "refuted"
    steps = steps_of(v)
    assert ("index", "B", "B[i, j] = -abs(i - j) -> B") in steps       # the bias is fixed: it does not move
    lemma, at, statement = steps[-1]
    assert (lemma, at) == ("none", "S")
    assert "B is not permuted with" in statement and "abs(i - j)" in statement and "positions" in statement
    left, right = reevaluate(v.counterexample, alibi, ["X", "W_q", "W_k", "W_v"])
    np.testing.assert_allclose(left, v.counterexample.lhs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(right, v.counterexample.rhs, rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(left - right)) == pytest.approx(reported_gap(v.counterexample.note), rel=5e-3)


def test_alibi_in_index_notation_stops_at_the_scores():
    v = text_verdict(ALIBI_INLINE)
    assert v.verdict == "refuted"
    lemma, at, statement = steps_of(v)[-1]
    assert (lemma, at) == ("none", "S")
    assert re.search(r"uses the value of index [ij]", statement)


def test_alibi_at_two_tokens_is_unknown_not_refuted():
    """At N = 2, -|i - j| is symmetric under the only swap, so no counterexample exists there:
    the failed general proof must give `unknown`, never `refuted` (nor `proved`)."""
    v = text_verdict(ALIBI, N=2)
    assert v.verdict == "unknown" and v.counterexample is None
    assert "the proof stops at S" in v.method and "no counterexample found" in v.method


def test_learned_bias_is_refuted():
    v = text_verdict(LEARNED)
    assert v.verdict == "refuted"
    lemma, at, statement = steps_of(v)[-1]
    assert (lemma, at) == ("none", "S")
    assert "B is a param, which the claim does not permute" in statement
    counter = v.counterexample
    assert "B" in counter.inputs
    left, right = reevaluate(counter, learned_bias, ["X", "W_q", "W_k", "W_v", "B"])
    np.testing.assert_allclose(left, counter.lhs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(right, counter.rhs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text", [SHARED, LINEAR, INDEX], ids=["shared-kv", "feature-map", "index-notation"])
def test_new_equivariant_specs_are_proved(text):
    v = text_verdict(text)
    assert v.verdict == "proved", v.method
    assert steps_of(v)[-1] == ("conclusion", "O", "O(Pi X) = Pi O(X)")
    assert "element-level witness: exact identity" in v.method


def test_index_notation_steps():
    steps = steps_of(text_verdict(INDEX))
    assert ("index", "S", "S[i, j] = sum(k, Q[i, k] * K[j, k]) / sqrt(d_k) -> Pi S Pi^T") in steps
    assert [s[0] for s in steps if s[1] in ("S", "P", "O")][:3] == ["index", "index", "index"]


def test_pooled_outputs_are_invariant():
    s = symattn.load(POOLED)
    checks = s.check()
    assert [v.verdict for v in checks] == ["proved", "proved"]
    assert steps_of(checks[0])[-1] == ("conclusion", "R", "R(Pi X) = R(X)")
    assert checks[1].counterexample is not None  # `not invariant(O, X)`: O moves with X


def test_attention_pooling_with_a_vector_is_invariant():
    """A 1-D operand of @ (numpy.matmul semantics) has a rule: pooling with a query vector is invariant."""
    (v,) = symattn.load(QUERY_POOL).check()
    assert v.verdict == "proved", v.method
    steps = steps_of(v)
    assert ("softmax", "a", "a = softmax(X @ w, axis=-1) -> Pi a") in steps
    assert steps[-1] == ("conclusion", "O", "O(Pi X) = O(X)")


def test_self_attention_is_not_invariant():
    v = verdict("self_attention", "O", "X", True)
    assert v.verdict == "refuted"
    assert v.method.startswith("the proof stops at O: O transforms as Pi O, not as O")
    counter = v.counterexample
    inputs = {k: np.array(val) for k, val in counter.inputs.items()}
    perm = counter.extra["permutation"]
    base = self_attention(inputs["X"], inputs["W_q"], inputs["W_k"], inputs["W_v"])
    moved = self_attention(inputs["X"][perm], inputs["W_q"], inputs["W_k"], inputs["W_v"])
    np.testing.assert_allclose(moved, counter.lhs, rtol=1e-12)
    np.testing.assert_allclose(base, counter.rhs, rtol=1e-12)  # invariance compares with O(X) itself
    assert np.max(np.abs(moved - base)) > 1e-2


def test_the_dim_argument():
    s = symattn.load(TRANSPOSED)
    (v,) = s.check()
    assert v.claim == "equivariant(O, X, N)" and v.verdict == "proved", v.method
    steps = steps_of(v)
    assert steps[0] == ("leaf", "X", "X -> X Pi^T")
    assert ("transpose", "A", "A = X.T -> Pi A") in steps
    api = s.equivariance("O", "X", dim="N")
    assert api.verdict == "proved" and steps_of(api) == steps
    assert eq.find_counterexample(s.typed, "O", "X", "N", False) is None
    with pytest.raises(UsageError):
        s.equivariance("O", "X", dim="d_k")   # X has no axis of dim d_k


def test_api_returns_the_verdict_with_its_steps():
    v = spec("multi_head").equivariance("O", "X")
    assert v.verdict == "proved" and v.holds
    assert v.claim == "equivariant(O, X, N)"
    assert ("softmax", "P", "P = softmax(Q @ K.T / sqrt(d_k), axis=-1) -> Pi P Pi^T") in steps_of(v)
    assert steps_of(v)[-1] == ("conclusion", "O", "O(Pi X) = Pi O(X)")
    # another output, and one whose name is in "Pi": the conclusion names it whole
    p = spec("self_attention").equivariance("P", "X")
    assert steps_of(p)[-1] == ("conclusion", "P", "P(Pi X) = Pi P(X) Pi^T")


def test_a_failed_proof_with_no_counterexample_is_unknown(monkeypatch):
    monkeypatch.setattr(eq, "find_counterexample", lambda *args, **kwargs: None)
    s = symattn.load(DERIV / "causal.attn")
    v = s.equivariance("O", "X")
    assert v.verdict == "unknown" and v.counterexample is None
    assert "the proof stops at P" in v.method and "no counterexample found" in v.method
    assert steps_of(v)[-1][:2] == ("none", "P")
    negated = [c for c in s.check() if "variant" in c.claim]
    assert [c.verdict for c in negated] == ["unknown"]  # `check not ...` is not proved by a failed proof


def test_a_true_claim_the_rules_cannot_prove_is_unknown():
    (v,) = symattn.load(DIAGONAL).check()
    assert v.verdict == "unknown", v.method
    assert "uses the value of index" in v.method


def test_tensors_the_output_does_not_read_do_not_matter():
    text = SHARED.replace("output O", "param u[N]\nU = u @ X        # no rule applies: u is not permuted\noutput O, U")
    s = symattn.load(text)
    (v,) = s.check()
    assert v.verdict == "proved", v.method
    assert all(step[1] != "U" for step in v.steps)
    assert s.equivariance("U", "X", invariant=True).verdict == "refuted"


def test_tensors_with_several_transformations_get_a_step():
    text = HEAD + """
C = ones(N, N)
I = eye(N)
S = (X @ W_q) @ (X @ W_k).T + C + I
O = softmax(S, axis=-1) @ (X @ W_v)
output O
"""
    v = text_verdict(text)
    assert v.verdict == "proved"
    steps = steps_of(v)
    assert ("constant", "C", "C = ones(N, N) -> C = C Pi^T = Pi C = Pi C Pi^T") in steps
    assert ("constant", "I", "I = eye(N) -> I = Pi I Pi^T") in steps


def test_cli_prints_the_counterexample_and_fails(tmp_path):
    path = tmp_path / "alibi.attn"
    path.write_text(ALIBI + "check equivariant(O, X)\ncheck not equivariant(O, X)\n", encoding="utf-8")
    out = run_cli("check", str(path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "refuted: equivariant(O, X)" in out.stdout
    assert "proved: not equivariant(O, X)" in out.stdout
    assert "permutation Pi = [" in out.stdout and "X = [[" in out.stdout
    ok = run_cli("check", str(DERIV / "causal.attn"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
