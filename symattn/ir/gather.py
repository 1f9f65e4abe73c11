"""The gather form of a scatter: one entry of the result as a sum over the points that reach it.

Contract: `gather_form(node)` turns `Scatter(x, targets)` (`out[targets(i, j)] +=
x[i, j]`) into an equal `IndexDef` over fresh output indices, written with
the spec language's own index notation: a target that is a box index over
the axis's whole range is that output index (renamed, no sum); every other
target becomes a guard `where(target == l, ..., 0)` inside sums over the box
indices that remain. So `grad(b)[l] = sum(i, sum(j, where(j - i + N - 1 ==
l, grad(B)[i, j], 0)))` for the gradient of `b[j - i + N - 1]`: what the
text printer, the typesetter and the SymPy form show, every read in range.

With `solve=True` a target in which a box index has coefficient +1 or -1 is
solved for that index instead (`j = l + i - N + 1`), guarded by the index's
range: `sum(i, where(l + i - N + 1 >= 0, where(l + i - N + 1 < N, grad(B)[i,
l + i - N + 1], 0), 0))`, one sum fewer. Its reads are in range only where
the guards hold, so only a target that evaluates a `where` lazily (CUDA's
`?:`) may use it. `gather_forms(node, solve)` replaces every `Scatter` in a
tree; `entry_form(node)` writes a sum of such parts (`IndexDef`s and
scatters) as one definition over shared output indices, or None when the
node is not one. `substitute_indices` and `subscript_node` are the index
arithmetic they need.
"""

from __future__ import annotations

import sympy

from . import typed as t
from .affine import affine, offset, terms
from .integers import subscript_node, substitute_indices, substituted
from .shapes import same_dim

__all__ = ["gather_form", "gather_forms", "entry_form", "substitute_indices", "subscript_node"]

_OUTPUT_NAMES = ("l", "m", "n", "p", "q", "r", "s", "u", "v")


def _used_names(node: t.Node) -> set[str]:
    used: set[str] = set()
    for n in t.walk(node):
        if isinstance(n, t.Entry):
            used.update(t.entry_names(n))
        elif isinstance(n, t.IndexVar):
            used.add(n.name)
        elif isinstance(n, t.IndexSum):
            used.add(n.index.name)
        elif isinstance(n, t.IndexDef):
            used.update(i.name for i in n.indices)
    return used


def _fresh(count: int, used: set[str]) -> list[str]:
    pool = [n for n in _OUTPUT_NAMES if n not in used]
    k = 1
    while len(pool) < count:
        if f"t{k}" not in used:
            pool.append(f"t{k}")
        k += 1
    return pool[:count]


def _solvable(target, remaining: list[str]) -> str | None:
    """A remaining box index with coefficient +1 or -1 in `target`, or None."""
    if isinstance(target, str):
        return target if target in remaining else None
    if isinstance(target, t.Node):  # not affine: nothing to solve for
        return None
    for name, c in zip(target.indices, target.coefficients):
        if abs(c) == 1 and name in remaining:
            return name
    return None


def gather_form(node: t.Scatter, solve: bool = False, avoid: frozenset[str] | set[str] = frozenset()) -> t.IndexDef:
    """The scatter as an equal index-notation definition (see the module docstring); its output
    indices avoid `avoid` too (the names of a spec that the text is written into)."""
    values = node.x
    box = {i.name: i.range for i in values.indices}
    outputs = _fresh(len(node.shape), _used_names(values) | set(avoid))
    remaining = [i.name for i in values.indices]
    solution: dict[str, object] = {}
    equal: list[tuple[object, str]] = []   # target == output index
    bounds: list[tuple[object, sympy.Expr]] = []  # 0 <= value < size

    def fix(name: str, value) -> None:
        for k in list(solution):
            solution[k] = substituted(solution[k], {name: value})
        for k, (target, out) in enumerate(equal):
            equal[k] = (substituted(target, {name: value}), out)
        for k, (expr, size) in enumerate(bounds):
            bounds[k] = (substituted(expr, {name: value}), size)
        solution[name] = value
        remaining.remove(name)

    for target, out, size in zip(node.targets, outputs, node.shape):
        target = substituted(target, solution)
        if isinstance(target, str) and target in remaining and same_dim(box[target], size):
            fix(target, out)
            continue
        name = _solvable(target, remaining) if solve else None
        if name is None:
            equal.append((target, out))
            continue
        c = dict(terms(target))[name]
        rest = substituted(target, {name: affine({})})  # target without the term of `name`
        value = affine([(out, c)] + [(n, -k * c) for n, k in terms(rest)], -c * offset(rest))  # c * (out - rest)
        fix(name, value)
        bounds.append((value, box[name]))

    body = substitute_indices(values.body, solution)
    zero = t.Scalar(sympy.Integer(0))
    for expr, size in reversed(bounds):
        value = subscript_node(expr)
        inside = t.Where(t.Compare("<", value, t.DimValue(size), ()), body, zero, ())
        body = t.Where(t.Compare(">=", value, zero, ()), inside, zero, ())
    for target, out in reversed(equal):
        body = t.Where(t.Compare("==", subscript_node(target), t.IndexVar(out), ()), body, zero, ())
    for name in reversed(remaining):
        body = t.IndexSum(t.Index(name, box[name]), body)
    indices = tuple(t.Index(out, size) for out, size in zip(outputs, node.shape))
    return t.IndexDef(indices, body, node.shape, pos=node.pos)


def gather_forms(node: t.Node, solve: bool = False) -> t.Node:
    """`node` with every `Scatter` in it replaced by its gather form."""
    if isinstance(node, t.Scatter):
        return gather_form(node, solve)
    if not any(isinstance(n, t.Scatter) for n in t.walk(node)):
        return node
    return t.map_children(node, lambda child: gather_forms(child, solve))


def _terms(node: t.Node, sign: int, out: list[tuple[int, t.Node]]) -> None:
    if isinstance(node, t.Binary) and node.op in ("add", "sub"):
        _terms(node.a, sign, out)
        _terms(node.b, sign if node.op == "add" else -sign, out)
    else:
        out.append((sign, node))


def entry_form(node: t.Node) -> t.IndexDef | None:
    """`A + B - C` of index-notation parts (IndexDef, Scatter) as one IndexDef, or None."""
    terms: list[tuple[int, t.Node]] = []
    _terms(node, 1, terms)
    defs = [gather_form(n) if isinstance(n, t.Scatter) else n for _, n in terms]
    if not all(isinstance(d, t.IndexDef) and d.shape == node.shape for d in defs):
        return None
    outputs = [i.name for i in defs[0].indices]
    bound = set().union(*(_used_names(d.body) - {i.name for i in d.indices} for d in defs))
    if bound & set(outputs):  # the first part's names are bound inside another: fresh names for all
        outputs = _fresh(len(outputs), set().union(*(_used_names(d) for d in defs)))
    body = None
    for (sign, _), d in zip(terms, defs):
        part = substitute_indices(d.body, {i.name: out for i, out in zip(d.indices, outputs)})
        if body is None:
            body = part if sign > 0 else t.Unary("neg", part, ())
        else:
            body = t.Binary("add" if sign > 0 else "sub", body, part, ())
    return t.IndexDef(tuple(t.Index(out, i.range) for out, i in zip(outputs, defs[0].indices)), body, node.shape)
