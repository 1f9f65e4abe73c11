"""Algebraic and trigonometric atoms in exact proofs (issue 12): sqrt and rational powers as
positive roots, sin/cos with sin^2 + cos^2 = 1 and angle addition, tanh and sigmoid
through exp, and claims whose values may be NaN compared region by region.

Every expectation is computed independently of symattn, in plain NumPy written here: a
"proved" must agree NaN-aware with NumPy at every point tried (zero rows, zeros and
negatives included); a "refuted" must carry inputs at which NumPy reproduces a
difference. Claims that are false somewhere (a zero row, a negative entry) are also put
to the prover directly, past the counterexample search, which must not prove them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import symattn
from symattn.ir.shapes import broadcast
from symattn.prove.canonical import definitions_for, prove_equal
from symattn.symbolic.element import ElementModel
from symattn.symbolic.exact import zero_test
from symattn.symbolic.guarded import compare_by_cases

from conftest import run_cli


def same_ieee(a, b, rtol=1e-9) -> np.ndarray:
    """Entry-wise equality under float64 semantics: NaN equals NaN, infinities by sign."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(invalid="ignore"):
        close = np.isclose(a, b, rtol=rtol, atol=rtol)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    return both_nan | same_inf | (close & np.isfinite(a) & np.isfinite(b))


def points(shape, rng, count=12):
    """Multiples of 1/2 in [-1, 1], all zeros, all negative, and one with a zero row."""
    yield np.zeros(shape)
    yield np.full(shape, -0.5)
    for k in range(count - 2):
        x = rng.integers(-2, 3, size=shape) / 2.0
        if k % 3 == 0 and len(shape) == 2:
            x[k % shape[0]] = 0.0
        yield x


# --- the QK-norm gradient -------------------------------------------------------------------

QK = """\
dim N = 4, d = 3
input X[N, d], Q[N, d]
C = cos(X)^2 + sin(X)^2
Qn = Q / sqrt(sum(Q * Q, axis=-1))
output C, Qn
check C == ones(N, d)
check grad(Q) == (grad(Qn) - Qn * sum(grad(Qn) * Qn, axis=-1)) / sqrt(sum(Q * Q, axis=-1))
"""


def qk_claimed(Q, G):
    """The right side of the claim, in NumPy."""
    with np.errstate(all="ignore"):
        norm = np.sqrt(np.sum(Q * Q, axis=-1, keepdims=True))
        Qn = Q / norm
        return (G - Qn * np.sum(G * Qn, axis=-1, keepdims=True)) / norm


def qk_finite_differences(Q, G, h=1e-6):
    """dL/dQ for L = sum(Qn * G) by central differences (rows of Q nonzero)."""
    def loss(q):
        return np.sum(q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True)) * G)

    out = np.zeros_like(Q)
    for index in np.ndindex(*Q.shape):
        step = np.zeros_like(Q)
        step[index] = h
        out[index] = (loss(Q + step) - loss(Q - step)) / (2 * h)
    return out


def test_the_qk_norm_gradient_and_sin2_cos2_are_proved():
    spec = symattn.load(QK)
    c_claim, g_claim = spec.check()
    assert c_claim.verdict == "proved", c_claim.method
    assert "for all sizes" in c_claim.method  # the matrix level's cos^2 = 1 - sin^2
    assert g_claim.verdict == "proved", g_claim.method
    # for all sizes: the norm taken as > 0, and both sides NaN on a zero row (`symattn.prove.norm_rows`)
    assert g_claim.method.startswith("matrix level") and "for all sizes" in g_claim.method, g_claim.method
    assert "on a row where it is 0 both sides are NaN" in g_claim.method, g_claim.method

    # What grad(Q) is at a zero row: what the generated backward computes (NaN), and the
    # claimed formula gives NaN there too; elsewhere both are the true gradient.
    rng = np.random.default_rng(12)
    for n, d in ((4, 3), (2, 5), (5, 1)):  # proved for all sizes: checked at other sizes too
        _compare_qk_backward(symattn.load(QK.replace("dim N = 4, d = 3", f"dim N = {n}, d = {d}")), (n, d), rng)


