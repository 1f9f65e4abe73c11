"""Typed-IR nodes as SymPy matrix expressions, dims symbolic.

Contract: `to_sympy(node, spec)` returns a SymPy expression equal, entry by
entry, to the node for every size of the dims, written with SymPy's matrix
expressions so that it can be manipulated, substituted and evaluated:

- a tensor `X[N, d]` is `MatrixSymbol("X", N, d)`; `grad(X)` is
  `MatrixSymbol("grad(X)", N, d)`; a 1-D tensor `w[n]` is the row
  `MatrixSymbol("w", 1, n)` (a 1-D array broadcasts like a row in NumPy);
  a scalar tensor `tau` and `grad(tau)` are `Symbol`s; dims are the spec's
  dim symbols;
- `@` is `MatMul`, `.T` is `Transpose`, `*` between tensors is
  `HadamardProduct`, `/` by a tensor is a Hadamard product with
  `HadamardPower(B, -1)`, `^` by a scalar is `HadamardPower`, elementwise
  functions are `ElementwiseApplyFunction` (`sigmoid(x)` is `1/(1 + exp(-x))`,
  `relu(x)` is `Max(x, 0)`);
- broadcasting is explicit: a row `b[1, d]` added to `X[N, d]` is
  `X + OneMatrix(N, 1) @ b`; a reduction over the last axis is `X @ OneMatrix(d, 1)`
  (sums keep the axis, as in the language), `softmax(S, axis=-1)` is
  `E ∘ (E @ OneMatrix(n, n))^∘-1` with `E = exp(S)` (the mathematical softmax:
  a fully masked row is 0/0 here, where generated code gives zeros);
  `cumsum` along rows is `L @ X` with `L` the lower-triangular 0/1
  `FunctionMatrix` (along columns `X @ L.T`; reversed, the transposes);
  `max` and `min` are `Max` / `Min` of the entries of a line, which needs
  the reduced axis's size as a number;
- index notation, `where`, comparisons, `causal_mask` and `sinusoidal` are
  `FunctionMatrix(rows, cols, Lambda((i, j), entry))`, the entry written with
  `Sum`, `Piecewise` and the entries `X[i, k]` of the matrix symbols (indices
  0-based, as in the language);
- a result of shape `[]` is a scalar expression (a `(1, 1)` product is taken
  at its entry `[0, 0]`).

Tensors of rank 3 and more (heads: `[h, N, d_k]`) have no SymPy matrix form;
such a node raises a `SymbolicError` that names it and its shape.
"""

from __future__ import annotations

from functools import singledispatch

import sympy
from sympy import (FunctionMatrix, HadamardPower, HadamardProduct, Identity, Lambda, MatrixExpr, MatrixSymbol,
                   OneMatrix, Piecewise, Symbol)

from ..ir import typed as t
from ..ir.affine import as_sympy
from ..ir.gather import gather_form
from ..ir.functions import table
from ..errors import SymbolicError
from ..ir.printing import to_spec

__all__ = ["to_sympy", "tensor_symbol"]

_SCALAR_FUNCTIONS = table("exact")
_RELATIONS = {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "==": sympy.Eq, "!=": sympy.Ne}


def to_sympy(node: t.Node, spec: t.TypedSpec) -> sympy.Basic:
    """The node as a SymPy matrix expression (or a scalar expression for shape [])."""
    dims = list(spec.dims)
    for part in t.walk(node):
        if len(part.shape) > 2:
            raise SymbolicError(f"{to_spec(part, dims)} has shape [{', '.join(map(str, part.shape))}]: "
                                f"tensors of rank {len(part.shape)} have no SymPy matrix form")
    return _Converter(spec).matrix(node)


def tensor_symbol(name: str, shape: t.Shape, grad: bool = False) -> sympy.Basic:
    """The SymPy symbol standing for tensor `name` (or its gradient) of the given shape."""
    label = f"grad({name})" if grad else name
    if len(shape) == 0:
        return Symbol(label, real=True)
    if len(shape) == 1:
        return MatrixSymbol(label, 1, shape[0])
    if len(shape) == 2:
        return MatrixSymbol(label, *shape)
    raise SymbolicError(f"{label} has shape [{', '.join(map(str, shape))}]: tensors of rank "
                        f"{len(shape)} have no SymPy matrix form")


def _rows_cols(shape: t.Shape) -> tuple[sympy.Expr, sympy.Expr]:
    """The matrix shape standing for a tensor shape of rank 0, 1 or 2."""
    if len(shape) == 0:
        return sympy.Integer(1), sympy.Integer(1)
    if len(shape) == 1:
        return sympy.Integer(1), shape[0]
    return shape[0], shape[1]


