"""Typed-IR nodes as typeset mathematics (boxes), in matrix form and entry by entry.

Contract: `matrix_box(node, dims)` typesets a node the way papers write it:
`W^{q}`, `P^{\\top}`, `\\odot` for elementwise products, `\\operatorname{softmax}`,
`\\mathrm{d}V` for grad(V). `entry_box(node, indices, ...)` writes one entry
of a node in index form (`\\sum_{k} x_{i,k} W^{q}_{k,c}`), with an optional
map of textbook names (X -> a, scores -> \\alpha, weights -> \\alpha').
Both are `Printer`s (`symattn.ir.printer`) on the shared precedence table, with
one `_print_<Node>` rule per node type; brackets are fences, and a quotient,
typeset as a fraction, binds like a name. An unknown node is an error naming it.
`dim_box` typesets a dim expression, one rule per kind of SymPy expression.

The equations that documents and notebook displays both show are built here,
once: `definition_box` (a forward definition), `gradient_box` (a derived
grad(T), entry by entry when it uses index notation), `loss_box`, `shape_box`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import sympy

from ..ir import typed as t
from ..ir.functions import FUNCTIONS
from ..ir.affine import pieces
from ..ir.gather import gather_form, gather_forms
from ..ir.printer import ADD, ATOM, MUL, NEG, POSTFIX, PRECEDENCE, Printed, Printer
from .mathbox import Box, Fence, Frac, Func, Ident, Num, Op, Row, Sqrt, Sub, Sup, Text, ident, row

__all__ = ["matrix_box", "dim_box", "grad_box", "entry_box", "Names", "equation", "definition_box",
           "gradient_box", "loss_box", "shape_box", "BoxPrinter", "MatrixTypesetter", "EntryTypesetter"]

_CMP = {"<": ("<", "<"), "<=": ("≤", "\\le"), ">": (">", ">"), ">=": ("≥", "\\ge"), "==": ("=", "="),
        "!=": ("≠", "\\ne")}
TIMES = Op("\u2062", "\\,")
SUM = Op("∑", "\\sum")


def grad_box(name: str) -> Box:
    return row(Ident("d", upright=True), ident(name))


class BoxPrinter(Printer):
    """Typeset boxes: brackets are fences, and a fraction binds like a name."""

    precedence = {**PRECEDENCE, "div": ATOM}
    rules = "typesetting"

    def fence(self, box: Box) -> Box:
        return Fence(box)

    def left_factor(self, a: Printed) -> Box:
        """The left operand of a product: fenced when a sum in it would reach over the factors after it.

        `sum(dO, axis=-2) * b` is `(sum_N dO) . b`; written `sum_N dO . b` it reads as the sum of the product.
        """
        box = a.text
        if isinstance(box, Row) and any(isinstance(i, Sub) and isinstance(i.base, Op) and i.base.text == SUM.text
                                        for i in box.items):
            return Fence(box)
        return self.parenthesize(a, MUL)

    def unary(self, fn: str, x: Printed) -> Printed:
        if fn == "neg":
            return Printed(row(Op("−", "-"), self.parenthesize(x, NEG)), self.prec("neg"))
        if fn == "sqrt":
            return Printed(Sqrt(x.text), ATOM)
        if fn == "abs":
            return Printed(Fence(x.text, "|", "|"), ATOM)
        if fn == "exp2":  # 2^x, as papers write ALiBi's slopes
            return Printed(Sup(Num("2"), x.text), ATOM)
        if fn == "log2":
            return Printed(row(Sub(Ident("log", "\\log"), Num("2")), Fence(x.text)), self.prec("call"))
        if fn in ("floor", "ceil"):
            return Printed(Fence(x.text, *(("⌊", "⌋") if fn == "floor" else ("⌈", "⌉"))), ATOM)
        return Printed(Func(fn, (x.text,), known=fn in FUNCTIONS and FUNCTIONS[fn].named), self.prec("call"))

    def binary(self, op: str, a: Printed, b: Printed, scalar_side: bool) -> Printed:
        level = self.prec(op)
        if op in ("add", "sub"):
            glyph = Op("+", "+") if op == "add" else Op("−", "-")
            return Printed(row(self.parenthesize(a, level), glyph, self.parenthesize(b, level + 1)), level)
        if op == "mul":
            glyph = Op("·", "\\cdot") if scalar_side else Op("⊙", "\\odot")
            return Printed(row(self.left_factor(a), glyph, self.parenthesize(b, level + 1)), level)
        if op == "div":
            return Printed(Frac(a.text, b.text), level)
        if op == "pow":
            return Printed(Sup(self.parenthesize(a, POSTFIX), b.text), level)
        raise TypeError(f"no typesetting rule for {op}")

    def logical(self, op: str, parts: Sequence[Printed]) -> Printed:
        """`a ∧ b`, `a ∨ b`, `¬a`: conditions joined (each comparison fenced when it sits beside another)."""
        if op == "not":
            return Printed(row(Op("¬", "\\neg "), self.parenthesize(parts[0], NEG)), NEG)
        glyph = Op("∧", "\\wedge") if op == "and" else Op("∨", "\\vee")
        items: list[Box] = []
        for k, part in enumerate(parts):
            items += ([glyph] if k else []) + [self.fence(part.text) if part.prec <= self.prec("compare")
                                               else part.text]
        return Printed(row(*items), self.prec("compare"))

    def operation(self, fn: str, args: Sequence[Printed]) -> Printed:
        """`⌊a / b⌋`, `a mod b`, `min(a, b)`, `max(a, b)`, `clamp(x, lo, hi)`."""
        if fn == "floordiv":
            return Printed(Fence(row(self.parenthesize(args[0], MUL), Op("/", "/"),
                                     self.parenthesize(args[1], MUL + 1)), "⌊", "⌋"), ATOM)
        if fn == "mod":
            level = self.prec("mod")
            return Printed(row(self.parenthesize(args[0], level), Op("mod", "\\bmod"),
                               self.parenthesize(args[1], level + 1)), level)
        return Printed(Func(fn, tuple(a.text for a in args), known=fn in ("min", "max")), self.prec("call"))

    def compare(self, op: str, a: Printed, b: Printed) -> Printed:
        glyph, latex = _CMP[op]
        return Printed(row(self.parenthesize(a, ADD), Op(glyph, latex), self.parenthesize(b, ADD)),
                       self.prec("compare"))

    def summed(self, index: Box, body: Printed) -> Printed:
        """`sum_k body`: the body reaches as far as a product's factors."""
        level = self.prec("sum")
        return Printed(row(Sub(SUM, index), self.parenthesize(body, level)), level)