def _compare_qk_backward(spec, shape, rng):
    backward = spec.numpy().backward
    for Q in points(shape, rng):
        G = rng.integers(-2, 3, size=shape) / 2.0
        with np.errstate(all="ignore"):
            got = backward(X=np.zeros(shape), Q=Q, grad_C=np.ones(shape), grad_Qn=G)["Q"]
        claimed = qk_claimed(Q, G)
        assert same_ieee(got, claimed).all(), (Q, got, claimed)
        zero_rows = ~np.any(Q != 0, axis=-1)
        assert np.isnan(claimed[zero_rows]).all()
        if not zero_rows.all():
            fd = qk_finite_differences(Q[~zero_rows], G[~zero_rows])
            np.testing.assert_allclose(claimed[~zero_rows], fd, rtol=1e-5, atol=1e-6)


def test_the_element_level_zero_test_proves_sin2_cos2_at_its_sizes():
    typed = symattn.load(QK).typed
    model = ElementModel(typed)
    same, unfolded = model.identical(model.slot["C"], np.ones((4, 3), dtype=object))
    assert same and unfolded == ["C"]
    x = np.linspace(-7, 7, 29)
    assert np.allclose(np.cos(x) ** 2 + np.sin(x) ** 2, 1.0)


# --- true identities: proved, and NumPy agrees everywhere ------------------------------------

PAIR = """\
dim N = 3, d = 2
input X[N, d], Y[N, d], Q[N, d]
output X
"""


def _sides(func):
    def numpy_sides(X, Y, Q):
        with np.errstate(all="ignore"):
            return func(X, Y, Q)
    return numpy_sides


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def row_norm(Q):
    return np.sqrt(np.sum(Q * Q, axis=-1, keepdims=True))


TRUE_CLAIMS = [
    ("sin(X + Y) == sin(X) * cos(Y) + cos(X) * sin(Y)",
     _sides(lambda X, Y, Q: (np.sin(X + Y), np.sin(X) * np.cos(Y) + np.cos(X) * np.sin(Y)))),
    ("cos(X - Y) == cos(X) * cos(Y) + sin(X) * sin(Y)",
     _sides(lambda X, Y, Q: (np.cos(X - Y), np.cos(X) * np.cos(Y) + np.sin(X) * np.sin(Y)))),
    ("sin(2 * X) == 2 * sin(X) * cos(X)", _sides(lambda X, Y, Q: (np.sin(2 * X), 2 * np.sin(X) * np.cos(X)))),
    ("cos(3 * X) == 4 * cos(X)^3 - 3 * cos(X)",
     _sides(lambda X, Y, Q: (np.cos(3 * X), 4 * np.cos(X) ** 3 - 3 * np.cos(X)))),
    ("sqrt(X * X + 1) * sqrt(X * X + 1) == X * X + 1",
     _sides(lambda X, Y, Q: (np.sqrt(X * X + 1) * np.sqrt(X * X + 1), X * X + 1))),
    ("tanh(X) == 2 * sigmoid(2 * X) - 1", _sides(lambda X, Y, Q: (np.tanh(X), 2 * sigmoid(2 * X) - 1))),
    ("sqrt(X * X) == abs(X)", _sides(lambda X, Y, Q: (np.sqrt(X * X), np.abs(X)))),
    ("(X * X + Y * Y) ^ 0.5 == sqrt(X * X + Y * Y)",
     _sides(lambda X, Y, Q: (np.power(X * X + Y * Y, 0.5), np.sqrt(X * X + Y * Y)))),
    ("exp(log(X * X)) == X * X", _sides(lambda X, Y, Q: (np.exp(np.log(X * X)), X * X))),
    ("Q / sqrt(sum(Q * Q, axis=-1)) * (Q / sqrt(sum(Q * Q, axis=-1))) == Q * Q / sum(Q * Q, axis=-1)",
     _sides(lambda X, Y, Q: ((Q / row_norm(Q)) ** 2, Q * Q / np.sum(Q * Q, axis=-1, keepdims=True)))),
]


@pytest.mark.parametrize("claim, numpy_sides", TRUE_CLAIMS, ids=[c for c, _ in TRUE_CLAIMS])
def test_true_identities_are_proved_and_agree_with_numpy(claim, numpy_sides):
    (verdict,) = symattn.load(PAIR + f"check {claim}\n").check()
    assert verdict.verdict == "proved", verdict.method
    rng = np.random.default_rng(3)
    for X, Y, Q in zip(points((3, 2), rng), points((3, 2), rng), points((3, 2), rng)):
        lhs, rhs = numpy_sides(X, Y, Q)
        assert same_ieee(lhs, rhs).all(), (X, Y, Q, lhs, rhs)


