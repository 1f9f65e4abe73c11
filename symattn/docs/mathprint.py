"""Typed-IR nodes as typeset mathematics (boxes), in matrix form and entry by entry.

Contract: `matrix_box(node, dims)` typesets a node the way papers write it:
`W^{q}`, `P^{\\top}`, `\\odot` for elementwise products, `\\operatorname{softmax}`,
`\\mathrm{d}V` for grad(V). `entry_box(node, indices, ...)` writes one entry
of a node in index form (`\\sum_{k} x_{i,k} W^{q}_{k,c}`), with an optional
map of textbook names (X -> a, scores -> \\alpha, weights -> \\alpha').
One rule per node type in each printer; an unknown node is an error naming it.

The equations that documents and notebook displays both show are built here,
once: `definition_box` (a forward definition), `gradient_box` (a derived
grad(T), entry by entry when it uses index notation), `loss_box`, `shape_box`.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Mapping, Sequence

import sympy

from ..ir import typed as t
from ..ir.functions import FUNCTIONS
from ..ir.affine import pieces
from ..ir.gather import gather_form, gather_forms
from .mathbox import Box, Fence, Frac, Func, Ident, Num, Op, Row, Sqrt, Sub, Sup, Text, ident, row

__all__ = ["matrix_box", "dim_box", "grad_box", "entry_box", "Names", "equation", "definition_box",
           "gradient_box", "loss_box", "shape_box"]

COMPARE, ADD, MUL, NEG, POW, POSTFIX, ATOM = range(7)
_CMP = {"<": ("<", "<"), "<=": ("≤", "\\le"), ">": (">", ">"), ">=": ("≥", "\\ge"), "==": ("=", "="),
        "!=": ("≠", "\\ne")}
TIMES = Op("\u2062", "\\,")


def grad_box(name: str) -> Box:
    return row(Ident("d", upright=True), ident(name))


def dim_box(dim: sympy.Expr) -> tuple[Box, int]:
    dim = sympy.sympify(dim)
    if dim.is_Integer:
        return Num(str(dim)), ATOM
    if dim.is_Symbol:
        return ident(str(dim)), ATOM
    if dim.is_Add:
        items: list[Box] = []
        for k, term in enumerate(sympy.Add.make_args(dim)):
            box, _ = dim_box(term)
            if k:
                items.append(Op("+", "+"))
            items.append(box)
        return row(*items), ADD
    if dim.is_Mul:
        num, den = sympy.fraction(dim)
        if den != 1:
            return Frac(dim_box(num)[0], dim_box(den)[0]), ATOM
        factors = sympy.Mul.make_args(dim)
        return row(*[dim_box(f)[0] for f in factors]), MUL
    if dim.is_Pow:
        return Sup(dim_box(dim.base)[0], Num(str(dim.exp))), POW
    return Text(str(dim)), ATOM


def _scalar(value: sympy.Expr) -> tuple[Box, int]:
    if value == sympy.oo:
        return Ident("∞", "\\infty"), ATOM
    if value == -sympy.oo:
        return row(Op("−", "-"), Ident("∞", "\\infty")), NEG
    if value == sympy.pi:
        return Ident("π", "\\pi"), ATOM
    if value.is_Rational:
        if value < 0:
            inner, _ = _scalar(-value)
            return row(Op("−", "-"), inner), NEG
        if value.q == 1:
            return Num(str(value.p)), ATOM
        return Frac(Num(str(value.p)), Num(str(value.q))), ATOM
    return Text(str(value)), ATOM


def _wrap(pair: tuple[Box, int], at_least: int) -> Box:
    box, prec = pair
    return Fence(box) if prec < at_least else box


def _left_factor(pair: tuple[Box, int]) -> Box:
    """The left operand of a product: fenced when a sum in it would reach over the factors after it.

    `sum(dO, axis=-2) * b` is `(sum_N dO) . b`; written `sum_N dO . b` it reads as the sum of the product.
    """
    box, _ = pair
    if isinstance(box, Row) and any(isinstance(i, Sub) and isinstance(i.base, Op) and i.base.text == "∑"
                                    for i in box.items):
        return Fence(box)
    return _wrap(pair, MUL)


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
    return _m(node)[0]


@singledispatch
def _m(node) -> tuple[Box, int]:
    raise TypeError(f"no typesetting rule for {type(node).__name__}")


@_m.register
def _(node: t.Tensor):
    return ident(node.name), ATOM


@_m.register
def _(node: t.Grad):
    return grad_box(node.name), ATOM


@_m.register
def _(node: t.Scalar):
    return _scalar(node.value)


@_m.register
def _(node: t.DimValue):
    return dim_box(node.dim)


def _unary(fn: str, inner: tuple[Box, int]) -> tuple[Box, int]:
    if fn == "neg":
        return row(Op("−", "-"), _wrap(inner, NEG)), NEG
    if fn == "sqrt":
        return Sqrt(inner[0]), ATOM
    if fn == "abs":
        return Fence(inner[0], "|", "|"), ATOM
    return Func(fn, (inner[0],), known=fn in FUNCTIONS and FUNCTIONS[fn].named), ATOM


@_m.register
def _(node: t.Unary):
    return _unary(node.fn, _m(node.x))


def _binary(op: str, a: tuple[Box, int], b: tuple[Box, int], scalar_side: bool) -> tuple[Box, int]:
    if op == "add":
        return row(_wrap(a, ADD), Op("+", "+"), _wrap(b, ADD + 1)), ADD
    if op == "sub":
        return row(_wrap(a, ADD), Op("−", "-"), _wrap(b, ADD + 1)), ADD
    if op == "mul":
        glyph = Op("·", "\\cdot") if scalar_side else Op("⊙", "\\odot")
        return row(_left_factor(a), glyph, _wrap(b, MUL + 1)), MUL
    if op == "div":
        return Frac(a[0], b[0]), ATOM
    if op == "pow":
        return Sup(_wrap(a, POSTFIX), b[0]), POW
    raise TypeError(f"no typesetting rule for {op}")


@_m.register
def _(node: t.Binary):
    return _binary(node.op, _m(node.a), _m(node.b), node.a.shape == () or node.b.shape == ())


@_m.register
def _(node: t.MatMul):
    return row(_left_factor(_m(node.a)), TIMES, _wrap(_m(node.b), MUL + 1)), MUL


@_m.register
def _(node: t.Transpose):
    return Sup(_wrap(_m(node.x), POSTFIX), Op("⊤", "\\top")), POSTFIX


@_m.register
def _(node: t.Reduce):
    return Func(_axis_word(node.kind, node.axis, len(node.x.shape)), (_m(node.x)[0],)), ATOM


@_m.register
def _(node: t.Softmax):
    return Func(_axis_word("softmax", node.axis, len(node.x.shape)), (_m(node.x)[0],)), ATOM


@_m.register
def _(node: t.Compare):
    glyph, latex = _CMP[node.op]
    return row(_wrap(_m(node.a), ADD), Op(glyph, latex), _wrap(_m(node.b), ADD)), COMPARE


@_m.register
def _(node: t.Where):
    return Func("where", (_m(node.cond)[0], _m(node.a)[0], _m(node.b)[0])), ATOM


@_m.register
def _(node: t.MergeHeads):
    return Func("merge_heads", (_m(node.x)[0],)), ATOM


@_m.register
def _(node: t.SplitHeads):
    return Func("split_heads", (_m(node.x)[0], dim_box(node.heads)[0])), ATOM


@_m.register
def _(node: t.Concat):
    return Func("concat", tuple(_m(p)[0] for p in node.parts)), ATOM


@_m.register
def _(node: t.Constant):
    return Func(node.kind, tuple(dim_box(a)[0] for a in node.args)), ATOM


@_m.register
def _(node: t.SumTo):
    # An axis of size 1 only goes away (`[1, d]` to `[d]`): there is nothing to sum over it.
    names = [dim_box(node.x.shape[a])[0] for a in node.axes if node.x.shape[a] != 1]
    if not names:
        return _m(node.x)
    return row(Sub(Op("∑", "\\sum"), _commas(names)), _wrap(_m(node.x), MUL)), MUL


@_m.register
def _(node: t.Slice):
    cut = row(dim_box(node.start)[0], Op(":", ":"), dim_box(node.stop)[0])
    return Sub(_wrap(_m(node.x), POSTFIX), Row((Text(f"axis {node.axis}: "), cut))), POSTFIX


@_m.register
def _(node: t.Scatter):
    return _m(gather_form(node))


@_m.register
def _(node: t.IndexDef):
    return _m(node.body)


@_m.register
def _(node: t.Entry):
    return Names().entry(node.tensor, node.indices, grad=node.grad), ATOM


@_m.register
def _(node: t.IndexVar):
    return ident(node.name), ATOM


@_m.register
def _(node: t.IndexSum):
    return row(Sub(Op("∑", "\\sum"), ident(node.index.name)), _wrap(_m(node.body), MUL)), MUL


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
    """A subscript: an index name, or index arithmetic (`j − i + N − 1`)."""
    if isinstance(name, t.Affine):
        items: list[Box] = []
        for k, p in enumerate(pieces(name)):
            if k or p.negative:
                items.append(Op("−", "-") if p.negative else Op("+", "+"))
            if p.index is None:
                items.append(dim_box(p.dims)[0])
            else:
                items.append(ident(p.index) if p.coefficient == 1 else row(Num(str(p.coefficient)), ident(p.index)))
        return row(*items) if items else Num("0")
    return Num(name) if name.isdigit() else ident(name)


def entry_box(node: t.Node, indices: Sequence[str | None], names: Names) -> Box:
    """One entry of `node` at `indices` (None for an axis of size 1), in index form."""
    return _e(node, tuple(indices), names)[0]


def _align(shape, indices) -> tuple:
    """Indices for an operand of `shape` broadcast to the result's indices (size-1 axes -> None)."""
    tail = indices[len(indices) - len(shape):] if shape else ()
    return tuple(None if d == 1 else i for d, i in zip(shape, tail))


