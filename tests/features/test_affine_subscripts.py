"""Index arithmetic in subscripts and slicing, end to end, against plain NumPy written here.

A learned relative position bias (`b[j - i + N - 1]`), interleaved RoPE
(`Q[i, 2 * c]`, `Q[i, 2 * c + 1]`) and rotate-half RoPE (`Q[:, 0:h]` and
concat): the reference evaluator, the generated NumPy module and the derived
gradients are held to the same computations written with loops and NumPy
below, to central finite differences, and to NumPy re-evaluations of the
counterexamples `symattn check` reports. Invalid subscripts and slices are
located errors that name what is wrong.
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

import symattn
from conftest import REPO, run_cli
from symattn.check.numpy import verify_numpy
from symattn.errors import SpecShapeError
from symattn.symbolic.evaluate import Evaluator, random_leaves

RELATIVE_BIAS = REPO / "derivations" / "relative_bias.attn"


# --- plain NumPy references ----------------------------------------------------------------


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _bias_matrix(b: np.ndarray, n: int) -> np.ndarray:
    """B[i, j] = b[j - i + n - 1], entry by entry."""
    out = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = b[j - i + n - 1]
    return out


def _relative_bias_attention(X, W_q, W_k, W_v, b):
    """(O, the intermediates the backward needs) of derivations/relative_bias.attn."""
    n, d_k = X.shape[0], W_q.shape[1]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = Q @ K.T / np.sqrt(d_k) + _bias_matrix(b, n)
    P = _softmax(S)
    return P @ V, (P, V)


def _relative_bias_grads(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(grad(S), grad(b)) for L = sum(O * grad(O)), by the textbook softmax backward and diagonal sums."""
    X, W_q, W_k, W_v, b = (np.asarray(inputs[k], dtype=np.float64) for k in ("X", "W_q", "W_k", "W_v", "b"))
    G = np.asarray(inputs["grad(O)"], dtype=np.float64)
    _, (P, V) = _relative_bias_attention(X, W_q, W_k, W_v, b)
    dP = G @ V.T
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    n = X.shape[0]
    db = np.zeros(2 * n - 1)
    for i in range(n):
        for j in range(n):
            db[j - i + n - 1] += dS[i, j]
    return dS, db


def _rope_interleaved(Q: np.ndarray, sign: float = 1.0) -> np.ndarray:
    """Rotate the pairs (2c, 2c + 1) of row i by sign * i * 10000^(-c / h)."""
    n, width = Q.shape
    h = width // 2
    out = np.empty_like(Q)
    for i in range(n):
        for c in range(h):
            angle = sign * i * 10000.0 ** (-c / h)
            x, y = Q[i, 2 * c], Q[i, 2 * c + 1]
            out[i, 2 * c] = x * np.cos(angle) - y * np.sin(angle)
            out[i, 2 * c + 1] = x * np.sin(angle) + y * np.cos(angle)
    return out


def _rope_half(Q: np.ndarray, sign: float = 1.0) -> np.ndarray:
    """GPT-NeoX's rotate-half: Q * cos + rotate_half(Q) * sin, rotate_half(x) = concat(-x2, x1)."""
    n, width = Q.shape
    h = width // 2
    angle = sign * np.arange(n)[:, None] * 10000.0 ** (-np.arange(h)[None, :] / h)
    cos, sin = np.concatenate([np.cos(angle)] * 2, axis=1), np.concatenate([np.sin(angle)] * 2, axis=1)
    rotated = np.concatenate([-Q[:, h:], Q[:, :h]], axis=1)
    return Q * cos + rotated * sin


# --- (a) a learned relative position bias ---------------------------------------------------


def test_relative_bias_verifies_against_the_reference():
    report = verify_numpy(symattn.load(RELATIVE_BIAS).typed)
    assert report.ok, "\n".join(report.lines())
    assert {row.tensor for row in report.rows if row.phase == "backward"} >= {"b", "X", "W_q"}


