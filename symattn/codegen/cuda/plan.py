"""Lower a spec's program to CUDA: the buffers, and the kernels that fill them, in order.

Contract: `lower(program, cores)` turns the shared program IR
(`symattn.codegen.program_ir.Program`, built by `build_program`) into a
`KernelPlan`; `plan(spec, fused=True)` builds the program and lowers it. The
kernels lower what each statement of the program computes (`Stmt.defines`:
a tensor's definition, a gradient as derived), not its array-level form
(`Stmt.node`, what NumPy prints): a kernel fuses elementwise work that the
program splits into statements, and runs index notation as loops. The forward
computes, in the spec's order, every tensor that an output or the backward
needs (also one that the program computes in its backward section, where
only the backward reads it); the backward computes `grad(T)` for every
tensor that depends on an input or param, in the order derived, and ends
with the gradient of each input and param. (The program has no statement for
a gradient that no input's or param's gradient reads; its kernel lowers the
derivation's expression.) Every named tensor of the spec is one kernel (and one
buffer); inside a kernel, elementwise operations are fused into one
expression, and a subexpression that needs its own launch (a matrix product,
reduction, softmax or index-notation sum that is not the kernel's own root)
gets a temporary buffer and its own kernel first, shared by every later
kernel that reads the same subexpression (the backward reuses what the
forward computed). A root that is elementwise over matrix products of its own
shape (`grad(X) = grad(Q) @ W_q.T + grad(K) @ W_k.T + ...`) is one tiled
matmul kernel with several accumulators and the elementwise epilogue.

With `fused=True`, each attention core (`symattn.codegen.cuda.core`) is computed by
the fused kernels (`symattn.codegen.cuda.flash`): its intermediates (S, P) are
never stored, and the derivation's contributions through the core are replaced
by the dQ, dK, dV the fused backward writes.

Batch: every input, buffer, output and intermediate has a leading batch axis
(the launch functions' `batch` argument); params have none, so their gradients
are computed per batch entry and summed at the end. A buffer is an argument of
both passes and has no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...ir import build as b
from ...ir import typed as t
from ...ir.gather import gather_forms
from ...ir.printing import to_spec
from ..program import build_program
from ..program_ir import Program, Stmt
from . import flash, tensor_core
from .core import AttentionCore, accumulators, find_cores, read_again, substitute, whole_gradient, written_sum
from .kernels import (Buffer, Kernel, MatmulTerm, batch_sum_kernel, column_reduction, map_kernel, matmul_kernel,
                      reduce_kernel, scan_kernel, softmax_kernel)
from .names import CNames, c_identifier
from .syntax import CPrinter, CudaCodegenError, align, dim_c, offset_c

__all__ = ["KernelPlan", "Stored", "Unfusable", "lower", "plan"]

_HEAVY = (t.MatMul, t.Reduce, t.Softmax, t.SumTo, t.IndexDef, t.Scan)


@dataclass(frozen=True, slots=True)
class Stored(t.Node):
    """A value a fused kernel writes: the gradient of a core operand (`role` is q, k or v)."""

    core: str
    role: str
    shape: tuple


@dataclass
class KernelPlan:
    """The lowered program: the buffers, and the kernels that fill them, in launch order."""

    spec: t.TypedSpec                # the spec as planned (core operands named)
    prefix: str                      # the C name of the spec: prefix of every exported symbol
    names: CNames
    dims: list[str]                  # C names of the dim arguments, in declaration order
    batch: str                       # C name of the batch argument
    workspace_arg: str               # C names of the workspace and stream arguments
    stream_arg: str
    inputs: list[Buffer]             # forward arguments: the given tensors (inputs, params, buffers)
    outputs: list[Buffer]
    upstream: list[Buffer]           # backward: grad(O) for each output
    gradients: list[Buffer]          # backward results: grad of each input and param (not of a buffer)
    workspace: list[Buffer]
    forward: list[Kernel]
    backward: list[Kernel]
    cores: list[AttentionCore]
    notes: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)   # device functions emitted before the kernels
    tensor_cores: list[tensor_core.TensorCoreForward] = field(default_factory=list)  # each core on tensor cores

    @property
    def path(self) -> str:
        return "fused" if self.cores else "generic"


class _Scope:
    """The memory reads of one kernel, in first-use order (they become its parameters)."""

    def __init__(self, planner: "_Planner") -> None:
        self.planner = planner
        self.reads: list[Buffer] = []

    def read(self, node, coords):
        buffer = self.planner.lookup(node)
        if buffer is None:
            return None
        if buffer not in self.reads:
            self.reads.append(buffer)
        return f"{buffer.name}[{offset_c(coords, buffer.shape, self.planner.names)}]"


class _Planner:
    def __init__(self, program: Program, cores: list[AttentionCore], names: CNames, prefix: str) -> None:
        spec = self.spec = program.spec
        self.cores = {c.output: c for c in cores}
        self.names = names
        self.prefix = prefix
        self.order = list(spec.dims)
        self.dims = [names.spec("dim", d) for d in spec.dims]
        self.batch = names.fresh("batch")
        self.workspace_arg = names.fresh("workspace")
        self.stream_arg = names.fresh("stream")
        self.buffers: dict[tuple, Buffer] = {}
        self.temps: dict[t.Node, Buffer] = {}
        self.kernels: list[Kernel] = []
        self.helpers: list[str] = []
        self.tensor_cores: list[tensor_core.TensorCoreForward] = []
        self.phase = "forward"
        self.stage = ""
        self.derivation = program.derivation
        self.wholes: dict[t.Node, t.Node] = {}  # an output read again: its paths' sum -> the fused one
        self.definitions: dict[str, Stmt] = {}  # tensor -> the statement that computes it
        self.derived: dict[str, t.Node] = {}    # tensor -> its gradient, as derived
        for stmt in program.stmts:
            if stmt.defines is None:
                continue  # a temporary of the array-level form
            if stmt.defines.grad:
                self.derived[stmt.defines.tensor] = stmt.defines.expr
            else:
                self.definitions[stmt.defines.tensor] = stmt
        self.core_of = {}
        for core in cores:
            for owner in (*core.chain, core.output):
                self.core_of[owner] = core
        self.done_backward: set[str] = set()
        self.lead_names: dict[str, list[str]] = {}   # core output -> its head coordinate names
        self.core_prefix: dict[str, str] = {}        # core output -> prefix of its kernels

    # --- buffers -------------------------------------------------------------------------

    def _user(self, key, name, shape, batched, kind, note) -> Buffer:
        buffer = Buffer(name, shape, batched, kind, note)
        self.buffers[key] = buffer
        return buffer

    def _workspace(self, base: str, shape, note: str) -> Buffer:
        return Buffer(self.names.fresh(base), tuple(shape), True, "workspace", note, self.phase)

    def arguments(self) -> None:
        spec, n = self.spec, self.names
        self.inputs = [self._user(("tensor", x), n.spec("tensor", x), spec.tensors[x].shape,
                                  spec.tensors[x].kind != "param", spec.tensors[x].kind, spec.tensors[x].kind)
                       for x in spec.given]
        self.outputs = [self._user(("tensor", o), n.spec("tensor", o), spec.tensors[o].shape, True, "output",
                                   "output") for o in spec.outputs]
        self.upstream = [self._user(("grad", o), n.fresh(f"grad_{n.spec('tensor', o)}"), spec.tensors[o].shape, True,
                                    "upstream", f"grad({o})") for o in spec.outputs]
        self.gradients = [Buffer(n.fresh(f"grad_{n.spec('tensor', x)}"), spec.tensors[x].shape,
                                 spec.tensors[x].kind == "input", "grad", f"grad({x})") for x in spec.differentiable]

    def tensor_buffer(self, name: str) -> Buffer:
        key = ("tensor", name)
        if key not in self.buffers:
            info = self.spec.tensors[name]
            self.buffers[key] = Buffer(self.names.spec("tensor", name), tuple(info.shape), True, "workspace",
                                       f"{name} (forward, kept for the backward)", self.phase)
        return self.buffers[key]

    def grad_buffer(self, name: str) -> Buffer:
        key = ("grad", name)
        if key not in self.buffers:
            info = self.spec.tensors[name]
            if info.kind == "input":
                buffer = self.gradients[self.spec.differentiable.index(name)]
            elif info.kind == "param":
                buffer = self._workspace(f"grad_{self.names.spec('tensor', name)}_per_entry", info.shape,
                                         f"grad({name}) for each batch entry, summed into the result at the end")
            else:
                buffer = self._workspace(f"grad_{self.names.spec('tensor', name)}", info.shape, f"grad({name})")
            self.buffers[key] = buffer
        return self.buffers[key]

    def lookup(self, node: t.Node) -> Buffer | None:
        if isinstance(node, t.Tensor):
            buffer = self.buffers.get(("tensor", node.name))
            if buffer is None:
                raise CudaCodegenError(f"internal: {node.name} is read before a kernel computes it")
            return buffer
        if isinstance(node, t.Grad):
            buffer = self.buffers.get(("grad", node.name))
            if buffer is None:
                raise CudaCodegenError(f"internal: grad({node.name}) is read before a kernel computes it")
            return buffer
        if isinstance(node, Stored):
            return self.buffers[("stored", node.core, node.role)]
        return self.temps.get(node)

    # --- kernels for one expression ------------------------------------------------------

    def _kernel_name(self, target: Buffer) -> str:
        return self.names.fresh(f"{self.prefix}_{target.name}")

    def _prepare(self, node: t.Node, skip=()) -> None:
        """Give every subexpression that needs its own launch a buffer and a kernel, first."""
        stack = [node]
        while stack:
            n = stack.pop()
            if any(n is s for s in skip):
                continue
            if isinstance(n, Stored):
                self._core_backward(self.cores[n.core])
            elif isinstance(n, _HEAVY):
                self._temp(n)
            else:
                stack.extend(n.children)

    def _temp(self, node: t.Node) -> Buffer:
        if node not in self.temps:
            buffer = self._workspace(f"{self.stage}_part", node.shape, _grad_text(node, self.order))
            self.compute(buffer, node, [f"{buffer.name} = {_grad_text(node, self.order)}"])
            self.temps[node] = buffer
        return self.temps[node]

    def compute(self, out: Buffer, expr: t.Node, comment: list[str]) -> None:
        if isinstance(expr, t.IndexDef):
            self._prepare(expr.body)
            return self._index(out, expr, comment)
        if isinstance(expr, t.Softmax):
            self._prepare(expr.x)
            return self._softmax(out, expr, comment)
        if isinstance(expr, (t.Reduce, t.SumTo)):
            self._prepare(expr.x)
            return self._reduce(out, expr, comment)
        if isinstance(expr, t.Scan):
            self._prepare(expr.x)
            return self._scan(out, expr, comment)
        products = accumulators(expr)
        if products:
            self._prepare(expr, skip=products)
            for node in products:
                m = node.x if isinstance(node, t.SumTo) else node
                self._prepare(m.a)
                self._prepare(m.b)
            return self._matmul(out, expr, products, comment)
        self._prepare(expr)
        return self._map(out, expr, comment)

    def _emit(self, kernel: Kernel) -> None:
        self.kernels.append(kernel)

    def _map(self, out, expr, comment):
        scope = _Scope(self)
        coords = _coords("i", out.shape)
        printer = CPrinter(self.names, scope)
        value = printer.entry(expr, coords)
        self._emit(map_kernel(self._kernel_name(out), comment, out, scope.reads, self.dims, coords,
                              printer.statements, value, self.names, self.batch, self.phase))

    def _index(self, out, expr: t.IndexDef, comment):
        scope = _Scope(self)
        coords = [self.names.spec("index", i.name) for i in expr.indices]
        printer = CPrinter(self.names, scope, indices={i.name: c for i, c in zip(expr.indices, coords)})
        value = printer.entry(expr.body)
        self._emit(map_kernel(self._kernel_name(out), comment, out, scope.reads, self.dims, coords,
                              printer.statements, value, self.names, self.batch, self.phase))

    def _reduce(self, out, expr, comment):
        x = expr.x
        rank = len(x.shape)
        if isinstance(expr, t.Reduce):
            kind = expr.kind
            reduced = list(range(rank)) if expr.axis is None else [expr.axis]
            where = {k: k for k in range(rank)}
        else:
            kind = "sum"
            reduced = list(expr.axes)
            lead = rank - len(expr.shape)
            where = {k: k - lead for k in range(lead, rank)}
        out_coords = _coords("o", out.shape)
        red_coords = _coords("r", [x.shape[k] for k in reduced])
        x_coords = [red_coords[reduced.index(k)] if k in reduced else out_coords[where[k]] for k in range(rank)]
        scope = _Scope(self)
        printer = CPrinter(self.names, scope)
        value = printer.entry(x, x_coords)
        _no_statements(printer)
        red_shape = [x.shape[k] for k in reduced]
        if rank and rank - 1 not in reduced:
            # A column reduction (the last axis kept): one thread per output entry loops over the
            # reduced entries, and neighbouring threads read neighbouring memory.
            statements = column_reduction(kind, red_coords, red_shape, value, self.names)
            self._emit(map_kernel(self._kernel_name(out), comment, out, scope.reads, self.dims, out_coords,
                                  statements, "total_", self.names, self.batch, self.phase))
            return
        self._emit(reduce_kernel(self._kernel_name(out), comment, out, scope.reads, self.dims, out_coords, red_coords,
                                 red_shape, value, kind, self.names, self.batch, self.phase))

    def _line_kernel(self, make, out, expr, comment, *extra):
        """A kernel that walks whole lines of `expr.x` along `expr.axis` (softmax, cumsum): `make` gets
        the line's coordinates, the axis coordinate, its length, the entry and the output offset."""
        x, axis = expr.x, expr.axis
        coords = _coords("i", x.shape)
        coords[axis] = f"i{axis}_"
        scope = _Scope(self)
        printer = CPrinter(self.names, scope)
        value = printer.entry(x, coords)
        _no_statements(printer)
        line_coords = [c for k, c in enumerate(coords) if k != axis]
        line_shape = [d for k, d in enumerate(x.shape) if k != axis]
        self._emit(make(self._kernel_name(out), comment, out, scope.reads, self.dims, line_coords,
                        coords[axis], dim_c(x.shape[axis], self.names), value,
                        offset_c(coords, out.shape, self.names), self.names, self.batch, self.phase,
                        line_shape, *extra))

    def _softmax(self, out, expr: t.Softmax, comment):
        self._line_kernel(softmax_kernel, out, expr, comment)

    def _scan(self, out, expr: t.Scan, comment):
        self._line_kernel(scan_kernel, out, expr, comment, expr.reverse)

    def _matmul(self, out, expr, accumulators, comment):
        for node in accumulators:
            m = node.x if isinstance(node, t.SumTo) else node
            if len(m.a.shape) < 2 or len(m.b.shape) < 2:
                raise CudaCodegenError("@ with a 1-D operand is not generated yet; write the vector as a [1, n] "
                                       "or [n, 1] matrix")
        lead_shape = tuple(out.shape[:-2])
        lead = _coords("z", lead_shape)
        special = {m: f"acc{k}_[r_][c_]" for k, m in enumerate(accumulators)}
        scope = _Scope(self)
        printer = CPrinter(self.names, scope, special=special)
        terms = []
        for node in accumulators:
            k = len(terms)
            outer = ()
            m_lead_shape, m_lead = lead_shape, lead
            if isinstance(node, t.SumTo):  # the summed leading axes become loops around the contraction
                m = node.x
                summed = len(m.shape) - len(node.shape)
                outer = tuple((f"s{k}{j}_", dim_c(m.shape[j], self.names)) for j in range(summed))
                m_lead_shape = tuple(m.shape[:-2])
                m_lead = [c for c, _ in outer] + list(lead)
            else:
                m = node
            a_lead = align(m.a.shape[:-2], m_lead_shape, m_lead)
            b_lead = align(m.b.shape[:-2], m_lead_shape, m_lead)
            terms.append(MatmulTerm(f"acc{k}_", _grad_text(node, self.order), dim_c(m.a.shape[-1], self.names),
                                    printer.entry(m.a, (*a_lead, "row_", "k_")),
                                    printer.entry(m.b, (*b_lead, "k_", "col_")), outer))
        value = printer.entry(expr, (*lead, "row_", "col_"))
        _no_statements(printer)
        self._emit(matmul_kernel(self._kernel_name(out), comment, out, scope.reads, self.dims, lead, lead_shape,
                                 dim_c(out.shape[-2], self.names), dim_c(out.shape[-1], self.names), terms, value,
                                 self.names, self.batch, self.phase))

    # --- the fused attention cores -------------------------------------------------------

    def _core_prefix(self, core: AttentionCore) -> str:
        return self.names.fresh(f"{self.prefix}_{self.names.spec('tensor', core.output)}_attn")

    def core_forward(self, core: AttentionCore) -> None:
        prefix = self._core_prefix(core)
        self.core_prefix[core.output] = prefix
        text, lead = flash.score_functions(core, prefix, self.names, self.dims, self.order)
        self.lead_names[core.output] = lead
        self.helpers.append(text)
        out = self.tensor_buffer(core.output)
        lse = self._workspace(f"{out.name}_lse", (*core.lead, core.n_q),
                              f"row logsumexp of the scores of {core.output} (forward, kept for the backward)")
        self.buffers[("lse", core.output)] = lse
        formula = f"{core.output} = softmax({to_spec(core.score, self.order)}, axis=-1) @ {core.v}"
        self._emit(flash.forward_kernels(core, prefix, self.tensor_buffer(core.q), self.tensor_buffer(core.k),
                                         self.tensor_buffer(core.v), out, lse, self.names, self.dims, lead,
                                         self.batch, formula))
        self.tensor_cores.append(tensor_core.forward(core, prefix, self.names, self.dims, lead, self.batch, formula))

    def _core_backward(self, core: AttentionCore) -> None:
        if core.output in self.done_backward:
            return
        self.done_backward.add(core.output)
        out = self.tensor_buffer(core.output)
        d_out = self.lookup(t.Grad(core.output, ()))
        if read_again(self.derivation, core.output):
            whole = self.whole(core.output)
            d_out = self._workspace(f"grad_{out.name}_whole", whole.shape, f"grad({core.output}), all of it (backward)")
            self.compute(d_out, whole, [f"grad({core.output}) = {_grad_text(whole, self.order)}"])
        delta = self._workspace(f"{out.name}_delta", (*core.lead, core.n_q),
                                f"rowsum(grad({core.output}) * {core.output}) (backward)")
        grads = [self.buffers[("stored", core.output, role)] for role in "qkv"]
        self.kernels.extend(flash.backward_kernels(
            core, self.core_prefix[core.output], self.tensor_buffer(core.q), self.tensor_buffer(core.k),
            self.tensor_buffer(core.v), out, d_out, self.buffers[("lse", core.output)], delta, *grads,
            self.names, self.dims, self.lead_names[core.output], self.batch))

    # --- the passes ----------------------------------------------------------------------

    def definition(self, name: str) -> Stmt:
        stmt = self.definitions.get(name)
        if stmt is None:
            raise CudaCodegenError(f"internal: a kernel reads {name}, which no statement of the program computes")
        return stmt

    def gradient_exprs(self) -> dict[str, t.Node | None]:
        """grad(T) for every T that depends on a leaf, in the order derived: the program's statement for it,
        with the paths through a fused core replaced by Stored."""
        spec = self.spec
        depends = set(spec.differentiable)
        for name, info in spec.tensors.items():
            if info.expr is not None and any(r in depends for r in t.tensors_read(info.expr)):
                depends.add(name)
        absorbed = {n for core in self.cores.values() for n in core.chain}
        for name, gradient in self.derivation.gradients.items():  # (later tensors first: readers before)
            if read_again(self.derivation, name) and any(owner in self.core_of for owner, _ in gradient.paths):
                self.wholes[written_sum(gradient.paths)] = self.whole(name)  # its sum in its readers' gradients
        exprs: dict[str, t.Node | None] = {}
        for name, gradient in self.derivation.gradients.items():
            if name not in depends or name in absorbed or name in spec.outputs:
                continue
            if not any(owner in self.core_of for owner, _ in gradient.paths):
                # The program has no statement for a leaf's gradient of zero (None), nor for a gradient
                # that no leaf's gradient reads (M of `where(X @ W > 0, 0, -inf)`: the comparison passes
                # nothing on to X); for those the derivation's expression stands in.
                expr = self.derived.get(name, gradient.expr)  # a scatter in its gather form, one entry a thread
                expr = substitute(expr, self.wholes) if expr is not None and self.wholes else expr
                exprs[name] = None if expr is None else gather_forms(expr, solve=True)
                continue
            exprs[name] = self.whole(name)
        return exprs

    def whole(self, name: str) -> t.Node | None:
        """grad(name), every path summed, those through a fused core as what its kernel stores (`Stored`), a
        scatter in its gather form (one entry a thread)."""
        return whole_gradient(name, self.derivation.gradients[name].paths, self.core_of, self.cores.values(),
                              lambda core, index: Stored(core.output, "qkv"[index], self.spec.tensors[name].shape),
                              self.wholes, lambda part: gather_forms(part, solve=True))

    def live(self, grads: dict[str, t.Node | None]) -> set[str]:
        """The tensors the forward must compute: what the outputs and the backward read."""
        need = set(self.spec.outputs)
        wholes = [self.whole(c.output) for c in self.cores.values() if read_again(self.derivation, c.output)]
        for expr in [*grads.values(), *wholes]:  # (what flows back into a core from an output others read)
            if expr is None:
                continue
            need.update(t.tensors_read(expr))
            for stored in (n for n in t.walk(expr) if isinstance(n, Stored)):
                core = self.cores[stored.core]
                need.update((core.output, core.q, core.k, core.v))
        for name in reversed(list(self.spec.tensors)):
            if name in need and self.spec.tensors[name].expr is not None:
                core = self.cores.get(name)
                need.update((core.q, core.k, core.v) if core else t.tensors_read(self.definition(name).defines.expr))
        absorbed = {n for core in self.cores.values() for n in core.chain}
        if need & absorbed:
            raise Unfusable(f"{', '.join(sorted(need & absorbed))} is needed outside the attention core")
        return need

    def forward(self, live: set[str]) -> None:
        self.phase = "forward"
        for name, info in self.spec.tensors.items():
            if info.expr is None or name not in live:
                continue
            self.stage = self.names.spec("tensor", name)
            if name in self.cores:
                self.core_forward(self.cores[name])
            else:
                stmt = self.definition(name)
                self.compute(self.tensor_buffer(name), stmt.defines.expr, [stmt.title])

    def backward(self, grads: dict[str, t.Node | None]) -> None:
        self.phase = "backward"
        for core in self.cores.values():
            for role in "qkv":
                operand = getattr(core, role)
                mine = Stored(core.output, role, self.spec.tensors[operand].shape)
                if grads.get(operand) == mine:
                    self.buffers[("stored", core.output, role)] = self.grad_buffer(operand)
                else:
                    self.buffers[("stored", core.output, role)] = self._workspace(
                        f"grad_{self.names.spec('tensor', operand)}_via_{self.names.spec('tensor', core.output)}",
                        self.spec.tensors[operand].shape, f"the part of grad({operand}) through {core.output}")
        for name in self.derivation.gradients:
            if name not in grads:
                continue
            expr = grads[name]
            self.stage = f"grad_{self.names.spec('tensor', name)}"
            target = self.grad_buffer(name)
            if isinstance(expr, Stored) and self.buffers[("stored", expr.core, expr.role)] is target:
                self._core_backward(self.cores[expr.core])
                continue
            if expr is None and name not in self.spec.differentiable:
                continue  # nothing reads the gradient of an intermediate that no output depends on
            if expr is None:
                expr = t.Scalar(b.scalar(0).value)
                comment = [f"grad({name}) = 0: the outputs do not depend on {name}"]
            else:
                comment = [f"grad({name}) = {_grad_text(expr, self.order)}"]
            self.compute(target, expr, comment)
        for leaf, result in zip(self.spec.differentiable, self.gradients):
            if leaf not in grads:
                self.stage = result.name
                self.compute(result, t.Scalar(b.scalar(0).value), [f"grad({leaf}) = 0"])
            elif self.spec.tensors[leaf].kind == "param":
                per_entry = self.grad_buffer(leaf)
                self._emit(batch_sum_kernel(self._kernel_name(result), [f"grad({leaf}) = sum over the batch"],
                                            result, per_entry, self.dims, self.names, "batch_", self.batch))