# --- false somewhere: never proved, and a refutation reproduces in NumPy ----------------------

FALSE_CLAIMS = [
    ("sqrt(X * X) == X", _sides(lambda X, Y, Q: (np.sqrt(X * X), X))),
    ("sqrt(X)^2 == X", _sides(lambda X, Y, Q: (np.sqrt(X) ** 2, X))),
    ("exp(log(X)) == X", _sides(lambda X, Y, Q: (np.exp(np.log(X)), X))),
    ("Q / sqrt(sum(Q * Q, axis=-1)) * sqrt(sum(Q * Q, axis=-1)) == Q",
     _sides(lambda X, Y, Q: (Q / row_norm(Q) * row_norm(Q), Q))),
    ("sum(Q * Q / sum(Q * Q, axis=-1), axis=-1) == ones(N, 1)",
     _sides(lambda X, Y, Q: (np.sum(Q * Q / np.sum(Q * Q, axis=-1, keepdims=True), axis=-1, keepdims=True),
                             np.ones((3, 1))))),
    ("X / X == ones(N, d)", _sides(lambda X, Y, Q: (X / X, np.ones((3, 2))))),
    ("log(X * X) - log(X * X) == 0 * X", _sides(lambda X, Y, Q: (np.log(X * X) - np.log(X * X), 0 * X))),
    ("cos(log(X))^2 + sin(log(X))^2 == ones(N, d)",
     _sides(lambda X, Y, Q: (np.cos(np.log(X)) ** 2 + np.sin(np.log(X)) ** 2, np.ones((3, 2))))),
]


@pytest.mark.parametrize("claim, numpy_sides", FALSE_CLAIMS, ids=[c for c, _ in FALSE_CLAIMS])
def test_claims_false_somewhere_are_never_proved(claim, numpy_sides):
    spec = symattn.load(PAIR + f"check {claim}\n")
    (verdict,) = spec.check()
    assert verdict.verdict in ("refuted", "unknown"), verdict.method
    if verdict.verdict == "refuted":
        inputs = {k: np.array(v, dtype=float) for k, v in verdict.counterexample.inputs.items()}
        lhs, rhs = numpy_sides(inputs["X"], inputs["Y"], inputs["Q"])
        assert not same_ieee(lhs, rhs).all(), "NumPy finds no difference at the counterexample"
    # The prover itself, past the counterexample search, must not prove it either.
    typed = spec.typed
    check = typed.checks[0]
    shape = typed.concrete_shape(broadcast(check.lhs.shape, check.rhs.shape))
    assert not compare_by_cases(typed, check.lhs, check.rhs, shape, {}).proved


def test_a_zero_row_that_makes_only_one_side_nan_is_named_in_the_reason():
    typed = symattn.load(PAIR + "check Q / sqrt(sum(Q * Q, axis=-1)) * sqrt(sum(Q * Q, axis=-1)) == Q\n").typed
    check = typed.checks[0]
    result = compare_by_cases(typed, check.lhs, check.rhs, (3, 2), {})
    assert not result.proved
    assert "Q_{1,1} = Q_{1,2} = 0" in result.reason and "NaN" in result.reason
    with np.errstate(all="ignore"):
        Q = np.array([[0.0, 0.0]])
        assert np.isnan(Q / row_norm(Q) * row_norm(Q)).all()


# --- the matrix level: cos^2 = 1 - sin^2 for all sizes, on finite terms only -----------------

MATRIX = """\
dim N = 3, d = 2
input X[N, d], Y[N, d]
param W[d, d]
S = X @ W
output S
"""

MATRIX_CLAIMS = [
    ("cos(S)^2 + sin(S)^2 == ones(N, d)", True),
    ("sum(cos(X)^2, axis=-1) + sum(sin(X)^2, axis=-1) == d * ones(N, 1)", True),
    ("cos(X)^4 == (1 - sin(X)^2)^2", True),
    ("cos(X)^2 == ones(N, d)", False),
    ("cos(X)^2 + sin(X)^2 == 2 * ones(N, d)", False),
    ("cos(X)^2 + sin(Y)^2 == ones(N, d)", False),
    ("cos(X)^2 - sin(X)^2 == ones(N, d)", False),
    ("cos(log(X))^2 + sin(log(X))^2 == ones(N, d)", False),  # NaN where X < 0
]


