"""A spec and its derivation as one straight-line program: what code generators print.

Contract: `build_program(spec)` returns a `Program`, the statements `var = node`
that compute the spec's outputs (the forward section) followed by those that
compute the gradient of every input and param (the backward section; a buffer
is an argument of both and has no gradient), in an
order where every value is computed before it is read. Nodes are typed-IR
nodes in which

- a value computed by an earlier statement is a `Var` (or, in index notation,
  an `LVar`): subexpressions that occur more than once, in the forward pass,
  the backward pass or both, are computed once, so the backward pass reuses
  what the forward pass computed (`P`, the `tanh` of additive attention);
- index notation is an `IndexArray` of whole-array operations (`symattn.codegen.index`);
- the rewrites in `REWRITES` have been applied: each states an identity that
  holds for all sizes and makes the program cheaper (a chain of matrix
  products in its cheapest order; the softmax backward recognised as one
  operation, and in an attention core computed with `sum(grad(O) * O)`
  instead of `sum(grad(P) * P)`; a scalar factor of a matrix product applied
  to its smallest operand). Where cost depends on sizes, the spec's default
  sizes stand in for the sizes at run time; every choice is exact for all.

Each statement also records which leaves' batch axes its value may carry and
the last statement that reads it, so a printer can decide what to compute in
place, and, for a tensor or a gradient, its expression as the spec or the
derivation states it (`defines`), which the CUDA target lowers to kernels. Python identifiers are chosen here (`Namer`): the spec's own names,
`dX` for grad(X), and names that never collide with each other, with Python
keywords or with the printer's reserved names. Nothing here is NumPy-specific.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable

import sympy

from ..ir import typed as t
from ..symbolic.derive import Derivation, derive
from ..ir.printing import to_spec
from .index import IndexLowering, LEntry, LScalarTensor, LVar, count_shared
from .index import LContract, LOp, LSum
from .program_ir import (RETURNED, Arange, CodegenError, Definition, DropoutBase, DropoutMask, FusedAttention,
                         FusedAttentionGrad, Namer, Program, SoftmaxGrad, Stmt, Var, rebuild, spec_text, walk_labelled)
from .rewrites import REWRITES, Rewriter

__all__ = ["CodegenError", "Var", "SoftmaxGrad", "Arange", "Definition", "Stmt", "Program", "Namer", "build_program",
           "OnePass", "one_pass", "REWRITES", "spec_text"]


# --- the builder ------------------------------------------------------------------------


def _tensor_refs(node: t.Node) -> list[str]:
    out = []
    for n in t.walk(node):
        name = n.name if isinstance(n, t.Tensor) else n.tensor if isinstance(n, t.Entry) and not n.grad else None
        if name is not None and name not in out:
            out.append(name)
    return out


def _grad_refs(node: t.Node) -> list[str]:
    out = []
    for n in t.walk(node):
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
    return Rewriter.is_constant(node) and node.shape == ()


class _Builder:
    def __init__(self, spec: t.TypedSpec, derivation: Derivation, reserved: Iterable[str], fused=None) -> None:
        self.spec = spec
        self.fused = fused
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
        for name in spec.given:
            var = self.names.take(name)
            self.tensor_vars[name] = var
            if spec.tensors[name].dropout is None:  # a dropout mask is drawn (`mask`), not given
                self._argument(var, spec.tensors[name].shape, frozenset({name}))
        self.seed = None
        if spec.dropouts:  # `seed`, unless the spec names something so
            self.seed = self.names.take(spec.seed_keyword)
            if self.seed != spec.seed_keyword:
                raise CodegenError(f"the seed keyword {spec.seed_keyword} is a name the generated code reserves")
            self._argument(self.seed, (), frozenset())
        self.upstream: dict[str, str] = {}
        for out in spec.outputs:
            self.upstream[out] = f"grad_{out}"
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
        if info.dropout is not None and name not in self.emitted:
            self.mask(name)
        return Var(self.tensor_vars[name], info.shape)

    def mask(self, name: str) -> None:
        """The statement that draws dropout's mask `name` for the value it multiplies: x of D = x * mask / (1 - p)
        (`symattn.front.dropout`), whose runtime shape it takes."""
        info = self.spec.tensors[name]
        what = f"the 0/1 mask of {info.dropout.of} = dropout(..., {info.dropout.p_text})"
        core = next((c for c in (self.fused.cores.values() if self.fused is not None else ())
                     if name in c.read_tensors), None)
        if core is not None:  # drawn per entry inside the core: only each batch entry's first position
            tensors = self.spec.tensors
            sources = tuple((self.tensor(n), len(tensors[n].shape)) for n in (core.q, core.k, *core.read_tensors)
                            if n not in core.drawn)
            node = DropoutBase(sympy.Mul(*tensors[info.dropout.of].shape), sources)
            self.add(self.tensor_vars[name], node, f"{name}: (where each batch entry's positions start, the seed) for "
                     f"{what}, drawn inside the fused core", shape=(sympy.Integer(2),))
        else:
            like = self.lower(t.dropped(self.spec, name))
            node = DropoutMask(like, info.dropout.stream, info.dropout.threshold, info.shape)
            self.add(self.tensor_vars[name], node, f"{name}: {what}, drawn from {self.seed}", shape=info.shape)
        self.emitted.add(name)

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
                and Rewriter.is_constant(node.b):
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
                 t.Where: "choice", t.MergeHeads: "merged", t.SplitHeads: "heads", t.Concat: "joined",
                 t.Scan: "running"}
        return names.get(type(node), "value")

    # --- lowering -----------------------------------------------------------------------

    def lower(self, node: t.Node) -> t.Node:
        if isinstance(node, t.Tensor):
            return self.tensor(node.name)
        if isinstance(node, t.Grad):
            return self.grad(node.name)
        if node in self.named:
            return self.tensor(self.named[node])
        if isinstance(node, FusedAttentionGrad):
            return self.hoist(node, f"grads_{node.core}", f"grad({node.core}) back through the attention core")
        if node in self.shared and not _is_cheap(node):
            return self.hoist(node)
        return self._lower_inner(node)

    def hoist(self, node: t.Node, name: str | None = None, title: str | None = None) -> Var:
        """`node` computed by a statement of its own."""
        if node not in self.hoisted:
            lowered = self._lower_inner(node)
            var = self.names.numbered(name or self._temp_name(node))
            self.hoisted[node] = var
            self.add(var, lowered, title or spec_text(node, self.spec.dims), shape=node.shape)
        return Var(self.hoisted[node], node.shape)

    def _lower_inner(self, node: t.Node) -> t.Node:
        if isinstance(node, t.IndexDef):
            return self.index.lower_def(node)
        if isinstance(node, t.Scatter) and any(isinstance(s, t.Node) for s in node.targets):
            targets = self.index.lower_subscripts(node.targets, node.x.indices)
            return dataclasses.replace(rebuild(node, self.lower), targets=targets)
        if isinstance(node, t.Softmax) and isinstance(node.x, t.Binary):
            # the scores get a buffer of their own, so `+ M` and the softmax can work in place
            return dataclasses.replace(node, x=self.hoist(node.x, "scores"))
        return rebuild(node, self.lower)

    def add(self, var: str, node, title: str, shape=(), labels=None, rewritten: bool = False,
            defines: Definition | None = None) -> Stmt:
        notes = [n.note for n in walk_labelled(node) if isinstance(n, SoftmaxGrad) and n.note]
        stmt = Stmt(var, node, self.section, title, shape, labels, self._sources(node), self._reads(node),
                    note="; ".join(dict.fromkeys(notes)), rewritten=rewritten or bool(notes), defines=defines)
        self.stmts.append(stmt)
        self.info[var] = stmt
        return stmt

    def _reads(self, node) -> tuple[str, ...]:
        out: list[str] = []
        for n in walk_labelled(node):
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
        if self.fused is not None and name in self.fused.titles:
            title = self.fused.titles[name]
        elif isinstance(info.expr, t.IndexDef):
            idx = ", ".join(i.name for i in info.expr.indices)
            title = f"{name}[{idx}] = {to_spec(info.expr.body, dims)}"
        else:
            title = f"{name} = {to_spec(info.expr, dims)}"
        self.add(self.tensor_vars[name], lowered, title, shape=info.shape,
                 rewritten=self.forward_exprs[name] != info.expr, defines=Definition(name, False, info.expr))
        self.emitted.add(name)
        self.building.discard(name)

    def emit_grad(self, name: str, expr: t.Node) -> None:
        var = self.names.take(f"d{name}", f"grad_{name}")
        self.grad_vars[name] = var
        lowered = self.lower(expr)
        derived = self.derivation.gradients[name].expr
        self.add(var, lowered, self.derivation.one_line(name), shape=self.spec.tensors[name].shape,
                 rewritten=expr != derived, defines=Definition(name, True, derived))

    def gradient(self, name: str) -> t.Node | None:
        """grad(name) as derived; for a fused program, with the paths through an attention core fused."""
        if self.fused is not None and name in self.fused.gradients:
            return self.fused.gradients[name]
        if self.fused is not None and name in self.fused.absorbed:
            return None
        gradient = self.derivation.gradients.get(name)
        return None if gradient is None else gradient.expr

    def build(self) -> Program:
        spec, derivation = self.spec, self.derivation
        # Which gradients the inputs and params need, in the order derived (consumers first).
        wanted: set[str] = set()
        stack = list(spec.differentiable)
        while stack:
            name = stack.pop()
            expr = self.gradient(name)
            if expr is None:
                continue
            for ref in _grad_refs(expr):
                if ref not in wanted and ref not in spec.outputs:
                    wanted.add(ref)
                    stack.append(ref)
        order = [n for n in derivation.gradients
                 if (n in wanted or n in spec.differentiable) and n not in spec.outputs
                 and self.gradient(n) is not None]
        rewriter = Rewriter(spec, derivation)
        self.forward_exprs = {name: rewriter(info.expr) for name, info in spec.tensors.items()
                              if info.expr is not None}
        rewriter.forward_exprs = self.forward_exprs
        backward_exprs = {name: rewriter(self.gradient(name)) for name in order}
        if self.fused is not None:
            self.forward_exprs.update(self.fused.forward)
        self.named = {expr: name for name, expr in self.forward_exprs.items() if not isinstance(expr, t.IndexDef)}
        self.shared = _shared_nodes(list(self.forward_exprs.values()) + list(backward_exprs.values()))
        # the value a dropout mask takes its shape from is computed once, for the mask and its product
        self.shared |= {t.dropped(spec, m) for m in spec.dropouts}
        index_defs = [n for e in list(self.forward_exprs.values()) + list(backward_exprs.values())
                      for n in t.walk(e) if isinstance(n, t.IndexDef)]
        self.index = IndexLowering(self, count_shared(index_defs))

        # Forward: what the outputs need, in the spec's order.
        needed: set[str] = set()
        stack = list(spec.outputs)
        while stack:
            name = stack.pop()
            if name in needed or spec.tensors[name].expr is None:
                continue
            needed.add(name)
            fused = self.fused.forward.get(name) if self.fused is not None else None
            stack.extend(_tensor_refs(fused or spec.tensors[name].expr))
        for name in spec.intermediates:
            if name in needed and name not in self.emitted:
                self.emit_tensor(name)
        forward_count = len(self.stmts)
        self.section = "backward"
        for name in order:
            self.emit_grad(name, backward_exprs[name])
        leaf_grads = {name: self.grad_vars.get(name) for name in spec.differentiable}

        program = Program(spec, derivation, self.stmts, forward_count, self.tensor_vars, self.grad_vars,
                          self.upstream, self.dim_vars, leaf_grads, names=self.names, info=self.info,
                          cores=dict(self.fused.cores) if self.fused is not None else {}, seed=self.seed)
        _liveness(program)
        return program


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
                  reserved: Iterable[str] = (), fused=None) -> Program:
    """The straight-line program for `spec` (see the module docstring); with `fused`, a
    `symattn.codegen.fused.FusedPlan` of `spec`, each attention core is one fused operation."""
    if derivation is None:
        derivation = derive(spec)
    return _Builder(spec, derivation, reserved, fused).build()


# --- one pass per attention core --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OnePass:
    """A fused program reordered for a pass that has the outputs' gradients from the start: the statements of
    `program` (a copy: its own statements, liveness and names) in an order where each core of `cores`
    has its `FusedAttentionGrad` right after its `FusedAttention`, so that a printer can compute both in
    one pass over the scores (`_flash_forward_backward`)."""

    program: Program
    cores: frozenset[str]


def one_pass(program: Program) -> OnePass | None:
    """`program` (built with a fused plan) reordered so that each core whose output's gradient does not depend
    on the core's output (no path from it into grad(output)'s statements: the output is a spec output,
    or only linear maps follow it) runs forward and backward at once; None when no core can.

    Each such core in turn: every statement its backward reads, through any chain, except its own forward
    (with each core already paired kept whole with its partner), then the core's forward and backward,
    then the rest, each part in the order it had; that order reads nothing before it is computed, since
    the first part holds everything it reads. The statements are copies, their liveness recomputed
    for the new order, and the names a `Namer` copy, so that printing the copy leaves `program` as it was."""
    stmts = program.stmts
    producer = {s.var: k for k, s in enumerate(stmts)}
    reads = [{producer[r] for r in s.reads if r in producer} for s in stmts]
    readers: list[set[int]] = [set() for _ in stmts]
    for k, rs in enumerate(reads):
        for r in rs:
            readers[r].add(k)

    def closure(start: set[int], edges: list[set[int]]) -> set[int]:
        seen, stack = set(), list(start)
        while stack:
            k = stack.pop()
            if k not in seen:
                seen.add(k)
                stack.extend(edges[k])
        return seen

    forward = {s.node.core: k for k, s in enumerate(stmts) if isinstance(s.node, FusedAttention)}
    backward = {s.node.core: k for k, s in enumerate(stmts) if isinstance(s.node, FusedAttentionGrad)}
    order, pairs = list(range(len(stmts))), {}
    for core, f in sorted(forward.items(), key=lambda item: item[1]):
        g = backward.get(core)
        if g is None:
            continue
        node = stmts[g].node  # what it reads but its own output o: q, k, v and do
        used = {n.name for child in (node.q, node.k, node.v, node.do) for n in walk_labelled(child)
                if isinstance(n, Var)}
        before = closure({producer[v] for v in used if v in producer}, reads) | closure(reads[f], reads)
        grown = True
        while grown:  # a pair already made moves whole
            grown = False
            for pf, pg in pairs.values():
                if (pf in before) != (pg in before):
                    before |= closure({pf, pg}, reads)
                    grown = True
        if before & closure({f, g}, readers):  # do reads the core's output
            continue
        order = [k for k in order if k in before] + [f, g] + [k for k in order if k not in before and k not in (f, g)]
        pairs[core] = (f, g)
    if not pairs:
        return None
    info = {var: dataclasses.replace(s) for var, s in program.info.items()}
    new = [info[stmts[k].var] for k in order]  # (each statement is its variable's, `_Builder.stmt`)
    for stmt in new:
        if stmt.section != "argument":
            stmt.last_use = -1
    names = Namer(())
    names.used = set(program.names.used)
    copy = dataclasses.replace(program, stmts=new, info=info, names=names)
    _liveness(copy)
    return OnePass(copy, frozenset(pairs))