class DimTypesetter(BoxPrinter):
    """Dim expressions (SymPy): `h d_k`, `N + 1`, `d / h`."""

    def _print_Integer(self, dim: sympy.Integer) -> Printed:
        return Printed(Num(str(dim)), ATOM)

    def _print_Symbol(self, dim: sympy.Symbol) -> Printed:
        return Printed(ident(str(dim)), ATOM)

    def _print_Add(self, dim: sympy.Add) -> Printed:
        items: list[Box] = []
        for k, term in enumerate(sympy.Add.make_args(dim)):
            if k:
                items.append(Op("+", "+"))
            items.append(self.doprint(term).text)
        return Printed(row(*items), self.prec("add"))

    def _print_Mul(self, dim: sympy.Mul) -> Printed:
        num, den = sympy.fraction(dim)
        if den != 1:
            return Printed(Frac(self.doprint(num).text, self.doprint(den).text), self.prec("div"))
        return Printed(row(*[self.doprint(f).text for f in sympy.Mul.make_args(dim)]), self.prec("mul"))

    def _print_Pow(self, dim: sympy.Pow) -> Printed:
        return Printed(Sup(self.doprint(dim.base).text, Num(str(dim.exp))), self.prec("pow"))

    def _print_Basic(self, dim: sympy.Basic) -> Printed:
        return Printed(Text(str(dim)), ATOM)


_DIMS = DimTypesetter()


def dim_box(dim: sympy.Expr) -> Box:
    return _dim(dim).text


def _dim(dim: sympy.Expr) -> Printed:
    return _DIMS.doprint(sympy.sympify(dim))


