"""Claims over integer buffers: verdicts against brute force in plain NumPy over every value in range.

A claim over `buffer r[N] in LO:HI` holds when it holds for every integer assignment of r's entries in the
range (LANGUAGE.md). Each case here states the expectation computed independently: NumPy evaluates both
sides for every assignment (Python's // and %, the sign of the divisor), so "proved" must mean true for all
of them and "refuted" must carry integer values in range at which NumPy sees the sides differ. The inputs
most likely to fool a prover: negative values (C's truncating division differs from Python's), ranges that
make an identity hold only because of the bound (doc // D == 0 needs doc < D), a range one wider than that,
and subscripts through the buffer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import symattn

HEAD = "dim N = 3, D = 2\ninput X[N, 1]\n"

# (buffer declaration, definitions, claim, numpy (r, X) -> (lhs, rhs)): every assignment is enumerated here
CASES = [
    ("buffer r[N] in -2:3", "F = r // 2 * 2 + r % 2", "F == r",
     lambda r, x: (r // 2 * 2 + r % 2, r)),
    ("buffer r[N] in -2:3", "F = r // 2", "F == -((-r) // 2)",
     lambda r, x: (r // 2, -((-r) // 2))),
    ("buffer r[N] in 0:D", "F = r // D", "F == 0 * r",
     lambda r, x: (r // 2, 0 * r)),
    ("buffer r[N] in 0:D + 1", "F = r // D", "F == 0 * r",
     lambda r, x: (r // 2, 0 * r)),
    ("buffer r[N] in -1:2", "F = r % 2", "F == abs(r) % 2",
     lambda r, x: (r % 2, np.abs(r) % 2)),
    ("buffer r[N] in -1:2", "F = min(r, 0) + max(r, 0)", "F == r",
     lambda r, x: (np.minimum(r, 0) + np.maximum(r, 0), r)),
    ("buffer r[N] in -1:2", "F = clamp(r, 0, 1)", "F == abs(r)",
     lambda r, x: (np.clip(r, 0, 1), np.abs(r))),
    ("buffer r[N] in 0:N", "G[i:N, c:1] = X[r[i], c]\nF = G - X", "F == 0 * X",
     lambda r, x: (x[r] - x, 0 * x)),
    ("buffer r[N] in 0:N", "G[i:N, c:1] = X[r[r[i]], c]\nH[i:N, c:1] = X[r[i], c]", "G == H",
     lambda r, x: (x[r[r]], x[r])),
    ("buffer r[N] in 0:D", "M[i:N, j:N] = where(r[i] == r[j], 0, -inf)", "M == M.T",
     lambda r, x: ((m := np.where(r[:, None] == r[None, :], 0.0, -np.inf)), m.T)),
    ("buffer r[N] in 0:D", "M[i:N, j:N] = where((r[i] == r[j]) & (j <= i), 0, -inf)", "M == M.T",
     lambda r, x: ((m := np.where((r[:, None] == r[None, :]) & np.tri(3, dtype=bool), 0.0, -np.inf)), m.T)),
]


def _truth(declaration, function):
    """Whether the claim holds at every assignment, by NumPy (X at a few points too)."""
    low, high = _range(declaration)
    rng = np.random.default_rng(0)
    for values in itertools.product(range(low, high), repeat=3):
        r = np.array(values)
        for _ in range(3):
            x = rng.integers(-3, 4, size=(3, 1)).astype(np.float64)
            with np.errstate(all="ignore"):
                lhs, rhs = function(r, x)
            if not np.array_equal(np.broadcast_to(lhs, np.broadcast_shapes(np.shape(lhs), np.shape(rhs))),
                                  np.broadcast_to(rhs, np.broadcast_shapes(np.shape(lhs), np.shape(rhs)))):
                return False
    return True


def _range(declaration):
    low, high = declaration.split(" in ")[1].split(":")
    value = lambda s: eval(s.replace("N", "3").replace("D", "2"))  # noqa: E731
    return value(low), value(high)


@pytest.mark.parametrize("declaration, definitions, claim, function", CASES,
                         ids=[f"{d.split(' in ')[1]}: {c}" for d, _, c, _ in CASES])
def test_verdict_against_every_assignment(declaration, definitions, claim, function):
    text = f"{HEAD}{declaration}\n{definitions}\noutput {_first(definitions)}\ncheck {claim}\n"
    spec = symattn.load(text)
    verdict = spec.check()[-1]
    truth = _truth(declaration, function)
    assert verdict.verdict != ("refuted" if truth else "proved"), (claim, truth, verdict.method)
    if not truth:
        assert verdict.verdict == "refuted", verdict.method  # small enough for the search to find it
        counter = verdict.counterexample
        r = np.array(counter.inputs["r"])
        low, high = _range(declaration)
        assert r.dtype.kind in "iu" or np.array_equal(r, np.round(r)), r
        assert ((low <= r) & (r < high)).all(), r
        x = np.array(counter.inputs["X"], dtype=np.float64)
        with np.errstate(all="ignore"):
            lhs, rhs = function(r.astype(np.int64), x)
        assert not np.array_equal(*np.broadcast_arrays(lhs, rhs)), (r, x)


def _first(definitions):
    return definitions.split("\n")[0].split("[")[0].split("=")[0].strip()


def test_the_cases_cover_both_answers():
    truths = [_truth(d, f) for d, _, _, f in CASES]
    assert any(truths) and not all(truths)


DOC_MASK = """\
dim N = 4, D = 2, d_k = 2
input Q[N, d_k], K[N, d_k], V[N, d_k]
buffer doc[N] in 0:D
M[i:N, j:N] = where(doc[i] == doc[j], 0, -inf)
S = Q @ K.T / sqrt(d_k) + M
O = softmax(S, axis=-1) @ V
output O
"""


def _doc_attention(q, k, v, doc):
    s = q @ k.T / np.sqrt(q.shape[-1]) + np.where(doc[:, None] == doc[None, :], 0.0, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v


@pytest.mark.parametrize("claim, moved, holds", [
    ("equivariant(O, (Q, K, V, doc))", ("Q", "K", "V", "doc"), True),   # the ids move with their tokens
    ("equivariant(O, (Q, K, V))", ("Q", "K", "V"), False),              # the ids stay: the mask does not move
    ("invariant(O, (K, V, doc))", ("K", "V", "doc"), False),            # the queries' ids move too
])
def test_a_document_mask_under_permutations(claim, moved, holds):
    """A document mask is permutation-equivariant when the document ids move with the tokens, not otherwise
    (never a relabelling of the ids' values): against NumPy on every permutation of 4 tokens."""
    verdict = symattn.load(DOC_MASK + f"check {claim}\n").check()[-1]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 2)) for _ in range(3))
    truth = True
    for doc in itertools.product(range(2), repeat=4):
        doc = np.array(doc)
        base = _doc_attention(q, k, v, doc)
        for perm in itertools.permutations(range(4)):
            perm = np.array(perm)
            args = {"Q": q, "K": k, "V": v, "doc": doc}
            args = {n: (a[perm] if n in moved else a) for n, a in args.items()}
            out = _doc_attention(args["Q"], args["K"], args["V"], args["doc"])
            want = base if claim.startswith("invariant") else base[perm]
            truth = truth and np.allclose(out, want, atol=1e-12)
    assert truth == holds
    assert verdict.verdict == ("proved" if holds else "refuted"), verdict.method
