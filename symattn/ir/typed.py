"""The typed IR: resolved operations with symbolic shapes.

Contract: `symattn.front.validate` produces a `TypedSpec` whose tensor definitions
are trees of the frozen, slotted nodes below. Every node knows its `shape`,
a tuple of SymPy expressions over the spec's dim symbols (positive integers),
and its source position `pos` (not part of equality or hashing). Names are
resolved, axes are normalised to non-negative integers, and syntax variants
are gone (`K.T` and `transpose(K)` are both `Transpose`). The same nodes
express matrix-level gradients (`Grad` is the upstream gradient of a tensor),
so one printer (`symattn.ir.printing`) shows specs, derivations and claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Iterable, Iterator

import sympy

from .affine import Affine, names as affine_names
from .position import NOWHERE, Pos

__all__ = [
    "Shape",
    "Node",
    "Tensor",
    "Scalar",
    "DimValue",
    "Unary",
    "Binary",
    "MatMul",
    "Transpose",
    "Reduce",
    "Scan",
    "Softmax",
    "Compare",
    "Where",
    "Logical",
    "Apply",
    "MergeHeads",
    "SplitHeads",
    "Concat",
    "Constant",
    "Grad",
    "SumTo",
    "Slice",
    "Scatter",
    "Affine",
    "Index",
    "IndexDef",
    "Entry",
    "IndexVar",
    "IndexSum",
    "DimInfo",
    "TensorInfo",
    "CheckInfo",
    "TypedSpec",
    "REDUCTIONS",
    "CONSTANTS",
    "map_children",
    "walk",
    "dropped",
    "dropout_sources",
    "tensors_read",
    "depends_on",
    "entry_names",
    "subscript_names",
]

Shape = tuple  # tuple[sympy.Expr, ...]

REDUCTIONS = ("sum", "mean", "logsumexp", "max", "min")
CONSTANTS = ("sinusoidal", "causal_mask", "eye", "ones")


def _pos() -> Pos:
    return field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Node:
    """Base of every typed node; subclasses define `shape`."""

    @property
    def children(self) -> tuple["Node", ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Tensor(Node):
    """A named tensor: input, param, buffer or a defined intermediate."""

    name: str
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Scalar(Node):
    """A number: exact rational, `oo` for inf, or `pi`."""

    value: sympy.Expr
    shape: Shape = ()
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class DimValue(Node):
    """A dim (or dim arithmetic) used as a scalar value, as in `sqrt(d_k)`."""

    dim: sympy.Expr
    shape: Shape = ()
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Unary(Node):
    """An elementwise function of one tensor; `fn` names a `symattn.ir.functions` record, or is 'neg'."""

    fn: str
    x: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class Binary(Node):
    """Elementwise `add sub mul div pow` with NumPy broadcasting."""

    op: str
    a: Node
    b: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.a, self.b)


@dataclass(frozen=True, slots=True)
class MatMul(Node):
    """`a @ b`, batched over leading axes like numpy.matmul."""

    a: Node
    b: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.a, self.b)


@dataclass(frozen=True, slots=True)
class Transpose(Node):
    """Swap the last two axes."""

    x: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class Reduce(Node):
    """`sum`, `mean`, `logsumexp`, `max` or `min` over `axis` (None: every axis), keeping it.

    The gradient of `max` and `min` is shared equally among tied entries (torch.amax's convention).
    """

    kind: str
    x: Node
    axis: int | None
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class Scan(Node):
    """`cumsum(x, axis)`: the inclusive prefix sum along `axis`, same shape as `x`.

    `reverse` sums from the end instead (entry i holds the sum of entries i, i + 1, ...):
    the adjoint of the forward scan, written `cumsum(x, axis=0, reverse=1)`.
    """

    x: Node
    axis: int
    reverse: bool
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class Softmax(Node):
    x: Node
    axis: int
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class Compare(Node):
    """A boolean comparison, used as the condition of `Where`."""

    op: str
    a: Node
    b: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.a, self.b)


@dataclass(frozen=True, slots=True)
class Where(Node):
    cond: "Compare | Logical"
    a: Node
    b: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.cond, self.a, self.b)


@dataclass(frozen=True, slots=True)
class Logical(Node):
    """Conditions combined: `op` is "and" (`a & b`), "or" (`a | b`) or "not" (`~a`, one argument); each argument
    is a `Compare` or a `Logical`. (The attention plan writes a core's mask with it.)"""

    op: str
    args: tuple[Node, ...]
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return self.args


@dataclass(frozen=True, slots=True)
class Apply(Node):
    """An elementwise builtin of several operands, with NumPy broadcasting: `min(a, b)`, `max(a, b)`,
    `clamp(x, lo, hi)`, `a // b`, `a % b`; `fn` names a `symattn.ir.functions.OPERATIONS` record."""

    fn: str
    args: tuple[Node, ...]
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return self.args


@dataclass(frozen=True, slots=True)
class MergeHeads(Node):
    """[..., h, N, k] -> [..., N, h * k], head-major."""

    x: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class SplitHeads(Node):
    """[..., N, h * k] -> [..., h, N, k], the inverse of MergeHeads."""

    x: Node
    heads: sympy.Expr
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class Concat(Node):
    parts: tuple[Node, ...]
    axis: int
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return self.parts


@dataclass(frozen=True, slots=True)
class Constant(Node):
    """A fixed tensor: `sinusoidal(N, d)`, `causal_mask(N)`, `eye(N)`, `ones(...)`."""

    kind: str
    args: tuple[sympy.Expr, ...]
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Grad(Node):
    """`grad(T)`: dL/dT, with L = sum over outputs of <O, grad(O)>."""

    name: str
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Tangent(Node):
    """`tangent(T)` (x a `Tensor`) or `tangent(grad(T))` (x a `Grad`) in a check: the forward-mode derivative
    along free tangents of the inputs and params. A check that reads one is answered on the tangent pass
    written as a spec (`symattn.symbolic.passes`), where it is a tensor."""

    x: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class SumTo(Node):
    """Sum `x` down to `shape` (undo NumPy broadcasting); made by the backward pass.

    Leading axes that `shape` lacks are summed away; axes where `shape` has 1
    are summed keeping the axis.
    """

    x: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)

    @property
    def axes(self) -> tuple[int, ...]:
        """The axes of `x` that are summed."""
        lead = len(self.x.shape) - len(self.shape)
        kept = [lead + k for k, d in enumerate(self.shape) if d == 1 and self.x.shape[lead + k] != 1]
        return tuple(range(lead)) + tuple(kept)


@dataclass(frozen=True, slots=True)
class Slice(Node):
    """`x` restricted to `start <= index < stop` along `axis`: `X[:, 0:h]`, and the backward of concat."""

    x: Node
    axis: int
    start: sympy.Expr
    stop: sympy.Expr
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


# --- index notation ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Index:
    """An index of index notation and the dim it ranges over (0 .. range-1)."""

    name: str
    range: sympy.Expr


@dataclass(frozen=True, slots=True)
class IndexDef(Node):
    """`T[i, j] = body`: one entry per index tuple; `body` has shape ()."""

    indices: tuple[Index, ...]
    body: Node
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.body,)