def _scalar(value: sympy.Expr) -> Printed:
    if value == sympy.oo:
        return Printed(Ident("∞", "\\infty"), ATOM)
    if value == -sympy.oo:
        return Printed(row(Op("−", "-"), Ident("∞", "\\infty")), NEG)
    if value == sympy.pi:
        return Printed(Ident("π", "\\pi"), ATOM)
    if value.is_Rational:
        if value < 0:
            return Printed(row(Op("−", "-"), _scalar(-value).text), NEG)
        if value.q == 1:
            return Printed(Num(str(value.p)), ATOM)
        return Printed(Frac(Num(str(value.p)), Num(str(value.q))), ATOM)
    return Printed(Text(str(value)), ATOM)


def _axis_word(kind: str, axis: int | None, rank: int) -> str:
    if axis is None:
        return kind
    if axis == rank - 1:
        return f"row{kind}" if kind != "softmax" else "softmax"
    if axis == rank - 2:
        return f"col{kind}" if kind != "softmax" else "softmax_col"
    return f"{kind}_{axis}"


# --- matrix form -----------------------------------------------------------------------


def matrix_box(node: t.Node, dims: Sequence[str] = ()) -> Box:
    return _MATRIX.doprint(node).text


class MatrixTypesetter(BoxPrinter):
    """A node the way papers write the matrix: `Q K^T`, `softmax(S)`, `dP ⊙ P`."""

    def box(self, node: t.Node) -> Box:
        return self.doprint(node).text

    def call(self, name: str, *args: Box) -> Printed:
        return Printed(Func(name, args), self.prec("call"))

    def _print_Tensor(self, node: t.Tensor) -> Printed:
        return Printed(ident(node.name), ATOM)

    def _print_Grad(self, node: t.Grad) -> Printed:
        return Printed(grad_box(node.name), ATOM)

    def _print_Tangent(self, node: t.Tangent) -> Printed:
        return self.call("tangent", self.doprint(node.x).text)

    def _print_Scalar(self, node: t.Scalar) -> Printed:
        return _scalar(node.value)

    def _print_DimValue(self, node: t.DimValue) -> Printed:
        return _dim(node.dim)

    def _print_Unary(self, node: t.Unary) -> Printed:
        return self.unary(node.fn, self.doprint(node.x))

    def _print_Binary(self, node: t.Binary) -> Printed:
        return self.binary(node.op, self.doprint(node.a), self.doprint(node.b),
                           node.a.shape == () or node.b.shape == ())

    def _print_MatMul(self, node: t.MatMul) -> Printed:
        level = self.prec("matmul")
        return Printed(row(self.left_factor(self.doprint(node.a)), TIMES, self.parenthesize(node.b, level + 1)), level)

    def _print_Transpose(self, node: t.Transpose) -> Printed:
        return Printed(Sup(self.parenthesize(node.x, POSTFIX), Op("⊤", "\\top")), self.prec("transpose"))

    def _print_Reduce(self, node: t.Reduce) -> Printed:
        return self.call(_axis_word(node.kind, node.axis, len(node.x.shape)), self.box(node.x))

    def _print_Softmax(self, node: t.Softmax) -> Printed:
        return self.call(_axis_word("softmax", node.axis, len(node.x.shape)), self.box(node.x))

    def _print_Scan(self, node: t.Scan) -> Printed:
        kind = "revcumsum" if node.reverse else "cumsum"
        return self.call(_axis_word(kind, node.axis, len(node.x.shape)), self.box(node.x))

    def _print_Compare(self, node: t.Compare) -> Printed:
        return self.compare(node.op, self.doprint(node.a), self.doprint(node.b))

    def _print_Where(self, node: t.Where) -> Printed:
        return self.call("where", self.box(node.cond), self.box(node.a), self.box(node.b))

    def _print_Logical(self, node: t.Logical) -> Printed:
        return self.logical(node.op, [self.doprint(a) for a in node.args])

    def _print_Apply(self, node: t.Apply) -> Printed:
        return self.operation(node.fn, [self.doprint(a) for a in node.args])

    def _print_MergeHeads(self, node: t.MergeHeads) -> Printed:
        return self.call("merge_heads", self.box(node.x))

    def _print_SplitHeads(self, node: t.SplitHeads) -> Printed:
        return self.call("split_heads", self.box(node.x), dim_box(node.heads))

    def _print_Concat(self, node: t.Concat) -> Printed:
        return self.call("concat", *(self.box(p) for p in node.parts))

    def _print_Constant(self, node: t.Constant) -> Printed:
        return self.call(node.kind, *(dim_box(a) for a in node.args))

    def _print_SumTo(self, node: t.SumTo) -> Printed:
        # An axis of size 1 only goes away (`[1, d]` to `[d]`): there is nothing to sum over it.
        names = [dim_box(node.x.shape[a]) for a in node.axes if node.x.shape[a] != 1]
        if not names:
            return self.doprint(node.x)
        return self.summed(_commas(names), self.doprint(node.x))

    def _print_Slice(self, node: t.Slice) -> Printed:
        cut = row(dim_box(node.start), Op(":", ":"), dim_box(node.stop))
        return Printed(Sub(self.parenthesize(node.x, POSTFIX), Row((Text(f"axis {node.axis}: "), cut))),
                       self.prec("slice"))

    def _print_Scatter(self, node: t.Scatter) -> Printed:
        return self.doprint(gather_form(node))

    def _print_IndexDef(self, node: t.IndexDef) -> Printed:
        return self.doprint(node.body)

    def _print_Entry(self, node: t.Entry) -> Printed:
        return Printed(Names().entry(node.tensor, node.indices, grad=node.grad), ATOM)

    def _print_IndexVar(self, node: t.IndexVar) -> Printed:
        return Printed(ident(node.name), ATOM)

    def _print_IndexSum(self, node: t.IndexSum) -> Printed:
        return self.summed(ident(node.index.name), self.doprint(node.body))


