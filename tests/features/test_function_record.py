"""One record per builtin function: a function added in one place works in every stage.

The test registers `cube` (x^3) as a single `Function` record and then uses
it as a user would: a spec that calls it parses and validates, `derive`
differentiates it, `check` proves a true gradient claim and refutes a false
one, the generated NumPy module computes it (against plain NumPy and central
finite differences), the CUDA target spells it, and the document typesets it.
A second `cube`, whose exact value is a SymPy function of its own (as erf
would be), brings its mpmath value in the same record: the 30-digit
evaluation that confirms a counterexample reads it from there.
It also checks that the built-in table agrees with NumPy at a few points, the
independent reference for each float64 implementation.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy

import symattn
from symattn.errors import SymbolicError
from symattn.ir import build as b
from symattn.ir.functions import FUNCTIONS, Function, register
from symattn.symbolic.exact import mp_value

SPEC = """\
attention cubed
dim N = 3, d = 2
input X[N, d]
param W[d, d]
H = X @ W
O = cube(H)
output O
check grad(H) == 3 * H ^ 2 * grad(O)
check grad(W) == X.T @ (3 * H ^ 2 * grad(O))
check grad(W) == X.T @ (3 * H * grad(O))
"""


@pytest.fixture
def cube():
    record = register(Function(
        "cube", exact=lambda u: u ** 3, float64=lambda x: x ** 3, rule="d cube(A) = 3 A^2 dA",
        derivative=lambda x, n, g, r: b.mul(g, b.mul(b.scalar(3), b.power(x, b.scalar(2), r), r), r),
        numpy="({x}) ** 3", cuda="(({x}) * ({x}) * ({x}))"))
    yield record
    FUNCTIONS.pop("cube")


def test_a_function_registered_once_works_in_every_stage(cube, tmp_path):
    spec = symattn.load(SPEC)
    assert spec.shape("O") == "[N, d]"
    # derive and check
    assert spec.derive().formula("H") == "grad(H) = grad(O) * (3 * H^2)"
    verdicts = spec.check()
    assert [v.verdict for v in verdicts] == ["proved", "proved", "refuted"], [v.method for v in verdicts]
    # the generated NumPy module against plain NumPy and central finite differences
    module = spec.numpy()
    rng = np.random.default_rng(0)
    x, w, g = rng.standard_normal((3, 2)), rng.standard_normal((2, 2)), rng.standard_normal((3, 2))
    np.testing.assert_allclose(module.forward(X=x, W=w)["O"], (x @ w) ** 3, rtol=1e-12)
    grads = module.backward(X=x, W=w, grad_O=g)
    h = 1e-6
    numeric = np.zeros_like(w)
    for idx in np.ndindex(*w.shape):
        e = np.zeros_like(w)
        e[idx] = h
        numeric[idx] = (np.sum(((x @ (w + e)) ** 3) * g) - np.sum(((x @ (w - e)) ** 3) * g)) / (2 * h)
    np.testing.assert_allclose(grads["W"], numeric, rtol=1e-6, atol=1e-8)
    # the CUDA target spells it, and the document typesets it
    from symattn.codegen.cuda import emit_cuda

    kernel = emit_cuda(spec).files["cubed.cu"]
    assert "O[e_] = ((H[" in kernel and ") * (H[" in kernel
    document = spec.document("md")
    assert "cube" in document


class _Cube(sympy.Function):
    """cube(u) as a SymPy function of its own: SymPy knows its derivative and its value at a
    number, and nothing else (so its exact value is not arithmetic mpmath could evaluate)."""

    @classmethod
    def eval(cls, u):
        if u.is_Number:
            return u ** 3
        return None

    def fdiff(self, argindex=1):
        return 3 * self.args[0] ** 2


SPEC_WITHOUT_DERIVATIVE = """\
attention cubed
dim N = 3, d = 2
input X[N, d]
param W[d, d]
H = X @ W
O = cube(H) * H
output O
check grad(H) == grad(O) * (3 * H * H * H + cube(H))
check grad(H) == grad(O) * 3 * cube(H)
"""


def test_a_function_of_its_own_is_evaluated_at_30_digits_by_its_record(tmp_path):
    digits = []

    def cube_mpmath(x):
        digits.append(mpmath.mp.dps)
        return x ** 3

    def no_matrix_rule(x, n, g, r):
        raise SymbolicError("cube has no matrix-level derivative here")

    register(Function("cube", exact=_Cube, float64=lambda x: x ** 3, rule="d cube(A) = 3 A^2 dA",
                      derivative=no_matrix_rule, numpy="({x}) ** 3", cuda="(({x}) * ({x}) * ({x}))",
                      mpmath=cube_mpmath))
    try:
        u = sympy.Symbol("u", real=True)
        with mpmath.workdps(30):
            assert mp_value(_Cube(u) + 1, {u: mpmath.mpf(3) / 2}, {}) == mpmath.mpf(35) / 8  # (3/2)^3 + 1
        digits.clear()
        # Without a matrix-level derivation the gradients at a point are the element level's, in
        # mpmath at 30 digits: O = cube(H) * H, and grad(H) = grad(O) * (3 H^3 + cube(H)) reads cube.
        # The true claim agrees with plain float64 at every point (not a proof: the element level
        # does not compare a gradient without a derivation); the false one is refuted.
        verdicts = symattn.load(SPEC_WITHOUT_DERIVATIVE).check()
        assert [v.verdict for v in verdicts] == ["unknown", "refuted"], [v.method for v in verdicts]
        assert "the derivation failed (cube has no matrix-level derivative here)" in verdicts[0].method
        assert "the two sides agree at N=3, d=2 at 5 random rational points" in verdicts[0].method
        assert "and at 30 digits where both are finite" in verdicts[1].method
        assert digits and min(digits) >= 30
    finally:
        FUNCTIONS.pop("cube")


def test_the_builtin_table_agrees_with_numpy():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    expected = {"exp": np.exp(x), "tanh": np.tanh(x), "sin": np.sin(x), "cos": np.cos(x), "abs": np.abs(x),
                "relu": np.where(x > 0, x, 0.0), "sigmoid": 1 / (1 + np.exp(-x)),
                "tan": np.sin(x) / np.cos(x), "exp2": 2.0 ** x, "floor": np.array([-2.0, -1.0, 0.0, 0.0, 3.0]),
                "ceil": np.array([-2.0, -0.0, 0.0, 1.0, 3.0])}
    for name, want in expected.items():
        np.testing.assert_allclose(FUNCTIONS[name].float64(x), want, rtol=1e-15, err_msg=name)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.isnan(FUNCTIONS["log"].float64(x)), x < 0)
        np.testing.assert_array_equal(np.isnan(FUNCTIONS["sqrt"].float64(x)), x < 0)
        np.testing.assert_array_equal(np.isnan(FUNCTIONS["log2"].float64(x)), x < 0)
        np.testing.assert_allclose(FUNCTIONS["log2"].float64(np.array([0.5, 8.0])), [-1.0, 3.0], rtol=1e-15)
    assert {n for n, f in FUNCTIONS.items() if not f.total} == {"log", "sqrt", "tan", "log2"}
