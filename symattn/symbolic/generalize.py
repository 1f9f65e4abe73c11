"""Free tensors in place of polynomial intermediates: a stronger claim the element level can settle.

Contract: `generalized(spec)` is the spec with each *polynomial* intermediate
that a nonlinear definition reads made an input (its definition dropped), with
the names of those tensors, or None when there is none. A tensor is polynomial
when its definition uses only `+ - *`, `@`, transposes, slices, concats, sums,
means, numbers and dims on given tensors and other polynomial tensors (Q = X @
W_q, K, V): its entries are polynomials in the given entries, finite for
finite inputs.

Why: the element level compares values that may be NaN region by region, and
needs to tell where a divisor or a sqrt argument is 0 (`symattn.symbolic.signs`).
For `sum(Q * Q, axis=-1)` with Q an input that is "row i of Q is 0"; with
`Q = X @ W_q` it is the zero set of a sum of squares of bilinear forms, which
it cannot tell. A claim whose two sides read Q (and the gradients derived from
it) the same way, shown equal for every value of a free Q, holds in particular
for Q = X @ W_q: every point of the original domain is a point of the
generalized one (the free entries take the values X @ W_q has there). So a
proof of the generalized claim is a proof of the claim; a failure says nothing
(the claim may need Q = X @ W_q). Gradients are the derived formulas, as in the
element level's comparison, so grad(Q) is the same expression either way.
"""

from __future__ import annotations

import dataclasses

from ..ir import typed as t

__all__ = ["generalized", "polynomial"]

_LINEAR = (t.MatMul, t.Transpose, t.Slice, t.Concat, t.SumTo, t.MergeHeads, t.SplitHeads, t.Scan)


def polynomial(node: t.Node, poly: set[str]) -> bool:
    """Whether `node` is a polynomial of given tensors and of the tensors named in `poly`."""
    if isinstance(node, t.Tensor):
        return node.name in poly
    if isinstance(node, (t.Scalar, t.DimValue)):
        return node.value.is_finite is not False if isinstance(node, t.Scalar) else True
    if isinstance(node, t.Constant):
        return node.kind in ("ones", "eye")
    if isinstance(node, t.Unary):
        return node.fn == "neg" and polynomial(node.x, poly)
    if isinstance(node, t.Binary):
        return node.op in ("add", "sub", "mul") and polynomial(node.a, poly) and polynomial(node.b, poly)
    if isinstance(node, t.Reduce):
        return node.kind in ("sum", "mean") and polynomial(node.x, poly)
    if isinstance(node, _LINEAR):
        return all(polynomial(c, poly) for c in node.children)
    return False


def generalized(spec: t.TypedSpec) -> tuple[t.TypedSpec, tuple[str, ...]] | None:
    """(the spec with polynomial intermediates read by nonlinear definitions made inputs, their
    names), or None (see the module docstring)."""
    poly = set(spec.given)
    for name, info in spec.tensors.items():
        if info.expr is not None and polynomial(info.expr, poly):
            poly.add(name)
    freed = []
    for name, info in spec.tensors.items():
        if info.expr is None or name not in poly or name in spec.outputs:
            continue
        readers = [other for other, o in spec.tensors.items() if o.expr is not None and name in t.tensors_read(o.expr)]
        if any(reader not in poly for reader in readers):
            freed.append(name)
    if not freed:
        return None
    tensors = {name: (dataclasses.replace(info, kind="input", expr=None) if name in freed else info)
               for name, info in spec.tensors.items()}
    return dataclasses.replace(spec, tensors=tensors), tuple(freed)
