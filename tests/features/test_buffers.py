"""Buffers (given tensors that are never differentiated) and grouped symmetry claims.

Every expectation is computed here, independently of symattn: the forward passes
in plain NumPy, gradients by central finite differences of those in float64,
permutations applied with NumPy indexing. symattn's counterexamples are
re-evaluated in plain NumPy, never with symattn's own evaluator.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import symattn
from conftest import run_cli
from symattn.check.cuda import find_cxx, find_nvcc, gate_cached, verify_cuda
from symattn.codegen.cuda import emit_cuda
from symattn.errors import SpecCheckError, SpecError, SpecNameError, SpecShapeError, UnknownGradientError, UsageError

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found: the compile gate needs the CUDA toolkit")
needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="g++ not found: running the kernels on the CPU needs C++20")

KEY_PADDING = """\
attention key_padding
dim N = 4, d = 3, d_k = 2
input X[N, d]
param W_q[d, d_k], W_k[d, d_k], W_v[d, d_k]
buffer keep[N]
Mk = where(keep > 0, 0, -inf)
Q = X @ W_q
K = X @ W_k
V = X @ W_v
S = Q @ K.T / sqrt(d_k) + Mk
P = softmax(S, axis=-1)
O = P @ V
output O
check grad(V) == P.T @ grad(O)
check equivariant(O, X)
check equivariant(O, (X, keep))
check equivariant(O, (X, keep), N)
check where(keep > 0, X.T, 0) == X.T
check Mk * 0 == 0 * keep
"""
LINE = {"grad_v": 14, "alone": 15, "group": 16, "group_dim": 17, "where": 18, "mask_times_zero": 19}

# Cross-attention whose source tokens carry a padding flag: invariant under
# permuting the source with its flags, not under permuting the source alone.
CROSS = """\
attention cross_padding
dim N = 3, M = 4, d = 2
input X[N, d], Y[M, d]
param W_q[d, d], W_k[d, d], W_v[d, d]
buffer keep[M]
S = (X @ W_q) @ (Y @ W_k).T + where(keep > 0, 0, -inf)
O = softmax(S, axis=-1) @ (Y @ W_v)
output O
check invariant(O, (Y, keep))
check invariant(O, (keep, Y), M)
check invariant(O, Y)
check equivariant(O, X)
"""

# A square additive mask given as a buffer: a group moves both of its axes.
SQUARE = """\
attention square_mask
dim N = 3, d = 2
input X[N, d]
param W_q[d, d], W_k[d, d], W_v[d, d]
buffer M[N, N]
S = (X @ W_q) @ (X @ W_k).T + M
O = softmax(S, axis=-1) @ (X @ W_v)
output O
check equivariant(O, (X, M))
check equivariant(O, X)
"""

# A buffer read only inside a where condition, in index notation.
GATE = """\
attention gate
dim N = 3, d = 2
input X[N, d]
param W[d, d]
buffer keep[N]
A[i, j] = where(keep[i] > 0, X[i, j], 2 * X[i, j])
O = tanh(A @ W)
output O
"""


# --- plain NumPy references ----------------------------------------------------------------


def softmax_rows(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row that is -inf everywhere gives zeros (the language's convention)."""
    top = np.max(s, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - safe)
    total = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def key_padding_forward(X, W_q, W_k, W_v, keep):
    d_k = W_q.shape[-1]
    mask = np.where(keep > 0, 0.0, -np.inf)
    s = (X @ W_q) @ (X @ W_k).T / np.sqrt(d_k) + mask[None, :]
    return softmax_rows(s) @ (X @ W_v)


def cross_forward(X, Y, W_q, W_k, W_v, keep):
    s = (X @ W_q) @ (Y @ W_k).T + np.where(keep > 0, 0.0, -np.inf)[None, :]
    return softmax_rows(s) @ (Y @ W_v)


def square_forward(X, W_q, W_k, W_v, M):
    return softmax_rows((X @ W_q) @ (X @ W_k).T + M) @ (X @ W_v)


def gate_forward(X, W, keep):
    a = np.where(keep[:, None] > 0, X, 2 * X)
    return np.tanh(a @ W)


