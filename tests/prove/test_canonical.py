"""The matrix-level, all-sizes equality prover (symattn.prove.canonical)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import sympy

import symattn
from symattn.ir import typed as t
from symattn.prove.canonical import Proof, definitions_for, index_form_text, prove_equal
from symattn.prove.index_terms import ZERO_INDEX, Delta, Eye, Reference, Term, collect, display
from symattn.symbolic.finiteness import ANY, FINITE
from symattn.symbolic.derive import derive
from symattn.symbolic.evaluate import NUMERIC, Evaluator, random_leaves
from symattn.ir.shapes import broadcast, matmul_shape
from conftest import REPO

ROOT = REPO
DERIVATIONS = ROOT / "derivations"


def _spec_without_checks(name: str) -> str:
    text = (DERIVATIONS / f"{name}.attn").read_text()
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("check"))


def _load(text: str):
    spec = symattn.load(text).typed
    return spec, definitions_for(spec, derive(spec))


def _prove_checks(spec, defs):
    return {c.text: prove_equal(c.lhs, c.rhs, spec, defs) for c in spec.checks if c.kind == "equal"}


# --- the claims of the example specs ------------------------------------------------


@pytest.mark.parametrize("name", ["self_attention", "multi_head", "causal"])
def test_the_equal_checks_of_the_derivations_are_proved(name):
    spec = symattn.load(DERIVATIONS / f"{name}.attn").typed
    defs = definitions_for(spec, derive(spec))
    results = _prove_checks(spec, defs)
    assert results, "the spec has equal checks"
    for claim, proof in results.items():
        assert isinstance(proof, Proof), claim
        assert proof.method == "matrix level: canonical index forms agree for all sizes"
        assert all(isinstance(s, tuple) and len(s) == 3 and all(isinstance(x, str) for x in s) for s in proof.steps)


def test_self_attention_claims_are_all_there():
    spec = symattn.load(DERIVATIONS / "self_attention.attn").typed
    results = _prove_checks(spec, definitions_for(spec, derive(spec)))
    assert set(results) == {
        "grad(V) == P.T @ grad(O)",
        "grad(P) == grad(O) @ V.T",
        "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1))",
        "sum(grad(P) * P, axis=-1) == sum(grad(O) * O, axis=-1)",
        "grad(Q) == grad(S) @ K / sqrt(d_k)",
        "grad(K) == grad(S).T @ Q / sqrt(d_k)",
        "grad(W_q) == X.T @ grad(Q)",
    }
    assert all(results.values())


def test_steps_record_the_unfoldings_and_the_forms():
    spec = symattn.load(DERIVATIONS / "self_attention.attn").typed
    defs = definitions_for(spec, derive(spec))
    check = next(c for c in spec.checks if c.text.startswith("sum(grad(P)"))
    proof = prove_equal(check.lhs, check.rhs, spec, defs)
    rules = [s[0] for s in proof.steps]
    assert rules[0] == "substitute the derived gradient of grad(P)"
    assert proof.steps[0][1:] == ("grad(P)", "grad(O) @ V.T")
    assert rules[1] == "substitute the definition of O"
    assert proof.steps[1][1:] == ("O", "P @ V")
    left, right = proof.steps[-3][2], proof.steps[-2][2]
    assert left == right == "sum(b0<N, b1<d_k) P[p0,b0] * V[b0,b1] * grad(O)[p0,b1]"


def test_a_direct_identity_needs_no_unfolding():
    spec, defs = _load(_spec_without_checks("self_attention") + "\ncheck (Q @ K.T).T == K @ Q.T\n")
    proof = prove_equal(spec.checks[0].lhs, spec.checks[0].rhs, spec, defs)
    assert proof is not None
    assert not any(rule.startswith("substitute") for rule, _, _ in proof.steps)


# --- false claims people get wrong ----------------------------------------------------

FALSE_SELF_ATTENTION = [
    "grad(V) == P @ grad(O)",                                      # missing transpose
    "grad(P) == grad(O) @ V",                                      # missing transpose (square when d_k = N)
    "grad(Q) == grad(S) @ K",                                      # missing 1/sqrt(d_k)
    "grad(K) == grad(S) @ Q / sqrt(d_k)",                          # grad(S) not transposed
    "grad(S) == P * grad(P)",                                      # softmax rule without the row-sum term
    "grad(S) == P * (grad(P) + sum(grad(P) * P, axis=-1))",        # sign error
    "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-2))",        # row-sum over the wrong axis
    "grad(V) == -(P.T @ grad(O))",                                 # sign error
    "grad(X) == grad(Q) @ W_q.T + grad(K) @ W_k.T",                # missing the value path
    "grad(X) == grad(Q) @ W_q.T + grad(V) @ W_v.T",                # missing the key path
    "grad(X) == grad(K) @ W_k.T + grad(V) @ W_v.T",                # missing the query path
    "grad(W_q) == X @ grad(Q)",                                    # missing transpose (square when d = N)
    "grad(Q) == grad(S) @ K / d_k",                                # 1/d_k instead of 1/sqrt(d_k)
    "sum(grad(P) * P, axis=-1) == sum(grad(O) * V, axis=-1)",      # O confused with V
]


@pytest.mark.parametrize("claim", FALSE_SELF_ATTENTION)
def test_false_claims_are_not_proved(claim):
    # Squares where the mistake would otherwise be a shape error: d_k and d written as N.
    text = _spec_without_checks("self_attention").replace("dim d = 3", "dim d = 4")
    text = text.replace("W_q[d, d_k], W_k[d, d_k], W_v[d, d_k]", "W_q[d, N], W_k[d, N], W_v[d, N]")
    text = text.replace("sqrt(d_k)", "sqrt(N)")
    if "d_k" in claim:
        text = _spec_without_checks("self_attention")
    if "X @ grad(Q)" in claim:
        text = text.replace("input X[N, d]", "input X[N, N]").replace("param W_q[d,", "param W_q[N,") \
            .replace("W_k[d,", "W_k[N,").replace("W_v[d,", "W_v[N,")
    spec, defs = _load(text + f"\ncheck {claim}\n")
    check = spec.checks[0]
    assert prove_equal(check.lhs, check.rhs, spec, defs) is None


@pytest.mark.parametrize("name, claim", [
    ("causal", "grad(V) == P @ grad(O)"),
    ("causal", "grad(M) == P * grad(P)"),
    ("multi_head", "grad(W_o) == merge_heads(Z).T @ grad(O) / sqrt(d_k)"),
    ("multi_head", "grad(V) == P @ grad(Z)"),
    ("multi_head", "grad(W_o) == merge_heads(V).T @ grad(O)"),
])
def test_false_claims_in_other_specs_are_not_proved(name, claim):
    spec, defs = _load(_spec_without_checks(name) + f"\ncheck {claim}\n")
    check = spec.checks[0]
    assert prove_equal(check.lhs, check.rhs, spec, defs) is None


# --- more true claims: the linear structure and the index maps --------------------------

TRUE_CLAIMS = [
    ("self_attention", "grad(X) == grad(V) @ W_v.T + grad(K) @ W_k.T + grad(Q) @ W_q.T"),
    ("self_attention", "grad(S) == P * grad(P) - P * sum(P * grad(P), axis=-1)"),
    ("self_attention", "grad(S) == P * (grad(O) @ V.T - sum(grad(O) * O, axis=-1))"),
    ("self_attention", "grad(K) == (grad(S) / sqrt(d_k)).T @ (X @ W_q)"),
    ("self_attention", "grad(W_v) == (P @ X).T @ grad(O)"),
    ("self_attention", "mean(O, axis=-1) == sum(O, axis=-1) / d_k"),
    ("self_attention", "O == softmax(X @ W_q @ (X @ W_k).T / sqrt(d_k), axis=-1) @ V"),
    ("self_attention", "sum(grad(S), axis=-1) == 0 * sum(grad(S), axis=-1)"),  # softmax rows sum to 1
    ("self_attention", "sum(sum(X, axis=-1), axis=-2) == sum(X)"),
    ("multi_head", "grad(Z) == split_heads(grad(O) @ W_o.T, h)"),
    ("multi_head", "merge_heads(grad(Z)) == grad(O) @ W_o.T"),
    ("multi_head", "merge_heads(split_heads(X, h)) == X"),
    ("multi_head", "split_heads(merge_heads(Z), h) == Z"),
    ("multi_head", "merge_heads(Z + Z) == 2 * merge_heads(Z)"),
    ("causal", "grad(M) == P * (grad(P) - sum(grad(P) * P, axis=-1))"),
    ("causal", "M + M == 2 * M"),
    ("additive", "grad(W_v) == X.T @ P.T @ grad(O)"),
    ("additive", "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1))"),
]


@pytest.mark.parametrize("name, claim", TRUE_CLAIMS)
def test_more_true_claims_are_proved(name, claim):
    spec, defs = _load(_spec_without_checks(name) + f"\ncheck {claim}\n")
    check = spec.checks[0]
    assert prove_equal(check.lhs, check.rhs, spec, defs) is not None


CONCAT_SPEC = """
dim N = 3, d = 2
input X[N, d], Y[N, d]
param W[d, d]
C = concat(X, Y, axis=-1)
O = C @ concat(W, W, axis=0) + X @ eye(d)
output O
"""


@pytest.mark.parametrize("claim, holds", [
    ("O == X @ W + Y @ W + X", True),
    ("O == X @ W + Y @ W", False),
    ("eye(N) @ X == X", True),
    ("X.T @ eye(N) == X.T", True),
    ("eye(N) @ X == X.T.T * 1", True),
    ("eye(N) @ X == 2 * X", False),
])
def test_concat_and_eye(claim, holds):
    spec, defs = _load(CONCAT_SPEC + f"\ncheck {claim}\n")
    check = spec.checks[0]
    assert (prove_equal(check.lhs, check.rhs, spec, defs) is not None) == holds


def test_slices_of_a_concat_and_leading_unit_axes():
    spec, defs = _load(CONCAT_SPEC)
    N, d = spec.dims["N"].symbol, spec.dims["d"].symbol
    X, Y = t.Tensor("X", (N, d)), t.Tensor("Y", (N, d))
    both = t.Concat((X, Y), 1, (N, 2 * d))
    assert prove_equal(t.Slice(both, 1, d, 2 * d, (N, d)), Y, spec, defs) is not None
    assert prove_equal(t.Slice(both, 1, 0, d, (N, d)), Y, spec, defs) is None
    # a slice that is not literally a part: sum over the embedding, then the pair rule
    assert prove_equal(t.Slice(t.Binary("add", both, both, (N, 2 * d)), 1, 0, d, (N, d)),
                       t.Binary("mul", t.Scalar(sympy.Integer(2)), X, (N, d)), spec, defs) is not None
    # a leading axis of size 1 on one side is fine; other shapes are never equal
    one = sympy.Integer(1)
    summed = t.Reduce("sum", t.Binary("add", X, X, (N, d)), None, (one, one))
    lifted = t.Binary("mul", t.Scalar(sympy.Integer(2)), t.Reduce("sum", X, None, (one, one)), (one, one))
    assert prove_equal(summed, lifted, spec, defs) is not None
    unit = t.SumTo(t.Constant("ones", (one, N, d), (one, N, d)), (N, d))
    assert prove_equal(unit, t.Constant("ones", (N, d), (N, d)), spec, defs) is not None
    assert prove_equal(X, t.Transpose(X, (d, N)), spec, defs) is None


def test_index_notation_bodies_are_compared_by_their_entries():
    text = _spec_without_checks("self_attention") + """
