"""Generated code and `verify` at the edges: each against an independent computation.

- a stable sigmoid in every target (log(sigmoid(-40)) finite in float64, -20 in float32);
- dim arithmetic such as `(N + 1) / 2` printed as exact integer arithmetic, in NumPy and CUDA,
  and refused where it does not divide, as the reference evaluator refuses it;
- one definition of equal in `verify` (within tolerance, or non-finite in the same way);
- an output that is an alias of an input (`O = X`);
- the size guard (`symattn.ir.sizes`) in verify and in the counterexample search.

Expectations are plain NumPy written here (np.logaddexp, hand-derived gradients), central
finite differences, or exact integer facts (divisibility), never the code under test.
CUDA runs on the CPU emulation need g++ (nvcc only for the compile gate) and skip without it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import symattn
from conftest import run_cli
from symattn.codegen.arrays.numpy_runtime import _sigmoid
from symattn.errors import UsageError
from symattn.symbolic.evaluate import NUMERIC, Evaluator
from symattn.ir.sizes import VERIFY_BUDGET, constraints, entries, fit_sizes, repair, valid_sizes
from symattn.check.numpy import relative_error, verify_numpy
from symattn.check.cuda import find_cxx
from symattn.check.cuda import relative_error as cuda_relative_error

CXX = find_cxx()
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found: running the CUDA kernels on the CPU needs C++20")


def stable_sigmoid(x):
    """1 / (1 + exp(-x)) as exp(-log(1 + exp(-x))), by NumPy's own logaddexp."""
    return np.exp(-np.logaddexp(0, -x))


def no_traceback(done) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr


# --- 1. sigmoid --------------------------------------------------------------------------------


LOG_SIGMOID = """
dim N = 6
input z[N]
O = log(sigmoid(z))
output O
"""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_helper_matches_logaddexp_everywhere(dtype):
    x = np.concatenate([np.linspace(-700, 700, 2001), [-1e4, 1e4, -np.inf, np.inf, 0.0]]).astype(dtype)
    got = _sigmoid(x)
    want = stable_sigmoid(x.astype(np.float64))
    assert got.dtype == dtype
    eps, tiny = np.finfo(dtype).eps, np.finfo(dtype).tiny
    normal = want > tiny  # where `want` is a normal number of this dtype: relative error of a few ulps,
    # plus |x| ulps of float64 that exp(-logaddexp(0, -x)) itself loses for large |x|
    slack = 8 * eps + np.abs(x[normal].astype(np.float64)) * np.finfo(np.float64).eps
    assert np.all(np.abs(got[normal] - want[normal]) <= slack * want[normal])
    assert np.all(np.abs(got[~normal]) <= 2 * tiny)  # subnormal or 0 where the true value is below tiny


def test_generated_log_sigmoid_is_finite_at_minus_40_in_float64_and_minus_20_in_float32():
    module = symattn.load(LOG_SIGMOID).numpy()
    z = np.array([-40.0, -30.0, -20.0, -1.0, 0.0, 35.0])
    out = module.forward(z=z)["O"]
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, -np.logaddexp(0, -z), rtol=1e-14, atol=1e-15)  # sigmoid(35) rounds
    assert out[0] == pytest.approx(-40 - np.log1p(np.exp(-40)), rel=1e-15)
    grad = module.backward(z=z, grad_O=np.ones_like(z))["z"]
    assert np.all(np.isfinite(grad))
    # d/dz log(sigmoid(z)) = 1 - sigmoid(z) = sigmoid(-z); and by central differences of the formula
    np.testing.assert_allclose(grad, stable_sigmoid(-z), rtol=1e-12, atol=1e-15)  # 1 - sigmoid(35) rounds
    step = 1e-6
    central = (-np.logaddexp(0, -(z + step)) + np.logaddexp(0, -(z - step))) / (2 * step)
    np.testing.assert_allclose(grad, central, rtol=1e-6, atol=1e-9)

    z32 = np.array([-20.0, -10.0, 0.0, 5.0, -80.0, 12.0], dtype=np.float32)
    out32 = module.forward(z=z32)["O"]
    assert out32.dtype == np.float32 and np.all(np.isfinite(out32))
    np.testing.assert_allclose(out32, -np.logaddexp(0, -z32.astype(np.float64)), rtol=1e-6, atol=2e-7)
    assert np.all(np.isfinite(module.backward(z=z32, grad_O=np.ones_like(z32))["z"]))


