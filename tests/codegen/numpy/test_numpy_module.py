"""Generated NumPy code: every spec against independent computations.

Forward against the reference evaluator (float64, op by op, one batch element
at a time); backward against central finite differences of it; batch axes;
float32 and float64 kept; a fully masked row gives zeros; logits of +-1e4
against a float64 log-domain softmax written here; errors people can act on;
only NumPy imported; golden copies current; and, when torch is installed,
against `scaled_dot_product_attention` and torch autograd.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pytest

import symattn
from symattn.codegen.numpy.emit import load_module, numpy_source
from symattn.errors import SymAttnError
from symattn.symbolic.evaluate import random_leaves
from symattn.golden import COMMAND, golden_files
from symattn.check.numpy import reference_forward, relative_error, verify_numpy

from conftest import EXAMPLES, REPO, module_arguments, run_cli, slow_params

SPECS = {p.stem: p for p in EXAMPLES}

# Specs beyond the examples: what a new user writes. (strict_causal: row 0 sees nothing, so its weights
# and gradients must be 0, through an index-notation mask, against finite differences.)
EXTRA = {
    "elementwise": """
dim N = 3, d = 4
input X[N, d]
param W[d, d], b[d], m
H = relu(X @ W + b)
G = sigmoid(H) * tanh(X) + exp(-abs(X)) / 2
O = G - logsumexp(G, axis=-1) + mean(G * m, axis=-1) + sqrt(H * H + 1) - cos(X) * sin(H)
output O
""",
    "two_outputs": """
dim N = 3, d = 2
input X[N, d]
param W[d, d]
O = softmax(X @ W @ X.T, axis=-1) @ X
R = sum(X @ W, axis=-1)
output O, R
""",
    "awkward_names": """
dim N = 3, d = 2
input np[N, d]
param lambda[d, d], dtype[d, d]
O = softmax(np @ lambda @ np.T, axis=-1) @ (np @ dtype)
output O
""",
    "concat_heads": """
dim N = 3, d = 4, h = 2
input X[N, d], Y[N, d]
param W[d, d]
Z = concat(X @ W, Y, axis=-1)
H = split_heads(X @ W, h)
O = merge_heads(softmax(H @ H.T, axis=-1) @ H) + softmax(Z @ Z.T, axis=-1) @ Y
output O
""",
    "linear_attention": """
dim N = 6, d = 3
input X[N, d]
param W_q[d, d], W_k[d, d], W_v[d, d]
Q = relu(X @ W_q)
K = relu(X @ W_k)
O = Q @ K.T @ (X @ W_v) / N
output O
""",
    "strict_causal": """
dim N = 4, d = 3
input X[N, d]
param W[d, d]
M[i:N, j:N] = where(j < i, 0, -inf)
P = softmax(X @ W @ X.T + M, axis=-1)
O = P @ X
output O
""",
    "multi_query": """
dim N = 4, d = 4, h = 2, k = 2
input X[N, d]
param W_q[h, d, k], W_k[d, k], W_v[d, k], W_o[h * k, d]
Q = X @ W_q
K = X @ W_k
V = X @ W_v
P = softmax(Q @ K.T / sqrt(k), axis=-1)
O = merge_heads(P @ V) @ W_o
output O
""",
    "column_softmax_temperature": """
dim N = 4, M = 3, d = 2
input X[N, d], Y[M, d]
param tau
S = X @ Y.T * tau
A = softmax(S, axis=-2)
O = A.T @ X
output O
""",
    "declared_batch_bias_mean": """
dim B = 2, N = 4, d = 3
input X[B, N, d]
param W[d, d], bias[N, N]
P = softmax(X @ W @ X.T + bias, axis=-1)
O = mean(P @ X, axis=-2)
output O
""",
    "masked_cross": """
dim N = 3, M = 4, d = 2
input X[N, d], Y[M, d], mask[N, M]
param W_q[d, d], W_k[d, d]
S = (X @ W_q) @ (Y @ W_k).T
P = softmax(where(mask > 0, S, -inf), axis=-1)
O = P @ Y
output O
""",
    "power_eye_ones": """
dim N = 3, d = 3
input X[N, d]
param W[d, d]
H = (X @ W)^2 + eye(N) @ X - ones(N, d) / 2
O = softmax(H @ H.T, axis=-1) @ sigmoid(H)
output O
""",
    "rbf_kernel_index": """