class Unfusable(CudaCodegenError):
    """A value outside an attention core that the fused kernels do not store (the message names it)."""


def _grad_text(expr: t.Node, order) -> str:
    """A gradient formula as spec text; a fused kernel's result reads dQ_<core> (dK_, dV_)."""
    stored = {n: t.Tensor(f"d{n.role.upper()}_{n.core}", n.shape) for n in t.walk(expr) if isinstance(n, Stored)}
    return to_spec(substitute(expr, stored) if stored else expr, order)


def _coords(prefix: str, shape) -> list[str]:
    """Coordinate variable names; an axis of size 1 gets the literal 0 instead."""
    return ["0" if d == 1 else f"{prefix}{k}_" for k, d in enumerate(shape)]


def _no_statements(printer: CPrinter) -> None:
    if printer.statements:
        raise CudaCodegenError("internal: an index sum outside index notation")


def plan(spec: t.TypedSpec, fused: bool = True) -> KernelPlan:
    """The CUDA kernels for `spec`: its program lowered, fused attention cores when `fused` and the spec has them."""
    notes: list[str] = []
    cores: list[AttentionCore] = []
    planned = spec
    if fused:
        planned, cores, notes = find_cores(spec)
    try:
        return lower(build_program(planned), cores, notes)
    except Unfusable as why:
        return lower(build_program(spec), [], notes + [f"not fused: {why}"])


