"""Permutations followed through concat along the permuted axis: diag(Pi, I) block by block.

A KV-cache decode step joins the cached keys [T, d_k] and the new key [1, d_k] along the
rows; permuting the cache rows (keys and values together) permutes the joined rows by
diag(Pi, 1), which cancels in P @ V: `invariant(O, (K_cache, V_cache), T)` is proved for
every T. Claims that look alike but are false (keys alone, values joined in another order,
a slice of the joined rows, the weights themselves) are refuted, each counterexample
re-evaluated here in plain NumPy; the proved claims are re-checked in NumPy at other sizes
(T = 1, 2, 5) with random, zero and negative caches and random permutations.
"""

from __future__ import annotations


import numpy as np
import pytest

import symattn
from conftest import REPO

SPEC = REPO / "derivations" / "kv_cache_decode.attn"

BASE = """
dim T = 3, d = 3, d_k = 2
input x[1, d]
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k]
buffer K_cache[T, d_k], V_cache[T, d_k]
q = x @ W_q
K = concat(K_cache, x @ W_k, axis=-2)
V = concat(V_cache, x @ W_v, axis=-2)
Vs = concat(x @ W_v, V_cache, axis=-2)
K2 = concat(K_cache, K_cache, axis=-2)
V2 = concat(V_cache, V_cache, axis=-2)
P = softmax(q @ K.T, axis=-1)
O = P @ V
Os = P @ Vs
O2 = softmax(q @ K2.T, axis=-1) @ V2
Ot = P[:, 0:T] @ V_cache
Ou = P[:, 0:T - 1] @ V_cache[0:T - 1]
On = P[:, T:T + 1] @ (x @ W_v)
output O, Os, O2, Ot, Ou, On, P
"""


def forward(x, W_q, W_k, W_v, K_cache, V_cache):
    """Every output of BASE in plain NumPy."""
    def softmax(s):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    q = x @ W_q
    K = np.concatenate([K_cache, x @ W_k])
    V = np.concatenate([V_cache, x @ W_v])
    Vs = np.concatenate([x @ W_v, V_cache])
    P = softmax(q @ K.T)
    O2 = softmax(q @ np.concatenate([K_cache, K_cache]).T) @ np.concatenate([V_cache, V_cache])
    t = K_cache.shape[0]
    return {"O": P @ V, "Os": P @ Vs, "O2": O2, "Ot": P[:, :t] @ V_cache, "Ou": P[:, :t - 1] @ V_cache[:t - 1],
            "On": P[:, t:t + 1] @ (x @ W_v), "P": P}


def verdict(claim):
    (v,) = symattn.load(BASE + f"check {claim}\n", filename="blocks.attn").check()
    return v


def test_the_kv_cache_claim_is_proved_for_every_t():
    verdicts = {v.claim: v for v in symattn.load(SPEC).check()}
    v = verdicts["invariant(O, (K_cache, V_cache), T)"]
    assert v.verdict == "proved", v.method
    assert v.method.startswith("for every T: matrix-level permutation rules")
    assert any(step[0] == "blocks" and "diag(Pi, I_1)" in step[2] for step in v.steps), v.steps
    assert verdicts["not invariant(O, K_cache, T)"].verdict == "proved"  # keys alone: refuted


PROVED = ["O", "O2", "Ot", "On"]  # Ot: the weights of the cache rows, a whole block; On: the new row's


@pytest.mark.parametrize("claim", [f"invariant({o}, (K_cache, V_cache), T)" for o in PROVED])
def test_block_permutations_are_proved(claim):
    v = verdict(claim)
    assert v.verdict == "proved", v.method


@pytest.mark.parametrize("claim,output,sources", [
    ("invariant(Os, (K_cache, V_cache), T)", "Os", ("K_cache", "V_cache")),  # values joined in another order
    ("invariant(Ou, (K_cache, V_cache), T)", "Ou", ("K_cache", "V_cache")),  # part of a block
    ("invariant(P, (K_cache, V_cache), T)", "P", ("K_cache", "V_cache")),    # the weights move
    ("invariant(O, V_cache, T)", "O", ("V_cache",)),                          # values alone
    ("invariant(O2, K_cache, T)", "O2", ("K_cache",)),
])
def test_look_alike_claims_are_refuted_in_numpy(claim, output, sources):
    v = verdict(claim)
    assert v.verdict == "refuted", v.method
    counter = v.counterexample
    inputs = {k: np.array(x, dtype=float) for k, x in counter.inputs.items()}
    perm = counter.extra["permutation"]
    args = {n: inputs[n] for n in ("x", "W_q", "W_k", "W_v", "K_cache", "V_cache")}
    moved = {**args, **{n: args[n][perm] for n in sources}}
    left, right = forward(**moved)[output], forward(**args)[output]
    assert np.max(np.abs(left - right)) > 1e-3, claim


@pytest.mark.parametrize("t", [1, 2, 5])
@pytest.mark.parametrize("kind", ["random", "zeros", "negative"])
def test_what_is_proved_holds_in_numpy_at_other_sizes(t, kind):
    rng = np.random.default_rng(t)
    draw = {"random": lambda *s: rng.standard_normal(s), "zeros": lambda *s: np.zeros(s),
            "negative": lambda *s: -np.abs(rng.standard_normal(s)) - 0.5}[kind]
    args = {"x": rng.standard_normal((1, 3)), "W_q": rng.standard_normal((3, 2)), "W_k": rng.standard_normal((3, 2)),
            "W_v": rng.standard_normal((3, 2)), "K_cache": draw(t, 2), "V_cache": draw(t, 2)}
    base = forward(**args)
    for _ in range(3):
        perm = rng.permutation(t)
        moved = forward(**{**args, "K_cache": args["K_cache"][perm], "V_cache": args["V_cache"][perm]})
        for output in PROVED:
            np.testing.assert_allclose(moved[output], base[output], rtol=1e-12, atol=1e-12)