def _entry(value: sympy.Basic) -> sympy.Expr:
    """A (1, 1) matrix expression as the scalar it holds."""
    return value[0, 0] if isinstance(value, MatrixExpr) else value


class _Converter:
    def __init__(self, spec: t.TypedSpec) -> None:
        self.spec = spec

    # --- whole tensors -------------------------------------------------------------------
    def matrix(self, node: t.Node) -> sympy.Basic:
        value = _matrix(node, self)
        return _entry(value) if not node.shape else value

    def broadcast(self, node: t.Node, shape: t.Shape) -> sympy.Basic:
        """`node` as a matrix of the (rank <= 2) `shape`, broadcast explicitly; scalars stay scalars."""
        value = self.matrix(node)
        if not node.shape:
            return value
        rows, cols = _rows_cols(shape)
        have_rows, have_cols = _rows_cols(node.shape)
        if have_rows == 1 and rows != 1:
            value = OneMatrix(rows, 1) @ value
        if have_cols == 1 and cols != 1:
            value = value @ OneMatrix(1, cols)
        return value

    def elementwise(self, node: t.Node, shape: t.Shape, make) -> sympy.Basic:
        """A matrix whose entries are `make(i, j)`, as a FunctionMatrix (a scalar when `shape` is [])."""
        if not shape:
            return make(0, 0)
        rows, cols = _rows_cols(shape)
        i, j = Symbol("i", integer=True), Symbol("j", integer=True)
        return FunctionMatrix(rows, cols, Lambda((i, j), make(i, j)))

    def entry_of(self, node: t.Node, shape: t.Shape, i, j) -> sympy.Expr:
        """Entry (i, j) of `node` broadcast to `shape`."""
        value = self.broadcast(node, shape)
        return value[i, j] if isinstance(value, MatrixExpr) else value

    # --- entries of index notation ---------------------------------------------------------
    def scalar(self, node: t.Node, env: dict[str, Symbol]) -> sympy.Expr:
        return _scalar(node, self, env)


# --- whole-tensor rules ------------------------------------------------------------------------


@singledispatch
def _matrix(node, cv: _Converter) -> sympy.Basic:
    raise SymbolicError(f"no SymPy matrix form for {type(node).__name__}")


@_matrix.register
def _(node: t.Tensor, cv):
    return tensor_symbol(node.name, node.shape)


@_matrix.register
def _(node: t.Grad, cv):
    return tensor_symbol(node.name, node.shape, grad=True)


@_matrix.register
def _(node: t.Scalar, cv):
    return node.value


@_matrix.register
def _(node: t.DimValue, cv):
    return node.dim


@_matrix.register
def _(node: t.Unary, cv):
    x = cv.matrix(node.x)
    if node.fn == "neg":
        return -x
    fn = _SCALAR_FUNCTIONS[node.fn]
    if not node.shape:
        return fn(x)
    if isinstance(fn, sympy.FunctionClass):  # exp, tanh, ...: applied by name
        return x.applyfunc(fn)
    arg = Symbol("x", real=True)
    return x.applyfunc(Lambda(arg, fn(arg)))


@_matrix.register
def _(node: t.Binary, cv):
    if not node.shape:
        a, b = cv.matrix(node.a), cv.matrix(node.b)
        return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b, "pow": a ** b}[node.op]
    a, b = cv.broadcast(node.a, node.shape), cv.broadcast(node.b, node.shape)
    a_scalar, b_scalar = not node.a.shape, not node.b.shape
    if node.op in ("add", "sub"):
        if a_scalar:
            a = a * OneMatrix(*_rows_cols(node.shape))
        if b_scalar:
            b = b * OneMatrix(*_rows_cols(node.shape))
        return a + b if node.op == "add" else a - b
    if node.op == "mul":
        return a * b if a_scalar or b_scalar else HadamardProduct(a, b)
    if node.op == "div":
        if b_scalar:
            return a / b
        inverse = HadamardPower(b, -1)
        return a * inverse if a_scalar else HadamardProduct(a, inverse)
    if node.op == "pow" and b_scalar:
        return HadamardPower(a, b)
    # A power with a tensor exponent: entry by entry.
    return cv.elementwise(node, node.shape, lambda i, j: cv.entry_of(node.a, node.shape, i, j)
                          ** cv.entry_of(node.b, node.shape, i, j))


