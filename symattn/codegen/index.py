"""Index notation as whole-array operations: the vectorising half of code generation.

Contract: `IndexLowering(host).lower_def(node)` turns `T[i, j] = body` into
an `IndexArray`, a tree of *labelled* array operations: every value carries
the index names of its trailing axes (its labels) in a fixed order, after any
leading batch axes. No value ever loops over an index:

- `X[i, k]` is the array X read with labels (i, k) (`LEntry`); a read at
  computed subscripts, `b[j - i + N - 1]`, is a gather with integer index
  arrays over the indices it reads (`LGather`: an [N, N] array of positions,
  never a one-hot [N, N, 2N - 1] tensor);
- an index used as a value is an `arange` over its range (`LVar`, hoisted);
- elementwise operations broadcast their operands to the union of their
  labels (`LOp`); a label names one axis of one range, so sibling sums that
  reuse an index name are first given distinct names
  (`index_scope.scope_sum_indices`);
- `sum(k, ...)` over a product of factors is one contraction (`LContract`,
  printed as `@` or `einsum`): nested sums under a product are pulled out
  first, so `sum(j, a[l, j] * sum(c, b[l, j, c] * w[m, c]))` contracts over
  j and c at once instead of building an [l, j, m] array; a sum over
  anything else sums one axis (`LSum`).

Subexpressions that occur more than once in the program, equal up to the
names of their indices, are computed once (`host.hoist_index`); that is how
`tanh(...)` of additive attention, built over [i, j, c] in the forward pass,
is reused by every gradient that needs it. Nothing here is NumPy-specific:
printers turn these nodes into code.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import sympy

from ..ir import build as b
from ..ir import typed as t
from ..ir.integers import renamed as renamed_subscript
from ..ir.index_scope import scope_sum_indices
from ..errors import SymbolicError

__all__ = [
    "LNode",
    "LEntry",
    "LGather",
    "LVar",
    "LConst",
    "LOp",
    "LContract",
    "LSum",
    "IndexArray",
    "IndexLowering",
    "canonical_key",
    "count_shared",
]


# --- labelled nodes ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LNode:
    """A value whose trailing axes are labelled with index names."""

    labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LEntry(LNode):
    """Entries of a whole array `var` read at `indices` (labels: the distinct indices)."""

    var: str
    indices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LGather(LEntry):
    """Entries of `var` at computed subscripts: `indices` holds an index name, an `Affine` or a lowered
    integer value (an `LNode`: `table[j // S]`) per axis, `labels` the distinct index names they read,
    `ranges` the range of each label."""

    ranges: tuple[sympy.Expr, ...]


@dataclass(frozen=True, slots=True)
class LVar(LNode):
    """A labelled array computed by an earlier statement."""

    var: str


@dataclass(frozen=True, slots=True)
class LConst(LNode):
    """A scalar that depends on no tensor and no index (a number, a dim, arithmetic of them)."""

    node: t.Node


@dataclass(frozen=True, slots=True)
class LScalarTensor(LNode):
    """A tensor of shape () (a scalar param): no labels, but it may carry batch axes."""

    var: str


@dataclass(frozen=True, slots=True)
class LOp(LNode):
    """An elementwise operation; `kind` is unary, binary, compare, where, logical (`op`: and, or, not) or apply
    (`op`: a `functions.OPERATIONS` record, `min`, `//`, ...); `op` the function or operator."""

    kind: str
    op: str
    args: tuple[LNode, ...]


@dataclass(frozen=True, slots=True)
class LContract(LNode):
    """`coeff * sum over `summed` of the product of `factors`` (labels: what is left)."""

    factors: tuple[LNode, ...]
    summed: tuple[str, ...]
    coeff: t.Node | None


@dataclass(frozen=True, slots=True)
class LSum(LNode):
    """The sum of `x` over the axis labelled `index`."""

    x: LNode
    index: str


@dataclass(frozen=True, slots=True)
class IndexArray(t.Node):
    """A matrix-level node: the tensor `T[indices] = root`, axes in the order of `indices`."""

    root: LNode
    indices: tuple[str, ...]
    ranges: tuple[sympy.Expr, ...]
    shape: tuple


# --- canonical forms: equal up to index names ------------------------------------------


def _rename(node: t.Node, mapping: dict[str, str]) -> t.Node:
    """`node` with every index name (free and bound) replaced through `mapping`."""
    if isinstance(node, t.Entry):
        return t.Entry(node.tensor, tuple(renamed_subscript(i, mapping) for i in node.indices), grad=node.grad)
    if isinstance(node, t.IndexVar):
        return t.IndexVar(mapping.get(node.name, node.name))
    if isinstance(node, t.IndexSum):
        index = t.Index(mapping.get(node.index.name, node.index.name), node.index.range)
        return t.IndexSum(index, _rename(node.body, mapping))
    if isinstance(node, t.Unary):
        return t.Unary(node.fn, _rename(node.x, mapping), ())
    if isinstance(node, (t.Binary, t.Compare)):
        return type(node)(node.op, _rename(node.a, mapping), _rename(node.b, mapping), ())
    if isinstance(node, t.Where):
        return t.Where(_rename(node.cond, mapping), _rename(node.a, mapping), _rename(node.b, mapping), ())
    if isinstance(node, t.Logical):
        return t.Logical(node.op, tuple(_rename(a, mapping) for a in node.args), ())
    if isinstance(node, t.Apply):
        return t.Apply(node.fn, tuple(_rename(a, mapping) for a in node.args), ())
    return node


def _walk_names(node: t.Node, bound: set[str], free: list[str], binders: list[str]) -> None:
    if isinstance(node, t.Entry):
        free.extend(i for i in t.entry_names(node) if i not in bound and i not in free)
    elif isinstance(node, t.IndexVar):
        if node.name not in bound and node.name not in free:
            free.append(node.name)
    elif isinstance(node, t.IndexSum):
        binders.append(node.index.name)
        _walk_names(node.body, bound | {node.index.name}, free, binders)
        return
    for child in node.children:
        _walk_names(child, bound, free, binders)


def free_indices(node: t.Node) -> list[str]:
    """Index names used but not bound inside `node`, in order of first appearance."""
    free: list[str] = []
    _walk_names(node, set(), free, [])
    return free


def canonical_key(node: t.Node, ranges: dict[str, sympy.Expr]) -> tuple[tuple, list[str]]:
    """A key equal for subexpressions that differ only in index names, and the free indices in key order."""
    free: list[str] = []
    binders: list[str] = []
    _walk_names(node, set(), free, binders)
    mapping = {name: f"_f{k}" for k, name in enumerate(free)}
    mapping.update({name: f"_b{k}" for k, name in enumerate(binders) if name not in mapping})
    return (_rename(node, mapping), tuple(ranges.get(n) for n in free)), free


def _depends_on_data(node: t.Node) -> bool:
    """Whether a subtree reads a tensor or an index (otherwise it is a scalar constant)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (t.Entry, t.IndexVar, t.Tensor, t.Grad)):
            return True
        stack.extend(n.children)
    return False


