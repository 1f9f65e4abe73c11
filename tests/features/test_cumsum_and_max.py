"""cumsum (with the reverse scan as its adjoint) and the max / min reductions, end to end.

Every value is compared with an independent computation written here in plain NumPy:
central finite differences in float64 for gradients, the torch.amax tie convention
computed by hand (and torch itself when installed), causal linear attention as the
O(N^2) masked quadratic form, and counterexamples re-evaluated from their inputs.
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

import symattn
from symattn.codegen.numpy.emit import load_module, numpy_source
from symattn.codegen.program import build_program
from symattn.codegen.program_ir import walk_labelled
from symattn.ir import typed as t
from symattn.prove.claims import check_spec

from conftest import REPO, run_cli

CAUSAL_LINEAR = REPO / "derivations" / "causal_linear.attn"
STABLE_SOFTMAX = REPO / "derivations" / "stable_softmax.attn"

SCAN_SPEC = """
dim N = 5, d = 3
input X[N, d]
param W[d, d]
H = X @ W
F = cumsum(H, axis=0) * tanh(X) + cumsum(X, axis=-1)
O = cumsum(F * F, axis=0)
output O
"""

EXTREME_SPEC = """
dim N = 3, d = 4
input X[N, d]
A = max(X, axis=-1)
B = min(X, axis=0)
O = A * B
output O
"""


def _module(text: str):
    spec = symattn.load(text)
    return spec, load_module(numpy_source(spec.typed))


def _finite_differences(f, arrays: dict[str, np.ndarray], g: np.ndarray, eps: float = 1e-6):
    """d <f(arrays), g> / d array, entry by entry, by central differences."""
    out = {}
    for name, value in arrays.items():
        grad = np.zeros_like(value)
        for index in np.ndindex(*value.shape):
            plus = {k: v.copy() for k, v in arrays.items()}
            minus = {k: v.copy() for k, v in arrays.items()}
            plus[name][index] += eps
            minus[name][index] -= eps
            grad[index] = (np.sum(f(**plus) * g) - np.sum(f(**minus) * g)) / (2 * eps)
        out[name] = grad
    return out


def _scan_plain(X, W):
    H = X @ W
    cs = np.zeros_like(H)
    for i in range(H.shape[0]):  # an explicit running sum, not np.cumsum
        cs[i] = H[: i + 1].sum(axis=0)
    rows = np.stack([X[:, : j + 1].sum(axis=1) for j in range(X.shape[1])], axis=1)
    F = cs * np.tanh(X) + rows
    return np.stack([(F * F)[: i + 1].sum(axis=0) for i in range(F.shape[0])])


def test_cumsum_forward_and_backward_against_finite_differences():
    _, mod = _module(SCAN_SPEC)
    rng = np.random.default_rng(1)
    X, W = rng.standard_normal((5, 3)), rng.standard_normal((3, 3)) * 0.5
    g = rng.standard_normal((5, 3))
    outputs, grads = mod.forward_backward(X=X, W=W, grad_O=g)
    assert np.allclose(outputs["O"], _scan_plain(X, W), rtol=1e-12, atol=1e-12)
    numeric = _finite_differences(_scan_plain, {"X": X, "W": W}, g)
    for name in ("X", "W"):
        assert np.allclose(grads[name], numeric[name], rtol=1e-6, atol=1e-7), name


def _amax_backward(x: np.ndarray, axis: int, g: np.ndarray, kind: str) -> np.ndarray:
    """torch.amax's backward by hand: g shared equally among the entries equal to the extreme."""
    top = x.max(axis=axis, keepdims=True) if kind == "max" else x.min(axis=axis, keepdims=True)
    hit = (x == top).astype(float)
    return hit * g / hit.sum(axis=axis, keepdims=True)


def test_max_min_gradient_shares_ties_like_torch_amax():
    _, mod = _module(EXTREME_SPEC)
    X = np.array([[1.0, 3.0, 3.0, -2.0],     # a tie for the row max
                  [0.5, 0.5, 0.5, 0.5],      # every entry ties
                  [-2.0, 4.0, -2.0, 0.0]])   # a tie for column 0's min... and column 2's
    g = np.array([[0.7, -1.3, 2.0, 0.4], [1.1, 0.2, -0.5, 0.9], [-0.3, 0.6, 1.7, -2.2]])
    outputs, grads = mod.forward_backward(X=X, grad_O=g)
    A, B = X.max(axis=1, keepdims=True), X.min(axis=0, keepdims=True)
    assert np.array_equal(outputs["O"], A * B)
    dA = np.sum(g * B, axis=1, keepdims=True)
    dB = np.sum(g * A, axis=0, keepdims=True)
    expected = _amax_backward(X, 1, dA, "max") + _amax_backward(X, 0, dB, "min")
    assert np.allclose(grads["X"], expected, rtol=1e-13, atol=1e-15)
    assert np.isclose(grads["X"][1, 0], dA[1, 0] / 4 + _amax_backward(X, 0, dB, "min")[1, 0])
    torch = pytest.importorskip("torch")
    x = torch.tensor(X, requires_grad=True)
    out = torch.amax(x, dim=1, keepdim=True) * torch.amin(x, dim=0, keepdim=True)
    out.backward(torch.tensor(g))
    assert np.allclose(grads["X"], x.grad.numpy(), rtol=1e-13, atol=1e-15)


def _causal_linear_plain(X, W_q, W_k, W_v):
    """Causal linear attention as the O(N^2) masked quadratic form, no scans."""
    Fq = np.maximum(X @ W_q, 0) + 1
    Fk = np.maximum(X @ W_k, 0) + 1
    V = X @ W_v
    A = np.tril(Fq @ Fk.T)
    return (A @ V) / A.sum(axis=1, keepdims=True)


