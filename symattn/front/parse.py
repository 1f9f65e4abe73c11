"""Parse `.attn` text into the syntax IR.

Contract: `parse(text, filename)` returns an `ir.Program` or raises
`SpecSyntaxError` located at FILE:LINE:COL; no other exception escapes for
any input string. The grammar is `grammar/attention.lark`, shipped in the
wheel as the package `symattn.grammar` and loaded relative to the package.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Iterator

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from . import syntax as ir
from .. import cache
from ..errors import SpecError, SpecSyntaxError

__all__ = ["parse", "grammar_text", "KEYWORDS"]

KEYWORDS = frozenset({"attention", "dim", "input", "param", "buffer", "output", "check", "not", "in"})

# Deeper expressions are refused: every later pass walks trees recursively,
# and Python's stack would overflow long before a real spec gets near this.
MAX_DEPTH = 100

_OPENERS = {"LPAR": "(", "LSQB": "["}
_CLOSERS = {"RPAR": "LPAR", "RSQB": "LSQB"}

# How an expected terminal reads in an error message.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "_NL": "end of line",
    "$END": "end of file",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COMMA": "','",
    "EQUAL": "'='",
    "COLON": "':'",
    "COMPARE": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/', '//', '%' or '@'",
    "OR_OP": "'|'",
    "AND_OP": "'&'",
    "NOT_OP": "'~'",
    "IN": "'in'",
    "POW_OP": "'^'",
    "TRANSPOSE": "'.T'",
    "INPUT": "'input'",
    "PARAM": "'param'",
    "BUFFER": "'buffer'",
    "NOT": "'not'",
    "ATTENTION": "'attention'",
    "DIM": "'dim'",
    "OUTPUT": "'output'",
    "CHECK": "'check'",
}


def grammar_text() -> str:
    """The grammar of the checkout this package is imported from, or else the installed package's.

    The checkout comes first: an editable install maps `symattn.grammar` to the checkout it
    was installed from, which is not this one when another copy is on `sys.path` first."""
    checkout = Path(__file__).resolve().parents[2] / "grammar" / "attention.lark"
    if checkout.is_file():
        return checkout.read_text("utf-8")
    return resources.files("symattn.grammar").joinpath("attention.lark").read_text("utf-8")


class _BracketLines:
    """Post-lexer: drop newlines inside ( ) and [ ], remembering open brackets."""

    always_accept = ("_NL",)

    def __init__(self) -> None:
        self.open: list[Token] = []

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        self.open = []
        for token in stream:
            if token.type in _OPENERS:
                self.open.append(token)
            elif token.type in _CLOSERS and self.open and self.open[-1].type == _CLOSERS[token.type]:
                self.open.pop()
            elif token.type == "_NL" and self.open:
                continue
            yield token


@functools.lru_cache(maxsize=1)
def _parser() -> tuple[Lark, _BracketLines]:
    """The parser. Lark keeps its analysed grammar in symattn's cache directory (`symattn.cache`;
    Lark checks the file against the grammar, the options and its own version, and rebuilds it
    when it does not match or cannot be read): most of the time a short spec takes to parse."""
    postlex = _BracketLines()
    place = cache.place("parser.lark")
    parser = Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        postlex=postlex,
        propagate_positions=True,
        maybe_placeholders=False,
        cache=False if place is None else str(place),
    )
    return parser, postlex


def _pos_of(node) -> ir.Pos:
    return ir.Pos(node.line, node.column, node.end_line, node.end_column)


@v_args(meta=True)
class ToIR(Transformer):
    """Rule aliases of the grammar, one method each; only builds nodes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    # expressions
    def number(self, meta, children):
        (tok,) = children
        return ir.Number(str(tok), pos=_pos_of(tok))

    def name(self, meta, children):
        (tok,) = children
        return ir.Name(str(tok), pos=_pos_of(tok))

    def call(self, meta, children):
        func = children[0]
        args = tuple(children[1]) if len(children) > 1 else ()
        return ir.Call(str(func), args, pos=_pos_of(meta), func_pos=_pos_of(func))

    def subscript(self, meta, children):
        base, args = children
        if isinstance(base, ir.Name):
            return ir.Subscript(base.id, tuple(args), pos=_pos_of(meta))
        if isinstance(base, ir.Call):  # grad(S)[i, j] in index notation, grad(Q)[:, 0:h] in matrix notation
            return ir.CallSubscript(base, tuple(args), pos=_pos_of(meta))
        return ir.Sliced(base, tuple(args), pos=_pos_of(meta))

    def slice(self, meta, children):
        start, stop = children
        return ir.SliceItem(start, stop, pos=_pos_of(meta))

    def slice_to(self, meta, children):
        (stop,) = children
        return ir.SliceItem(None, stop, pos=_pos_of(meta))

    def slice_from(self, meta, children):
        (start,) = children
        return ir.SliceItem(start, None, pos=_pos_of(meta))

    def slice_all(self, meta, children):
        return ir.SliceItem(None, None, pos=_pos_of(meta))

    def arguments(self, meta, children):
        return list(children)

    def keyword(self, meta, children):
        tok, value = children
        return ir.Keyword(str(tok), value, pos=_pos_of(meta))

    def binop(self, meta, children):
        left, op, right = children
        return ir.BinOp(str(op), left, right, pos=_pos_of(meta), op_pos=_pos_of(op))

    def unary(self, meta, children):
        op, operand = children
        return ir.UnaryOp(str(op), operand, pos=_pos_of(meta))

    def transpose(self, meta, children):
        operand, op = children
        return ir.Transpose(operand, pos=_pos_of(meta), op_pos=_pos_of(op))

    def group(self, meta, children):
        return ir.Group(tuple(children), pos=_pos_of(meta))

    def compare(self, meta, children):
        left, op, right = children
        return ir.Compare(str(op), left, right, pos=_pos_of(meta), op_pos=_pos_of(op))

    # statements
    def header(self, meta, children):
        (tok,) = children
        return ir.Header(ir.Name(str(tok), pos=_pos_of(tok)), pos=_pos_of(meta))

    def dim_item(self, meta, children):
        tok, size = children
        return ir.DimItem(ir.Name(str(tok), pos=_pos_of(tok)), size, pos=_pos_of(meta))

    def dim_decl(self, meta, children):
        return ir.DimDecl(tuple(children), pos=_pos_of(meta))

    def value_range(self, meta, children):
        low, high = children
        return ir.ValueRange(low, high, pos=_pos_of(meta))

    def tensor_item(self, meta, children):
        tok, *shape = children
        values = shape.pop() if shape and isinstance(shape[-1], ir.ValueRange) else None
        name = ir.Name(str(tok), pos=_pos_of(tok))
        # `X[]` cannot parse, so brackets always hold at least one entry.
        return ir.TensorItem(name, tuple(shape) if shape else None, pos=_pos_of(meta), values=values)

    def tensor_decl(self, meta, children):
        kind, *items = children
        return ir.TensorDecl(str(kind), tuple(items), pos=_pos_of(meta))

    def index_item(self, meta, children):
        tok, *rng = children
        return ir.IndexItem(ir.Name(str(tok), pos=_pos_of(tok)), rng[0] if rng else None, pos=_pos_of(meta))

    def definition(self, meta, children):
        tok, expr = children
        return ir.Define(ir.Name(str(tok), pos=_pos_of(tok)), None, expr, pos=_pos_of(meta))

    def index_definition(self, meta, children):
        tok, *indices, expr = children
        return ir.Define(ir.Name(str(tok), pos=_pos_of(tok)), tuple(indices), expr, pos=_pos_of(meta))

    def output_decl(self, meta, children):
        return ir.OutputDecl(tuple(ir.Name(str(t), pos=_pos_of(t)) for t in children), pos=_pos_of(meta))

    def check(self, meta, children):
        negated = len(children) == 2
        claim = children[-1]
        text = self._text[claim_start(claim, meta, self._text):meta.end_pos]
        return ir.Check(negated, claim, " ".join(text.split()), pos=_pos_of(meta))

    def start(self, meta, children):
        return ir.Program(tuple(children))