def test_reference_evaluator_log_sigmoid_is_finite():
    spec = symattn.load(LOG_SIGMOID).typed
    z = np.array([-40.0, -30.0, -20.0, -1.0, 0.0, 35.0])
    out = Evaluator(spec, NUMERIC).run({"z": z})["O"]
    np.testing.assert_allclose(out, -np.logaddexp(0, -z), rtol=1e-14, atol=1e-15)


@needs_cxx
def test_cuda_log_sigmoid_is_finite_in_float32(tmp_path):
    """The emitted CUDA, built for the CPU: sa_sigmoid never rounds sigmoid(-80) to 0 in float32."""
    from symattn.check.cuda import _concrete, _Runner, build_cpu

    code = symattn.load(LOG_SIGMOID).emit("cuda")
    p = code.plan
    z = np.array([[-80.0, -40.0, -20.0, 0.0, 5.0, 35.0]], dtype=np.float32)
    arrays = {id(p.inputs[0]): z, id(p.upstream[0]): np.ones_like(z)}
    for b in (*p.outputs, *p.gradients):
        arrays[id(b)] = np.full(_concrete(b, {"N": 6}, 1), np.nan, np.float32)
    _Runner(build_cpu(code, tmp_path), code)(arrays, [6, 1])
    out, grad = arrays[id(p.outputs[0])][0], arrays[id(p.gradients[0])][0]
    z64 = z[0].astype(np.float64)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(out, -np.logaddexp(0, -z64), rtol=1e-6, atol=2e-7)
    np.testing.assert_allclose(grad, stable_sigmoid(-z64), rtol=1e-6, atol=2e-7)


# --- 2. dim arithmetic ----------------------------------------------------------------------------


HALF = """
dim N = 5, d = 3
input X[N, d], Y[(N + 1) / 2, d]
S = X.T @ X
Z = Y @ S
output Z
"""


def half_by_hand(X, Y, dZ):
    """Z = Y @ X.T X and its gradients, derived by hand."""
    S = X.T @ X
    dS = Y.T @ dZ
    return Y @ S, X @ (dS + dS.T), dZ @ S.T