@dataclass(frozen=True, slots=True)
class Entry(Node):
    """`X[i, k]`: one entry of a tensor. A subscript is an index name (`str`, the common case),
    a computed one affine in the indices (`Affine`: `b[j - i + N - 1]`, `Q[i, 2 * c + 1]`), or
    any other integer expression of them, as a node of shape () (`Kc[table[j // S], j % S, c]`,
    `Bt[clamp(j - i, -R, R) + R]`: see `symattn.ir.integers`)."""

    tensor: str
    indices: tuple["str | Affine | Node", ...]
    shape: Shape = ()
    grad: bool = False  # an entry of grad(tensor), made by the backward pass
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class IndexVar(Node):
    """The value of an index (0-based), as in `where(j <= i, 0, -inf)`."""

    name: str
    shape: Shape = ()
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class IndexSum(Node):
    """`sum(k, body)`: the sum of `body` over index k."""

    index: Index
    body: Node
    shape: Shape = ()
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.body,)


@dataclass(frozen=True, slots=True)
class Scatter(Node):
    """Zeros of `shape`, to which each entry of `x` over its index box is added at `targets`
    (one subscript per axis, in `x`'s index names): `out[targets(i, j)] += x[i, j]`. The
    gradient of a read at computed subscripts (`b[j - i + N - 1]`), made by the backward pass;
    entries that no box point reaches stay 0."""

    x: IndexDef
    targets: tuple[str | Affine, ...]
    shape: Shape
    pos: Pos = _pos()

    @property
    def children(self):
        return (self.x,)


