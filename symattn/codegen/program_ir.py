"""The program IR every code target renders: statements `var = node` over typed nodes.

Contract: a `Program` is the forward section and the backward section of a spec
as `Stmt`s (a `Var` name, a node, the leaves whose batch axes the value may
carry, the last statement that reads it), with nodes from the typed IR plus
`Var` (a value an earlier statement computed), `SoftmaxGrad` (the softmax
backward as one operation) and `Arange` (an index's values); `Namer` chooses
identifiers that collide with nothing. `symattn.codegen.program` builds it,
`symattn.codegen.rewrites` makes it cheaper, the targets print it.

A statement that computes a tensor of the spec or a gradient also says so in
`defines`: the value and its expression as the spec or the derivation states
it (over `t.Tensor` and `t.Grad`, before rewrites, sharing and index
lowering). A target that prints statements as array operations (NumPy) reads
`node`; a target that fuses work across statements into kernels of its own
(CUDA, `symattn.codegen.cuda.plan`) lowers `defines`.
"""

from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass, field
from typing import Iterable

import sympy

from ..errors import CodegenError
from ..ir import typed as t
from ..ir.printing import to_spec
from ..symbolic.derive import Derivation
from .index import IndexArray, LContract, LGather, LNode, LOp, LSum

__all__ = ["CodegenError", "Var", "SoftmaxGrad", "Arange", "FusedAttention", "FusedAttentionGrad", "FusedPart", "FusedLse",
           "Definition", "Stmt", "Program", "Namer", "spec_text", "rebuild", "unrewrite", "RETURNED", "walk_labelled"]


@dataclass(frozen=True, slots=True)
class Var(t.Node):
    """The value of an earlier statement (or of an argument)."""

    name: str
    shape: tuple


@dataclass(frozen=True, slots=True)
class SoftmaxGrad(t.Node):
    """grad(S) for P = softmax(S, axis): `P * (G - rowdot)`, rowdot = sum(G * P, axis) or an equal value."""

    p: t.Node
    g: t.Node
    rowdot: t.Node
    axis: int
    shape: tuple
    original: t.Node | None = field(default=None, compare=False)  # the rowdot as derived
    note: str = field(default="", compare=False)  # why rowdot equals it

    @property
    def children(self):
        return (self.p, self.g, self.rowdot)


@dataclass(frozen=True, slots=True)
class Arange:
    """The values 0, 1, ..., size - 1 of an index used as a number."""

    size: sympy.Expr


@dataclass(frozen=True, slots=True)
class DropoutMask(t.Node):
    """The 0/1 mask of a `dropout` definition, drawn from the module's seed (`Program.seed`) for every entry
    of `like`, the value it multiplies, in its shape at run time (leading batch axes included): entry n
    (flat, row-major) is 1 iff `symattn.ir.philox.keep_at(seed, stream, n, threshold)`. The forward pass
    and the backward pass each draw it (a module's backward runs the forward statements again), so no
    mask is stored between them."""

    like: t.Node
    stream: int
    threshold: int
    shape: tuple

    @property
    def children(self):
        return (self.like,)


@dataclass(frozen=True, slots=True)
class DropoutBase(t.Node):
    """In a fused program, a dropout mask that an attention core draws per entry (`plan.DropoutEntry`) held as
    (offset, seed) per batch entry: the offset is `size` (the mask's entries per batch entry) times the
    entry's number over the batch axes of `sources` (the core's q, k and score reads, each with its spec
    rank), those of the scores the mask has the shape of; the seed is the program's, its 64 bits as an
    int64. An int64 array of those batch axes and [2]."""

    size: sympy.Expr
    sources: tuple  # of (Var, rank)
    shape: tuple = (2,)

    @property
    def children(self):
        return tuple(v for v, _ in self.sources)


@dataclass(frozen=True, slots=True)
class FusedAttention(t.Node):
    """An attention core's output `softmax(score(q @ k.T)) @ v` computed as one operation (block by block,
    never the whole score), with the row log-sum-exp its backward reads; `core` names the core's output
    (`Program.cores`); `operands` are the given tensors its score reads (`AttentionCore.read_tensors`)."""

    core: str
    q: t.Node
    k: t.Node
    v: t.Node
    shape: tuple
    operands: tuple = ()

    @property
    def children(self):
        return (self.q, self.k, self.v, *self.operands)


