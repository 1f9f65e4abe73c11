"""Computed subscripts at the matrix level (symattn.prove.index_equations): gathers, scatters and
exp(causal_mask) proved for all sizes, and their false neighbours never proved.

Every claim's truth is decided here in plain NumPy, independently of symattn: the gather
`B[i, j] = b[f(i, j)]` is indexed directly, its adjoint is the loop `grad(b)[f(i, j)] += grad(B)[i, j]`
(the definition of the gradient of a read), with `O = B * X`, so `grad(B) = grad(O) * X`. A claim
"holds" when both sides agree at every size N = 1 .. 5 (and M = 1 .. 3 where the claim reads M)
at random points, with the float64 semantics of the spec (NaN and -inf included).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import numpy as np
import pytest
import sympy

import symattn
from symattn.prove.canonical import METHOD, definitions_for, prove_equal
from symattn.prove.index_terms import ZERO_INDEX, Equation, Term, collect
from symattn.symbolic.derive import derive
from conftest import REPO

NEG_INF = -np.inf


@dataclasses.dataclass(frozen=True)
class Gather:
    """A spec `B[i:N, j:N] = <body>`, `O = B * X`, and the same gather in NumPy."""

    name: str
    length: str                     # b's length, spec text
    body: str                       # B's entry formula, spec text
    size: Callable[[int], int]      # b's length at N
    entry: Callable                 # (b, i, j, N) -> B[i, j] in NumPy
    reads: Callable                 # (i, j, N) -> the b subscripts entry (i, j) reads, each once per read

    def text(self) -> str:
        return (f"attention {self.name}\n\ndim N = 4, M = 4\n\ninput X[N, N]\nparam b[{self.length}]\n\n"
                f"B[i:N, j:N] = {self.body}\nO = B * X\n\noutput O\n")


RELATIVE = Gather("relative", "2 * N - 1", "b[j - i + N - 1]", lambda n: 2 * n - 1,
                  lambda b, i, j, n: b[j - i + n - 1], lambda i, j, n: [j - i + n - 1])
BOTH_WAYS = Gather("both_ways", "2 * N - 1", "b[j - i + N - 1] + b[i - j + N - 1]", lambda n: 2 * n - 1,
                   lambda b, i, j, n: b[j - i + n - 1] + b[i - j + n - 1],
                   lambda i, j, n: [j - i + n - 1, i - j + n - 1])
ROWS = Gather("rows", "N", "b[N - 1 - i]", lambda n: n,
              lambda b, i, j, n: b[n - 1 - i], lambda i, j, n: [n - 1 - i])
# the relative bias with a causal mask: entries above the diagonal are -inf
MASKED = Gather("masked", "2 * N - 1", "b[j - i + N - 1] + where(j <= i, 0, -inf)", lambda n: 2 * n - 1,
                lambda b, i, j, n: b[j - i + n - 1] + (0.0 if j <= i else NEG_INF), lambda i, j, n: [j - i + n - 1])


def _values(gather: Gather, n: int, rng, b=None, x=None, g=None) -> dict:
    """b, X, grad(O) (random unless given) and B, grad(B), grad(b) computed from them in NumPy."""
    b = rng.integers(-4, 5, gather.size(n)).astype(float) / 2 if b is None else b
    x = rng.integers(-4, 5, (n, n)).astype(float) / 2 if x is None else x
    g = rng.integers(-4, 5, (n, n)).astype(float) / 2 if g is None else g
    big_b = np.array([[gather.entry(b, i, j, n) for j in range(n)] for i in range(n)], dtype=float)
    grad_big_b = g * x
    grad_b = np.zeros(gather.size(n))
    for i in range(n):
        for j in range(n):
            for k in gather.reads(i, j, n):
                grad_b[k] += grad_big_b[i, j]
    return {"b": b, "X": x, "G": g, "B": big_b, "gB": grad_big_b, "gb": grad_b}


def _eye(n):
    return np.eye(n)


# (id, gather, claim, NumPy sides (v, N, M) -> (lhs, rhs), whether it holds: then the matrix level proves
# it for all sizes; a false one it must not prove)
CASES = [
    ("sum", RELATIVE, "sum(grad(b)) == sum(grad(B))",
     lambda v, n, m: (v["gb"].sum(), v["gB"].sum()), True),
    ("first offset", RELATIVE, "grad(b)[0:1] == grad(B)[N - 1:N, 0:1]",
     lambda v, n, m: (v["gb"][0:1], v["gB"][n - 1:n, 0:1]), True),
    ("last offset", RELATIVE, "grad(b)[2 * N - 2:2 * N - 1] == grad(B)[0:1, N - 1:N]",
     lambda v, n, m: (v["gb"][2 * n - 2:2 * n - 1], v["gB"][0:1, n - 1:n]), True),
    ("diagonal", RELATIVE, "grad(b)[N - 1:N] == sum(grad(B) * eye(N))",
     lambda v, n, m: (v["gb"][n - 1:n], (v["gB"] * _eye(n)).sum()), True),
    ("gather pinned", RELATIVE, "B[N - 1:N, 0:1] == b[0:1]",
     lambda v, n, m: (v["B"][n - 1:n, 0:1], v["b"][0:1]), True),
    ("two reads, sum", BOTH_WAYS, "sum(grad(b)) == 2 * sum(grad(B))",
     lambda v, n, m: (v["gb"].sum(), 2 * v["gB"].sum()), True),
    ("two reads, corner", BOTH_WAYS, "grad(b)[0:1] == grad(B)[N - 1:N, 0:1] + grad(B)[0:1, N - 1:N]",
     lambda v, n, m: (v["gb"][0:1], v["gB"][n - 1:n, 0:1] + v["gB"][0:1, n - 1:n]), True),
    ("row read, sum of the row", ROWS, "grad(b)[0:1] == sum(grad(B)[N - 1:N, :], axis=-1)",
     lambda v, n, m: (v["gb"][0:1], v["gB"][n - 1:n, :].sum(axis=-1)), True),
    # false neighbours
    ("wrong corner", RELATIVE, "grad(b)[0:1] == grad(B)[0:1, N - 1:N]",
     lambda v, n, m: (v["gb"][0:1], v["gB"][0:1, n - 1:n]), False),
    ("wrong offset", RELATIVE, "grad(b)[N - 1:N] == grad(B)[0:1, 0:1]",
     lambda v, n, m: (v["gb"][n - 1:n], v["gB"][0:1, 0:1]), False),
    ("one row short", RELATIVE, "sum(grad(b)) == sum(grad(B)[0:N - 1, :])",
     lambda v, n, m: (v["gb"].sum(), v["gB"][0:n - 1, :].sum()), False),
    ("all offsets but the first", RELATIVE, "sum(grad(b)[1:2 * N - 1]) == sum(grad(B))",
     lambda v, n, m: (v["gb"][1:2 * n - 1].sum(), v["gB"].sum()), False),
    ("all offsets but the last", RELATIVE, "sum(grad(b)[0:2 * N - 2]) == sum(grad(B))",
     lambda v, n, m: (v["gb"][0:2 * n - 2].sum(), v["gB"].sum()), False),
    ("all offsets", RELATIVE, "sum(grad(b)[0:2 * N - 1]) == sum(grad(B))",
     lambda v, n, m: (v["gb"][0:2 * n - 1].sum(), v["gB"].sum()), True),
    ("one entry too many", RELATIVE, "grad(b)[0:1] == grad(B)[N - 1:N, 0:1] + grad(B)[0:1, 0:1]",
     lambda v, n, m: (v["gb"][0:1], v["gB"][n - 1:n, 0:1] + v["gB"][0:1, 0:1]), False),
    ("gather, wrong end", RELATIVE, "B[0:1, 0:1] == b[0:1]",
     lambda v, n, m: (v["B"][0:1, 0:1], v["b"][0:1]), False),
    ("two reads, one counted", BOTH_WAYS, "sum(grad(b)) == sum(grad(B))",
     lambda v, n, m: (v["gb"].sum(), v["gB"].sum()), False),
    ("two reads, one corner", BOTH_WAYS, "grad(b)[0:1] == grad(B)[N - 1:N, 0:1]",
     lambda v, n, m: (v["gb"][0:1], v["gB"][n - 1:n, 0:1]), False),
    ("row read, one entry of the row", ROWS, "grad(b)[0:1] == grad(B)[N - 1:N, 0:1]",
     lambda v, n, m: (v["gb"][0:1], v["gB"][n - 1:n, 0:1]), False),
    # M equals N at the spec's sizes only
    ("sizes that coincide", RELATIVE, "sum(grad(b)) == M / N * sum(grad(B))",
     lambda v, n, m: (v["gb"].sum(), m / n * v["gB"].sum()), False),
    # -inf above the diagonal: the corner (0, N - 1) is -inf once N > 1, and 0 * -inf is NaN
    ("masked corner", MASKED, "B[0:1, N - 1:N] == b[2 * N - 2:2 * N - 1]",
     lambda v, n, m: (v["B"][0:1, n - 1:n], v["b"][2 * n - 2:2 * n - 1]), False),
    ("masked, times zero", MASKED, "sum(B * 0) == 0 * sum(b)",
     lambda v, n, m: ((v["B"] * 0).sum(), 0 * v["b"].sum()), False),
]


def _same(a, b) -> bool:
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b)) | np.isclose(a, b, rtol=1e-12, atol=1e-12)))


def _holds_for_all_sizes(gather, sides) -> bool:
    rng = np.random.default_rng(7)
    for n in range(1, 6):
        for m in range(1, 4):
            for _ in range(4):
                if not _same(*sides(_values(gather, n, rng), n, m)):
                    return False
    return True


def _assert_proved_iff(text: str, claim: str, holds: bool):
    """The claim, checked on the spec `text`, is proved for all sizes by index equations exactly when it holds."""
    spec = symattn.load(text + f"check {claim}\n").typed
    (check,) = spec.checks
    proof = prove_equal(check.lhs, check.rhs, spec, definitions_for(spec, derive(spec)))
    if holds:
        assert proof is not None and proof.method == METHOD
    else:
        assert proof is None, f"a false claim proved for all sizes: {proof.steps if proof else ''}"


@pytest.mark.parametrize("gather, claim, sides, proved", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_the_matrix_level_proves_exactly_the_true_claims(gather, claim, sides, proved):
    with np.errstate(invalid="ignore"):
        holds = _holds_for_all_sizes(gather, sides)
    assert holds == proved, "the table's truth disagrees with NumPy"
    _assert_proved_iff(gather.text(), claim, holds)


REFUTED = ["wrong corner", "two reads, one corner", "row read, one entry of the row", "masked corner"]


@pytest.mark.parametrize("gather, claim, sides", [pytest.param(*c[1:4], id=c[0]) for c in CASES if c[0] in REFUTED])
def test_false_neighbours_are_refuted_with_counterexamples_numpy_reproduces(gather, claim, sides):
    (verdict,) = symattn.load(gather.text() + f"check {claim}\n").check(budget=120.0)
    assert verdict.verdict != "proved", verdict.method
    if verdict.verdict == "unknown":
        return
    ce = verdict.counterexample
    assert ce is not None, verdict.method
    n = ce.sizes["N"]
    v = _values(gather, n, None, b=np.array(ce.inputs["b"], dtype=float),
                x=np.array(ce.inputs["X"], dtype=float).reshape(n, n),
                g=np.array(ce.inputs["grad(O)"], dtype=float).reshape(n, n))
    assert not _same(*sides(v, n, ce.sizes["M"])), "the counterexample does not reproduce in NumPy"


def test_coinciding_sizes_are_shown_at_the_spec_sizes_only():
    (verdict,) = symattn.load(RELATIVE.text() + "check sum(grad(b)) == M / N * sum(grad(B))\n").check(budget=120.0)
    assert verdict.verdict == "proved" and "not shown for all sizes" in verdict.method, verdict.method


def test_relative_bias_claims_are_proved_for_all_sizes():
    spec = symattn.load(REPO / "derivations" / "relative_bias.attn").typed
    defs = definitions_for(spec, derive(spec))
    proved = {c.text: prove_equal(c.lhs, c.rhs, spec, defs) for c in spec.checks if c.kind == "equal"}
    assert proved["sum(grad(b)) == sum(grad(S))"].method == METHOD
    assert proved["grad(b)[0:1] == grad(S)[N - 1:N, 0:1]"].method == METHOD
    assert proved["grad(b)[0:1] == grad(S)[0:1, N - 1:N]"] is None


# --- exp(causal_mask(N)) is the 0/1 lower triangle, on finite factors only -------------------

MASK_SPEC = """attention masked_products

