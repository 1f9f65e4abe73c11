"""The document model and its renderings: Markdown (math GitHub renders), standalone HTML
(MathML, renders offline) and LaTeX (compiles with a standard distribution).

Contract: a `Document` is a list of blocks (`Heading`, `Para`, `Display`, `Code`, `Table`,
`Items`, `Figure`), each inline part plain text or a `Math` holding one formula's LaTeX and
MathML; `render(doc, fmt)` writes it in one of `FORMATS`, the same bytes for the same document.
`symattn.docs.document.build` makes the documents.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html import escape
from typing import Callable

import sympy

from .figures import Figure
from .mathbox import Box, to_latex, to_mathml

__all__ = ["Math", "Inline", "Heading", "Para", "Display", "Code", "Table", "Items", "Document", "FORMATS",
           "render", "render_md", "render_html", "render_tex"]


# --- the document model ---------------------------------------------------------------

@dataclass(frozen=True)
class Math:
    """One formula in both renderings."""

    latex: str
    mathml: str

    @staticmethod
    def of(box: Box) -> "Math":
        return Math(to_latex(box), to_mathml(box))

    @staticmethod
    def of_sympy(expr: sympy.Expr) -> "Math":
        # Element symbols are named `P_{1,1}`, `W^{q}_{2,1}`; SymPy's MathML printer wants `P_1,1`.
        plain = {s: sympy.Symbol(s.name.replace("{", "").replace("}", "")) for s in expr.free_symbols}
        inner = sympy.mathml(expr.xreplace(plain), printer="presentation")
        return Math(sympy.latex(expr), f'<math xmlns="http://www.w3.org/1998/Math/MathML">{inner}</math>')


Inline = str | Math


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    parts: list[Inline]


@dataclass
class Display:
    math: Math


@dataclass
class Code:
    text: str


@dataclass
class Table:
    header: list[str]
    rows: list[list[Inline]]


@dataclass
class Items:
    items: list[list[Inline]]


@dataclass
class Document:
    name: str
    title: str
    blocks: list = field(default_factory=list)

    @property
    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]

    def add(self, *blocks) -> None:
        self.blocks.extend(blocks)


# --- rendering ------------------------------------------------------------------------------

def _md_inline(parts: list[Inline]) -> str:
    return "".join(f"${p.latex}$" if isinstance(p, Math) else p for p in parts)


def _md_cell(cell: Inline) -> str:
    return (f"${cell.latex}$" if isinstance(cell, Math) else cell).replace("|", "\\|")


def render_md(doc: Document) -> str:
    out = []
    for b in doc.blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(_md_inline(b.parts))
        elif isinstance(b, Display):
            out.append(f"$$\n{b.math.latex}\n$$")
        elif isinstance(b, Code):
            out.append("```\n" + b.text.replace("```", "'''") + "\n```")
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(b.header) + " |", "|" + "---|" * len(b.header)]
            lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Items):
            out.append("\n".join("- " + _md_inline(i) for i in b.items))
        elif isinstance(b, Figure):
            out.append(f"![{b.caption}]({b.name})")
    return "\n\n".join(out) + "\n"


# Long lines stay inside the page's column: code (a counterexample's note) wraps;
# formulas and lists of steps scroll sideways. On a list the scrolling box is the
# <ul>, not each <li>, which would clip its bullet. A table wider than the column
# takes the window's width around it (centred on the column, which is centred in
# the window), and scrolls sideways only past that.
_CSS = """body{font-family:Georgia,serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.5}
code,pre{font-family:Menlo,Consolas,monospace;font-size:90%}
pre{background:#f6f8fa;padding:.8em;white-space:pre-wrap;overflow-wrap:anywhere;overflow-x:auto}
table{border-collapse:collapse;margin:1em 0;display:block;overflow-x:auto;width:max-content;min-width:100%;
max-width:calc(100vw - 2em);position:relative;left:50%;transform:translateX(-50%)}
td,th{border:1px solid #ccc;padding:.3em .6em}ul,p{overflow-x:auto;overflow-y:hidden}
math[display=block]{margin:.8em 0;overflow-x:auto;overflow-y:hidden;max-width:100%}img{max-width:100%}"""


def _html_inline(parts: list[Inline]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, Math):
            out += p.mathml
        else:
            text = escape(p)
            pieces = text.split("`")
            out += "".join(f"<code>{s}</code>" if k % 2 else s for k, s in enumerate(pieces))
    return out


def render_html(doc: Document) -> str:
    body = []
    for b in doc.blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{escape(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_html_inline(b.parts)}</p>")
        elif isinstance(b, Display):
            body.append(b.math.mathml.replace("<math ", '<math display="block" ', 1))
        elif isinstance(b, Code):
            body.append(f"<pre>{escape(b.text)}</pre>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{escape(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{_html_inline([c])}</td>" for c in r) + "</tr>" for r in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Items):
            body.append("<ul>" + "".join(f"<li>{_html_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Figure):
            data = base64.b64encode(b.png).decode("ascii")
            body.append(f'<figure><img alt="{escape(b.caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{escape(b.caption)}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escape(doc.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


_TEX_TEXT = {"\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "$": "\\$",
             "{": "\\{", "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}"}


def _tex_text(text: str) -> str:
    escaped = "".join(_TEX_TEXT.get(c, c) for c in text)
    pieces = escaped.split("`")
    return "".join(f"\\texttt{{{s}}}" if k % 2 else s for k, s in enumerate(pieces))


def _tex_inline(parts: list[Inline]) -> str:
    return "".join(f"${p.latex}$" if isinstance(p, Math) else _tex_text(p) for p in parts)


def render_tex(doc: Document) -> str:
    out = ["\\documentclass{article}", "\\usepackage[utf8]{inputenc}", "\\usepackage{amsmath,amssymb}",
           "\\usepackage{graphicx}", "\\usepackage[margin=2cm]{geometry}", "\\usepackage{longtable}",
           f"\\title{{{_tex_text(doc.title)}}}", "\\date{}", "\\begin{document}", "\\maketitle"]
    for b in doc.blocks:
        if isinstance(b, Heading):
            if b.level == 1:
                continue
            command = {2: "section", 3: "subsection"}.get(b.level, "paragraph")
            out.append(f"\\{command}*{{{_tex_text(b.text)}}}")
        elif isinstance(b, Para):
            out.append(_tex_inline(b.parts) + "\n")
        elif isinstance(b, Display):
            out.append(f"\\[\n{b.math.latex}\n\\]")
        elif isinstance(b, Code):
            out.append("\\begin{verbatim}\n" + b.text.replace("\\end{verbatim}", "\\end {verbatim}")
                       + "\n\\end{verbatim}")
        elif isinstance(b, Table):
            spec = "l" * len(b.header)
            rows = [" & ".join(_tex_text(h) for h in b.header) + " \\\\ \\hline"]
            rows += [" & ".join(_tex_inline([c]) for c in r) + " \\\\" for r in b.rows]
            out.append(f"\\begin{{longtable}}{{{spec}}}\n" + "\n".join(rows) + "\n\\end{longtable}")
        elif isinstance(b, Items):
            out.append("\\begin{itemize}\n" + "\n".join(f"\\item {_tex_inline(i)}" for i in b.items)
                       + "\n\\end{itemize}")
        elif isinstance(b, Figure):
            out.append(f"\\begin{{figure}}[h]\\centering\\IfFileExists{{{b.name}}}"
                       f"{{\\includegraphics[width=0.6\\textwidth]{{{b.name}}}}}{{}}"
                       f"\\par {_tex_text(b.caption)}\\end{{figure}}")
    out.append("\\end{document}")
    return "\n".join(out) + "\n"


FORMATS: dict[str, Callable[[Document], str]] = {"md": render_md, "html": render_html, "tex": render_tex}


def render(doc: Document, fmt: str = "md") -> str:
    return FORMATS[fmt](doc)