@dataclass(frozen=True, slots=True)
class FusedLse(t.Node):
    """The row log-sum-exp of the scores of a fused core `x` (a `FusedAttention`): a tensor of the spec that is it."""

    x: t.Node
    shape: tuple

    @property
    def children(self):
        return (self.x,)


@dataclass(frozen=True, slots=True)
class FusedAttentionGrad(t.Node):
    """The gradients through one attention core (dq, dk, dv, then d of each learned tensor its score reads), from
    its output `o` and the output's gradient `do` (FlashAttention-2's backward: the weights recomputed from the
    saved log-sum-exp); `dlse` is the gradient of the core's row log-sum-exp where the spec has it as a tensor."""

    core: str
    q: t.Node
    k: t.Node
    v: t.Node
    o: t.Node
    do: t.Node
    shape: tuple = ()
    dlse: t.Node | None = None
    operands: tuple = ()

    @property
    def children(self):
        return (self.q, self.k, self.v, self.o, self.do, *((self.dlse,) if self.dlse is not None else ()),
                *self.operands)


@dataclass(frozen=True, slots=True)
class FusedPart(t.Node):
    """Gradient number `index` of a `FusedAttentionGrad` (0: q, 1: k, 2: v, 3 on: the learned reads)."""

    x: t.Node
    index: int
    shape: tuple

    @property
    def children(self):
        return (self.x,)


def unrewrite(node: t.Node) -> t.Node:
    if isinstance(node, SoftmaxGrad):
        inner = t.Binary("sub", unrewrite(node.g), unrewrite(node.original or node.rowdot), node.shape)
        return t.Binary("mul", unrewrite(node.p), inner, node.shape)
    if isinstance(node, FusedPart):  # shown as the variable the NumPy printer gives it: dQ_via_O
        operands = (node.x.q, node.x.k, node.x.v, *node.x.operands)
        operand = operands[node.index] if node.index < 3 else None
        named = operand.name if isinstance(operand, t.Tensor) else ("Q", "K", "V")[node.index] \
            if node.index < 3 else f"read{node.index - 2}"
        return t.Tensor(f"d{named}_via_{node.x.core}", node.shape)
    if isinstance(node, FusedLse):
        return t.Tensor(f"lse_of_{node.x.core}", node.shape)
    return rebuild(node, unrewrite)


def spec_text(node: t.Node, dims) -> str:
    """A (rewritten) node in spec syntax, for comments."""
    return to_spec(unrewrite(node), list(dims))


# The fields that hold children, per node type: how lowering rebuilds a node.
_CHILD_FIELDS = {
    t.Unary: ("x",), t.Binary: ("a", "b"), t.MatMul: ("a", "b"), t.Transpose: ("x",), t.Reduce: ("x",),
    t.Softmax: ("x",), t.Compare: ("a", "b"), t.Where: ("cond", "a", "b"), t.MergeHeads: ("x",),
    t.SplitHeads: ("x",), t.SumTo: ("x",), t.Slice: ("x",), t.Scan: ("x",), SoftmaxGrad: ("p", "g", "rowdot"),
    t.Scatter: ("x",), FusedAttention: ("q", "k", "v", "operands"),
    FusedAttentionGrad: ("q", "k", "v", "o", "do", "dlse", "operands"), FusedPart: ("x",), FusedLse: ("x",),
    t.Logical: ("args",), t.Apply: ("args",),
}


def rebuild(node: t.Node, fn) -> t.Node:
    if isinstance(node, t.Concat):
        return dataclasses.replace(node, parts=tuple(fn(p) for p in node.parts))
    fields = _CHILD_FIELDS.get(type(node))
    if not fields:
        return node
    changes = {}
    for f in fields:
        value = getattr(node, f)
        changes[f] = tuple(fn(x) for x in value) if isinstance(value, tuple) else None if value is None else fn(value)
    return dataclasses.replace(node, **changes)


