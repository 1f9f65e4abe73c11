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
from conftest import REPO

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


# --- divisors read from integer buffers -----------------------------------------------------------------------
# tests/data/dilated_heads.attn (a per-head dilation, a per-query reach (j - i) // back[i] with back < 0, a divisor
# i // (j + 1) that reads an index, a remainder that takes the divisor's sign). Its mask M against the same mask
# written without those divisors (M2: true under Python's floor) and with C's truncation (M3: false at N >= 4).
# The truth is computed here in NumPy over every assignment of dil and back in range, at N = 4, h = 1.

DIVISORS = REPO / "tests" / "data" / "dilated_heads.attn"
DIVISOR_SIZES = {"N": 4, "h": 1}

MASKS = {
    "M2": "M2[g:h, i:N, j:N] = where((((i - j) % dil[g]) == 0) & ((j - i) <= -back[i]) & (i <= 2 * j + 1), "
          "slope * ((j - i) - back[i] * ((j - i) // back[i])) - 0.25 * ((i - j + dil[g]) // dil[g]), -inf)",
    "M3": "M3[g:h, i:N, j:N] = where((((i - j) % dil[g]) == 0) & ((j - i) < -2 * back[i]) & (i <= 2 * j + 1), "
          "slope * ((j - i) % back[i]) + 0.25 * ((j - i - 1) // dil[g]), -inf)",
}


def _divisor_mask(name, dil, back, slope, n=4):
    """M, M2 or M3 of shape [h, n, n] in NumPy from the definitions above (NumPy's // and % on integer arrays are
    Python's: floor, and the sign of the divisor)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    d, r = np.asarray(dil)[:, None, None], np.asarray(back)[None, :, None]
    if name == "M":
        keep = ((i - j) % d == 0) & ((j - i) // r >= -1) & (i // (j + 1) <= 1)
        bias = slope * ((j - i) % r) + 0.25 * ((j - i - 1) // d)
    elif name == "M2":
        keep = ((i - j) % d == 0) & ((j - i) <= -r) & (i <= 2 * j + 1)
        bias = slope * ((j - i) - r * ((j - i) // r)) - 0.25 * ((i - j + d) // d)
    else:
        keep = ((i - j) % d == 0) & ((j - i) < -2 * r) & (i <= 2 * j + 1)
        bias = slope * ((j - i) % r) + 0.25 * ((j - i - 1) // d)
    return np.where(keep, bias, -np.inf)


def _masks_agree_everywhere(other):
    rng = np.random.default_rng(0)
    for dil in range(1, 4):
        for back in itertools.product((-2, -1), repeat=4):
            slope = float(rng.integers(-4, 5)) / 2
            if not np.array_equal(_divisor_mask("M", [dil], back, slope), _divisor_mask(other, [dil], back, slope)):
                return False
    return True


@pytest.mark.parametrize("other", MASKS)
def test_a_mask_of_buffer_divisors_against_every_assignment(other):
    text = DIVISORS.read_text(encoding="utf-8") + f"{MASKS[other]}\ncheck M == {other}\n"
    verdict = symattn.load(text, dims=DIVISOR_SIZES).check()[-1]
    truth = _masks_agree_everywhere(other)
    assert truth == (other == "M2")  # the rewriting is exact under Python's floor, not under C's truncation
    if truth:
        assert verdict.verdict == "proved", verdict.method  # 3 x 2^4 assignments: the element level takes each
        return
    assert verdict.verdict == "refuted", verdict.method
    inputs = verdict.counterexample.inputs
    dil, back = np.array(inputs["dil"]), np.array(inputs["back"])
    assert dil.dtype.kind in "iu" and back.dtype.kind in "iu", (dil, back)  # integer values, in range
    assert ((1 <= dil) & (dil < 4)).all() and ((-2 <= back) & (back < 0)).all(), (dil, back)
    slope = float(np.asarray(inputs["slope"]))
    assert not np.array_equal(_divisor_mask("M", dil, back, slope), _divisor_mask(other, dil, back, slope))


def test_the_attention_of_a_buffer_divisor_mask_is_proved_and_its_gradient_for_all_sizes():
    text = DIVISORS.read_text(encoding="utf-8") + f"{MASKS['M2']}\ncheck softmax(Q @ K.T / sqrt(d_k) + M2, axis=-1) == P\n"
    verdicts = symattn.load(text, dims=DIVISOR_SIZES).check()
    assert [v.verdict for v in verdicts] == ["proved", "proved"], [v.method for v in verdicts]
    assert "for all sizes" in verdicts[0].method


# Matrix notation, a whole buffer as the divisor: r in -2:3 over q, positive or negative, at N = 2 (at most 100
# assignments, so that the element level takes each).
WHOLE_CASES = [
    ("1:3", "F = r // q * q + r % q", "F == r", lambda r, q: (r // q * q + r % q, r)),
    ("-2:0", "F = r // q * q + r % q", "F == r", lambda r, q: (r // q * q + r % q, r)),
    ("-2:0", "F = r // q", "F == (-r) // (-q)", lambda r, q: (r // q, (-r) // (-q))),
    ("-2:0", "F = r % q", "F == -((-r) % (-q))", lambda r, q: (r % q, -((-r) % (-q)))),
    ("2:4", "F = r % q", "F == abs(r) % q", lambda r, q: (r % q, np.abs(r) % q)),       # false: -1 % 3 is 2
    ("-2:0", "F = r // q", "F == -(r // (-q))", lambda r, q: (r // q, -(r // (-q)))),  # false: floor is not odd
    ("-2:0", "F = r % q", "F == r % (-q)", lambda r, q: (r % q, r % (-q))),            # false: the divisor's sign
]


def _whole_truth(values, function):
    low, high = (int(v) for v in values.split(":"))
    return all(np.array_equal(*function(np.array(r), np.array(q))) for r in itertools.product(range(-2, 3), repeat=2)
               for q in itertools.product(range(low, high), repeat=2))


@pytest.mark.parametrize("values, definition, claim, function", WHOLE_CASES,
                         ids=[f"q in {v}: {c}" for v, _, c, _ in WHOLE_CASES])
def test_a_whole_buffer_divisor_against_every_assignment(values, definition, claim, function):
    text = f"dim N = 2\nbuffer r[N] in -2:3\nbuffer q[N] in {values}\n{definition}\noutput F\ncheck {claim}\n"
    verdict = symattn.load(text).check()[-1]
    truth = _whole_truth(values, function)
    assert verdict.verdict == ("proved" if truth else "refuted"), (claim, truth, verdict.method)
    if not truth:
        r, q = (np.array(verdict.counterexample.inputs[n]) for n in "rq")
        low, high = (int(v) for v in values.split(":"))
        assert r.dtype.kind in "iu" and q.dtype.kind in "iu", (r, q)
        assert ((-2 <= r) & (r < 3)).all() and ((low <= q) & (q < high)).all(), (r, q)
        assert not np.array_equal(*function(r, q)), (r, q)


def test_the_whole_buffer_cases_cover_both_answers():
    truths = [_whole_truth(v, f) for v, _, _, f in WHOLE_CASES]
    assert truths == [True] * 4 + [False] * 3