@pytest.mark.parametrize("claim, holds", MATRIX_CLAIMS, ids=[c for c, _ in MATRIX_CLAIMS])
def test_the_matrix_level_rewrites_cos_squared_only_where_sound(claim, holds):
    typed = symattn.load(MATRIX + f"check {claim}\n").typed
    check = typed.checks[0]
    proof = prove_equal(check.lhs, check.rhs, typed, definitions_for(typed))
    assert (proof is not None) == holds
    # NumPy: a true claim holds at every point, a false one fails somewhere.
    rng = np.random.default_rng(5)
    env = {"np": np}
    expr_l, expr_r = claim.split(" == ")
    agree = []
    for X, Y in zip(points((3, 2), rng), points((3, 2), rng)):
        W = rng.integers(-2, 3, size=(2, 2)) / 2.0
        with np.errstate(all="ignore"):
            scope = {"X": X, "Y": Y, "S": X @ W, "N": 3, "d": 2, "cos": np.cos, "sin": np.sin, "log": np.log,
                     "ones": lambda *s: np.ones(s), "sum": lambda a, axis: np.sum(a, axis=axis, keepdims=True)}
            lhs = eval(expr_l.replace("^", "**"), env, scope)
            rhs = eval(expr_r.replace("^", "**"), env, scope)
        agree.append(same_ieee(lhs, rhs).all())
    assert all(agree) == holds


# --- the zero test on random trigonometric and root expressions ------------------------------

_x, _y = sympy.symbols("x y", real=True)
_ATOMS = [sympy.sin(_x), sympy.cos(_x), sympy.sin(_y), sympy.cos(_y), _x, sympy.sin(_x + _y), sympy.cos(2 * _x)]


def _numeric(expr, x, y):
    """expr at (x, y), at 40 digits, relative to the size of its largest term."""
    point = {_x: sympy.Float(x, 40), _y: sympy.Float(y, 40)}
    terms = [abs(complex(term.evalf(40, subs=point))) for term in sympy.Add.make_args(sympy.expand(expr))]
    return abs(complex(expr.evalf(40, subs=point))) / max(terms + [1.0])


def _polynomial(terms):
    return sympy.Add(*[c * sympy.Mul(*[_ATOMS[i] ** p for i, p in monomial]) for c, monomial in terms])


_terms = st.lists(st.tuples(st.integers(-3, 3), st.lists(st.tuples(st.integers(0, len(_ATOMS) - 1),
                                                                  st.integers(1, 2)), max_size=3)),
                  min_size=1, max_size=4)


@settings(max_examples=25, deadline=None)
@given(_terms, _terms)
def test_zero_test_on_random_trigonometric_expressions(f_terms, g_terms):
    f, g = _polynomial(f_terms), _polynomial(g_terms)
    pythagoras = sympy.sin(_x) ** 2 + sympy.cos(_x) ** 2 - 1
    addition = sympy.sin(_x + _y) - sympy.sin(_x) * sympy.cos(_y) - sympy.cos(_x) * sympy.sin(_y)
    double = sympy.cos(2 * _x) - 1 + 2 * sympy.sin(_x) ** 2
    zero = f * pythagoras + g * addition + (f - g) * double  # zero by trigonometry alone
    probes = [(0.3, -1.1), (1.7, 0.4), (-2.2, 2.9)]
    assert all(_numeric(zero, *p) < 1e-25 for p in probes)
    assert zero_test(zero)
    nonzero = zero + f - g
    if any(_numeric(nonzero, *p) > 1e-6 for p in probes):
        assert not zero_test(nonzero)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(-3, 3), st.integers(1, 4))
def test_zero_test_on_roots_of_positive_radicands(power, shift, scale):
    from symattn.symbolic.relations import root_atom

    radicand = scale * _x ** 2 + _y ** 2 + 1  # > 0 everywhere: a root atom is allowed
    r = root_atom(radicand, 2)
    assert zero_test(r ** (2 * power) - radicand ** power)
    assert zero_test((_x + shift) / r * r - (_x + shift))
    x, y = 0.7, -1.3
    value = np.sqrt(scale * x * x + y * y + 1)
    assert abs(value - (x + shift)) > 1e-9  # so r == x + shift is false
    assert not zero_test(r - (_x + shift))