@_matrix.register
def _(node: t.MatMul, cv):
    a, b = cv.matrix(node.a), cv.matrix(node.b)
    if len(node.b.shape) == 1 and len(node.a.shape) == 2:
        return (a @ b.T).T  # [n, m] @ [m] is the 1-D [n], written as a row
    if len(node.a.shape) == 1 and len(node.b.shape) == 1:
        return a @ b.T      # a dot product, as a (1, 1) matrix
    return a @ b


@_matrix.register
def _(node: t.Transpose, cv):
    return cv.matrix(node.x).T


def _sum_axes(value: MatrixExpr, shape: t.Shape, axes) -> MatrixExpr:
    """Sum a matrix over the given axes of the tensor shape it stands for, keeping them."""
    rows, cols = _rows_cols(shape)
    offset = 2 - len(shape)  # axis k of the tensor is axis k + offset of the matrix
    for axis in axes:
        if axis + offset == 0:
            value = OneMatrix(1, rows) @ value
        else:
            value = value @ OneMatrix(cols, 1)
    return value


@_matrix.register
def _(node: t.Reduce, cv):
    x = cv.matrix(node.x)
    shape = node.x.shape
    axes = range(len(shape)) if node.axis is None else [node.axis]
    if node.kind == "logsumexp":
        return _sum_axes(x.applyfunc(sympy.exp), shape, axes).applyfunc(sympy.log)
    if node.kind in ("max", "min"):
        return _extreme(node, x, cv)
    total = _sum_axes(x, shape, axes)
    if node.kind == "mean":
        return total / sympy.Mul(*[shape[k] for k in axes])
    return total


def _extreme(node: t.Reduce, x, cv) -> sympy.Basic:
    """max or min along one axis: entry by entry `Max(X[i, 0], ..., X[i, n - 1])`, which needs
    the reduced axis's size as a number (SymPy has no Max over a symbolic range)."""
    fn = sympy.Max if node.kind == "max" else sympy.Min
    rows, cols = _rows_cols(node.x.shape)
    axes = range(len(node.x.shape)) if node.axis is None else [node.axis]
    offset = 2 - len(node.x.shape)
    over_rows = any(k + offset == 0 for k in axes)
    over_cols = any(k + offset == 1 for k in axes)
    for size, reduced in ((rows, over_rows), (cols, over_cols)):
        if reduced and not sympy.sympify(size).is_Integer:
            raise SymbolicError(f"{to_spec(node, list(cv.spec.dims))}: {node.kind} over an axis of symbolic "
                                f"size {size} has no SymPy matrix form")

    def make(i, j):
        rs = range(int(rows)) if over_rows else [i]
        cs = range(int(cols)) if over_cols else [j]
        return fn(*(x[r, c] for r in rs for c in cs))

    return cv.elementwise(node, node.shape, make)


def _tril(size) -> MatrixExpr:
    """The [size, size] matrix with 1 where column <= row (the prefix-sum matrix), 0 elsewhere."""
    i, j = Symbol("i", integer=True), Symbol("j", integer=True)
    return FunctionMatrix(size, size, Lambda((i, j), Piecewise((1, j <= i), (0, True))))


@_matrix.register
def _(node: t.Scan, cv):
    """cumsum along rows is L @ X, along columns X @ L.T (L lower triangular ones); reversed, the transposes."""
    x = cv.matrix(node.x)
    rows, cols = _rows_cols(node.x.shape)
    if node.axis + 2 - len(node.x.shape) == 0:
        lower = _tril(rows)
        return (lower.T if node.reverse else lower) @ x
    lower = _tril(cols)
    return x @ (lower if node.reverse else lower.T)


@_matrix.register
def _(node: t.Softmax, cv):
    e = cv.matrix(node.x).applyfunc(sympy.exp)
    rows, cols = _rows_cols(node.x.shape)
    last = node.axis == len(node.x.shape) - 1
    totals = e @ OneMatrix(cols, cols) if last else OneMatrix(rows, rows) @ e
    return HadamardProduct(e, HadamardPower(totals, -1))


@_matrix.register
def _(node: t.Compare, cv):
    relation = _RELATIONS[node.op]
    return cv.elementwise(node, node.shape, lambda i, j: relation(cv.entry_of(node.a, node.shape, i, j),
                                                                  cv.entry_of(node.b, node.shape, i, j)))


@_matrix.register
def _(node: t.Where, cv):
    def make(i, j):
        cond = cv.entry_of(node.cond, node.shape, i, j)
        return Piecewise((cv.entry_of(node.a, node.shape, i, j), cond),
                         (cv.entry_of(node.b, node.shape, i, j), True))

    return cv.elementwise(node, node.shape, make)


