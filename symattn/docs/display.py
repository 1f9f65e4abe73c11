"""Specs, derivations, formulas and verdicts as notebook displays (HTML with MathML, and LaTeX).

Contract: the `_repr_html_` and `_repr_latex_` methods of `Spec`, `Derivation`,
`Formula` and `Verdict` call the functions here, which typeset with the same
boxes the derivation documents use (`symattn.docs.mathprint` builds them,
`symattn.docs.mathbox` renders them as MathML or LaTeX), so a formula looks the
same in a notebook as in `derivations/*.html`. HTML is a fragment with inline
styles (no stylesheet, no script); LaTeX is one `$$ ... $$` display that
MathJax renders.

`Formula` is what `derivation["grad(Q)"]` returns: one gradient as spec text,
LaTeX, MathML and a SymPy expression (see `symattn.symbolic.sympy_form` for what that
expression is).
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

import numpy as np

from ..ir import typed as t
from ..present import register
from .mathbox import Box, Num, Op, Text, ident, row, to_latex, to_mathml
from .mathprint import definition_box, gradient_box, grad_box, loss_box, shape_box

if TYPE_CHECKING:
    from ..prove.verdicts import Verdict
    from ..symbolic.derive import Derivation, Formula

__all__ = ["formula_latex", "formula_mathml", "formula_html", "counterexample_lines", "spec_html", "spec_latex",
           "derivation_html", "derivation_latex", "verdict_html", "verdict_latex"]

_BLOCK = 'style="margin:.4em 0;overflow-x:auto;overflow-y:hidden"'
_PRE = 'style="white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;padding:.5em;margin:.3em 0"'
_QUAD = Op("\u2003", "\\quad ")  # an em space before a remark in words
_COLOURS = {"proved": "#1a7f37", "refuted": "#cf222e", "unknown": "#9a6700"}


def _latex_text(text: str) -> str:
    """Text for `\\text{}` or `\\texttt{}`: the characters LaTeX treats specially, escaped."""
    table = {"\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "{": "\\{", "}": "\\}",
             "$": "\\$", "^": "\\^{}", "~": "\\~{}"}
    return "".join(table.get(c, c) for c in text)


# --- one gradient ------------------------------------------------------------------------------


def _gradient_equation(name: str, expr: t.Node | None, spec: t.TypedSpec) -> Box:
    if expr is None:
        return row(grad_box(name), Op("=", "="), Num("0"), _QUAD, Text(f"(L does not depend on {name})"))
    if isinstance(expr, t.Grad) and name in spec.outputs:
        return row(grad_box(name), _QUAD, Text(f"(the upstream gradient of the output {name})"))
    return gradient_box(name, expr, spec)


def _formula_box(formula: "Formula") -> Box:
    return _gradient_equation(formula.tensor, formula.node, formula.spec)


def formula_latex(formula: "Formula") -> str:
    """The equation as the documents typeset it, in LaTeX (no `$` around it)."""
    return to_latex(_formula_box(formula))


def formula_mathml(formula: "Formula") -> str:
    return to_mathml(_formula_box(formula))


def formula_html(formula: "Formula") -> str:
    shown = formula_mathml(formula).replace("<math ", '<math display="block" ', 1)
    return f'<div {_BLOCK} title="{escape(formula.text)}">{shown}</div>'


# --- a whole derivation ---------------------------------------------------------------------------


def derivation_html(derivation: "Derivation") -> str:
    spec = derivation.spec
    parts = [f"<div><p><strong>Backward pass of {escape(spec.name)}</strong>: matrix form, dims symbolic "
             f"(valid for all sizes); the loss is {to_mathml(loss_box(spec))}.</p>"]
    for key in derivation:
        parts.append(formula_html(derivation[key]))
    parts.append("</div>")
    return "\n".join(parts)


def derivation_latex(derivation: "Derivation") -> str:
    spec = derivation.spec
    lines = [to_latex(loss_box(spec))]
    lines += [formula_latex(derivation[key]) for key in derivation]
    return "$$\\begin{gathered}\n" + " \\\\\n".join(lines) + "\n\\end{gathered}$$"


# --- a spec ----------------------------------------------------------------------------------------


def _spec_rows(spec: t.TypedSpec):
    dims = list(spec.dims)
    for name, info in spec.tensors.items():
        sizes = "[" + ", ".join(map(str, spec.concrete_shape(info.shape))) + "]"
        definition = definition_box(name, info, dims) if info.expr is not None else None
        yield name, info, sizes, definition


def spec_html(spec: t.TypedSpec) -> str:
    dims = ", ".join(f"{n} = {spec.sizes[n]}" for n in spec.dims)
    cell = 'style="border:1px solid #ccc;padding:.2em .5em;text-align:left"'
    head = "".join(f"<th {cell}>{h}</th>" for h in ("tensor", "role", "shape", "at these sizes", "definition"))
    rows = []
    for name, info, sizes, definition in _spec_rows(spec):
        shown = to_mathml(definition) if definition is not None else ""
        rows.append(f"<tr><td {cell}>{to_mathml(ident(name))}</td><td {cell}>{escape(info.role)}</td>"
                    f"<td {cell}>{to_mathml(shape_box(info.shape))}</td><td {cell}><code>{sizes}</code></td>"
                    f"<td {cell}>{shown}</td></tr>")
    checks = f"; {len(spec.checks)} check{'s' if len(spec.checks) != 1 else ''}" if spec.checks else ""
    return (f"<div><p><strong>attention {escape(spec.name)}</strong> (dims {escape(dims)}; "
            f"outputs {escape(', '.join(spec.outputs))}{checks})</p>"
            f'<table style="border-collapse:collapse;display:block;max-width:100%;overflow-x:auto">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def spec_latex(spec: t.TypedSpec) -> str:
    lines = ["\\text{tensor} & \\text{role} & \\text{shape} & \\text{definition} \\\\ \\hline"]
    for name, info, _, definition in _spec_rows(spec):
        shown = to_latex(definition) if definition is not None else ""
        lines.append(f"{to_latex(ident(name))} & \\text{{{info.role}}} & {to_latex(shape_box(info.shape))} & "
                     f"{shown} \\\\")
    return ("$$\\begin{array}{l}\n\\textbf{attention " + _latex_text(spec.name) + "} \\\\\n"
            + "\\begin{array}{llll}\n" + "\n".join(lines) + "\n\\end{array}\n\\end{array}$$")


# --- a verdict -------------------------------------------------------------------------------------


def counterexample_lines(verdict: "Verdict") -> list[str]:
    """The counterexample of a refuted claim as text: what differs, then every input (4 digits)."""
    ce = verdict.counterexample
    if ce is None:
        return []
    lines = [f"counterexample for line {verdict.line} ({verdict.claim}): {ce.note}"]
    lines += [f"{k} = {np.array2string(np.asarray(val, dtype=float), precision=4, separator=', ')}"
              for k, val in ce.inputs.items()]
    return lines


def verdict_html(verdict: "Verdict") -> str:
    colour = _COLOURS.get(verdict.verdict, "#000")
    where = f" (line {verdict.line})" if verdict.line else ""
    out = (f'<div><strong style="color:{colour}">{escape(verdict.verdict)}</strong>: '
           f"<code>{escape(verdict.claim)}</code>{where}<br><small>{escape(verdict.method)}</small>")
    lines = counterexample_lines(verdict)
    if lines:
        out += f"<pre {_PRE}>{escape(chr(10).join(lines))}</pre>"
    return out + "</div>"


def verdict_latex(verdict: "Verdict") -> str:
    where = f" (line {verdict.line})" if verdict.line else ""
    lines = [f"\\textbf{{{_latex_text(verdict.verdict)}}}\\text{{: }}\\texttt{{{_latex_text(verdict.claim)}}}"
             f"\\text{{{_latex_text(where)}}}", f"\\text{{{_latex_text(verdict.method)}}}"]
    if verdict.counterexample is not None:
        lines.append(f"\\text{{counterexample: {_latex_text(verdict.counterexample.note)}}}")
    return "$$\\begin{array}{l}\n" + " \\\\\n".join(lines) + "\n\\end{array}$$"


register("Formula", html=formula_html, latex=lambda f: f"$${formula_latex(f)}$$", mathml=formula_mathml)
register("Derivation", html=derivation_html, latex=derivation_latex)
register("Verdict", html=verdict_html, latex=verdict_latex)
