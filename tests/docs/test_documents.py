"""Derivation documents: sections, formulas from checked expressions, formats, determinism."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

import symattn
from symattn.docs.document import Display, build, render
from symattn.docs.mathbox import to_latex
from symattn.docs.mathprint import grad_box, matrix_box
from symattn.ir.typed import Grad, IndexDef
from conftest import REPO

ROOT = REPO
SPECS = sorted((ROOT / "derivations").glob("*.attn"))
SECTIONS = ["## The spec", "## Forward pass", "## A small example", "## Backward pass", "## Checks",
            "## Permutation symmetry", "## Cost"]


TINY = "dim N = 2, d = 2\ninput X[N, d]\nparam W[d, d]\nO = softmax(X @ W, axis=-1)\noutput O\n"


@pytest.fixture(scope="module")
def documents():
    """Each spec's Document, built once for the module."""
    return {path.stem: (symattn.load(path, filename=f"derivations/{path.name}"),) for path in SPECS}


@pytest.fixture(scope="module")
def built(documents):
    return {name: build(spec) for name, (spec,) in documents.items()}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_section_is_present(built, path):
    text = render(built[path.stem], "md")
    positions = [text.find(heading) for heading in SECTIONS]
    assert all(p >= 0 for p in positions), [h for h, p in zip(SECTIONS, positions) if p < 0]
    assert positions == sorted(positions), "sections out of order"
    # Every tensor appears in the table with its role and shape.
    spec = symattn.load(path)
    for name, info in spec.tensors.items():
        assert f"| `{name}` | {info.role} | `{spec.shape(name)}` |" in text


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_gradient_formulas_come_from_the_derivation(built, path):
    """Each displayed matrix-form gradient is the LaTeX of the derived (and checked) expression."""
    spec = symattn.load(path)
    displays = {b.math.latex for b in built[path.stem].blocks if isinstance(b, Display)}
    derivation = spec.derive()
    dims = list(spec.typed.dims)
    shown = 0
    for name, grad in derivation.gradients.items():
        if grad.expr is None or isinstance(grad.expr, Grad) or _has_index(grad.expr):
            continue
        expected = to_latex(grad_box(name)) + "=" + to_latex(matrix_box(grad.expr, dims))
        assert expected in displays, f"grad({name}) is not shown as derived"
        shown += 1
    assert shown >= 1


def _has_index(node) -> bool:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, IndexDef):
            return True
        stack.extend(n.children)
    return False


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_gradient_is_marked_checked(built, path):
    text = render(built[path.stem], "md")
    checked = re.findall(r"^Checked: (.*)$", text, flags=re.M)
    assert checked and all(c.startswith("exact identity of every entry") for c in checked), checked


def test_spec_syntax_formulas_parse_back():
    """`derive --gradients` prints spec syntax: each formula, stated as a check, is proved."""
    path = ROOT / "derivations" / "self_attention.attn"
    spec = symattn.load(path)
    derivation = spec.derive()
    lines = []
    for name, grad in derivation.gradients.items():
        if grad.expr is not None and not isinstance(grad.expr, Grad):
            lines.append("check " + derivation.formula(name).replace(" = ", " == ", 1))
    text = path.read_text() + "\n" + "\n".join(lines) + "\n"
    checked = symattn.load(text).check()
    claims = [v for v in checked if v.claim.startswith("grad(") and v.line > 31]
    assert len(claims) == len(lines)
    assert all(v.verdict == "proved" for v in claims), [(v.claim, v.method) for v in claims]


def test_textbook_walkthrough_for_self_attention(built):
    text = render(built["self_attention"], "md")
    assert "\\alpha'_{i,j}=\\frac{\\exp\\left(\\alpha_{i,j}\\right)}" in text
    assert "b_{1,c}=\\sum_{j}\\alpha'_{1,j}\\,v_{j,c}" in text
    assert "W^{q}" in text and "\\odot" in text and "^{\\top}" in text and "\\operatorname{softmax}" in text


def test_refuted_checks_show_their_counterexample(built):
    text = render(built["causal"], "md")
    assert "| 19 | `not equivariant(O, X)` | proved |" in text
    assert "counterexample for line 19" in text and "permutation Pi" in text