def test_causal_linear_backward_against_finite_differences():
    spec = symattn.load(CAUSAL_LINEAR, dims={"N": 6})
    mod = load_module(numpy_source(spec.typed))
    rng = np.random.default_rng(2)
    arrays = {"X": rng.standard_normal((6, 3)), "W_q": rng.standard_normal((3, 2)),
              "W_k": rng.standard_normal((3, 2)), "W_v": rng.standard_normal((3, 2))}
    g = rng.standard_normal((6, 2))
    outputs, grads = mod.forward_backward(**arrays, grad_O=g)
    assert np.allclose(outputs["O"], _causal_linear_plain(**arrays), rtol=1e-12)
    numeric = _finite_differences(_causal_linear_plain, arrays, g)
    for name in arrays:
        assert np.allclose(grads[name], numeric[name], rtol=1e-5, atol=1e-7), name


def test_causal_linear_backward_is_a_reverse_scan_without_n_by_n_arrays():
    spec = symattn.load(CAUSAL_LINEAR)
    program = build_program(spec.typed)
    backward = [s for s in program.stmts if s.section == "backward"]
    scans = [n for s in backward for n in walk_labelled(s.node) if isinstance(n, t.Scan)]
    assert scans and all(n.reverse for n in scans)
    n = spec.typed.dims["N"].symbol
    for stmt in program.stmts:
        assert list(stmt.shape).count(n) <= 1, f"{stmt.var} has shape {stmt.shape}"
    # Measured: the forward and backward at N = 512 allocate far less than one N x N array.
    source = numpy_source(symattn.load(CAUSAL_LINEAR, dims={"N": 512}).typed)
    assert "_reverse_cumsum" in source and "np.cumsum" in source
    mod = load_module(source)
    rng = np.random.default_rng(3)
    args = {n: rng.standard_normal(s) for n, s in zip(("X", "W_q", "W_k", "W_v"), ((512, 3), (3, 2), (3, 2), (3, 2)))}
    g = rng.standard_normal((512, 2))
    tracemalloc.start()
    mod.forward_backward(**args, grad_O=g)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 0.25 * 512 * 512 * 8


def test_causal_linear_verdicts():
    spec = symattn.load(CAUSAL_LINEAR)
    verdicts = check_spec(spec.typed, budget=None)
    by_claim = {v.claim: v for v in verdicts}
    assert all(v.verdict == "proved" for v in verdicts), [(v.claim, v.verdict) for v in verdicts]
    refuted = by_claim["not O == num / sum(Fq * Fk, axis=-1)"].counterexample
    assert refuted is not None
    inputs = {k: np.array(v, dtype=float) for k, v in refuted.inputs.items() if not k.startswith("grad(")}
    O = _causal_linear_plain(**inputs)
    Fq = np.maximum(inputs["X"] @ inputs["W_q"], 0) + 1
    Fk = np.maximum(inputs["X"] @ inputs["W_k"], 0) + 1
    num = np.tril(Fq @ Fk.T) @ (inputs["X"] @ inputs["W_v"])
    wrong = num / np.sum(Fq * Fk, axis=-1, keepdims=True)
    assert np.allclose(np.array(refuted.lhs), O) and np.allclose(np.array(refuted.rhs), wrong)
    assert not np.allclose(O, wrong)


def test_stable_softmax_verdicts():
    verdicts = check_spec(symattn.load(STABLE_SOFTMAX).typed, budget=None)
    assert all(v.verdict == "proved" for v in verdicts), [(v.claim, v.verdict) for v in verdicts]
    wrong = next(v for v in verdicts if v.claim.startswith("not E =="))
    inputs = {k: np.array(v, dtype=float) for k, v in wrong.counterexample.inputs.items()}
    S = (inputs["X"] @ inputs["W_q"]) @ (inputs["X"] @ inputs["W_k"]).T / np.sqrt(2)
    assert np.allclose(np.array(wrong.counterexample.lhs), np.exp(S - S.max(axis=1, keepdims=True)))
    assert np.allclose(np.array(wrong.counterexample.rhs), np.exp(S - S.min(axis=1, keepdims=True)))


@pytest.mark.parametrize("text, message", [
    ("Y = cumsum(X, axis=2)", r"axis 2 is out of range for cumsum\(\)"),
    ("Y = cumsum(X)", r"cumsum\(\) is missing the argument 'axis'"),
    ("Y = cumsum(X, axis=0, reverse=2)", r"reverse must be 0"),
    ("Y = max(X, axis=-3)", r"axis -3 is out of range for max\(\)"),
])
def test_located_errors(tmp_path, text, message):
    path = tmp_path / "bad.attn"
    path.write_text(f"dim N = 3, d = 2\ninput X[N, d]\n{text}\noutput Y\n", encoding="utf-8")
    result = run_cli("check", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert re.search(rf"bad.attn:3:\d+: error: .*{message}", result.stderr), result.stderr


def test_printed_gradients_parse_back():
    derivation = symattn.load(CAUSAL_LINEAR).derive()
    text = str(derivation["grad(KV_step)"])
    assert text == "grad(KV_step) = cumsum(grad(KV), axis=-3, reverse=1)"


def test_verify_numpy_green():
    for path in (CAUSAL_LINEAR, STABLE_SOFTMAX):
        result = run_cli("verify", str(path), "--target", "numpy")
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_verify_cuda_green():
    from symattn.check.cuda import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    for path in (CAUSAL_LINEAR, STABLE_SOFTMAX):
        result = run_cli("verify", str(path), "--target", "cuda", timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "result: ok" in result.stdout