dim N = 3, d = 4, e = 2
input X[N, d]
param A[d, e], b[e]
Z[i, c] = sum(k, X[i, k] * A[k, c]) + b[c]
G[i, j] = exp(-sum(c, (Z[i, c] - Z[j, c])^2))
O = G @ X
output O
""",
    "relative_bias": """
dim N = 4, d = 3
input X[N, d]
param W_q[d, d], W_k[d, d], w
B[i:N, j:N] = w * (j - i)
P = softmax(X @ W_q @ (X @ W_k).T + B, axis=-1)
O = P @ X
output O
""",
}
# The derivation (not the code generator) drops a scalar param read inside index notation.
KNOWN_DERIVE_BUGS: dict[str, str] = {}  # spec name -> the derive bug that verification must catch

MASKED = """
attention masked
dim N = 4, d = 3
input X[N, d], B[N, N]
param W_q[d, d], W_k[d, d]
P = softmax(X @ W_q @ (X @ W_k).T + B, axis=-1)
O = P @ X
output O
"""


@pytest.fixture(scope="module")
def modules():
    """Each example's generated module, generated once."""
    return {name: symattn.load(path).numpy() for name, path in SPECS.items()}


def _spec(name: str):
    return symattn.load(SPECS[name])


# --- numbers: every example, every configuration -------------------------------------------


@pytest.mark.parametrize("name", slow_params(sorted(SPECS), sorted(SPECS), {"natten_2d", "window_zero_side",
                                                                         "rope_interleaved", "alibi_exp2",
                                                                         "dilated_window"}))
def test_forward_and_backward_match_reference_and_finite_differences(name, modules):
    report = verify_numpy(_spec(name).typed, module=modules[name])
    assert report.ok, "\n".join(report.lines())
    configs = {row.config for row in report.rows}
    assert any("batch" in c for c in configs) and len(configs) >= 3


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_specs_beyond_the_examples(name):
    spec = symattn.load(EXTRA[name])
    report = verify_numpy(spec.typed)
    if name in KNOWN_DERIVE_BUGS:  # verification must catch it; once fixed, this says so
        assert not report.ok, f"{name} verifies now: remove it from KNOWN_DERIVE_BUGS"
        pytest.xfail(KNOWN_DERIVE_BUGS[name])
    assert report.ok, "\n".join(report.lines())


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_kept(name, dtype, modules):
    spec = _spec(name)
    leaves = module_arguments(spec.typed, random_leaves(spec.typed, np.random.default_rng(1), batch=(2,)))
    cast = {k: v.astype(dtype) if isinstance(v, np.ndarray) else v for k, v in leaves.items()}
    module = modules[name]
    outputs = module.forward(**cast)
    upstream = {f"grad_{o}": np.ones_like(outputs[o]) for o in spec.outputs}
    grads = module.backward(**cast, **upstream)
    for value in list(outputs.values()) + list(grads.values()):
        assert value.dtype == dtype
        assert np.all(np.isfinite(value))
    for name_, value in grads.items():
        assert value.shape == cast[name_].shape
    if dtype == np.float32:  # and float32 is float64's answer to float32 precision
        exact = module.forward(**leaves)
        for o in spec.outputs:
            assert relative_error(outputs[o], exact[o]) < 1e-4


def test_mixed_and_integer_inputs_follow_numpy_promotion(modules):
    spec = _spec("self_attention")
    leaves = random_leaves(spec.typed, np.random.default_rng(2))
    mixed = dict(leaves, X=leaves["X"].astype(np.float32))
    assert modules["self_attention"].forward(**mixed)["O"].dtype == np.float64  # float32 with float64
    ints = {k: np.round(v * 3).astype(np.int64) for k, v in leaves.items()}
    assert modules["self_attention"].forward(**ints)["O"].dtype == np.float64
    lists = {k: v.tolist() for k, v in leaves.items()}
    np.testing.assert_allclose(modules["self_attention"].forward(**lists)["O"],
                               modules["self_attention"].forward(**leaves)["O"])