def test_numpy_prints_exact_integer_division():
    source = symattn.load(HALF).emit("numpy")
    assert "(N + 1) // 2" in source and "1 / 2" not in source and "N // 2" not in source
    assert "[(N + 1) / 2, d]" in source  # the docstring and messages show the spec's own form
    module = symattn.load(HALF).numpy()
    rng = np.random.default_rng(1)
    X, Y, dZ = rng.standard_normal((5, 3)), rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    Z, dX, dY = half_by_hand(X, Y, dZ)
    np.testing.assert_allclose(module.forward(X=X, Y=Y)["Z"], Z, rtol=1e-12)
    grads = module.backward(X=X, Y=Y, grad_Z=dZ)
    np.testing.assert_allclose(grads["X"], dX, rtol=1e-12)
    np.testing.assert_allclose(grads["Y"], dY, rtol=1e-12)
    # N = 9 at run time: (9 + 1) / 2 = 5 rows of Y
    X9, Y9, dZ9 = rng.standard_normal((9, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    np.testing.assert_allclose(module.forward(X=X9, Y=Y9)["Z"], half_by_hand(X9, Y9, dZ9)[0], rtol=1e-12)


@pytest.mark.parametrize("rows", [2, 3])
def test_a_size_at_which_the_quotient_does_not_divide_is_refused_by_numpy_and_the_evaluator(rows):
    """N = 4: (N + 1) / 2 = 5/2 is no size; both refuse, whatever Y's row count."""
    spec = symattn.load(HALF)
    X, Y = np.ones((4, 3)), np.ones((rows, 3))
    with pytest.raises(ValueError, match=r"\(N \+ 1\) / 2|expected shape"):
        spec.numpy().forward(X=X, Y=Y)
    with pytest.raises(UsageError, match=r"\(N \+ 1\) / 2 is 5/2 at N=4, d=3, not a whole size"):
        Evaluator(spec.typed, NUMERIC, {"N": 4, "d": 3}).run({"X": X, "Y": Y})
    with pytest.raises(UsageError, match=r"Y: expected shape \[\(N \+ 1\) / 2, d\] = \[3, 3\]"):
        Evaluator(spec.typed, NUMERIC, {"N": 5, "d": 3}).run({"X": np.ones((5, 3)), "Y": Y[:2]})


def test_validation_refuses_the_quotient_at_the_spec_sizes():
    with pytest.raises(symattn.SpecError, match=r"\(N \+ 1\) / 2 is 5/2 at N=4, d=3, not a positive integer"):
        symattn.load(HALF.replace("N = 5", "N = 4"))


def test_cli_verify_numpy_dim_arithmetic(tmp_path):
    path = tmp_path / "half.attn"
    path.write_text(HALF)
    done = run_cli("verify", str(path))
    no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "larger sizes (N=9, d=6)" in done.stdout  # doubled, then N made odd again
    bad = run_cli("verify", str(path), "--dim", "N=4")
    no_traceback(bad)
    assert bad.returncode == 2 and "(N + 1) / 2 is 5/2" in bad.stderr


def test_cuda_prints_exact_integer_division():
    code = symattn.load(HALF).emit("cuda")
    source = code.files[code.source_name]
    assert "((1 + N) / 2)" in source and "1 / 2" not in source.replace("(1 + N) / 2", "")
    assert "if ((1 + N) % 2 != 0) return SYMATTN_BAD_SIZE;" in source


@needs_cxx
def test_cuda_dim_arithmetic_runs_on_the_cpu(tmp_path):
    from symattn.check.cuda import _concrete, _Runner, build_cpu

    code = symattn.load(HALF).emit("cuda")
    runner = _Runner(build_cpu(code, tmp_path), code)
    p = code.plan
    rng = np.random.default_rng(2)
    sizes = {"N": 7, "d": 3}
    X, Y, dZ = (rng.standard_normal(s).astype(np.float32) for s in ((1, 7, 3), (1, 4, 3), (1, 4, 3)))
    given = {"X": X, "Y": Y}
    arrays = {}
    for name, b in zip(code.plan.spec.given, p.inputs):
        arrays[id(b)] = np.ascontiguousarray(given[name])
    arrays[id(p.upstream[0])] = dZ
    for b in (*p.outputs, *p.gradients):
        arrays[id(b)] = np.full(_concrete(b, sizes, 1), np.nan, np.float32)
    runner(arrays, [7, 3, 1])
    Z, dX, dY = half_by_hand(X[0].astype(np.float64), Y[0].astype(np.float64), dZ[0].astype(np.float64))
    np.testing.assert_allclose(arrays[id(p.outputs[0])][0], Z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(arrays[id(p.gradients[0])][0], dX, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(arrays[id(p.gradients[1])][0], dY, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="returned -1"):  # N = 6: (N + 1) / 2 does not divide
        runner(arrays, [6, 3, 1])


# --- 3. what equal means in verify --------------------------------------------------------------


@pytest.mark.parametrize("compare", [relative_error, cuda_relative_error], ids=["numpy", "cuda"])
def test_equal_within_tolerance_or_non_finite_in_the_same_way(compare):
    inf, nan = np.inf, np.nan
    assert compare([-inf, 1.0, nan], [-inf, 1.0, nan]) == 0.0
    assert compare([inf, -inf], [inf, -inf]) == 0.0
    assert compare([-inf, 2.0], [-inf, 2.0 + 2e-12]) == pytest.approx(1e-12)
    assert compare([inf, 1.0], [-inf, 1.0]) == inf
    assert compare([nan, 1.0], [inf, 1.0]) == inf
    assert compare([1.0, 1.0], [-inf, 1.0]) == inf
    assert compare([nan], [0.5]) == inf
    assert compare([1.0, 2.0], [1.0, 2.0, 3.0]) == inf
    # an output that reads no batched tensor comes back without the batch axes: broadcast
    assert compare([1.0, 2.0], [[1.0, 2.0], [1.0, 2.0]]) == 0.0
    assert compare([1.0, 2.0], [[1.0, 2.0], [1.0, 2.5]]) > 0.1


MASKED_LSE = """
dim N = 4
input X[N, N]
B[i:N, j:N] = where(i < 1, -inf, 0)
L = logsumexp(X + B, axis=-1)
output L
"""

SCALAR_OUT = """
dim N = 3, d = 2
input X[N, d]
param w
O = X * w
s = w * w
output O, s
"""


def test_fully_masked_logsumexp_row_verifies():
    spec = symattn.load(MASKED_LSE)
    X = np.random.default_rng(3).standard_normal((4, 4))
    out = spec.numpy().forward(X=X)["L"][:, 0]
    assert out[0] == -np.inf
    np.testing.assert_allclose(out[1:], np.logaddexp.reduce(X[1:], axis=-1), rtol=1e-14)
    grad = spec.numpy().backward(X=X, grad_L=np.ones((4, 1)))["X"]
    np.testing.assert_array_equal(grad[0], 0.0)  # the masked row: d(-inf)/dX = 0, not NaN
    weights = np.exp(X[1:] - np.logaddexp.reduce(X[1:], axis=-1, keepdims=True))
    np.testing.assert_allclose(grad[1:], weights, rtol=1e-12)
    report = verify_numpy(spec.typed)
    assert report.ok, "\n".join(report.lines())


def test_scalar_output_with_batch_axes_verifies():
    report = verify_numpy(symattn.load(SCALAR_OUT).typed)
    assert report.ok, "\n".join(report.lines())


def test_cli_verify_exit_status(tmp_path):
    path = tmp_path / "lse.attn"
    path.write_text(MASKED_LSE)
    done = run_cli("verify", str(path))
    no_traceback(done)
    assert done.returncode == 0 and "8 of 8 tensors within tolerance" in done.stdout, done.stdout + done.stderr


# --- 4. an output that is an alias ------------------------------------------------------------


ALIAS = """
dim N = 3, d = 2
input X[N, d]
param W[d, d]
Y = X
O = Y @ W
P = Y
output O, P
"""


def test_alias_output_emits_and_runs(tmp_path):
    path = tmp_path / "alias.attn"
    path.write_text("dim N = 3, d = 2\ninput X[N, d]\nO = X\noutput O\n")
    done = run_cli("emit", "numpy", str(path), "-o", str(tmp_path / "alias.py"))
    no_traceback(done)
    assert done.returncode == 0, done.stderr
    cuda = run_cli("emit", "cuda", str(path), "-o", str(tmp_path / "alias_cuda"))
    assert cuda.returncode == 0, cuda.stderr

    module = symattn.load(ALIAS).numpy()
    rng = np.random.default_rng(4)
    X, W, dO, dP = (rng.standard_normal(s) for s in ((3, 2), (2, 2), (3, 2), (3, 2)))
    out = module.forward(X=X, W=W)
    np.testing.assert_array_equal(out["P"], X)
    np.testing.assert_allclose(out["O"], X @ W, rtol=1e-14)
    keep = dP.copy()
    grads = module.backward(X=X, W=W, grad_O=dO, grad_P=dP)
    np.testing.assert_allclose(grads["X"], dO @ W.T + dP, rtol=1e-14)
    np.testing.assert_allclose(grads["W"], X.T @ dO, rtol=1e-14)
    np.testing.assert_array_equal(dP, keep)  # the caller's upstream gradient is not written to
    report = verify_numpy(symattn.load(ALIAS).typed)
    assert report.ok, "\n".join(report.lines())


@needs_cxx
def test_alias_output_verifies_on_the_cuda_cpu_build(tmp_path):
    from symattn.check.cuda import verify_cuda

    report = verify_cuda(symattn.load(ALIAS), gate=False, tsan=False, workdir=tmp_path)
    assert report.ok, report.problems


# --- 5. the size guard ----------------------------------------------------------------------------


HEADS_HUGE = """
dim N = 1000000000, d = 6, h = 3
input X[N, d]
param W[d, d]
Z = split_heads(X @ W, h)
O = merge_heads(softmax(Z @ Z.T, axis=-1) @ Z)
output O
"""


def by_hand_entries(n, d, h):
    """Entries of every array of HEADS_HUGE, counted here: X, W, X @ W, Z, Z.T, Z @ Z.T, softmax, @ Z, O."""
    return n * d + d * d + n * d + n * d + n * d + h * n * n + h * n * n + n * d + n * d


def test_fit_sizes_shrinks_and_keeps_split_heads_divisible():
    spec = symattn.load(HEADS_HUGE).typed
    assert {str(c.dim) for c in constraints(spec)} >= {"N", "d", "h", "d/h"}
    choice = fit_sizes(spec, VERIFY_BUDGET)
    n, d, h = (choice.sizes[k] for k in ("N", "d", "h"))
    assert choice.shrunk and n < 1000 and d == 6 and h == 3
    assert entries(spec, choice.sizes) == by_hand_entries(n, d, h) <= VERIFY_BUDGET
    assert choice.note("verify") == f"verify at N={n} instead of N=1000000000 (size guard)"
    tight = fit_sizes(spec, 60)  # so small that d and h must shrink too: d / h stays whole
    assert tight.sizes["d"] % tight.sizes["h"] == 0 and valid_sizes(spec, tight.sizes)
    assert entries(spec, tight.sizes) <= 60
    assert not valid_sizes(spec, {"N": 4, "d": 5, "h": 3})
    fixed = repair(spec, {"N": 4, "d": 5, "h": 3}, movable=["d"])
    assert fixed == {"N": 4, "d": 6, "h": 3} or fixed == {"N": 4, "d": 3, "h": 3}


@settings(max_examples=40, deadline=None)
@given(budget=st.integers(min_value=60, max_value=10**6), start=st.integers(min_value=1, max_value=10**9))
def test_fit_sizes_property(budget, start):
    """Whatever the budget and the requested N: whole sizes (h divides d), within the budget by hand."""
    spec = symattn.load(HEADS_HUGE).typed
    choice = fit_sizes(spec, budget, sizes={"N": start, "d": 6, "h": 3})
    n, d, h = (choice.sizes[k] for k in ("N", "d", "h"))
    assert min(n, d, h) >= 1 and d % h == 0
    assert by_hand_entries(n, d, h) <= budget
    assert n <= start and d <= 6 and h <= 3
    if by_hand_entries(start, 6, 3) <= budget:
        assert not choice.shrunk


def test_fit_sizes_keeps_an_odd_n_for_half():
    spec = symattn.load(HALF.replace("N = 5", "N = 999999999")).typed
    choice = fit_sizes(spec, 5_000)
    assert choice.shrunk and (choice.sizes["N"] + 1) % 2 == 0 and entries(spec, choice.sizes) <= 5_000


def test_user_sizes_win_unless_huge():
    small = symattn.load(HEADS_HUGE, dims={"d": 12}).typed
    choice = fit_sizes(small, VERIFY_BUDGET, fixed=["d"])
    assert choice.sizes["d"] == 12 and choice.sizes["N"] < 1000
    huge = symattn.load("dim N = 4, d = 3\ninput X[N, d]\nO = X @ X.T\noutput O\n", dims={"N": 10**8}).typed
    assert fit_sizes(huge, VERIFY_BUDGET, fixed=["N"], fixed_budget=10**6).sizes["N"] < 10**4
    kept = symattn.load("dim N = 4, d = 3\ninput X[N, d]\nO = X @ X.T\noutput O\n", dims={"N": 200}).typed
    assert fit_sizes(kept, VERIFY_BUDGET, fixed=["N"], fixed_budget=10**6).sizes == {"N": 200, "d": 3}


def test_verify_numpy_under_the_size_guard():
    spec = symattn.load("dim N = 1000000000, d = 2\ninput X[N, d]\nparam w\nO = X * w\noutput O\n").typed
    report = verify_numpy(spec, budget=200)
    assert report.ok and report.sizes["N"] < 100
    assert report.lines()[0] == f"verify at N={report.sizes['N']} instead of N=1000000000 (size guard)"


def test_cli_verify_numpy_under_the_size_guard(tmp_path):
    path = tmp_path / "huge.attn"
    path.write_text("dim N = 1000000000, d = 2\ninput X[N, d]\nO = softmax(X @ X.T, axis=-1) @ X\noutput O\n")
    done = run_cli("verify", str(path), "--dim", "d=1")
    no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "instead of N=1000000000 (size guard)" in done.stdout


CAUSAL_HUGE = """
dim N = 1000000000, d = 2
input X[N, d]
M = causal_mask(N)
O = softmax(X @ X.T + M, axis=-1) @ X
output O
check equivariant(O, X)
"""


def plain_causal_attention(X):
    S = X @ X.T + np.triu(np.full((len(X), len(X)), -np.inf), k=1)
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    return (P / P.sum(axis=-1, keepdims=True)) @ X


def test_counterexample_search_under_the_size_guard(tmp_path):
    verdict = symattn.load(CAUSAL_HUGE).check()[0]
    assert verdict.verdict == "refuted"
    assert "instead of N=1000000000 (size guard)" in verdict.method
    ce = verdict.counterexample
    n = ce.sizes["N"]
    assert 2 <= n < 10_000
    X = np.asarray(ce.inputs["X"])
    perm = ce.extra["permutation"]
    # Independently: causal attention of the permuted rows is not the permuted attention.
    gap = np.abs(plain_causal_attention(X[perm]) - plain_causal_attention(X)[perm])
    assert gap.max() > 1e-6
    path = tmp_path / "causal.attn"
    path.write_text(CAUSAL_HUGE)
    done = run_cli("check", str(path))
    no_traceback(done)
    assert done.returncode == 1 and "(size guard)" in done.stdout


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@needs_cxx
def test_verify_cuda_under_the_size_guard(tmp_path):
    from symattn.check.cuda import verify_cuda

    spec = symattn.load("dim N = 4, d = 3\ninput X[N, d]\nparam w\nO = X * w\noutput O\n", dims={"N": 10**9})
    lines: list[str] = []
    report = verify_cuda(spec, gate=False, tsan=False, workdir=tmp_path, out=lines.append, budget=2_000)
    assert report.ok, report.problems
    assert report.sizes["N"] < 1_000
    assert f"verify at N={report.sizes['N']} instead of N=1000000000 (size guard)" in lines
