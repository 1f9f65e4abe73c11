"""The array printer: typed-IR nodes of a program as NumPy or torch expressions and statements.

Contract: `ArrayPrinter(program, spelling)` prints one `Program`
(`symattn.codegen.program`) in the array language `spelling`
(`symattn.codegen.arrays.syntax`: NUMPY or TORCH): `statement(k, stmt)`
returns the lines of code for statement k and records the runtime helpers
they call in `.helpers`. It is a `Printer` (`symattn.ir.printer`) with one
`_print_<Node>` method per node type and `_dim_<Expr>` per kind of dim
expression, on the shared precedence table as Python binds it; every
spelling comes from the `Spelling` table, never from editing printed text.
Arrays keep their dtype: constants are Python numbers (both libraries treat
them as "weak") or arrays made in the computation's dtype, and positions stay
integers where the spelling says so (torch: exact at every size) until they
meet a value. Operands of a lower rank that may carry batch axes get axes
inserted so that batch axes line up. Elementwise chains are computed in place
(`S = Q @ K.T` then `S += M`) when the buffer is fresh, or dead and owned,
and the operand's batch axes fit into it; the softmax and its backward
overwrite their input when nothing reads it later. `Program` supplies the
liveness that makes those decisions safe.

The statements of a fused attention core (`FusedAttention`,
`FusedAttentionGrad`) are each target's own: a target subclasses the printer
and defines `fused_statement(var, node)`; `fused` maps each such statement's
variable to the names it binds (the gradients, the row log-sum-exp), which
`FusedPart` and `FusedLse` read.
"""

from __future__ import annotations

import sympy

from ...errors import CodegenError
from ...ir import typed as t
from ...ir.printer import ADD, ATOM, MUL, NEG, POW
from ..index import IndexArray, LEntry, LScalarTensor, LVar
from ..program_ir import (Arange, DropoutBase, DropoutMask, FusedAttention, FusedAttentionGrad, FusedLse, FusedPart, Program, SoftmaxGrad, Stmt,
                          Var, walk_labelled)
from .index_printer import IndexNotationPrinter
from .syntax import INPLACE, SCALAR_UNARY, Code, Spelling

__all__ = ["ArrayPrinter"]