def test_params_batched_like_the_inputs(modules):
    """A batch axis on every tensor: each batch element is its own problem."""
    spec = _spec("multi_head")
    rng = np.random.default_rng(3)
    leaves = random_leaves(spec.typed, rng, batch=(3,))
    out = modules["multi_head"].forward(**leaves)["O"]
    for b in range(3):
        single = modules["multi_head"].forward(**{k: v[b] for k, v in leaves.items()})["O"]
        np.testing.assert_allclose(out[b], single, rtol=1e-12, atol=1e-12)


# --- numerics at the edges -----------------------------------------------------------------


@pytest.fixture(scope="module")
def masked():
    spec = symattn.load(MASKED)
    return spec, spec.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_masked_row_gives_zeros_not_nan(masked, dtype):
    spec, module = masked
    rng = np.random.default_rng(4)
    leaves = {k: v.astype(dtype) for k, v in random_leaves(spec.typed, rng, batch=(2,)).items()}
    bias = np.zeros((2, 4, 4), dtype)
    bias[0, 1, :] = -np.inf  # row 1 of batch element 0 sees nothing
    bias[1, :, 2] = -np.inf  # column 2 hidden everywhere in element 1
    leaves["B"] = bias
    out = module.forward(**leaves)["O"]
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, 1], 0)
    upstream = rng.standard_normal(out.shape).astype(dtype)
    grads = module.backward(**leaves, grad_O=upstream)
    for name, grad in grads.items():
        assert np.all(np.isfinite(grad)), name
        assert grad.dtype == dtype
    np.testing.assert_array_equal(grads["B"][0, 1], 0)  # no weight, no gradient
    np.testing.assert_array_equal(grads["B"][1, :, 2], 0)
    # the rows that do see something match the reference evaluator
    reference = reference_forward(spec.typed, {k: v.astype(np.float64) for k, v in leaves.items()},
                                  dict(spec.typed.sizes))["O"]
    assert np.all(np.isnan(reference[0, 1])) or np.allclose(reference[0, 1], 0)
    keep = np.ones((2, 4), bool)
    keep[0, 1] = False
    tol = 1e-4 if dtype == np.float32 else 1e-12
    assert relative_error(out[keep], reference[keep]) < tol


def _log_domain_attention(X, W_q, W_k, W_v):
    """Self-attention in float64 with softmax as exp(S - logsumexp(S)): an independent reference."""
    S = (X @ W_q) @ (X @ W_k).T / np.sqrt(W_q.shape[-1])
    top = S.max(axis=-1, keepdims=True)
    lse = top + np.log(np.exp(S - top).sum(axis=-1, keepdims=True))
    return np.exp(S - lse) @ (X @ W_v), S


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_logits_stay_finite_and_correct(modules, dtype):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((6, 3))
    W_q, W_k, W_v = (rng.standard_normal((3, 2)) for _ in range(3))
    W_q *= 1e4 / np.abs((X @ W_q) @ (X @ W_k).T / np.sqrt(2)).max()  # logits up to +-1e4
    expected, logits = _log_domain_attention(X, W_q, W_k, W_v)
    assert np.abs(logits).max() > 0.99e4
    module = modules["self_attention"]
    args = {k: v.astype(dtype) for k, v in dict(X=X, W_q=W_q, W_k=W_k, W_v=W_v).items()}
    out = module.forward(**args)["O"]
    assert out.dtype == dtype and np.all(np.isfinite(out))
    tol = 1e-2 if dtype == np.float32 else 1e-9  # float32 logits of 1e4 carry absolute error ~1e-3
    assert relative_error(out, expected) < tol
    grads = module.backward(**args, grad_O=np.ones_like(out))
    assert all(np.all(np.isfinite(g)) for g in grads.values())


# --- errors people can act on ---------------------------------------------------------------