def subscript_names(s) -> tuple[str, ...]:
    """The indices a subscript reads, each once, in order: an index name, an Affine's, or those of an integer
    node (`table[j // S]`: inside the subscripts of the entries it reads too)."""
    if not isinstance(s, Node):
        return affine_names(s)
    found: list[str] = []
    for n in walk(s):
        if isinstance(n, IndexVar):
            found.append(n.name)
        elif isinstance(n, Entry):
            for sub in n.indices:
                found.extend(subscript_names(sub))
    return tuple(dict.fromkeys(found))


def entry_names(node: Entry) -> list[str]:
    """The index names an entry's subscripts read, each once, in order."""
    return list(dict.fromkeys(n for s in node.indices for n in subscript_names(s)))


def map_children(node: Node, fn) -> Node:
    """`node` with `fn` applied to each child node: every field that is a node, and the nodes in a tuple field
    (other items, such as an entry's index names, kept); `node` itself where nothing changed."""
    changes = {}
    for f in fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Node):
            changes[f.name] = fn(value)
        elif isinstance(value, tuple) and any(isinstance(v, Node) for v in value):
            changes[f.name] = tuple(fn(v) if isinstance(v, Node) else v for v in value)
    return replace(node, **changes) if any(changes[k] is not getattr(node, k) for k in changes) else node


def walk(node: Node) -> Iterator[Node]:
    """Every node of a tree, in preorder, left to right (a shared subtree is visited each time)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def tensors_read(node: Node) -> list[str]:
    """The tensors a node reads (whole, or entry by entry in index notation), in order of first read."""
    found: list[str] = []
    stack = [node]
    while stack:  # the node, and the integer subscripts of its entries (offsets[doc[i]] reads doc too)
        for n in walk(stack.pop()):
            name = n.name if isinstance(n, Tensor) else n.tensor if isinstance(n, Entry) and not n.grad else None
            if name is not None and name not in found:
                found.append(name)
            if isinstance(n, Entry):
                stack.extend(s for s in n.indices if isinstance(s, Node))
    return found


def depends_on(spec: "TypedSpec", nodes: Iterable[Node]) -> Iterator[Node]:
    """Every node the values of `nodes` are computed from: their own nodes and those of the
    definitions of the tensors they read, transitively, each definition once; a gradient reads
    every definition of the spec (the chain rule does)."""
    seen: set[str] = set()
    todo = list(nodes)
    while todo:
        for n in walk(todo.pop()):
            yield n
            if isinstance(n, Grad) or (isinstance(n, Entry) and n.grad):
                names = list(spec.tensors)
            elif isinstance(n, (Tensor, Entry)):
                names = [n.name if isinstance(n, Tensor) else n.tensor]
            else:
                continue
            for name in names:
                info = spec.tensors.get(name)
                if name not in seen and info is not None and info.expr is not None:
                    seen.add(name)
                    todo.append(info.expr)


def dropped(spec: "TypedSpec", mask: str) -> Node:
    """x of `D = dropout(x, p)` for D's mask `mask`: D's definition is x * mask / (1 - p) (`front.dropout`)."""
    return spec.tensors[spec.tensors[mask].dropout.of].expr.a.a


def dropout_sources(spec: "TypedSpec", mask: str) -> list[str]:
    """The given tensors (dropout masks aside) the x of `mask`'s dropout is computed from, in spec order: their
    batch axes are the mask's."""
    read = {n.name if isinstance(n, Tensor) else n.tensor for n in depends_on(spec, [dropped(spec, mask)])
            if isinstance(n, Tensor) or (isinstance(n, Entry) and not n.grad)}
    return [n for n in spec.tensors if n in read and spec.tensors[n].expr is None and spec.tensors[n].dropout is None]


# the whole spec (`symattn.ir.spec`), read through this module as ever
from .spec import CheckInfo, DimInfo, TensorInfo, TypedSpec  # noqa: E402