def _worth_sharing(node: t.Node) -> bool:
    return isinstance(node, (t.Unary, t.Binary, t.Where, t.Apply, t.IndexSum)) and _depends_on_data(node) \
        and bool(free_indices(node))


def _ranges_of(node: t.IndexDef) -> dict[str, sympy.Expr]:
    """The range of every index name of `node` (one per name: run on `scope_sum_indices(node)`)."""
    ranges = {i.name: i.range for i in node.indices}
    stack = [node.body]
    while stack:
        n = stack.pop()
        if isinstance(n, t.IndexSum):
            ranges.setdefault(n.index.name, n.index.range)
        stack.extend(n.children)
    return ranges


def count_shared(defs: list[t.IndexDef]) -> set[tuple]:
    """Keys of index subexpressions that occur more than once over all `defs` (counted as a DAG)."""
    counts: Counter = Counter()

    def visit(node: t.Node, ranges) -> None:
        if _worth_sharing(node):
            key, _ = canonical_key(node, ranges)
            counts[key] += 1
            if counts[key] > 1:
                return
        for child in node.children:
            visit(child, ranges)

    for node in map(scope_sum_indices, defs):
        visit(node.body, _ranges_of(node))
    return {key for key, n in counts.items() if n > 1}


# --- lowering -------------------------------------------------------------------------


class Host(Protocol):
    """What the lowering needs from the program builder."""

    def entry_var(self, tensor: str, grad: bool) -> str: ...

    def scalar_var(self, node: t.Node) -> str: ...

    def hoist_index(self, key: tuple, free: list[str], make, ranges) -> tuple[str, tuple[str, ...]]:
        """The variable holding the subexpression `key` (computing `make()` the first time), and its
        storage labels as canonical names `_f<k>` (k: position in `free`, the free indices in key order)."""

    def arange_var(self, name: str, size: sympy.Expr) -> str: ...


