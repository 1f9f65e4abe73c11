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

With `fused=True`, each core of the attention plan (`symattn.codegen.plan`)
is computed by the fused kernels (`symattn.codegen.cuda.flash`): its
intermediates (S, P) are never stored, and the gradients are the plan's, in
which every contribution through a core is a `FusedPart` the fused backward
writes (dQ, dK, dV, and the atomic adds of each learned tensor the score
reads; an operand broadcast over heads gets its part per head, summed after).

Batch: every input, buffer, output and intermediate has a leading batch axis
(the launch functions' `batch` argument); params have none, so their gradients
are computed per batch entry and summed at the end. A buffer is an argument of
both passes and has no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import CodegenError
from ...ir import build as b
from ...ir import typed as t
from ...ir.gather import gather_forms
from ...symbolic.derive import derive
from ..plan import AttentionCore, AttentionPlan, attention_plan, roles
from ..program_ir import FusedAttentionGrad, FusedPart, Program, Stmt
from . import flash, tensor_core
from .kernels import Buffer, Kernel, batch_sum_kernel
from .lowering import Lowering, accumulators, grad_text
from .names import CNames, c_identifier
from .syntax import numel_c

__all__ = ["KernelPlan", "lower", "plan", "accumulators"]

@dataclass(frozen=True, slots=True)
class _PerHead(t.Node):
    """The part `index` of a core's fused gradients of an operand broadcast over heads, as the fused backward
    writes it: one per head of the core (summed into the operand's shape after)."""

    core: str
    index: int
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
    seed: str | None = None          # C name of dropout's seed argument (unsigned long long), None without dropout
    dropout_ints: list[str] = field(default_factory=list)  # kernel ints after the dims: the seed's low and high
    #                                  words, and the batch entry the launch starts at (masks are drawn in kernels)

    @property
    def path(self) -> str:
        return "fused" if self.cores else "generic"

    def kernel_ints(self, sliced: bool) -> list[str]:
        """The host expressions a launch passes after the dims: the dropout ints (the first batch entry of the
        launch: b0_ in a sliced launch, else 0)."""
        if not self.dropout_ints:
            return []
        return [f"(int)(unsigned)({self.seed} & 0xFFFFFFFFull)", f"(int)(unsigned)({self.seed} >> 32)",
                "(int)b0_" if sliced else "0"]


class _Planner(Lowering):
    def __init__(self, program: Program, fused: AttentionPlan, names: CNames, prefix: str) -> None:
        spec = self.spec = program.spec
        self.fused = fused
        self.cores = dict(fused.cores)
        self.names = names
        self.prefix = prefix
        self.order = list(spec.dims)
        self.host_dims = [names.spec("dim", d) for d in spec.dims]
        self.batch = names.fresh("batch")
        # Dropout: the kernels that draw a mask take the seed's words and the launch's first batch entry
        # after the dims (the host passes them), so every kernel's int parameters are `dims`.
        self.seed = names.fresh("seed") if spec.dropouts else None
        self.dropout_ints = [names.fresh(n) for n in ("seed_lo_", "seed_hi_", "entry0_")] if spec.dropouts else []
        self.dims = self.host_dims + self.dropout_ints
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
        self.definitions: dict[str, Stmt] = {}  # tensor -> the statement that computes it
        self.derived: dict[str, t.Node] = {}    # tensor -> its gradient, as derived
        for stmt in program.stmts:
            if stmt.defines is None:
                continue  # a temporary of the array-level form
            if stmt.defines.grad:
                self.derived[stmt.defines.tensor] = stmt.defines.expr
            else:
                self.definitions[stmt.defines.tensor] = stmt
        self.done_backward: set[str] = set()
        self.lead_names: dict[str, list[str]] = {}   # core output -> its head coordinate names
        self.core_prefix: dict[str, str] = {}        # core output -> prefix of its kernels
        self.grad_nodes: dict[str, FusedAttentionGrad] = {}  # core output -> its fused backward, as planned

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
                       for x in spec.arguments]  # (a dropout mask is drawn where it is read, `dropout_read`)
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
                raise CodegenError(f"internal: {node.name} is read before a kernel computes it")
            return buffer
        if isinstance(node, t.Grad):
            buffer = self.buffers.get(("grad", node.name))
            if buffer is None:
                raise CodegenError(f"internal: grad({node.name}) is read before a kernel computes it")
            return buffer
        if isinstance(node, FusedPart):
            self._core_backward(self.cores[node.x.core])
            return self.buffers[("stored", node.x.core, node.index)]
        if isinstance(node, _PerHead):
            return self.buffers[("per head", node.core, node.index)]
        return self.temps.get(node)

    # --- kernels for one expression ------------------------------------------------------

    def stored(self, node: t.Node) -> bool:
        if isinstance(node, FusedPart):
            self.grad_nodes.setdefault(node.x.core, node.x)
            self._core_backward(self.cores[node.x.core])
            return True
        return False

    # --- the fused attention cores -------------------------------------------------------

    def _core_prefix(self, core: AttentionCore) -> str:
        return self.names.fresh(f"{self.prefix}_{self.names.spec('tensor', core.output)}_attn")

    def core_forward(self, core: AttentionCore) -> None:
        prefix = self._core_prefix(core)
        self.core_prefix[core.output] = prefix
        reads = self.read_buffers(core)
        text, lead = flash.score_functions(core, prefix, self.names, self.dims, self.order, reads, self.spec,
                                           self.dropout_read)
        self.lead_names[core.output] = lead
        self.helpers.append(text)
        out = self.tensor_buffer(core.output)
        existing = self.buffers.get(("tensor", core.lse)) if core.lse is not None else None
        if core.lse is not None and (existing.kind == "output" if existing else self._needed(core.lse)):
            lse = self.tensor_buffer(core.lse)  # the spec's own tensor (an output, or kept) is the row log-sum-exp
        else:
            lse = self._workspace(f"{out.name}_lse", (*core.lead, core.n_q),
                                  f"row logsumexp of the scores of {core.output} (forward, kept for the backward)")
        self.buffers[("lse", core.output)] = lse
        self._emit(flash.forward_kernels(core, prefix, self.tensor_buffer(core.q), self.tensor_buffer(core.k),
                                         self.tensor_buffer(core.v), out, lse, reads, self.names, self.dims, lead,
                                         self.batch, core.text))
        reason = tensor_core.unsupported(core)
        if reason is None:
            self.tensor_cores.append(tensor_core.forward(core, prefix, self.names, self.host_dims, lead, self.batch,
                                                         core.text))
        else:
            self.notes.append(f"{core.output}: tensor-core kernels not generated: {reason} (the fp32 fused kernels "
                              "compute it)")

    def _needed(self, name: str) -> bool:
        return name in self.live_set

    def read_buffers(self, core: AttentionCore) -> list[Buffer]:
        """The buffers of the tensors the core's score reads, in the plan's order (a dropout mask has none: the
        kernels draw it, `DropoutEntry`)."""
        return [self.tensor_buffer(n) for n in core.read_tensors if n not in core.drawn]

    def dropout_read(self, name: str, offset: str) -> str:
        """The C expression of dropout's mask `name` at `offset` (its flat position in the batch entry b_): 1.0f
        where Philox keeps it, else 0.0f (`sa_dropout`, runtime/philox.h). A mask of a tensor computed from
        params alone has no batch axis (NumPy's semantics): every entry draws the same."""
        info = self.spec.tensors[name]
        batched = any(self.spec.tensors[n].kind != "param" for n in t.dropout_sources(self.spec, name))
        size = numel_c(self.spec.tensors[info.dropout.of].shape, self.names)  # (the mask's own shape: a fused
        #                                                             program holds only (offset, seed) for it)
        lo, hi, first = self.dropout_ints
        position = f"(unsigned long long)({first} + b_) * ({size}) + ({offset})" if batched else f"({offset})"
        return f"sa_dropout({lo}, {hi}, {info.dropout.stream}u, {position}, {info.dropout.threshold}u)"

    def _core_backward(self, core: AttentionCore) -> None:
        if core.output in self.done_backward:
            return
        self.done_backward.add(core.output)
        node = self.grad_nodes[core.output]
        out = self.tensor_buffer(core.output)
        d_out = self.incoming(node.do, f"grad_{out.name}_whole", f"grad({core.output}), all of it (backward)")
        d_lse = None if node.dlse is None else self.incoming(node.dlse, f"grad_{out.name}_lse",
                                                             f"grad of the row log-sum-exp of {core.output}")
        delta = self._workspace(f"{out.name}_delta", (*core.lead, core.n_q),
                                f"rowsum(grad({core.output}) * {core.output}) (backward)")
        stored = []
        for index, role in enumerate(roles(core)):
            stored.append(self.buffers[("per head", core.output, index)] if ("per head", core.output, index)
                          in self.buffers else self.buffers[("stored", core.output, index)])
        for buffer in stored[3:]:  # the learned reads' gradients are atomic sums: zeros first
            self.compute(buffer, t.Scalar(b.scalar(0).value), [f"{buffer.name} = 0 (the fused backward adds into it)"])
        self.kernels.extend(flash.backward_kernels(
            core, self.core_prefix[core.output], self.tensor_buffer(core.q), self.tensor_buffer(core.k),
            self.tensor_buffer(core.v), out, d_out, self.buffers[("lse", core.output)], delta, *stored[:3],
            self.read_buffers(core), stored[3:], d_lse, self.names, self.dims, self.lead_names[core.output],
            self.batch))
        for index in range(3):  # an operand broadcast over heads: its per-head part summed
            if ("per head", core.output, index) in self.buffers:
                operand = roles(core)[index]
                shape = self.spec.tensors[operand].shape
                target = self.buffers[("stored", core.output, index)]
                self.compute(target, t.SumTo(_PerHead(core.output, index, (*core.lead, *shape[-2:])), shape),
                             [f"the part of grad({operand}) through {core.output}, summed over the heads it is "
                              "broadcast along"])

    def incoming(self, expr: t.Node, base: str, note: str) -> Buffer:
        """The buffer of what flows back into a core (grad(O) or the lse's gradient): an upstream or computed
        gradient as it is, anything else computed into a workspace first."""
        if isinstance(expr, t.Grad):
            return self.lookup(expr)
        buffer = self._workspace(base, expr.shape, note)
        self.compute(buffer, expr, [f"{note} = {grad_text(expr, self.order)}"])
        return buffer

    # --- the passes ----------------------------------------------------------------------

    def definition(self, name: str) -> Stmt:
        stmt = self.definitions.get(name)
        if stmt is None:
            raise CodegenError(f"internal: a kernel reads {name}, which no statement of the program computes")
        return stmt

    def gradient_exprs(self) -> dict[str, t.Node | None]:
        """grad(T) for every T that depends on a leaf, in the order derived: the plan's gradient (every path through
        a fused core its `FusedPart`), else the derivation's; a scatter in its gather form (one entry a thread)."""
        spec = self.spec
        depends = set(spec.differentiable)
        for name, info in spec.tensors.items():
            if info.expr is not None and any(r in depends for r in t.tensors_read(info.expr)):
                depends.add(name)
        exprs: dict[str, t.Node | None] = {}
        for name, gradient in self.derivation.gradients.items():
            if name not in depends or name in self.fused.absorbed or name in spec.outputs:
                continue
            # The program has no statement for a leaf's gradient of zero (None), nor for a gradient that no
            # leaf's gradient reads (M of `where(X @ W > 0, 0, -inf)`: the comparison passes nothing on to X);
            # for those the derivation's expression stands in.
            expr = self.fused.gradients[name] if name in self.fused.gradients else self.derived.get(name, gradient.expr)
            exprs[name] = None if expr is None else gather_forms(expr, solve=True)
        for expr in exprs.values():
            for n in t.walk(expr) if expr is not None else ():
                if isinstance(n, FusedPart):
                    self.grad_nodes.setdefault(n.x.core, n.x)
        return exprs

    def live(self, grads: dict[str, t.Node | None]) -> set[str]:
        """The tensors the forward must compute: what the outputs and the backward read."""
        need = set(self.spec.outputs)
        flowing = [e for node in self.grad_nodes.values() for e in (node.do, node.dlse) if e is not None]
        for expr in [*grads.values(), *flowing]:  # (what flows back into a core, too)
            if expr is None:
                continue
            need.update(t.tensors_read(expr))
        for core in self.cores.values():
            if core.output in self.grad_nodes:
                need.update((core.output, core.q, core.k, core.v, *core.read_tensors))
        for name in reversed(list(self.spec.tensors)):
            if name in need and self.spec.tensors[name].expr is not None:
                core = self.cores.get(name)
                lse_of = next((c for c in self.cores.values() if c.lse == name), None)
                if core is not None:
                    need.update((core.q, core.k, core.v, *core.read_tensors))
                elif lse_of is not None:
                    need.add(lse_of.output)
                else:
                    need.update(t.tensors_read(self.definition(name).defines.expr))
        if need & self.fused.absorbed:
            raise CodegenError(f"internal: {', '.join(sorted(need & self.fused.absorbed))} is needed outside the "
                               "attention core (the plan keeps such a core unfused)")
        self.live_set = need
        return need

    def forward(self, live: set[str]) -> None:
        self.phase = "forward"
        lses = {c.lse: c for c in self.cores.values() if c.lse is not None}
        for name, info in self.spec.tensors.items():
            if info.expr is None or name not in live:
                continue
            self.stage = self.names.spec("tensor", name)
            if name in self.cores:
                self.core_forward(self.cores[name])
            elif name in lses:
                continue  # the core's forward writes it
            else:
                stmt = self.definition(name)
                self.compute(self.tensor_buffer(name), stmt.defines.expr, [stmt.title])

    def backward(self, grads: dict[str, t.Node | None]) -> None:
        self.phase = "backward"
        for core in self.cores.values():
            for index, operand in enumerate(roles(core)):
                shape = self.spec.tensors[operand].shape
                mine = FusedPart(self.grad_nodes.get(core.output), index, shape)
                per_head = index < 3 and tuple(shape[:-2]) != tuple(core.lead)  # broadcast over heads (GQA)
                if grads.get(operand) == mine and operand in self.spec.differentiable:
                    self.buffers[("stored", core.output, index)] = self.grad_buffer(operand)
                else:
                    self.buffers[("stored", core.output, index)] = self._workspace(
                        f"grad_{self.names.spec('tensor', operand)}_via_{self.names.spec('tensor', core.output)}",
                        shape, f"the part of grad({operand}) through {core.output}")
                if per_head:
                    self.buffers[("per head", core.output, index)] = self._workspace(
                        f"grad_{self.names.spec('tensor', operand)}_per_head_{self.names.spec('tensor', core.output)}",
                        (*core.lead, *shape[-2:]), f"the part of grad({operand}) through {core.output}, per head")
        for name in self.derivation.gradients:
            if name not in grads:
                continue
            expr = grads[name]
            self.stage = f"grad_{self.names.spec('tensor', name)}"
            target = self.grad_buffer(name)
            if isinstance(expr, FusedPart) and self.buffers[("stored", expr.x.core, expr.index)] is target:
                self._core_backward(self.cores[expr.x.core])
                continue
            if expr is None and name not in self.spec.differentiable:
                continue  # nothing reads the gradient of an intermediate that no output depends on
            if expr is None:
                expr = t.Scalar(b.scalar(0).value)
                comment = [f"grad({name}) = 0: the outputs do not depend on {name}"]
            else:
                comment = [f"grad({name}) = {grad_text(expr, self.order)}"]
            self.compute(target, expr, comment)
        for leaf, result in zip(self.spec.differentiable, self.gradients):
            if leaf not in grads:
                self.stage = result.name
                self.compute(result, t.Scalar(b.scalar(0).value), [f"grad({leaf}) = 0"])
            elif self.spec.tensors[leaf].kind == "param":
                per_entry = self.grad_buffer(leaf)
                self._emit(batch_sum_kernel(self._kernel_name(result), [f"grad({leaf}) = sum over the batch"],
                                            result, per_entry, self.dims, self.names, "batch_", self.batch))


