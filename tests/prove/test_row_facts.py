"""Row facts and the finiteness classes they refine (issue 26), each checked against NumPy.

`symattn.symbolic.row_facts` says which lines of a tensor hold a finite entry
(a causal mask's rows do, a key-padding mask's may not, a strict causal mask's
first row does not), which values are > 0 or >= 0; the finiteness analysis
then calls the row max of causally masked scores finite and `E / sum(E)`
finite. A True here is a proof for every value and size, so every fact the
tests expect to hold is also sampled in NumPy (zeros, negatives, ties, masks
that empty rows), and every fact expected not to be shown has a NumPy point
where it fails, so a "not shown" is never the analysis being lazy about a
true fact the table calls false.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.symbolic.finiteness import ANY, FINITE, MINUS_INF, Finiteness

from numpy_claims import KINDS, NEG_INF, leaves, softmax

HEAD = """\
dim N = 3, d = 2, w = 2
input X[N, d], Y[N, d]
buffer keep[N], b[N, 1], span[w]
Mk = where(keep > 0, 0, -inf)
Ms[i:N, j:N] = where(j < i, 0, -inf)
Mc[i:N, j:N] = where(j <= i, 0, -inf)
Mw[i:N, j:N] = where(j <= i, where(i - j < w, 0, -inf), -inf)
Mv[i:N, j:N] = where(j <= i, where(i - j < w - 1, 0, -inf), -inf)
Mu[i:N, j:N] = where(j >= i, 0, -inf)
S = X @ Y.T
A = S + Mk
B = S + Ms
C = S + Mc
W = S + Mw
Wv = S + Mv
U = S + Mu
L = log(X * X)
O = X
output O
"""


def _numpy(v):
    n = v.X.shape[0]
    w = v.get("w_size", 2)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v["Mk"] = np.where(v.keep > 0, 0.0, NEG_INF)
    v["Ms"] = np.where(j < i, 0.0, NEG_INF)
    v["Mc"] = np.where(j <= i, 0.0, NEG_INF)
    v["Mw"] = np.where((j <= i) & (i - j < w), 0.0, NEG_INF)
    v["Mv"] = np.where((j <= i) & (i - j < w - 1), 0.0, NEG_INF)
    v["Mu"] = np.where(j >= i, 0.0, NEG_INF)
    v["S"] = v.X @ v.Y.T
    for name, mask in (("A", "Mk"), ("B", "Ms"), ("C", "Mc"), ("W", "Mw"), ("Wv", "Mv"), ("U", "Mu")):
        v[name] = v.S + v[mask]
    with np.errstate(all="ignore"):
        v["L"] = np.log(v.X * v.X)


def _points(spec, sizes=None):
    """NumPy values of every tensor at sampled points (all the kinds, and mixed kinds per tensor)."""
    rng = np.random.default_rng(3)
    at = spec if sizes is None else spec.with_dims(**sizes)
    out = []
    for shift in [None] + list(range(2 * len(KINDS))):
        for kind in (KINDS if shift is None else ["mixed kinds"]):
            v = leaves(at, kind, rng, ("keep",), shift)
            v["w_size"] = (sizes or {}).get("w", 2)
            _numpy(v)
            out.append(v)
    return out


def _expr(spec, text):
    """The typed node of an expression, read as the left side of a claim."""
    return symattn.load(spec.typed.source + f"check {text} == {text}\n").typed.checks[-1].lhs


@pytest.fixture(scope="module")
def spec():
    return symattn.load(HEAD)


def _facts(spec):
    typed = spec.typed
    return Finiteness(typed, {n: i.expr for n, i in typed.tensors.items() if i.expr is not None}), typed


# (expression, axis, rows hold a finite entry) with NumPy checking the True ones at sampled points
LINES = [
    ("C", 1, True), ("C", 0, True), ("U", 1, True), ("U", 0, True), ("W", 1, True),
    ("B", 1, False), ("A", 1, False), ("Wv", 1, False), ("Mk", 0, False),
    ("C.T", 0, True), ("concat(B, C, axis=-1)", 1, True), ("concat(B, A, axis=-1)", 1, False),
    ("C + b", 1, True), ("C - max(C, axis=-1)", 1, True), ("B - max(B, axis=-1)", 1, False),
    ("max(C, axis=-1)", 1, True), ("logsumexp(C, axis=-1)", 1, True), ("max(B, axis=-1)", 1, False),
    ("C * 2", 1, True), ("C * -2", 1, False), ("C[:, 1:N]", 1, False), ("C[1:N, :]", 1, True),
    ("L", 1, False),
]


@pytest.mark.parametrize("text, axis, expected", LINES, ids=[f"{t} axis {a}" for t, a, _ in LINES])
def test_lines_holding_a_finite_entry(spec, text, axis, expected):
    facts, _ = _facts(spec)
    node = _expr(spec, text)
    shown = facts.rows.nonempty(node, axis)
    assert shown == expected, (text, axis)
    some_line_empty = False
    for sizes in (None, {"N": 4, "w": 3}, {"N": 5, "w": 1}):
        for v in _points(spec, sizes):
            with np.errstate(all="ignore"):
                value = np.asarray(eval(text.replace("max(", "np_max(").replace("logsumexp(", "np_lse(")
                                        .replace("concat(", "np_concat(").replace(".T", ".T"),
                                        {"np_max": lambda x, axis: np.max(x, axis=axis, keepdims=True),
                                         "np_lse": _lse, "np_concat": lambda *p, axis: np.concatenate(p, axis=axis),
                                         "N": v.X.shape[0], **v}), dtype=np.float64)
            finite = np.isfinite(value).any(axis=axis)
            if expected:
                assert finite.all(), (text, sizes, value)
            some_line_empty = some_line_empty or not finite.all()
    if not expected and text != "C * -2":  # +inf entries: a line may hold a finite one, unshown
        assert some_line_empty, f"{text}: NumPy never empties a line, so 'not shown' would be lazy"


def test_a_window_whose_width_may_be_zero_holds_no_finite_entry_for_sure():
    """A dim used only as a number may be 0 (LANGUAGE.md): `i - j < w` at w = 0 empties every row."""
    text = HEAD.replace(", span[w]", "")
    facts, _ = _facts(symattn.load(text))
    assert not facts.rows.nonempty(_expr(symattn.load(text), "W"), 1)
    i, j = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    assert not ((j <= i) & (i - j < 0)).any(axis=1).any()  # NumPy at w = 0: every row empty


def _lse(x, axis):
    from numpy_claims import logsumexp
    return logsumexp(x, axis)


# (expression, class) of the refined finiteness analysis, with NumPy sampling the FINITE ones
CLASSES = [
    ("max(C, axis=-1)", FINITE), ("max(B, axis=-1)", MINUS_INF), ("logsumexp(C, axis=-1)", FINITE),
    ("logsumexp(A, axis=-1)", MINUS_INF), ("C - max(C, axis=-1)", MINUS_INF), ("B - max(B, axis=-1)", ANY),
    ("exp(C - max(C, axis=-1)) / sum(exp(C - max(C, axis=-1)), axis=-1)", FINITE),
    ("exp(B) / sum(exp(B), axis=-1)", ANY), ("X / sum(exp(S), axis=-1)", FINITE),
    ("X / sum(X * X, axis=-1)", ANY), ("log(X * X)", MINUS_INF), ("log(exp(X) + 1)", FINITE),
    ("log(X)", ANY), ("sqrt(X * X)", FINITE), ("sqrt(X)", ANY), ("sqrt(sum(X * X, axis=-1))", FINITE),
    ("1 / sum(where(S == max(S, axis=-1), 1, 0), axis=-1)", FINITE),
    ("1 / sum(where(C == max(C, axis=-1), 1, 0), axis=-1)", FINITE),
    ("1 / sum(where(L == max(L, axis=-1), 1, 0), axis=-1)", FINITE),
    ("1 / sum(where(S == max(S, axis=0), 1, 0), axis=-1)", ANY),
    ("1 / sum(where(log(X) == max(log(X), axis=-1), 1, 0), axis=-1)", ANY),
    ("exp(L) ^ 0.5", FINITE), ("X ^ 0.5", ANY),
]


@pytest.mark.parametrize("text, expected", CLASSES, ids=[t for t, _ in CLASSES])
def test_refined_finiteness_classes(spec, text, expected):
    facts, _ = _facts(spec)
    assert facts.node(_expr(spec, text)) == expected, text
    if expected != ANY:
        for v in _points(spec):
            value = _numpy_of(text, v)
            assert not np.isnan(value).any(), (text, value)
            if expected == FINITE:
                assert np.isfinite(value).all(), (text, value)
            else:
                assert not (value == np.inf).any(), (text, value)


def _numpy_of(text, v):
    names = {"np": np, **v}
    code = (text.replace("max(", "amax_(").replace("logsumexp(", "lse_(").replace("sum(", "sum_(")
            .replace("where(", "np.where(").replace("exp(", "np.exp(").replace("log(", "np.log(")
            .replace("sqrt(", "np.sqrt(").replace("^", "**").replace("np.np.", "np."))
    names.update(amax_=lambda x, axis: np.max(x, axis=axis, keepdims=True), lse_=_lse,
                 sum_=lambda x, axis: np.sum(x, axis=axis, keepdims=True))
    with np.errstate(all="ignore"):
        return np.asarray(eval(code, names), dtype=np.float64)


def test_signs(spec):
    facts, _ = _facts(spec)
    rows = facts.rows
    positive = ["exp(X)", "sum(exp(S), axis=-1)", "sum(exp(C - max(C, axis=-1)), axis=-1)", "exp(X) + X * X",
                "sum(where(S == max(S, axis=-1), 1, 0), axis=-1)", "sqrt(exp(X))"]
    not_positive = ["sum(exp(A), axis=-1)", "sum(exp(B), axis=-1)", "X * X", "softmax(S, axis=-1)", "exp(L)",
                    "sum(where(S == max(S, axis=0), 1, 0), axis=-1)"]
    nonnegative = ["X * X", "exp(A)", "softmax(A, axis=-1)", "sum(X * X, axis=-1)", "exp(L) + X * X", "abs(X)"]
    not_nonnegative = ["X", "X * Y", "L", "log(exp(X) + 1) - 1"]
    for text in positive:
        assert rows.positive(_expr(spec, text)), text
    for text in not_positive:
        assert not rows.positive(_expr(spec, text)), text
    for text in nonnegative:
        assert rows.nonnegative(_expr(spec, text)), text
    for text in not_nonnegative:
        assert not rows.nonnegative(_expr(spec, text)), text
    for v in _points(spec):
        for text in positive:
            value = _numpy_of(text.replace("softmax(", "softmax_("), {**v, "softmax_": softmax})
            assert (value > 0).all() and np.isfinite(value).all(), (text, value)
        for text in nonnegative:
            value = _numpy_of(text.replace("softmax(", "softmax_("), {**v, "softmax_": lambda x, axis: softmax(x)})
            assert (value >= 0).all() and np.isfinite(value).all(), (text, value)