class _Context:
    """One index-notation definition: its index names in grid order and their ranges."""

    def __init__(self, node: t.IndexDef) -> None:
        self.ranges = _ranges_of(node)
        self.order: list[str] = [i.name for i in node.indices]
        stack = [node.body]
        while stack:
            n = stack.pop()
            if isinstance(n, t.IndexSum) and n.index.name not in self.order:
                self.order.append(n.index.name)
            stack.extend(reversed(n.children))
        self.taken = set(self.order)

    def sort(self, labels) -> tuple[str, ...]:
        wanted = set(labels)
        return tuple(n for n in self.order if n in wanted)

    def fresh(self, base: str, size: sympy.Expr) -> str:
        k = 1
        while f"{base}_{k}" in self.taken:
            k += 1
        name = f"{base}_{k}"
        self.taken.add(name)
        self.order.append(name)
        self.ranges[name] = size
        return name


class IndexLowering:
    """Lower index-notation definitions to labelled array operations (see the module docstring)."""

    def __init__(self, host: Host, shared: set[tuple]) -> None:
        self.host = host
        self.shared = shared

    def lower_def(self, node: t.IndexDef) -> IndexArray:
        node = scope_sum_indices(node)  # one range per index name: sibling sums may reuse a name
        cx = _Context(node)
        root = self.lower(node.body, cx)
        return IndexArray(root, tuple(i.name for i in node.indices), tuple(i.range for i in node.indices),
                          node.shape)

    def lower(self, node: t.Node, cx: _Context) -> LNode:
        if not _depends_on_data(node):
            return LConst((), node)
        if _worth_sharing(node):
            key, free = canonical_key(node, cx.ranges)
            if key in self.shared:
                var, stored = self.host.hoist_index(key, free, lambda: self._lower_fresh(node, cx), cx.ranges)
                mapping = dict(zip(key_free_names(len(free)), free))
                return LVar(tuple(mapping[c] for c in stored), var)
        return self._lower_fresh(node, cx)

    def _lower_fresh(self, node: t.Node, cx: _Context) -> LNode:
        if isinstance(node, t.Entry):
            var = self.host.entry_var(node.tensor, node.grad)
            if not node.indices:
                return LScalarTensor((), var)
            if not all(isinstance(i, str) for i in node.indices):
                labels = cx.sort(t.entry_names(node))
                # an integer subscript that is not affine (`table[j // S]`) is lowered like any value
                at = tuple(self.lower(i, cx) if isinstance(i, t.Node) else i for i in node.indices)
                return LGather(labels, var, at, tuple(cx.ranges[n] for n in labels))
            return LEntry(tuple(dict.fromkeys(node.indices)), var, node.indices)
        if isinstance(node, (t.Tensor, t.Grad)):
            if node.shape:
                raise SymbolicError(f"{getattr(node, 'name', '?')} is used without indices inside index notation")
            return LScalarTensor((), self.host.scalar_var(node))
        if isinstance(node, t.IndexVar):
            return LVar((node.name,), self.host.arange_var(node.name, cx.ranges[node.name]))
        if isinstance(node, t.Unary):
            x = self.lower(node.x, cx)
            return LOp(x.labels, "unary", node.fn, (x,))
        if isinstance(node, (t.Binary, t.Compare)):
            args = (self.lower(node.a, cx), self.lower(node.b, cx))
            kind = "binary" if isinstance(node, t.Binary) else "compare"
            return LOp(_result_labels(args, cx), kind, node.op, args)
        if isinstance(node, t.Where):
            args = (self.lower(node.cond, cx), self.lower(node.a, cx), self.lower(node.b, cx))
            return LOp(_result_labels(args, cx), "where", "where", args)
        if isinstance(node, (t.Logical, t.Apply)):
            args = tuple(self.lower(a, cx) for a in node.args)
            kind, op = ("logical", node.op) if isinstance(node, t.Logical) else ("apply", node.fn)
            return LOp(_result_labels(args, cx), kind, op, args)
        if isinstance(node, t.IndexSum):
            return self._lower_sum(node, cx)
        raise SymbolicError(f"no index-notation lowering for {type(node).__name__}")

    def lower_subscripts(self, subscripts: tuple, box: tuple[t.Index, ...]) -> tuple:
        """The subscripts of a scatter over the index `box`, an integer node among them lowered on its grid."""
        if all(not isinstance(s, t.Node) for s in subscripts):
            return subscripts
        cx = _Context(t.IndexDef(box, t.Scalar(sympy.Integer(0)), tuple(i.range for i in box)))
        return tuple(self.lower(s, cx) if isinstance(s, t.Node) else s for s in subscripts)

    def _lower_sum(self, node: t.IndexSum, cx: _Context) -> LNode:
        summed: list[str] = []
        coeffs: list[t.Node] = []
        factors: list[t.Node] = []
        outer = set(free_indices(node))
        if not self._product(node, summed, coeffs, factors, cx, outer, top=True):
            body = self.lower(node.body, cx)
            if node.index.name not in body.labels:  # the body does not depend on k: times the range
                count = t.DimValue(node.index.range)
                return LOp(body.labels, "binary", "mul", (body, LConst((), count)))
            return LSum(tuple(n for n in body.labels if n != node.index.name), body, node.index.name)
        lowered = tuple(self.lower(f, cx) for f in factors)
        number = sympy.Integer(1)  # numbers fold into one: 2 * -1 * x is -2 * x
        coeff = None
        for c in coeffs:
            if isinstance(c, t.Scalar) and c.value.is_Rational:
                number *= c.value
            else:
                coeff = c if coeff is None else b.mul(coeff, c)
        if number != 1:
            coeff = b.scalar(number) if coeff is None else b.mul(b.scalar(number), coeff)
        present = {n for f in lowered for n in f.labels}
        labels = cx.sort(present - set(summed))
        # an index summed over that no factor reads multiplies the result by its range
        for name in summed:
            if name not in present:
                count = t.DimValue(cx.ranges[name])
                coeff = count if coeff is None else b.mul(coeff, count)
        kept = tuple(n for n in summed if n in present)
        if not lowered:
            return LConst((), coeff if coeff is not None else b.scalar(1))
        return LContract(labels, lowered, kept, coeff)

    def _product(self, node: t.Node, summed, coeffs, factors, cx: _Context, outer: set[str],
                 top: bool = False) -> bool:
        """Flatten a product (with sums under it) into factors; False when `node` is a sum of a non-product."""
        if isinstance(node, t.IndexSum):
            name = node.index.name
            body = node.body
            if not top and (name in summed or name in outer):  # a sibling's or an outer index: rename
                new = cx.fresh(name, node.index.range)
                body = _rename(body, {name: new})
                name = new
            if not top and not self._is_product(body):
                factors.append(t.IndexSum(t.Index(name, node.index.range), body))
                return True
            if top and not self._is_product(body):
                return False
            summed.append(name)
            return self._product(body, summed, coeffs, factors, cx, outer)
        if isinstance(node, t.Binary) and node.op == "mul":
            return (self._product(node.a, summed, coeffs, factors, cx, outer)
                    and self._product(node.b, summed, coeffs, factors, cx, outer))
        if isinstance(node, t.Binary) and node.op == "div" and not _depends_on_data(node.b):
            coeffs.append(b.div(b.scalar(1), node.b))
            return self._product(node.a, summed, coeffs, factors, cx, outer)
        if isinstance(node, t.Unary) and node.fn == "neg":
            coeffs.append(b.scalar(-1))
            return self._product(node.x, summed, coeffs, factors, cx, outer)
        if not _depends_on_data(node):
            coeffs.append(node)
            return True
        factors.append(node)
        return True

    @staticmethod
    def _is_product(node: t.Node) -> bool:
        if isinstance(node, t.Binary) and node.op in ("mul", "div"):
            return True
        if isinstance(node, t.Unary) and node.fn == "neg":
            return IndexLowering._is_product(node.x)
        if isinstance(node, t.IndexSum):
            return IndexLowering._is_product(node.body)
        return isinstance(node, t.Entry)


def _result_labels(args: tuple[LNode, ...], cx: _Context) -> tuple[str, ...]:
    """The labels of an elementwise result: an operand's own order when it has them all (no axes move)."""
    union = {n for a in args for n in a.labels}
    for a in sorted(args, key=lambda a: -len(a.labels)):
        if set(a.labels) == union:
            return a.labels
    return cx.sort(union)


def key_free_names(count: int) -> list[str]:
    return [f"_f{k}" for k in range(count)]
