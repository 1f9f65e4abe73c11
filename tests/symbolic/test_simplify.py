"""Simplification of derived formulas (issue 12): numbers of a product combined, `ones(...)`
factors that broadcast nothing dropped, like terms collected.

Each rule's before and after are evaluated with a NumPy evaluator written here (not
symattn's) at random points whose entries include 0, +-inf, NaN and -inf masked rows, and
must agree as float64 values do: the same NaN pattern, the same infinities, finite entries
equal up to rounding. The cases the rules must leave alone (`0 * A`, `2 * A - A`, `A - A`, a
`ones(...)` that broadcasts) are listed with the value that tells them apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sympy

import symattn
from symattn.ir import build as b
from symattn.ir import typed as t
from conftest import COSINE_SELF_ATTENTION, REPO

N, D = sympy.Symbol("N", positive=True, integer=True), sympy.Symbol("d", positive=True, integer=True)
SIZES = {N: 3, D: 4}
A = t.Tensor("A", (N, D))
B = t.Tensor("B", (N, D))
U = t.Tensor("U", (N, sympy.Integer(1)))   # a row statistic, broadcast along d
ONES = t.Constant("ones", (N, D), (N, D))


def num(value) -> t.Scalar:
    return t.Scalar(sympy.sympify(value))


def raw(op: str, x: t.Node, y: t.Node) -> t.Binary:
    """The node written out, no builder involved."""
    from symattn.ir.shapes import broadcast

    return t.Binary(op, x, y, broadcast(x.shape, y.shape))


def neg(x: t.Node) -> t.Unary:
    return t.Unary("neg", x, x.shape)


# --- an independent NumPy evaluator ----------------------------------------------------


def value(node: t.Node, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(node, t.Tensor):
        return env[node.name]
    if isinstance(node, t.Scalar):
        return np.float64(float(node.value))
    if isinstance(node, t.Constant) and node.kind == "ones":
        return np.ones([SIZES.get(d, d) for d in node.shape])
    if isinstance(node, t.Unary) and node.fn == "neg":
        return -value(node.x, env)
    if isinstance(node, t.Unary) and node.fn == "tanh":
        return np.tanh(value(node.x, env))
    if isinstance(node, t.Binary):
        x, y = value(node.a, env), value(node.b, env)
        with np.errstate(all="ignore"):
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                    "pow": np.power}[node.op](x, y)
    raise TypeError(f"the test evaluator has no rule for {type(node).__name__}")


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 1e-3])


def envs(count: int = 40) -> list[dict[str, np.ndarray]]:
    """Random points: finite entries, entries drawn from SPECIAL, and rows masked to -inf."""
    rng = np.random.default_rng(12)
    out = []
    for k in range(count):
        env = {}
        for name, shape in (("A", (3, 4)), ("B", (3, 4)), ("U", (3, 1))):
            x = rng.standard_normal(shape)
            if k % 2:
                pick = rng.random(shape) < 0.4
                x[pick] = rng.choice(SPECIAL, size=int(pick.sum()))
            if k % 3 == 0:
                x[rng.integers(0, 3)] = -np.inf   # a masked row
            env[name] = x
        out.append(env)
    return out


def same(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal as float64 values are under symattn's semantics: NaN with NaN, the same infinity,
    finite entries equal up to rounding."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        return False
    finite = np.isfinite(x) & np.isfinite(y)
    if not np.array_equal(x[~finite & ~np.isnan(x)], y[~finite & ~np.isnan(y)]):
        return False
    return bool(np.allclose(x[finite], y[finite], rtol=1e-12, atol=1e-12))


def equal_everywhere(x: t.Node, y: t.Node) -> bool:
    return tuple(x.shape) == tuple(y.shape) and all(same(value(x, env), value(y, env)) for env in envs())


def test_the_evaluator_tells_apart_what_the_rules_must_not_do():
    """The comparison has teeth at the points used: each of these 'simplifications' is wrong
    somewhere in them (an infinite or NaN entry)."""
    assert not equal_everywhere(raw("mul", num(0), A), raw("mul", num(0), B))          # 0 * A is not 0
    assert not equal_everywhere(raw("sub", raw("mul", num(2), A), A), A)                 # 2A - A is not A
    assert not equal_everywhere(raw("sub", A, A), raw("mul", num(0), B))                 # A - A is not 0
    assert not equal_everywhere(raw("mul", A, B), raw("mul", A, A))


# --- each rule: the calls that fire it, its steps, their values ------------------------

NUMBERS = "numbers of a product combined: c1 * A / c2 = (c1 / c2) * A"
ONES_RULE = "A * ones(shape) = A where the product has that shape anyway"
LIKE = "like terms collected: c1 * A + c2 * A = (c1 + c2) * A for c1, c2 of one sign"
TANH = t.Unary("tanh", raw("div", A, num(50)), A.shape)

CASES = [
    # softcap: 50 * tanh(S / 50), differentiated
    ("50 * G * (1 - tanh^2) / 50", lambda r: b.div(b.mul(raw("mul", num(50), B), raw("sub", num(1), TANH), r), num(50), r),
     [NUMBERS], raw("mul", B, raw("sub", num(1), TANH))),
    ("2 * A * 3", lambda r: b.mul(raw("mul", num(2), A), num(3), r), [NUMBERS], raw("mul", num(6), A)),
    ("2 * A / 6", lambda r: b.div(raw("mul", num(2), A), num(6), r), [NUMBERS], raw("div", A, num(3))),
    ("4 * A / 6", lambda r: b.div(raw("mul", num(4), A), num(6), r), [NUMBERS],
     raw("div", raw("mul", num(2), A), num(3))),
    ("-2 * A / 2", lambda r: b.div(raw("mul", num(-2), A), num(2), r), [NUMBERS], neg(A)),
    ("A / (2 * B) * 4", lambda r: b.mul(raw("div", A, raw("mul", num(2), B)), num(4), r), [NUMBERS],
     raw("div", raw("mul", num(2), A), B)),
    ("0.5 * A * 2", lambda r: b.mul(raw("mul", num(0.5), A), num(2), r), [NUMBERS], A),
    ("2 * 3", lambda r: b.mul(num(2), num(3), r), [NUMBERS], num(6)),
    ("(U * ones) * A", lambda r: b.mul(raw("mul", U, ONES), A, r), [ONES_RULE], raw("mul", U, A)),
    ("A * (U * ones)", lambda r: b.mul(A, raw("mul", U, ONES), r), [ONES_RULE], raw("mul", A, U)),
    ("A / ones", lambda r: b.div(A, ONES, r), [ONES_RULE], A),
    ("U / 2 * ones * A * 2", lambda r: b.mul(raw("mul", raw("mul", raw("div", U, num(2)), ONES), A), num(2), r),
     [ONES_RULE, NUMBERS], raw("mul", U, A)),
    ("A * B + B * A", lambda r: b.add(raw("mul", A, B), raw("mul", B, A), r), [LIKE],
     raw("mul", raw("mul", num(2), A), B)),
    ("A / 2 + A / 2", lambda r: b.add(raw("div", A, num(2)), raw("div", A, num(2)), r), [LIKE], A),
    ("B + 2 * A + A", lambda r: b.add(raw("add", B, raw("mul", num(2), A)), A, r), [LIKE],
     raw("add", B, raw("mul", num(3), A))),
    ("-A - A", lambda r: b.sub(neg(A), A, r), [LIKE], neg(raw("mul", num(2), A))),
    ("A - (-A)", lambda r: b.sub(A, neg(A), r), [LIKE], raw("mul", num(2), A)),
    # the numbers inside the terms are part of their coefficients
    ("A * U / 2 + U * A / 2 (cosine)", lambda r: b.add(raw("div", raw("mul", A, U), num(2)),
                                                       raw("div", raw("mul", U, A), num(2)), r),
     [LIKE], raw("mul", A, U)),
    ("3 * A * B / 2 + B * A / 2", lambda r: b.add(raw("div", raw("mul", raw("mul", num(3), A), B), num(2)),
                                                  raw("div", raw("mul", B, A), num(2)), r),
     [LIKE], raw("mul", raw("mul", num(2), A), B)),
]


@pytest.mark.parametrize("name, make, rules, expected", CASES, ids=[c[0] for c in CASES])
def test_each_new_rule_fires_is_recorded_and_keeps_every_value(name, make, rules, expected):
    rec = b.Recorder()
    result = make(rec)
    assert result == expected, f"{name}: got {symattn.ir.printing.to_spec(result, ['N', 'd'])}"
    assert [s.rule for s in rec.steps][-len(rules):] == rules
    assert rec.steps[-1].after == result
    for step in rec.steps:
        assert step.before != step.after
        assert equal_everywhere(step.before, step.after), f"{name}: {step.rule} changed a value"


LEFT_ALONE = [
    ("0 * A * 2", lambda r: b.mul(raw("mul", num(0), A), num(2), r)),       # 0 is never folded into anything
    ("2 * A - A", lambda r: b.sub(raw("mul", num(2), A), A, r)),          # NaN where A is infinite
    ("A - A", lambda r: b.sub(A, A, r)),
    ("A + (-A)", lambda r: b.add(A, neg(A), r)),
    ("A * B - B * A", lambda r: b.sub(raw("mul", A, B), raw("mul", B, A), r)),
    ("U * ones", lambda r: b.mul(U, ONES, r)),                             # broadcasts: the shape changes
    ("U * ones / 2", lambda r: b.div(raw("mul", U, ONES), num(2), r)),
    ("inf * A / inf", lambda r: b.div(raw("mul", num(sympy.oo), A), num(sympy.oo), r)),
    ("A * 2 / B", lambda r: b.div(raw("mul", A, num(2)), B, r)),          # one number: nothing to combine
    ("A / A", lambda r: b.div(A, A, r)),                                 # only numbers ever cancel
]


@pytest.mark.parametrize("name, make", LEFT_ALONE, ids=[c[0] for c in LEFT_ALONE])
def test_what_is_not_value_preserving_is_left_alone(name, make):
    rec = b.Recorder()
    result = make(rec)
    assert not {s.rule for s in rec.steps} & {NUMBERS, ONES_RULE, LIKE}, [s.rule for s in rec.steps]
    kept = list(t.walk(result))
    assert ("ones" in name) == any(isinstance(n, t.Constant) for n in kept)
    assert ("0 *" in name) == any(isinstance(n, t.Scalar) and n.value == 0 for n in kept)
    assert sum(isinstance(n, t.Tensor) for n in kept) == name.count("A") + name.count("B") + name.count("U")


# --- the simplified gradients of the specs ---------------------------------------------


def _formula(path: Path, tensor: str) -> str:
    return symattn.load(path).derive().formula(tensor)


def test_softcap_gradient_has_its_numbers_cancelled():
    assert _formula(REPO / "derivations" / "softcap.attn", "S") == "grad(S) = grad(R) * (1 - tanh(S / 50)^2)"
    steps = symattn.load(REPO / "derivations" / "softcap.attn").derive().gradients["S"].steps
    assert f"simplify: {NUMBERS}" in [s.rule for s in steps]


def test_a_sum_broadcast_back_folds_its_ones_and_collects_the_two_paths():
    """cosine: Q * Q has two paths to Q, each `U * ones(N, d_k) * Q`; the ones broadcast
    nothing next to Q, the paths are like terms, and the 2 of the sum's derivative cancels."""
    text = _formula(COSINE_SELF_ATTENTION, "Q")
    assert "ones(" not in text
    assert text == ("grad(Q) = grad(Qn) / sqrt(sum(Q * Q, axis=-1)) + sum(-(grad(Qn) * Qn / sqrt(sum(Q * Q, axis=-1))), "
                    "axis=-1) / sqrt(sum(Q * Q, axis=-1)) * Q")
    rules = [s.rule for s in symattn.load(COSINE_SELF_ATTENTION).derive().gradients["Q"].steps]
    assert f"simplify: {ONES_RULE}" in rules and f"simplify: {LIKE}" in rules


ONES_SPEC = """attention onesfold
dim N = 3, d = 2
input X[N, d]
O = X * sum(X, axis=-1)
output O
"""


def test_a_broadcast_that_changes_the_shape_keeps_its_ones():
    """grad(X) = grad(O) * sum(X) + sum(X * grad(O)) * ones(N, d): the second path needs its
    ones (sum(...) is [N, 1]), the first has none."""
    text = symattn.load(ONES_SPEC).derive().formula("X")
    assert text == "grad(X) = grad(O) * sum(X, axis=-1) + sum(X * grad(O), axis=-1) * ones(N, d)"
