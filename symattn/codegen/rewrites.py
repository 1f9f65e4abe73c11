"""Rewrites of the program: identities that hold for all sizes and make it cheaper.

Contract: `Rewriter(spec, derivation).rewrite(node)` applies the rules in
`REWRITES` bottom up: a chain of matrix products in its cheapest order (at the
spec's default sizes; exact for all), the softmax backward recognised as one
`SoftmaxGrad` (in an attention core with the cheaper row sum
`sum(grad(O) * O)`), a scalar factor of a matrix product applied to its
smallest operand.
"""

from __future__ import annotations

import sympy

from ..ir import typed as t
from ..symbolic.derive import Derivation
from .program_ir import SoftmaxGrad, Var, rebuild, spec_text

__all__ = ["Rewriter", "REWRITES"]


def _softmax_grad(node: t.Node, rw: "Rewriter") -> t.Node | None:
    """`P * (G - sum(G * P, axis))` is the softmax backward; an attention core gets the cheaper row sum.

    When G = grad(T) @ B.T and T = P @ B (P the softmax, O = P @ V in attention),
    sum(G * P, -1) = sum(grad(T) * T, -1): an [N, d] product instead of an [N, N] one.
    """
    if not (isinstance(node, t.Binary) and node.op == "mul"):
        return None
    p, inner = node.a, node.b
    if not (isinstance(inner, t.Binary) and inner.op == "sub"):
        return None
    g, red = inner.a, inner.b
    if not (isinstance(red, t.Reduce) and red.kind == "sum" and red.axis is not None
            and red.x in (t.Binary("mul", g, p, red.x.shape), t.Binary("mul", p, g, red.x.shape))):
        return None
    if not rw.is_softmax(p) or rw.softmax_axis(p) != red.axis:
        return None
    rowdot, note = red, ""
    core = rw.attention_core(p, g, red.axis)
    if core is not None:
        rowdot, note = core
    return SoftmaxGrad(p, g, rowdot, red.axis, node.shape, original=red, note=note)


def _scale_smallest(node: t.Node, rw: "Rewriter") -> t.Node | None:
    """`(A @ B) / c` for a scalar c: divide whichever of A, B, A @ B has the fewest entries.

    Sizes are unknown until run time; the spec's default sizes stand in for them
    (ties keep the scalar on the product, where it can be applied in place).
    """
    if not (isinstance(node, t.Binary) and node.op in ("mul", "div") and isinstance(node.a, t.MatMul)
            and node.b.shape == () and rw.is_constant(node.b)):
        return None
    mm = node.a
    costs = {"out": rw.entries(mm.shape), "a": rw.entries(mm.a.shape), "b": rw.entries(mm.b.shape)}
    side = min(("out", "a", "b"), key=lambda k: (costs[k], k != "out"))
    if side == "out":
        return None
    if side == "a":
        return t.MatMul(t.Binary(node.op, mm.a, node.b, mm.a.shape), mm.b, mm.shape)
    return t.MatMul(mm.a, t.Binary(node.op, mm.b, node.b, mm.b.shape), mm.shape)


def _reassociate(node: t.Node, rw: "Rewriter") -> t.Node | None:
    """A chain of matrix products in the cheapest order: `Q @ K.T @ V` as `Q @ (K.T @ V)` when N > d.

    Products are associative; the order that needs the fewest multiplications at
    the spec's default sizes is chosen (the textbook dynamic programme). Only
    chains of matrices (rank 2) are reordered; a tie keeps the order written.
    """
    if not isinstance(node, t.MatMul) or not (isinstance(node.a, t.MatMul) or isinstance(node.b, t.MatMul)):
        return None

    def operands(n: t.Node) -> list[t.Node]:
        if isinstance(n, t.MatMul) and len(n.a.shape) == len(n.b.shape) == 2:
            return operands(n.a) + operands(n.b)
        return [n]

    chain = operands(node)
    if len(chain) < 3 or any(len(x.shape) != 2 for x in chain):
        return None
    dims = [chain[0].shape[0]] + [x.shape[1] for x in chain]
    size = [rw.entries((d,)) for d in dims]
    n = len(chain)
    best: dict[tuple[int, int], tuple[int, int]] = {(i, i): (0, -1) for i in range(n)}
    for span in range(1, n):
        for i in range(n - span):
            j = i + span
            best[i, j] = min((best[i, k][0] + best[k + 1, j][0] + size[i] * size[k + 1] * size[j + 1], k)
                             for k in range(i, j))

    def build(i: int, j: int) -> t.Node:
        if i == j:
            return chain[i]
        k = best[i, j][1]
        a, b = build(i, k), build(k + 1, j)
        return t.MatMul(a, b, (a.shape[0], b.shape[1]))

    def cost(n: t.Node) -> int:
        if not isinstance(n, t.MatMul) or n in chain:
            return 0
        return cost(n.a) + cost(n.b) + rw.entries(n.a.shape) * rw.entries((n.b.shape[1],))

    if best[0, n - 1][0] >= cost(node):
        return None
    return build(0, n - 1)


