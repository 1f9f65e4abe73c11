"""The notebook API: displays of specs, derivations and verdicts, and one gradient as a `Formula`.

A real notebook is executed with nbclient (the optional extra `symattn[notebook]`;
skipped with a reason when nbclient, nbformat or ipykernel is missing) and its
HTML output must carry MathML. The plain tests compare each display with
something symattn did not build for it: the committed derivation documents
(the same typesetting must appear there), the text `symattn derive --gradients`
prints, and, for `Formula.sympy`, plain NumPy and central finite differences.
"""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import sympy

import symattn
from symattn.errors import SymAttnError, SymbolicError, UnknownGradientError
from symattn.symbolic.evaluate import NUMERIC, Evaluator
from symattn.symbolic.sympy_form import to_sympy
from conftest import REPO, run_cli

SELF = REPO / "derivations" / "self_attention.attn"
DERIVATIONS = REPO / "derivations"


# --- a real notebook -----------------------------------------------------------------------------


def test_notebook_displays_a_derivation_as_mathml():
    nbformat = pytest.importorskip("nbformat", reason="the notebook extra is not installed: "
                                   "pip install 'symattn[notebook]'")
    nbclient = pytest.importorskip("nbclient", reason="the notebook extra is not installed: "
                                   "pip install 'symattn[notebook]'")
    pytest.importorskip("ipykernel", reason="the notebook extra is not installed: pip install 'symattn[notebook]'")
    cells = [
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nimport symattn\n"
        f"spec = symattn.load({str(SELF)!r})\nspec",
        "derivation = spec.derive()\nderivation",
        'derivation["grad(V)"]',
        "spec.check()[0]",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()
    outputs = [cell.outputs for cell in notebook.cells]
    for cell, out in zip(cells, outputs):
        assert not [o for o in out if o.output_type == "error"], (cell, out)
    html = [next(o.data["text/html"] for o in out if o.output_type == "execute_result") for out in outputs]
    assert all("text/latex" in next(o.data for o in out if o.output_type == "execute_result") for out in outputs)
    spec_html, derivation_html, formula_html, verdict_html = html
    assert spec_html.count("<math") >= 10               # every tensor's name, shape and definition
    assert derivation_html.count("<math") >= 10         # every gradient
    assert "<math" in formula_html and "<msup><mi>P</mi><mo>⊤</mo></msup>" in formula_html
    assert "proved" in verdict_html and "grad(V) == P.T @ grad(O)" in verdict_html


# --- Spec -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_attention():
    return symattn.load(SELF)


@pytest.fixture(scope="module")
def committed_md() -> str:
    """The committed Markdown document of self_attention: typeset by the documents, not by the displays."""
    return (DERIVATIONS / "self_attention.md").read_text("utf-8")


def test_spec_html_lists_every_tensor_with_role_and_shape(self_attention):
    html = self_attention._repr_html_()
    rows = html.split("<tr>")[2:]  # after the header row
    assert len(rows) == len(self_attention.tensors)
    for row, (name, info) in zip(rows, self_attention.tensors.items()):
        assert f"<td style=\"border:1px solid #ccc;padding:.2em .5em;text-align:left\">{info.role}</td>" in row
        sizes = "[" + ", ".join(str(n) for n in self_attention.concrete_shape(name)) + "]"
        assert f"<code>{sizes}</code>" in row
        assert row.count("<math") == (3 if info.expr is not None else 2), (name, row)
    assert "<script" not in html and "attention self_attention" in html


def test_spec_latex_typesets_the_definitions_as_the_document_does(self_attention, committed_md):
    latex = self_attention._repr_latex_()
    assert latex.startswith("$$") and latex.endswith("$$")
    for name in ("Q", "K", "V", "S", "P", "O"):
        line = next(x for x in latex.split("\n") if x.startswith(f"{name} & "))
        definition = line.split(" & ")[3].removesuffix(" \\\\")
        assert f"$$\n{definition}\n$$" in committed_md, definition
    assert "\\left[N,d_{k}\\right]" in latex  # the shape of Q, K, V


def test_spec_repr_stays_one_line(self_attention):
    assert repr(self_attention) == "<Spec self_attention: 10 tensors, outputs O>"


# --- Derivation -------------------------------------------------------------------------------------


def test_derivation_repr_is_one_short_line(self_attention):
    assert repr(self_attention.derive()) == "<Derivation self_attention: 10 gradients>"


def test_derivation_displays_every_gradient_as_the_document_does(self_attention, committed_md):
    derivation = self_attention.derive()
    html = derivation._repr_html_()
    latex = derivation._repr_latex_()
    assert html.count('<math display="block" ') == len(derivation)
    for key in derivation:
        formula = derivation[key]
        assert formula.mathml.replace("<math ", '<math display="block" ') in html and formula.latex in latex
        if key != "grad(O)":  # the upstream gradient has no equation in the document
            assert f"$$\n{formula.latex}\n$$" in committed_md, key
    assert latex.startswith("$$\\begin{gathered}") and "L=\\langle O,\\mathrm{d}O\\rangle" in latex


def test_formula_text_is_what_derive_gradients_prints(self_attention):
    run = run_cli("derive", str(SELF), "--gradients")
    assert run.returncode == 0, run.stderr
    printed = run.stdout.splitlines()[2:]  # after the heading and a blank line
    derivation = self_attention.derive()
    assert [line for key in derivation for line in derivation[key].text.splitlines()] == printed


def test_formula_lookup_by_gradient_or_tensor_name(self_attention):
    derivation = self_attention.derive()
    by_grad, by_name = derivation["grad(Q)"], derivation["Q"]
    assert by_grad == by_name and by_grad.name == "grad(Q)"
    assert by_grad.text == "grad(Q) = grad(S) @ K / sqrt(d_k)"
    assert by_grad.latex == "\\mathrm{d}Q=\\frac{\\mathrm{d}S\\,K}{\\sqrt{d_{k}}}"
    assert by_grad.mathml.startswith('<math xmlns="http://www.w3.org/1998/Math/MathML">')
    assert by_grad._repr_latex_() == f"$${by_grad.latex}$$"
    assert by_grad.mathml[len("<math "):] in by_grad._repr_html_()
    assert str(by_grad) == by_grad.text and "mathml" not in repr(by_grad)
    assert "grad(V)" in derivation and "V" in derivation and "grad(Nope)" not in derivation
    assert list(derivation) == [f"grad({n})" for n in derivation.gradients]
    assert derivation.get("Nope") is None


@pytest.mark.parametrize("key", ["grad(Nope)", "Nope", "grad(", "", "grad(Q"])
def test_unknown_gradient_is_a_symattn_key_error_naming_the_known_ones(self_attention, key):
    derivation = self_attention.derive()
    with pytest.raises(UnknownGradientError, match=r"the known gradients are grad\(O\), grad\(P\),.* grad\(X\)$"):
        derivation[key]
    with pytest.raises(KeyError):
        derivation[key]
    with pytest.raises(SymAttnError):
        derivation[key]


def test_a_gradient_that_is_zero_and_an_upstream_gradient_display():
    spec = symattn.load("dim N = 2\ninput X[N, N], Y[N, N]\nO = exp(X)\noutput O\n")
    derivation = spec.derive()
    assert derivation["Y"].text.startswith("grad(Y) = 0")
    assert derivation["Y"].sympy == sympy.ZeroMatrix(*derivation["Y"].sympy.shape)
    assert "does not depend on Y" in derivation["Y"]._repr_html_()
    assert "upstream gradient" in derivation["O"].latex
    assert derivation["O"].sympy == sympy.MatrixSymbol("grad(O)", *spec.typed.tensors["O"].shape)


# --- Formula.sympy against plain NumPy ------------------------------------------------------------


def evaluate(expr: sympy.Basic, values: dict[str, np.ndarray], spec) -> np.ndarray:
    """A SymPy matrix expression at concrete sizes and values, as a float array."""
    sizes = {info.symbol: sympy.Integer(spec.typed.sizes[n]) for n, info in spec.typed.dims.items()}
    expr = expr.xreplace(sizes)
    mapping = {}
    for symbol in expr.atoms(sympy.MatrixSymbol):
        mapping[symbol] = sympy.ImmutableMatrix(np.asarray(values[symbol.name], float).reshape(symbol.shape))
    for symbol in expr.atoms(sympy.Symbol):
        if symbol.name in values:
            mapping[symbol] = sympy.Float(float(np.asarray(values[symbol.name])))
    result = expr.xreplace(mapping).doit()
    if isinstance(result, sympy.MatrixExpr):
        result = result.as_explicit()
    return np.array(sympy.N(result), dtype=float)


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _self_attention(leaves: dict[str, np.ndarray], d_k: int) -> dict[str, np.ndarray]:
    """Plain NumPy self-attention, written here from the textbook formulas."""
    x = leaves["X"]
    q, k, v = x @ leaves["W_q"], x @ leaves["W_k"], x @ leaves["W_v"]
    s = q @ k.T / np.sqrt(d_k)
    p = _softmax_rows(s)
    return {"Q": q, "K": k, "V": v, "S": s, "P": p, "O": p @ v}


def test_sympy_of_grad_v_is_p_transpose_times_grad_o(self_attention):
    formula = self_attention.derive()["grad(V)"]
    assert isinstance(formula.sympy, sympy.MatrixExpr)
    n, d_k = self_attention.dims["N"], self_attention.dims["d_k"]
    rng = np.random.default_rng(7)
    for _ in range(3):
        p, grad_o = rng.normal(size=(n, n)), rng.normal(size=(n, d_k))
        value = evaluate(formula.sympy, {"P": p, "grad(O)": grad_o}, self_attention)
        np.testing.assert_allclose(value, p.T @ grad_o, rtol=1e-12, atol=1e-12)


def _loss(forward, leaves, upstream) -> float:
    return float(np.sum(forward(leaves)["O"] * upstream))


def _finite_differences(forward, leaves, upstream, name, step=1e-6) -> np.ndarray:
    grad = np.zeros_like(leaves[name])
    for index in np.ndindex(grad.shape):
        plus = {k: v.copy() for k, v in leaves.items()}
        minus = {k: v.copy() for k, v in leaves.items()}
        plus[name][index] += step
        minus[name][index] -= step
        grad[index] = (_loss(forward, plus, upstream) - _loss(forward, minus, upstream)) / (2 * step)
    return grad


def _every_sympy_gradient(spec, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate each Formula.sympy in the order derived, feeding each gradient to the next."""
    values = dict(values)
    derivation = spec.derive()
    for key in derivation:
        if key in values:
            continue
        tensor = key[len("grad("):-1]
        values[key] = evaluate(derivation[key].sympy, values, spec).reshape(spec.concrete_shape(tensor))
    return values


def test_every_sympy_gradient_of_self_attention_matches_finite_differences(self_attention):
    sizes = self_attention.dims
    rng = np.random.default_rng(3)
    leaves = {n: rng.normal(size=self_attention.concrete_shape(n)) for n in self_attention.typed.given}
    upstream = rng.normal(size=self_attention.concrete_shape("O"))

    def forward(x):
        return _self_attention(x, sizes["d_k"])

    values = {**leaves, **forward(leaves), "grad(O)": upstream}
    grads = _every_sympy_gradient(self_attention, values)
    for name in self_attention.typed.differentiable:
        np.testing.assert_allclose(grads[f"grad({name})"], _finite_differences(forward, leaves, upstream, name),
                                   rtol=1e-6, atol=1e-8, err_msg=name)
    # grad(S), the softmax backward, against its textbook form in NumPy.
    p, grad_p = values["P"], grads["grad(P)"]
    np.testing.assert_allclose(grads["grad(S)"], p * (grad_p - np.sum(grad_p * p, axis=-1, keepdims=True)),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_sympy_of_index_notation_gradients_matches_finite_differences():
    """Additive attention's gradients are in index notation: FunctionMatrix, Sum and entries."""
    spec = symattn.load(DERIVATIONS / "additive.attn")
    rng = np.random.default_rng(5)
    leaves = {n: rng.normal(size=spec.concrete_shape(n)) for n in spec.typed.given}
    upstream = rng.normal(size=spec.concrete_shape("O"))

    def forward(x):
        a, b = x["X"] @ x["W_1"], x["X"] @ x["W_2"]
        s = np.tanh(a[:, None, :] + b[None, :, :]) @ x["w"]  # S[i, j] = sum_c w_c tanh(a_ic + b_jc)
        p = _softmax_rows(s)
        return {"S": s, "P": p, "O": p @ (x["X"] @ x["W_v"])}

    values = {**leaves, **forward(leaves), "grad(O)": upstream}
    grads = _every_sympy_gradient(spec, values)
    for name in spec.typed.differentiable:
        np.testing.assert_allclose(grads[f"grad({name})"], _finite_differences(forward, leaves, upstream, name),
                                   rtol=1e-6, atol=1e-8, err_msg=name)


# --- symattn.symbolic.sympy_form on forward definitions, against the float64 evaluator -----------------------

EVERY_NODE = """\
attention every_node
dim N = 3, d = 2
input X[N, d], Y[N, d]
param w[d], b[1, d], c[N, 1], tau
A = relu(X) + sigmoid(Y) * abs(X - b) - tanh(c) / (1 + exp(Y))
B = sqrt(exp(X)) ^ 2 + log(1 + X * X) * sin(Y) - cos(tau * X) + w
C = where(X > Y, X, -Y) + mean(X, axis=-1) - logsumexp(Y, axis=-2) + sum(X) / 3
D = softmax(A @ B.T, axis=-2) @ C + concat(X, Y, axis=-1) @ concat(eye(d), ones(d, d), axis=-2)
E = X ^ Y + exp(causal_mask(N)) @ sinusoidal(N, d) + tau ^ 2
F[i:N, j:d] = sum(k, X[i, k] * X[i, k]) * Y[i, j] * where(i < j, 1, 2) + w[j] * tau
G = w @ X.T + X @ w + w @ w
O = D + E + F + sum(G)
output O
"""


def _forward_values(spec, seed=11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    leaves = {n: rng.uniform(0.5, 1.5, size=spec.concrete_shape(n)) for n in spec.typed.given}
    return {k: np.asarray(v, dtype=float) for k, v in Evaluator(spec.typed, NUMERIC).run(leaves).items()}


@pytest.mark.parametrize("source", [EVERY_NODE, *(DERIVATIONS / f"{n}.attn" for n in
                                                   ("self_attention", "causal", "cross_attention", "positional"))],
                         ids=["every_node", "self_attention", "causal", "cross_attention", "positional"])
def test_sympy_form_of_every_definition_matches_the_evaluator(source):
    spec = symattn.load(source)
    values = _forward_values(spec)
    for name, info in spec.tensors.items():
        if info.expr is None:
            continue
        got = evaluate(to_sympy(info.expr, spec.typed), values, spec)
        want = values[name]
        assert np.allclose(got.reshape(want.shape), want, rtol=1e-10, atol=1e-12, equal_nan=True), name


def test_rank_three_gradients_say_they_have_no_sympy_form():
    derivation = symattn.load(DERIVATIONS / "multi_head.attn").derive()
    formula = derivation["grad(W_q)"]
    assert formula.latex == "\\mathrm{d}W^{q}=X^{\\top}\\,\\mathrm{d}Q" and "<math" in formula._repr_html_()
    with pytest.raises(SymbolicError, match=r"shape \[h, d, d_k\]: tensors of rank 3 have no SymPy matrix form"):
        formula.sympy


# --- Verdict ----------------------------------------------------------------------------------------

WRONG_CLAIM = textwrap.dedent("""\
    dim N = 2, d = 2
    input X[N, d]
    param W[d, d]
    P = softmax(X @ W @ X.T, axis=-1)
    O = P @ X
    output O
    check grad(P) == X @ grad(O).T
""")


def test_verdict_displays_claim_method_and_counterexample():
    spec = symattn.load(REPO / "derivations" / "causal.attn")
    proved, negated = spec.check()
    html = proved._repr_html_()
    assert ">proved</strong>: <code>grad(V) == P.T @ grad(O)</code> (line 18)" in html
    assert proved.method in html and "<pre" not in html
    html = negated._repr_html_()
    assert "counterexample for line 19" in html and "white-space:pre-wrap" in html
    assert "X = [[" in html and "where(j &lt;= i, 0, -inf)" in html
    latex = negated._repr_latex_()
    assert latex.startswith("$$\\begin{array}{l}") and "\\texttt{not equivariant(O, X)}" in latex
    assert "\\text{counterexample: permutation Pi" in latex and "sqrt(d\\_k)" in latex


def test_a_refuted_verdict_shows_red_and_its_counterexample():
    verdicts = symattn.load(WRONG_CLAIM).check()
    refuted = [v for v in verdicts if v.verdict == "refuted"]
    assert refuted, [(v.claim, v.verdict, v.method) for v in verdicts]
    html = refuted[0]._repr_html_()
    assert 'color:#cf222e">refuted</strong>' in html and "<pre" in html and "counterexample for line" in html
    assert "\\textbf{refuted}" in refuted[0]._repr_latex_()


def test_the_displays_need_no_ipython():
    """The reprs are plain methods: nothing is imported from IPython to build them."""
    before = set(sys.modules)
    spec = symattn.load(SELF)
    spec._repr_html_(), spec._repr_latex_()
    assert not {m for m in set(sys.modules) - before if m.startswith(("IPython", "ipykernel"))}
