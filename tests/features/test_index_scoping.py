"""Index names are scoped to their own `sum(k, ...)`: sibling sums may reuse a name over other ranges.

Each spec below reuses an index name: sibling sums over different ranges (with
the narrower range last, and with the wider one last), an index used as a value in
such sums, nested sums that reuse the names of their siblings, an index that is
free in one definition and summed in another, and a product of sums whose
derived gradients keep sibling sums that reuse the name. Every expectation is
computed independently in the test: the forward pass in plain NumPy (einsum),
gradients by float64 central finite differences of that NumPy forward, and
every counterexample re-evaluated in NumPy. The reference evaluator (both
backends), `check`, `derive`, the generated NumPy code and the generated CUDA
code (run on the CPU; the nvcc compile gate where nvcc is installed) must all
agree with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import sympy

import symattn
from conftest import EXAMPLES, run_cli
from symattn.ir.index_scope import scope_sum_indices
from symattn.ir import typed as t
from symattn.symbolic.evaluate import NUMERIC, SYMBOLIC, Evaluator, random_leaves
from symattn.check.numpy import verify_numpy
from symattn.check.cuda import find_cxx, find_nvcc, reference, verify_cuda

NVCC = find_nvcc()
CXX = find_cxx()
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found: running the CUDA kernels on the CPU needs C++20")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found: the compile gate needs the CUDA toolkit")


@dataclass(frozen=True)
class Case:
    text: str
    forward: Callable[..., dict]   # every output from the leaves, in plain NumPy
    claims: dict[int, Callable[..., tuple]]  # line of a false claim -> its (lhs, rhs) in NumPy, from leaves and dZ
    true_lines: tuple[int, ...] = ()


def _range(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


# The narrower range last: the one-axis-per-name grid summed the first k over range e only,
# so `Z == T + Y @ W2` (T: the first sum cut to k < e) was "proved" at the element level.
NARROW_LAST = Case(
    """\
attention narrow_last
dim N = 3, d = 3, e = 2
input X[N, d], Y[N, e]
param W1[d, d], W2[e, d]
Z[i, j] = sum(k, X[i, k] * W1[k, j]) + sum(k, Y[i, k] * W2[k, j])
T[i, j] = sum(m, where(m < e, X[i, m], 0) * W1[m, j])
output Z, T
check Z == X @ W1 + Y @ W2
check Z == T + Y @ W2
check Z == X @ W1 + 2 * Y @ W2
""",
    lambda X, Y, W1, W2: {"Z": np.einsum("ik,kj->ij", X, W1) + np.einsum("ik,kj->ij", Y, W2),
                          "T": X[:, :2] @ W1[:2]},
    {
        9: lambda X, Y, W1, W2, **_: (X @ W1 + Y @ W2, X[:, :2] @ W1[:2] + Y @ W2),
        10: lambda X, Y, W1, W2, **_: (X @ W1 + Y @ W2, X @ W1 + 2 * Y @ W2),
    },
    true_lines=(8,),
)

# The wider range last: the grid read Y[i, 2] (an IndexError in check, derive and verify).
WIDE_LAST = Case(
    """\
attention wide_last
dim N = 3, d = 3, e = 2
input X[N, d], Y[N, e]
param W1[d, d], W2[e, d]
Z[i, j] = sum(k, Y[i, k] * W2[k, j]) + sum(k, X[i, k] * W1[k, j])
output Z
check Z == X @ W1 + Y @ W2
check Z == X @ W1 + Y @ W2 + X
""",
    lambda X, Y, W1, W2: {"Z": np.einsum("ik,kj->ij", Y, W2) + np.einsum("ik,kj->ij", X, W1)},
    {8: lambda X, Y, W1, W2, **_: (X @ W1 + Y @ W2, X @ W1 + Y @ W2 + X)},
    true_lines=(7,),
)

# The summed index used as a value, in sums over e, d and d (one of them reads no tensor by k).
INDEX_VALUES = Case(
    """\