_MATRIX = MatrixTypesetter()


# --- entry form --------------------------------------------------------------------------

class Names:
    """How entries of tensors are written: textbook names and fresh summation indices."""

    def __init__(self, names: Mapping[str, Box] | None = None, used: Sequence[str] = (),
                 tokens: Sequence[sympy.Expr] = ()) -> None:
        self.names = dict(names or {})
        self.used = set(used)
        self.tokens = tuple(tokens)

    def fresh(self, dim: sympy.Expr | None = None) -> str:
        """A new summation index; `j` when it runs over tokens (b_i = sum_j alpha'_ij v_j)."""
        pool = ("j", "m", "l", "n", "p") if dim is not None and dim in self.tokens else ("m", "l", "n", "p", "j")
        for name in pool + ("r", "s", "u", "c", "k"):
            if name not in self.used:
                self.used.add(name)
                return name
        k = len(self.used)
        self.used.add(f"k{k}")
        return f"k{k}"

    def entry(self, tensor: str, indices: Sequence[str], grad: bool = False) -> Box:
        from .mathbox import SubSup

        if grad:
            head = grad_box(tensor)
        else:
            head = self.names.get(tensor) or ident(tensor)
        if not indices:
            return head
        sub = _commas([_index(i) for i in indices])
        if isinstance(head, Sup):
            return SubSup(head.base, sub, head.sup)
        if isinstance(head, Sub):
            return Sub(Fence(head), sub)
        return Sub(head, sub)


def _commas(items: Sequence[Box]) -> Box:
    """`a, b, c` as one box (a single item stays itself)."""
    if len(items) == 1:
        return items[0]
    return row(*[x for item in items for x in (item, Op(",", ","))][:-1])


def _index(name) -> Box:
    """A subscript: an index name, index arithmetic (`j − i + N − 1`), or an integer expression
    (`offsets_{doc_i}`, `⌊j / S⌋`)."""
    if isinstance(name, t.Node):
        return _MATRIX.doprint(name).text
    if isinstance(name, t.Affine):
        items: list[Box] = []
        for k, p in enumerate(pieces(name)):
            if k or p.negative:
                items.append(Op("−", "-") if p.negative else Op("+", "+"))
            if p.index is None:
                items.append(dim_box(p.dims))
            else:
                items.append(ident(p.index) if p.coefficient == 1 else row(Num(str(p.coefficient)), ident(p.index)))
        return row(*items) if items else Num("0")
    return Num(name) if name.isdigit() else ident(name)