def central_differences(forward, args: dict, upstream: np.ndarray, names, step: float = 1e-6) -> dict:
    """dL/dT for L = sum(forward(**args) * upstream), by central differences in float64."""
    grads = {}
    for name in names:
        value = args[name]
        grad = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            moved = value.copy()
            moved[index] += step
            plus = np.sum(forward(**{**args, name: moved}) * upstream)
            moved[index] -= 2 * step
            minus = np.sum(forward(**{**args, name: moved}) * upstream)
            grad[index] = (plus - minus) / (2 * step)
        grads[name] = grad
    return grads


def verdicts_of(text: str) -> dict[int, object]:
    return {v.line: v for v in symattn.load(text).check()}


def counterexample_arrays(verdict) -> dict[str, np.ndarray]:
    return {k: np.array(v, dtype=np.float64) for k, v in verdict.counterexample.inputs.items()}


@pytest.fixture(scope="module")
def key_padding():
    return symattn.load(KEY_PADDING, filename="key_padding.attn")


@pytest.fixture(scope="module")
def key_padding_verdicts(key_padding):
    return {v.line: v for v in key_padding.check()}


# --- the declaration and the derivation -------------------------------------------------------


def test_buffer_is_given_but_not_differentiable(key_padding):
    typed = key_padding.typed
    assert typed.tensors["keep"].kind == "buffer" and not typed.tensors["keep"].has_gradient
    assert typed.buffers == ("keep",)
    assert typed.given == ("X", "W_q", "W_k", "W_v", "keep")
    assert typed.differentiable == ("X", "W_q", "W_k", "W_v")
    assert "keep  buffer" in key_padding.show()


def test_derive_gives_no_gradient_of_the_buffer(key_padding):
    derivation = key_padding.derive()
    assert "grad(keep)" not in derivation
    with pytest.raises(UnknownGradientError):
        derivation["grad(keep)"]
    assert set(derivation.gradients) == set(key_padding.tensors) - {"keep"}
    # The mask computed from the buffer is an intermediate: it has a gradient, dL/dMk.
    assert derivation["grad(Mk)"].text == "grad(Mk) = sum(grad(S), axis=-2)"
    assert not any("keep" in f.text for f in derivation.values())


def test_numpy_forward_and_backward_against_plain_numpy(key_padding):
    module = key_padding.numpy()
    rng = np.random.default_rng(0)
    args = {"X": rng.standard_normal((4, 3)), "W_q": rng.standard_normal((3, 2)),
            "W_k": rng.standard_normal((3, 2)), "W_v": rng.standard_normal((3, 2)),
            "keep": np.array([1.0, -1.0, 0.5, 0.0])}
    upstream = rng.standard_normal((4, 2))
    np.testing.assert_allclose(module.forward(**args)["O"], key_padding_forward(**args), rtol=1e-12, atol=1e-12)
    gradients = module.backward(**args, grad_O=upstream)
    assert set(gradients) == {"X", "W_q", "W_k", "W_v"}  # no gradient for the buffer
    expected = central_differences(key_padding_forward, args, upstream, gradients)
    for name, value in gradients.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-8, err_msg=name)


def test_numpy_buffer_travels_with_the_batch(key_padding):
    module = key_padding.numpy()
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2, 4, 3))
    keep = np.array([[1.0, 1.0, -1.0, -1.0], [0.0, 1.0, 1.0, 1.0]])
    W = {n: rng.standard_normal((3, 2)) for n in ("W_q", "W_k", "W_v")}
    got = module.forward(X=X, keep=keep, **W)["O"]
    for b in range(2):
        np.testing.assert_allclose(got[b], key_padding_forward(X[b], keep=keep[b], **W), rtol=1e-12, atol=1e-12)


def test_buffer_only_in_a_where_condition():
    spec = symattn.load(GATE)
    derivation = spec.derive()
    assert "grad(keep)" not in derivation and "grad(X)" in derivation
    rng = np.random.default_rng(2)
    args = {"X": rng.standard_normal((3, 2)), "W": rng.standard_normal((2, 2)), "keep": np.array([1.0, -0.5, 0.0])}
    upstream = rng.standard_normal((3, 2))
    gradients = spec.numpy().backward(**args, grad_O=upstream)
    assert set(gradients) == {"X", "W"}
    expected = central_differences(gate_forward, args, upstream, gradients)
    for name, value in gradients.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-8, err_msg=name)