attention index_values
dim N = 3, d = 3, e = 2
input X[N, d], Y[N, e]
param W1[d, d], W2[e, d]
Z[i, j] = sum(k, Y[i, k] * W2[k, j] * k) + sum(k, X[i, k] * W1[k, j] * k) + sum(k, k * k * X[i, k])
output Z
""",
    lambda X, Y, W1, W2: {"Z": np.einsum("ik,kj,k->ij", Y, W2, _range(2)) + np.einsum("ik,kj,k->ij", X, W1, _range(3))
                          + np.einsum("k,ik->i", _range(3) ** 2, X)[:, None]},
    {},
)

# Nested sums that reuse their siblings' names (k over e, d, then e again inside a sum over m);
# k is free in A and summed in Z, j is summed in A and free in Z.
NESTED = Case(
    """\
attention nested
dim N = 3, d = 3, e = 2
input X[N, d], Y[N, e]
param W1[d, d], W2[e, d], V[d, e]
A[i, k] = sum(m, sum(j, X[i, j] * W1[j, m]) * V[m, k])
Z[i, j] = sum(k, A[i, k] * W2[k, j]) * sum(k, X[i, k] * W1[k, j]) + sum(m, sum(k, Y[i, k] * V[m, k]) * W1[m, j])
output Z
check Z == (X @ W1 @ V @ W2) * (X @ W1) + Y @ V.T @ W1
check Z == (X @ W1 @ V @ W2) * (X @ W1) + Y @ V.T
""",
    lambda X, Y, W1, W2, V: {"Z": np.einsum("ik,kj->ij", np.einsum("ij,jm,mk->ik", X, W1, V), W2)
                             * np.einsum("ik,kj->ij", X, W1) + np.einsum("ik,mk,mj->ij", Y, V, W1)},
    {9: lambda X, Y, W1, W2, V, **_: ((X @ W1 @ V @ W2) * (X @ W1) + Y @ V.T @ W1,
                                     (X @ W1 @ V @ W2) * (X @ W1) + Y @ V.T)},
    true_lines=(8,),
)

# A product of sums over d, e and f: grad(G) keeps three sibling sums that all bind k.
PRODUCT = Case(
    """\
