"""Claims about tangents and Hessian-vector products (`check tangent(P) == ...`, `tangent(grad(W))`), against
expectations computed independently in plain NumPy: the attention written out by hand below, tangents by
central differences of it along random directions, gradients by the textbook formulas, and the tangents of
gradients (the HVP) by central differences of those. Causal and key-padding masks make masked entries and a
fully masked row (query 0 sees only key 0, which is padded)."""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.symbolic.passes import tangent_spec

SPEC = """\
attention masked
dim N = 4, d = 3
input Q[N, d], K[N, d], V[N, d]
buffer keep[N]
M[i:N, j:N] = where(j <= i, 0, -inf)
Kp = where(keep > 0, 0, -inf)
S = Q @ K.T / sqrt(d) + M + Kp
P = softmax(S, axis=-1)
O = P @ V
output O
"""

# (claim, what plain NumPy says of it: a function of the values below that is True where it holds)
CLAIMS = [
    ("tangent(P) == P * (tangent(S) - sum(P * tangent(S), axis=-1))",
     lambda v: np.allclose(v["tP"], v["P"] * (v["tS"] - np.sum(v["P"] * v["tS"], -1, keepdims=True)), atol=1e-6)),
    ("tangent(S) == (tangent(Q) @ K.T + Q @ tangent(K).T) / sqrt(d)",
     lambda v: _same(v["tS"], (v["tQ"] @ v["K"].T + v["Q"] @ v["tK"].T) / np.sqrt(3))),
    ("tangent(S) == tangent(Q) @ K.T / sqrt(d)",
     lambda v: _same(v["tS"], v["tQ"] @ v["K"].T / np.sqrt(3))),
    ("where(M < 0, tangent(P), 0) == 0", lambda v: np.allclose(np.where(v["M"] < 0, v["tP"], 0), 0, atol=1e-7)),
    ("sum(tangent(P), axis=-1) == 0", lambda v: np.allclose(v["tP"].sum(-1), 0, atol=1e-6)),
    ("tangent(O) == tangent(P) @ V + P @ tangent(V)",
     lambda v: np.allclose(v["tO"], v["tP"] @ v["V"] + v["P"] @ v["tV"], atol=1e-6)),
    ("tangent(O) == P @ tangent(V)", lambda v: np.allclose(v["tO"], v["P"] @ v["tV"], atol=1e-6)),
    ("tangent(keep) == 0", lambda v: True),
    ("tangent(P) == 0", lambda v: np.allclose(v["tP"], 0, atol=1e-7)),
    # Hessian-vector products: tangents of the gradients, the upstream gradient's tangent 0
    ("tangent(grad(V)) == tangent(P).T @ grad(O)", lambda v: np.allclose(v["tgV"], v["tP"].T @ v["gO"], atol=1e-5)),
    ("tangent(grad(V)) == P.T @ grad(O)", lambda v: np.allclose(v["tgV"], v["P"].T @ v["gO"], atol=1e-5)),
    ("tangent(grad(Q)) == tangent(grad(S)) @ K / sqrt(d) + grad(S) @ tangent(K) / sqrt(d)",
     lambda v: np.allclose(v["tgQ"], (v["tgS"] @ v["K"] + v["gS"] @ v["tK"]) / np.sqrt(3), atol=1e-5)),
    ("tangent(grad(Q)) == tangent(grad(S)) @ K / sqrt(d)",
     lambda v: np.allclose(v["tgQ"], v["tgS"] @ v["K"] / np.sqrt(3), atol=1e-5)),
    ("tangent(grad(S)) == tangent(P) * (grad(P) - sum(grad(P) * P, axis=-1)) "
     "+ P * (tangent(grad(P)) - sum(tangent(grad(P)) * P + grad(P) * tangent(P), axis=-1))",
     lambda v: np.allclose(v["tgS"], v["tP"] * (v["gP"] - np.sum(v["gP"] * v["P"], -1, keepdims=True))
                           + v["P"] * (v["tgP"] - np.sum(v["tgP"] * v["P"] + v["gP"] * v["tP"], -1, keepdims=True)),
                           atol=1e-5)),
    ("tangent(grad(P)) == grad(O) @ tangent(V).T", lambda v: np.allclose(v["tgP"], v["gO"] @ v["tV"].T, atol=1e-5)),
    ("tangent(grad(P)) == 0", lambda v: np.allclose(v["tgP"], 0, atol=1e-6)),
]


def _same(a, b):
    return bool(np.allclose(a, b, atol=1e-6))


def _softmax(s):
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)  # a fully masked row is 0


def _forward(q, k, v, keep):
    n, d = q.shape
    m = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, -np.inf)
    kp = np.where(keep > 0, 0.0, -np.inf)
    s0 = q @ k.T / np.sqrt(d)
    s = s0 + m + kp
    p = _softmax(s)
    return {"M": m, "S0": s0, "S": s, "P": p, "O": p @ v}


def _backward(q, k, v, keep, g_o):
    f = _forward(q, k, v, keep)
    p = f["P"]
    g_p = g_o @ v.T
    g_s = p * (g_p - np.sum(g_p * p, -1, keepdims=True))
    d = q.shape[1]
    return {"gO": g_o, "gP": g_p, "gS": g_s, "gV": p.T @ g_o, "gQ": g_s @ k / np.sqrt(d)}