def test_relative_bias_forward_is_the_plain_numpy_one():
    spec = symattn.load(RELATIVE_BIAS)
    leaves = random_leaves(spec.typed, np.random.default_rng(3))
    want, _ = _relative_bias_attention(*(leaves[k] for k in ("X", "W_q", "W_k", "W_v", "b")))
    assert np.allclose(spec.numpy().forward(**leaves)["O"], want, rtol=1e-12, atol=1e-12)
    assert np.allclose(Evaluator(spec.typed).run(leaves)["O"], want, rtol=1e-12, atol=1e-12)


def test_relative_bias_grad_b_matches_central_differences():
    spec = symattn.load(RELATIVE_BIAS).with_dims(N=5)
    rng = np.random.default_rng(7)
    leaves = random_leaves(spec.typed, rng)
    upstream = rng.standard_normal((5, 2))
    got = spec.numpy().backward(**leaves, grad_O=upstream)["b"]

    def loss(b):
        out, _ = _relative_bias_attention(leaves["X"], leaves["W_q"], leaves["W_k"], leaves["W_v"], b)
        return float(np.sum(out * upstream))

    step = 1e-6
    want = np.zeros_like(leaves["b"])
    for t in range(want.size):
        up, down = leaves["b"].copy(), leaves["b"].copy()
        up[t] += step
        down[t] -= step
        want[t] = (loss(up) - loss(down)) / (2 * step)
    assert got.shape == (9,)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-8), (got, want)


def test_relative_bias_numpy_code_is_a_gather_and_a_scatter_in_quadratic_memory():
    spec = symattn.load(RELATIVE_BIAS)
    source = spec.emit("numpy")
    # the bias is gathered with an [N, N] array of positions, and its gradient added back at them
    assert "b[..., np.arange(N)[None, :] - np.arange(N)[:, None] + N - 1]" in source
    assert re.search(r"db = _scatter\(\w+, \(np\.arange\(N\)\[None, :\] - np\.arange\(N\)\[:, None\] \+ N - 1,\)",
                     source)
    body = source.split("def _forward_backward")[1].split("\ndef ")[0]
    assert "np.eye" not in body and "einsum" not in body  # no one-hot [N, N, 2N - 1] tensor
    n, width = 256, 8
    sizes = {"N": n, "d": width, "d_k": width}
    module = spec.numpy()
    leaves = random_leaves(spec.typed, np.random.default_rng(1), sizes=sizes)
    upstream = np.ones((n, width))
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    module.forward_backward(**leaves, grad_O=upstream)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    square = n * n * 8  # one [N, N] float64 array; a one-hot [N, N, 2N - 1] would be 511 of them
    assert peak < 8 * square, peak / square


# --- (b) interleaved RoPE ---------------------------------------------------------------------

ROPE_INTERLEAVED = """
dim N = 5, h = 3
input Q[N, 2 * h]
Cos[i:N, c:h] = cos(i * 10000^(-c / h))
Sin[i:N, c:h] = sin(i * 10000^(-c / h))
R[c:h, i:N, p:2] = where(p == 0, Q[i, 2 * c] * Cos[i, c] - Q[i, 2 * c + 1] * Sin[i, c], Q[i, 2 * c] * Sin[i, c] + Q[i, 2 * c + 1] * Cos[i, c])
Qr = merge_heads(R)
output Qr
"""

# The same rotation entry by entry, the pair index c read only inside subscript arithmetic (so its range is given).
ROPE_BY_ENTRY = """
dim N = 5, h = 3
input Q[N, 2 * h]
Qr[i:N, k:2 * h] = sum(c:h, where(k == 2 * c, Q[i, 2 * c] * cos(i * 10000^(-c / h)) - Q[i, 2 * c + 1] * sin(i * 10000^(-c / h)), 0) + where(k == 2 * c + 1, Q[i, 2 * c] * sin(i * 10000^(-c / h)) + Q[i, 2 * c + 1] * cos(i * 10000^(-c / h)), 0))
output Qr
"""

ROPE_HALF = """
dim N = 5, h = 3
input Q[N, 2 * h]
Cos[i:N, c:h] = cos(i * 10000^(-c / h))
Sin[i:N, c:h] = sin(i * 10000^(-c / h))
Q1 = Q[:, 0:h]
Q2 = Q[:, h:]
Qr = concat(Q1 * Cos - Q2 * Sin, Q2 * Cos + Q1 * Sin, axis=-1)
output Qr
"""