def plan(spec: t.TypedSpec, fused: bool = True) -> KernelPlan:
    """The CUDA kernels for `spec`: its program lowered, the attention plan's cores fused when `fused`."""
    planned = attention_plan(spec)
    if not fused:
        planned = AttentionPlan(spec, planned.derivation if not planned.cores else derive(spec), {}, ())
    return lower(planned.program(), planned)


def lower(program: Program, fused: AttentionPlan | None = None) -> KernelPlan:
    """The kernels and buffers that compute `program` (`fused.program()`); the cores of the attention plan `fused`
    are computed by the fused kernels (None: a program with no fused core)."""
    spec = program.spec
    if fused is None:
        fused = AttentionPlan(spec, program.derivation, {}, ())
    names = CNames()
    for name in spec.dims:
        names.spec("dim", name)
    for name in spec.tensors:
        names.spec("tensor", name)
    prefix = names.fresh(c_identifier(spec.name))
    planner = _Planner(program, fused, names, prefix)
    planner.notes = list(fused.notes)
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
    return KernelPlan(spec, prefix, names, planner.host_dims, planner.batch, planner.workspace_arg,
                      planner.stream_arg, planner.inputs, planner.outputs, planner.upstream, planner.gradients,
                      workspace, forward, planner.kernels, list(fused.cores.values()), planner.notes, planner.helpers,
                      planner.tensor_cores, planner.seed, planner.dropout_ints)
