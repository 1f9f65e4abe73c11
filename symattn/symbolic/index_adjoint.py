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

A read at computed subscripts (`b[j - i + N - 1]`, `Q[i, 2 * c + 1]`) or
with a repeated index (`X[i, i]`) has no such elimination: its terms keep
the subscripts, the sums over indices they use are lifted out, and the
contribution is a `Scatter`: every point (i, j) of T's index box (with the
lifted sums) adds grad(T)[i, j] * d body / d b[...] to grad(b) at the entry
it read, grad(b)[t] = sum over (i, j) with j - i + N - 1 == t of grad(B)[i, j].
Terms that read the same entry are added into one scatter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import singledispatch
from typing import Callable

from ..ir import build as b
from ..ir import typed as t
from ..ir.affine import names as subscript_names, renamed as renamed_subscript
from ..errors import SymbolicError

__all__ = ["index_adjoint", "rename_indices"]

_FRESH = ("l", "m", "n", "p", "q", "r", "s", "u", "v", "a", "b", "e", "f", "g", "i", "j", "k")


@dataclass(frozen=True)
class Term:
    """One term of a derivative by X[targets]: `expr` times the deltas of the read it comes from.

    A read of distinct index names carries `deltas` (read index -> target index), eliminated
    as the sums close; any other read keeps its subscripts `at` (None for the first kind)
    and the sum indices they use, `lifted` out of their sums, and becomes a scatter.
    """

    deltas: dict[str, str]
    expr: t.Node
    at: tuple | None = None
    lifted: tuple[t.Index, ...] = field(default=())

    def but(self, expr: t.Node) -> "Term":
        return replace(self, expr=expr)


def _index_names(node: t.Node) -> set[str]:
    names: set[str] = set()
    for n in t.walk(node):
        if isinstance(n, t.IndexVar):
            names.add(n.name)
        elif isinstance(n, t.Entry):
            names.update(t.entry_names(n))
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
    return t.Entry(node.tensor, tuple(renamed_subscript(i, mapping) for i in node.indices), grad=node.grad)


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
            plain = all(isinstance(i, str) for i in node.indices) and len(set(node.indices)) == len(node.indices)
            if not plain:  # computed subscripts or a repeated index: a scatter
                return [Term({}, b.scalar(1), at=tuple(node.indices))]
            return [Term(dict(zip(node.indices, self.targets)), b.scalar(1))]
        if isinstance(node, t.Tensor):  # a scalar tensor read whole, as in `w * (j - i)`
            return [Term({}, b.scalar(1))] if node.name == self.tensor else []
        if isinstance(node, (t.Scalar, t.DimValue, t.IndexVar)):
            return []
        if isinstance(node, t.Unary):
            _, make = self.unary_rules[node.fn]
            factor = make(node.x, node, b.scalar(1), self.rec)
            return [c.but(b.mul(factor, c.expr)) for c in self.d(node.x)]
        if isinstance(node, t.Binary):
            return self._binary(node)
        if isinstance(node, t.Where):
            zero = b.scalar(0)
            return ([c.but(b.where(node.cond, c.expr, zero)) for c in self.d(node.a)]
                    + [c.but(b.where(node.cond, zero, c.expr)) for c in self.d(node.b)])
        if isinstance(node, t.IndexSum):
            out: list[Term] = []
            name = node.index.name
            for term in self.d(node.body):
                if term.at is not None and any(name in subscript_names(s) for s in term.at):
                    out.append(replace(term, lifted=(node.index, *term.lifted)))  # summed by the scatter
                elif name in term.deltas:
                    deltas = dict(term.deltas)
                    target = deltas.pop(name)
                    out.append(Term(deltas, rename_indices(term.expr, {name: target})))  # the sum collapses
                else:
                    out.append(term.but(t.IndexSum(node.index, term.expr)))
            return out
        raise SymbolicError(f"cannot differentiate {type(node).__name__} in index notation")

    def _binary(self, node: t.Binary) -> list[Term]:
        u, v, op = node.a, node.b, node.op
        du, dv = self.d(u), self.d(v)
        if op == "add":
            return du + dv
        if op == "sub":
            return du + [c.but(b.neg(c.expr)) for c in dv]
        if op == "mul":
            return [c.but(b.mul(c.expr, v)) for c in du] + [c.but(b.mul(u, c.expr)) for c in dv]
        if op == "div":
            return ([c.but(b.div(c.expr, v)) for c in du]
                    + [c.but(b.neg(b.div(b.mul(u, c.expr), b.power(v, b.scalar(2))))) for c in dv])
        if op == "pow":
            if dv:
                raise SymbolicError("a power whose exponent depends on a tensor is not derived in index notation")
            if isinstance(v, t.Scalar):
                factor = b.mul(v, b.power(u, b.scalar(v.value - 1)))
            else:
                factor = b.mul(v, b.power(u, b.sub(v, b.scalar(1))))
            return [c.but(b.mul(factor, c.expr)) for c in du]
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
        shape = spec.tensors[name].shape
        targets = _fresh(len(shape), used)
        terms = _Differentiator(name, targets, unary_rules).d(node.body)
        total = None
        scattered: dict[tuple, t.Node] = {}  # (subscripts read, lifted sums) -> their summed terms
        for term in terms:
            if term.at is not None:
                key = (term.at, term.lifted)
                scattered[key] = b.add(scattered.get(key), term.expr)
                continue
            deltas, expr = term.deltas, term.expr
            stray = [k for k in deltas if k not in {i.name for i in lhs}]
            if stray:
                raise SymbolicError(f"index {stray[0]} of {name} is not bound where it is read")
            upstream = t.Entry(g.name, tuple(deltas.get(i.name, i.name) for i in lhs), grad=True)
            term = b.mul(upstream, rename_indices(expr, deltas))
            for index in reversed(lhs):
                if index.name not in deltas:
                    term = t.IndexSum(index, term)
            total = b.add(total, term)
        if total is not None:
            contribution = t.IndexDef(tuple(t.Index(n, d) for n, d in zip(targets, shape)), total, shape)
            out.append((t.Tensor(name, shape), contribution,
                        f"{g.name}[...] = f({name}[...]): differentiate the entry formula"))
        for (at, lifted), expr in scattered.items():
            box = (*lhs, *lifted)
            upstream = t.Entry(g.name, tuple(i.name for i in lhs), grad=True)
            values = t.IndexDef(box, b.mul(upstream, expr), tuple(i.range for i in box))
            read = ", ".join(map(str, at))
            out.append((t.Tensor(name, shape), t.Scatter(values, at, shape),
                        f"{g.name}[...] = f({name}[{read}]): each entry read gets its share, scattered back"))
    return out