def test_symmetry_section_shows_where_the_proof_breaks(built):
    text = render(built["positional"], "md")
    assert "no rule applies to H = X + E" in text
    text = render(built["self_attention"], "md")
    assert "O(Pi X) = Pi O(X)" in text


def test_cost_section_has_polynomials_and_depth(built):
    text = render(built["self_attention"], "md")
    assert "N^{2}" in text and "O(1) in sequential steps" in text and "O(N) steps" in text


def test_output_is_byte_identical_from_run_to_run(documents, built):
    (spec,) = documents["self_attention"]
    first, second = built["self_attention"], build(spec)  # the module's build and a second one
    for fmt in ("md", "html", "tex"):
        assert render(first, fmt) == render(second, fmt)
    assert [f.png for f in first.figures] == [f.png for f in second.figures]


def test_derivations_are_up_to_date(built):
    """The committed documents are what `python -m symattn.regenerate` writes today."""
    pytest.importorskip("matplotlib", reason="the committed documents include matplotlib figures")
    stale = []
    for name, doc in built.items():
        for fmt in ("md", "html", "tex"):
            path = ROOT / "derivations" / f"{name}.{fmt}"
            if not path.exists() or path.read_text(encoding="utf-8") != render(doc, fmt):
                stale.append(str(path.relative_to(ROOT)))
        stale += [f"derivations/{f.name}" for f in doc.figures if not (ROOT / "derivations" / f.name).exists()]
    assert not stale, f"out of date: {stale}; regenerate with `python -m symattn.regenerate`"