@_matrix.register
def _(node: t.Concat, cv):
    parts = [cv.matrix(p) for p in node.parts]
    if node.axis == len(node.shape) - 1:
        return sympy.BlockMatrix([parts])
    return sympy.BlockMatrix([[p] for p in parts])


@_matrix.register
def _(node: t.Slice, cv):
    x = cv.matrix(node.x)
    if node.axis + 2 - len(node.x.shape) == 0:
        return x[node.start:node.stop, :]
    return x[:, node.start:node.stop]


@_matrix.register
def _(node: t.Scatter, cv):
    return _matrix(gather_form(node), cv)  # each entry: the sum of what reaches it


@_matrix.register
def _(node: t.Constant, cv):
    rows, cols = _rows_cols(node.shape)
    if node.kind == "ones":
        return OneMatrix(rows, cols)
    if node.kind == "eye":
        return Identity(rows)
    if node.kind == "causal_mask":
        return cv.elementwise(node, node.shape, lambda i, j: Piecewise((0, j <= i), (-sympy.oo, True)))
    if node.kind == "sinusoidal":
        width = cols

        def make(i, j):
            angle = i / sympy.Integer(10000) ** (2 * sympy.floor(j / 2) / width)
            return Piecewise((sympy.sin(angle), sympy.Eq(sympy.Mod(j, 2), 0)), (sympy.cos(angle), True))

        return cv.elementwise(node, node.shape, make)
    raise SymbolicError(f"no SymPy matrix form for the constant {node.kind}")


@_matrix.register
def _(node: t.SumTo, cv):
    x = cv.matrix(node.x)
    if not node.shape:
        return _entry(_sum_axes(x, node.x.shape, range(len(node.x.shape))))
    # Summing the leading axis of [r, c] down to [c] leaves the row [1, c], which is how a
    # 1-D tensor is written, so dropping an axis needs nothing more.
    return _sum_axes(x, node.x.shape, node.axes)


@_matrix.register
def _(node: t.IndexDef, cv):
    rows, cols = _rows_cols(node.shape)
    names = [i.name for i in node.indices]
    symbols = {name: Symbol(name, integer=True) for name in names}
    body = cv.scalar(node.body, symbols)
    if len(names) == 0:
        return body
    if len(names) == 1:
        row = Symbol("row", integer=True)  # the one row of a 1-D tensor
        return FunctionMatrix(rows, cols, Lambda((row, symbols[names[0]]), body))
    return FunctionMatrix(rows, cols, Lambda((symbols[names[0]], symbols[names[1]]), body))


# --- entries in index notation -------------------------------------------------------------------


def _element(symbol: sympy.Basic, shape: t.Shape, indices) -> sympy.Expr:
    if not shape:
        return symbol
    if len(shape) == 1:
        return symbol[0, indices[0]]
    return symbol[indices[0], indices[1]]


@singledispatch
def _scalar(node, cv: _Converter, env) -> sympy.Expr:
    raise SymbolicError(f"no SymPy form for {type(node).__name__} inside index notation")


@_scalar.register
def _(node: t.Entry, cv, env):
    shape = cv.spec.tensors[node.tensor].shape
    symbol = tensor_symbol(node.tensor, shape, grad=node.grad)
    return _element(symbol, shape, [env[i] if isinstance(i, str) else as_sympy(i, env) for i in node.indices])


@_scalar.register
def _(node: t.IndexVar, cv, env):
    return env[node.name]


@_scalar.register
def _(node: t.IndexSum, cv, env):
    k = Symbol(node.index.name, integer=True)
    return sympy.Sum(cv.scalar(node.body, {**env, node.index.name: k}), (k, 0, node.index.range - 1))


@_scalar.register(t.Scalar)
@_scalar.register(t.DimValue)
@_scalar.register(t.Tensor)
@_scalar.register(t.Grad)
def _(node, cv, env):
    return cv.matrix(node)


@_scalar.register
def _(node: t.Unary, cv, env):
    x = cv.scalar(node.x, env)
    return -x if node.fn == "neg" else _SCALAR_FUNCTIONS[node.fn](x)


@_scalar.register
def _(node: t.Binary, cv, env):
    a, b = cv.scalar(node.a, env), cv.scalar(node.b, env)
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b, "pow": a ** b}[node.op]


@_scalar.register
def _(node: t.Compare, cv, env):
    return _RELATIONS[node.op](cv.scalar(node.a, env), cv.scalar(node.b, env))


@_scalar.register
def _(node: t.Where, cv, env):
    return Piecewise((cv.scalar(node.a, env), cv.scalar(node.cond, env)), (cv.scalar(node.b, env), True))