def claim_start(claim: ir.Expr, meta, text: str) -> int:
    """Offset in `text` where the claim of a check begins (after `check [not]`)."""
    # Lark counts lines by "\n" only; str.splitlines would also split at \f, \x85, ...
    line_start = sum(len(line) for line in text.split("\n")[: claim.pos.line - 1]) + claim.pos.line - 1
    return line_start + claim.pos.column - 1


def _check_depth(tree: Tree) -> None:
    """Refuse expressions nested deeper than MAX_DEPTH (iteratively: no recursion here)."""
    for statement in tree.children:
        if not isinstance(statement, Tree):
            continue
        stack = [(statement, 0)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise SpecSyntaxError(
                    f"this statement nests its expression more than {MAX_DEPTH} levels deep",
                    line=statement.meta.line, column=statement.meta.column,
                    hint="split it into several definitions",
                )
            stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def _describe(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type == "_NL":
        return "end of line"
    return f"'{token.value}'"


def _expected(names) -> str:
    words = sorted({_TERMINAL_WORDS.get(n, f"'{n.lower()}'") for n in names})
    if not words:
        return ""
    if len(words) > 6:
        words = words[:6] + ["..."]
    return "; expected " + ", ".join(words)


def _syntax_error(err: UnexpectedInput, text: str, open_brackets: list[Token]) -> SpecSyntaxError:
    if isinstance(err, UnexpectedCharacters):
        char = text[err.pos_in_stream] if 0 <= err.pos_in_stream < len(text) else "?"
        hint = ("the only postfix is .T (swap the last two axes); call functions as f(x), e.g. transpose(X)"
                if char == "." else None)
        error = SpecSyntaxError(f"unexpected character {char!r}", line=err.line, column=err.column, hint=hint)
    elif isinstance(err, (UnexpectedToken, UnexpectedEOF)):
        token = getattr(err, "token", None)
        if token is None or token.type == "$END":
            lines = text.rstrip("\r\n").split("\n")
            line, column = len(lines), len(lines[-1]) + 1
            what = "end of file"
        else:
            line, column, what = token.line, token.column, _describe(token)
        message = f"unexpected {what}{_expected(getattr(err, 'expected', ()) or ())}"
        hint = None
        lines = text.split("\n")
        line_text = lines[line - 1] if 0 < line <= len(lines) else ""
        first_word = line_text.split("=")[0].split("[")[0].strip()
        if token is not None and token.type == "_NL":
            hint = "the statement ends before it is complete"
        elif token is not None and token.type == "COMPARE" and ("&" in line_text or "|" in line_text):
            hint = ("as in NumPy, & and | bind tighter than a comparison: put each comparison in brackets, "
                    "as in (j <= i) & (doc[i] == doc[j])")
        elif token is not None and token.value == "*" and "**" in line_text[max(0, column - 2):column + 1]:
            hint = "powers are written with ^, as in x^2"
        elif first_word in KEYWORDS:
            hint = f"'{first_word}' is a keyword and cannot be used as a name"
        error = SpecSyntaxError(message, line=line, column=column, hint=hint,
                                length=len(str(getattr(token, "value", "") or " ")))
    else:  # pragma: no cover - lark raises only the kinds above for bad input
        error = SpecSyntaxError(str(err).splitlines()[0], line=getattr(err, "line", 1),
                                column=getattr(err, "column", 1))
    if open_brackets:
        opener = open_brackets[-1]
        if error.line > opener.line or getattr(getattr(err, "token", None), "type", "") in ("$END",):
            return SpecSyntaxError(
                f"'{opener.value}' is never closed",
                line=opener.line,
                column=opener.column,
                hint=f"at {error.line}:{error.column}: {error.message.split(';')[0]}; "
                f"close the '{opener.value}' before the statement ends",
            )
    return error


def parse(text: str, filename: str = "<spec>") -> ir.Program:
    """Parse spec text into an `ir.Program`; raise `SpecSyntaxError` if it is not one."""
    parser, postlex = _parser()
    source = text if text.endswith("\n") else text + "\n"
    try:
        tree = parser.parse(source)
        _check_depth(tree)
        return ToIR(text).transform(tree)
    except SpecError as err:
        raise err.located(filename, text) from None
    except UnexpectedInput as err:
        raise _syntax_error(err, text, list(postlex.open)).located(filename, text) from None
    except VisitError as err:
        inner = err.orig_exc
        if isinstance(inner, SpecError):
            raise inner.located(filename, text) from None
        raise SpecSyntaxError(f"cannot read this statement: {inner}", line=1, column=1).located(
            filename, text
        ) from None
    except LarkError as err:  # pragma: no cover - defensive: keep the no-traceback promise
        raise SpecSyntaxError(str(err).splitlines()[0], line=1, column=1).located(filename, text) from None