def test_html_is_standalone():
    html = (ROOT / "derivations" / "self_attention.html").read_text()
    assert "<math" in html and "http://" not in html.replace("http://www.w3.org/1998/Math/MathML", "")
    assert "<script" not in html and "https://" not in html


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_html_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless Chromium installed (Debian package 'chromium')")
    page = ROOT / "derivations" / "self_attention.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<math") >= 20 and "merror" not in dom.stdout
    shot = tmp_path / "page.png"
    run = subprocess.run([browser, *flags, "--window-size=1000,1600", f"--screenshot={shot}", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    image = pytest.importorskip("matplotlib.image", reason="matplotlib reads the screenshot back")
    pixels = image.imread(str(shot))
    assert pixels.std() > 0.05, "the screenshot is blank"


def test_latex_compiles(tmp_path):
    engine = shutil.which("pdflatex") or shutil.which("lualatex") or shutil.which("xelatex")
    if engine is None:
        pytest.skip("no TeX engine installed (pdflatex, lualatex or xelatex)")
    for name in ("self_attention", "additive"):
        shutil.copy(ROOT / "derivations" / f"{name}.tex", tmp_path)
        for png in (ROOT / "derivations").glob(f"{name}-*.png"):
            shutil.copy(png, tmp_path)
        run = subprocess.run([engine, "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:]
        assert (tmp_path / f"{name}.pdf").stat().st_size > 10_000


@pytest.mark.slow  # two full documents in fresh interpreters; built in-process above
def test_cli_derive_writes_document_and_figures(tmp_path):
    out = tmp_path / "doc.md"
    run = subprocess.run([sys.executable, "-m", "symattn", "derive", "-o", str(out)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert text.startswith("# Derivation of self_attention")
    for match in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (tmp_path / match).exists()
    html = tmp_path / "doc.html"
    run = subprocess.run([sys.executable, "-m", "symattn", "derive", str(ROOT / "derivations" / "causal.attn"),
                          "--format", "html", "-o", str(html)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and html.read_text().startswith("<!DOCTYPE html>")


def test_document_api():
    spec = symattn.load(TINY, filename="tiny.attn")  # small: the API, not the mathematics, is under test
    assert spec.document("tex").startswith("\\documentclass{article}")
    with pytest.raises(symattn.UsageError, match="unknown document format"):
        spec.document("pdf")


BROADCAST_BIAS = """\
attention bias
dim N = 3, d = 2
input X[N, d]
param b[1, d], c[d]
Y = b + c
O = X * Y + b
output O
"""


def test_a_size_one_axis_is_not_typeset_as_a_sum():
    """grad(c) for c[d] read as [1, d] only drops that axis; grad(b) sums over N and nothing else."""
    spec = symattn.load(BROADCAST_BIAS)
    derivation = spec.derive()
    dims = list(spec.dims)
    shown = {name: to_latex(matrix_box(g.expr, dims)) for name, g in derivation.gradients.items()
             if g.expr is not None}
    assert shown["c"] == "\\mathrm{d}Y"
    assert shown["b"] == "\\mathrm{d}Y+\\sum_{N}\\mathrm{d}O"  # from Y = b + c and from + b
    text = spec.document("md")
    assert not re.search(r"\\sum_\{[^}]*\b1\b", text), "a sum over an axis of size 1"
    assert "$$\n\\mathrm{d}c=\\mathrm{d}Y\n$$" in text


def test_a_sum_on_the_left_of_a_product_is_fenced():
    """(sum_N dO) . b, not sum_N dO . b, which reads as the sum of the product."""
    spec = symattn.load("dim N = 3, d = 2\ninput X[N, d]\nparam b[1, d]\nO = sum(X, axis=-2) * b + X\noutput O\n")
    grad_x = to_latex(matrix_box(spec.derive().gradients["X"].expr, list(spec.dims)))
    assert "\\left(\\sum_{N}\\mathrm{d}O\\right)\\odot b" in grad_x, grad_x
    assert "\\sum_{N}\\mathrm{d}O\\odot" not in grad_x


# Appended to a copy of a document (the documents themselves carry no script): which boxes
# stick out past the window without a scrolling box around them, and which code blocks hide text.
_OVERFLOW_PROBE = """<script>
window.addEventListener('load', () => {
  const found = [];
  const scrolls = (el) => {
    for (let a = el.parentElement; a; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible' && a.getBoundingClientRect().right <= innerWidth + 1) return true;
    }
    return false;
  };
  for (const el of document.querySelectorAll('pre, table, math, p, li, figure')) {
    if (el.getBoundingClientRect().right > innerWidth + 1 && !scrolls(el)) found.push('past the window: ' + el.tagName);
    if (el.tagName === 'PRE' && el.scrollWidth > el.clientWidth + 1) found.push('cut off: PRE');
  }
  if (document.documentElement.scrollWidth > innerWidth + 1) found.push('the page scrolls sideways');
  const out = document.createElement('div');
  out.id = 'overflow-probe';
  out.textContent = 'PROBE[' + found.join('; ') + ']';
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_long_lines_stay_inside_a_narrow_window_in_headless_chromium(tmp_path):
    """causal.html has a long counterexample line and additive.html long formulas: at 600 px wide
    nothing runs past the window and no code block hides text (wide tables and formulas scroll)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless Chromium installed (Debian package 'chromium')")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=600,1000", "--virtual-time-budget=5000"]
    for name in ("causal", "additive"):
        html = (ROOT / "derivations" / f"{name}.html").read_text("utf-8")
        assert name != "causal" or max(len(line) for line in html.split("<pre>")[1].split("\n")) > 200
        page = tmp_path / f"{name}.html"
        page.write_text(html.replace("</body>", _OVERFLOW_PROBE + "</body>"), "utf-8")
        dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                             timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        found = re.search(r'<div id="overflow-probe">PROBE\[(.*?)\]</div>', dom.stdout)
        assert found is not None, "the probe did not run"
        assert found.group(1) == "", f"{name}.html: {found.group(1)}"


# --- what a reader can act on: no bare "Unknown", which head a heatmap shows, tables that fit ---


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_gradient_says_what_was_checked(built, path):
    """Each gradient section ends in one note: checked, or what the element level found and what to run."""
    text = render(built[path.stem], "md")
    assert not re.search(r"^Unknown", text, flags=re.M)
    sections = re.split(r"^### grad\(", text.split("## Backward pass")[1].split("## Checks")[0], flags=re.M)[1:]
    for section in sections:
        notes = re.findall(r"^(Checked: |Not confirmed at the element level: |Not checked at the element level: )",
                           section, flags=re.M)
        assert len(notes) == 1, section[:200]
        if notes[0] != "Checked: ":
            assert f"`symattn check {path.name} --explain`" in section


def test_a_gradient_the_element_level_did_not_confirm_says_what_ran_and_what_to_run():
    from symattn.docs.document import _gradient_note
    from symattn.prove.verdicts import GradientCheck, Verdict

    spec = symattn.load(ROOT / "derivations" / "key_padding.attn", filename="derivations/key_padding.attn").typed
    stated = Verdict(25, "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1))", "proved",
                     "matrix level: canonical index forms agree for all sizes")
    other = Verdict(24, "grad(V) == P.T @ grad(O)", "proved", "matrix level: canonical index forms agree for all sizes")
    note = _gradient_note(spec, GradientCheck("S", False, "not shown equal at N=4, d=3, d_k=2"), [other, stated])
    assert note == (
        "Not confirmed at the element level: at N=4, d=3, d_k=2 the exact comparison of every entry with the "
        "element-level chain rule did not reduce to an identity. No entry was shown to differ, so this is neither "
        "a proof nor a refutation of the formula. The spec's check at line 25 (`grad(S) == P * (grad(P) - "
        "sum(grad(P) * P, axis=-1))`), which compares the derived formula with the one it states, is proved: "
        "matrix level: canonical index forms agree for all sizes. To learn more: `symattn check key_padding.attn "
        "--explain` (the steps of every check, and every gradient against the chain rule) and `symattn verify "
        "key_padding.attn --target numpy` (the generated code against central finite differences).")
    budget = _gradient_note(spec, GradientCheck("V", False, "not checked: gave up after 1 s"), [other])
    assert budget.startswith("Not checked at the element level: gave up after 1 s. The spec's check at line 24")
    assert _gradient_note(spec, GradientCheck("V", True, "exact identity of every entry at N=4"), []) == \
        "Checked: exact identity of every entry at N=4."


@pytest.mark.parametrize("name, shown", [
    ("self_attention", "the weights P are:"),
    ("multi_head", "the weights P[0, :, :] (the first of h = 2) are:"),        # P [h, N, N], h = 2
    ("gqa", "the weights P[0, 0, :, :] (the first of g = 2 and of r = 2) are:"),  # P [g, r, N, N]
])
def test_the_example_says_which_matrix_of_the_weights_it_shows(built, name, shown):
    assert shown in render(built[name], "md")


@pytest.mark.parametrize("name, caption", [
    ("self_attention", "![The attention weights P of the small example](self_attention-weights.png)"),
    ("multi_head", "![The attention weights P[0, :, :] of the small example (the first of h = 2)]"
                   "(multi_head-weights.png)"),
])
def test_the_heatmap_says_which_matrix_it_shows(built, name, caption):
    from symattn.docs import figures

    if not figures.available():
        pytest.skip("the heatmap needs matplotlib (pip install 'symattn[plots]')")
    assert caption in render(built[name], "md")


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_the_cost_table_has_one_formula_a_row(built, path):
    text = render(built[path.stem], "md").split("## Cost")[1]
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows and all(line.count("$") == 2 for line in rows), rows


def test_tables_fit_a_1200_px_window_in_headless_chromium(tmp_path):
    """At 1200 px wide no table of the widest documents hides a column behind a scroll bar (a table
    wider than the text column takes the window's width around it)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless Chromium installed (Debian package 'chromium')")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1000", "--virtual-time-budget=5000"]
    for name in ("gqa", "multi_head", "additive"):
        page = tmp_path / f"{name}.html"
        html = (ROOT / "derivations" / f"{name}.html").read_text("utf-8")
        page.write_text(html.replace("</body>", _TABLE_PROBE + "</body>"), "utf-8")
        dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                             timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        found = re.search(r'<div id="table-probe">PROBE\[(.*?)\]</div>', dom.stdout)
        assert found is not None, "the probe did not run"
        assert found.group(1) == "", f"{name}.html: {found.group(1)}"


_TABLE_PROBE = """<script>
window.addEventListener('load', () => {
  const found = [];
  document.querySelectorAll('table').forEach((t, k) => {
    const r = t.getBoundingClientRect();
    if (t.scrollWidth > t.clientWidth + 1) found.push(`table ${k} hides ${t.scrollWidth - t.clientWidth} px`);
    if (r.left < 0 || r.right > innerWidth + 1) found.push(`table ${k} runs past the window`);
  });
  const out = document.createElement('div');
  out.id = 'table-probe';
  out.textContent = 'PROBE[' + found.join('; ') + ']';
  document.body.appendChild(out);
});
</script>"""
