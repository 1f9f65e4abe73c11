"""Typeset mathematics once, render it as LaTeX or MathML.

Contract: the document printers build small trees of `Box` nodes (identifier,
number, operator, row, sub/superscript, fraction, root, fence, function,
text) and render them with `to_latex(box)` or `to_mathml(box)`, two `Printer`s
(`symattn.ir.printer`) with one `_print_<Box>` rule per kind of box. One tree,
two renderers: LaTeX for Markdown (GitHub renders `$...$`) and `.tex` files,
presentation MathML for HTML that renders offline. Text is escaped for the
target; identifiers come from validated spec names.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..ir.printer import Printed, Printer

__all__ = [
    "Box", "Ident", "Num", "Op", "Row", "Sub", "Sup", "SubSup", "Frac", "Sqrt", "Fence", "Func", "Text",
    "to_latex", "to_mathml", "row", "ident", "LatexPrinter", "MathMLPrinter",
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


class LatexPrinter(Printer):
    """Boxes as LaTeX source, one `_print_<Box>` rule per kind of box (brackets are explicit `Fence`s)."""

    rules = "LaTeX"

    def render(self, box: Box) -> str:
        return self.doprint(box).text

    def base(self, box: Box) -> str:
        """The base of a sub/superscript: braced when it carries scripts itself."""
        text = self.render(box)
        return f"{{{text}}}" if isinstance(box, (Sub, Sup, SubSup)) else text

    def _print_Ident(self, box: Ident) -> Printed:
        if box.latex:
            return Printed(box.latex)
        text = _latex_text(box.text)
        return Printed(f"\\mathrm{{{text}}}" if box.upright else text)

    def _print_Num(self, box: Num) -> Printed:
        return Printed(box.text)

    def _print_Op(self, box: Op) -> Printed:
        return Printed(box.latex)

    def _print_Row(self, box: Row) -> Printed:
        out = ""
        for item in box.items:
            piece = self.render(item)
            if out and out[-1].isalpha() and piece[:1].isalpha():
                out += " "
            out += piece
        return Printed(out)

    def _print_Sub(self, box: Sub) -> Printed:
        return Printed(f"{self.base(box.base)}_{{{self.render(box.sub)}}}")

    def _print_Sup(self, box: Sup) -> Printed:
        return Printed(f"{self.base(box.base)}^{{{self.render(box.sup)}}}")

    def _print_SubSup(self, box: SubSup) -> Printed:
        return Printed(f"{self.base(box.base)}_{{{self.render(box.sub)}}}^{{{self.render(box.sup)}}}")

    def _print_Frac(self, box: Frac) -> Printed:
        return Printed(f"\\frac{{{self.render(box.num)}}}{{{self.render(box.den)}}}")

    def _print_Sqrt(self, box: Sqrt) -> Printed:
        return Printed(f"\\sqrt{{{self.render(box.x)}}}")

    def _print_Fence(self, box: Fence) -> Printed:
        left = {"(": "\\left(", "[": "\\left[", "|": "\\left|", "{": "\\left\\{", "⌊": "\\left\\lfloor ",
                "⌈": "\\left\\lceil "}[box.left]
        right = {")": "\\right)", "]": "\\right]", "|": "\\right|", "}": "\\right\\}", "⌋": "\\right\\rfloor ",
                 "⌉": "\\right\\rceil "}[box.right]
        return Printed(f"{left}{self.render(box.x)}{right}")

    def _print_Func(self, box: Func) -> Printed:
        head = f"\\{box.name}" if box.known else f"\\operatorname{{{_latex_text(box.name)}}}"
        args = ", ".join(self.render(a) for a in box.args)
        return Printed(f"{head}\\left({args}\\right)")

    def _print_Text(self, box: Text) -> Printed:
        return Printed(f"\\text{{{_latex_text(box.text)}}}")


_LATEX = LatexPrinter()


def to_latex(box: Box) -> str:
    return _LATEX.render(box)


# --- MathML -------------------------------------------------------------------------


def to_mathml(box: Box, display: bool = False) -> str:
    """A complete <math> element."""
    mode = ' display="block"' if display else ""
    return f'<math xmlns="http://www.w3.org/1998/Math/MathML"{mode}>{_MATHML.render(box)}</math>'


class MathMLPrinter(Printer):
    """Boxes as presentation MathML, one `_print_<Box>` rule per kind of box."""

    rules = "MathML"

    def render(self, box: Box) -> str:
        return self.doprint(box).text

    def _print_Ident(self, box: Ident) -> Printed:
        variant = ' mathvariant="normal"' if box.upright and len(box.text) == 1 else ""
        return Printed(f"<mi{variant}>{escape(box.text)}</mi>")

    def _print_Num(self, box: Num) -> Printed:
        return Printed(f"<mn>{escape(box.text)}</mn>")

    def _print_Op(self, box: Op) -> Printed:
        return Printed(f"<mo>{escape(box.text)}</mo>")

    def _print_Row(self, box: Row) -> Printed:
        return Printed("<mrow>" + "".join(self.render(i) for i in box.items) + "</mrow>")

    def _print_Sub(self, box: Sub) -> Printed:
        return Printed(f"<msub>{self.render(box.base)}{self.render(box.sub)}</msub>")

    def _print_Sup(self, box: Sup) -> Printed:
        return Printed(f"<msup>{self.render(box.base)}{self.render(box.sup)}</msup>")

    def _print_SubSup(self, box: SubSup) -> Printed:
        return Printed(f"<msubsup>{self.render(box.base)}{self.render(box.sub)}{self.render(box.sup)}</msubsup>")

    def _print_Frac(self, box: Frac) -> Printed:
        return Printed(f"<mfrac>{self.render(box.num)}{self.render(box.den)}</mfrac>")

    def _print_Sqrt(self, box: Sqrt) -> Printed:
        return Printed(f"<msqrt>{self.render(box.x)}</msqrt>")

    def _print_Fence(self, box: Fence) -> Printed:
        return Printed(f'<mrow><mo fence="true">{escape(box.left)}</mo>{self.render(box.x)}'
                       f'<mo fence="true">{escape(box.right)}</mo></mrow>')

    def _print_Func(self, box: Func) -> Printed:
        args = "<mo>,</mo>".join(self.render(a) for a in box.args)
        return Printed(f'<mrow><mi mathvariant="normal">{escape(box.name)}</mi><mo>&#x2061;</mo>'
                       f'<mrow><mo fence="true">(</mo>{args}<mo fence="true">)</mo></mrow></mrow>')

    def _print_Text(self, box: Text) -> Printed:
        return Printed(f"<mtext>{escape(box.text)}</mtext>")


_MATHML = MathMLPrinter()
