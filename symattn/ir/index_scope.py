"""One index name per binding: the form that gives every index name one axis.

Contract: `scope_sum_indices(node)` is the definition `node` with each
`sum(k, ...)` that reuses a name taken by the left side or an earlier sum
renamed to a fresh `k_1`, `k_2`, ... in its own body (see its docstring);
the reference evaluator's grid, the vectorised lowering and the equivariance
prover run on this form.
"""

from __future__ import annotations

from dataclasses import fields, replace

from .integers import renamed as renamed_subscript
from .typed import Entry, Index, IndexDef, IndexSum, IndexVar, Node, entry_names, walk

__all__ = ["scope_sum_indices"]


def scope_sum_indices(node: IndexDef) -> IndexDef:
    """The same definition with one index name per binding, so a name means one axis.

    Each `sum(k, ...)` scopes its own k: sibling sums may reuse a name over
    different ranges (`sum(k, X[i, k] * W1[k, j]) + sum(k, Y[i, k] * W2[k, j])`).
    Code that gives every index name one axis or one range (the reference
    evaluator's grid, the vectorised lowering) runs on this form: a sum whose
    name an index of the left side or an earlier sum already took is renamed
    to a fresh `k_1`, `k_2`, ... (a name used nowhere in the definition) in its
    own body. A definition without reuse comes back unchanged, equal and with
    the same names.
    """
    taken = {i.name for i in node.indices}
    used = taken | {n.index.name if isinstance(n, IndexSum) else n.name for n in walk(node.body)
                    if isinstance(n, (IndexSum, IndexVar))}
    used |= {i for n in walk(node.body) if isinstance(n, Entry) for i in entry_names(n)}

    def fresh(name: str) -> str:
        k = 1
        while f"{name}_{k}" in used:
            k += 1
        used.add(f"{name}_{k}")
        return f"{name}_{k}"

    def scoped(n: Node, names: dict[str, str]) -> Node:
        if isinstance(n, IndexSum):
            name = n.index.name if n.index.name not in taken else fresh(n.index.name)
            taken.add(name)
            body = scoped(n.body, {**names, n.index.name: name})
            return replace(n, index=Index(name, n.index.range), body=body)
        if isinstance(n, IndexVar):
            return replace(n, name=names.get(n.name, n.name))
        if isinstance(n, Entry):
            return replace(n, indices=tuple(renamed_subscript(i, names) for i in n.indices))
        changes = {}
        for f in fields(n):
            value = getattr(n, f.name)
            if isinstance(value, Node):
                changes[f.name] = scoped(value, names)
            elif isinstance(value, tuple) and value and all(isinstance(v, Node) for v in value):
                changes[f.name] = tuple(scoped(v, names) for v in value)
        return replace(n, **changes) if changes else n

    return replace(node, body=scoped(node.body, {}))