@pytest.mark.parametrize("text, rope", [(ROPE_INTERLEAVED, _rope_interleaved), (ROPE_BY_ENTRY, _rope_interleaved),
                                        (ROPE_HALF, _rope_half)], ids=["interleaved", "by_entry", "half"])
def test_rope_forward_and_backward_against_numpy(text, rope):
    spec = symattn.load(text)
    rng = np.random.default_rng(5)
    Q = rng.standard_normal((5, 6))
    G = rng.standard_normal((5, 6))
    module = spec.numpy()
    assert np.allclose(module.forward(Q=Q)["Qr"], rope(Q), rtol=1e-12, atol=1e-12)
    assert np.allclose(Evaluator(spec.typed).run({"Q": Q})["Qr"], rope(Q), rtol=1e-12, atol=1e-12)
    # a rotation's gradient is the rotation by the opposite angle
    assert np.allclose(module.backward(Q=Q, grad_Qr=G)["Q"], rope(G, sign=-1.0), rtol=1e-12, atol=1e-12)
    batch = rng.standard_normal((2, 5, 6))
    assert np.allclose(module.forward(Q=batch)["Qr"], np.stack([rope(q) for q in batch]), rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_rope_reference_specs_verify():
    for name in ("rope_interleaved", "rope_half"):
        report = verify_numpy(symattn.load(REPO / "derivations" / f"{name}.attn").typed)
        assert report.ok, "\n".join(report.lines())


def test_interleaved_rope_gradient_is_a_strided_scatter():
    derivation = symattn.load(ROPE_INTERLEAVED).derive()
    text = derivation.formula("Q")  # spec text: each scatter a check-only definition in its gather form
    assert text.endswith("\ngrad(Q) = dQ_1 + dQ_2")
    assert "where(2 * c == m" in text and "where(2 * c + 1 == m" in text
    assert derivation.one_line("Q").startswith("grad(Q)[l, m] = ")  # the caption: one entry formula
    source = symattn.load(ROPE_INTERLEAVED).emit("numpy")
    assert "2 * np.arange(h)" in source and "_scatter(" in source


# --- (d) errors ---------------------------------------------------------------------------------

ERRORS = [
    ("leaves_range", "dim N = 4\nparam b[2 * N - 1]\nB[i:N, j:N] = b[j - i]\noutput B\n", 3, 17,
     r"^subscript j - i of b leaves its range: it is -N \+ 1 at j = 0, i = N - 1 \(j in \[0, N\), i in \[0, N\)\), "
     r"outside axis 0 of b, \[0, 2 \* N - 1\)"),
    ("past_the_end", "dim N = 4\nparam b[2 * N - 1]\nB[i:N, j:N] = b[j - i + N]\noutput B\n", 3, 17,
     r"^subscript j - i \+ N of b leaves its range: it is 2 \* N - 1 at j = N - 1, i = 0"),
    ("not_for_every_size", "dim N = 4, d = 8, h = 4\ninput Q[N, d]\nZ[i:N, c:h] = Q[i, 2 * c + 1]\noutput Z\n", 3, 20,
     r"^subscript 2 \* c \+ 1 of Q leaves its range: it is 2 \* h - 1 at c = h - 1 .*; at d=1, h=1 that is -1$"),
    ("non_integer_coefficient", "dim N = 4, d = 2\ninput Q[N, d]\nZ[i:N, c:d] = Q[i, c / 2]\noutput Z\n", 3, 22,
     r"^a subscript cannot divide: the coefficients of its indices are integers$"),
    ("dim_coefficient", "dim N = 4\ninput v[N * N]\nZ[i:N, j:N] = v[N * i + j]\noutput Z\n", 3, 19,
     r"^the coefficient of an index in a subscript must be an integer, not N$"),
    ("product_of_indices", "dim N = 4\ninput v[N * N]\nZ[i:N, j:N] = v[i * j]\noutput Z\n", 3, 19,
     r"^a subscript is affine in the indices: this multiplies two indices$"),
    ("function_in_subscript", "dim N = 4\ninput v[N]\nZ[i:N] = v[exp(i)]\noutput Z\n", 3, 12,
     r"^a subscript is an integer, but exp\(i\) is real$"),
    ("range_only_in_arithmetic", "dim N = 4, h = 2\ninput Q[N, 2 * h]\nZ[i:N, c] = Q[i, 2 * c]\noutput Z\n", 3, 8,
     r"^cannot infer the range of index 'c' \(it appears only inside subscript arithmetic\)$"),
    ("slice_beyond_dim", "dim N = 4, d = 3\ninput X[N, d]\nY = X[:, 0:d + 1]\noutput Y\n", 3, 12,
     r"^the slice 0:d \+ 1 of axis 1 of X is out of bounds: it ends after d, the size of axis 1 of X$"),
    ("slice_reversed", "dim N = 4, d = 3\ninput X[N, d]\nY = X[2:1, :]\noutput Y\n", 3, 7,
     r"^the slice 2:1 of axis 0 of X is out of bounds: its start 2 is after its end 1$"),
    ("slice_not_for_every_size", "dim N = 4, d = 3\ninput X[N, d]\nY = X[0:2, :]\noutput Y\n", 3, 9,
     r"^the slice 0:2 of axis 0 of X is out of bounds: it ends after N, the size of axis 0 of X \(at N=1\)$"),
    ("slice_empty", "dim N = 4, d = 3\ninput X[N, d]\nY = X[:, d:d]\noutput Y\n", 3, 10,
     r"^the slice d:d of axis 1 of X is empty at N=4, d=3$"),
    ("slice_in_index_notation", "dim N = 4\ninput X[N, N]\nY[i:N] = X[i, 0:2]\noutput Y\n", 3, 15,
     r"^a slice start:stop works on whole tensors"),
    ("integer_subscript_in_matrix_notation", "dim N = 4\ninput X[N, N]\nY = X[:, 0]\noutput Y\n", 3, 10,
     r"^in matrix notation a subscript is a slice, start:stop or :$"),
]


@pytest.mark.parametrize("text, line, column, message", [pytest.param(*e[1:], id=e[0]) for e in ERRORS])
def test_invalid_subscripts_and_slices(text, line, column, message):
    with pytest.raises(SpecShapeError) as info:
        symattn.load(text, filename="bad.attn")
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert re.search(message, err.message), err.message


def test_subscript_error_on_the_command_line(tmp_path):
    path = tmp_path / "bad.attn"
    path.write_text(ERRORS[0][1], encoding="utf-8")
    done = run_cli("show", str(path))
    assert done.returncode == 2
    assert f"{path}:3:17: error: subscript j - i of b leaves its range" in done.stderr
    assert "Traceback" not in done.stderr and "^~~~~" in done.stderr


# --- (e) claims ---------------------------------------------------------------------------------

CLAIMS = RELATIVE_BIAS.read_text("utf-8").split("# grad(b) sums")[0] + """
check grad(b)[0:1] == grad(S)[N - 1:N, 0:1]
check grad(b)[N - 1:N] == sum(grad(S) * eye(N))
check grad(b)[0:1] == grad(S)[0:1, N - 1:N]
"""


def test_relative_bias_claims_are_proved_and_refuted_by_numpy_too():
    spec = symattn.load(CLAIMS)
    first, diagonal, false = spec.check()
    assert first.verdict == "proved" and "for all sizes" in first.method and "not shown" not in first.method
    assert diagonal.verdict == "proved"
    assert false.verdict == "refuted" and false.counterexample is not None
    # the counterexample, re-evaluated in plain NumPy: grad(b)[0] and grad(S)[0, N - 1] differ there
    dS, db = _relative_bias_grads(false.counterexample.inputs)
    assert abs(db[0] - dS[0, -1]) > 1e-3
    assert np.isclose(db[0], dS[-1, 0]) and np.isclose(db[3], np.trace(dS))
    # and the true claims hold in plain NumPy at random inputs
    rng = np.random.default_rng(2)
    inputs = {k: rng.standard_normal(v.shape) for k, v in random_leaves(spec.typed, rng).items()}
    inputs["grad(O)"] = rng.standard_normal((4, 2))
    dS, db = _relative_bias_grads(inputs)
    assert np.isclose(db[0], dS[-1, 0]) and np.isclose(db[3], np.trace(dS)) and np.isclose(db.sum(), dS.sum())


def test_slice_gradients_are_proved_for_every_size():
    """grad(Q) is the two halves' gradients padded back: the matrix level sees it at every size."""
    text = (REPO / "derivations" / "rope_half.attn").read_text("utf-8").split("# The backward")[0]
    spec = symattn.load(text + "check grad(Q)[:, h:2 * h] == grad(Q2)\ncheck grad(Q)[:, 0:h] == grad(Q2)\n")
    second, wrong = spec.check()
    assert second.verdict == "proved" and "for all sizes" in second.method
    assert wrong.verdict == "refuted"
    inputs = {k: np.asarray(v, dtype=np.float64) for k, v in wrong.counterexample.inputs.items()}
    # plain NumPy: grad(Q)[:, 0:h] is grad(Q1), which is not grad(Q2) at the counterexample
    X, W_q, W_k, W_v = inputs["X"], inputs["W_q"], inputs["W_k"], inputs["W_v"]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    Qr, Kr = _rope_half(Q), _rope_half(K)
    P = _softmax(Qr @ Kr.T / 2.0)
    dP = inputs["grad(O)"] @ V.T
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True)) / 2.0
    dQ = _rope_half(dS @ Kr, sign=-1.0)
    assert np.abs(dQ[:, :2] - dQ[:, 2:]).max() > 1e-3


