"""CUDA C syntax for typed-IR expressions: one entry of a tensor as a C expression.

Contract: `CPrinter(names, source).entry(node, coords)` returns the C
expression (float) for the entry of `node` at `coords`, a tuple of C int
expressions, one per axis of `node.shape`. Elementwise operations, `where`,
comparisons, transposes, head merges and splits, slices, concatenations and
constants become arithmetic on the coordinates (NumPy broadcasting by
aligning axes from the right); a tensor, a `grad(T)`, or a subexpression that
another kernel materialised is read from memory through `source.read`.
Index notation is printed with its index names; `sum(k, ...)` becomes a loop
statement collected in `statements`, and the expression reads its
accumulator. The operations form tables (`UNARY`, `BINARY`, `COMPARE`); a node
type without a rule is an error that names it.
"""

from __future__ import annotations

from functools import singledispatchmethod
from typing import Callable, Protocol, Sequence

import sympy

from ...ir.functions import table
from ...ir import typed as t
from ...ir.affine import pieces, signed_sum
from ...errors import SymAttnError
from .names import CNames

__all__ = ["CudaCodegenError", "CPrinter", "Source", "UNARY", "BINARY", "COMPARE", "float_literal", "dim_c",
           "quotients", "numel_c", "offset_c", "align"]


class CudaCodegenError(SymAttnError):
    """A spec (or part of one) that the CUDA generator cannot translate; the message says what."""


# Loosest to tightest, as C parses them.
TERNARY, COMPARE_PREC, ADD, MUL, UNARY_PREC, ATOM = range(6)

# fn -> template over the operand (float32), read live from the function table
UNARY = table("cuda", {"neg": "-{x}"})
BINARY: dict[str, tuple[str, int]] = {
    "add": ("{a} + {b}", ADD),
    "sub": ("{a} - {b}", ADD),
    "mul": ("{a} * {b}", MUL),
    "div": ("{a} / {b}", MUL),
    "pow": ("powf({a}, {b})", ATOM),
}
COMPARE = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
CONSTANT: dict[str, Callable[[Sequence[str], Sequence[str]], str]] = {
    "ones": lambda coords, args: "1.0f",
    "eye": lambda coords, args: f"({coords[0]} == {coords[1]} ? 1.0f : 0.0f)",
    "causal_mask": lambda coords, args: f"({coords[1]} <= {coords[0]} ? 0.0f : -INFINITY)",
    "sinusoidal": lambda coords, args: f"sa_sinusoidal({coords[0]}, {coords[1]}, {args[1]})",
}


def float_literal(value: sympy.Expr) -> str:
    if value == sympy.oo:
        return "INFINITY"
    if value == -sympy.oo:
        return "-INFINITY"
    number = float(value)
    text = repr(number)
    if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
        text += ".0"
    return text + "f"


def dim_c(dim: sympy.Expr, names: CNames) -> str:
    """A dim expression (`h * d_k`) as C int arithmetic over the dim arguments.

    A quotient is one integer division over a common denominator, `((N + 1) / 2)`,
    exact for valid sizes (the host code refuses sizes at which it does not divide).
    """
    dim = sympy.sympify(dim)
    num, den = sympy.fraction(sympy.together(dim))
    if den != 1:
        return f"({_polynomial_c(num, names)} / {_polynomial_c(den, names)})"
    return _polynomial_c(dim, names)


def quotients(dims) -> list[tuple[str, sympy.Expr, sympy.Expr]]:
    """(dim, numerator, denominator) of each dim expression that is a quotient (`d / h`), once each."""
    out = {}
    for dim in dims:
        num, den = sympy.fraction(sympy.together(sympy.sympify(dim)))
        if den != 1:
            out.setdefault(sympy.sympify(dim), (num, den))
    return [(dim, num, den) for dim, (num, den) in out.items()]


def _polynomial_c(dim: sympy.Expr, names: CNames) -> str:
    if dim.is_Integer:
        return str(int(dim))
    if dim.is_Symbol:
        return names.spec("dim", str(dim))
    if dim.is_Add:
        return "(" + " + ".join(_polynomial_c(a, names) for a in dim.args) + ")"
    if dim.is_Mul or dim.is_Rational or (dim.is_Pow and dim.exp.is_Integer):
        top, bottom = [], []
        for factor in sympy.Mul.make_args(dim):
            if factor.is_Rational:
                if factor.p != 1:
                    top.append(str(factor.p))
                if factor.q != 1:
                    bottom.append(str(factor.q))
            elif factor.is_Pow and factor.exp.is_Integer:
                side = top if factor.exp > 0 else bottom
                side += [_polynomial_c(factor.base, names)] * abs(int(factor.exp))
            else:
                top.append(_polynomial_c(factor, names))
        text = " * ".join(top) or "1"
        return f"({text} / ({' * '.join(bottom)}))" if bottom else f"({text})"
    raise CudaCodegenError(f"the dim expression {dim} is not integer arithmetic of dims")