def lower(program: Program, cores: Sequence[AttentionCore] = (), notes: Sequence[str] = ()) -> KernelPlan:
    """The kernels and buffers that compute `program`; `cores` (of `program.spec`, see `find_cores`) are
    computed by the fused kernels. Raises `Unfusable` when the rest of the program needs a value that a
    core does not store (`plan` then lowers the program of the spec as written, unfused)."""
    cores, notes = list(cores), list(notes)
    spec = program.spec
    names = CNames()
    for name in spec.dims:
        names.spec("dim", name)
    for name in spec.tensors:
        names.spec("tensor", name)
    prefix = names.fresh(c_identifier(spec.name))
    planner = _Planner(program, cores, names, prefix)
    planner.arguments()
    grads = planner.gradient_exprs()
    planner.forward(planner.live(grads))
    forward = list(planner.kernels)
    planner.kernels = []
    planner.backward(grads)
    workspace = []
    for kernel in forward + planner.kernels:
        for buffer in (*kernel.writes, *kernel.reads):
            if buffer.kind == "workspace" and buffer not in workspace:
                workspace.append(buffer)
    workspace.sort(key=lambda buf: buf.phase != "forward")
    return KernelPlan(spec, prefix, names, planner.dims, planner.batch, planner.workspace_arg, planner.stream_arg,
                      planner.inputs, planner.outputs, planner.upstream, planner.gradients, workspace, forward,
                      planner.kernels, cores, notes, planner.helpers, planner.tensor_cores)