dim N = 4

input X[N, N]

A = X @ X.T
C = causal_mask(N) + X @ X.T
E = cumsum(C.T, axis=0)
D[i:N] = E[i, i]          # sum over k <= i of C[i, k]: no -inf in it
O = A + C

output O
"""


def _causal(n):
    return np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, NEG_INF)


MASK_CASES = [
    ("finite, split by the mask", "exp(causal_mask(N)) * A + (1 - exp(causal_mask(N))) * A == A",
     lambda x, n: (np.exp(_causal(n)) * (x @ x.T) + (1 - np.exp(_causal(n))) * (x @ x.T), x @ x.T), True),
    ("finite, cumsum", "sum(A * exp(causal_mask(N)), axis=-1) == sum(cumsum(A.T, axis=0).T * eye(N), axis=-1)",
     lambda x, n: ((x @ x.T * np.exp(_causal(n))).sum(-1), (np.cumsum((x @ x.T).T, axis=0).T * np.eye(n)).sum(-1)),
     True),
    # -inf above the diagonal: 0 * -inf + 1 * -inf is NaN, not -inf
    ("-inf, split by the mask", "exp(causal_mask(N)) * C + (1 - exp(causal_mask(N))) * C == C",
     lambda x, n: (np.exp(_causal(n)) * (_causal(n) + x @ x.T) + (1 - np.exp(_causal(n))) * (_causal(n) + x @ x.T),
                   _causal(n) + x @ x.T), False),
    # the mask selects the finite entries of C, but exp(-inf) * -inf is NaN: rows i < N - 1 are NaN
    ("-inf, a row sum against a selection", "sum(exp(causal_mask(N)) * C, axis=-1).T == D",
     lambda x, n: ((np.exp(_causal(n)) * (_causal(n) + x @ x.T)).sum(-1),
                   np.array([np.cumsum((_causal(n) + x @ x.T).T, axis=0)[i, i] for i in range(n)])), False),
    ("transposed mask", "A * exp(causal_mask(N)).T == A * exp(causal_mask(N))",
     lambda x, n: ((x @ x.T) * np.exp(_causal(n)).T, (x @ x.T) * np.exp(_causal(n))), False),
]


@pytest.mark.parametrize("claim, sides, proved", [pytest.param(*c[1:], id=c[0]) for c in MASK_CASES])
def test_exp_of_the_causal_mask(claim, sides, proved):
    rng = np.random.default_rng(3)
    holds = True
    with np.errstate(invalid="ignore"):
        for n in range(1, 6):
            for _ in range(4):
                x = rng.integers(-4, 5, (n, n)).astype(float) / 2
                holds = holds and _same(*sides(x, n))
    assert holds == proved, "the table's truth disagrees with NumPy"
    _assert_proved_iff(MASK_SPEC, claim, holds)


# --- the rules on hand-built sums, against counting -------------------------------------------

N_ = sympy.Symbol("N", positive=True, integer=True)


def _count(equations, ranges, n):
    """How many points of the box (each token in 0 .. range - 1 at N = n) satisfy every equation."""
    tokens = list(ranges)
    sizes = [int(ranges[x].subs(N_, n)) for x in tokens]
    total = 0
    for point in itertools.product(*[range(s) for s in sizes]):
        value = dict(zip(tokens, point))
        if all(sum(c * value[x] for x, c in zip(eq.indices, eq.coefficients)) + eq.offset.subs(N_, n) == 0
               for eq in equations):
            total += 1
    return total


# (id, equations over contracted tokens, their ranges): a sum of [equations] counts the box points
SUMS = [
    ("one solution at the last index", [Equation((1,), -(N_ - 1), ("t",))], {"t": N_}),
    ("no solution: past the end", [Equation((1,), -N_, ("t",))], {"t": N_}),
    ("no solution: negative", [Equation((1,), sympy.Integer(1), ("t",))], {"t": N_}),
    ("even N only", [Equation((2,), -(N_ - 1), ("t",))], {"t": N_}),
    ("half N: no integer solution at odd N", [Equation((1,), -N_ / 2, ("t",))], {"t": N_}),
    ("odd offset, even coefficient", [Equation((2,), sympy.Integer(-1), ("t",))], {"t": N_}),
    ("divisible by 2", [Equation((2,), -2 * N_ + 2, ("t",))], {"t": N_}),
    ("4t == 2", [Equation((4,), sympy.Integer(-2), ("t",))], {"t": N_}),
    ("2t == 2", [Equation((2,), sympy.Integer(-2), ("t",))], {"t": N_}),
    ("a pair index: 2c + p == 1 at p = 0", [Equation((2, 1), sympy.Integer(-1), ("c", "p")),
                                           Equation((1,), sympy.Integer(0), ("p",))], {"c": N_, "p": sympy.Integer(2)}),
    ("a pair index: 2c + p == 1", [Equation((2, 1), sympy.Integer(-1), ("c", "p"))], {"c": N_, "p": sympy.Integer(2)}),
    ("every diagonal once", [Equation((1, -1, 1), -(N_ - 1), ("k", "j", "i"))], {"k": 2 * N_ - 1, "i": N_, "j": N_}),
    ("diagonals of a short b", [Equation((1, -1, 1), -(N_ - 1), ("k", "j", "i"))], {"k": N_, "i": N_, "j": N_}),
    ("a corner", [Equation((1, -1), -(N_ - 1), ("i", "j"))], {"i": N_, "j": N_}),
    ("two equations", [Equation((1, -1), sympy.Integer(0), ("k", "i")), Equation((1, 1), -(N_ - 1), ("k", "j"))],
     {"k": N_, "i": N_, "j": N_}),
    ("a slice of a scatter", [Equation((1, -1), sympy.Integer(-1), ("m", "c")),
                              Equation((1, -1, 1), -(N_ - 1), ("m", "j", "i"))],
     {"m": 2 * N_ - 1, "c": 2 * N_ - 2, "i": N_, "j": N_}),
]


@pytest.mark.parametrize("equations, ranges", [pytest.param(*s[1:], id=s[0]) for s in SUMS])
def test_a_sum_of_equations_collapses_only_to_its_count(equations, ranges):
    term = Term(sympy.Integer(1), tuple(equations), tuple(ranges.items()))
    collected = collect([term], {ZERO_INDEX: ZERO_INDEX}, {ZERO_INDEX: sympy.Integer(1)})
    if any("$" in key for key in collected):
        return  # not settled: the sum stays a sum (never a wrong count)
    coefficient = collected["1"].coef if collected else sympy.Integer(0)
    for n in range(1, 7):
        assert coefficient.subs(N_, n) == _count(equations, ranges, n), (n, coefficient)


# --- where on an index of a few values, and merge_heads: interleaved RoPE -----------------------

ROPE = "\n".join(line for line in (REPO / "derivations" / "rope_interleaved.attn").read_text("utf-8").splitlines()
                 if not line.lstrip().startswith("check"))


def _rope_values(n: int, h: int, rng) -> dict:
    x = rng.integers(-4, 5, (n, 3)).astype(float) / 2
    q = x @ (rng.integers(-4, 5, (3, 2 * h)).astype(float) / 2)
    angle = np.arange(n)[:, None] * 10000.0 ** (-np.arange(h)[None, :] / h)
    cos, sin = np.cos(angle), np.sin(angle)
    qr = np.zeros((n, 2 * h))
    qr[:, 0::2] = q[:, 0::2] * cos - q[:, 1::2] * sin   # pair c: columns 2c and 2c + 1
    qr[:, 1::2] = q[:, 0::2] * sin + q[:, 1::2] * cos
    return {"Q": q, "Cos": cos, "Sin": sin, "Qr": qr}


ROPE_CASES = [
    ("first pair, first entry", "Qr[:, 0:1] == Q[:, 0:1] * Cos[:, 0:1] - Q[:, 1:2] * Sin[:, 0:1]",
     lambda v, h: (v["Qr"][:, 0:1], v["Q"][:, 0:1] * v["Cos"][:, 0:1] - v["Q"][:, 1:2] * v["Sin"][:, 0:1]), True),
    ("first pair, second entry", "Qr[:, 1:2] == Q[:, 0:1] * Sin[:, 0:1] + Q[:, 1:2] * Cos[:, 0:1]",
     lambda v, h: (v["Qr"][:, 1:2], v["Q"][:, 0:1] * v["Sin"][:, 0:1] + v["Q"][:, 1:2] * v["Cos"][:, 0:1]), True),
    ("last pair", "Qr[:, 2 * h - 1:2 * h] == Q[:, 2 * h - 2:2 * h - 1] * Sin[:, h - 1:h] "
                  "+ Q[:, 2 * h - 1:2 * h] * Cos[:, h - 1:h]",
     lambda v, h: (v["Qr"][:, 2 * h - 1:2 * h], v["Q"][:, 2 * h - 2:2 * h - 1] * v["Sin"][:, h - 1:h]
                   + v["Q"][:, 2 * h - 1:2 * h] * v["Cos"][:, h - 1:h]), True),
    ("second entry, first formula", "Qr[:, 1:2] == Q[:, 1:2] * Cos[:, 0:1] - Q[:, 0:1] * Sin[:, 0:1]",
     lambda v, h: (v["Qr"][:, 1:2], v["Q"][:, 1:2] * v["Cos"][:, 0:1] - v["Q"][:, 0:1] * v["Sin"][:, 0:1]), False),
    ("sign flipped", "Qr[:, 0:1] == Q[:, 0:1] * Cos[:, 0:1] + Q[:, 1:2] * Sin[:, 0:1]",
     lambda v, h: (v["Qr"][:, 0:1], v["Q"][:, 0:1] * v["Cos"][:, 0:1] + v["Q"][:, 1:2] * v["Sin"][:, 0:1]), False),
    ("last pair, first angle", "Qr[:, 2 * h - 1:2 * h] == Q[:, 2 * h - 2:2 * h - 1] * Sin[:, 0:1] "
                               "+ Q[:, 2 * h - 1:2 * h] * Cos[:, 0:1]",
     lambda v, h: (v["Qr"][:, 2 * h - 1:2 * h], v["Q"][:, 2 * h - 2:2 * h - 1] * v["Sin"][:, 0:1]
                   + v["Q"][:, 2 * h - 1:2 * h] * v["Cos"][:, 0:1]), False),
]


@pytest.mark.parametrize("claim, sides, holds", [pytest.param(*c[1:], id=c[0]) for c in ROPE_CASES])
def test_interleaved_rope_entries(claim, sides, holds):
    rng = np.random.default_rng(11)
    agree = all(_same(*sides(_rope_values(n, h, rng), h)) for n in range(1, 5) for h in range(1, 4) for _ in range(3))
    assert agree == holds, "the table's truth disagrees with NumPy"
    _assert_proved_iff(ROPE + "\n", claim, holds)


SPLIT_SPEC = """attention split