attention product
dim N = 3, d = 3, e = 2, f = 4
input X[N, d], Y[N, e], U[N, f]
param W1[d, d], W2[e, d], W3[f, d], G[N, d]
Z[i, j] = G[i, j] * sum(k, X[i, k] * W1[k, j]) * sum(k, Y[i, k] * W2[k, j]) * sum(k, U[i, k] * W3[k, j])
output Z
check grad(G) == grad(Z) * (X @ W1) * (Y @ W2) * (U @ W3)
check grad(G) == grad(Z) * (X @ W1) * (Y @ W2)
""",
    lambda X, Y, U, W1, W2, W3, G: {"Z": G * (X @ W1) * np.einsum("ik,kj->ij", Y, W2)
                                         * np.einsum("ik,kj->ij", U, W3)},
    {8: lambda X, Y, U, W1, W2, W3, G, dZ: (dZ * (X @ W1) * (Y @ W2) * (U @ W3), dZ * (X @ W1) * (Y @ W2))},
    true_lines=(7,),
)

CASES = {"narrow_last": NARROW_LAST, "wide_last": WIDE_LAST, "index_values": INDEX_VALUES, "nested": NESTED,
         "product": PRODUCT}
case_params = pytest.mark.parametrize("name", list(CASES))

_SPECS: dict[str, symattn.Spec] = {}


def _spec(name: str) -> symattn.Spec:
    if name not in _SPECS:
        _SPECS[name] = symattn.load(CASES[name].text)
    return _SPECS[name]


def _leaves(spec: symattn.Spec, seed: int = 0) -> dict[str, np.ndarray]:
    return random_leaves(spec.typed, np.random.default_rng(seed))


def _loss(forward, leaves: dict[str, np.ndarray], upstream: dict[str, np.ndarray]) -> float:
    outputs = forward(**leaves)
    return sum(float(np.sum(outputs[o] * upstream[o])) for o in outputs)


def _finite_differences(forward, leaves: dict[str, np.ndarray], upstream: dict[str, np.ndarray],
                        eps: float = 1e-6) -> dict:
    """dL/dT for L = sum over outputs O of sum(O * upstream[O]), by float64 central differences."""
    grads = {}
    for name, value in leaves.items():
        grad = np.zeros_like(value)
        for index in np.ndindex(*value.shape):
            up, down = dict(leaves), dict(leaves)
            up[name], down[name] = value.copy(), value.copy()
            up[name][index] += eps
            down[name][index] -= eps
            grad[index] = (_loss(forward, up, upstream) - _loss(forward, down, upstream)) / (2 * eps)
        grads[name] = grad
    return grads


def _binders(node: t.Node) -> list[str]:
    return [n.index.name for n in t.walk(node) if isinstance(n, t.IndexSum)]


def test_scoping_renames_only_reused_sum_indices():
    z = _spec("nested").tensors["Z"].expr
    scoped = scope_sum_indices(z)
    assert _binders(z) == ["k", "k", "m", "k"]
    assert _binders(scoped) == ["k", "k_1", "m", "k_2"]
    reads = [n.indices for n in t.walk(scoped.body) if isinstance(n, t.Entry)]
    assert reads == [("i", "k"), ("k", "j"), ("i", "k_1"), ("k_1", "j"), ("i", "k_2"), ("m", "k_2"), ("m", "j")]
    assert scope_sum_indices(scoped) == scoped


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_scoping_gives_each_sum_its_own_name(path):
    """In every example and its derived gradients, each sum binds a name of its own after scoping, and a
    definition that reuses no name comes back equal (additive attention reuses k in sibling sums)."""
    spec = symattn.load(path)
    defs = [i.expr for i in spec.tensors.values() if isinstance(i.expr, t.IndexDef)]
    defs += [g.expr for g in spec.derive().gradients.values() if isinstance(g.expr, t.IndexDef)]
    for node in defs:
        scoped = scope_sum_indices(node)
        names = [i.name for i in node.indices] + _binders(scoped)
        assert len(set(names)) == len(names)
        if len(set(_binders(node))) == len(_binders(node)):
            assert scoped == node


@case_params
def test_reference_evaluator_forward_matches_numpy(name):
    spec, case = _spec(name), CASES[name]
    leaves = _leaves(spec)
    got = Evaluator(spec.typed, NUMERIC).run(leaves)
    for output, want in case.forward(**leaves).items():
        np.testing.assert_allclose(got[output], want, rtol=1e-12, atol=1e-12, err_msg=output)


@case_params
def test_exact_evaluator_forward_matches_numpy(name):
    spec, case = _spec(name), CASES[name]
    rng = np.random.default_rng(1)
    ints = {n: rng.integers(-3, 4, size=v.shape) for n, v in _leaves(spec).items()}  # exact in float64 too
    exact = {n: np.vectorize(sympy.Integer, otypes=[object])(v) for n, v in ints.items()}
    got = Evaluator(spec.typed, SYMBOLIC).run(exact)
    for output, want in case.forward(**{n: v.astype(np.float64) for n, v in ints.items()}).items():
        value = np.asarray(got[output], dtype=object)
        assert value.shape == want.shape, output
        assert all(sympy.Integer(int(w)) == v for v, w in zip(value.ravel(), want.ravel())), output


@case_params
def test_gradients_match_finite_differences(name):
    """The generated NumPy backward and the derived gradients on the reference evaluator, against central
    differences of the NumPy forward."""
    spec, case = _spec(name), CASES[name]
    leaves = _leaves(spec, seed=2)
    rng = np.random.default_rng(3)
    upstream = {o: rng.standard_normal(v.shape) for o, v in case.forward(**leaves).items()}
    expected = _finite_differences(case.forward, leaves, upstream)

    generated = spec.numpy().backward(**leaves, **{f"grad_{o}": g for o, g in upstream.items()})
    batched = {n: v[None] if spec.tensors[n].kind == "input" else v for n, v in leaves.items()}
    _, derived = reference(spec.typed, spec.dims, batched, {o: g[None] for o, g in upstream.items()}, batch=1)
    for leaf in spec.typed.differentiable:
        np.testing.assert_allclose(generated[leaf], expected[leaf], rtol=1e-6, atol=1e-7, err_msg=leaf)
        derived_leaf = derived[leaf][0] if spec.tensors[leaf].kind == "input" else derived[leaf]
        np.testing.assert_allclose(derived_leaf, expected[leaf], rtol=1e-6, atol=1e-7, err_msg=leaf)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.claims or c.true_lines])
def test_check_verdicts_agree_with_numpy(name):
    """True claims are proved; false ones are refuted, and the counterexample reproduces in NumPy."""
    spec, case = _spec(name), CASES[name]
    verdicts = {v.line: v for v in spec.check()}
    for line in case.true_lines:
        assert verdicts[line].verdict == "proved", (verdicts[line].claim, verdicts[line].method)
    for line, sides in case.claims.items():
        verdict = verdicts[line]
        assert verdict.verdict == "refuted", (verdict.claim, verdict.verdict, verdict.method)
        counter = verdict.counterexample
        inputs = {n: np.array(v, dtype=np.float64) for n, v in counter.inputs.items()}
        lhs, rhs = sides(**{n: inputs[n] for n in spec.typed.given}, dZ=inputs["grad(Z)"])
        assert not np.allclose(lhs, rhs, rtol=1e-12, atol=1e-12), verdict.claim
        np.testing.assert_allclose(np.array(counter.lhs, dtype=np.float64), lhs, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.array(counter.rhs, dtype=np.float64), rhs, rtol=1e-12, atol=1e-12)


@case_params
def test_derived_gradients_hold_exactly(name):
    """derive does not crash, and every gradient equals the element-level chain rule at the spec's sizes."""
    spec = _spec(name)
    assert spec.derive().gradients
    checks = spec.verify_gradients()
    assert checks and all(c.ok for c in checks), [(c.tensor, c.method) for c in checks if not c.ok]


