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

from dataclasses import dataclass
from functools import singledispatch
from typing import Callable

from ..ir import build as b
from ..ir import typed as t
from ..errors import SymbolicError

__all__ = ["Part", "index_adjoint", "rename_indices"]

_FRESH = ("l", "m", "n", "p", "q", "r", "s", "u", "v", "a", "b", "e", "f", "g", "i", "j", "k")

@dataclass(frozen=True)
class Part:
    """One contribution an adjoint rule sends to an operand: `child` gets `build(recorder)`.

    The contribution is built only when the caller (`derive`) calls `build` with a recorder of
    its own, so the simplifications made while building it are recorded for it and for nothing
    else. `build` returns None when the operand gets nothing after all (index notation that
    reads a tensor only where its derivative vanishes).
    """

    child: t.Node
    rule: str
    build: Callable[[b.Recorder], t.Node | None]


# A term of a derivative: index -> target index constraints (deltas), and the expression. The
# expression is None where it is the bare delta, d X[l, m] / d X[l, m] = 1: the chain and product
# rules then write v, not 1 * v, so no redundant node is built and no `1 * A = A` step recorded.
Term = tuple[dict[str, str], t.Node | None]


def _unit(e: t.Node | None) -> t.Node:
    """The expression of a term, with the bare delta written as the number 1."""
    return b.scalar(1) if e is None else e


def _times(a: t.Node, e: t.Node | None, rec: b.Recorder | None, left: bool = False) -> t.Node:
    """a * e (e * a when `left`), where e = None is the bare delta: then just a."""
    if e is None:
        return a
    return b.mul(e, a, rec) if left else b.mul(a, e, rec)


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

    def __init__(self, tensor: str, targets: list[str], unary_rules: dict[str, tuple[str, Callable]],
                 rec: b.Recorder | None) -> None:
        self.tensor = tensor
        self.targets = targets
        self.unary_rules = unary_rules
        self.rec = rec

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
            return [(deltas, None)]
        if isinstance(node, t.Tensor):  # a scalar tensor read whole, as in `w * (j - i)`
            return [({}, None)] if node.name == self.tensor else []
        if isinstance(node, (t.Scalar, t.DimValue, t.IndexVar)):
            return []
        if isinstance(node, t.Unary):
            _, make = self.unary_rules[node.fn]
            # f'(u) read off the function's adjoint at G = 1: the `1 * A` that reading makes is
            # how the table is read, not a step of the derivation, so it is recorded nowhere.
            factor = make(node.x, node, b.scalar(1), None)
            return [(c, _times(factor, e, self.rec)) for c, e in self.d(node.x)]
        if isinstance(node, t.Binary):
            return self._binary(node)
        if isinstance(node, t.Where):
            zero = b.scalar(0)
            return ([(c, b.where(node.cond, _unit(e), zero)) for c, e in self.d(node.a)]
                    + [(c, b.where(node.cond, zero, _unit(e))) for c, e in self.d(node.b)])
        if isinstance(node, t.IndexSum):
            out: list[Term] = []
            for deltas, expr in self.d(node.body):
                name = node.index.name
                if name in deltas:
                    deltas = dict(deltas)
                    target = deltas.pop(name)
                    out.append((deltas, None if expr is None else rename_indices(expr, {name: target})))  # collapses
                else:
                    out.append((deltas, t.IndexSum(node.index, _unit(expr))))
            return out
        raise SymbolicError(f"cannot differentiate {type(node).__name__} in index notation")

    def _binary(self, node: t.Binary) -> list[Term]:
        u, v, op, r = node.a, node.b, node.op, self.rec
        du, dv = self.d(u), self.d(v)
        if op == "add":
            return du + dv
        if op == "sub":
            return du + [(c, b.scalar(-1) if e is None else b.neg(e, r)) for c, e in dv]
        if op == "mul":
            return [(c, _times(v, e, r, left=True)) for c, e in du] + [(c, _times(u, e, r)) for c, e in dv]
        if op == "div":
            return ([(c, b.div(_unit(e), v, r)) for c, e in du]
                    + [(c, b.neg(b.div(_times(u, e, r), b.power(v, b.scalar(2), r), r), r)) for c, e in dv])
        if op == "pow":
            if dv:
                raise SymbolicError("a power whose exponent depends on a tensor is not derived in index notation")
            if isinstance(v, t.Scalar):
                factor = b.mul(v, b.power(u, b.scalar(v.value - 1), r), r)
            else:
                factor = b.mul(v, b.power(u, b.sub(v, b.scalar(1), r), r), r)
            return [(c, _times(factor, e, r)) for c, e in du]
        raise SymbolicError(f"cannot differentiate {op} in index notation")


def index_adjoint(node: t.IndexDef, g: t.Node, spec: t.TypedSpec, reserved: set[str],
                  unary_rules: dict[str, tuple[str, Callable]]) -> list[Part]:
    """A `Part` for each tensor X the body reads: grad(X) as index notation, built on demand."""
    if not isinstance(g, t.Grad):
        raise SymbolicError("index notation is differentiated only as the definition of a named tensor")
    used = _index_names(node.body) | {i.name for i in node.indices} | set(reserved)
    parts = []
    for name in t.tensors_read(node.body):
        if not spec.tensors[name].has_gradient:  # a buffer: never differentiated
            continue
        tensor = t.Tensor(name, spec.tensors[name].shape)
        targets = _fresh(len(tensor.shape), used)
        parts.append(Part(tensor, f"{g.name}[...] = f({name}[...]): differentiate the entry formula",
                          lambda rec, x=tensor, targets=targets: _gradient(node, g, x, targets, unary_rules, rec)))
    return parts


def _gradient(node: t.IndexDef, g: t.Grad, x: t.Tensor, targets: list[str],
              unary_rules: dict[str, tuple[str, Callable]], rec: b.Recorder | None) -> t.IndexDef | None:
    """grad(x)[targets] through `node` with upstream `g`, as index notation; None when it is zero."""
    lhs = {i.name for i in node.indices}
    total = None
    for deltas, expr in _Differentiator(x.name, targets, unary_rules, rec).d(node.body):
        stray = [k for k in deltas if k not in lhs]
        if stray:
            raise SymbolicError(f"index {stray[0]} of {x.name} is not bound where it is read")
        upstream = t.Entry(g.name, tuple(deltas.get(i.name, i.name) for i in node.indices), grad=True)
        term = upstream if expr is None else b.mul(upstream, rename_indices(expr, deltas), rec)
        for index in reversed(node.indices):
            if index.name not in deltas:
                term = t.IndexSum(index, term)
        total = b.add(total, term, rec)
    if total is None:
        return None
    return t.IndexDef(tuple(t.Index(n, d) for n, d in zip(targets, x.shape)), total, x.shape)