def _values(rng, keep):
    q, k, v = (rng.standard_normal((4, 3)) for _ in range(3))
    tq, tk, tv = (rng.standard_normal((4, 3)) for _ in range(3))
    g_o = rng.standard_normal((4, 3))
    h = 1e-6
    plus, minus = _forward(q + h * tq, k + h * tk, v + h * tv, keep), _forward(q - h * tq, k - h * tk, v - h * tv, keep)
    out = {**_forward(q, k, v, keep), "Q": q, "K": k, "V": v, "tQ": tq, "tK": tk, "tV": tv}
    # the masks are constants, so tangent(S) is the tangent of the finite part (the language's convention;
    # a -inf score does not move)
    out["tS"] = (plus["S0"] - minus["S0"]) / (2 * h)
    out.update({f"t{n}": (plus[n] - minus[n]) / (2 * h) for n in ("P", "O")})
    gp, gm = (_backward(q + s * h * tq, k + s * h * tk, v + s * h * tv, keep, g_o) for s in (1, -1))
    out.update(_backward(q, k, v, keep, g_o))
    out.update({f"tg{n}": (gp[f"g{n}"] - gm[f"g{n}"]) / (2 * h) for n in ("P", "S", "V", "Q")})
    return out


def _truth(claim):
    rng = np.random.default_rng(5)
    points = [_values(rng, keep) for keep in (np.array([-1.0, 1, 1, 1]), np.array([1.0, -1, 1, 1]),
                                              np.array([1.0, 1, 1, 1]))]
    return all(claim(v) for v in points)


@pytest.fixture(scope="module")
def verdicts():
    text = SPEC + "".join(f"check {claim}\n" for claim, _ in CLAIMS)
    return symattn.load(text).check()


@pytest.mark.parametrize("k", range(len(CLAIMS)), ids=[c for c, _ in CLAIMS])
def test_verdict_agrees_with_plain_numpy(k, verdicts):
    claim, truth = CLAIMS[k]
    verdict = verdicts[k]
    assert verdict.claim == claim
    expected = _truth(truth)
    assert verdict.verdict == ("proved" if expected else "refuted"), (verdict.verdict, verdict.method)
    if verdict.verdict == "refuted":  # the counterexample names the tangents it was found at
        assert any(name.startswith("tangent_") for name in verdict.counterexample.inputs)


def test_masked_tangents_are_zero_not_nan():
    """A fully masked row (query 0: its one key padded) has P = 0 and tangent(P) = 0, never NaN; the tangent
    pass's values against the NumPy reference above."""
    from symattn.symbolic.evaluate import NUMERIC, Evaluator

    spec = symattn.load(SPEC).typed
    written = symattn.load(tangent_spec(spec).text).typed
    rng = np.random.default_rng(3)
    keep = np.array([-1.0, 1, 1, 1])
    v = _values(rng, keep)
    got = Evaluator(written, NUMERIC).run({"Q": v["Q"], "K": v["K"], "V": v["V"], "keep": keep, "tangent_Q": v["tQ"],
                                           "tangent_K": v["tK"], "tangent_V": v["tV"]})
    assert np.all(np.isfinite(got["tangent_O"]))
    np.testing.assert_array_equal(got["tangent_O"][0], 0.0)
    np.testing.assert_allclose(got["tangent_O"], v["tO"], atol=1e-6)
    np.testing.assert_array_equal(got["tangent_P"][np.triu_indices(4, 1)], 0.0)


@pytest.mark.slow  # a fresh interpreter each
@pytest.mark.parametrize("text, message", [
    ("check tangent(Q + K) == 0", "tangent() takes one tensor name"),
    ("check tangent(N) == 0", "it is a dim"),
    ("check tangent(Z) == 0", "unknown tensor 'Z'"),
    ("check tangent(grad(keep)) == 0", "it is a buffer"),
    ("T = tangent(Q)", "stands only in checks"),
])
def test_tangent_misuse_is_a_located_error(text, message, tmp_path):
    from conftest import run_cli

    path = tmp_path / "bad.attn"
    path.write_text(SPEC + text + "\n")
    result = run_cli("check", str(path))
    assert result.returncode == 2, result.stderr
    assert f"{path}:{SPEC.count(chr(10)) + 1}:" in result.stderr and "error:" in result.stderr, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_review_findings():
    """An adversarial review's three findings: a negated tangent claim says `not` (it was shown without it,
    a false claim reading as proved); tangent(grad(a)) of a scalar param (crashed: its gradient is [1] in
    the written pass); relative(tangent(B)) (aborted the whole run)."""
    negated = symattn.load("attention a\ndim N = 3, d = 2\ninput Q[N, d], K[N, d], V[N, d]\nS = Q @ K.T\n"
                           "P = softmax(S, axis=-1)\nO = P @ V\noutput O\ncheck not tangent(P) == 0\n"
                           "check not tangent(O) == tangent(P) @ V + P @ tangent(V)\n").check()
    assert [(v.verdict, v.claim) for v in negated] == [
        ("proved", "not tangent(P) == 0"), ("refuted", "not tangent(O) == tangent(P) @ V + P @ tangent(V)")]
    scalar = symattn.load("attention p\ndim N = 3\ninput X[N]\nparam a\nE = exp(X * a)\noutput E\n"
                          "check tangent(grad(a)) == 0\ncheck tangent(grad(a)) == tangent(grad(a))\n").check()
    assert [v.verdict for v in scalar] == ["refuted", "proved"]
    relative = symattn.load("attention r\ndim N = 4, H = 2\ninput X[N, N]\nparam Bt[2 * H + 1]\n"
                            "B[i:N, j:N] = Bt[clamp(j - i, -H, H) + H]\nO = X + B\noutput O\n"
                            "check relative(tangent(B))\ncheck not relative(tangent(O))\n").check()
    assert [v.verdict for v in relative] == ["proved", "proved"], [(v.verdict, v.method) for v in relative]
