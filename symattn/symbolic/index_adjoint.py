"""The adjoint of index notation: differentiate the entry formula.

Contract: for `T[i, j] = body`, `index_adjoint` returns, for every tensor X
whose entries the body reads, `grad(X)` as index notation again:

    grad(X)[l, m] = sum over the indices of T not fixed by X[l, m] of
                    grad(T)[i, j] * d body / d X[l, m]

The derivative of the body is taken node by node (chain, product and
quotient rules); each read `X[p, q]` contributes Kronecker deltas
delta(p, l) delta(q, m), which are eliminated as they meet the sum that binds
the index (`sum(k, ... X[i, k] ...)` collapses to the term at k = m) or, for
the indices of T, by substituting into grad(T)[i, j]. So the result has no
deltas and no more sums than the entry formula itself.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Callable

from ..ir import build as b
from ..ir import typed as t
from ..errors import SymbolicError

__all__ = ["index_adjoint", "rename_indices"]

_FRESH = ("l", "m", "n", "p", "q", "r", "s", "u", "v", "a", "b", "e", "f", "g", "i", "j", "k")

# A term of a derivative: index -> target index constraints (deltas), and the expression.
Term = tuple[dict[str, str], t.Node]


def _index_names(node: t.Node) -> set[str]:
    names: set[str] = set()
    for n in t.walk(node):
        if isinstance(n, t.IndexVar):
            names.add(n.name)
        elif isinstance(n, t.Entry):
            names.update(n.indices)
        elif isinstance(n, t.IndexSum):
            names.add(n.index.name)
    return names


def _fresh(count: int, used: set[str]) -> list[str]:
    pool = [name for name in _FRESH if name not in used]
    pool += [f"i{k}" for k in range(1, count + 1) if f"i{k}" not in used]
    return pool[:count]


@singledispatch
def rename_indices(node, mapping: dict[str, str]) -> t.Node:
    """The node with index names replaced by `mapping` (bound names are never mapped)."""
    if not node.children:
        return node
    raise SymbolicError(f"cannot rename indices inside {type(node).__name__}")


@rename_indices.register
def _(node: t.IndexVar, mapping):
    return t.IndexVar(mapping.get(node.name, node.name))


@rename_indices.register
def _(node: t.Entry, mapping):
    return t.Entry(node.tensor, tuple(mapping.get(i, i) for i in node.indices), grad=node.grad)


@rename_indices.register
def _(node: t.IndexSum, mapping):
    inner = {k: v for k, v in mapping.items() if k != node.index.name}
    return t.IndexSum(node.index, rename_indices(node.body, inner))


@rename_indices.register
def _(node: t.Unary, mapping):
    return t.Unary(node.fn, rename_indices(node.x, mapping), ())


@rename_indices.register
def _(node: t.Binary, mapping):
    return t.Binary(node.op, rename_indices(node.a, mapping), rename_indices(node.b, mapping), ())


@rename_indices.register
def _(node: t.Compare, mapping):
    return t.Compare(node.op, rename_indices(node.a, mapping), rename_indices(node.b, mapping), ())


@rename_indices.register
def _(node: t.Where, mapping):
    return t.Where(rename_indices(node.cond, mapping), rename_indices(node.a, mapping),
                   rename_indices(node.b, mapping), ())


class _Differentiator:
    """d body / d X[targets], as a list of terms with pending deltas."""

    def __init__(self, tensor: str, targets: list[str], unary_rules: dict[str, tuple[str, Callable]]) -> None:
        self.tensor = tensor
        self.targets = targets
        self.unary_rules = unary_rules
        self.rec = b.Recorder()

    def d(self, node: t.Node) -> list[Term]:
        if isinstance(node, t.Entry):
            if node.tensor != self.tensor or node.grad:
                return []
            deltas: dict[str, str] = {}
            for index, target in zip(node.indices, self.targets):
                if deltas.get(index, target) != target:
                    raise SymbolicError(f"{node.tensor}[{', '.join(node.indices)}] repeats an index; the gradient "
                                        "of a diagonal read is not derived yet")
                deltas[index] = target
            return [(deltas, b.scalar(1))]
        if isinstance(node, t.Tensor):  # a scalar tensor read whole, as in `w * (j - i)`
            return [({}, b.scalar(1))] if node.name == self.tensor else []
        if isinstance(node, (t.Scalar, t.DimValue, t.IndexVar)):
            return []
        if isinstance(node, t.Unary):
            _, make = self.unary_rules[node.fn]
            factor = make(node.x, node, b.scalar(1), self.rec)
            return [(c, b.mul(factor, e)) for c, e in self.d(node.x)]
        if isinstance(node, t.Binary):
            return self._binary(node)
        if isinstance(node, t.Where):
            zero = b.scalar(0)
            return ([(c, b.where(node.cond, e, zero)) for c, e in self.d(node.a)]
                    + [(c, b.where(node.cond, zero, e)) for c, e in self.d(node.b)])
        if isinstance(node, t.IndexSum):
            out: list[Term] = []
            for deltas, expr in self.d(node.body):
                name = node.index.name
                if name in deltas:
                    deltas = dict(deltas)
                    target = deltas.pop(name)
                    out.append((deltas, rename_indices(expr, {name: target})))  # the sum collapses
                else:
                    out.append((deltas, t.IndexSum(node.index, expr)))
            return out
        raise SymbolicError(f"cannot differentiate {type(node).__name__} in index notation")

    def _binary(self, node: t.Binary) -> list[Term]:
        u, v, op = node.a, node.b, node.op
        du, dv = self.d(u), self.d(v)
        if op == "add":
            return du + dv
        if op == "sub":
            return du + [(c, b.neg(e)) for c, e in dv]
        if op == "mul":
            return [(c, b.mul(e, v)) for c, e in du] + [(c, b.mul(u, e)) for c, e in dv]
        if op == "div":
            return ([(c, b.div(e, v)) for c, e in du]
                    + [(c, b.neg(b.div(b.mul(u, e), b.power(v, b.scalar(2))))) for c, e in dv])
        if op == "pow":
            if dv:
                raise SymbolicError("a power whose exponent depends on a tensor is not derived in index notation")
            if isinstance(v, t.Scalar):
                factor = b.mul(v, b.power(u, b.scalar(v.value - 1)))
            else:
                factor = b.mul(v, b.power(u, b.sub(v, b.scalar(1))))
            return [(c, b.mul(factor, e)) for c, e in du]
        raise SymbolicError(f"cannot differentiate {op} in index notation")


def index_adjoint(node: t.IndexDef, g: t.Node, spec: t.TypedSpec, reserved: set[str],
                  unary_rules: dict[str, tuple[str, Callable]]):
    """[(Tensor X, grad(X) contribution as IndexDef, rule)] for each tensor the body reads."""
    if not isinstance(g, t.Grad):
        raise SymbolicError("index notation is differentiated only as the definition of a named tensor")
    lhs = [i for i in node.indices]
    used = _index_names(node.body) | {i.name for i in lhs} | set(reserved)
    out = []
    for name in t.tensors_read(node.body):
        if not spec.tensors[name].has_gradient:  # a buffer: never differentiated
            continue
        shape = spec.tensors[name].shape
        targets = _fresh(len(shape), used)
        terms = _Differentiator(name, targets, unary_rules).d(node.body)
        total = None
        for deltas, expr in terms:
            stray = [k for k in deltas if k not in {i.name for i in lhs}]
            if stray:
                raise SymbolicError(f"index {stray[0]} of {name} is not bound where it is read")
            upstream = t.Entry(g.name, tuple(deltas.get(i.name, i.name) for i in lhs), grad=True)
            term = b.mul(upstream, rename_indices(expr, deltas))
            for index in reversed(lhs):
                if index.name not in deltas:
                    term = t.IndexSum(index, term)
            total = b.add(total, term)
        if total is None:
            continue
        contribution = t.IndexDef(tuple(t.Index(n, d) for n, d in zip(targets, shape)), total, shape)
        out.append((t.Tensor(name, shape), contribution,
                    f"{g.name}[...] = f({name}[...]): differentiate the entry formula"))
    return out