REWRITES = (_reassociate, _softmax_grad, _scale_smallest)


class Rewriter:
    def __init__(self, spec: t.TypedSpec, derivation: Derivation) -> None:
        self.spec = spec
        self.derivation = derivation
        self.forward_exprs: dict[str, t.Node] = {}  # filled in once the forward pass is rewritten
        self.subs = {info.symbol: spec.sizes[name] for name, info in spec.dims.items()}

    def entries(self, shape) -> int:
        size = 1
        for d in shape:
            size *= int(sympy.sympify(d).subs(self.subs))
        return size

    @staticmethod
    def is_constant(node: t.Node) -> bool:
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, (t.Tensor, t.Grad, t.Entry, t.IndexVar, Var)):
                return False
            stack.extend(n.children)
        return True

    def definition(self, node: t.Node) -> t.Node:
        if isinstance(node, t.Tensor) and node.name in self.forward_exprs:
            return self.forward_exprs[node.name]
        return node

    def is_softmax(self, p: t.Node) -> bool:
        return isinstance(self.definition(p), t.Softmax)

    def softmax_axis(self, p: t.Node) -> int:
        return self.definition(p).axis

    def gradient(self, g: t.Node) -> t.Node:
        if isinstance(g, t.Grad) and g.name in self.derivation.gradients and g.name not in self.spec.outputs:
            return self.derivation.gradients[g.name].expr or g
        return g

    def attention_core(self, p: t.Node, g: t.Node, axis: int):
        """(sum(grad(T) * T, axis), note) when g = grad(T) @ B.T and T = p @ B is computed by the forward pass."""
        if axis != len(p.shape) - 1:
            return None
        g_expr = self.gradient(g)
        if not (isinstance(g_expr, t.MatMul) and isinstance(g_expr.b, t.Transpose)):
            return None
        upstream, other = g_expr.a, g_expr.b.x
        if len(other.shape) < 2 or len(p.shape) < 2:
            return None
        for name, expr in self.forward_exprs.items():
            shape = self.spec.tensors[name].shape
            if isinstance(expr, t.MatMul) and expr.a in (p, self.definition(p)) and expr.b == other \
                    and upstream == t.Grad(name, shape):
                value = t.Tensor(name, shape)
                break
        else:
            forward_nodes = {n for e in self.forward_exprs.values() for n in t.walk(e)}
            candidates = [n for n in forward_nodes if isinstance(n, t.MatMul) and n.b == other
                          and n.a in (p, self.definition(p))]
            if not candidates or isinstance(upstream, t.Grad):
                return None
            value = candidates[0]
        product = t.Binary("mul", upstream, value, upstream.shape)
        shape = tuple(sympy.Integer(1) if k == axis else d for k, d in enumerate(upstream.shape))
        rowdot = t.Reduce("sum", product, axis, shape)
        dims = list(self.spec.dims)
        note = f"sum({spec_text(g, dims)} * {spec_text(p, dims)}, axis=-1) = {spec_text(rowdot, dims)}"
        if isinstance(value, t.Tensor):
            note += f" as {value.name} = {spec_text(p, dims)} @ {spec_text(other, dims)}"
        return rowdot, note

    def __call__(self, node: t.Node) -> t.Node:
        if isinstance(node, t.IndexDef):
            return node
        node = rebuild(node, self)
        for rule in REWRITES:
            new = rule(node, self)
            if new is not None:
                node = new
        return node