dim N = 4

input X[N, 2]

T[i:N, p:2] = where(p == 0, X[i, 1], -inf)
U[i:N, p:2] = where(1 <= p, X[i, 0], 0)
O = T + U

output O
"""


def _split_values(n, rng):
    x = rng.integers(-4, 5, (n, 2)).astype(float) / 2
    t = np.stack([x[:, 1], np.full(n, NEG_INF)], axis=1)
    u = np.stack([np.zeros(n), x[:, 0]], axis=1)
    return {"X": x, "T": t, "U": u}


SPLIT_CASES = [
    ("the picked branch", "T[:, 0:1] == X[:, 1:2]", lambda v: (v["T"][:, 0:1], v["X"][:, 1:2]), True),
    ("the other branch, mirrored condition", "U[:, 1:2] == X[:, 0:1]",
     lambda v: (v["U"][:, 1:2], v["X"][:, 0:1]), True),
    ("the wrong column", "T[:, 0:1] == X[:, 0:1]", lambda v: (v["T"][:, 0:1], v["X"][:, 0:1]), False),
    ("the -inf entry", "T[:, 1:2] == X[:, 1:2]", lambda v: (v["T"][:, 1:2], v["X"][:, 1:2]), False),
    ("the -inf entry times 0", "T[:, 1:2] * 0 == 0 * X[:, 1:2]",
     lambda v: (v["T"][:, 1:2] * 0, 0 * v["X"][:, 1:2]), False),
    ("the zero branch", "U[:, 0:1] == X[:, 0:1]", lambda v: (v["U"][:, 0:1], v["X"][:, 0:1]), False),
]


@pytest.mark.parametrize("claim, sides, holds", [pytest.param(*c[1:], id=c[0]) for c in SPLIT_CASES])
def test_where_on_an_index_is_split_by_its_value(claim, sides, holds):
    rng = np.random.default_rng(5)
    with np.errstate(invalid="ignore"):
        agree = all(_same(*sides(_split_values(n, rng))) for n in range(1, 6) for _ in range(4))
    assert agree == holds, "the table's truth disagrees with NumPy"
    _assert_proved_iff(SPLIT_SPEC, claim, holds)