@dataclass(frozen=True, slots=True)
class Definition:
    """What a statement computes: `tensor`, or grad(tensor) when `grad`, and `expr`, its definition or
    its derivative as the spec or the derivation states it."""

    tensor: str
    grad: bool
    expr: t.Node


@dataclass
class Stmt:
    """`var = node`. `labels` is None for a tensor, or the index labels of an index-notation array."""

    var: str
    node: object
    section: str  # "forward" or "backward"
    title: str  # what it computes, in spec syntax ("S = Q @ K.T / sqrt(d_k)", "grad(V) = P.T @ grad(O)")
    shape: tuple = ()
    labels: tuple[str, ...] | None = None
    sources: frozenset = frozenset()  # leaves and upstream gradients whose batch axes it may carry
    reads: tuple[str, ...] = ()
    last_use: int = -1  # index of the last statement that reads it (a large number: returned)
    note: str = ""  # the identity a rewrite used, if any
    rewritten: bool = False  # computed otherwise than its title says
    defines: Definition | None = None  # the tensor or gradient it computes; None for a temporary


@dataclass
class Program:
    spec: t.TypedSpec
    derivation: Derivation
    stmts: list[Stmt]
    forward_count: int  # stmts[:forward_count] make up the forward section
    tensor_vars: dict[str, str]  # every given (input, param, buffer) and emitted tensor -> its variable
    grad_vars: dict[str, str]  # tensor -> variable of its gradient
    upstream: dict[str, str]  # output -> its keyword, grad_O
    dim_vars: dict[str, str]
    leaf_grads: dict[str, str | None]  # input or param -> variable of its gradient, None when L does not depend on it
    names: Namer | None = None  # for printers that need more variables
    info: dict[str, Stmt] = field(default_factory=dict)  # variable -> statement (arguments too)
    cores: dict = field(default_factory=dict)  # core output -> AttentionCore, for FusedAttention statements
    seed: str | None = None  # the keyword argument dropout's masks are drawn from (None: the spec has no dropout)

    @property
    def arguments(self) -> list[str]:
        """The variables of the module's tensor arguments (the spec's `arguments`), then the seed's, if any."""
        return [self.tensor_vars[n] for n in self.spec.arguments] + ([self.seed] if self.seed else [])

    @property
    def forward(self) -> list[Stmt]:
        return self.stmts[: self.forward_count]

    @property
    def backward(self) -> list[Stmt]:
        return self.stmts[self.forward_count:]


RETURNED = 1 << 30  # last_use of what is returned to the caller


class Namer:
    """Unique Python identifiers: a name is taken once; a clash gets underscores appended."""

    def __init__(self, reserved: Iterable[str]) -> None:
        self.used = set(reserved) | set(keyword.kwlist) | set(keyword.softkwlist)

    def take(self, *preferred: str) -> str:
        for name in preferred:
            if name not in self.used:
                self.used.add(name)
                return name
        name = preferred[-1]
        while name in self.used:
            name += "_"
        self.used.add(name)
        return name

    def numbered(self, base: str) -> str:
        """`base`, else base2, base3, ...: for temporaries."""
        k = 1
        name = base
        while name in self.used:
            k += 1
            name = f"{base}{k}"
        self.used.add(name)
        return name


def walk_labelled(node):
    """Every node under `node`, through labelled and index-array nodes too."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None or isinstance(n, (tuple, Arange)):
            continue
        yield n
        if isinstance(n, IndexArray):
            stack.append(n.root)
        elif isinstance(n, LOp):
            stack.extend(n.args)
        elif isinstance(n, LContract):
            stack.extend(n.factors)
        elif isinstance(n, LSum):
            stack.append(n.x)
        elif isinstance(n, LGather):  # integer subscripts that read arrays (`table[j // S]`)
            stack.extend(i for i in n.indices if isinstance(i, LNode))
        elif isinstance(n, t.Node):
            stack.extend(n.children)
            if isinstance(n, t.Scatter):
                stack.extend(s for s in n.targets if isinstance(s, LNode))