def numel_c(shape: Sequence[sympy.Expr], names: CNames) -> str:
    """The number of entries of a shape, as a C `long long` expression."""
    if not shape:
        return "1LL"
    return " * ".join(["(long long)" + dim_c(shape[0], names)] + [dim_c(d, names) for d in shape[1:]])


def _atom(coord: str) -> str:
    return coord if coord.replace("_", "a").isalnum() else f"({coord})"


def offset_c(coords: Sequence[str], shape: Sequence[sympy.Expr], names: CNames) -> str:
    """The row-major offset of `coords` in a contiguous tensor of `shape` (long long when rank > 1)."""
    text = None
    for k, (coord, dim) in enumerate(zip(coords, shape)):
        if text is None:
            if coord != "0":
                text = _atom(coord) if k == len(shape) - 1 else f"(long long){_atom(coord)}"
            continue
        scaled = f"{text if ' + ' not in text else f'({text})'} * {dim_c(dim, names)}"
        text = scaled if coord == "0" else f"{scaled} + {_atom(coord)}"
    return text if text is not None else "0"


def align(child_shape, parent_shape, coords: Sequence[str]) -> tuple[str, ...]:
    """A broadcast operand's coordinates: trailing axes line up, size-1 axes read entry 0."""
    lead = len(parent_shape) - len(child_shape)
    out = []
    for k, dim in enumerate(child_shape):
        parent = parent_shape[lead + k]
        out.append("0" if dim == 1 and parent != 1 else coords[lead + k])
    return tuple(out)


class Source(Protocol):
    def read(self, node: t.Node, coords: tuple[str, ...]) -> str | None:
        """A memory read of `node` at `coords`, or None when `node` is computed inline."""