def test_reference_specs_check_green():
    for name in ("relative_bias", "rope_interleaved", "rope_half"):
        done = run_cli("check", f"derivations/{name}.attn", timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "refuted" not in done.stdout.replace("is refuted", "") and "unknown" not in done.stdout


def test_derived_gradients_are_exact_at_the_element_level():
    checks = symattn.load(RELATIVE_BIAS).verify_gradients()
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert "b" in {c.tensor for c in checks}


# --- CUDA ---------------------------------------------------------------------------------------


def test_relative_bias_cuda_reads_and_scatters_with_index_arithmetic():
    """The fused kernels read the table at j - i + N - 1 in the score and add dS there atomically; the generic
    kernels (the spec unfused) gather B and scatter grad(b) by solving the subscript for each entry."""
    from symattn.codegen.cuda import emit_cuda

    fused = symattn.load(RELATIVE_BIAS).emit("cuda")
    assert fused.path == "fused"
    text = fused.files[fused.source_name]
    assert "+ b[((j_ - i_ + N - 1))];" in text
    assert "atomicAdd(&grad_b_per_entry[b_ * (long long)(-1 + (2 * N)) + ((j_ - i_ + N - 1))], dsc_ * " in text
    code = emit_cuda(symattn.load(RELATIVE_BIAS), fused=False)
    source = code.files[code.source_name]
    assert "B[e_] = b[((j - i + N - 1))];" in source  # the gather: one read per entry
    # the scatter in its gather form: each entry of grad(b) sums one diagonal, j = l + i - N + 1 solved
    assert re.search(r"for \(int i = 0; i < N; \+\+i\) \{\n\s+sum1_ \+= \(\(\(\(l \+ i\) - N\) \+ 1\) >= 0 \?", source)
    assert "grad_B[(long long)i * N + ((l + i - N + 1))]" in source


@pytest.mark.slow
def test_relative_bias_cuda_compiles(tmp_path):
    from symattn.check.cuda import compile_gate, find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found: the compile gate needs the CUDA toolkit")
    code = symattn.load(RELATIVE_BIAS).emit("cuda")
    code.write(tmp_path)
    gate = compile_gate(tmp_path / code.source_name)
    assert gate.ok, gate.problems
    assert {k.name for k in gate.kernels} >= set(code.kernel_names())
