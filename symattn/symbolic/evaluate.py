"""Evaluate typed-IR nodes on arrays: exact SymPy entries or float64 numbers.

Contract: `Evaluator(spec, backend).run(leaves, grads)` computes every tensor
of the spec op by op, written for obviousness rather than speed, and
`evaluate(node)` computes one expression (claims and derived gradients, with
`grad(T)` taken from `grads`). Two backends share the rules:

- `SYMBOLIC`: NumPy object arrays of SymPy expressions (the element level:
  softmax written with exp, `-inf` masks giving exactly 0 weight);
- `NUMERIC`: float64 arrays (the reference evaluator used by checks of
  generated code; stable softmax, a fully masked row gives zeros).

Index notation is evaluated on a grid with one axis per index; every
`sum(k, ...)` gets an axis of its own (`index_scope.scope_sum_indices`), so sibling
sums may reuse a name over different ranges.

Extra leading batch axes on the leaves broadcast through every operation.
"""

from __future__ import annotations

import math
from functools import lru_cache, singledispatchmethod
from typing import Mapping

import numpy as np
import sympy

from ..ir import typed as t
from ..ir.affine import value as subscript_value
from ..ir.functions import FUNCTIONS, table
from ..ir.index_scope import scope_sum_indices
from ..errors import SymbolicError, UsageError
from ..ir.shapes import dim_symbol, format_dim, format_shape
from .lattice import lattice

__all__ = ["Evaluator", "SYMBOLIC", "NUMERIC", "sinusoidal_value", "random_leaves", "reduce_lines"]


def sinusoidal_value(i: int, column: int, width: int, exact: bool):
    """E[i, 2c] = sin(i / 10000^(2c/d)), E[i, 2c+1] = cos(i / 10000^(2c/d))."""
    c = column // 2
    if exact:
        angle = sympy.Integer(i) / sympy.Integer(10000) ** sympy.Rational(2 * c, width)
        return sympy.sin(angle) if column % 2 == 0 else sympy.cos(angle)
    angle = i / 10000.0 ** (2 * c / width)
    return math.sin(angle) if column % 2 == 0 else math.cos(angle)


def reduce_lines(x, axis, line) -> np.ndarray:
    """`line(entries)` of every line of the object array `x` along `axis` (an int or a tuple of
    them), keeping the reduced axes with size 1: max and min of exact or guarded entries."""
    x = np.asarray(x, dtype=object)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0)))
    flat = moved.reshape(*moved.shape[:moved.ndim - len(axes)], -1)
    out = np.empty(flat.shape[:-1], dtype=object)
    for index in np.ndindex(*out.shape):
        out[index] = line(list(flat[index]))
    return np.expand_dims(out, tuple(a % x.ndim for a in axes))


class _Backend:
    exact: bool


class _Numeric(_Backend):
    exact = False
    dtype = np.float64

    def scalar(self, value: sympy.Expr):
        if value == sympy.oo:
            return np.inf
        if value == -sympy.oo:
            return -np.inf
        return float(value)

    def unary(self, fn: str, x):
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return -x if fn == "neg" else FUNCTIONS[fn].float64(x)

    def binary(self, op: str, a, b):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                    "pow": np.power}[op](a, b)

    def compare(self, op: str, a, b):
        return {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                "==": np.equal, "!=": np.not_equal}[op](a, b)

    def where(self, cond, a, b):
        return np.where(cond, a, b)

    def softmax(self, x, axis: int):
        """The stable formula of the generated code: exp(x - row max) / its sum. A fully masked row
        (all -inf) has weights 0; a row holding NaN or +inf is NaN (inf - inf), as in the generated
        NumPy and CUDA code and torch.softmax (not 0s, or [NaN, 0, ...])."""
        x = np.asarray(x, dtype=np.float64)
        top = np.max(x, axis=axis, keepdims=True)
        shift = np.where(top == -np.inf, 0.0, top)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(x - shift)
            total = np.sum(e, axis=axis, keepdims=True)
            return np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total))

    def logsumexp(self, x, axis):
        """log(sum(exp(x - row max))) + row max, as the generated code computes it: -inf for a fully
        masked row, NaN for a row holding NaN or +inf."""
        x = np.asarray(x, dtype=np.float64)
        top = np.max(x, axis=axis, keepdims=True)
        shift = np.where(top == -np.inf, 0.0, top)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift

    def extreme(self, kind: str, x, axis):
        """max or min along `axis`, keeping it; NaN anywhere in a row gives NaN, as np.max says."""
        x = np.asarray(x, dtype=np.float64)
        return (np.max if kind == "max" else np.min)(x, axis=axis, keepdims=True)

    def array(self, values):
        return np.asarray(values, dtype=np.float64)