def entry_box(node: t.Node, indices: Sequence[str | None], names: Names) -> Box:
    """One entry of `node` at `indices` (None for an axis of size 1), in index form."""
    return EntryTypesetter(names).doprint(node, tuple(indices)).text


def _align(shape, indices) -> tuple:
    """Indices for an operand of `shape` broadcast to the result's indices (size-1 axes -> None)."""
    tail = indices[len(indices) - len(shape):] if shape else ()
    return tuple(None if d == 1 else i for d, i in zip(shape, tail))


class EntryTypesetter(BoxPrinter):
    """One entry of a node, in index form; the context of every rule is the entry's indices."""

    def __init__(self, names: Names) -> None:
        self.nm = names

    def operand(self, child: t.Node, idx) -> Printed:
        """An operand's entry, at the indices it is read at when broadcast to the result."""
        return self.doprint(child, _align(child.shape, idx))

    def _print_Tensor(self, node: t.Tensor, idx) -> Printed:
        return Printed(self.nm.entry(node.name, [i for i in idx if i is not None]), ATOM)

    def _print_Grad(self, node: t.Grad, idx) -> Printed:
        return Printed(self.nm.entry(node.name, [i for i in idx if i is not None], grad=True), ATOM)

    def _print_Scalar(self, node: t.Scalar | t.DimValue, idx) -> Printed:
        return _MATRIX.doprint(node)

    _print_DimValue = _print_Scalar

    def _print_Unary(self, node: t.Unary, idx) -> Printed:
        return self.unary(node.fn, self.operand(node.x, idx))

    def _print_Binary(self, node: t.Binary, idx) -> Printed:
        return self.binary(node.op, self.operand(node.a, idx), self.operand(node.b, idx), True)

    def _print_MatMul(self, node: t.MatMul, idx) -> Printed:
        if len(node.a.shape) < 2 or len(node.b.shape) < 2:
            return self._print_Node(node, idx)
        k = self.nm.fresh(node.a.shape[-1])
        *batch, i, j = idx
        level = self.prec("matmul")
        a = self.parenthesize(self.doprint(node.a, _align(node.a.shape, (*batch, i, k))), level + 1)
        b = self.parenthesize(self.doprint(node.b, _align(node.b.shape, (*batch, k, j))), level + 1)
        return Printed(row(Sub(SUM, ident(k)), a, TIMES, b), self.prec("sum"))

    def _print_Transpose(self, node: t.Transpose, idx) -> Printed:
        *batch, i, j = idx
        return self.doprint(node.x, (*batch, j, i))

    def _print_Softmax(self, node: t.Softmax, idx) -> Printed:
        k = self.nm.fresh()
        other = tuple(k if a == node.axis else i for a, i in enumerate(idx))
        top = Func("exp", (self.doprint(node.x, idx).text,), known=True)
        bottom = row(Sub(SUM, ident(k)), Func("exp", (self.doprint(node.x, other).text,), known=True))
        return Printed(Frac(top, bottom), self.prec("div"))

    def _print_Reduce(self, node: t.Reduce, idx) -> Printed:
        if node.axis is None or node.kind not in ("sum", "mean"):
            return self._print_Node(node, idx)
        k = self.nm.fresh()
        inner = tuple(k if a == node.axis else i for a, i in enumerate(idx))
        body = self.summed(ident(k), self.doprint(node.x, inner))
        if node.kind == "mean":
            return Printed(Frac(body.text, dim_box(node.x.shape[node.axis])), self.prec("div"))
        return body

    def _print_Scan(self, node: t.Scan, idx) -> Printed:
        """`sum_{k <= i} X_{k, j}` (reversed: k >= i)."""
        if idx[node.axis] is None:
            return self._print_Node(node, idx)
        k = self.nm.fresh(node.x.shape[node.axis])
        inner = tuple(k if a == node.axis else i for a, i in enumerate(idx))
        bound = self.compare(">=" if node.reverse else "<=", Printed(ident(k), ATOM),
                             Printed(ident(idx[node.axis]), ATOM)).text
        return self.summed(bound, self.doprint(node.x, inner))

    def _print_Compare(self, node: t.Compare, idx) -> Printed:
        return self.compare(node.op, self.operand(node.a, idx), self.operand(node.b, idx))

    def _print_Where(self, node: t.Where, idx) -> Printed:
        parts = tuple(self.operand(p, idx).text for p in (node.cond, node.a, node.b))
        return Printed(Func("where", parts), self.prec("call"))

    def _print_Logical(self, node: t.Logical, idx) -> Printed:
        return self.logical(node.op, [self.operand(a, idx) for a in node.args])

    def _print_Apply(self, node: t.Apply, idx) -> Printed:
        return self.operation(node.fn, [self.operand(a, idx) for a in node.args])

    def _print_Scatter(self, node: t.Scatter, idx) -> Printed:
        return self.doprint(gather_form(node), idx)

    def _print_IndexDef(self, node: t.IndexDef, idx) -> Printed:
        from ..symbolic.index_adjoint import rename_indices

        mapping = {i.name: j for i, j in zip(node.indices, idx) if j is not None}
        self.nm.used.update(i.name for i in node.indices)
        return _MATRIX.doprint(rename_indices(node.body, mapping))

    def _print_Node(self, node: t.Node, idx) -> Printed:
        # Anything else (heads, constants, reductions over every axis): the matrix form, indexed.
        sub = _commas([ident(i) for i in idx if i is not None])
        return Printed(Sub(Fence(_MATRIX.doprint(node).text, "[", "]"), sub), ATOM)