# --- "unknown", never "FAILED", for a check that was not shown -------------------------------

UNSHOWN = """\
dim N = 3, d = 2
input X[N, d], Y[N, d]
O = X * Y
output O
check sin(X / 2)^2 == (1 - cos(X)) / 2
check exp(-1 / (X * X)) * 0 == 0 * X
"""


def test_a_check_that_was_not_shown_is_unknown_in_every_output(tmp_path):
    path = tmp_path / "unshown.attn"
    path.write_text(UNSHOWN)
    text = run_cli("check", str(path))
    as_json = run_cli("check", str(path), "--json")
    summary = run_cli("derive", str(path), "--summary")
    document = symattn.load(UNSHOWN).document("md")
    for output in (text.stdout, as_json.stdout, summary.stdout, document):
        assert "FAILED" not in output and "NOT shown" not in output
    assert text.returncode == 1 and "unknown: sin(X / 2)^2" in text.stdout
    verdicts = json.loads(as_json.stdout)
    assert [v["verdict"] for v in verdicts][0] == "unknown"
    assert "unknown" in summary.stdout


def test_the_rule_applies_inside_the_arguments_of_opaque_functions():
    typed = symattn.load(MATRIX + "check exp(cos(X)^2 + sin(X)^2) * X == exp(ones(N, d)) * X\n"
                                  "check exp(cos(X)^2) * X == exp(ones(N, d)) * X\n").typed
    true, false = typed.checks
    assert prove_equal(true.lhs, true.rhs, typed, definitions_for(typed)) is not None
    assert prove_equal(false.lhs, false.rhs, typed, definitions_for(typed)) is None
    x = np.array([[0.3, -1.2]])
    assert np.allclose(np.exp(np.cos(x) ** 2 + np.sin(x) ** 2) * x, np.exp(1.0) * x)
    assert not np.allclose(np.exp(np.cos(x) ** 2) * x, np.exp(1.0) * x)


# --- the region prover directly: what it proves, NumPy confirms at every point ----------------

REGION_CLAIMS = [  # (claim, NumPy sides, proved today: false ones never, true ones where the lattice follows)
    ("Q / sqrt(sum(Q * Q, axis=-1)) - Q / sqrt(sum(Q * Q, axis=-1)) == 0 * Q",
     lambda X, Y, Q: (Q / row_norm(Q) - Q / row_norm(Q), 0 * Q), False),
    ("X * 0 == 0 * X / X", lambda X, Y, Q: (X * 0, 0 * X / X), False),
    ("1 / X * 0 == 0 * X", lambda X, Y, Q: (1 / X * 0, 0 * X), False),
    ("sqrt(X * X + Y * Y) / sqrt(X * X + Y * Y) == sqrt(Y * Y + X * X) / sqrt(Y * Y + X * X)",
     lambda X, Y, Q: (np.sqrt(X * X + Y * Y) / np.sqrt(X * X + Y * Y),
                      np.sqrt(Y * Y + X * X) / np.sqrt(Y * Y + X * X)), True),
    ("exp(-1 / (X * X)) * 0 == 0 * X", lambda X, Y, Q: (np.exp(-1 / (X * X)) * 0, 0 * X), False),  # true; the
    # sign of 1 / 0 is not followed
    ("X ^ (-1) * X == ones(N, d)", lambda X, Y, Q: (np.power(X, -1.0) * X, np.ones_like(X)), False),
    ("(X * X) ^ (3/2) == abs(X) ^ 3", lambda X, Y, Q: (np.power(X * X, 1.5), np.abs(X) ** 3), True),
    ("(X * X * Y * Y + 1) ^ (1/2) * (X * X * Y * Y + 1) ^ (-1/2) == ones(N, d)",
     lambda X, Y, Q: (np.power(X * X * Y * Y + 1, 0.5) * np.power(X * X * Y * Y + 1, -0.5), np.ones_like(X)), True),
    ("1 / (X * X + Y * Y) * (X * X + Y * Y) == ones(N, d)",
     lambda X, Y, Q: (1 / (X * X + Y * Y) * (X * X + Y * Y), np.ones_like(X)), False),
    ("sin(1 / X) * 0 == 0 * X", lambda X, Y, Q: (np.sin(1 / X) * 0, 0 * X), False),
    ("cos(1 / X)^2 + sin(1 / X)^2 == ones(N, d)",
     lambda X, Y, Q: (np.cos(1 / X) ** 2 + np.sin(1 / X) ** 2, np.ones_like(X)), False),
    ("sum(Q * Q / sum(Q * Q, axis=-1), axis=-1) == sum(Q * Q, axis=-1) / sum(Q * Q, axis=-1)",
     lambda X, Y, Q: (np.sum(Q * Q / np.sum(Q * Q, axis=-1, keepdims=True), axis=-1, keepdims=True),
                      np.sum(Q * Q, axis=-1, keepdims=True) / np.sum(Q * Q, axis=-1, keepdims=True)), True),
    ("log(X * X + 1) - log(X * X + 1) == 0 * X",
     lambda X, Y, Q: (np.log(X * X + 1) - np.log(X * X + 1), 0 * X), True),
    ("log(X * X) * 0 == 0 * X", lambda X, Y, Q: (np.log(X * X) * 0, 0 * X), False),
]


