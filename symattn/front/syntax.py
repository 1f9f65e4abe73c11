"""The syntax IR: what a spec says, before any name or shape is resolved.

Contract: a closed set of frozen, slotted dataclasses with tuple children,
built only by `symattn.front.parse`. Every node carries its source position `pos`
(excluded from equality and hashing, so equal subexpressions at different
places compare equal and can be cached). `symattn.front.validate` turns a
`Program` into the typed IR of `symattn.ir.typed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.position import NOWHERE, Pos

__all__ = [
    "Pos",
    "Expr",
    "Number",
    "Name",
    "Call",
    "Keyword",
    "Subscript",
    "SliceItem",
    "Sliced",
    "CallSubscript",
    "BinOp",
    "UnaryOp",
    "Transpose",
    "Compare",
    "Group",
    "Statement",
    "Header",
    "DimItem",
    "DimDecl",
    "TensorItem",
    "ValueRange",
    "TensorDecl",
    "IndexItem",
    "Define",
    "OutputDecl",
    "Check",
    "Program",
]




def _pos() -> Pos:
    return field(default=NOWHERE, compare=False, repr=False)


# --- expressions -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expr:
    """Base of every expression node."""


@dataclass(frozen=True, slots=True)
class Number(Expr):
    text: str
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Name(Expr):
    id: str
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Keyword(Expr):
    """`name=value` inside a call's argument list (only `axis=` is meaningful)."""

    name: str
    value: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Call(Expr):
    func: str
    args: tuple[Expr, ...]
    pos: Pos = _pos()
    func_pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Subscript(Expr):
    """`X[i, k]`: one entry of a tensor, in index notation; or `X[:, 0:h]`, a slice of it."""

    name: str
    indices: tuple[Expr, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class SliceItem(Expr):
    """`start:stop` inside brackets; either bound may be missing (`:`, `:h`, `1:`)."""

    start: Expr | None
    stop: Expr | None
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Sliced(Expr):
    """`(expr)[...]` or `grad(X)[...]`: brackets after something that is not a name (slicing only)."""

    base: Expr
    indices: tuple[Expr, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class CallSubscript(Expr):
    """`grad(S)[i, j]`: one entry of a call's result, in index notation (only `grad` has entries)."""

    call: Call
    indices: tuple[Expr, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class BinOp(Expr):
    op: str  # one of + - * / // % @ ^ & |
    left: Expr
    right: Expr
    pos: Pos = _pos()
    op_pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class UnaryOp(Expr):
    op: str  # + - or ~
    operand: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Transpose(Expr):
    operand: Expr
    pos: Pos = _pos()
    op_pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    op: str  # < <= > >= == !=
    left: Expr
    right: Expr
    pos: Pos = _pos()
    op_pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Group(Expr):
    """`(X, keep)`: tensors a symmetry claim permutes together (only meaningful there)."""

    items: tuple[Expr, ...]
    pos: Pos = _pos()


# --- statements --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Statement:
    """Base of every statement node."""


@dataclass(frozen=True, slots=True)
class Header(Statement):
    name: Name
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class DimItem:
    name: Name
    size: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class DimDecl(Statement):
    items: tuple[DimItem, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class ValueRange:
    """`in low:high` after an integer buffer: every entry is an integer in low .. high - 1."""

    low: Expr
    high: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class TensorItem:
    name: Name
    shape: tuple[Expr, ...] | None  # None: a scalar (no brackets)
    pos: Pos = _pos()
    values: ValueRange | None = None  # `in 0:D`: an integer buffer


@dataclass(frozen=True, slots=True)
class TensorDecl(Statement):
    kind: str  # "input", "param" or "buffer"
    items: tuple[TensorItem, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class IndexItem:
    name: Name
    range: Expr | None  # `i:N` gives it; None: inferred
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Define(Statement):
    """`NAME = expr` (indices None) or `NAME[i, j] = expr` (index notation)."""

    name: Name
    indices: tuple[IndexItem, ...] | None
    expr: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class OutputDecl(Statement):
    names: tuple[Name, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Check(Statement):
    negated: bool
    claim: Expr
    text: str  # the claim as written, for reports
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Program:
    statements: tuple[Statement, ...]