@pytest.mark.parametrize("name", ["narrow_last", "wide_last", "index_values"])  # the others: FD test above
def test_verify_numpy_passes(name):
    """`verify --target numpy` used to blame correct generated code (or crash) on these."""
    report = verify_numpy(_spec(name).typed)
    assert report.ok, "\n".join(report.lines())


def test_command_line_reports_verdicts_not_an_internal_error(tmp_path):
    """The wider range last used to end `check` (and `derive`, `verify`) with `internal error: IndexError`."""
    path = tmp_path / "wide_last.attn"
    path.write_text(WIDE_LAST.text, encoding="utf-8")
    check = run_cli("check", str(path))
    assert check.returncode == 1, check.stdout + check.stderr  # line 8 is false
    assert "wide_last.attn:7: proved" in check.stdout and "wide_last.attn:8: refuted" in check.stdout
    assert "internal error" not in check.stderr


EQUIVARIANT = """\
attention equivariant
dim N = 3, d = 2
input X[N, d]
param W[d, d]
H[i, c] = sum(k, X[i, k] * W[k, c])
S[i, j] = sum(k, H[i, k] * X[j, k])
O[i, c] = sum(k, X[i, k] * W[k, c]) + sum(k, S[i, k] * X[k, c])
output O
check equivariant(O, X)
"""


def test_equivariance_with_a_name_summed_over_a_permuted_and_a_fixed_axis():
    """k runs over d (not permuted) in one sum and over N (permuted) in its sibling: O = X W + X W X^T X is
    equivariant, and the permutation rules see that once each sum has its own k."""
    spec = symattn.load(EQUIVARIANT)
    leaves = _leaves(spec, seed=4)
    X, W = leaves["X"], leaves["W"]
    perm = np.array([2, 0, 1])

    def forward(X):
        return X @ W + X @ W @ X.T @ X

    np.testing.assert_allclose(Evaluator(spec.typed, NUMERIC).run(leaves)["O"], forward(X), rtol=1e-12)
    np.testing.assert_allclose(forward(X[perm]), forward(X)[perm], rtol=1e-12)
    [verdict] = spec.check()
    assert verdict.verdict == "proved", verdict.method


@needs_cxx
def test_cuda_on_the_cpu_matches_the_reference(tmp_path):
    """The emitted CUDA for three sibling sums over d, e and f, built for the CPU, against the float64
    reference evaluator (checked above against NumPy)."""
    report = verify_cuda(_spec("product"), tsan=False, gate=False, workdir=tmp_path)
    assert report.ok, report.problems


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@needs_nvcc
@needs_cxx
def test_cuda_compile_gate_and_run(tmp_path):
    """`verify --target cuda` with the wider range last: its reference used to raise IndexError."""
    report = verify_cuda(_spec("wide_last"), tsan=False, gate=True, workdir=tmp_path)
    assert report.ok, report.problems