def test_shape_errors_name_tensor_expected_and_given(modules):
    module = modules["self_attention"]
    rng = np.random.default_rng(6)
    good = {"X": rng.standard_normal((4, 3)), "W_q": rng.standard_normal((3, 2)),
            "W_k": rng.standard_normal((3, 2)), "W_v": rng.standard_normal((3, 2))}
    cases = [
        (dict(good, W_k=rng.standard_normal((5, 2))), r"W_k: expected shape \[d, d_k\] = \[3, 2\].*got \[5, 2\]"),
        (dict(good, W_q=rng.standard_normal((5, 2))), r"W_q: expected shape \[d, d_k\] = \[3, \?\].*got \[5, 2\]"),
        (dict(good, X=rng.standard_normal(4)), r"X: expected shape \[N, d\].*got \[4\]"),
        (dict(good, X=rng.standard_normal((2, 4, 3)), W_v=rng.standard_normal((3, 3, 2))),
         r"batch axes do not broadcast: X \[2, 4, 3\], W_q \[3, 2\], W_k \[3, 2\], W_v \[3, 3, 2\]"),
    ]
    for leaves, message in cases:
        with pytest.raises(ValueError, match=message):
            module.forward(**leaves)
    with pytest.raises(ValueError, match=r"grad_O: expected shape \[N, d_k\] = \[4, 2\].*got \[4, 3\]"):
        module.backward(**good, grad_O=np.ones((4, 3)))
    with pytest.raises(TypeError, match="W_v"):
        module.forward(X=good["X"], W_q=good["W_q"], W_k=good["W_k"])
    with pytest.raises(TypeError, match="grad_O"):
        module.backward(**good)
    with pytest.raises(ValueError, match="real floating-point"):
        module.forward(**dict(good, X=good["X"] + 1j))


def test_multi_head_dim_arithmetic_is_checked(modules):
    spec = _spec("multi_head")
    leaves = random_leaves(spec.typed, np.random.default_rng(7))
    leaves["W_o"] = np.ones((5, 4))
    with pytest.raises(ValueError, match=r"W_o: expected shape \[h \* d_k, d\] = \[4, 4\].*got \[5, 4\]"):
        modules["multi_head"].forward(**leaves)


def test_sizes_no_input_gives_are_keywords():
    """split_heads(X @ W, h) with no tensor of shape [h, ...]: h is a keyword with the spec's default."""
    module = symattn.load(EXTRA["concat_heads"]).numpy()
    rng = np.random.default_rng(10)
    X, Y, W = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((4, 4))
    two = module.forward(X=X, Y=Y, W=W)["O"]
    np.testing.assert_array_equal(two, module.forward(X=X, Y=Y, W=W, h=2)["O"])
    assert relative_error(module.forward(X=X, Y=Y, W=W, h=4)["O"], two) > 1e-3  # another head count
    with pytest.raises(ValueError, match="not a multiple of 3 heads"):
        module.forward(X=X, Y=Y, W=W, h=3)
    with pytest.raises(ValueError, match="h: a size is a positive integer"):
        module.forward(X=X, Y=Y, W=W, h=0)


def test_awkward_names_keyword_errors():
    module = symattn.load(EXTRA["awkward_names"]).numpy()
    with pytest.raises(TypeError, match=r"missing tensors \['lambda'\]"):
        module.forward(np=np.ones((3, 2)), dtype=np.ones((2, 2)))


# --- the generated file ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPECS))
def test_generated_file_imports_only_numpy_and_names_its_spec(name):
    source = _spec(name).emit("numpy")
    tree = ast.parse(source)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    loaded = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    assert loaded | {node.module for node in tree.body if isinstance(node, ast.ImportFrom)} == {"numpy"}
    # inside functions of the tiled pass: the standard library, and threadpoolctl only where it is installed
    assert imported - {"numpy"} <= {"os", "concurrent.futures", "threadpoolctl"}
    guarded = {node.module for tried in ast.walk(tree) if isinstance(tried, ast.Try)
               and any(getattr(h.type, "id", None) == "ImportError" for h in tried.handlers)
               for node in tried.body if isinstance(node, ast.ImportFrom)}
    assert "threadpoolctl" not in imported or "threadpoolctl" in guarded
    head = ast.get_docstring(tree)
    assert f"`{name}`" in head and f"symattn {symattn.__version__}" in head
    text = SPECS[name].read_text()
    for comment in (line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line):
        if len(comment) > 12 and not _is_shape_of_names(comment):
            assert comment not in source  # user text is never copied, only validated names


def _is_shape_of_names(text: str) -> bool:
    """A comment such as `[g, r, N, d_k]` is also the shape text the module prints (in its
    docstring and its shape errors), built from the validated dim names, not copied."""
    if not (text.startswith("[") and text.endswith("]")):
        return False
    return all(e.strip().isidentifier() or e.strip().isdigit() for e in text[1:-1].split(","))


