"""Random claims over buffers, cumsum, max / min, slices, concat and where, against NumPy (slow: about a minute per 30 claims).

Expressions over inputs X, Y, a mask that is -inf where a buffer is 0.25, log and sqrt of
squares, built from + - * /, elementwise functions, cumsum (both directions), max / min / sum /
mean broadcast back, a row rotation by slices and concat, and where with thresholds the
counterexample search never draws; each claim is a rewrite that holds over the reals (x - x = 0,
x / x = 1, distributing, exp(log x) = x, cumsum differences, ...) and may fail in float64, or a
perturbation that is false. Every "proved" must agree with NumPy at 40 points (zeros, 0.25,
negatives, values above 1, signed zeros through 0 * x) and every "refuted" must reproduce.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import symattn
from test_soundness_language_features import cumsum, differs, relu, sigmoid

N, D = 3, 2
NEG = -np.inf


def mk(keep):
    return np.broadcast_to(np.where(keep[None, :] == 0.25, NEG, 0.0), (N, N)).copy()


HEAD = f"""dim N = {N}, d = {D}
input X[N, d], Y[N, d]
buffer keep[N]
Mk[i:N, j:N] = where(keep[j] == 0.25, -inf, 0)
L = log(X * X)
R = sqrt(X * X + Y * Y)
S = X @ Y.T + Mk
O = X + Y
output O
"""


def env(v):
    e = dict(v)
    with np.errstate(all="ignore"):
        e["Mk"] = mk(v["keep"])
        e["L"] = np.log(v["X"] ** 2)
        e["R"] = np.sqrt(v["X"] ** 2 + v["Y"] ** 2)
        e["S"] = v["X"] @ v["Y"].T + e["Mk"]
    return e


# expression: (text, fn(env)->array, kind) kind 'nd' [N,d] or 'nn' [N,N]
def leaf(kind, rnd):
    if kind == "nd":
        name = rnd.choice(["X", "Y", "L", "R", "X", "Y"])
    else:
        name = rnd.choice(["S", "Mk", "X @ Y.T", "S"])
    if name == "X @ Y.T":
        return ("(X @ Y.T)", lambda e: e["X"] @ e["Y"].T, kind)
    return (name, lambda e, n=name: e[n], kind)


UN = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs, "relu": relu, "tanh": np.tanh,
    "sigmoid": sigmoid, "sin": np.sin, "cos": np.cos, "neg": lambda x: -x,
}


def gen(kind, depth, rnd):
    if depth == 0 or rnd.random() < 0.25:
        return leaf(kind, rnd)
    c = rnd.choice(["un", "bin", "bin", "scal", "cum", "red", "slice", "where"])
    if c == "un":
        f = rnd.choice(list(UN))
        a = gen(kind, depth - 1, rnd)
        t = f"(-{a[0]})" if f == "neg" else f"{f}({a[0]})"
        return (t, lambda e, a=a, f=f: UN[f](a[1](e)), kind)
    if c == "bin":
        op = rnd.choice("+-*/")
        a, b = gen(kind, depth - 1, rnd), gen(kind, depth - 1, rnd)
        fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op]
        return (f"({a[0]} {op} {b[0]})", lambda e, a=a, b=b, fn=fn: fn(a[1](e), b[1](e)), kind)
    if c == "scal":
        op, k = rnd.choice([("*", 2.0), ("+", 1.0), ("*", 0.0), ("-", 1.0), ("*", -1.0)])
        a = gen(kind, depth - 1, rnd)
        fn = {"+": np.add, "-": np.subtract, "*": np.multiply}[op]
        return (f"({a[0]} {op} {k})", lambda e, a=a, fn=fn, k=k: fn(a[1](e), k), kind)
    if c == "cum":
        ax = rnd.choice([0, -1])
        rev = rnd.random() < 0.5
        a = gen(kind, depth - 1, rnd)
        t = f"cumsum({a[0]}, axis={ax}{', reverse=1' if rev else ''})"
        return (t, lambda e, a=a, ax=ax, rev=rev: cumsum(a[1](e), ax, rev), kind)
    if c == "red":
        f = rnd.choice(["max", "min", "sum", "mean"])
        ax = rnd.choice([0, -1])
        a = gen(kind, depth - 1, rnd)
        npf = {"max": np.max, "min": np.min, "sum": np.sum, "mean": np.mean}[f]
        t = f"({f}({a[0]}, axis={ax}) + 0 * {a[0]})"
        # broadcast back to the kind's shape; 0 * a keeps NaN of a: written the same way in NumPy
        return (t, lambda e, a=a, ax=ax, npf=npf: npf(a[1](e), axis=ax, keepdims=True) + 0 * a[1](e), kind)
    if c == "slice":
        a = gen(kind, depth - 1, rnd)
        # rotate rows: concat(a[1:N], a[0:1]) along axis 0
        t = f"concat({a[0]}[1:N], {a[0]}[0:1], axis=0)"
        return (t, lambda e, a=a: np.concatenate([a[1](e)[1:], a[1](e)[:1]], axis=0), kind)
    # where
    a, b, x = gen(kind, depth - 1, rnd), gen(kind, depth - 1, rnd), gen(kind, depth - 1, rnd)
    op, thr = rnd.choice([(">", 0.0), ("==", 0.25), ("<", 1.0), ("!=", 0.0)])
    npop = {">": np.greater, "==": np.equal, "<": np.less, "!=": np.not_equal}[op]
    t = f"where({x[0]} {op} {thr}, {a[0]}, {b[0]})"
    return (t, lambda e, a=a, b=b, x=x, npop=npop, thr=thr: np.where(npop(x[1](e), thr), a[1](e), b[1](e)), kind)


def rewrite(e, rnd, kind):
    """A claim (lhs, rhs): true in reals, maybe not in IEEE."""
    a, b, c = e, gen(kind, 1, rnd), gen(kind, 1, rnd)
    r = rnd.choice(["self-sub", "times0", "div-self", "distribute", "exp-log", "sqrt-sq", "cum-diff", "commute",
                    "double", "max-neg", "cum-rev", "perturb", "identity", "relu-abs"])
    F = lambda t, f: (t, f, kind)
    if r == "self-sub":
        return F(f"({a[0]} - {a[0]})", lambda v: a[1](v) - a[1](v)), F(f"(0 * {b[0]})", lambda v: 0 * b[1](v))
    if r == "times0":
        return F(f"(0 * {a[0]})", lambda v: 0 * a[1](v)), F(f"(0 * {b[0]})", lambda v: 0 * b[1](v))
    if r == "div-self":
        return F(f"({a[0]} / {a[0]})", lambda v: a[1](v) / a[1](v)), F(f"(1 + 0 * {b[0]})", lambda v: 1 + 0 * b[1](v))
    if r == "distribute":
        return (F(f"({a[0]} * ({b[0]} + {c[0]}))", lambda v: a[1](v) * (b[1](v) + c[1](v))),
                F(f"({a[0]} * {b[0]} + {a[0]} * {c[0]})", lambda v: a[1](v) * b[1](v) + a[1](v) * c[1](v)))
    if r == "exp-log":
        return F(f"exp(log({a[0]}))", lambda v: np.exp(np.log(a[1](v)))), a
    if r == "sqrt-sq":
        return F(f"(sqrt({a[0]}) * sqrt({a[0]}))", lambda v: np.sqrt(a[1](v)) ** 2), a
    if r == "cum-diff":
        t1 = f"cumsum({a[0]}, axis=0)"
        return (F(f"({t1}[1:N] - {t1}[0:N-1])", lambda v: cumsum(a[1](v), 0)[1:] - cumsum(a[1](v), 0)[:-1]),
                F(f"{a[0]}[1:N]", lambda v: a[1](v)[1:]))
    if r == "commute":
        return F(f"({a[0]} + {b[0]})", lambda v: a[1](v) + b[1](v)), F(f"({b[0]} + {a[0]})", lambda v: b[1](v) + a[1](v))
    if r == "double":
        return F(f"({a[0]} + {a[0]})", lambda v: a[1](v) + a[1](v)), F(f"(2 * {a[0]})", lambda v: 2 * a[1](v))
    if r == "max-neg":
        return (F(f"max({a[0]}, axis=-1)", lambda v: np.max(a[1](v), axis=-1, keepdims=True)),
                F(f"(-min(-{a[0]}, axis=-1))", lambda v: -np.min(-a[1](v), axis=-1, keepdims=True)))
    if r == "cum-rev":
        return (F(f"(cumsum({a[0]}, axis=0) + cumsum({a[0]}, axis=0, reverse=1))",
                  lambda v: cumsum(a[1](v), 0) + cumsum(a[1](v), 0, True)),
                F(f"({a[0]} + sum({a[0]}, axis=0))", lambda v: a[1](v) + np.sum(a[1](v), axis=0, keepdims=True)))
    if r == "relu-abs":
        return (F(f"(relu({a[0]}) + relu(-{a[0]}))", lambda v: relu(a[1](v)) + relu(-a[1](v))),
                F(f"abs({a[0]})", lambda v: np.abs(a[1](v))))
    if r == "identity":
        return a, F(f"({a[0]} + 0 * {b[0]})", lambda v: a[1](v) + 0 * b[1](v))
    return a, F(f"({a[0]} + 0.5 * X)" if kind == "nd" else f"({a[0]} + 0.5 * (X @ X.T))",
                (lambda v: a[1](v) + 0.5 * v["X"]) if kind == "nd" else (lambda v: a[1](v) + 0.5 * (v["X"] @ v["X"].T)))


def points(rng):
    vals = [0.0, -1.0, -0.5, 0.25, 0.5, 2.0, -2.0, 3.0, 1.0]
    for k in range(40):
        v = {}
        for name, shape in (("X", (N, D)), ("Y", (N, D)), ("keep", (N,))):
            mode = (k + len(name)) % 5
            if mode == 0:
                v[name] = rng.choice(vals, size=shape)
            elif mode == 1:
                v[name] = np.zeros(shape)
            elif mode == 2:
                v[name] = np.full(shape, 0.25)
            elif mode == 3:
                v[name] = rng.standard_normal(shape)
            else:
                v[name] = rng.integers(-2, 3, size=shape) / 2.0
        yield v


def _difference(lhs, rhs):
    """A point (with both sides) at which NumPy tells the sides apart, or None."""
    rng = np.random.default_rng(0)
    for v in points(rng):
        e = env(v)
        with np.errstate(all="ignore"):
            a, b = lhs[1](e), rhs[1](e)
        bad = differs(a, b, 1e-7)
        if bad.any():
            return v, a, b
    return None




@pytest.mark.slow
@pytest.mark.parametrize("seed", range(120))
def test_random_claims_agree_with_numpy(seed):
    rnd = random.Random(seed)
    kind = rnd.choice(["nd", "nn"])
    lhs, rhs = rewrite(gen(kind, 2, rnd), rnd, kind)
    text = HEAD + f"check {lhs[0]} == {rhs[0]}\n"
    try:
        (verdict,) = symattn.load(text).check(budget=10)
    except symattn.SymAttnError:
        pytest.skip("the random claim is not a valid spec (shapes)")
    difference = _difference(lhs, rhs)
    if verdict.verdict == "proved":
        assert difference is None, f"proved, but NumPy differs at {difference[0]}: {text}"
    elif verdict.verdict == "refuted":
        values = {k: np.asarray(x, dtype=float) for k, x in verdict.counterexample.inputs.items()
                  if not k.startswith("grad(")}
        e = env(values)
        with np.errstate(all="ignore"):
            a, b = lhs[1](e), rhs[1](e)
        assert differs(a, b, 1e-9).any(), f"refuted, but NumPy finds the sides equal there: {text}"