def test_verify_numpy_is_green(tmp_path):
    path = tmp_path / "key_padding.attn"
    path.write_text(KEY_PADDING, encoding="utf-8")
    result = run_cli("verify", str(path), "--target", "numpy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "batch axis [2] on the inputs and buffers" in result.stdout
    assert not re.search(r"backward\s+keep", result.stdout)


# --- claims ------------------------------------------------------------------------------------


def test_equivariance_without_the_buffer_is_refuted(key_padding_verdicts):
    verdict = key_padding_verdicts[LINE["alone"]]
    assert verdict.verdict == "refuted", verdict.method
    assert "keep, a buffer the claim does not permute" in verdict.method
    values = counterexample_arrays(verdict)
    perm = verdict.counterexample.extra["permutation"]
    assert verdict.counterexample.extra["axis"] == 0
    args = {n: values[n] for n in ("X", "W_q", "W_k", "W_v", "keep")}
    left = key_padding_forward(**{**args, "X": args["X"][perm]})  # the tokens move, their padding flags do not
    right = key_padding_forward(**args)[perm]
    assert not np.allclose(left, right)
    np.testing.assert_allclose(np.array(verdict.counterexample.lhs, dtype=float), left, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.array(verdict.counterexample.rhs, dtype=float), right, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("line", [LINE["group"], LINE["group_dim"]])
def test_equivariance_with_the_buffer_in_the_group_is_proved(key_padding_verdicts, line):
    verdict = key_padding_verdicts[line]
    assert verdict.verdict == "proved", verdict.method
    assert verdict.method.startswith("for every N")
    assert ("group", "keep", "keep -> Pi keep") in verdict.steps
    assert verdict.steps[-1][2] == "O(Pi X, Pi keep) = Pi O(X, keep)"


def test_grouped_equivariance_holds_in_plain_numpy():
    """What the proof says, checked at every permutation of 4 tokens with random values."""
    rng = np.random.default_rng(3)
    for _ in range(3):
        args = {"X": rng.standard_normal((4, 3)), "W_q": rng.standard_normal((3, 2)),
                "W_k": rng.standard_normal((3, 2)), "W_v": rng.standard_normal((3, 2)),
                "keep": rng.choice([-1.0, 0.0, 1.0], size=4)}
        base = key_padding_forward(**args)
        for perm in map(list, itertools.permutations(range(4))):
            moved = key_padding_forward(**{**args, "X": args["X"][perm], "keep": args["keep"][perm]})
            np.testing.assert_allclose(moved, base[perm], rtol=1e-12, atol=1e-12)


def test_claims_on_buffers_are_sound(key_padding_verdicts):
    # True for some buffer values only: refuted, never proved.
    assert key_padding_verdicts[LINE["where"]].verdict == "refuted"
    # -inf * 0 is NaN, not 0: the mask computed from a finite buffer may be -inf.
    verdict = key_padding_verdicts[LINE["mask_times_zero"]]
    assert verdict.verdict == "refuted", verdict.method
    values = counterexample_arrays(verdict)
    with np.errstate(invalid="ignore"):
        left = np.where(values["keep"] > 0, 0.0, -np.inf) * 0
    assert np.isnan(left).any()
    assert key_padding_verdicts[LINE["grad_v"]].verdict == "proved"


def test_invariance_with_a_group():
    verdicts = verdicts_of(CROSS)
    assert verdicts[9].verdict == "proved", verdicts[9].method
    assert verdicts[10].verdict == "proved", verdicts[10].method
    assert verdicts[9].steps[-1][2] == "O(Pi Y, Pi keep) = O(Y, keep)"
    assert verdicts[12].verdict == "proved", verdicts[12].method  # keep has no axis of N: permuting X leaves it
    refuted = verdicts[11]
    assert refuted.verdict == "refuted", refuted.method
    values = counterexample_arrays(refuted)
    perm = refuted.counterexample.extra["permutation"]
    args = {n: values[n] for n in ("X", "Y", "W_q", "W_k", "W_v", "keep")}
    left = cross_forward(**{**args, "Y": args["Y"][perm]})
    right = cross_forward(**args)
    assert not np.allclose(left, right)
    np.testing.assert_allclose(np.array(refuted.counterexample.lhs, dtype=float), left, rtol=1e-12, atol=1e-12)
    # and the grouped claim, at every permutation of the source, in plain NumPy
    for perm in map(list, itertools.permutations(range(4))):
        moved = cross_forward(**{**args, "Y": args["Y"][perm], "keep": args["keep"][perm]})
        np.testing.assert_allclose(moved, right, rtol=1e-12, atol=1e-12)


def test_a_group_moves_every_axis_of_a_square_mask():
    verdicts = verdicts_of(SQUARE)
    proved = verdicts[9]
    assert proved.verdict == "proved", proved.method
    assert "element-level witness: exact identity" in proved.method
    assert ("group", "M", "M -> Pi M Pi^T") in proved.steps
    refuted = verdicts[10]
    assert refuted.verdict == "refuted", refuted.method
    values = counterexample_arrays(refuted)
    perm = refuted.counterexample.extra["permutation"]
    args = {n: values[n] for n in ("X", "W_q", "W_k", "W_v", "M")}
    left = square_forward(**{**args, "X": args["X"][perm]})
    assert not np.allclose(left, square_forward(**args)[perm])
    np.testing.assert_allclose(np.array(refuted.counterexample.lhs, dtype=float), left, rtol=1e-12, atol=1e-12)
    rng = np.random.default_rng(4)
    args = {"X": rng.standard_normal((3, 2)), "M": rng.standard_normal((3, 3)),
            **{n: rng.standard_normal((2, 2)) for n in ("W_q", "W_k", "W_v")}}
    base = square_forward(**args)
    for perm in map(list, itertools.permutations(range(3))):
        moved = square_forward(**{**args, "X": args["X"][perm], "M": args["M"][np.ix_(perm, perm)]})
        np.testing.assert_allclose(moved, base[perm], rtol=1e-12, atol=1e-12)


def test_api_equivariance_takes_a_group(key_padding):
    assert key_padding.equivariance("O", ("X", "keep")).verdict == "proved"
    assert key_padding.equivariance("O", ["X", "keep"], dim="N").verdict == "proved"
    assert key_padding.equivariance("O", "X").verdict == "refuted"
    with pytest.raises(UsageError):
        key_padding.equivariance("O", ("X", "W_q"))  # W_q has no axis of N
    with pytest.raises(UsageError):
        key_padding.equivariance("O", ("X", "Q"))  # computed, not given


# --- mistakes ----------------------------------------------------------------------------------

ERR_BASE = "dim N = 4, d = 3, d_k = 2\ninput X[N, d]\nparam W_q[d, d_k]\nbuffer keep[N]\n"  # lines 1-4
ERR_TAIL = "Mk = where(keep > 0, 0, -inf)\nO = X @ W_q\n"  # lines 5-6

ERRORS = [
    ("grad_of_buffer", ERR_BASE + ERR_TAIL + "output O\ncheck grad(keep) == keep\n", SpecCheckError, 8, 12,
     r"^grad of 'keep': it is a buffer, a given tensor that is never differentiated, so it has no gradient$"),
    ("buffer_as_output", ERR_BASE + "output keep\n", SpecNameError, 5, 8, r"^'keep' is a buffer: given, never "),
    ("buffer_name_as_index", ERR_BASE + "A[keep, j] = X[keep, j]\noutput A\n", SpecNameError, 5, 3,
     r"^index 'keep' clashes with the tensor of that name$"),
    ("buffer_redefined", ERR_BASE + "keep = X\noutput keep\n", SpecNameError, 5, 1, r"^redefinition of 'keep'"),
    ("buffer_keyword", ERR_BASE + "buffer = X\noutput X\n", None, 5, None, None),
    ("group_twice", ERR_BASE + ERR_TAIL + "output O\ncheck equivariant(O, (X, keep, X))\n", SpecCheckError, 8, 32,
     r"^'X' is named twice in the group \(first at 8:23\)$"),
    ("group_intermediate", ERR_BASE + ERR_TAIL + "output O\ncheck equivariant(O, (X, Mk))\n", SpecCheckError, 8, 26,
     r"^'Mk' is computed, not declared; permute an input, param or buffer$"),
    ("group_no_axis", ERR_BASE + ERR_TAIL + "output O\ncheck equivariant(O, (X, W_q))\n", SpecCheckError, 8, 26,
     r"^W_q \[d, d_k\] has no axis of dim N$"),
    ("group_no_axis_of_named_dim", ERR_BASE + ERR_TAIL + "output O\ncheck invariant(O, (X, keep), d)\n",
     SpecCheckError, 8, 24, r"^keep \[N\] has no axis of dim d$"),
    ("group_of_expressions", ERR_BASE + ERR_TAIL + "output O\ncheck equivariant(O, (X, keep + 1))\n",
     SpecCheckError, 8, 26, r"^a group lists tensor names"),
    ("group_in_expression", ERR_BASE + "Z = (X, X)\noutput Z\n", SpecShapeError, 5, 5,
     r"^a parenthesised group \(A, B\) only names the tensors"),
    ("group_as_output_of_claim", ERR_BASE + ERR_TAIL + "output O\ncheck equivariant((O, O), X)\n", SpecCheckError,
     8, 7, r"^equivariant takes \(OUTPUT, TENSOR\)"),
]


@pytest.mark.parametrize("text, cls, line, column, message", [pytest.param(*c[1:], id=c[0]) for c in ERRORS])
def test_mistakes_are_located_errors(text, cls, line, column, message):
    with pytest.raises(SpecError) as info:
        symattn.load(text, filename="case.attn")
    err = info.value
    if cls is None:  # `buffer` is a keyword: any located syntax error on that line
        assert err.line == line and "Traceback" not in str(err)
        return
    assert type(err) is cls, str(err)
    assert (err.line, err.column) == (line, column), str(err)
    assert re.search(message, err.message), err.message
    report = str(err).splitlines()
    assert report[0] == f"case.attn:{line}:{column}: error: {err.message}"
    assert report[1] == "    " + text.split("\n")[line - 1]
    assert re.fullmatch(" " * (4 + column - 1) + r"\^~*", report[2]), report[2]


def test_grad_of_buffer_in_a_check_exits_2(tmp_path):
    text = ERRORS[0][1]
    path = tmp_path / "bad.attn"
    path.write_text(text, encoding="utf-8")
    result = run_cli("check", str(path))
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]
    assert first == f"{path}:8:12: error: grad of 'keep': it is a buffer, a given tensor that is never " \
                    "differentiated, so it has no gradient"
    assert "Traceback" not in result.stderr


# --- documents and CUDA ------------------------------------------------------------------------


def test_document_lists_the_buffer_as_given_with_no_gradient(key_padding):
    text = key_padding.document("md")
    assert "| `keep` | buffer | `[N]` | `[4]` |" in text
    assert "`keep` is a buffer: given, never differentiated, so there is no gradient of it" in text
    assert "### grad(keep)" not in text and "### grad(X)" in text


def test_cuda_takes_the_buffer_as_an_input_with_no_gradient(key_padding):
    code = emit_cuda(key_padding.typed)
    p = code.plan
    assert [b.name for b in p.inputs] == ["X", "W_q", "W_k", "W_v", "keep"]
    keep = p.inputs[-1]
    assert keep.batched and keep.kind == "buffer"
    assert [b.note for b in p.gradients] == ["grad(X)", "grad(W_q)", "grad(W_k)", "grad(W_v)"]
    header = code.files[f"{code.prefix}.h"]
    assert "const float* keep" in header and "grad_keep" not in header


@pytest.mark.slow
@needs_nvcc
def test_cuda_compile_gate_with_buffers(tmp_path):
    for text in (SQUARE, CROSS, GATE):
        gate = gate_cached(emit_cuda(symattn.load(text).typed), tmp_path)
        assert gate.ok, gate.problems


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("text", [SQUARE, CROSS, GATE], ids=["square", "cross", "gate"])
def test_cuda_on_the_cpu_with_buffers(tmp_path, text):
    spec = symattn.load(text)
    report = verify_cuda(spec, tsan=False, gate=False, workdir=tmp_path)
    assert set(report.errors) == {*spec.outputs, *(f"grad({x})" for x in spec.typed.differentiable)}
    assert report.ok, report.problems