def _elementwise(func):
    ufunc = np.frompyfunc(func, 1, 1)
    return lambda x: ufunc(np.asarray(x, dtype=object)) if np.ndim(x) else func(
        x.item() if isinstance(x, np.ndarray) else x)


def _ieee(value):
    """A SymPy number as float64 would have it: complex infinity, an imaginary part or an
    interval (sin(oo)) is NaN. Expressions are left alone."""
    if isinstance(value, sympy.Basic) and value.is_number and (
            value is sympy.zoo or value.has(sympy.I) or value.has(sympy.AccumBounds)):
        return sympy.nan
    return value


def _ieee_divide(a, b):
    """a / b with float64's answers when b is exactly 0: +-inf, or NaN for 0 / 0."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    if b.is_zero and a.is_number:
        if a.is_zero or a is sympy.nan:
            return sympy.nan
        return sympy.oo if a.is_positive else -sympy.oo if a.is_negative else sympy.nan
    return _ieee(a / b)


def _non_finite_number(value) -> bool:
    """NaN or an infinity (a row holding NaN or +inf, summed)."""
    value = sympy.sympify(value)
    return value is sympy.nan or value in (sympy.oo, sympy.zoo) or (value.is_number and value.has(sympy.nan))


def _weight(u, total):
    """One softmax weight exp(x) / total at 30 digits or exactly (see `_Symbolic.softmax`)."""
    total = sympy.sympify(total)
    if total.is_zero:
        return sympy.Integer(0)
    if _non_finite_number(total):
        return sympy.nan
    return u / total


class _Symbolic(_Backend):
    exact = True

    _FUNCS = table("exact", {"neg": lambda x: -x})
    _REL = {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "==": sympy.Eq, "!=": sympy.Ne}

    def scalar(self, value):
        return value

    def unary(self, fn, x):
        func = self._FUNCS[fn]
        return _elementwise(lambda u: _ieee(func(u)))(x)

    def binary(self, op, a, b):
        a, b = self._obj(a), self._obj(b)
        if op == "pow":
            return np.frompyfunc(lambda u, v: _ieee(u**v) if not (sympy.sympify(u).is_zero and
                                                                  sympy.sympify(v).is_negative)
                                 else sympy.oo, 2, 1)(a, b)
        if op == "div":
            return np.frompyfunc(_ieee_divide, 2, 1)(a, b)
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a, b)

    def compare(self, op, a, b):
        rel = self._REL[op]

        def compare(u, v):
            u, v = sympy.sympify(u), sympy.sympify(v)
            if u is sympy.nan or v is sympy.nan:  # every comparison with NaN is false but !=
                return sympy.true if op == "!=" else sympy.false
            return rel(u, v)

        return np.frompyfunc(compare, 2, 1)(self._obj(a), self._obj(b))

    def where(self, cond, a, b):
        def pick(c, u, v):
            if c is sympy.true or c is True:
                return u
            if c is sympy.false or c is False:
                return v
            return sympy.Piecewise((u, c), (v, True))

        return np.frompyfunc(pick, 3, 1)(cond, self._obj(a), self._obj(b))

    def softmax(self, x, axis):
        e = self.unary("exp", x)
        total = np.sum(e, axis=axis, keepdims=True)
        # A fully masked row (every entry -oo) sums to exactly 0: its weights are 0, as in
        # the numeric backend and the generated code, not 0 / 0. A row holding NaN or +oo sums to
        # NaN or +oo: every weight is NaN, as the stable formula (x - row max) gives.
        return np.frompyfunc(_weight, 2, 1)(e, total)

    def logsumexp(self, x, axis):
        total = np.sum(self.unary("exp", x), axis=axis, keepdims=True)
        return np.frompyfunc(lambda s: sympy.nan if _non_finite_number(s) else s, 1, 1)(
            self.unary("log", total))

    def extreme(self, kind: str, x, axis):
        """sympy.Max or sympy.Min of each line along `axis`, keeping it; a NaN entry makes the line NaN."""
        fn = sympy.Max if kind == "max" else sympy.Min

        def line(values):
            values = tuple(sympy.sympify(v) for v in values)
            if any(v is sympy.nan for v in values):
                return sympy.nan
            key = (fn, values)
            if key not in _EXTREMES:
                if len(_EXTREMES) > _EXTREMES_KEPT:
                    _EXTREMES.clear()
                _EXTREMES[key] = lattice(fn, values)
            return _EXTREMES[key]

        return reduce_lines(x, axis, line)

    def array(self, values):
        return np.asarray(values, dtype=object)

    @staticmethod
    def _obj(x):
        return np.asarray(x, dtype=object) if np.ndim(x) else x


# Max and Min of the same entries, in the same order, built once per process: SymPy compares every
# pair of arguments symbolically when it builds one (a softmax row's scores: a tenth of a second),
# and the element model, the claims and the symmetry witness each evaluate the same rows. The
# result is the very expression another call would build.
_EXTREMES: dict[tuple, sympy.Expr] = {}
_EXTREMES_KEPT = 4096

SYMBOLIC = _Symbolic()
NUMERIC = _Numeric()


def _whole(dim, subs: Mapping, sizes: Mapping[str, int], order: list[str]) -> int:
    """A dim expression at these sizes, which must be an integer: `d / h` needs h to divide d."""
    value = sympy.sympify(dim).subs(subs)
    if not value.is_Integer:
        shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise UsageError(f"{format_dim(dim, order)} is {value} at {shown}, not a whole size")
    return int(value)


@lru_cache(maxsize=1024)
def _shape_at(shape: tuple, sizes: tuple[tuple[str, int], ...], order: tuple[str, ...]) -> tuple[int, ...]:
    """A declared shape at these sizes (cached: finite differences run the evaluator thousands of times)."""
    subs = {dim_symbol(name): size for name, size in sizes}
    return tuple(_whole(d, subs, dict(sizes), list(order)) for d in shape)


class Evaluator:
    """Evaluate the nodes of one spec at concrete sizes with one backend."""

    def __init__(self, spec: t.TypedSpec, backend: _Backend = NUMERIC, sizes: Mapping[str, int] | None = None):
        self.spec = spec
        self.backend = backend
        self.sizes = dict(sizes or spec.sizes)
        self.subs = {spec.dims[n].symbol: s for n, s in self.sizes.items()}
        self.values: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        # Applied to each tensor `run` computes: the digits mode of claims rounds every entry to a
        # number there, so exact constants (cos(1/100)) do not grow into huge expressions downstream.
        self.settle = None

    def size(self, dim) -> int:
        """A dim expression at these sizes; division is exact, so `(N + 1) / 2` at an even N is an error."""
        return _whole(dim, self.subs, self.sizes, list(self.spec.dims))

    def run(self, leaves: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray] | None = None):
        """Every tensor's value, given the inputs, params and buffers (and optional grad(T) arrays).

        A given tensor must have its declared shape at these sizes (after any leading batch
        axes), and each dim of it must be whole (`(N + 1) / 2` refuses an even N),
        as generated code refuses them too: otherwise a UsageError.
        """
        order = tuple(self.spec.dims)
        for name in self.spec.given:
            declared = tuple(self.spec.tensors[name].shape)
            expected = _shape_at(declared, tuple(self.sizes.items()), order)
            given = np.shape(leaves[name])
            if len(given) < len(declared) or given[len(given) - len(declared):] != expected:
                raise UsageError(f"{name}: expected shape {format_shape(declared, list(order))} = "
                                 f"{list(expected)} at these sizes, got {list(given)}")
        self.values = {name: leaves[name] for name in self.spec.given}
        self.grads = dict(grads or {})
        for name, info in self.spec.tensors.items():
            if info.expr is not None:
                value = self.evaluate(info.expr)
                self.values[name] = value if self.settle is None else self.settle(value)
        return self.values

    def evaluate(self, node: t.Node):
        with np.errstate(all="ignore"):  # NaN and infinities are values here, as in float64
            return self._eval(node)

    # Axes in the typed IR count from the front of the spec's shape; leading batch axes
    # shift them, so every rule works with negative axes.
    @staticmethod
    def _neg(axis: int, node: t.Node) -> int:
        return axis - len(node.shape)

    @singledispatchmethod
    def _eval(self, node):
        raise SymbolicError(f"no evaluation rule for {type(node).__name__}")

    @_eval.register
    def _(self, node: t.Tensor):
        return self.values[node.name]

    @_eval.register
    def _(self, node: t.Grad):
        if node.name not in self.grads:
            raise SymbolicError(f"grad({node.name}) is not available here")
        return self.grads[node.name]

    @_eval.register
    def _(self, node: t.Scalar):
        return self.backend.scalar(node.value)

    @_eval.register
    def _(self, node: t.DimValue):
        value = sympy.sympify(node.dim).subs(self.subs)
        return value if self.backend.exact else float(value)

    @_eval.register
    def _(self, node: t.Unary):
        return self.backend.unary(node.fn, self._eval(node.x))

    @_eval.register
    def _(self, node: t.Binary):
        return self.backend.binary(node.op, self._eval(node.a), self._eval(node.b))

    @_eval.register
    def _(self, node: t.MatMul):
        a, b = self._eval(node.a), self._eval(node.b)
        if self.backend.exact:
            a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 is NaN, as float64 says
            return np.matmul(a, b)

    @_eval.register
    def _(self, node: t.Transpose):
        return np.swapaxes(self._eval(node.x), -1, -2)

    @_eval.register
    def _(self, node: t.Reduce):
        x = self._eval(node.x)
        rank = len(node.x.shape)
        axis = tuple(range(-rank, 0)) if node.axis is None else node.axis - rank
        if node.kind == "logsumexp":
            return self.backend.logsumexp(x, axis)
        if node.kind in ("max", "min"):
            return self.backend.extreme(node.kind, x, axis)
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf is NaN, as float64 says
            total = np.sum(x, axis=axis, keepdims=True)
        if node.kind == "mean":
            count = 1
            for k in (range(rank) if node.axis is None else [node.axis]):
                count *= self.size(node.x.shape[k])
            return total / (sympy.Integer(count) if self.backend.exact else count)
        return total

    @_eval.register
    def _(self, node: t.Scan):
        x = np.asarray(self._eval(node.x))
        axis = self._neg(node.axis, node.x)
        if node.reverse:
            return np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)
        return np.cumsum(x, axis=axis)  # object arrays add their SymPy entries exactly

    @_eval.register
    def _(self, node: t.Softmax):
        return self.backend.softmax(self._eval(node.x), self._neg(node.axis, node.x))

    @_eval.register
    def _(self, node: t.Compare):
        return self.backend.compare(node.op, self._eval(node.a), self._eval(node.b))

    @_eval.register
    def _(self, node: t.Where):
        return self.backend.where(self._eval(node.cond), self._eval(node.a), self._eval(node.b))

    @_eval.register
    def _(self, node: t.MergeHeads):
        x = np.asarray(self._eval(node.x))
        merged = np.swapaxes(x, -3, -2)  # [..., N, h, k]
        return merged.reshape(*merged.shape[:-2], merged.shape[-2] * merged.shape[-1])

    @_eval.register
    def _(self, node: t.SplitHeads):
        x = np.asarray(self._eval(node.x))
        heads = self.size(node.heads)
        split = x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads)  # [..., N, h, k]
        return np.swapaxes(split, -3, -2)

    @_eval.register
    def _(self, node: t.Concat):
        parts = [np.asarray(self._eval(p)) for p in node.parts]
        batch = np.broadcast_shapes(*[p.shape[: p.ndim - len(node.shape)] for p in parts])
        parts = [np.broadcast_to(p, batch + p.shape[p.ndim - len(node.shape):]) for p in parts]
        return np.concatenate(parts, axis=self._neg(node.axis, node))

    @_eval.register
    def _(self, node: t.Constant):
        shape = tuple(self.size(d) for d in node.shape)
        exact = self.backend.exact
        if node.kind == "ones":
            return self.backend.array(np.ones(shape, dtype=object if exact else np.float64))
        if node.kind == "eye":
            eye = np.eye(shape[0], dtype=np.int64)
            return self.backend.array(eye.astype(object) if exact else eye.astype(np.float64))
        if node.kind == "causal_mask":
            n = shape[0]
            ninf = -sympy.oo if exact else -np.inf
            zero = sympy.Integer(0) if exact else 0.0
            return self.backend.array([[zero if j <= i else ninf for j in range(n)] for i in range(n)])
        if node.kind == "sinusoidal":
            n, width = shape
            return self.backend.array([[sinusoidal_value(i, c, width, exact) for c in range(width)]
                                       for i in range(n)])
        raise SymbolicError(f"no evaluation rule for the constant {node.kind}")

    @_eval.register
    def _(self, node: t.SumTo):
        x = np.asarray(self._eval(node.x))
        lead = len(node.x.shape) - len(node.shape)
        rank = len(node.x.shape)
        kept = [a - rank for a in node.axes if a >= lead]
        if kept:
            x = np.sum(x, axis=tuple(kept), keepdims=True)
        if lead:
            x = np.sum(x, axis=tuple(range(-rank, -rank + lead)))
        return x

    @_eval.register
    def _(self, node: t.Slice):
        x = np.asarray(self._eval(node.x))
        axis = self._neg(node.axis, node.x)
        index = [slice(None)] * x.ndim
        index[axis] = slice(self.size(node.start), self.size(node.stop))
        return x[tuple(index)]

    @_eval.register
    def _(self, node: t.Scatter):
        values = np.asarray(self._eval(node.x))
        box = [i.name for i in node.x.indices]
        ranges = [self.size(i.range) for i in node.x.indices]
        grid = dict(zip(box, np.meshgrid(*[np.arange(r, dtype=np.int64) for r in ranges], indexing="ij")))
        at = tuple(np.broadcast_to(subscript_value(s, grid, self._offset(s)), tuple(ranges)) for s in node.targets)
        lead = values.shape[: values.ndim - len(box)]
        out = self._zeros(lead + tuple(self.size(d) for d in node.shape), values)
        np.add.at(out, (Ellipsis, *at), values)  # entries that several box points reach get their sum
        return out

    def _zeros(self, shape: tuple[int, ...], like: np.ndarray) -> np.ndarray:
        if self.backend.exact:
            out = np.empty(shape, dtype=object)
            out.fill(sympy.Integer(0))
            return out
        return np.zeros(shape, dtype=np.result_type(like, np.float64))

    def _offset(self, s) -> int | None:
        """The offset of a computed subscript at these sizes (None for a plain index)."""
        return None if isinstance(s, str) else self.size(s.offset)

    # --- index notation: each index owns one trailing axis of a grid -------------

    @_eval.register
    def _(self, node: t.IndexDef):
        node = scope_sum_indices(node)  # one grid axis per index name, so one name per sum
        names = [i.name for i in node.indices]
        ranges = {i.name: self.size(i.range) for i in node.indices}
        for n in _sum_indices(node.body):
            if n.index.name not in ranges:
                names.append(n.index.name)
            ranges[n.index.name] = self.size(n.index.range)
        grid = _Grid(names, ranges, self)
        value = np.asarray(grid.eval(node.body), dtype=object if self.backend.exact else np.float64)
        if value.ndim < len(names):
            value = value.reshape((1,) * (len(names) - value.ndim) + value.shape)
        full = value.shape[: value.ndim - len(names)] + tuple(
            ranges[n] if k < len(node.indices) else 1 for k, n in enumerate(names))
        value = np.broadcast_to(value, np.broadcast_shapes(value.shape, full))
        value = value.reshape(value.shape[: value.ndim - len(names) + len(node.indices)])
        return np.array(value)


def _sum_indices(node: t.Node):
    return (n for n in t.walk(node) if isinstance(n, t.IndexSum))


class _Grid:
    """Evaluate an index-notation body with every index as a broadcast axis."""

    def __init__(self, names: list[str], ranges: dict[str, int], ev: Evaluator) -> None:
        self.names = names
        self.ranges = ranges
        self.ev = ev
        self.rank = len(names)

    def axis(self, name: str) -> int:
        return self.names.index(name) - self.rank

    def arange(self, name: str) -> np.ndarray:
        shape = [1] * self.rank
        shape[self.names.index(name)] = self.ranges[name]
        values = np.arange(self.ranges[name]).reshape(shape)
        return values.astype(object) if self.ev.backend.exact else values

    def eval(self, node: t.Node):
        if isinstance(node, t.Entry):
            source = np.asarray(self.ev.grads[node.tensor] if node.grad else self.ev.values[node.tensor])
            values = {n: self.arange(n).astype(np.int64) for n in t.entry_names(node)}
            index = tuple(np.broadcast_to(subscript_value(s, values, self.ev._offset(s)), (1,) * self.rank)
                          if isinstance(s, t.Affine) and not s.indices else
                          subscript_value(s, values, self.ev._offset(s)) for s in node.indices)
            return source[(Ellipsis, *index)]
        if isinstance(node, t.IndexVar):
            values = self.arange(node.name)
            return np.vectorize(sympy.Integer, otypes=[object])(values) if self.ev.backend.exact else values * 1.0
        if isinstance(node, t.IndexSum):
            body = np.asarray(self.eval(node.body))
            axis = self.axis(node.index.name)
            shape = list(body.shape)
            while len(shape) < self.rank:
                shape.insert(0, 1)
            body = body.reshape(shape) if body.ndim < self.rank else body
            target = list(body.shape)
            target[axis] = self.ranges[node.index.name]
            return np.sum(np.broadcast_to(body, target), axis=axis, keepdims=True)
        backend = self.ev.backend
        if isinstance(node, t.Unary):
            return backend.unary(node.fn, self.eval(node.x))
        if isinstance(node, t.Binary):
            return backend.binary(node.op, self.eval(node.a), self.eval(node.b))
        if isinstance(node, t.Compare):
            return backend.compare(node.op, self.eval(node.a), self.eval(node.b))
        if isinstance(node, t.Where):
            return backend.where(self.eval(node.cond), self.eval(node.a), self.eval(node.b))
        if isinstance(node, (t.Scalar, t.DimValue, t.Tensor)):
            return self.ev.evaluate(node)
        raise SymbolicError(f"no index-notation rule for {type(node).__name__}")


def random_leaves(spec: t.TypedSpec, rng: np.random.Generator, batch: tuple[int, ...] = (),
                  sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Standard-normal float64 arrays for every input, param and buffer."""
    ev = Evaluator(spec, NUMERIC, sizes)
    return {name: rng.standard_normal(batch + tuple(ev.size(d) for d in spec.tensors[name].shape))
            for name in spec.given}

