"""Typeset mathematics once, render it as LaTeX or MathML.

Contract: the document printers build small trees of `Box` nodes (identifier,
number, operator, row, sub/superscript, fraction, root, fence, function,
text) and render them with `to_latex(box)` or `to_mathml(box)`. One tree,
two renderers: LaTeX for Markdown (GitHub renders `$...$`) and `.tex` files,
presentation MathML for HTML that renders offline. Text is escaped for the
target; identifiers come from validated spec names.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

__all__ = [
    "Box", "Ident", "Num", "Op", "Row", "Sub", "Sup", "SubSup", "Frac", "Sqrt", "Fence", "Func", "Text",
    "to_latex", "to_mathml", "row", "ident",
]


@dataclass(frozen=True)
class Box:
    pass


@dataclass(frozen=True)
class Ident(Box):
    """An identifier; `latex` may be a command (`\\alpha`), `text` the Unicode glyph."""

    text: str
    latex: str | None = None
    upright: bool = False


@dataclass(frozen=True)
class Num(Box):
    text: str


@dataclass(frozen=True)
class Op(Box):
    """An operator: Unicode glyph for MathML, LaTeX source for LaTeX."""

    text: str
    latex: str


@dataclass(frozen=True)
class Row(Box):
    items: tuple[Box, ...]


@dataclass(frozen=True)
class Sub(Box):
    base: Box
    sub: Box


@dataclass(frozen=True)
class Sup(Box):
    base: Box
    sup: Box


@dataclass(frozen=True)
class SubSup(Box):
    base: Box
    sub: Box
    sup: Box


@dataclass(frozen=True)
class Frac(Box):
    num: Box
    den: Box


@dataclass(frozen=True)
class Sqrt(Box):
    x: Box


@dataclass(frozen=True)
class Fence(Box):
    x: Box
    left: str = "("
    right: str = ")"


@dataclass(frozen=True)
class Func(Box):
    """`\\operatorname{name}` applied to fenced, comma-separated arguments."""

    name: str
    args: tuple[Box, ...]
    known: bool = False  # LaTeX has a command for it (\\exp, \\log, ...)


@dataclass(frozen=True)
class Text(Box):
    text: str


def row(*items: Box) -> Row:
    flat: list[Box] = []
    for item in items:
        if isinstance(item, Row):
            flat.extend(item.items)
        else:
            flat.append(item)
    return Row(tuple(flat))


_GREEK = {"alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "theta": "θ", "lambda": "λ", "mu": "μ",
          "pi": "π", "sigma": "σ", "tau": "τ", "phi": "φ", "omega": "ω", "Pi": "Π", "Sigma": "Σ"}


def ident(name: str) -> Box:
    """A spec name as people write it: `W_q` -> W^{q}, `d_k` -> d_{k}, `alpha` -> α."""
    base, _, rest = name.partition("_")
    if base in _GREEK:
        head: Box = Ident(_GREEK[base], "\\" + base)
    else:
        head = Ident(base)
    if not rest:
        return head
    if len(base) == 1 and base.isupper():
        return Sup(head, Ident(rest, upright=len(rest) > 1))
    return Sub(head, Ident(rest, upright=len(rest) > 1))


# --- LaTeX ------------------------------------------------------------------------

_LATEX_ESCAPE = {"_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "{": "\\{", "}": "\\}", "$": "\\$"}


def _latex_text(text: str) -> str:
    return "".join(_LATEX_ESCAPE.get(c, c) for c in text)


def to_latex(box: Box) -> str:
    if isinstance(box, Ident):
        if box.latex:
            return box.latex
        text = _latex_text(box.text)
        return f"\\mathrm{{{text}}}" if box.upright else text
    if isinstance(box, Num):
        return box.text
    if isinstance(box, Op):
        return box.latex
    if isinstance(box, Row):
        out = ""
        for item in box.items:
            piece = to_latex(item)
            if out and out[-1].isalpha() and piece[:1].isalpha():
                out += " "
            out += piece
        return out
    if isinstance(box, Sub):
        return f"{_latex_base(box.base)}_{{{to_latex(box.sub)}}}"
    if isinstance(box, Sup):
        return f"{_latex_base(box.base)}^{{{to_latex(box.sup)}}}"
    if isinstance(box, SubSup):
        return f"{_latex_base(box.base)}_{{{to_latex(box.sub)}}}^{{{to_latex(box.sup)}}}"
    if isinstance(box, Frac):
        return f"\\frac{{{to_latex(box.num)}}}{{{to_latex(box.den)}}}"
    if isinstance(box, Sqrt):
        return f"\\sqrt{{{to_latex(box.x)}}}"
    if isinstance(box, Fence):
        left = {"(": "\\left(", "[": "\\left[", "|": "\\left|", "{": "\\left\\{"}[box.left]
        right = {")": "\\right)", "]": "\\right]", "|": "\\right|", "}": "\\right\\}"}[box.right]
        return f"{left}{to_latex(box.x)}{right}"
    if isinstance(box, Func):
        head = f"\\{box.name}" if box.known else f"\\operatorname{{{_latex_text(box.name)}}}"
        args = ", ".join(to_latex(a) for a in box.args)
        return f"{head}\\left({args}\\right)"
    if isinstance(box, Text):
        return f"\\text{{{_latex_text(box.text)}}}"
    raise TypeError(f"no LaTeX rule for {type(box).__name__}")


def _latex_base(box: Box) -> str:
    text = to_latex(box)
    if isinstance(box, (Sub, Sup, SubSup)):
        return f"{{{text}}}"
    return text


# --- MathML -------------------------------------------------------------------------


def to_mathml(box: Box, display: bool = False) -> str:
    """A complete <math> element."""
    mode = ' display="block"' if display else ""
    return f'<math xmlns="http://www.w3.org/1998/Math/MathML"{mode}>{_ml(box)}</math>'


def _ml(box: Box) -> str:
    if isinstance(box, Ident):
        variant = ' mathvariant="normal"' if box.upright and len(box.text) == 1 else ""
        return f"<mi{variant}>{escape(box.text)}</mi>"
    if isinstance(box, Num):
        return f"<mn>{escape(box.text)}</mn>"
    if isinstance(box, Op):
        return f"<mo>{escape(box.text)}</mo>"
    if isinstance(box, Row):
        return "<mrow>" + "".join(_ml(i) for i in box.items) + "</mrow>"
    if isinstance(box, Sub):
        return f"<msub>{_ml(box.base)}{_ml(box.sub)}</msub>"
    if isinstance(box, Sup):
        return f"<msup>{_ml(box.base)}{_ml(box.sup)}</msup>"
    if isinstance(box, SubSup):
        return f"<msubsup>{_ml(box.base)}{_ml(box.sub)}{_ml(box.sup)}</msubsup>"
    if isinstance(box, Frac):
        return f"<mfrac>{_ml(box.num)}{_ml(box.den)}</mfrac>"
    if isinstance(box, Sqrt):
        return f"<msqrt>{_ml(box.x)}</msqrt>"
    if isinstance(box, Fence):
        return (f'<mrow><mo fence="true">{escape(box.left)}</mo>{_ml(box.x)}'
                f'<mo fence="true">{escape(box.right)}</mo></mrow>')
    if isinstance(box, Func):
        args = "<mo>,</mo>".join(_ml(a) for a in box.args)
        return (f'<mrow><mi mathvariant="normal">{escape(box.name)}</mi><mo>&#x2061;</mo>'
                f'<mrow><mo fence="true">(</mo>{args}<mo fence="true">)</mo></mrow></mrow>')
    if isinstance(box, Text):
        return f"<mtext>{escape(box.text)}</mtext>"
    raise TypeError(f"no MathML rule for {type(box).__name__}")
