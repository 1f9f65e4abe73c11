"""A spec and its derivation as one straight-line program: what code generators print.

Contract: `build_program(spec)` returns a `Program`, the statements `var = node`
that compute the spec's outputs (the forward section) followed by those that
compute the gradient of every input and param (the backward section), in an
order where every value is computed before it is read. Nodes are typed-IR
nodes in which

- a value computed by an earlier statement is a `Var` (or, in index notation,
  an `LVar`): subexpressions that occur more than once, in the forward pass,
  the backward pass or both, are computed once, so the backward pass reuses
  what the forward pass computed (`P`, the `tanh` of additive attention);
- index notation is an `IndexArray` of whole-array operations (`codegen_index`);
- the rewrites in `REWRITES` have been applied: each states an identity that
  holds for all sizes and makes the program cheaper (a chain of matrix
  products in its cheapest order; the softmax backward recognised as one
  operation, and in an attention core computed with `sum(grad(O) * O)`
  instead of `sum(grad(P) * P)`; a scalar factor of a matrix product applied
  to its smallest operand). Where cost depends on sizes, the spec's default
  sizes stand in for the sizes at run time; every choice is exact for all.

Each statement also records which leaves' batch axes its value may carry and
the last statement that reads it, so a printer can decide what to compute in
place. Python identifiers are chosen here (`Namer`): the spec's own names,
`dX` for grad(X), and names that never collide with each other, with Python
keywords or with the printer's reserved names. Nothing here is NumPy-specific.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

import sympy

from ..ir import typed as t
from ..symbolic.derive import Derivation, derive
from ..errors import SymAttnError
from ..ir.printing import to_spec
from .index import IndexArray, IndexLowering, LEntry, LScalarTensor, LVar, count_shared
from .index import LContract, LOp, LSum

__all__ = ["CodegenError", "Var", "SoftmaxGrad", "Arange", "Stmt", "Program", "Namer", "build_program",
           "REWRITES", "spec_text"]


class CodegenError(SymAttnError):
    """A spec that code generation cannot express (the message says why and what to change)."""


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


def _unrewrite(node: t.Node) -> t.Node:
    if isinstance(node, SoftmaxGrad):
        inner = t.Binary("sub", _unrewrite(node.g), _unrewrite(node.original or node.rowdot), node.shape)
        return t.Binary("mul", _unrewrite(node.p), inner, node.shape)
    return _rebuild(node, _unrewrite)


def spec_text(node: t.Node, dims) -> str:
    """A (rewritten) node in spec syntax, for comments."""
    return to_spec(_unrewrite(node), list(dims))


# The fields that hold children, per node type: how lowering rebuilds a node.
_CHILD_FIELDS = {
    t.Unary: ("x",), t.Binary: ("a", "b"), t.MatMul: ("a", "b"), t.Transpose: ("x",), t.Reduce: ("x",),
    t.Softmax: ("x",), t.Compare: ("a", "b"), t.Where: ("cond", "a", "b"), t.MergeHeads: ("x",),
    t.SplitHeads: ("x",), t.SumTo: ("x",), t.Slice: ("x",), SoftmaxGrad: ("p", "g", "rowdot"),
}


def _rebuild(node: t.Node, fn) -> t.Node:
    if isinstance(node, t.Concat):
        return dataclasses.replace(node, parts=tuple(fn(p) for p in node.parts))
    fields = _CHILD_FIELDS.get(type(node))
    if not fields:
        return node
    return dataclasses.replace(node, **{f: fn(getattr(node, f)) for f in fields})


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


@dataclass
class Program:
    spec: t.TypedSpec
    derivation: Derivation
    stmts: list[Stmt]
    forward_count: int  # stmts[:forward_count] make up the forward section
    tensor_vars: dict[str, str]  # every leaf and emitted tensor -> its variable
    grad_vars: dict[str, str]  # tensor -> variable of its gradient
    upstream: dict[str, str]  # output -> its keyword, grad_O
    dim_vars: dict[str, str]
    leaf_grads: dict[str, str | None]  # leaf -> variable of its gradient, None when L does not depend on it
    names: Namer | None = None  # for printers that need more variables
    info: dict[str, Stmt] = field(default_factory=dict)  # variable -> statement (arguments too)

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


# --- rewrites: identities that make the program cheaper ---------------------------------


def _softmax_grad(node: t.Node, rw: "_Rewriter") -> t.Node | None:
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


def _scale_smallest(node: t.Node, rw: "_Rewriter") -> t.Node | None:
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


def _reassociate(node: t.Node, rw: "_Rewriter") -> t.Node | None:
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


class _Rewriter:
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
            forward_nodes = {n for e in self.forward_exprs.values() for n in _walk(e)}
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
        node = _rebuild(node, self)
        for rule in REWRITES:
            new = rule(node, self)
            if new is not None:
                node = new
        return node


# --- the builder ------------------------------------------------------------------------


def _walk(node: t.Node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, t.IndexDef):
            stack.append(n.body)
        else:
            stack.extend(n.children)


def _tensor_refs(node: t.Node) -> list[str]:
    out = []
    for n in _walk(node):
        name = n.name if isinstance(n, t.Tensor) else n.tensor if isinstance(n, t.Entry) and not n.grad else None
        if name is not None and name not in out:
            out.append(name)
    return out


def _grad_refs(node: t.Node) -> list[str]:
    out = []
    for n in _walk(node):
        name = n.name if isinstance(n, t.Grad) else n.tensor if isinstance(n, t.Entry) and n.grad else None
        if name is not None and name not in out:
            out.append(name)
    return out


def _is_cheap(node: t.Node) -> bool:
    """Not worth a variable of its own even when repeated."""
    if isinstance(node, (t.Tensor, t.Grad, t.Scalar, t.DimValue, Var)):
        return True
    if isinstance(node, t.Transpose):
        return _is_cheap(node.x)
    return _Rewriter.is_constant(node) and node.shape == ()


class _Builder:
    def __init__(self, spec: t.TypedSpec, derivation: Derivation, reserved: Iterable[str]) -> None:
        self.spec = spec
        self.derivation = derivation
        self.names = Namer(reserved)
        self.stmts: list[Stmt] = []
        self.info: dict[str, Stmt] = {}
        self.section = "forward"
        self.tensor_vars: dict[str, str] = {}
        self.grad_vars: dict[str, str] = {}
        self.hoisted: dict[t.Node, str] = {}
        self.index_hoisted: dict[tuple, tuple[str, tuple[str, ...]]] = {}
        self.aranges: dict[tuple, str] = {}
        self.building: set[str] = set()
        self.emitted: set[str] = set()
        self.dim_vars = {name: self.names.take(name) for name in spec.dims}
        for name in spec.leaves:
            var = self.names.take(name)
            self.tensor_vars[name] = var
            self._argument(var, spec.tensors[name].shape, frozenset({name}))
        self.upstream: dict[str, str] = {}
        for out in spec.outputs:
            kw = f"grad_{out}"
            if kw in spec.tensors:
                raise CodegenError(f"tensor {kw} has the name of the keyword that passes grad({out}) to "
                                   f"backward(); rename it")
            self.upstream[out] = kw
        for name in spec.intermediates:  # the spec's names come first: they read best
            self.tensor_vars[name] = self.names.take(name)
        for out, kw in self.upstream.items():
            self.names.used.add(kw)
            self.grad_vars[out] = self.names.take(f"d{out}", f"grad_{out}_")
            self._argument(self.grad_vars[out], spec.tensors[out].shape, frozenset({kw}))

    def _argument(self, var: str, shape, sources) -> None:
        self.info[var] = Stmt(var, None, "argument", "", shape, None, sources, (), RETURNED)

    # --- values ---------------------------------------------------------------------------

    def tensor(self, name: str) -> Var:
        info = self.spec.tensors[name]
        if info.kind == "intermediate" and name not in self.emitted:
            self.emit_tensor(name)
        return Var(self.tensor_vars[name], info.shape)

    def grad(self, name: str) -> Var:
        if name not in self.grad_vars:
            raise CodegenError(f"grad({name}) is read before it is computed (a bug in symattn's ordering)")
        return Var(self.grad_vars[name], self.spec.tensors[name].shape)

    # Host protocol of IndexLowering
    def entry_var(self, tensor: str, grad: bool) -> str:
        return (self.grad(tensor) if grad else self.tensor(tensor)).name

    def scalar_var(self, node: t.Node) -> str:
        return (self.grad(node.name) if isinstance(node, t.Grad) else self.tensor(node.name)).name

    def arange_var(self, name: str, size) -> str:
        key = (name, size)
        if key not in self.aranges:
            var = self.names.take(name, f"{name}_index")
            self.aranges[key] = var
            self.add(var, Arange(size), "", shape=(size,), labels=(name,))
        return self.aranges[key]

    def hoist_index(self, key, free, make, ranges):
        if key not in self.index_hoisted:
            lnode = make()
            storage = lnode.labels
            canon = tuple(f"_f{free.index(n)}" for n in storage)
            var = self.names.numbered(self._temp_name(lnode))
            self.add(var, lnode, "", shape=tuple(ranges[n] for n in storage), labels=storage)
            self.index_hoisted[key] = (var, canon)
        return self.index_hoisted[key]

    @staticmethod
    def _temp_name(node) -> str:
        if isinstance(node, t.Binary) and node.op in ("mul", "div") and isinstance(node.a, (t.Tensor, t.Grad)) \
                and _Rewriter.is_constant(node.b):
            return f"{'d' if isinstance(node.a, t.Grad) else ''}{node.a.name}_scaled"
        if isinstance(node, t.MatMul) and all(isinstance(x, (t.Tensor, t.Grad)) for x in (node.a, node.b)):
            return "".join(("d" if isinstance(x, t.Grad) else "") + x.name for x in (node.a, node.b))
        if isinstance(node, LOp) and node.kind == "unary":
            return node.op
        if isinstance(node, (LContract, LSum)):
            return "contraction"
        if isinstance(node, t.Unary):
            return node.fn
        names = {t.MatMul: "product", t.Softmax: "weights", SoftmaxGrad: "dscores", t.Reduce: "total",
                 t.Binary: "term", t.SumTo: "total", t.Transpose: "transposed", t.Constant: "constant",
                 t.Where: "choice", t.MergeHeads: "merged", t.SplitHeads: "heads", t.Concat: "joined"}
        return names.get(type(node), "value")

    # --- lowering -----------------------------------------------------------------------

    def lower(self, node: t.Node) -> t.Node:
        if isinstance(node, t.Tensor):
            return self.tensor(node.name)
        if isinstance(node, t.Grad):
            return self.grad(node.name)
        if node in self.named:
            return self.tensor(self.named[node])
        if node in self.shared and not _is_cheap(node):
            return self.hoist(node)
        return self._lower_inner(node)

    def hoist(self, node: t.Node, name: str | None = None) -> Var:
        """`node` computed by a statement of its own."""
        if node not in self.hoisted:
            lowered = self._lower_inner(node)
            var = self.names.numbered(name or self._temp_name(node))
            self.hoisted[node] = var
            self.add(var, lowered, spec_text(node, self.spec.dims), shape=node.shape)
        return Var(self.hoisted[node], node.shape)

    def _lower_inner(self, node: t.Node) -> t.Node:
        if isinstance(node, t.IndexDef):
            return self.index.lower_def(node)
        if isinstance(node, t.Softmax) and isinstance(node.x, t.Binary):
            # the scores get a buffer of their own, so `+ M` and the softmax can work in place
            return dataclasses.replace(node, x=self.hoist(node.x, "scores"))
        return _rebuild(node, self.lower)

    def add(self, var: str, node, title: str, shape=(), labels=None, rewritten: bool = False) -> Stmt:
        notes = [n.note for n in _lwalk(node) if isinstance(n, SoftmaxGrad) and n.note]
        stmt = Stmt(var, node, self.section, title, shape, labels, self._sources(node), self._reads(node),
                    note="; ".join(dict.fromkeys(notes)), rewritten=rewritten or bool(notes))
        self.stmts.append(stmt)
        self.info[var] = stmt
        return stmt

    def _reads(self, node) -> tuple[str, ...]:
        out: list[str] = []
        for n in _lwalk(node):
            var = n.name if isinstance(n, Var) else n.var if isinstance(n, (LVar, LEntry, LScalarTensor)) else None
            if var is not None and var in self.info and var not in out:
                out.append(var)
        return tuple(out)

    def _sources(self, node) -> frozenset:
        found: set[str] = set()
        for var in self._reads(node):
            found |= self.info[var].sources
        return frozenset(found)

    # --- statements ----------------------------------------------------------------------

    def emit_tensor(self, name: str) -> None:
        if name in self.building:
            raise CodegenError(f"{name} depends on itself")
        self.building.add(name)
        info = self.spec.tensors[name]
        definition = self.forward_exprs[name]
        # the definition itself, not its name; an alias (`O = X`) is the other tensor's variable
        lowered = self.lower(definition) if isinstance(definition, (t.Tensor, t.Grad)) \
            else self._lower_inner(definition)
        dims = list(self.spec.dims)
        if isinstance(info.expr, t.IndexDef):
            idx = ", ".join(i.name for i in info.expr.indices)
            title = f"{name}[{idx}] = {to_spec(info.expr.body, dims)}"
        else:
            title = f"{name} = {to_spec(info.expr, dims)}"
        self.add(self.tensor_vars[name], lowered, title, shape=info.shape,
                 rewritten=self.forward_exprs[name] != info.expr)
        self.emitted.add(name)
        self.building.discard(name)

    def emit_grad(self, name: str, expr: t.Node) -> None:
        var = self.names.take(f"d{name}", f"grad_{name}")
        self.grad_vars[name] = var
        lowered = self.lower(expr)
        self.add(var, lowered, self.derivation.formula(name), shape=self.spec.tensors[name].shape,
                 rewritten=expr != self.derivation.gradients[name].expr)

    def build(self) -> Program:
        spec, derivation = self.spec, self.derivation
        # Which gradients the leaves need, in the order derived (consumers first).
        wanted: set[str] = set()
        stack = list(spec.leaves)
        while stack:
            name = stack.pop()
            expr = derivation.gradients[name].expr if name in derivation.gradients else None
            if expr is None:
                continue
            for ref in _grad_refs(expr):
                if ref not in wanted and ref not in spec.outputs:
                    wanted.add(ref)
                    stack.append(ref)
        order = [n for n in derivation.gradients if (n in wanted or n in spec.leaves) and n not in spec.outputs
                 and derivation.gradients[n].expr is not None]
        rewriter = _Rewriter(spec, derivation)
        self.forward_exprs = {name: rewriter(info.expr) for name, info in spec.tensors.items()
                              if info.expr is not None}
        rewriter.forward_exprs = self.forward_exprs
        backward_exprs = {name: rewriter(derivation.gradients[name].expr) for name in order}
        self.named = {expr: name for name, expr in self.forward_exprs.items() if not isinstance(expr, t.IndexDef)}
        self.shared = _shared_nodes(list(self.forward_exprs.values()) + list(backward_exprs.values()))
        index_defs = [n for e in list(self.forward_exprs.values()) + list(backward_exprs.values())
                      for n in _walk(e) if isinstance(n, t.IndexDef)]
        self.index = IndexLowering(self, count_shared(index_defs))

        # Forward: what the outputs need, in the spec's order.
        needed: set[str] = set()
        stack = list(spec.outputs)
        while stack:
            name = stack.pop()
            if name in needed or spec.tensors[name].expr is None:
                continue
            needed.add(name)
            stack.extend(_tensor_refs(spec.tensors[name].expr))
        for name in spec.intermediates:
            if name in needed and name not in self.emitted:
                self.emit_tensor(name)
        forward_count = len(self.stmts)
        self.section = "backward"
        for name in order:
            self.emit_grad(name, backward_exprs[name])
        leaf_grads = {name: self.grad_vars.get(name) for name in spec.leaves}

        program = Program(spec, derivation, self.stmts, forward_count, self.tensor_vars, self.grad_vars,
                          self.upstream, self.dim_vars, leaf_grads, names=self.names, info=self.info)
        _liveness(program)
        return program


def _lwalk(node):
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
        elif isinstance(n, t.Node):
            stack.extend(n.children)


def _shared_nodes(exprs: list[t.Node]) -> set[t.Node]:
    """Nodes that occur more than once over `exprs`, counted as a DAG (a repeat's children are not recounted)."""
    counts: Counter = Counter()

    def visit(node: t.Node) -> None:
        counts[node] += 1
        if counts[node] > 1 or isinstance(node, t.IndexDef):
            return
        for child in node.children:
            visit(child)

    for expr in exprs:
        visit(expr)
    return {node for node, n in counts.items() if n > 1}


def _liveness(program: Program) -> None:
    for k, stmt in enumerate(program.stmts):
        for var in stmt.reads:
            program.info[var].last_use = k
    for name, var in program.tensor_vars.items():
        if name in program.spec.outputs and var in program.info:
            program.info[var].last_use = RETURNED
    for var in program.leaf_grads.values():
        if var is not None:
            program.info[var].last_use = RETURNED


def build_program(spec: t.TypedSpec, derivation: Derivation | None = None,
                  reserved: Iterable[str] = ()) -> Program:
    """The straight-line program for `spec` (see the module docstring)."""
    if derivation is None:
        derivation = derive(spec)
    return _Builder(spec, derivation, reserved).build()