class CPrinter:
    """Prints one kernel's expressions; `statements` collects the loops of index sums."""

    def __init__(self, names: CNames, source: Source, indices: dict[str, str] | None = None,
                 special: dict[t.Node, str] | None = None, indent: str = "        ") -> None:
        self.names = names
        self.source = source
        self.indices = dict(indices or {})
        self.special = dict(special or {})
        self.statements: list[str] = []
        self.indent = indent
        self._locals = 0

    def entry(self, node: t.Node, coords: Sequence[str] = ()) -> str:
        return self._print(node, tuple(coords))[0]

    def _wrap(self, node: t.Node, coords, at_least: int) -> str:
        text, prec = self._print(node, coords)
        return f"({text})" if prec < at_least else text

    def _child(self, child: t.Node, parent: t.Node, coords, at_least: int) -> str:
        return self._wrap(child, align(child.shape, parent.shape, coords), at_least)

    def _dim(self, dim) -> str:
        return dim_c(dim, self.names)

    # --- integer-valued expressions: index arithmetic and comparisons stay in int ---------

    def integer(self, node: t.Node) -> str | None:
        """`node` as C int arithmetic when it is index/dim/integer arithmetic, else None."""
        if isinstance(node, t.IndexVar):
            return self.indices[node.name]
        if isinstance(node, t.DimValue):
            return self._dim(node.dim)
        if isinstance(node, t.Scalar) and node.value.is_Integer:
            return str(int(node.value))
        if isinstance(node, t.Unary) and node.fn == "neg":
            inner = self.integer(node.x)
            return None if inner is None else f"(-{inner})"
        if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
            a, b = self.integer(node.a), self.integer(node.b)
            if a is None or b is None:
                return None
            return f"({a} {BINARY[node.op][0][4]} {b})"
        return None

    # --- the rules ------------------------------------------------------------------------

    @singledispatchmethod
    def _print(self, node, coords) -> tuple[str, int]:
        text = self.source.read(node, coords)  # a value the planner stored (a fused kernel's result)
        if text is None:
            raise CudaCodegenError(f"no CUDA rule for {type(node).__name__}")
        return text, ATOM

    def _memory(self, node, coords) -> tuple[str, int]:
        if node in self.special:
            return self.special[node], ATOM
        text = self.source.read(node, coords)
        if text is None:
            raise CudaCodegenError(f"no CUDA rule for {type(node).__name__} here")
        return text, ATOM

    for _type in (t.Tensor, t.Grad, t.MatMul, t.Reduce, t.Softmax, t.SumTo, t.IndexDef):
        _print.register(_type)(_memory)
    del _type

    @_print.register
    def _(self, node: t.Scalar, coords):
        text = float_literal(node.value)
        return text, UNARY_PREC if text.startswith("-") else ATOM

    @_print.register
    def _(self, node: t.DimValue, coords):
        return f"(float){self._dim(node.dim)}", UNARY_PREC

    @_print.register
    def _(self, node: t.Unary, coords):
        if node in self.special:
            return self.special[node], ATOM
        if node.fn == "neg":
            return "-" + self._child(node.x, node, coords, UNARY_PREC), UNARY_PREC
        return UNARY[node.fn].format(x=self._child(node.x, node, coords, TERNARY)), ATOM

    @_print.register
    def _(self, node: t.Binary, coords):
        if node in self.special:
            return self.special[node], ATOM
        template, prec = BINARY[node.op]
        if node.op == "pow" and isinstance(node.b, t.Scalar) and node.b.value == 2:
            return f"sa_square({self._child(node.a, node, coords, TERNARY)})", ATOM
        if node.op == "pow":
            return template.format(a=self._child(node.a, node, coords, TERNARY),
                                   b=self._child(node.b, node, coords, TERNARY)), ATOM
        left = self._child(node.a, node, coords, prec)
        right = self._child(node.b, node, coords, prec + 1)
        return template.format(a=left, b=right), prec

    @_print.register
    def _(self, node: t.Compare, coords):
        a, b = self.integer(node.a), self.integer(node.b)
        if a is None or b is None:
            a = self._child(node.a, node, coords, ADD)
            b = self._child(node.b, node, coords, ADD)
        return f"{a} {COMPARE[node.op]} {b}", COMPARE_PREC

    @_print.register
    def _(self, node: t.Where, coords):
        cond = self._child(node.cond, node, coords, COMPARE_PREC)
        a = self._child(node.a, node, coords, TERNARY + 1)
        b = self._child(node.b, node, coords, TERNARY)
        return f"({cond} ? {a} : {b})", ATOM

    @_print.register
    def _(self, node: t.Transpose, coords):
        swapped = (*coords[:-2], coords[-1], coords[-2])
        return self._print(node.x, swapped)

    @_print.register
    def _(self, node: t.MergeHeads, coords):
        # [..., h, N, k] -> [..., N, h * k]: column c is head c / k, entry c % k.
        *lead, row, col = coords
        per_head = self._dim(node.x.shape[-1])
        return self._print(node.x, (*lead, f"{col} / {per_head}", row, f"{col} % {per_head}"))

    @_print.register
    def _(self, node: t.SplitHeads, coords):
        # [..., N, h * k] -> [..., h, N, k]: head hh, entry kk is column hh * k + kk.
        *lead, head, row, col = coords
        per_head = self._dim(node.shape[-1])
        return self._print(node.x, (*lead, row, f"{head} * {per_head} + {col}"))

    @_print.register
    def _(self, node: t.Slice, coords):
        moved = list(coords)
        moved[node.axis] = f"({coords[node.axis]} + {self._dim(node.start)})"
        return self._print(node.x, tuple(moved))

    @_print.register
    def _(self, node: t.Concat, coords):
        axis = node.axis
        start = sympy.Integer(0)
        pieces = []
        for part in node.parts:
            shifted = list(coords)
            shifted[axis] = coords[axis] if start == 0 else f"({coords[axis]} - {self._dim(start)})"
            stop = start + part.shape[axis]
            pieces.append((self._dim(stop), self._child(part, node, tuple(shifted), TERNARY)))
            start = stop
        text = pieces[-1][1]
        for stop, value in reversed(pieces[:-1]):
            text = f"{coords[axis]} < {stop} ? {value} : {text}"
        return (f"({text})", ATOM) if len(pieces) > 1 else (text, ATOM)

    @_print.register
    def _(self, node: t.Constant, coords):
        if node.kind not in CONSTANT:
            raise CudaCodegenError(f"no CUDA rule for the constant {node.kind}")
        return CONSTANT[node.kind](coords, [self._dim(a) for a in node.args]), ATOM

    # --- index notation -------------------------------------------------------------------

    @_print.register
    def _(self, node: t.IndexVar, coords):
        return f"(float){self.indices[node.name]}", UNARY_PREC

    def subscript(self, s) -> str:
        """A subscript (index name or Affine) as C int arithmetic on the index variables."""
        if isinstance(s, str):
            return self.indices[s]
        parts = [(p.negative, self._dim(p.dims) if p.index is None else self.indices[p.index] if p.coefficient == 1
                  else f"{p.coefficient} * {self.indices[p.index]}") for p in pieces(s)]
        return f"({signed_sum(parts) or '0'})"

    @_print.register
    def _(self, node: t.Entry, coords):
        at = tuple(self.subscript(i) for i in node.indices)
        target = t.Grad(node.tensor, ()) if node.grad else t.Tensor(node.tensor, ())
        text = self.source.read(target, at)
        if text is None:
            raise CudaCodegenError(f"cannot read {node.tensor}[{', '.join(map(str, node.indices))}]")
        return text, ATOM

    @_print.register
    def _(self, node: t.IndexSum, coords):
        self._locals += 1
        acc = f"sum{self._locals}_"
        var = self.names.spec("index", node.index.name)
        outer, saved = self.statements, dict(self.indices)
        self.statements = []
        self.indices[node.index.name] = var
        body = self.entry(node.body)
        inner = self.statements
        self.statements, self.indices = outer, saved
        pad = self.indent
        lines = [f"{pad}float {acc} = 0.0f;  // sum({node.index.name}, ...)",
                 f"{pad}for (int {var} = 0; {var} < {self._dim(node.index.range)}; ++{var}) {{"]
        lines += ["\n".join("    " + line for line in s.split("\n")) for s in inner]
        lines += [f"{pad}    {acc} += {body};", f"{pad}}}"]
        self.statements.append("\n".join(lines))
        return acc, ATOM
