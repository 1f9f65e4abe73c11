"""Print typed-IR nodes back in spec syntax.

Contract: `to_spec(node, dims)` returns text that the spec language parses
back to the same node (same operations, same parenthesisation), so that
derived gradients, claims and documents all read like the user's own spec:
`P.T @ grad(O)`, `softmax(Q @ K.T / sqrt(d_k), axis=-1)`. One `_print`
rule per node type; an unknown node type is an error naming it.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Sequence

import sympy

from . import typed as t
from .affine import Affine, text as subscript_text
from .gather import gather_form
from .shapes import format_dim

__all__ = ["to_spec"]

# Loosest to tightest, as in the grammar.
COMPARE, ADD, MUL, NEG, POW, POSTFIX, ATOM = range(7)
_BINARY_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "^"}
_BINARY_PREC = {"add": ADD, "sub": ADD, "mul": MUL, "div": MUL, "pow": POW}


def to_spec(node: t.Node, dims: Sequence[str] = ()) -> str:
    """The node as spec text."""
    return _print(node, tuple(dims))[0]


def _wrap(node: t.Node, dims, at_least: int) -> str:
    text, prec = _print(node, dims)
    return f"({text})" if prec < at_least else text


def _axis_text(axis: int | None, rank: int) -> str:
    return "" if axis is None else f", axis={axis - rank}"


@singledispatch
def _print(node, dims) -> tuple[str, int]:
    raise TypeError(f"no printing rule for {type(node).__name__}")


@_print.register
def _(node: t.Tensor, dims):
    return node.name, ATOM


@_print.register
def _(node: t.Grad, dims):
    return f"grad({node.name})", ATOM


@_print.register
def _(node: t.Scalar, dims):
    return scalar_text(node.value)


def scalar_text(value: sympy.Expr) -> tuple[str, int]:
    if value == sympy.oo:
        return "inf", ATOM
    if value == -sympy.oo:
        return "-inf", NEG
    if value == sympy.pi:
        return "pi", ATOM
    if value.is_Rational:
        if value.q == 1:
            return str(value), ATOM if value >= 0 else NEG
        return f"{value.p}/{value.q}", MUL
    return str(value), ATOM


@_print.register
def _(node: t.DimValue, dims):
    text = format_dim(node.dim, dims)
    if node.dim.is_Symbol or node.dim.is_Integer:
        return text, ATOM
    return text, ADD if node.dim.is_Add else MUL


@_print.register
def _(node: t.Unary, dims):
    if node.fn == "neg":
        return "-" + _wrap(node.x, dims, NEG), NEG
    return f"{node.fn}({to_spec(node.x, dims)})", ATOM


@_print.register
def _(node: t.Binary, dims):
    prec = _BINARY_PREC[node.op]
    symbol = _BINARY_SYMBOL[node.op]
    if node.op == "pow":
        return f"{_wrap(node.a, dims, POSTFIX)}^{_wrap(node.b, dims, NEG)}", POW
    left = _wrap(node.a, dims, prec)
    if node.op == "mul" and isinstance(node.a, t.MatMul):
        left = f"({left})"  # `(A @ B) * C`: legal without brackets, but people misread it
    # The right operand of `*` or `/` is bracketed whenever it is a product (precedence
    # MUL), a matrix product included, so it needs no second pair.
    right = _wrap(node.b, dims, prec + 1)
    return f"{left} {symbol} {right}", prec


def _mixing(node: t.Node) -> bool:
    """`*` or `/` beside `@`: legal without brackets, but people misread it."""
    return isinstance(node, t.Binary) and node.op in ("mul", "div")


@_print.register
def _(node: t.MatMul, dims):
    left = f"({to_spec(node.a, dims)})" if _mixing(node.a) else _wrap(node.a, dims, MUL)
    return f"{left} @ {_wrap(node.b, dims, MUL + 1)}", MUL


@_print.register
def _(node: t.Transpose, dims):
    return f"{_wrap(node.x, dims, POSTFIX)}.T", POSTFIX


@_print.register
def _(node: t.Reduce, dims):
    return f"{node.kind}({to_spec(node.x, dims)}{_axis_text(node.axis, len(node.x.shape))})", ATOM


@_print.register
def _(node: t.Softmax, dims):
    return f"softmax({to_spec(node.x, dims)}{_axis_text(node.axis, len(node.x.shape))})", ATOM


@_print.register
def _(node: t.Compare, dims):
    return f"{_wrap(node.a, dims, ADD)} {node.op} {_wrap(node.b, dims, ADD)}", COMPARE


@_print.register
def _(node: t.Where, dims):
    parts = ", ".join(to_spec(x, dims) for x in (node.cond, node.a, node.b))
    return f"where({parts})", ATOM


@_print.register
def _(node: t.MergeHeads, dims):
    return f"merge_heads({to_spec(node.x, dims)})", ATOM


@_print.register
def _(node: t.SplitHeads, dims):
    return f"split_heads({to_spec(node.x, dims)}, {format_dim(node.heads, dims)})", ATOM


@_print.register
def _(node: t.Concat, dims):
    parts = ", ".join(to_spec(p, dims) for p in node.parts)
    return f"concat({parts}, axis={node.axis - len(node.shape)})", ATOM


@_print.register
def _(node: t.Constant, dims):
    return f"{node.kind}({', '.join(format_dim(a, dims) for a in node.args)})", ATOM


@_print.register
def _(node: t.SumTo, dims):
    text = to_spec(node.x, dims)
    rank = len(node.x.shape)
    for axis in sorted(node.axes, reverse=True):
        text = f"sum({text}, axis={axis - rank})"
    return text, ATOM


@_print.register
def _(node: t.Slice, dims):
    cut = f"{format_dim(node.start, dims)}:{format_dim(node.stop, dims)}"
    return f"{_wrap(node.x, dims, POSTFIX)}[{', '.join([':'] * node.axis + [cut])}]", POSTFIX


@_print.register
def _(node: t.Scatter, dims):
    return _print(gather_form(node), dims)


@_print.register
def _(node: t.IndexDef, dims):
    indices = ", ".join(i.name for i in node.indices)
    return f"[{indices}] -> {to_spec(node.body, dims)}", COMPARE


@_print.register
def _(node: t.Entry, dims):
    name = f"grad({node.tensor})" if node.grad else node.tensor
    return f"{name}[{', '.join(subscript_text(i, dims) for i in node.indices)}]", ATOM


@_print.register
def _(node: t.IndexVar, dims):
    return node.name, ATOM


@_print.register
def _(node: t.IndexSum, dims):
    return f"sum({_summed(node, dims)}, {to_spec(node.body, dims)})", ATOM


def _summed(node: t.IndexSum, dims) -> str:
    """`k`, or `c:h` when the body reads c only in computed subscripts (its range cannot be inferred)."""
    name = node.index.name
    entries = [n for n in t.walk(node.body) if isinstance(n, t.Entry)]
    plain = any(name in n.indices for n in entries)
    computed = any(isinstance(s, Affine) and name in s.indices for n in entries for s in n.indices)
    return f"{name}:{format_dim(node.index.range, dims)}" if computed and not plain else name