@pytest.mark.parametrize("claim, numpy_sides, expected", REGION_CLAIMS, ids=[c for c, _, _ in REGION_CLAIMS])
def test_what_the_region_prover_proves_numpy_confirms(claim, numpy_sides, expected):
    typed = symattn.load(PAIR + f"check {claim}\n").typed
    check = typed.checks[0]
    shape = typed.concrete_shape(broadcast(check.lhs.shape, check.rhs.shape))
    proved = compare_by_cases(typed, check.lhs, check.rhs, shape, {}).proved
    assert proved == expected
    rng = np.random.default_rng(8)
    agree = True
    for X, Y, Q in zip(points((3, 2), rng, 30), points((3, 2), rng, 30), points((3, 2), rng, 30)):
        with np.errstate(all="ignore"):
            lhs, rhs = numpy_sides(X, Y, Q)
        agree = agree and bool(same_ieee(lhs, rhs).all())
    if proved:
        assert agree, "proved, but NumPy finds a difference"


# --- gradient checks of values that may be NaN: radicals as positive roots --------------------

_QK_NORM = """
dim N = 3, d = 2
input Q[N, d]
Qn = Q / sqrt(sum(Q * Q, axis=-1))
O = Qn * Qn
output O
"""


def test_the_qk_norm_gradient_is_checked_as_rational_functions_and_a_wrong_one_is_not():
    import dataclasses as dc

    from symattn.prove.claims import verify_gradients
    from symattn.symbolic.derive import derive

    typed = symattn.load(_QK_NORM).typed
    derivation = derive(typed)
    checks = {c.tensor: c for c in verify_gradients(typed, derivation=derivation)}
    assert checks["Q"].ok and "as rational functions" in checks["Q"].method
    # grad(Q) with the radial part not projected out: correct nowhere, so never "identical"
    wrong_q = symattn.load(_QK_NORM + "check grad(Q) == grad(Qn) / sqrt(sum(Q * Q, axis=-1))\n").typed
    wrong = wrong_q.checks[0].rhs
    gradients = dict(derivation.gradients)
    gradients["Q"] = dc.replace(gradients["Q"], expr=wrong)
    tampered = dc.replace(derivation, gradients=gradients)
    (bad,) = [c for c in verify_gradients(typed, derivation=tampered) if c.tensor == "Q"]
    assert not bad.ok
    # and the wrong formula really differs in float64 at a point with no zero row
    rng = np.random.default_rng(0)
    Q, G = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    r = np.sqrt((Q * Q).sum(-1, keepdims=True))
    Qn = Q / r
    dQn = 2 * Qn * G
    true = (dQn - Qn * (dQn * Qn).sum(-1, keepdims=True)) / r
    assert not np.allclose(dQn / r, true)


def test_radicals_as_roots_do_not_make_sqrt_of_a_square_the_value():
    from symattn.symbolic.exact import zero_test
    from symattn.symbolic.relations import radicals_as_roots

    x, y = sympy.symbols("x y", real=True)
    assert zero_test(radicals_as_roots(sympy.sqrt(x * x + y * y) ** 2 - (x * x + y * y)))
    assert not zero_test(radicals_as_roots(sympy.sqrt(x * x) - x))        # |x| is not x
