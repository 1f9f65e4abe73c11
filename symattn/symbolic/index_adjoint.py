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
from ..ir.integers import names as subscript_names, renamed as renamed_subscript
from ..ir.functions import FUNCTIONS, OPERATIONS
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


@dataclass(frozen=True)
class Term:
    """One term of a derivative by X[targets]: `expr` times the deltas of the read it comes from.

    A read of distinct index names carries `deltas` (read index -> target index), eliminated
    as the sums close; any other read keeps its subscripts `at` (None for the first kind)
    and the sum indices they use, `lifted` out of their sums, and becomes a scatter. `expr` is
    None where it is the bare delta, d X[l, m] / d X[l, m] = 1: the chain and product rules then
    write v, not 1 * v, so no redundant node is built and no `1 * A = A` step recorded.
    """

    deltas: dict[str, str]
    expr: t.Node | None
    at: tuple | None = None
    lifted: tuple[t.Index, ...] = field(default=())

    def but(self, expr: t.Node | None) -> "Term":
        return replace(self, expr=expr)


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
def _(node: t.Logical, mapping):
    return t.Logical(node.op, tuple(rename_indices(a, mapping) for a in node.args), ())


@rename_indices.register
def _(node: t.Apply, mapping):
    return t.Apply(node.fn, tuple(rename_indices(a, mapping) for a in node.args), ())


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
            plain = all(isinstance(i, str) for i in node.indices) and len(set(node.indices)) == len(node.indices)
            if not plain:  # computed subscripts or a repeated index: a scatter
                return [Term({}, None, at=tuple(node.indices))]
            return [Term(dict(zip(node.indices, self.targets)), None)]
        if isinstance(node, t.Tensor):  # a scalar tensor read whole, as in `w * (j - i)`
            return [Term({}, None)] if node.name == self.tensor else []
        if isinstance(node, (t.Scalar, t.DimValue, t.IndexVar)):
            return []
        if isinstance(node, t.Unary):
            if node.fn in FUNCTIONS and FUNCTIONS[node.fn].steps:  # floor, ceil: derivative 0
                return []
            _, make = self.unary_rules[node.fn]
            # f'(u) read off the function's adjoint at G = 1: the `1 * A` that reading makes is
            # how the table is read, not a step of the derivation, so it is recorded nowhere.
            factor = make(node.x, node, b.scalar(1), None)
            return [c.but(_times(factor, c.expr, self.rec)) for c in self.d(node.x)]
        if isinstance(node, t.Binary):
            return self._binary(node)
        if isinstance(node, t.Apply):
            # each operand's factor read off the operation's adjoint at G = 1 (min's 1, 1/2 or 0)
            factors = OPERATIONS[node.fn].partials(node.args, node, b.scalar(1), None)
            return [c.but(_times(factor, c.expr, self.rec)) for arg, factor in zip(node.args, factors)
                    if factor is not None for c in self.d(arg)]
        if isinstance(node, (t.Compare, t.Logical)):
            return []
        if isinstance(node, t.Where):
            zero = b.scalar(0)
            return ([c.but(b.where(node.cond, _unit(c.expr), zero)) for c in self.d(node.a)]
                    + [c.but(b.where(node.cond, zero, _unit(c.expr))) for c in self.d(node.b)])
        if isinstance(node, t.IndexSum):
            out: list[Term] = []
            name = node.index.name
            for term in self.d(node.body):
                if term.at is not None and any(name in subscript_names(s) for s in term.at):
                    out.append(replace(term, lifted=(node.index, *term.lifted)))  # summed by the scatter
                elif name in term.deltas:
                    deltas = dict(term.deltas)
                    target = deltas.pop(name)
                    expr = None if term.expr is None else rename_indices(term.expr, {name: target})
                    out.append(Term(deltas, expr))  # the sum collapses
                else:
                    out.append(term.but(t.IndexSum(node.index, _unit(term.expr))))
            return out
        raise SymbolicError(f"cannot differentiate {type(node).__name__} in index notation")

    def _binary(self, node: t.Binary) -> list[Term]:
        u, v, op, r = node.a, node.b, node.op, self.rec
        du, dv = self.d(u), self.d(v)
        if op == "add":
            return du + dv
        if op == "sub":
            return du + [c.but(b.scalar(-1) if c.expr is None else b.neg(c.expr, r)) for c in dv]
        if op == "mul":
            return [c.but(_times(v, c.expr, r, left=True)) for c in du] + [c.but(_times(u, c.expr, r)) for c in dv]
        if op == "div":
            return ([c.but(b.div(_unit(c.expr), v, r)) for c in du]
                    + [c.but(b.neg(b.div(_times(u, c.expr, r), b.power(v, b.scalar(2), r), r), r)) for c in dv])
        if op == "pow":
            if dv:
                raise SymbolicError("a power whose exponent depends on a tensor is not derived in index notation")
            if isinstance(v, t.Scalar):
                factor = b.mul(v, b.power(u, b.scalar(v.value - 1), r), r)
            else:
                factor = b.mul(v, b.power(u, b.sub(v, b.scalar(1), r), r), r)
            return [c.but(_times(factor, c.expr, r)) for c in du]
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
        # which kinds of terms there are (plain reads, and scatters by what they read), unrecorded
        terms = _Differentiator(name, targets, unary_rules, None).d(node.body)
        scatters = list(dict.fromkeys((term.at, term.lifted) for term in terms if term.at is not None))
        if any(term.at is None for term in terms) or not scatters:
            parts.append(Part(tensor, f"{g.name}[...] = f({name}[...]): differentiate the entry formula",
                              lambda rec, x=tensor, targets=targets: _gradient(node, g, x, targets, unary_rules,
                                                                               rec)))
        for key in scatters:
            read = ", ".join(map(str, key[0]))
            parts.append(Part(tensor, f"{g.name}[...] = f({name}[{read}]): each entry read gets its share, "
                              "scattered back", lambda rec, x=tensor, targets=targets, key=key:
                              _scatter(node, g, x, targets, unary_rules, rec, key)))
    return parts


def _gradient(node: t.IndexDef, g: t.Grad, x: t.Tensor, targets: list[str],
              unary_rules: dict[str, tuple[str, Callable]], rec: b.Recorder | None) -> t.IndexDef | None:
    """grad(x)[targets] through `node` with upstream `g` from x's plain reads, as index notation; None when
    it is zero."""
    lhs = {i.name for i in node.indices}
    total = None
    for term in _Differentiator(x.name, targets, unary_rules, rec).d(node.body):
        if term.at is not None:
            continue
        deltas, expr = term.deltas, term.expr
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


def _scatter(node: t.IndexDef, g: t.Grad, x: t.Tensor, targets: list[str],
             unary_rules: dict[str, tuple[str, Callable]], rec: b.Recorder | None, key: tuple) -> t.Scatter:
    """grad(x) from the reads of x at the subscripts `key` names (with the sums lifted out of them):
    every point of the index box adds its term at the entry it read."""
    at, lifted = key
    exprs = [term.expr for term in _Differentiator(x.name, targets, unary_rules, rec).d(node.body)
             if term.at is not None and (term.at, term.lifted) == key]
    total = None
    for expr in exprs:
        total = b.add(total, _unit(expr), rec)
    box = (*node.indices, *lifted)
    upstream = t.Entry(g.name, tuple(i.name for i in node.indices), grad=True)
    body = upstream if exprs == [None] else b.mul(upstream, total, rec)
    values = t.IndexDef(box, body, tuple(i.range for i in box))
    return t.Scatter(values, at, x.shape)
