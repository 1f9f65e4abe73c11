"""Validate a parsed spec and build its typed IR.

Contract: `validate(program, filename, source, sizes)` returns a
`typed.TypedSpec`, or raises a located `SpecError` subclass: names resolved
(defined once, before use, never a keyword or builtin), every tensor's shape
inferred with symbolic dims (NumPy broadcasting, batched `@`, `.T` on the
last two axes, reductions keeping their axis), index ranges inferred and
checked, and every `check` typed (both sides the same shape, `grad(T)` of
defined tensors only). No other exception escapes for any `ir.Program`.

Check-only definitions: a definition that reads `grad(T)` (or an entry
`grad(T)[i, j]`), or reads another check-only definition, is not part of the
forward pass. It is kept out of `TypedSpec.tensors`; a check that names it
sees its typed expression in its place (inlined). An output that is one, or
that depends on one through the forward pass, is a located error at the read
that brought `grad` into the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import singledispatchmethod
from pathlib import Path
from typing import Mapping

import sympy

from . import syntax as ir
from ..ir import integers, typed as t
from ..ir.functions import FUNCTIONS
from ..errors import SpecCheckError, SpecError, SpecNameError, SpecShapeError, UsageError
from .claim_forms import relative_check, symmetry_check
from .check_only import CHECK_ONLY_HINT, CheckOnly, grad_entry, output_reads_backward, read_backward
from . import dims, hints, operators, subscripts
from .dims import number_value
from .dropout import dropout_definition, hidden_read, is_dropout
from .parse import KEYWORDS
from ..ir.printing import to_spec
from ..ir.shapes import ONE, ShapeMismatch, broadcast, dim_symbol, format_shape, matmul_shape, same_dim

__all__ = ["validate", "BUILTINS"]

_MATRIX_FUNCTIONS = (
    "softmax", "where", "merge_heads", "split_heads", "concat", "transpose", "clamp", "dropout",
) + t.REDUCTIONS + t.CONSTANTS
_CHECK_FUNCTIONS = ("grad", "tangent", "equivariant", "invariant", "relative")
class _Builtins:
    """Every builtin name, the elementwise functions read live from `symattn.ir.functions`."""

    _fixed = frozenset(_MATRIX_FUNCTIONS + _CHECK_FUNCTIONS + ("inf", "pi"))

    def __contains__(self, name: object) -> bool:
        return name in self._fixed or name in FUNCTIONS

    def __iter__(self):
        return iter(sorted(self._fixed | set(FUNCTIONS)))


BUILTINS = _Builtins()
_BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "^": "pow"}


def _same_shape(a, b) -> bool:
    """Equal shapes, ignoring leading axes of size 1 (which broadcasting adds and removes freely)."""
    a, b = list(a), list(b)
    while len(a) > len(b) and a[0] == ONE:
        a.pop(0)
    while len(b) > len(a) and b[0] == ONE:
        b.pop(0)
    return len(a) == len(b) and all(map(same_dim, a, b))


def _err(cls, message: str, pos: ir.Pos, hint: str | None = None) -> SpecError:
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


@dataclass
class _IndexScope:
    """Index names visible in an index-notation body, with inferred ranges."""

    ranges: dict[str, sympy.Expr | None] = field(default_factory=dict)
    seen_at: dict[str, ir.Pos] = field(default_factory=dict)
    # computed subscripts to range-check (subscripts.Pending) and divisors that read indices, to show nonzero
    # (operators.PendingDivisor), once every index's range is known
    pending: list = field(default_factory=list)


class _Validator:
    def __init__(self, program: ir.Program, filename: str, overrides: Mapping[str, int],
                 numbers: frozenset[str] = frozenset()) -> None:
        self.program = program
        # Dims no shape, range or divisor uses (found by a first pass): they may be 0, and their
        # symbols are nonnegative, not positive, so that no proof assumes them >= 1.
        self.numbers = numbers
        self.size_uses: dict[str, ir.Pos] = {}  # dim -> where it is first used as a size
        self.filename = filename
        self.overrides = dict(overrides)
        self.name = Path(filename).stem if filename and not filename.startswith("<") else "spec"
        self.dims: dict[str, t.DimInfo] = {}
        self.tensors: dict[str, t.TensorInfo] = {}
        self.outputs: list[str] = []
        self.checks: list[t.CheckInfo] = []
        self.defined_at: dict[str, ir.Pos] = {}
        self.later: dict[str, ir.Pos] = {}  # every name a statement defines, for "used before"
        self.in_check = False
        self.check_only: dict[str, CheckOnly] = {}
        # While a definition is validated: what it reads of the backward pass (grad or a
        # check-only definition), as (position, what, check-only name or None); else None.
        self.reads: list[tuple[ir.Pos, str, str | None]] | None = None
        self.defining: str | None = None  # the tensor a definition being validated defines (for hints)
        self.notes: list[tuple[ir.Pos, str]] = []  # valid, but likely not what was meant

    # --- helpers ---------------------------------------------------------------

    @property
    def order(self) -> list[str]:
        return list(self.dims)

    def shape_text(self, shape) -> str:
        return format_shape(shape, self.order)

    def shape_error(self, exc: ShapeMismatch, pos: ir.Pos, hint: str | None = None) -> SpecError:
        return _err(SpecShapeError, str(exc), pos, hint)

    def define(self, name: ir.Name) -> None:
        if name.id in KEYWORDS:
            raise _err(SpecNameError, f"'{name.id}' is a keyword and cannot be redefined", name.pos)
        if name.id in BUILTINS:
            raise _err(SpecNameError, f"'{name.id}' is a builtin and cannot be redefined", name.pos,
                       "choose another name")
        if name.id in self.defined_at:
            first = self.defined_at[name.id]
            raise _err(SpecNameError, f"redefinition of '{name.id}' (first defined at {first.line}:{first.column})",
                       name.pos, "every name is defined once")
        self.defined_at[name.id] = name.pos

    def unknown(self, name: str, pos: ir.Pos, extra: tuple[str, ...] = (), dim: bool = False) -> SpecError:
        """The error for a name nothing declares; `dim`: it stands where a dim belongs (a shape)."""
        if name in self.check_only:
            read = self.check_only[name]
            return _err(SpecCheckError, f"'{name}' is a check-only definition (it reads {read.read} at "
                        f"{read.at.line}:{read.at.column}), not a tensor of the forward pass", pos, CHECK_ONLY_HINT)
        if name in self.later:
            where = self.later[name]
            return _err(SpecNameError, f"'{name}' is used before its definition at {where.line}:{where.column}",
                        pos, "define every name before it is used")
        if name in ("inf", "pi"):
            return _err(SpecNameError, f"'{name}' is a number, not a tensor or dim", pos)
        if name in BUILTINS:
            return _err(SpecNameError, f"'{name}' is a function; call it as {name}(...)", pos)
        known = list(self.dims) + list(self.tensors) + list(extra)
        return _err(SpecNameError, f"unknown name '{name}'", pos, hints.undeclared(name, known, dim))

    # --- dims and dim arithmetic -------------------------------------------------

    def dim_expr(self, node: ir.Expr, what: str = "a shape") -> sympy.Expr:
        """Dim arithmetic (`h * d_k`, `N + 1`, `2`) as a SymPy expression (`symattn.front.dims`)."""
        return dims.dim_expr(self, node, what)

    def check_size(self, dim: sympy.Expr, pos: ir.Pos) -> None:
        """A dim expression must be a positive integer at the spec's sizes."""
        dims.check_size(self, dim, pos)

    @property
    def sizes(self) -> dict[str, int]:
        return {name: self.overrides.get(name, info.default) for name, info in self.dims.items()}

    def int_literal(self, node: ir.Expr, what: str) -> int:
        sign = 1
        while isinstance(node, ir.UnaryOp):
            sign = -sign if node.op == "-" else sign
            node = node.operand
        if isinstance(node, ir.Number):
            value = number_value(node)
            if value.is_integer:
                return sign * int(value)
        raise _err(SpecShapeError, f"{what} must be an integer literal", node.pos)

    # --- statements ----------------------------------------------------------------

    def run(self) -> t.TypedSpec:
        statements = self.program.statements
        for stmt in statements:
            for name in self._names_defined(stmt):
                self.later.setdefault(name.id, name.pos)
        for position, stmt in enumerate(statements):
            if isinstance(stmt, ir.Header):
                if position != 0:
                    raise _err(SpecNameError, "the 'attention' header must be the first statement", stmt.pos)
                if stmt.name.id in KEYWORDS:
                    raise _err(SpecNameError, f"'{stmt.name.id}' is a keyword", stmt.name.pos)
                self.name = stmt.name.id
            else:
                self.statement(stmt)
        for name in self.overrides:
            if name not in self.dims:
                raise UsageError(f"--dim {name}: the spec has no dim '{name}' (it declares "
                                 f"{', '.join(self.dims) or 'none'})")
        if not self.outputs:
            raise hints.no_output(statements, self.tensors)
        for name, size in self.sizes.items():
            if size == 0 and name in self.size_uses:
                at = self.size_uses[name]
                where = "--dim " if self.overrides.get(name) == 0 else "its declaration "
                raise _err(SpecShapeError, f"{name} is 0 ({where}says so), but it is used as a size here; only a "
                           "dim that is used as a number alone (no shape, index range or divisor) may be 0", at)
        tensors = {
            name: t.TensorInfo(info.name, info.kind, info.shape, info.pos, info.expr, name in self.outputs,
                               values=info.values, dropout=info.dropout)
            for name, info in self.tensors.items()
        }
        return t.TypedSpec(self.name, self.filename, "", dict(self.dims), self.sizes, tensors,
                           tuple(self.outputs), tuple(self.checks), tuple(dict.fromkeys(self.notes)))

    @staticmethod
    def _names_defined(stmt: ir.Statement):
        if isinstance(stmt, ir.DimDecl):
            return [item.name for item in stmt.items]
        if isinstance(stmt, ir.TensorDecl):
            return [item.name for item in stmt.items]
        if isinstance(stmt, ir.Define):
            return [stmt.name]
        return []

    @singledispatchmethod
    def statement(self, stmt) -> None:
        raise TypeError(f"no validation rule for statement {type(stmt).__name__}")

    @statement.register
    def _(self, stmt: ir.DimDecl) -> None:
        for item in stmt.items:
            self.define(item.name)
            size = item.size
            sign = 1
            while isinstance(size, ir.UnaryOp):
                sign = -sign if size.op == "-" else sign
                size = size.operand
            value = number_value(size) * sign if isinstance(size, ir.Number) else None
            if value is None or not value.is_integer or value < 0:
                raise _err(SpecShapeError, f"dim {item.name.id} must have a positive integer size", item.size.pos,
                           f"for example `dim {item.name.id} = 4` (0 only for a dim no shape uses)")
            number = item.name.id in self.numbers
            symbol = sympy.Symbol(item.name.id, nonnegative=True, integer=True) if number else \
                dim_symbol(item.name.id)
            self.dims[item.name.id] = t.DimInfo(item.name.id, symbol, int(value), item.name.pos)
            if item.name.id in self.overrides and self.overrides[item.name.id] < 0:
                raise UsageError(f"--dim {item.name.id}={self.overrides[item.name.id]}: sizes are positive integers")

    @statement.register
    def _(self, stmt: ir.TensorDecl) -> None:
        for item in stmt.items:
            self.define(item.name)
            shape: tuple = ()
            if item.shape is not None:
                shape = tuple(self.dim_expr(e, f"the shape of {item.name.id}") for e in item.shape)
                for dim, e in zip(shape, item.shape):
                    self.check_size(dim, e.pos)
            values = None
            if item.values is not None:
                values = operators.value_range(self, stmt.kind, item)
            self.tensors[item.name.id] = t.TensorInfo(item.name.id, stmt.kind, shape, item.name.pos, values=values)

    @statement.register
    def _(self, stmt: ir.Define) -> None:
        self.define(stmt.name)
        self.reads = []
        self.defining = stmt.name.id
        try:
            if is_dropout(stmt):
                node = dropout_definition(self, stmt)
            elif stmt.indices is None:
                node = self.expr(stmt.expr, None)
                if isinstance(node, (t.Compare, t.Logical)):
                    raise _err(SpecShapeError, "a condition is not a tensor; use it as where(cond, a, b)", node.pos)
            else:
                node = self.index_definition(stmt)
            reads = self.reads
        finally:
            self.reads = None
            self.defining = None
        if reads:
            at, what, via = reads[0]
            self.check_only[stmt.name.id] = CheckOnly(stmt.name.id, node, what, at, via)
            return
        self.tensors[stmt.name.id] = t.TensorInfo(stmt.name.id, "intermediate", node.shape, stmt.name.pos, node)

    @statement.register
    def _(self, stmt: ir.OutputDecl) -> None:
        for name in stmt.names:
            if name.id in self.check_only:
                raise output_reads_backward(self, name)
            if name.id not in self.tensors:
                if name.id in self.dims:
                    raise _err(SpecNameError, f"'{name.id}' is a dim; an output must be a tensor", name.pos)
                raise self.unknown(name.id, name.pos)
            if self.tensors[name.id].kind == "buffer":
                raise _err(SpecNameError, f"'{name.id}' is a buffer: given, never differentiated, so it has no "
                           "upstream gradient and cannot be an output", name.pos,
                           f"output a tensor computed from it, e.g. `{name.id}_out = {name.id} * 1`")
            if name.id in self.outputs:
                raise _err(SpecNameError, f"'{name.id}' is already an output", name.pos)
            self.outputs.append(name.id)

    @statement.register
    def _(self, stmt: ir.Check) -> None:
        self.in_check = True
        try:
            self.checks.append(self.check(stmt))
        finally:
            self.in_check = False

    # --- checks --------------------------------------------------------------------

    def check(self, stmt: ir.Check) -> t.CheckInfo:
        claim = stmt.claim
        if isinstance(claim, ir.Compare) and claim.op == "==":
            lhs, rhs = self.expr(claim.left, None), self.expr(claim.right, None)
            if lhs.shape != () and rhs.shape != () and not _same_shape(lhs.shape, rhs.shape):
                raise _err(SpecCheckError,
                           f"the two sides have different shapes: {self.shape_text(lhs.shape)} == "
                           f"{self.shape_text(rhs.shape)}", claim.op_pos)
            return t.CheckInfo(stmt.pos.line, stmt.text, stmt.negated, "equal", stmt.pos, lhs=lhs, rhs=rhs)
        if isinstance(claim, ir.Call) and claim.func in ("equivariant", "invariant"):
            return symmetry_check(self, stmt, claim)
        if isinstance(claim, ir.Call) and claim.func == "relative":
            return relative_check(self, stmt, claim)
        raise _err(SpecCheckError, "a check is `A == B`, `equivariant(O, X)`, `invariant(O, Y)` or `relative(B)`",
                   claim.pos,
                   "prefix with `not` to claim that a counterexample exists")

    # --- index notation ----------------------------------------------------------------

    def index_definition(self, stmt: ir.Define) -> t.IndexDef:
        scope = _IndexScope()
        for item in stmt.indices:
            name = item.name.id
            if name in self.dims or name in self.tensors or name in self.check_only or name in BUILTINS \
                    or name in KEYWORDS:
                raise _err(SpecNameError, f"index '{name}' clashes with the {self._what(name)} of that name",
                           item.name.pos, "index names are local; pick one that is not a dim or tensor")
            if name in scope.ranges:
                raise _err(SpecNameError, f"index '{name}' appears twice on the left", item.name.pos)
            scope.ranges[name] = None
            if item.range is not None:
                scope.ranges[name] = self.dim_expr(item.range, f"the range of {name}")
                self.check_size(scope.ranges[name], item.range.pos)
            scope.seen_at[name] = item.name.pos
        body = self.expr(stmt.expr, scope)
        if body.shape != ():
            raise _err(SpecShapeError, f"index notation defines one entry at a time, but the right side has shape "
                       f"{self.shape_text(body.shape)}", stmt.expr.pos)
        indices = []
        for item in stmt.indices:
            rng = scope.ranges[item.name.id]
            if rng is None:
                computed = any(item.name.id in t.subscript_names(p.value) for p in scope.pending)
                raise _err(SpecShapeError, f"cannot infer the range of index '{item.name.id}'"
                           + (" (it appears only inside subscript arithmetic)" if computed else ""),
                           item.name.pos, f"give it explicitly, as {item.name.id}:N")
            indices.append(t.Index(item.name.id, rng))
        for pending in scope.pending:  # computed subscripts (subscripts.Pending), divisors (operators.PendingDivisor)
            pending.check(self, {n: r for n, r in scope.ranges.items() if r is not None})
        return t.IndexDef(tuple(indices), body, tuple(i.range for i in indices), pos=stmt.pos)

    def _what(self, name: str) -> str:
        if name in self.dims:
            return "dim"
        if name in self.check_only:
            return "check-only definition"
        if name in self.tensors:
            return "tensor"
        return "builtin"

    def bind_range(self, scope: _IndexScope, index: str, rng: sympy.Expr, pos: ir.Pos, where: str) -> None:
        known = scope.ranges[index]
        if known is None:
            scope.ranges[index] = rng
            scope.seen_at[index] = pos
        elif not same_dim(known, rng):
            first = scope.seen_at[index]
            raise _err(SpecShapeError,
                       f"index '{index}' ranges over {self.shape_text((rng,))[1:-1]} here ({where}) but over "
                       f"{self.shape_text((known,))[1:-1]} at {first.line}:{first.column}", pos)

    # --- expressions -------------------------------------------------------------------

    @singledispatchmethod
    def expr(self, node, scope: _IndexScope | None) -> t.Node:
        raise TypeError(f"no validation rule for expression {type(node).__name__}")

    @expr.register
    def _(self, node: ir.Number, scope) -> t.Node:
        return t.Scalar(number_value(node), pos=node.pos)

    @expr.register
    def _(self, node: ir.Name, scope) -> t.Node:
        name = node.id
        if scope is not None and name in scope.ranges:
            return t.IndexVar(name, pos=node.pos)
        if name == "inf":
            return t.Scalar(sympy.oo, pos=node.pos)
        if name == "pi":
            return t.Scalar(sympy.pi, pos=node.pos)
        if name in self.dims:
            return t.DimValue(self.dims[name].symbol, pos=node.pos)
        if name in self.check_only and scope is None:
            read_backward(self, node.pos, f"'{name}'", name)
            return self.check_only[name].node  # a check sees the definition in its place
        if name in self.tensors and self.tensors[name].dropout is not None and not self.in_check:
            raise hidden_read(self, name, node.pos)
        if name in self.tensors:
            shape = self.tensors[name].shape
            if scope is not None and shape != ():
                subs = ", ".join("ijkl"[: len(shape)]) if len(shape) <= 4 else "..."
                raise _err(SpecShapeError, f"'{name}' has shape {self.shape_text(shape)}; in index notation "
                           f"write one entry, as {name}[{subs}]", node.pos)
            return t.Tensor(name, shape, pos=node.pos)
        if scope is not None and name not in self.later and name not in BUILTINS:
            raise _err(SpecNameError, f"unknown name '{name}'", node.pos,
                       f"an index must appear on the left (T[{name}, ...] = ...) or be summed: sum({name}, ...)")
        raise self.unknown(name, node.pos)

    @expr.register
    def _(self, node: ir.UnaryOp, scope) -> t.Node:
        x = self.expr(node.operand, scope)
        if node.op == "~":
            operators.condition(self, x, "~", node.pos)
            return t.Logical("not", (x,), x.shape, pos=node.pos)
        if isinstance(x, (t.Compare, t.Logical)):
            raise _err(SpecShapeError, "a condition is only allowed as the condition of where(cond, a, b)", x.pos,
                       "negate a condition with ~, as in ~(j <= i)")
        if node.op == "+":
            return x
        if isinstance(x, t.Scalar):
            return t.Scalar(-x.value, pos=node.pos)
        return t.Unary("neg", x, x.shape, pos=node.pos)

    @expr.register
    def _(self, node: ir.BinOp, scope) -> t.Node:
        a, b = self.expr(node.left, scope), self.expr(node.right, scope)
        if node.op in operators.LOGICAL:
            return operators.logical(self, node, a, b)
        for side in (a, b):
            if isinstance(side, (t.Compare, t.Logical)):
                raise _err(SpecShapeError, "a condition is only allowed as the condition of where(cond, a, b)",
                           side.pos)
        if node.op in operators.INTEGER_BINARY:
            return operators.integer_binary(self, node, a, b, scope)
        if node.op == "@":
            if scope is not None:
                raise _err(SpecShapeError, "@ is matrix notation; in index notation write sum(k, A[i, k] * B[k, j])",
                           node.op_pos)
            try:
                shape = matmul_shape(a.shape, b.shape, self.order)
            except ShapeMismatch as exc:
                raise self.shape_error(exc, node.op_pos) from None
            return t.MatMul(a, b, shape, pos=node.pos)
        try:
            shape = broadcast(a.shape, b.shape, op=node.op, order=self.order)
        except ShapeMismatch as exc:
            raise self.shape_error(exc, node.op_pos, hints.broadcast(a, b, self.order, self.tensors, self.defining)) \
                from None
        return t.Binary(_BINARY[node.op], a, b, shape, pos=node.pos)

    @expr.register
    def _(self, node: ir.Transpose, scope) -> t.Node:
        x = self.expr(node.operand, scope)
        return self.transpose(x, node.pos, node.op_pos, scope)

    def transpose(self, x: t.Node, pos: ir.Pos, op_pos: ir.Pos, scope) -> t.Node:
        if scope is not None:
            raise _err(SpecShapeError, ".T is matrix notation; in index notation swap the indices instead", op_pos)
        if len(x.shape) < 2:
            raise _err(SpecShapeError, f".T swaps the last two axes, but the operand has shape "
                       f"{self.shape_text(x.shape)}", op_pos)
        shape = (*x.shape[:-2], x.shape[-1], x.shape[-2])
        return t.Transpose(x, shape, pos=pos)

    @expr.register
    def _(self, node: ir.Compare, scope) -> t.Node:
        operators.comparison_operands(self, node)
        a, b = self.expr(node.left, scope), self.expr(node.right, scope)
        for side in (a, b):
            if isinstance(side, (t.Compare, t.Logical)):
                raise _err(SpecShapeError, "a comparison compares values, not conditions", side.pos,
                           "join conditions with & and |, each in brackets: (a < b) & (c < d)")
        try:
            shape = broadcast(a.shape, b.shape, op=node.op, order=self.order)
        except ShapeMismatch as exc:
            raise self.shape_error(exc, node.op_pos) from None
        if scope is not None:
            self.note_real_division(a, b)
        return t.Compare(node.op, a, b, shape, pos=node.pos)

    def note_real_division(self, *sides: t.Node) -> None:
        """A comparison of `i / W` (integers divided: a fraction) is valid, but `i // W`, the block an index falls
        in, is what masks mean (a dilated or blocked window): a note says so."""
        for side in sides:
            for n in t.walk(side):
                if isinstance(n, t.Binary) and n.op == "div" and any(isinstance(x, t.IndexVar) for x in t.walk(n.a)) \
                        and integers.integer_valued(n.a, self.tensors) and integers.integer_valued(n.b, self.tensors):
                    a, b = to_spec(n.a, self.order), to_spec(n.b, self.order)
                    self.notes.append((n.pos, f"{a} / {b} is real division, a fraction; for the block an index falls "
                                       f"in write {a} // {b}"))

    @expr.register
    def _(self, node: ir.Subscript, scope) -> t.Node:
        if scope is None:
            if not any(isinstance(i, ir.SliceItem) for i in node.indices):
                raise _err(SpecShapeError, f"{node.name}[...] picks one entry, which is index notation",
                           node.pos, f"define an index-notation tensor: T[i, j] = ... {node.name}[i, j] ...")
            return subscripts.sliced(self, self.expr(ir.Name(node.name, pos=node.pos), None), node.indices,
                                     node.name, node.pos)
        if node.name not in self.tensors:
            raise self.unknown(node.name, node.pos, tuple(scope.ranges))
        if self.tensors[node.name].dropout is not None and not self.in_check:
            raise hidden_read(self, node.name, node.pos)
        shape = self.tensors[node.name].shape
        if len(node.indices) != len(shape):
            raise _err(SpecShapeError, f"{node.name} has shape {self.shape_text(shape)}: it takes {len(shape)} "
                       f"ind{'ex' if len(shape) == 1 else 'ices'}, not {len(node.indices)}", node.pos)
        names = []
        for axis, index in enumerate(node.indices):
            if isinstance(index, ir.Name) and index.id not in scope.ranges and index.id not in self.dims \
                    and index.id not in self.tensors:
                raise _err(SpecNameError, f"unknown index '{index.id}'", index.pos,
                           f"an index must appear on the left (T[{index.id}, ...] = ...) or be summed: "
                           f"sum({index.id}, ...)")
            value = subscripts.subscript(self, index, scope)
            if isinstance(value, str):  # a plain index: it gives the index its range
                self.bind_range(scope, value, shape[axis], index.pos, f"axis {axis} of {node.name}")
            else:
                scope.pending.append(subscripts.Pending(value, node.name, axis, shape[axis], index.pos))
            names.append(value)
        return t.Entry(node.name, tuple(names), pos=node.pos)

    @expr.register
    def _(self, node: ir.Sliced, scope) -> t.Node:
        if scope is not None:
            raise _err(SpecShapeError, "slicing works on whole tensors (matrix notation); in index notation "
                       "write the subscripts of one entry", node.pos)
        base = self.expr(node.base, None)
        if isinstance(base, t.Compare):
            raise _err(SpecShapeError, "a comparison is only allowed as the condition of where(cond, a, b)",
                       base.pos)
        return subscripts.sliced(self, base, node.indices, to_spec(base, self.order), node.pos)

    @expr.register
    def _(self, node: ir.SliceItem, scope) -> t.Node:
        raise _err(SpecShapeError, "a slice start:stop goes inside the brackets after a tensor, as in X[:, 0:h]",
                   node.pos)

    @expr.register
    def _(self, node: ir.Group, scope) -> t.Node:
        raise _err(SpecShapeError, "a parenthesised group (A, B) only names the tensors an equivariant or "
                   "invariant claim permutes together", node.pos, "the language has no tuples")

    @expr.register
    def _(self, node: ir.CallSubscript, scope) -> t.Node:
        if scope is None and any(isinstance(i, ir.SliceItem) for i in node.indices):  # grad(Q)[:, 0:h]
            return self.expr(ir.Sliced(node.call, node.indices, pos=node.pos), None)
        return grad_entry(self, node, scope)

    @expr.register
    def _(self, node: ir.Keyword, scope) -> t.Node:
        raise _err(SpecShapeError, f"unexpected keyword argument '{node.name}='", node.pos)

    @expr.register
    def _(self, node: ir.Call, scope) -> t.Node:
        from .builtins import validate_call

        return validate_call(self, node, scope)


def validate(program: ir.Program, filename: str = "<spec>", source: str = "",
             sizes: Mapping[str, int] | None = None) -> t.TypedSpec:
    """Resolve names and shapes of a parsed spec; `sizes` overrides dim defaults."""
    validator = _Validator(program, filename, sizes or {})
    try:
        spec = validator.run()
        numbers = frozenset(spec.dims) - frozenset(validator.size_uses)
        if numbers:  # dims used only as numbers: again, with symbols that may be 0
            validator = _Validator(program, filename, sizes or {}, numbers)
            spec = validator.run()
    except SpecError as err:
        raise err.located(filename, source) from None
    except RecursionError:
        raise SpecShapeError("the expression is nested too deeply", line=1, column=1).located(filename, source) \
            from None
    return t.TypedSpec(spec.name, filename, source, spec.dims, spec.sizes, spec.tensors, spec.outputs, spec.checks,
                       spec.notes)
