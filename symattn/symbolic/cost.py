"""Cost of a spec as polynomials in its dims: FLOPs, memory, sequential depth.

Contract: `spec_cost(spec, derivation)` returns a `Cost` with SymPy
polynomials in the dim symbols for forward and backward FLOPs (a multiply-add
is 2 FLOPs; an elementwise operation, comparison or transcendental 1 per
entry; softmax 5 per entry: max, subtract, exp, sum, divide) and for the
floats held (activations of the forward, gradients of the backward), each
shared subexpression counted once, plus the critical path: the longest chain
of dependent operations, which does not grow with the sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir import typed as t
from .derive import Derivation

__all__ = ["Cost", "spec_cost", "flops"]


def _numel(shape) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def _body_flops(node: t.Node) -> sympy.Expr:
    """FLOPs of one entry of an index-notation body."""
    if isinstance(node, t.IndexSum):
        return node.index.range * (_body_flops(node.body) + 1)
    own = 1 if isinstance(node, (t.Unary, t.Binary, t.Compare, t.Where)) else 0
    return own + sum((_body_flops(c) for c in node.children), sympy.Integer(0))


def _own_flops(node: t.Node) -> sympy.Expr:
    if node.shape == () and not isinstance(node, t.IndexDef):
        return sympy.Integer(0)  # a scalar such as sqrt(d_k), computed once
    if isinstance(node, t.MatMul):
        return 2 * _numel(node.shape) * node.a.shape[-1]
    if isinstance(node, (t.Unary, t.Binary, t.Compare, t.Where)):
        return _numel(node.shape)
    if isinstance(node, t.Softmax):
        return 5 * _numel(node.shape)
    if isinstance(node, t.Reduce):
        return (4 if node.kind == "logsumexp" else 1) * _numel(node.x.shape)
    if isinstance(node, (t.SumTo, t.Scan)):
        return _numel(node.x.shape)
    if isinstance(node, t.IndexDef):
        return _numel(node.shape) * _body_flops(node.body)
    if isinstance(node, t.Scatter):  # one addition per point of the index box
        return _numel(node.x.shape)
    return sympy.Integer(0)


def flops(roots) -> sympy.Expr:
    """FLOPs to evaluate all `roots`, each distinct subexpression once."""
    seen: set = set()
    total = sympy.Integer(0)
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        total += _own_flops(node)
        if not isinstance(node, t.IndexDef):
            stack.extend(node.children)
    return sympy.expand(total)


def _depth(node: t.Node, memo: dict, spec: t.TypedSpec) -> int:
    if node in memo:
        return memo[node]
    if isinstance(node, t.Tensor):
        info = spec.tensors[node.name]
        value = 0 if info.expr is None else _depth(info.expr, memo, spec)
    else:
        value = max((_depth(c, memo, spec) for c in node.children), default=0)
        if _own_flops(node) != 0:
            value += 1
    memo[node] = value
    return value


@dataclass(frozen=True)
class Cost:
    forward_flops: sympy.Expr
    backward_flops: sympy.Expr
    activations: sympy.Expr     # floats of every intermediate the forward holds
    gradients: sympy.Expr       # floats of every gradient the backward holds
    quadratic: sympy.Expr       # floats of the intermediates whose size grows with two token axes
    depth: int                  # longest chain of dependent operations (forward)
    recompute: sympy.Expr = sympy.Integer(0)  # FLOPs of the N x N work a fused kernel redoes in the backward


def spec_cost(spec: t.TypedSpec, derivation: Derivation) -> Cost:
    forward = flops([i.expr for i in spec.tensors.values() if i.expr is not None])
    backward = flops([g.expr for g in derivation.gradients.values() if g.expr is not None])
    activations = sympy.expand(sum((_numel(i.shape) for i in spec.tensors.values() if i.expr is not None),
                                   sympy.Integer(0)))
    grads = sympy.expand(sum((_numel(i.shape) for n, i in spec.tensors.items()
                              if derivation.gradients.get(n) and derivation.gradients[n].expr is not None),
                             sympy.Integer(0)))
    square = sympy.Integer(0)
    recompute = sympy.Integer(0)
    for info in spec.tensors.values():
        if info.expr is not None and _quadratic(info.shape):
            square += _numel(info.shape)
    seen: set = set()
    stack = [i.expr for i in spec.tensors.values() if i.expr is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if _quadratic(node.shape):
            recompute += _own_flops(node)
        if not isinstance(node, t.IndexDef):
            stack.extend(node.children)
    memo: dict = {}
    depth = max((_depth(t.Tensor(o, spec.tensors[o].shape), memo, spec) for o in spec.outputs), default=0)
    return Cost(forward, backward, activations, grads, sympy.expand(square), depth, sympy.expand(recompute))


def _quadratic(shape) -> bool:
    """Two trailing axes of the same token dim: the N x N (or M x M) attention matrices."""
    return len(shape) >= 2 and shape[-1] == shape[-2] and getattr(shape[-1], "is_Symbol", False)
