"""Lower one expression to CUDA kernels: what the planner does for every tensor that is not a fused core.

Contract: `Lowering` is the planner's base (`symattn.codegen.cuda.plan`):
`compute(out, expr, comment)` emits the kernels that fill the buffer `out`
with `expr` (a typed-IR node over tensors, gradients and values other kernels
stored, which `lookup` finds): every subexpression that needs its own launch
(a matrix product, reduction, softmax, scan or index-notation sum that is not
the kernel's own root) gets a temporary buffer and its own kernel first,
shared by every later kernel that reads the same subexpression; inside a
kernel, elementwise operations are fused into one expression; a root that is
elementwise over matrix products of its own shape (`accumulators`) is one
tiled matmul kernel with several accumulators and the elementwise epilogue.
A subclass says which nodes are values stored by kernels of its own
(`stored`: a fused core's gradients).
"""

from __future__ import annotations

from ...errors import CodegenError
from ...ir import typed as t
from ...ir.printing import to_spec
from ..plan import substitute
from ..program_ir import FusedPart
from .kernels import (Buffer, Kernel, MatmulTerm, column_reduction, map_kernel, matmul_kernel, reduce_kernel,
                      scan_kernel, softmax_kernel)
from .syntax import CPrinter, align, dim_c, offset_c

__all__ = ["Lowering", "accumulators", "summed_product", "grad_text"]

_HEAVY = (t.MatMul, t.Reduce, t.Softmax, t.SumTo, t.IndexDef, t.Scan)


def summed_product(n: t.Node) -> bool:
    """sum(A @ B) over leading axes only (the heads of grad(X) in multi-head attention)."""
    if not isinstance(n, t.SumTo) or not isinstance(n.x, t.MatMul):
        return False
    lead = len(n.x.shape) - len(n.shape)
    return n.axes == tuple(range(lead)) and lead <= len(n.x.shape) - 2 and lead > 0


def accumulators(expr: t.Node) -> list[t.Node]:
    """Matrix products of the root's own shape reachable through elementwise operations only,
    each a MatMul or a SumTo of one over its leading axes (then the kernel loops over those too)."""
    found: list[t.Node] = []

    def walk(n: t.Node) -> None:
        if tuple(n.shape) != tuple(expr.shape):
            return
        if isinstance(n, t.MatMul) or summed_product(n):
            if n not in found:
                found.append(n)
        elif isinstance(n, (t.Unary, t.Binary)):
            for c in n.children:
                walk(c)
        elif isinstance(n, t.Where):
            walk(n.a)
            walk(n.b)

    walk(expr)
    return found


class _Scope:
    """The memory reads of one kernel, in first-use order (they become its parameters)."""

    def __init__(self, planner: "Lowering") -> None:
        self.planner = planner
        self.reads: list[Buffer] = []

    def integer(self, name: str) -> bool:
        info = self.planner.spec.tensors.get(name)
        return info is not None and info.integer and info.dropout is None

    def read(self, node, coords):
        info = self.planner.spec.tensors.get(node.name) if isinstance(node, t.Tensor) else None
        if info is not None and info.dropout is not None:  # drawn here, from the seed: no buffer
            return self.planner.dropout_read(node.name, offset_c(coords, info.shape, self.planner.names))
        buffer = self.planner.lookup(node)
        if buffer is None:
            return None
        if buffer not in self.reads:
            self.reads.append(buffer)
        return f"{buffer.name}[{offset_c(coords, buffer.shape, self.planner.names)}]"


class Lowering:
    """Kernels for expressions (see the module docstring); the planner holds the buffers and the passes."""

    def stored(self, node: t.Node) -> bool:
        """Whether `node` is a value a kernel of the subclass's own stores (it makes sure that kernel runs)."""
        return False

    def _kernel_name(self, target: Buffer) -> str:
        return self.names.fresh(f"{self.prefix}_{target.name}")

    def _prepare(self, node: t.Node, skip=()) -> None:
        """Give every subexpression that needs its own launch a buffer and a kernel, first."""
        stack = [node]
        while stack:
            n = stack.pop()
            if any(n is s for s in skip):
                continue
            if self.stored(n):
                continue
            if isinstance(n, _HEAVY):
                self._temp(n)
            else:
                stack.extend(n.children)

    def _temp(self, node: t.Node) -> Buffer:
        if node not in self.temps:
            buffer = self._workspace(f"{self.stage}_part", node.shape, grad_text(node, self.order))
            self.compute(buffer, node, [f"{buffer.name} = {grad_text(node, self.order)}"])
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
                raise CodegenError("@ with a 1-D operand is not generated yet; write the vector as a [1, n] "
                                       "or [n, 1] matrix")
        lead_shape = tuple(out.shape[:-2])
        lead = _coords("z", lead_shape)
        # A plain sum of products (grad(X) through several projections) shares one accumulator: one set of
        # SA_MICRO^2 registers a thread rather than one per product, which spilled.
        shared = _sum_of(expr, accumulators)
        special = {m: f"acc{0 if shared else k}_[r_][c_]" for k, m in enumerate(accumulators)}
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
            terms.append(MatmulTerm(f"acc{0 if shared else k}_", grad_text(node, self.order), dim_c(m.a.shape[-1], self.names),
                                    printer.entry(m.a, (*a_lead, "row_", "k_")),
                                    printer.entry(m.b, (*b_lead, "k_", "col_")), outer))
        value = "acc0_[r_][c_]" if shared else printer.entry(expr, (*lead, "row_", "col_"))
        _no_statements(printer)
        self._emit(matmul_kernel(self._kernel_name(out), comment, out, scope.reads, self.dims, lead, lead_shape,
                                 dim_c(out.shape[-2], self.names), dim_c(out.shape[-1], self.names), terms, value,
                                 self.names, self.batch, self.phase))

def _sum_of(expr: t.Node, accumulators) -> bool:
    """Whether `expr` is acc0 + acc1 + ... with every accumulator once, each of the result's shape."""
    leaves: list = []

    def visit(node) -> bool:
        if isinstance(node, t.Binary) and node.op == "add" and node.shape == expr.shape:
            return visit(node.a) and visit(node.b)
        leaves.append(node)
        return node.shape == expr.shape
    return len(accumulators) > 1 and visit(expr) and sorted(map(id, leaves)) == sorted(map(id, accumulators))


def grad_text(expr: t.Node, order) -> str:
    """A gradient formula as spec text; a fused kernel's result reads d<operand>_via_<core>."""
    stored = {}
    for n in t.walk(expr):
        if isinstance(n, FusedPart):
            operand = roles_of(n)
            stored[n] = t.Tensor(f"d{operand}_via_{n.x.core}", n.shape)
    return to_spec(substitute(expr, stored) if stored else expr, order)


def roles_of(part: FusedPart) -> str:
    node = part.x
    operands = (node.q, node.k, node.v, *node.operands)
    operand = operands[part.index] if part.index < 3 else None
    return operand.name if isinstance(operand, t.Tensor) else f"part{part.index}"


def _coords(prefix: str, shape) -> list[str]:
    """Coordinate variable names; an axis of size 1 gets the literal 0 instead."""
    return ["0" if d == 1 else f"{prefix}{k}_" for k, d in enumerate(shape)]


def _no_statements(printer: CPrinter) -> None:
    if printer.statements:
        raise CodegenError("internal: an index sum outside index notation")