# --- equations shown by documents and notebooks ---------------------------------------------


def equation(left: Box, right: Box) -> Box:
    return row(left, Op("=", "="), right)


def shape_box(shape: Sequence[sympy.Expr]) -> Box:
    """`[N, d_k]`, typeset (`[]` for a scalar)."""
    inner = _commas([dim_box(d) for d in shape]) if shape else Row(())
    return Fence(inner, "[", "]")


def definition_box(name: str, info: t.TensorInfo, dims: Sequence[str] = ()) -> Box:
    """A forward definition: `Q = X W^{q}`, or `M_{i,j} = ...` for index notation."""
    if isinstance(info.expr, t.IndexDef):
        head = Names().entry(name, [i.name for i in info.expr.indices])
        return equation(head, matrix_box(info.expr.body, dims))
    return equation(ident(name), matrix_box(info.expr, dims))


def gradient_box(name: str, expr: t.Node, spec: t.TypedSpec) -> Box:
    """`dT = ...` for a derived gradient; entry by entry when the result uses index notation."""
    expr = gather_forms(expr)  # a scatter is written entry by entry, as what reaches each entry
    index_part = next((n for n in t.walk(expr) if isinstance(n, t.IndexDef)), None)
    if index_part is None:
        return equation(grad_box(name), matrix_box(expr, list(spec.dims)))
    # Index notation in the result: write every term entry by entry, at the same indices.
    idx = [i.name for i in index_part.indices]
    head = Names().entry(name, idx, grad=True)
    nm = Names(used=idx + list(spec.dims) + list(spec.tensors) + _used_indices(expr))
    return equation(head, entry_box(expr, idx, nm))


def _used_indices(node: t.Node) -> list[str]:
    found = []
    for n in t.walk(node):
        if isinstance(n, t.IndexSum):
            found.append(n.index.name)
        elif isinstance(n, t.IndexDef):
            found += [i.name for i in n.indices]
    return found


def loss_box(spec: t.TypedSpec) -> Box:
    """`L = <O, dO>` (one term per output)."""
    parts: list[Box] = [Ident("L"), Op("=", "=")]
    for k, out in enumerate(spec.outputs):
        if k:
            parts.append(Op("+", "+"))
        parts += [Op("⟨", "\\langle "), ident(out), Op(",", ","), grad_box(out), Op("⟩", "\\rangle ")]
    return row(*parts)