class ArrayPrinter(IndexNotationPrinter):
    """Print one `Program` in one array language (see the module docstring)."""

    def __init__(self, program: Program, spell: Spelling) -> None:
        self.spell = spell
        self.p = program
        self.spec = program.spec
        self.helpers: set[str] = set()
        self.k = 0  # the statement being printed
        self.owned: dict[str, bool] = {}
        self.parent: dict[str, str] = {}
        self.dims = {self.spec.dims[n].symbol: v for n, v in program.dim_vars.items()}
        self.fused: dict[str, tuple[str, ...]] = {}  # fused core or gradient variable -> the names it binds
        self.integers: set[str] = {program.tensor_vars[n] for n in self.spec.buffers  # positions, integer
                                   if self.spec.tensors[n].integer  # buffers: kept as integers
                                   and self.spec.tensors[n].dropout is None}  # (a dropout mask: its values')

    # --- dims and scalars -----------------------------------------------------------------

    def dim(self, expr, integer: bool = True) -> Code:
        """A dim expression as Python arithmetic on the size variables.

        A quotient is printed over one common denominator, `(N + 1) // 2` (exact
        integer division where a size is meant: the module checks up front that
        it divides, see `symattn.codegen.numpy.emit._exact_dims`), or `(N + 1) / 2` where the value is a number.
        """
        expr = sympy.sympify(expr)
        num, den = sympy.fraction(sympy.together(expr))
        if den != 1 and not expr.is_Rational:
            top, bottom = self._polynomial(num, integer), self._polynomial(den, integer)
            text = f"{self.parenthesize(top, MUL)} {'//' if integer else '/'} {self.parenthesize(bottom, MUL + 1)}"
            return Code(text, MUL, carrying=False)
        return self._polynomial(expr, integer)

    def _polynomial(self, expr, integer: bool) -> Code:
        rule = self.rule("_dim_", type(expr))
        if rule is None:
            raise CodegenError(f"cannot print the dim expression {expr}")
        return rule(self, expr, integer)

    def _dim_Integer(self, expr: sympy.Integer, integer: bool) -> Code:
        return Code(str(int(expr)), ATOM if expr >= 0 else self.prec("neg"), carrying=False)

    def _dim_Rational(self, expr: sympy.Rational, integer: bool) -> Code:
        return Code(f"{expr.p} / {expr.q}", self.prec("div"), carrying=False)

    def _dim_Symbol(self, expr: sympy.Symbol, integer: bool) -> Code:
        if expr not in self.dims:
            raise CodegenError(f"unknown dim {expr}")
        return Code(self.dims[expr], carrying=False)

    def _dim_Add(self, expr: sympy.Add, integer: bool) -> Code:
        terms = [self.dim(a, integer) for a in expr.as_ordered_terms()]
        text = terms[0].text
        for term in terms[1:]:
            text += f" - {term.text[1:]}" if term.text.startswith("-") else f" + {self.parenthesize(term, ADD + 1)}"
        return Code(text, self.prec("add"), carrying=False)

    def _dim_Mul(self, expr: sympy.Mul, integer: bool) -> Code:
        coeff, rest = expr.as_coeff_Mul()
        num, den = sympy.fraction(coeff)
        factors = ([str(num)] if num != 1 else []) + [self.parenthesize(self.dim(f, integer), MUL + 1)
                                                   for f in sympy.Mul.make_args(rest)]
        text = " * ".join(factors) if factors else "1"
        if den != 1:
            text = f"{text} {'//' if integer else '/'} {den}"
        return Code(text, self.prec("mul"), carrying=False)

    def _dim_Pow(self, expr: sympy.Pow, integer: bool) -> Code:
        base, exp = expr.as_base_exp()
        if exp == sympy.Rational(1, 2):
            return Code(f"{self.parenthesize(self.dim(base, integer), ATOM)} ** 0.5", POW, carrying=False)
        return Code(f"{self.parenthesize(self.dim(base, integer), ATOM)} ** {self.parenthesize(self.dim(exp), NEG)}",
                    self.prec("pow"), carrying=False)

    def shape_tuple(self, shape) -> str:
        parts = [self.dim(d).text for d in shape]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def number(self, value) -> Code:
        value = sympy.sympify(value)
        if value == sympy.oo:
            return Code(self.spell.numbers["inf"], carrying=False)
        if value == -sympy.oo:
            return Code(f"-{self.spell.numbers['inf']}", NEG, carrying=False)
        if value == sympy.pi:
            return Code(self.spell.numbers["pi"], carrying=False)
        if value.is_Integer:
            return Code(str(int(value)), ATOM if value >= 0 else NEG, carrying=False)
        if value.is_Rational:
            as_float = float(value)
            if sympy.Rational(repr(as_float)) == value:
                return Code(repr(as_float), ATOM if as_float >= 0 else NEG, carrying=False)
            return Code(f"{value.p} / {value.q}", MUL, carrying=False)
        return Code(repr(float(value)), ATOM, carrying=False)

    # --- values ----------------------------------------------------------------------------

    def sources(self, node) -> frozenset:
        found: set[str] = set()
        for n in walk_labelled(node):
            var = n.name if isinstance(n, Var) else n.var if isinstance(n, (LVar, LEntry, LScalarTensor)) else None
            if var is not None:
                found |= self.p.info[var].sources
        return frozenset(found)

    def batched(self, node) -> bool:
        return bool(self.sources(node))

    def aligned(self, node: t.Node, rank: int) -> Code:
        """`node` printed, with axes inserted before its own so that its batch axes line up at `rank`."""
        code = self.doprint(node)
        own = len(node.shape)
        if own >= rank or not self.batched(node):
            return code
        return self.new_axes(code, rank - own, own)

    def new_axes(self, code: Code, new: int, own: int) -> Code:
        """`code[..., None, :]`: `new` axes of size 1 inserted before the last `own` ones."""
        index = ", ".join(["..."] + ["None"] * new + [":"] * own)
        return Code(f"{self.parenthesize(code, ATOM)}[{index}]", self.prec("slice"), False, code.carrying)

    def _print_Var(self, node: Var) -> Code:
        return Code(node.name, ATOM, fresh=False, carrying=node.name not in self.integers)

    def _print_Scalar(self, node: t.Scalar) -> Code:
        return self.number(node.value)

    def _print_DimValue(self, node: t.DimValue) -> Code:
        return self.dim(node.dim, integer=False)

    def reciprocal(self, node: t.Node) -> Code:
        """1 / node for a constant scalar, as Python arithmetic: `d_k ** -0.5` for sqrt(d_k)."""
        if isinstance(node, t.Unary) and node.fn == "sqrt":
            return Code(f"{self.parenthesize(node.x, POW + 1)} ** -0.5", POW, carrying=False)
        if isinstance(node, t.Scalar) and node.value != 0:
            return self.number(1 / node.value)
        return Code(f"1 / {self.parenthesize(node, MUL + 1)}", MUL, carrying=False)

    def _constant_scalar(self, node: t.Node) -> bool:
        return node.shape == () and not self.batched(node) and not any(
            isinstance(n, (Var, t.Constant, IndexArray)) for n in _nodes(node))

    def _print_Unary(self, node: t.Unary) -> Code:
        x = self.doprint(node.x)
        if self._constant_scalar(node):  # Python arithmetic keeps the scalar "weak": no upcast of float32
            if node.fn in SCALAR_UNARY:
                need = POW + 1 if node.fn == "sqrt" else NEG
                return Code(SCALAR_UNARY[node.fn].format(x=self.parenthesize(x, need)),
                            POW if node.fn == "sqrt" else NEG, carrying=False)
            helper = self.spell.functions[node.fn][1] if node.fn not in self.spell.scalar_function else None
            if helper:
                self.helpers.add(helper)
            return self.spell.scalar(node.fn, x.text)
        template, helper = self.spell.functions[node.fn]
        if helper:
            self.helpers.add(helper)
        if node.fn == "neg":
            return Code(f"-{self.parenthesize(x, NEG)}", self.prec("neg"), True, x.carrying)
        return Code(template.format(x=x.text), ATOM, True, x.carrying)

    def _print_Binary(self, node: t.Binary) -> Code:
        rank = len(node.shape)
        if node.op == "div" and node.a.shape and self._constant_scalar(node.b):
            # an array divided by a constant is multiplied by its reciprocal: a multiplication is cheaper
            a = self.aligned(node.a, rank)
            return Code(self.infix(a, "*", self.reciprocal(node.b), MUL), MUL, True, a.carrying)
        a, b = self.aligned(node.a, rank), self.aligned(node.b, rank)
        return self.binary(node.op, a, b, a.carrying or b.carrying)

    def _print_MatMul(self, node: t.MatMul) -> Code:
        a_node, b_node = node.a, node.b
        a, b = self.doprint(a_node), self.doprint(b_node)
        ra, rb = len(a_node.shape), len(b_node.shape)
        squeeze = ""
        if ra == 1 and self.batched(a_node):  # a batched vector: make it a row, take the row back after
            a, ra, squeeze = Code(f"{self.parenthesize(a, ATOM)}[..., None, :]", ATOM, False), 2, "[..., 0, :]"
        if rb == 1 and self.batched(b_node):
            b, rb = Code(f"{self.parenthesize(b, ATOM)}[..., :, None]", ATOM, False), 2
            squeeze = "[..., 0, 0]" if squeeze else "[..., 0]"
        rank = max(ra, rb)
        if ra < rank and self.batched(a_node):
            a = self.new_axes(a, rank - ra, ra)
        if rb < rank and self.batched(b_node):
            b = self.new_axes(b, rank - rb, rb)
        level = self.prec("matmul")
        left = self.fence(a.text) if a.prec == MUL else self.parenthesize(a, level)  # `(Q / c) @ K`, not `Q / c @ K`
        text = f"{left} @ {self.parenthesize(b, level + 1)}"
        if squeeze:
            return Code(f"{self.fence(text)}{squeeze}", ATOM, False)
        return Code(text, level, True)

    def _print_Transpose(self, node: t.Transpose) -> Code:
        x = self.doprint(node.x)
        return Code(self.spell.transpose.format(x=self.parenthesize(x, ATOM)), self.prec("transpose"), False,
                    x.carrying)

    def _axis(self, axis, rank) -> str:
        if axis is None:
            return "(" + ", ".join(str(k) for k in range(-rank, 0)) + ("," if rank == 1 else "") + ")"
        return str(axis - rank)

    def _print_Reduce(self, node: t.Reduce) -> Code:
        rank = len(node.x.shape)
        inner = node.x
        if node.kind == "sum" and node.axis == rank - 1 and isinstance(inner, t.Binary) and inner.op == "mul" \
                and inner.a.shape == inner.b.shape == inner.shape and rank >= 1:
            self.helpers.add("_rowdot")  # no array of the products
            a, b = self.doprint(inner.a), self.doprint(inner.b)
            return Code(f"_rowdot({a.text}, {b.text})", ATOM, True, a.carrying or b.carrying)
        x = self.doprint(inner)
        if node.kind == "logsumexp":
            self.helpers.add("_logsumexp")
        return Code(self.spell.reduce[node.kind].format(x=x.text, axis=self._axis(node.axis, rank)), ATOM, True,
                    x.carrying)

    def _print_Scan(self, node: t.Scan) -> Code:
        x = self.doprint(node.x)
        if node.reverse:
            self.helpers.add("_reverse_cumsum")
        return Code(self.spell.scan[node.reverse].format(x=x.text, axis=node.axis - len(node.x.shape)), ATOM, True,
                    x.carrying)

    def _print_Softmax(self, node: t.Softmax) -> Code:
        axis = node.axis - len(node.x.shape)
        x = self.doprint(node.x)
        if x.fresh or self._dead(node.x):
            self.helpers.add("_softmax_")
            self.consumed = getattr(node.x, "name", None)
            return Code(f"_softmax_({x.text}, axis={axis})", ATOM, True, x.carrying)
        self.helpers.update({"_softmax", "_softmax_"})
        return Code(f"_softmax({x.text}, axis={axis})", ATOM, True, x.carrying)

    def _print_SoftmaxGrad(self, node: SoftmaxGrad) -> Code:
        p, rowdot = self.doprint(node.p), self.doprint(node.rowdot)
        g = self.doprint(node.g)
        if g.fresh or self._dead(node.g):
            self.helpers.add("_softmax_backward_")
            self.consumed = getattr(node.g, "name", None)
            return Code(f"_softmax_backward_({p.text}, {g.text}, {rowdot.text})", ATOM, True)
        self.helpers.add("_softmax_backward")
        return Code(f"_softmax_backward({p.text}, {g.text}, {rowdot.text})", ATOM, True)

    def _print_Compare(self, node: t.Compare) -> Code:
        rank = len(node.shape)
        a, b = self.aligned(node.a, rank), self.aligned(node.b, rank)
        return self.compare(node.op, a, b)

    def _print_Where(self, node: t.Where) -> Code:
        rank = len(node.shape)
        return self.where(*(self.aligned(n, rank) for n in (node.cond, node.a, node.b)))

    def _print_Logical(self, node: t.Logical) -> Code:
        rank = len(node.shape)
        args = [self.aligned(a, rank) for a in node.args]
        if self._constant_scalar(node):  # Python booleans: ~True is -2
            if node.op == "not":
                return Code(f"(not {self.fence(args[0].text)})", ATOM, carrying=False)
            return Code(self.fence(f" {node.op} ".join(self.fence(a.text) for a in args)), ATOM, carrying=False)
        return self.logical(node.op, args)

    def _print_Apply(self, node: t.Apply) -> Code:
        rank = len(node.shape)
        args = [self.aligned(a, rank) for a in node.args]
        if self._constant_scalar(node):  # Python numbers: Python's own min, max, //, %
            python = {"min": "min({0}, {1})", "max": "max({0}, {1})", "clamp": "min(max({0}, {1}), {2})",
                      "floordiv": "({0} // {1})", "mod": "({0} % {1})"}[node.fn]
            return Code(python.format(*(a.text for a in args)), ATOM, carrying=False)
        return self.operation(node.fn, args)

    def _print_MergeHeads(self, node: t.MergeHeads) -> Code:
        self.helpers.add("_merge_heads")
        return Code(f"_merge_heads({self.doprint(node.x).text})", ATOM, False)

    def _print_SplitHeads(self, node: t.SplitHeads) -> Code:
        self.helpers.add("_split_heads")
        return Code(f"_split_heads({self.doprint(node.x).text}, {self.dim(node.heads).text})", ATOM, False)

    def _print_Concat(self, node: t.Concat) -> Code:
        self.helpers.add("_concat")
        parts = ", ".join(self.doprint(p).text for p in node.parts)
        return Code(f"_concat([{parts}], axis={node.axis - len(node.shape)})", ATOM, True)

    def _print_Constant(self, node: t.Constant) -> Code:
        template, helper = self.spell.constant[node.kind]
        if helper:
            self.helpers.add(helper)
        args = ", ".join(self.dim(a).text for a in node.args)
        return Code(template.format(args=args), ATOM, True)

    def _print_SumTo(self, node: t.SumTo) -> Code:
        x = self.doprint(node.x)
        rank = len(node.x.shape)
        lead = rank - len(node.shape)
        kept = tuple(a - rank for a in node.axes if a >= lead)
        text = x.text
        if kept:
            text = self.spell.sum_kept.format(x=text, axes=kept[0] if len(kept) == 1 else kept)
        if lead:
            axes = tuple(range(-rank, -rank + lead))
            text = self.spell.sum_dropped.format(x=text, axes=axes[0] if len(axes) == 1 else axes)
        return Code(text, ATOM, True, x.carrying)

    def _print_Slice(self, node: t.Slice) -> Code:
        x = self.doprint(node.x)
        cut = f"{self.dim(node.start).text}:{self.dim(node.stop).text}"
        after = len(node.x.shape) - 1 - node.axis
        index = ", ".join(["...", cut] + [":"] * after)
        return Code(f"{self.parenthesize(x, ATOM)}[{index}]", self.prec("slice"), False, x.carrying)

    def _print_Scatter(self, node: t.Scatter) -> Code:
        self.helpers.add("_scatter")
        values = self.doprint(node.x)
        at = [self.index_array(s, node.x.indices, node.x.ranges) for s in node.targets]
        return Code(f"_scatter({values.text}, ({', '.join(at)},), {self.shape_tuple(node.shape)}, "
                    f"{len(node.x.indices)})", ATOM, True, values.carrying)

    def _print_IndexArray(self, node: IndexArray) -> Code:
        root = node.root
        target = node.indices
        if not root.labels and not self.batched(root):
            value = self.label(root)
            return Code(self.spell.full.format(shape=self.shape_tuple(node.ranges), value=value.text), ATOM, True)
        present = tuple(n for n in target if n in root.labels)
        code = self.label_aligned(root, target, keep_missing=True)
        if len(present) < len(target):
            self.helpers.add("_expand")
            code = Code(f"_expand({code.text}, {self.shape_tuple(node.ranges)})", ATOM, False, code.carrying)
        if not code.carrying:
            code = self.cast(code)
        return code

    def cast(self, code: Code) -> Code:
        """`code` (an array of bools or integers, say) as an array of the computation's dtype."""
        return Code(self.spell.cast.format(x=self.parenthesize(code, ATOM)), ATOM, True)

    # --- buffers: which arrays a statement may overwrite --------------------------------

    def _find(self, var: str) -> str:
        while self.parent.get(var, var) != var:
            var = self.parent[var]
        return var

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[ra] = rb

    def _dead(self, node) -> bool:
        """Whether `node` is a variable this code owns and that nothing reads after the current statement."""
        if not isinstance(node, Var):
            return False
        var = node.name
        if not self.owned.get(var):
            return False
        root = self._find(var)
        group = [v for v in self.owned if self._find(v) == root] + [v for v in self.p.info if
                                                                     self._find(v) == root]
        return all(self.p.info[v].last_use <= self.k for v in group if v in self.p.info)

    # --- statements ------------------------------------------------------------------------

    def statement(self, k: int, stmt: Stmt) -> list[str]:
        self.k = k
        self.consumed = None
        var = stmt.var
        if isinstance(stmt.node, Arange):
            self.owned[var] = True
            if self.spell.integer_positions:
                self.integers.add(var)
            return [f"{var} = {self.spell.arange_values.format(n=self.dim(stmt.node.size).text)}"]
        if isinstance(stmt.node, DropoutMask):
            self.owned[var] = True
            self.helpers.add("_dropout_mask")
            node = stmt.node
            return [f"{var} = _dropout_mask({self.p.seed}, {node.stream}, {self.doprint(node.like).text}, "
                    f"{node.threshold})"]
        if isinstance(stmt.node, DropoutBase):
            self.owned[var] = True
            self.integers.add(var)
            self.helpers.add("_dropout_base")
            sources = "".join(f", ({self.doprint(v).text}, {rank})" for v, rank in stmt.node.sources)
            return [f"{var} = _dropout_base({self.dim(stmt.node.size).text}, {self.p.seed}{sources})"]
        if isinstance(stmt.node, (FusedAttention, FusedAttentionGrad)):
            self.owned[var] = True
            return self.fused_statement(var, stmt.node)
        if isinstance(stmt.node, FusedLse):
            return self.fused_lse(var, stmt.node)
        if stmt.labels is not None:
            code = self.label(stmt.node)
            self._record(var, stmt, code.fresh)
            if not code.carrying:
                return [f"{var} = {self.cast(code).text}"]
            return [f"{var} = {code.text}"]
        lines = self._in_place(var, stmt)
        if lines is None:
            code = self.doprint(stmt.node)
            lines = [f"{var} = {code.text}"]
            self._record(var, stmt, code.fresh)
        return lines

    # --- fused attention cores: each target's own ---------------------------------------------

    def fused_statement(self, var: str, node) -> list[str]:
        """The code of a `FusedAttention` or `FusedAttentionGrad` statement (see the module docstring)."""
        raise CodegenError(f"this target computes no fused attention core ({node.core})")

    def lse_name(self, core: str) -> str:
        """The variable of a fused core's row log-sum-exp: the spec's tensor that is it, else one chosen once."""
        if core not in self.fused:
            lse = self.p.cores[core].lse
            if lse is not None and lse in self.p.tensor_vars:
                self.fused[core] = (self.p.tensor_vars[lse],)
            else:
                base = self.p.tensor_vars.get(core, "core")
                self.fused[core] = (self.p.names.numbered(f"{base if base.isidentifier() else 'core'}_lse"),)
        return self.fused[core][-1]

    def fused_lse(self, var: str, node: FusedLse) -> list[str]:
        """A tensor of the spec that is a core's row log-sum-exp: the fused forward wrote it already."""
        self.owned[var] = True
        name = self.lse_name(self.p.info[node.x.name].node.core)
        return [] if name == var else [f"{var} = {name}"]

    def _print_FusedPart(self, node: FusedPart) -> Code:
        return Code(self.fused[node.x.name][node.index], ATOM, fresh=False)

    def _record(self, var: str, stmt: Stmt, fresh: bool) -> None:
        self.owned[var] = fresh or self.consumed is not None
        if self.consumed is not None:
            self._union(var, self.consumed)
        elif not fresh:
            for read in stmt.reads:
                self._union(var, read)

    def released(self, k: int) -> list[str]:
        """Variables to `del` after statement k: buffers of a quadratic shape ([N, N]) that nothing reads
        any more, so they do not stay alive to the end of the function."""
        groups: dict[str, list[str]] = {}
        for var in self.owned:
            groups.setdefault(self._find(var), []).append(var)
        out = []
        for members in groups.values():
            infos = [self.p.info[v] for v in members if v in self.p.info]
            if not infos or any(i.section == "argument" for i in infos):
                continue
            last = max(i.last_use for i in infos)
            quadratic = any(len(set(i.shape)) < len(i.shape) for i in infos)
            if last == k and quadratic:
                out += sorted(members)
        return out

    def _in_place(self, var: str, stmt: Stmt) -> list[str] | None:
        """`var = base; var op= operand ...` when the elementwise chain can reuse one buffer."""
        node, ops = stmt.node, []
        while isinstance(node, t.Binary) and node.op in INPLACE:
            if self._fits(node, node.a, node.b):
                ops.append((node.op, node.b))
                node = node.a
            elif node.op in ("add", "mul") and self._fits(node, node.b, node.a):
                ops.append((node.op, node.a))
                node = node.b
            else:
                break
        if not ops:
            return None
        base = self.doprint(node)
        if not base.carrying:
            return None
        if not base.fresh:
            if not self._dead(node) or any(_mentions(operand, node.name) for _, operand in ops):
                return None
            self.consumed = node.name
        elif self.consumed is not None and any(_mentions(operand, self.consumed) for _, operand in ops):
            return None
        lines = [f"{var} = {base.text}"]
        for op, operand in reversed(ops):
            if op == "div" and self._constant_scalar(operand):
                lines.append(f"{var} *= {self.reciprocal(operand).text}")
            else:
                lines.append(f"{var} {INPLACE[op]} {self.aligned(operand, len(stmt.shape)).text}")
        self._record(var, stmt, True)
        return lines

    def _fits(self, node: t.Binary, base: t.Node, operand: t.Node) -> bool:
        """`base op= operand` gives `node`: same shape, and the operand's batch axes fit into the base's."""
        return (len(base.shape) > 0 and tuple(base.shape) == tuple(node.shape)
                and self.sources(operand) <= self.sources(base))


def _nodes(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, t.Node) and not isinstance(n, IndexArray):
            stack.extend(n.children)


def _mentions(node, var: str) -> bool:
    for n in _nodes(node):
        if isinstance(n, Var) and n.name == var:
            return True
        if isinstance(n, IndexArray):
            return True  # conservative
    return False