def _e(node, idx, nm: Names) -> tuple[Box, int]:
    if isinstance(node, t.Tensor):
        return nm.entry(node.name, [i for i in idx if i is not None]), ATOM
    if isinstance(node, t.Grad):
        return nm.entry(node.name, [i for i in idx if i is not None], grad=True), ATOM
    if isinstance(node, (t.Scalar, t.DimValue)):
        return _m(node)
    if isinstance(node, t.Unary):
        return _unary(node.fn, _e(node.x, _align(node.x.shape, idx), nm))
    if isinstance(node, t.Binary):
        a = _e(node.a, _align(node.a.shape, idx), nm)
        b = _e(node.b, _align(node.b.shape, idx), nm)
        return _binary(node.op, a, b, True)
    if isinstance(node, t.MatMul) and len(node.a.shape) >= 2 and len(node.b.shape) >= 2:
        k = nm.fresh(node.a.shape[-1])
        *batch, i, j = idx
        a = _e(node.a, _align(node.a.shape, (*batch, i, k)), nm)
        b = _e(node.b, _align(node.b.shape, (*batch, k, j)), nm)
        return row(Sub(Op("∑", "\\sum"), ident(k)), _wrap(a, MUL + 1), TIMES, _wrap(b, MUL + 1)), MUL
    if isinstance(node, t.Transpose):
        *batch, i, j = idx
        return _e(node.x, (*batch, j, i), nm)
    if isinstance(node, t.Softmax):
        k = nm.fresh()
        other = tuple(k if a == node.axis else i for a, i in enumerate(idx))
        top = Func("exp", (_e(node.x, idx, nm)[0],), known=True)
        bottom = row(Sub(Op("∑", "\\sum"), ident(k)), Func("exp", (_e(node.x, other, nm)[0],), known=True))
        return Frac(top, bottom), ATOM
    if isinstance(node, t.Reduce) and node.axis is not None and node.kind in ("sum", "mean"):
        k = nm.fresh()
        inner = tuple(k if a == node.axis else i for a, i in enumerate(idx))
        body = row(Sub(Op("∑", "\\sum"), ident(k)), _wrap(_e(node.x, inner, nm), MUL))
        if node.kind == "mean":
            return Frac(body, dim_box(node.x.shape[node.axis])[0]), ATOM
        return body, MUL
    if isinstance(node, t.Compare):
        glyph, latex = _CMP[node.op]
        a = _e(node.a, _align(node.a.shape, idx), nm)
        b = _e(node.b, _align(node.b.shape, idx), nm)
        return row(_wrap(a, ADD), Op(glyph, latex), _wrap(b, ADD)), COMPARE
    if isinstance(node, t.Where):
        return Func("where", tuple(_e(p, _align(p.shape, idx), nm)[0] for p in (node.cond, node.a, node.b))), ATOM
    if isinstance(node, t.Scatter):
        return _e(gather_form(node), idx, nm)
    if isinstance(node, t.IndexDef):
        from ..symbolic.index_adjoint import rename_indices

        mapping = {i.name: j for i, j in zip(node.indices, idx) if j is not None}
        nm.used.update(i.name for i in node.indices)
        return _m(rename_indices(node.body, mapping))
    # Anything else (heads, constants, reductions over every axis): the matrix form, indexed.
    inner = _m(node)[0]
    sub = _commas([ident(i) for i in idx if i is not None])
    return Sub(Fence(inner, "[", "]"), sub), ATOM


# --- equations shown by documents and notebooks ---------------------------------------------


def equation(left: Box, right: Box) -> Box:
    return row(left, Op("=", "="), right)


def shape_box(shape: Sequence[sympy.Expr]) -> Box:
    """`[N, d_k]`, typeset (`[]` for a scalar)."""
    inner = _commas([dim_box(d)[0] for d in shape]) if shape else Row(())
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