def test_no_loops_in_the_computation():
    for name in SPECS:
        tree = ast.parse(_spec(name).emit("numpy"))
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_forward_backward")
        assert not any(isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in ast.walk(main)), name


def test_backward_reuses_the_forward_pass():
    """The attention core: dS in place from P and rowsum(dO * O), and the softmax computed once."""
    source = _spec("self_attention").emit("numpy")
    assert source.count("_softmax_(") == 2  # the definition and one call
    assert "dS = _softmax_backward_(P, dP, _rowdot(dO, O))" in source
    assert "dV = P.swapaxes(-1, -2) @ dO" in source
    additive = _spec("additive").emit("numpy")
    assert additive.count("np.tanh(") == 1  # built once over [i, j, c], reused by every gradient


@pytest.mark.parametrize("name", ["self_attention", "causal", "positional"])
def test_peak_memory_is_two_attention_matrices(name, modules):
    """P (in the scores' buffer) and dP (which becomes dS): no third [N, N] array, the mask included."""
    import tracemalloc

    n, width = 512, 8
    spec = _spec(name)
    sizes = {dim: (n if dim == "N" else width) for dim in spec.typed.sizes}
    leaves = random_leaves(spec.typed, np.random.default_rng(11), sizes=sizes)
    upstream = np.ones((n, width))
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    modules[name].forward_backward(**leaves, grad_O=upstream)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    square = n * n * 8
    assert 2 * square <= peak < 2.5 * square, peak / square


def test_matrix_chains_take_the_cheap_order():
    """Linear attention written left to right is computed as Q @ (K.T @ V): no [N, N] array."""
    source = symattn.load(EXTRA["linear_attention"]).emit("numpy")
    (line,) = [line.strip() for line in source.splitlines() if line.strip().startswith("O = ")]
    assert line.startswith("O = Q @ ((K.swapaxes(-1, -2) @ X)"), line