S2[i, j] = sum(k, Q[i, k] * K[j, k]) / sqrt(d_k)
check S2 == S
check S2 == Q @ K.T
"""
    spec, defs = _load(text)
    proved = [prove_equal(c.lhs, c.rhs, spec, defs) is not None for c in spec.checks]
    assert proved == [True, False]
    assert index_form_text(spec.tensors["S2"].expr, spec) == "1/sqrt(d_k) * sum(b0<d_k) K[p1,b0] * Q[p0,b0]"


def test_factors_are_small_values_and_terms_are_compared_canonically():
    """Factors are frozen, hashable values; a term's canonical text (hand-written here) does not
    depend on the order of its factors or the names of its contracted indices."""
    N, d = sympy.symbols("N d", positive=True, integer=True)
    one = sympy.Integer(1)
    names = {ZERO_INDEX: ZERO_INDEX, "p0": "p0", "p1": "p1"}
    ranges = {ZERO_INDEX: one, "p0": N, "p1": d, "#1": d, "#2": N, "#7": d}
    x, w = Reference("X", False, ("p0", "#1"), FINITE), Reference("W", False, ("#1", "p1"), FINITE)
    assert x.key == "X" and x.indices == ("p0", "#1") and Reference("X", True, (), FINITE).key == "grad(X)"
    assert x.renamed("#1", "#1") == x and hash(x.renamed("#1", "#1")) == hash(x) and x.renamed("#1", "#7") != x
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.indices = ()
    forward = collect([Term(one, (x, w), (("#1", d),))], names, ranges)
    backward = collect([Term(one, (w.renamed("#1", "#7"), x.renamed("#1", "#7")), (("#7", d),))], names, ranges)
    assert display(forward) == display(backward) == "sum(b0<d) W[b0,p1] * X[p0,b0]"
    # a delta selects; eye(N) multiplies by 0 and 1, so it selects only an entry that is finite
    y = Reference("Y", True, ("#2", "p1"), FINITE)
    assert display(collect([Term(one, (Delta(("p0", "#2")), y), (("#2", N),))], names, ranges)) == "grad(Y)[p0,p1]"
    assert display(collect([Term(one, (Eye(("p0", "#2")), y), (("#2", N),))], names, ranges)) == "grad(Y)[p0,p1]"
    risky = Reference("Y", True, ("#2", "p1"), ANY)
    assert display(collect([Term(one, (Eye(("p0", "#2")), risky), (("#2", N),))], names, ranges)) == \
        "sum(b0<N) $eye[p0,b0] * grad(Y)[b0,p1]"


@pytest.mark.parametrize("claim", [
    "softmax(Q @ K.T, axis=-1) == softmax(Q @ K.T, axis=-2)",
    "softmax(Q @ K.T, axis=-1) == softmax(K @ Q.T, axis=-1).T",
    "logsumexp(Q @ K.T, axis=-1) == logsumexp(Q @ K.T, axis=-2).T",
    "mean(Q @ K.T, axis=-1) == sum(Q @ K.T, axis=-1)",
    "exp(Q @ K.T) == exp(K @ Q.T)",
    "tanh(Q) == sigmoid(Q)",
    "where(Q > 0, Q, K) == where(K > 0, Q, K)",
    "Q * Q == Q * K",
    "sum(Q, axis=-1) == sum(K, axis=-1)",
])
def test_near_misses_are_not_proved(claim):
    spec, defs = _load(_spec_without_checks("self_attention") + f"\ncheck {claim}\n")
    check = spec.checks[0]
    assert prove_equal(check.lhs, check.rhs, spec, defs) is None


# --- values that may be infinite or NaN ------------------------------------------------------


@pytest.mark.parametrize("claim, holds", [
    ("M - M == 0 * M", False),                                      # -inf - -inf is NaN
    ("M * 0 == 0 * X @ X.T", False),                                # 0 * -inf is NaN
    ("softmax(M + M - M, axis=-1) == softmax(M, axis=-1)", False),
    ("softmax(M + M, axis=-1) == softmax(2 * M, axis=-1)", True),
    # causal rows hold j = 0, so none is fully masked and each sums to 1 (tests/test_row_facts.py: masks with
    # empty rows, whose softmax rows sum to 0)
    ("sum(softmax(M, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)", True),
    ("sum(softmax(X @ X.T, axis=-1), axis=-1) == 1 + 0 * sum(X, axis=-1)", True),
    ("log(X) - log(X) == 0 * X", False),
    ("X / X == 1 + 0 * X", False),
    ("0 * (X / X) == 0 * X", False),
    ("eye(N) @ M == M", False),                                     # 0 * -inf in the product
    ("eye(N) @ (X @ X.T) == X @ X.T", True),
    ("2 * M - M == M", False),                                      # -inf + inf is NaN
    # (A - B) * -inf is +-inf where A - B != 0, but -inf * A - -inf * B is NaN: exp tells them apart
    ("exp(M * (X @ X.T - Q @ K.T)) == exp(M * (X @ X.T) - M * (Q @ K.T))", False),
])
def test_possibly_non_finite_terms_are_never_cancelled(claim, holds):
    spec, defs = _load(_spec_without_checks("causal") + f"\ncheck {claim}\n")
    check = spec.checks[0]
    assert (prove_equal(check.lhs, check.rhs, spec, defs) is not None) == holds


# --- soundness: every proof agrees with float64 evaluation at random sizes ----------------

PROPERTY_SPEC = """
dim N = 3, M = 2
input A[N, M], B[M, N], C[N, N], D[N, M]
param u[N, 1], w[1, M]
T = A @ B
U = softmax(C + T, axis=-1)
R = C + causal_mask(N)
O = U @ D + T @ A + u * w
Z = softmax(R, axis=-1) @ D
output O, Z
"""


class _Gen:
    """Random typed expressions over PROPERTY_SPEC, and random rewrites of them."""

    def __init__(self, spec, rng):
        self.spec, self.rng = spec, rng
        self.N, self.M = spec.dims["N"].symbol, spec.dims["M"].symbol
        self.leaves: dict[tuple, list[t.Node]] = {}
        for name, info in spec.tensors.items():
            self.leaves.setdefault(tuple(info.shape), []).append(t.Tensor(name, info.shape))
            self.leaves[tuple(info.shape)].append(t.Grad(name, info.shape))
        self.leaves[(self.N, self.N)] += [t.Constant("eye", (self.N,), (self.N, self.N)),
                                          t.Constant("causal_mask", (self.N,), (self.N, self.N))]

    def pick(self, seq):
        return seq[self.rng.integers(len(seq))]

    def dim(self):
        return self.pick([self.N, self.M])

    def expr(self, shape, depth):
        shape = tuple(shape)
        r = self.rng.random()
        leaves = self.leaves.get(shape, [])
        if depth <= 0 or r < 0.2:
            if leaves and self.rng.random() < 0.9:
                return self.pick(leaves)
            if len(shape) == 2 and self.rng.random() < 0.5:
                return t.Transpose(self.expr((shape[1], shape[0]), 0), shape) if (shape[1], shape[0]) in self.leaves \
                    else t.Constant("ones", shape, shape)
            return t.Constant("ones", shape, shape)
        kind = self.pick(["add", "sub", "mul", "matmul", "matmul", "scale", "transpose", "reduce", "unary",
                          "softmax", "softmax", "where", "div", "sumto", "add", "matmul", "reduce"])
        if kind in ("add", "sub", "mul", "div"):
            a = self.expr(shape, depth - 1)
            other = list(shape)
            if len(shape) == 2 and self.rng.random() < 0.3:
                other[self.rng.integers(2)] = sympy.Integer(1)
            b = self.expr(tuple(other), depth - 1)
            if kind == "div" and self.rng.random() < 0.7:
                b = t.Unary("sqrt", t.DimValue(self.dim()), ())
            return t.Binary(kind, a, b, broadcast(a.shape, b.shape))
        if kind == "scale":
            c = self.pick([t.Scalar(sympy.Integer(2)), t.Scalar(sympy.Rational(-1, 3)), t.DimValue(self.dim()),
                           t.Scalar(sympy.Integer(0))])
            x = self.expr(shape, depth - 1)
            return t.Binary("mul", c, x, x.shape) if self.rng.random() < 0.5 else t.Binary("mul", x, c, x.shape)
        if kind == "matmul" and len(shape) == 2:
            k = self.dim()
            a, b = self.expr((shape[0], k), depth - 1), self.expr((k, shape[1]), depth - 1)
            return t.MatMul(a, b, matmul_shape(a.shape, b.shape))
        if kind == "transpose" and len(shape) == 2:
            return t.Transpose(self.expr((shape[1], shape[0]), depth - 1), shape)
        if kind == "reduce" and len(shape) == 2 and sympy.Integer(1) in shape:
            axis = shape.index(sympy.Integer(1))
            inner = list(shape)
            inner[axis] = self.dim()
            x = self.expr(tuple(inner), depth - 1)
            return t.Reduce(self.pick(["sum", "mean", "logsumexp"]), x, axis, shape)
        if kind == "sumto" and len(shape) == 2 and sympy.Integer(1) in shape:
            axis = shape.index(sympy.Integer(1))
            inner = list(shape)
            inner[axis] = self.dim()
            return t.SumTo(self.expr(tuple(inner), depth - 1), shape)
        if kind == "unary":
            x = self.expr(shape, depth - 1)
            return t.Unary(self.pick(["exp", "tanh", "neg", "neg", "log", "sigmoid", "relu"]), x, shape)
        if kind == "softmax" and len(shape) == 2:
            x = self.expr(shape, depth - 1)
            if self.rng.random() < 0.3:
                x = t.Binary("add", x, self.risky(shape), shape)
            axis = int(self.rng.integers(2))
            if sympy.Integer(1) in shape and self.rng.random() < 0.5:  # a row sum of a softmax
                axis = shape.index(sympy.Integer(1))
                inner = list(shape)
                inner[axis] = self.dim()
                x = self.expr(tuple(inner), depth - 1)
                if self.rng.random() < 0.5:
                    x = t.Binary("add", x, t.Scalar(-sympy.oo), x.shape)  # fully masked
                return t.Reduce("sum", t.Softmax(x, axis, x.shape), axis, shape)
            return t.Softmax(x, axis, shape)
        if kind == "where":
            a, b = self.expr(shape, depth - 1), self.expr(shape, depth - 1)
            cond = t.Compare(">", self.expr(shape, 0), t.Scalar(sympy.Integer(0)), shape)
            return t.Where(cond, a, b, shape)
        return self.expr(shape, depth - 1)

    # rewrites: (new node, whether it is meant to preserve the value)
    def rewrite(self, node):
        options = []
        if isinstance(node, t.Binary) and node.op in ("add", "mul"):
            options.append((t.Binary(node.op, node.b, node.a, node.shape), True))
        if isinstance(node, t.Binary) and node.op == "sub":
            options.append((t.Binary("sub", node.b, node.a, node.shape), False))
            options.append((t.Binary("add", node.a, t.Unary("neg", node.b, node.b.shape), node.shape), True))
        if isinstance(node, t.MatMul):
            a, b = node.a, node.b
            if isinstance(a, t.Binary) and a.op in ("add", "sub"):
                left, right = t.MatMul(a.a, b, matmul_shape(a.a.shape, b.shape)), t.MatMul(a.b, b, matmul_shape(a.b.shape, b.shape))
                options.append((t.Binary(a.op, left, right, broadcast(left.shape, right.shape)), True))
            if isinstance(a, t.MatMul):
                inner = t.MatMul(a.b, b, matmul_shape(a.b.shape, b.shape))
                options.append((t.MatMul(a.a, inner, node.shape), True))
            bt = t.Transpose(b, (b.shape[1], b.shape[0]))
            at = t.Transpose(a, (a.shape[1], a.shape[0]))
            options.append((t.Transpose(t.MatMul(bt, at, (node.shape[1], node.shape[0])), node.shape), True))
            if a.shape[0] == a.shape[1] == b.shape[0] == b.shape[1]:
                options.append((t.MatMul(b, a, node.shape), False))
                options.append((t.MatMul(at, b, node.shape), False))
        if isinstance(node, t.Transpose) and node.shape[0] == node.shape[1]:
            options.append((node.x, False))
        if isinstance(node, t.Softmax) and node.shape[0] == node.shape[1]:
            options.append((t.Softmax(node.x, 1 - node.axis, node.shape), False))
        if isinstance(node, t.Unary) and node.fn == "exp":
            options.append((t.Unary("tanh", node.x, node.shape), False))
        if isinstance(node, t.Tensor) and node.name in ("T", "R"):
            options.append((self.spec.tensors[node.name].expr, True))
        if isinstance(node, t.Reduce) and node.kind in ("sum", "mean"):
            other = "mean" if node.kind == "sum" else "sum"
            options.append((t.Reduce(other, node.x, node.axis, node.shape), False))
            if isinstance(node.x, t.Softmax) and node.x.axis == node.axis:
                options.append((t.Constant("ones", node.shape, node.shape), True))
        if isinstance(node, t.Binary) and node.op == "mul" and isinstance(node.b, t.Binary) \
                and node.b.op in ("add", "sub") and node.b.shape == node.shape:
            left = t.Binary("mul", node.a, node.b.a, broadcast(node.a.shape, node.b.a.shape))
            right = t.Binary("mul", node.a, node.b.b, broadcast(node.a.shape, node.b.b.shape))
            options.append((t.Binary(node.b.op, left, right, node.shape), True))
        if isinstance(node, (t.Unary, t.Softmax)) and node.shape[0] == node.shape[1] == self.N:
            risky = self.risky(node.shape)
            product = t.Binary("mul", risky, t.Binary("add", node.x, node.x, node.shape), node.shape)
            split = t.Binary("add", t.Binary("mul", risky, node.x, node.shape),
                             t.Binary("mul", risky, node.x, node.shape), node.shape)
            options.append((dataclasses.replace(node, x=product), False))
            options.append((dataclasses.replace(node, x=split), False))
        if isinstance(node, t.Reduce) and node.kind == "sum" and isinstance(node.x, t.Binary) and node.x.op == "add":
            parts = [t.Reduce("sum", p, node.axis, node.shape) if p.shape == node.x.shape else None
                     for p in (node.x.a, node.x.b)]
            if None not in parts:
                options.append((t.Binary("add", parts[0], parts[1], node.shape), True))
        if options and self.rng.random() < 0.6:  # prefer the rewrites specific to this node
            return options[self.rng.integers(len(options))]
        options.append((t.Binary("mul", t.Scalar(sympy.Integer(2)), node, node.shape), False))
        options.append((t.Binary("add", node, t.Binary("mul", t.Scalar(sympy.Integer(0)), node, node.shape),
                                 node.shape), True))
        options.append((t.Binary("sub", t.Binary("add", node, node, node.shape), node, node.shape), True))
        risky = self.risky(node.shape)
        options.append((t.Binary("add", node, t.Binary("mul", t.Scalar(sympy.Integer(0)), risky, node.shape),
                                 node.shape), None))  # true for reals, false in floating point
        options.append((t.Binary("add", node, t.Binary("sub", risky, risky, node.shape), node.shape), None))
        options.append((t.Transpose(t.Transpose(node, (node.shape[1], node.shape[0])), node.shape)
                        if len(node.shape) == 2 else node, True))
        same = [leaf for leaf in self.leaves.get(tuple(node.shape), []) if leaf != node]
        if same:
            options.append((self.pick(same), False))
        return options[self.rng.integers(len(options))]

    def rewrite_somewhere(self, node):
        """A rewrite at a node of the tree chosen uniformly."""
        paths = []

        def walk(n, path):
            paths.append(path)
            for k, child in enumerate(n.children):
                if not isinstance(child, t.Compare) and child.shape != ():
                    walk(child, path + (k,))

        walk(node, ())
        return self._rewrite_at(node, paths[self.rng.integers(len(paths))])

    def _rewrite_at(self, node, path):
        if not path:
            return self.rewrite(node)
        new_child, meant = self._rewrite_at(node.children[path[0]], path[1:])
        return _replace_child(node, path[0], new_child), meant

    def risky(self, shape):
        """A node of `shape` whose entries may be -inf or NaN."""
        n = self.N
        base = self.pick([t.Tensor("R", (n, n)), t.Constant("causal_mask", (n,), (n, n)),
                          t.Unary("log", t.Tensor("C", (n, n)), (n, n)),
                          t.Binary("add", t.Tensor("C", (n, n)), t.Scalar(-sympy.oo), (n, n))])
        if tuple(shape) == (n, n):
            return base
        return t.Binary("mul", t.Constant("ones", shape, shape),
                        t.Reduce("sum", t.Reduce("sum", base, 0, (1, n)), 1, (1, 1)), tuple(shape))


def _replace_child(node, k, child):
    if isinstance(node, (t.Unary, t.Transpose, t.Reduce, t.Softmax, t.SumTo)):
        fields = {"x": child}
    elif isinstance(node, (t.Binary, t.MatMul)):
        fields = {"a": child} if k == 0 else {"b": child}
    elif isinstance(node, t.Where):
        fields = {["cond", "a", "b"][k]: child}
    else:
        raise AssertionError(type(node))
    return dataclasses.replace(node, **fields)


def _values(spec, derivation, node_pairs, sizes, rng):
    ev = Evaluator(spec, NUMERIC, sizes)
    leaves = random_leaves(spec, rng, sizes=sizes)
    grads = {out: rng.standard_normal(tuple(ev.size(d) for d in spec.tensors[out].shape)) for out in spec.outputs}
    ev.run(leaves, grads)
    for name, gradient in derivation.gradients.items():
        if name not in ev.grads:
            shape = tuple(ev.size(d) for d in spec.tensors[name].shape)
            ev.grads[name] = np.zeros(shape) if gradient.expr is None else \
                np.broadcast_to(ev.evaluate(gradient.expr), shape)
    out = []
    with np.errstate(all="ignore"):
        for lhs, rhs in node_pairs:
            out.append((np.asarray(ev.evaluate(lhs), dtype=float), np.asarray(ev.evaluate(rhs), dtype=float)))
    return out


def _agree(a, b) -> bool:
    a, b = np.broadcast_arrays(a, b)
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    if np.any(finite_a != finite_b):
        return False  # one side finite where the other is not
    scale = max(1.0, float(np.max(np.abs(a[finite_a]), initial=0.0)))
    return bool(np.all(np.abs(a[finite_a] - b[finite_b]) <= 1e-7 * scale))


def test_every_proof_agrees_with_float64_at_random_sizes():
    spec = symattn.load(PROPERTY_SPEC).typed
    derivation = derive(spec)
    defs = definitions_for(spec, derivation)
    rng = np.random.default_rng(20240611)
    gen = _Gen(spec, rng)
    proved, pairs = [], 0
    meant_true = meant_true_proved = meant_false_proved = 0
    shapes = [(gen.N, gen.N), (gen.N, gen.M), (gen.N, gen.N), (gen.M, gen.N), (gen.N, sympy.Integer(1)),
              (gen.M, gen.M), (sympy.Integer(1), gen.N)]
    start = time.perf_counter()
    while pairs < 600 and time.perf_counter() - start < 15:
        shape = shapes[pairs % len(shapes)]
        lhs = gen.expr(shape, int(rng.integers(1, 4)))
        rhs, meant = gen.rewrite_somewhere(lhs)
        if rng.random() < 0.3:
            rhs, again = gen.rewrite_somewhere(rhs)
            meant = None if None in (meant, again) else meant and again
        pairs += 1
        meant_true += meant is True
        proof = prove_equal(lhs, rhs, spec, defs)
        if proof is not None:
            proved.append((lhs, rhs))
            meant_true_proved += meant is True
            meant_false_proved += meant is not True
    failures = []
    for sizes in ({"N": 1, "M": 1}, {"N": 3, "M": 2}, {"N": 2, "M": 4}, {"N": 4, "M": 3}):
        for seed in range(2):
            values = _values(spec, derivation, proved, sizes, np.random.default_rng(seed))
            for (lhs, rhs), (a, b) in zip(proved, values):
                if not _agree(a, b):
                    failures.append((sizes, symattn.ir.printing.to_spec(lhs), symattn.ir.printing.to_spec(rhs)))
    tally = (f"{pairs} random pairs, {len(proved)} proved ({meant_true_proved} of {meant_true} value-preserving "
             f"rewrites, {meant_false_proved} other rewrites that happened to be harmless)")
    assert not failures, (tally, failures[:5])
    assert meant_true_proved >= 0.4 * meant_true, f"the property test should exercise real proofs: {tally}"
