"""Forward-mode derivation: `tangent(T)` of every tensor, with steps.

Contract: `tangents(spec, names)` returns, for every tensor of the spec in spec
order, a `Tangent` whose `expr` is the directional derivative of T along the
tangents of the inputs and params, written with the spec's own names and the
tangent tensors `names[X]` (a `typed.Tensor` of X's shape standing for
tangent(X)): `tangent(Q) = tangent_X @ W_q + X @ tangent_W_q`,
`tangent(P) = P * (tangent_S - sum(P * tangent_S, axis=-1))`. `expr` is None
where T depends on no input or param (a buffer, a constant, an integer): its
tangent is exactly 0, and a term that would multiply it is left out, never
written as `0 * A` (NaN where A is infinite: a mask's -inf entries have tangent
0, so `tangent(S + M) == tangent(S)`). Dims stay symbolic, so each formula holds
for all sizes.

The rules are the local derivatives the backward pass applies
(`symattn.ir.functions`: one `derivative` per elementwise function, which is
f'(A) times its third argument, and one `partials` per operation), applied to
the tangent instead of the upstream gradient; matrix products, reductions,
softmax, scans, slices and head reshapes have rules of their own here. Index
notation is differentiated entry by entry: `X[i, k]` becomes `tangent_X[i, k]`
at the same subscripts (a gather's tangent is the gather of the tangent), sums
stay sums. Where a function is not differentiable, the tangent is what its
formula gives (torch's conventions: a tie of min/max or of a max reduction
shares equally, clamp passes the tangent inside its bounds, floor and ceil
pass none). Every rule applied is a `Step(rule, tensor, before, after)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from typing import Collection, Mapping

from ..errors import SymbolicError
from ..ir import build as b
from ..ir import typed as t
from ..ir.functions import FUNCTIONS, OPERATIONS
from .derive import Step, UNARY_RULES

__all__ = ["Tangent", "tangents", "TANGENT_RULES"]


@dataclass(frozen=True)
class Tangent:
    """tangent(T) for one tensor: `expr` is None where it is exactly 0."""

    tensor: str
    expr: t.Node | None
    steps: tuple[Step, ...]


# The rule text documents print for each node kind (elementwise functions print their own `rule`).
TANGENT_RULES = {
    "add": "tangent(A + B) = tangent(A) + tangent(B)",
    "sub": "tangent(A - B) = tangent(A) - tangent(B)",
    "mul": "tangent(A * B) = tangent(A) * B + A * tangent(B)",
    "div": "tangent(A / B) = (tangent(A) - (A / B) * tangent(B)) / B",
    "pow": "tangent(A^B) = B * A^(B - 1) * tangent(A) + A^B * log(A) * tangent(B)",
    "matmul": "tangent(A @ B) = tangent(A) @ B + A @ tangent(B)",
    "transpose": "tangent(A.T) = tangent(A).T",
    "sum": "tangent(sum(A)) = sum(tangent(A))",
    "mean": "tangent(mean(A)) = mean(tangent(A))",
    "max": "tangent(max(A)) = sum(tangent(A) where A == C) / (the number of ties) (torch.amax's convention)",
    "min": "tangent(min(A)) = sum(tangent(A) where A == C) / (the number of ties) (torch.amin's convention)",
    "logsumexp": "tangent(logsumexp(A)) = sum(softmax(A) * tangent(A))",
    "softmax": "P = softmax(S): tangent(P) = P * (tangent(S) - sum(P * tangent(S)))",
    "scan": "tangent(cumsum(A)) = cumsum(tangent(A))",
    "where": "tangent(where(c, A, B)) = where(c, tangent(A), tangent(B))",
    "merge_heads": "tangent(merge_heads(A)) = merge_heads(tangent(A))",
    "split_heads": "tangent(split_heads(A, h)) = split_heads(tangent(A), h)",
    "concat": "tangent(concat(A, B)) = concat(tangent(A), tangent(B))",
    "slice": "tangent(A[start:stop]) = tangent(A)[start:stop]",
    "entry": "tangent(X[s]) = tangent(X)[s], at the same subscripts",
    "index_sum": "tangent(sum(k, e)) = sum(k, tangent(e))",
    "index": "tangent(T[i, ...] = e) = (tangent(T)[i, ...] = tangent(e))",
}


class _Context:
    def __init__(self, spec: t.TypedSpec, known: dict[str, t.Node | None], tensor: str) -> None:
        self.spec = spec
        self.known = known      # tensor -> its tangent tensor (a typed.Tensor), None where it is 0
        self.tensor = tensor    # whose tangent is being built (for the steps)
        self.steps: list[Step] = []
        self.names = {info.expr: t.Tensor(name, info.shape) for name, info in spec.tensors.items()
                      if info.expr is not None and not isinstance(info.expr, t.IndexDef)}

    def ref(self, node: t.Node) -> t.Node:
        """A node, or the name of the tensor it defines (so P is written P, not softmax(S))."""
        return self.names.get(node, node)

    def note(self, rule: str, before: t.Node, after: t.Node | None, rec: b.Recorder | None = None) -> t.Node | None:
        if after is not None:
            self.steps.append(Step(rule, self.tensor, before, after))
            if rec is not None:
                self.steps.extend(Step(f"simplify: {s.rule}", self.tensor, s.before, s.after) for s in rec.steps)
        return after


def _fit(x: t.Node | None, shape) -> t.Node | None:
    """A tangent broadcast up to the shape of the value it is the tangent of."""
    return None if x is None else b.expand_to(x, shape)


def _zero_or(x: t.Node | None, shape) -> t.Node:
    return b.zeros(shape) if x is None else x


@singledispatch
def _d(node, cx: _Context) -> t.Node | None:
    raise SymbolicError(f"no forward-mode rule for {type(node).__name__}")


@_d.register(t.Scalar)
@_d.register(t.DimValue)
@_d.register(t.Constant)
@_d.register(t.IndexVar)
@_d.register(t.Compare)
@_d.register(t.Logical)
def _(node, cx):
    return None


@_d.register
def _(node: t.Tensor, cx):
    if node.name not in cx.known:
        raise SymbolicError(f"tangent({node.name}) is needed before it is derived")
    return cx.known[node.name]


@_d.register
def _(node: t.Entry, cx):
    if node.grad:
        raise SymbolicError(f"an entry of grad({node.tensor}) has no tangent in a forward definition")
    tangent = cx.known.get(node.tensor)
    if tangent is None:
        return None
    return cx.note(TANGENT_RULES["entry"], node, t.Entry(tangent.name, node.indices, node.shape))


@_d.register
def _(node: t.Unary, cx):
    dx = _d(node.x, cx)
    if dx is None or (node.fn in FUNCTIONS and FUNCTIONS[node.fn].steps):
        return None
    rule, make = UNARY_RULES[node.fn]
    rec = b.Recorder()
    return cx.note(f"tangent: {rule}", node, make(node.x, cx.ref(node), dx, rec), rec)


@_d.register
def _(node: t.Binary, cx):
    x, y = node.a, node.b
    dx, dy = _d(x, cx), _d(y, cx)
    if dx is None and dy is None:
        return None
    rec = b.Recorder()
    if node.op == "add":
        out = b.add(dx, dy, rec)
    elif node.op == "sub":
        out = b.sub(dx, dy, rec) if dx is not None else b.neg(dy, rec)
    elif node.op == "mul":
        out = b.add(None if dx is None else b.mul(dx, y, rec), None if dy is None else b.mul(x, dy, rec), rec)
    elif node.op == "div":
        if dy is None:
            out = b.div(dx, y, rec)
        else:
            moved = b.mul(cx.ref(node), dy, rec)
            out = b.div(b.sub(dx, moved, rec) if dx is not None else b.neg(moved, rec), y, rec)
    elif node.op == "pow":
        out = None
        if dx is not None and not (isinstance(y, t.Scalar) and y.value == 0):
            exponent = b.scalar(y.value - 1) if isinstance(y, t.Scalar) else b.sub(y, b.scalar(1), rec)
            out = b.mul(b.mul(y, b.power(x, exponent, rec), rec), dx, rec)
        if dy is not None:
            out = b.add(out, b.mul(b.mul(cx.ref(node), b.unary("log", x), rec), dy, rec), rec)
    else:
        raise SymbolicError(f"no forward-mode rule for the elementwise operation {node.op}")
    return cx.note(TANGENT_RULES[node.op], node, _fit(out, node.shape), rec)


@_d.register
def _(node: t.Apply, cx):
    record = OPERATIONS[node.fn]
    if record.integer:
        return None
    out, rec = None, b.Recorder()
    for k, arg in enumerate(node.args):
        darg = _d(arg, cx)
        if darg is None:
            continue
        partial = record.partials(node.args, cx.ref(node), darg, rec)[k]
        if partial is None:
            raise SymbolicError(f"{node.fn}: its operand {k + 1} reads an input or param but has no derivative")
        out = b.add(out, partial, rec)
    return cx.note(f"tangent: {record.rules[0]}", node, _fit(out, node.shape), rec)


@_d.register
def _(node: t.MatMul, cx):
    dx, dy = _d(node.a, cx), _d(node.b, cx)
    if dx is None and dy is None:
        return None
    rec = b.Recorder()
    out = b.add(None if dx is None else b.matmul(dx, node.b, rec),
                None if dy is None else b.matmul(node.a, dy, rec), rec)
    return cx.note(TANGENT_RULES["matmul"], node, out, rec)


@_d.register
def _(node: t.Transpose, cx):
    dx = _d(node.x, cx)
    rec = b.Recorder()
    return None if dx is None else cx.note(TANGENT_RULES["transpose"], node, b.transpose(dx, rec), rec)


@_d.register
def _(node: t.Reduce, cx):
    x = node.x
    dx = _d(x, cx)
    if dx is None:
        return None
    dx = _fit(dx, x.shape)
    rec = b.Recorder()
    if node.kind in ("sum", "mean"):
        out = t.Reduce(node.kind, dx, node.axis, node.shape)
    elif node.kind in ("max", "min"):
        hit = b.compare("==", x, cx.ref(node))
        ties = b.reduce_sum(b.where(hit, b.scalar(1), b.scalar(0)), node.axis)
        out = b.div(b.reduce_sum(b.where(hit, dx, b.scalar(0)), node.axis), ties, rec)
    elif node.kind == "logsumexp":
        weights = b.unary("exp", b.sub(x, cx.ref(node), rec)) if node.axis is None else cx.ref(b.softmax(x, node.axis))
        out = b.reduce_sum(b.mul(weights, dx, rec), node.axis)
    else:
        raise SymbolicError(f"no forward-mode rule for the reduction {node.kind}")
    return cx.note(TANGENT_RULES[node.kind], node, out, rec)


@_d.register
def _(node: t.Scan, cx):
    dx = _d(node.x, cx)
    if dx is None:
        return None
    return cx.note(TANGENT_RULES["scan"], node, t.Scan(_fit(dx, node.x.shape), node.axis, node.reverse, node.shape))


@_d.register
def _(node: t.Softmax, cx):
    dx = _d(node.x, cx)
    if dx is None:
        return None
    dx = _fit(dx, node.x.shape)
    p, rec = cx.ref(node), b.Recorder()
    out = b.mul(p, b.sub(dx, b.reduce_sum(b.mul(p, dx, rec), node.axis), rec), rec)
    return cx.note(TANGENT_RULES["softmax"], node, out, rec)


@_d.register
def _(node: t.Where, cx):
    da, db = _d(node.a, cx), _d(node.b, cx)
    if da is None and db is None:
        return None
    out = b.where(node.cond, _zero_or(da, ()), _zero_or(db, ()))
    return cx.note(TANGENT_RULES["where"], node, _fit(out, node.shape))


@_d.register
def _(node: t.MergeHeads, cx):
    dx = _d(node.x, cx)
    return None if dx is None else cx.note(TANGENT_RULES["merge_heads"], node,
                                           t.MergeHeads(_fit(dx, node.x.shape), node.shape))


@_d.register
def _(node: t.SplitHeads, cx):
    dx = _d(node.x, cx)
    return None if dx is None else cx.note(TANGENT_RULES["split_heads"], node,
                                           t.SplitHeads(_fit(dx, node.x.shape), node.heads, node.shape))


@_d.register
def _(node: t.Concat, cx):
    parts = [_d(p, cx) for p in node.parts]
    if all(p is None for p in parts):
        return None
    out = t.Concat(tuple(_fit(d, p.shape) if d is not None else b.zeros(p.shape) for d, p in zip(parts, node.parts)),
                   node.axis, node.shape)
    return cx.note(TANGENT_RULES["concat"], node, out)


@_d.register
def _(node: t.Slice, cx):
    dx = _d(node.x, cx)
    if dx is None:
        return None
    return cx.note(TANGENT_RULES["slice"], node,
                   t.Slice(_fit(dx, node.x.shape), node.axis, node.start, node.stop, node.shape))


@_d.register
def _(node: t.IndexSum, cx):
    body = _d(node.body, cx)
    return None if body is None else cx.note(TANGENT_RULES["index_sum"], node, t.IndexSum(node.index, body, node.shape))


@_d.register
def _(node: t.IndexDef, cx):
    body = _d(node.body, cx)
    return None if body is None else cx.note(TANGENT_RULES["index"], node,
                                             t.IndexDef(node.indices, body, node.shape))


def tangents(spec: t.TypedSpec, names: Mapping[str, str], fixed: Collection[str] = ()) -> dict[str, Tangent]:
    """tangent(T) of every tensor, in spec order; `names[X]` names the tangent tensor of every
    input, param and defined tensor that has one (see the module docstring). The inputs in `fixed`
    have tangent 0, as buffers do."""
    known: dict[str, t.Node | None] = {}
    out: dict[str, Tangent] = {}
    for name, info in spec.tensors.items():
        cx = _Context(spec, known, name)
        if info.kind in ("input", "param") and name not in fixed:
            expr = None
            known[name] = t.Tensor(names[name], info.shape)
        elif info.expr is None:  # a buffer: a constant of the forward pass
            expr = None
            known[name] = None
        else:
            expr = _d(info.expr, cx)
            if expr is not None and not isinstance(expr, t.IndexDef):
                expr = _fit(expr, info.shape)
            known[name] = None if expr is None else t.Tensor(names[name], info.shape)
        out[name] = Tangent(name, expr, tuple(cx.steps))
    return out