def test_golden_files_are_current():
    stale = [str(path.relative_to(REPO)) for path, text in golden_files(REPO).items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"golden generated code is out of date: {stale}; run `{COMMAND}` and review the diff"


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_golden_module_runs_standalone(tmp_path):
    """The golden file, copied anywhere, runs with nothing but NumPy."""
    target = tmp_path / "attn.py"
    target.write_text((REPO / "tests" / "golden" / "self_attention.py").read_text())
    script = tmp_path / "run.py"
    script.write_text("import numpy as np, attn\n"
              "X = np.ones((2, 5, 3), np.float32); W = np.eye(3, 2, dtype=np.float32)\n"
              "out = attn.forward(X=X, W_q=W, W_k=W, W_v=W)['O']\n"
              "g = attn.backward(X=X, W_q=W, W_k=W, W_v=W, grad_O=np.ones_like(out))\n"
                      "print(out.shape, out.dtype, g['X'].shape, g['W_q'].shape)\n")
    done = subprocess.run([sys.executable, "-E", "-s", str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(2, 5, 2) float32 (2, 5, 3) (3, 2)"


def test_load_module_and_api():
    spec = _spec("causal")
    assert spec.numpy().forward.__doc__
    assert load_module(numpy_source(spec.typed)).backward.__doc__
    with pytest.raises(SymAttnError, match="unknown target 'fortran'"):
        spec.emit("fortran")


# --- command line -----------------------------------------------------------------------------


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_cli_emit_and_verify(tmp_path):
    target = tmp_path / "attn.py"
    done = run_cli("emit", "numpy", "derivations/self_attention.attn", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text() == _spec("self_attention").emit("numpy")
    done = run_cli("verify", "derivations/causal.attn", "--target", "numpy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "max rel error" in done.stdout and "25 of 25 tensors within tolerance" in done.stdout  # 5 of the tiled pass


def test_cli_exit_codes_for_bad_input(tmp_path, capsys):
    from symattn.cli import main

    bad = tmp_path / "bad.attn"
    bad.write_text("input X[N, d]\noutput X @ \n")
    causal = str(SPECS["causal"])
    for args in (["emit", "numpy", str(bad), "-o", str(tmp_path / "x.py")], ["verify", str(bad)],
                 ["verify", str(tmp_path / "missing.attn")],
                 ["emit", "numpy", causal, "-o", str(tmp_path / "no" / "x.py")],
                 ["emit", "numpy", causal, "-o", str(tmp_path)]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "error" in err and "Traceback" not in err, (args, err)
    done = run_cli("verify", str(bad))  # and as a user runs it: a located error, no traceback
    assert done.returncode == 2 and "bad.attn:2:" in done.stderr and "Traceback" not in done.stderr


def test_verify_exits_1_when_generated_code_is_wrong(monkeypatch, capsys):
    """A module whose forward is off by a little must fail verification."""
    import symattn.codegen.numpy.emit as codegen
    from symattn.cli import main

    real = codegen.load_module

    def broken(source, name="x"):
        module = real(source, name)
        forward = module.forward

        def wrong(**tensors):
            return {k: v * (1 + 1e-6) for k, v in forward(**tensors).items()}

        module.forward = wrong
        return module

    monkeypatch.setattr(codegen, "load_module", broken)
    assert main(["verify", str(SPECS["self_attention"])]) == 1
    assert "FAIL forward" in capsys.readouterr().out



def test_verify_checks_the_tiled_pass_too():
    """A spec with an attention core: verify also forces the tiled pass on (the pass large attention takes),
    against the same reference; a spec without one has no such rows."""
    from symattn.check.numpy import verify_numpy

    rows = verify_numpy(symattn.load(SPECS["causal"]).typed).rows
    tiled = [r for r in rows if "tiled pass" in r.config]
    assert tiled and all(r.ok for r in tiled)
    assert {r.tensor for r in tiled if r.phase == "backward"} == set(symattn.load(SPECS["causal"]).typed.differentiable)
    assert not [r for r in verify_numpy(symattn.load(SPECS["additive"]).typed).rows if "tiled pass" in r.config]


def test_verify_catches_a_wrong_tiled_pass():
    """grad(K) off by a little in the one pass over each query block: only the tiled rows fail."""
    from symattn.check.numpy import verify_numpy
    from symattn.codegen.numpy.emit import load_module, numpy_source

    spec = symattn.load(SPECS["causal"]).typed
    module = load_module(numpy_source(spec), "tiled_wrong")
    right = module._flash_forward_backward

    def wrong(*args):
        o, lse, dq, dk, dv = right(*args)
        return o, lse, dq, dk * (1 + 1e-4), dv

    module._flash_forward_backward = wrong
    rows = verify_numpy(spec, module=module).rows
    failed = {(r.config, r.tensor) for r in rows if not r.ok}
    assert failed and all("tiled pass" in config for config, _ in failed)


# --- torch, an independent gradient reference ------------------------------------------------

try:
    import torch
except ImportError:  # optional: the cross-checks below skip, the rest of this file runs
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch==2.13.0)")


def _torch_attention(name: str, leaves: dict):
    t = {k: torch.tensor(v, requires_grad=True) for k, v in leaves.items()}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if name == "cross_attention":
        out = sdpa(t["X"] @ t["W_q"], t["Y"] @ t["W_k"], t["Y"] @ t["W_v"])
    else:
        x = t["X"]
        out = sdpa(x @ t["W_q"], x @ t["W_k"], x @ t["W_v"], is_causal=(name == "causal"))
    return out, t


@needs_torch
@pytest.mark.parametrize("name", ["self_attention", "causal", "cross_attention"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_against_torch_sdpa_and_autograd(name, batch, modules):
    spec = _spec(name)
    sizes = {k: 2 * v for k, v in spec.typed.sizes.items()}
    leaves = random_leaves(spec.typed, np.random.default_rng(8), batch=batch, sizes=sizes)
    leaves = {k: (v if k in spec.typed.inputs else v[(0,) * len(batch)]) for k, v in leaves.items()}
    module = modules[name]
    out = module.forward(**leaves)["O"]
    expected, tensors = _torch_attention(name, leaves)
    assert relative_error(out, expected.detach().numpy()) < 1e-12
    upstream = np.random.default_rng(9).standard_normal(out.shape)
    expected.backward(torch.tensor(upstream))
    grads = module.backward(**leaves, grad_O=upstream)
    for leaf, tensor in tensors.items():
        assert relative_error(grads[leaf], tensor.grad.numpy()) < 1e-10, leaf
