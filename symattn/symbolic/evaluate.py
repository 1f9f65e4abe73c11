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
from ..ir.index_scope import scope_sum_indices
from ..errors import SymbolicError, UsageError
from ..ir.shapes import dim_symbol, format_dim, format_shape
from .backends import NUMERIC, SYMBOLIC, Backend, reduce_lines

__all__ = ["Evaluator", "SYMBOLIC", "NUMERIC", "sinusoidal_value", "random_leaves", "reduce_lines"]


def sinusoidal_value(i: int, column: int, width: int, exact: bool):
    """E[i, 2c] = sin(i / 10000^(2c/d)), E[i, 2c+1] = cos(i / 10000^(2c/d))."""
    c = column // 2
    if exact:
        angle = sympy.Integer(i) / sympy.Integer(10000) ** sympy.Rational(2 * c, width)
        return sympy.sin(angle) if column % 2 == 0 else sympy.cos(angle)
    angle = i / 10000.0 ** (2 * c / width)
    return math.sin(angle) if column % 2 == 0 else math.cos(angle)


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
    subs.update({sympy.Symbol(name, nonnegative=True, integer=True): size for name, size in sizes})
    return tuple(_whole(d, subs, dict(sizes), list(order)) for d in shape)


class Evaluator:
    """Evaluate the nodes of one spec at concrete sizes with one backend."""

    def __init__(self, spec: t.TypedSpec, backend: Backend = NUMERIC, sizes: Mapping[str, int] | None = None):
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
    def _(self, node: t.Logical):
        return self.backend.logical(node.op, *(self._eval(a) for a in node.args))

    @_eval.register
    def _(self, node: t.Apply):
        return self.backend.apply(node.fn, *(self._eval(a) for a in node.args))

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
        cells = _Grid(box, dict(zip(box, ranges)), self)
        at = [cells.integer(s) if isinstance(s, t.Node) else subscript_value(s, grid, self._offset(s))
              for s in node.targets]
        lead = values.shape[: values.ndim - len(box)]
        for a in at:
            lead = np.broadcast_shapes(lead, np.shape(a)[: max(0, np.ndim(a) - len(box))])
        out = self._zeros(lead + tuple(self.size(d) for d in node.shape), values)
        values = np.broadcast_to(values, lead + tuple(ranges))
        at = [np.broadcast_to(a, lead + tuple(ranges)) for a in at]
        batch = [np.arange(n).reshape((n,) + (1,) * (len(lead) - k - 1 + len(box))) for k, n in enumerate(lead)]
        np.add.at(out, (*batch, *at), values)  # entries that several box points reach get their sum
        return out

    def _zeros(self, shape: tuple[int, ...], like: np.ndarray) -> np.ndarray:
        if self.backend.exact:
            out = np.empty(shape, dtype=object)
            out.fill(sympy.Integer(0))
            return out
        return np.zeros(shape, dtype=np.result_type(like, np.float64))

    def _offset(self, s) -> int | None:
        """The offset of a computed subscript at these sizes (None for a plain index or an integer node)."""
        return None if not isinstance(s, t.Affine) else self.size(s.offset)

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
            index = [self.integer(s) if isinstance(s, t.Node) else
                     np.broadcast_to(subscript_value(s, values, self.ev._offset(s)), (1,) * self.rank)
                     if isinstance(s, t.Affine) and not s.indices else
                     subscript_value(s, values, self.ev._offset(s)) for s in node.indices]
            lead = source.ndim - len(node.indices)
            if all(np.ndim(i) <= self.rank for i in index):
                return source[(Ellipsis, *index)]
            # A subscript read through a buffer with batch axes (offsets[doc[i]]): each batch
            # entry reads its own, so the batch axes index too.
            batch = source.shape[:lead]
            for i in index:
                batch = np.broadcast_shapes(batch, np.shape(i)[: max(0, np.ndim(i) - self.rank)])
            source = np.broadcast_to(source, batch + source.shape[lead:])
            axes = [np.arange(n).reshape((n,) + (1,) * (len(batch) - k - 1 + self.rank))
                    for k, n in enumerate(batch)]
            return source[(*axes, *index)]
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
        if isinstance(node, t.Logical):
            return backend.logical(node.op, *(self.eval(a) for a in node.args))
        if isinstance(node, t.Apply):
            return backend.apply(node.fn, *(self.eval(a) for a in node.args))
        if isinstance(node, (t.Scalar, t.DimValue, t.Tensor)):
            return self.ev.evaluate(node)
        raise SymbolicError(f"no index-notation rule for {type(node).__name__}")

    def integer(self, node: t.Node) -> np.ndarray:
        """An integer subscript (`table[j // S]`, `clamp(j - i, -R, R) + R`) as int64 arrays on the grid.
        Both backends read integer buffers as given integers; a value that is not one (NaN) is an error."""
        value = self.eval(node)
        if self.ev.backend.exact:
            flat = [sympy.sympify(self.ev.backend.number(v)) for v in np.asarray(value, dtype=object).ravel()]
            if not all(v.is_Integer for v in flat):
                bad = next(v for v in flat if not v.is_Integer)
                raise SymbolicError(f"the subscript {node} is {bad} somewhere, not an integer: an integer "
                                    "buffer it reads must be given integer values")
            return np.array([int(v) for v in flat], dtype=np.int64).reshape(np.shape(value))
        value = np.asarray(value)
        if value.dtype.kind == "f":
            if not np.all(np.isfinite(value)):
                raise SymbolicError("a computed subscript is NaN or infinite at some entry")
            value = value.astype(np.int64)
        return value


def random_leaves(spec: t.TypedSpec, rng: np.random.Generator, batch: tuple[int, ...] = (),
                  sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Standard-normal float64 arrays for every input, param and buffer."""
    ev = Evaluator(spec, NUMERIC, sizes)
    out = {}
    for name in spec.given:
        info = spec.tensors[name]
        shape = batch + tuple(ev.size(d) for d in info.shape)
        if info.integer:  # an integer buffer: integers drawn from its range
            low, high = (ev.size(v) for v in info.values)
            out[name] = rng.integers(low, high, size=shape, dtype=np.int64)
        else:
            out[name] = rng.standard_normal(shape)
    return out

