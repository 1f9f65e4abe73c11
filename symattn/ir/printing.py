"""Print typed-IR nodes back in spec syntax.

Contract: `to_spec(node, dims)` returns text that the spec language parses
back to the same node (same operations, same parenthesisation), so that
derived gradients, claims and documents all read like the user's own spec:
`P.T @ grad(O)`, `softmax(Q @ K.T / sqrt(d_k), axis=-1)`. `SpecPrinter` is a
`Printer` (`symattn.ir.printer`) with one `_print_<Node>` rule per node type
and the shared precedence table, which follows the grammar; an unknown node
type is an error naming it.
"""

from __future__ import annotations

from typing import Sequence

import sympy

from . import typed as t
from .affine import text as affine_text
from .functions import OPERATIONS
from .gather import gather_form
from .printer import ADD, ATOM, BINARY, COMPARE, LOGICAL, MUL, NEG, POSTFIX, Printed, Printer
from .shapes import format_dim

__all__ = ["to_spec", "SpecPrinter"]



def to_spec(node: t.Node, dims: Sequence[str] = ()) -> str:
    """The node as spec text."""
    return SpecPrinter(dims).doprint(node).text


def _decimal(value: sympy.Rational) -> str | None:
    """The exact decimal text of a rational whose denominator is 2^a 5^b with b > 0 (0.9, 0.125, 2.05); None for
    others (1/2 stays a fraction, as derivations write it)."""
    q, twos, fives = value.q, 0, 0
    while q % 2 == 0:
        q, twos = q // 2, twos + 1
    while q % 5 == 0:
        q, fives = q // 5, fives + 1
    if q != 1 or fives == 0:
        return None
    places = max(twos, fives)
    digits = str(abs(value.p) * 10 ** places // value.q).rjust(places + 1, "0")
    return ("-" if value < 0 else "") + digits[:-places] + "." + digits[-places:]


def _axis_text(axis: int | None, rank: int) -> str:
    return "" if axis is None else f", axis={axis - rank}"


def _mixing(node: t.Node) -> bool:
    """`*` or `/` beside `@`: legal without brackets, but people misread it."""
    return isinstance(node, t.Binary) and node.op in ("mul", "div")


class SpecPrinter(Printer):
    """Spec text; `dims` orders the factors of dim expressions as they were declared."""

    def __init__(self, dims: Sequence[str] = ()) -> None:
        self.dims = tuple(dims)

    def text(self, node: t.Node) -> str:
        return self.doprint(node).text

    def dim(self, dim: sympy.Expr) -> str:
        return format_dim(dim, self.dims)

    def call(self, name: str, *args: str) -> Printed:
        return Printed(f"{name}({', '.join(args)})", self.prec("call"))

    def number(self, value: sympy.Expr) -> Printed:
        if value == sympy.oo:
            return Printed("inf", ATOM)
        if value == -sympy.oo:
            return Printed("-inf", NEG)
        if value == sympy.pi:
            return Printed("pi", ATOM)
        if value.is_Rational:
            if value.q == 1:
                return Printed(str(value), ATOM if value >= 0 else NEG)
            decimal = _decimal(value)
            if decimal is not None:  # a decimal literal of the spec (0.9 is 9/10): written back as one
                return Printed(decimal, ATOM if value >= 0 else NEG)
            return Printed(f"{value.p}/{value.q}", self.prec("div"))
        return Printed(str(value), ATOM)

    def _print_Tensor(self, node: t.Tensor) -> Printed:
        return Printed(node.name, self.prec("name"))

    def _print_Grad(self, node: t.Grad) -> Printed:
        return self.call("grad", node.name)

    def _print_Tangent(self, node: t.Tangent) -> Printed:
        return self.call("tangent", self.doprint(node.x).text)

    def _print_Scalar(self, node: t.Scalar) -> Printed:
        return self.number(node.value)

    def _print_DimValue(self, node: t.DimValue) -> Printed:
        text = self.dim(node.dim)
        if node.dim.is_Symbol or node.dim.is_Integer:
            return Printed(text, ATOM)
        return Printed(text, ADD if node.dim.is_Add else MUL)

    def _print_Unary(self, node: t.Unary) -> Printed:
        if node.fn == "neg":
            return Printed("-" + self.parenthesize(node.x, NEG), self.prec("neg"))
        return self.call(node.fn, self.text(node.x))

    def _print_Binary(self, node: t.Binary) -> Printed:
        level = self.prec(node.op)
        if node.op == "pow":
            return Printed(f"{self.parenthesize(node.a, POSTFIX)}^{self.parenthesize(node.b, NEG)}", level)
        if node.op == "mul" and isinstance(node.a, t.MatMul):
            # `(A @ B) * C`: legal without brackets, but people misread it
            left = self.fence(self.parenthesize(node.a, level))
            return Printed(f"{left} * {self.parenthesize(node.b, level + 1)}", level)
        # The right operand of `*` or `/` is bracketed whenever it is a product (precedence
        # MUL), a matrix product included, so it needs no second pair.
        return Printed(self.infix(node.a, BINARY[node.op], node.b, level), level)

    def _print_MatMul(self, node: t.MatMul) -> Printed:
        level = self.prec("matmul")
        left = self.fence(self.text(node.a)) if _mixing(node.a) else self.parenthesize(node.a, level)
        return Printed(f"{left} @ {self.parenthesize(node.b, level + 1)}", level)

    def _print_Transpose(self, node: t.Transpose) -> Printed:
        return Printed(f"{self.parenthesize(node.x, POSTFIX)}.T", self.prec("transpose"))

    def _print_Reduce(self, node: t.Reduce) -> Printed:
        return self.call(node.kind, self.text(node.x) + _axis_text(node.axis, len(node.x.shape)))

    def _print_Scan(self, node: t.Scan) -> Printed:
        flag = ", reverse=1" if node.reverse else ""
        return self.call("cumsum", self.text(node.x) + _axis_text(node.axis, len(node.x.shape)) + flag)

    def _print_Softmax(self, node: t.Softmax) -> Printed:
        return self.call("softmax", self.text(node.x) + _axis_text(node.axis, len(node.x.shape)))

    def _print_Compare(self, node: t.Compare) -> Printed:
        return Printed(f"{self.parenthesize(node.a, ADD)} {node.op} {self.parenthesize(node.b, ADD)}",
                       self.prec("compare"))

    def _print_Where(self, node: t.Where) -> Printed:
        return self.call("where", *(self.text(x) for x in (node.cond, node.a, node.b)))

    def _print_Logical(self, node: t.Logical) -> Printed:
        """`(a) & (b)`, `(a) | (b)`, `~(a)`: each comparison in brackets, as the language requires."""
        parts = [self.fence(self.text(x)) if isinstance(x, t.Compare) else self.parenthesize(x, NEG)
                 for x in node.args]
        if node.op == "not":
            return Printed(LOGICAL["not"] + parts[0], NEG)
        return Printed(f" {LOGICAL[node.op]} ".join(parts), COMPARE)

    def _print_Apply(self, node: t.Apply) -> Printed:
        record = OPERATIONS[node.fn]
        if record.infix is not None:  # a // b, a % b: left-associative at the level of *
            level = self.prec(node.fn)
            return Printed(self.infix(node.args[0], record.infix, node.args[1], level), level)
        return self.call(node.fn, *(self.text(a) for a in node.args))

    def _print_MergeHeads(self, node: t.MergeHeads) -> Printed:
        return self.call("merge_heads", self.text(node.x))

    def _print_SplitHeads(self, node: t.SplitHeads) -> Printed:
        return self.call("split_heads", self.text(node.x), self.dim(node.heads))

    def _print_Concat(self, node: t.Concat) -> Printed:
        return self.call("concat", *(self.text(p) for p in node.parts), f"axis={node.axis - len(node.shape)}")

    def _print_Constant(self, node: t.Constant) -> Printed:
        return self.call(node.kind, *(self.dim(a) for a in node.args))

    def _print_SumTo(self, node: t.SumTo) -> Printed:
        text = self.text(node.x)
        rank = len(node.x.shape)
        for axis in sorted(node.axes, reverse=True):
            text = f"sum({text}, axis={axis - rank})"
        return Printed(text, self.prec("call"))

    def _print_Slice(self, node: t.Slice) -> Printed:
        cut = f"{self.dim(node.start)}:{self.dim(node.stop)}"
        return Printed(f"{self.parenthesize(node.x, POSTFIX)}[{', '.join([':'] * node.axis + [cut])}]",
                       self.prec("slice"))

    def _print_Scatter(self, node: t.Scatter) -> Printed:
        return self.doprint(gather_form(node))

    def _print_IndexDef(self, node: t.IndexDef) -> Printed:
        indices = ", ".join(i.name for i in node.indices)
        return Printed(f"[{indices}] -> {self.text(node.body)}", self.prec("index_def"))

    def _print_Entry(self, node: t.Entry) -> Printed:
        name = f"grad({node.tensor})" if node.grad else node.tensor
        return Printed(f"{name}[{', '.join(self.subscript(i) for i in node.indices)}]", ATOM)

    def subscript(self, s) -> str:
        """A subscript: an index, affine arithmetic of indices, or an integer node (`table[j // S]`)."""
        return self.text(s) if isinstance(s, t.Node) else affine_text(s, self.dims)

    def _print_IndexVar(self, node: t.IndexVar) -> Printed:
        return Printed(node.name, self.prec("name"))

    def _print_IndexSum(self, node: t.IndexSum) -> Printed:
        return self.call("sum", self.summed(node), self.text(node.body))

    def summed(self, node: t.IndexSum) -> str:
        """`k`, or `c:h` when the body reads c only in computed subscripts (its range cannot be inferred)."""
        name = node.index.name
        entries = [n for n in t.walk(node.body) if isinstance(n, t.Entry)]
        plain = any(name in n.indices for n in entries)
        computed = any(not isinstance(s, str) and name in t.subscript_names(s) for n in entries for s in n.indices)
        return f"{name}:{self.dim(node.index.range)}" if computed and not plain else name
