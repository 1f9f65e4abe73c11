"""Triton syntax for a core's score in entry form: one tile of it as a `triton.language` expression.

Contract: `TritonPrinter(core, spec).tile(node)` returns the Triton
expression of an entry expression of the attention plan
(`symattn.codegen.plan`) on a tile: the coordinates are the kernel's
variables, the head coordinates `z0_`, ... (scalars), the query row `i_` (a
[BLOCK_M, 1] tensor) and the key `j_` (a [1, BLOCK_N] tensor); the product is
the tile `s_` the kernel holds; an entry of a given tensor (`t.Entry`) is a
masked `tl.load` through its pointer `T_<name>`, its batch stride
`T_<name>_bs` and its strides `T_<name>_s<axis>`, at subscripts computed in
integers (`address` gives the offset, for the backward's scatter-add too).
Dims are the kernel arguments `D_<dim>`. The operations form tables (`UNARY`
from the function records' `triton` spellings, `BINARY`, `COMPARISON`); a
node type without a rule is a `CodegenError` that names it.
"""

from __future__ import annotations

from typing import Mapping

import sympy
from sympy.printing.precedence import precedence
from sympy.printing.str import StrPrinter

from ...errors import CodegenError
from ...ir import typed as t
from ...ir.affine import pieces, signed_sum
from ...ir.functions import table
from ...ir import printer as base
from ...ir.printer import ADD, ATOM, COMPARE, NEG, PRECEDENCE, Printed, Printer
from ..plan import KEY, ROW, AttentionCore, DropoutEntry, ProductEntry

__all__ = ["TritonPrinter", "UNARY", "BINARY", "COMPARISON", "dim_py", "float_py", "operand_args"]

# fn -> template over the operand (a float32 tile), live over the function records (`triton`). tanh
# and pow go through helpers of the generated module (`_tanh`, `_pow`): libdevice on a GPU, plain
# arithmetic under the interpreter.
UNARY: Mapping[str, str] = table("triton")
BINARY = {op: symbol for op, symbol in base.BINARY.items() if op != "pow"}  # (pow: the helper `_pow`)
COMPARISON = base.COMPARISON
LOGICAL = base.LOGICAL


def float_py(value: sympy.Expr) -> str:
    """A float literal in Triton source (`float("-inf")` for the infinities)."""
    if value == sympy.oo:
        return 'float("inf")'
    if value == -sympy.oo:
        return 'float("-inf")'
    return repr(float(value))


class _IntPrinter(StrPrinter):
    """SymPy's text, a power of a dim with a positive integer exponent written as a product (`D_N*D_N`): a kernel
    argument is a Triton scalar, which has no `**`."""

    def _print_Pow(self, expr):
        base, exp = expr.as_base_exp()
        if exp.is_Integer and exp > 0:
            return "*".join([self.parenthesize(base, precedence(expr))] * int(exp))
        return super()._print_Pow(expr)


def dim_py(dim) -> str:
    """A dim expression as Python int arithmetic over the kernel's `D_<dim>` arguments."""
    dim = sympy.sympify(dim)
    num, den = sympy.fraction(sympy.together(dim))
    rename = {s: sympy.Symbol(f"D_{s.name}", integer=True) for s in dim.free_symbols}
    text = _IntPrinter().doprint(num.subs(rename))
    return f"(({text}) // ({den.subs(rename)}))" if den != 1 else f"({text})" if not num.is_Atom else text


def operand_args(core: AttentionCore, spec: t.TypedSpec, grad: bool = False) -> list[str]:
    """The kernel arguments of the tensors the score loads: pointer, batch stride, strides (or their gradients')."""
    out = []
    for name in (core.learned if grad else core.read_tensors):
        rank = len(spec.tensors[name].shape)
        prefix = "G" if grad else "T"
        out += [f"{prefix}_{name}", f"{prefix}_{name}_bs", *[f"{prefix}_{name}_s{k}" for k in range(rank)]]
    return out


class TritonPrinter(Printer):
    """Prints one core's entry expressions as tile expressions."""

    precedence = {**PRECEDENCE, "pow": ATOM}
    error = CodegenError
    rules = "Triton"

    def __init__(self, core: AttentionCore, spec: t.TypedSpec) -> None:
        self.core = core
        self.spec = spec
        self.coords = {ROW: "i_", KEY: "j_", **{f"z{k}": f"z{k}_" for k in range(len(core.lead))}}

    def tile(self, node: t.Node) -> str:
        return self.doprint(node).text

    def unknown(self, node, *context) -> Printed:
        raise CodegenError(f"no Triton rule for {type(node).__name__} in an attention score")

    # --- integer-valued expressions: coordinates and subscripts stay in int ------------------------

    def integer(self, node: t.Node) -> str | None:
        rule = self.rule("_integer_", type(node))
        return None if rule is None else rule(self, node)

    def _integer_IndexVar(self, node: t.IndexVar) -> str | None:
        return self.coords[node.name]

    def _integer_DimValue(self, node: t.DimValue) -> str | None:
        return dim_py(node.dim)

    def _integer_Scalar(self, node: t.Scalar) -> str | None:
        return str(int(node.value)) if node.value.is_Integer else None

    def _integer_Unary(self, node: t.Unary) -> str | None:
        if node.fn in ("floor", "ceil"):  # of a real: an integer (T5's log buckets)
            return self._floor_to_int(node)
        inner = self.integer(node.x) if node.fn in ("neg", "abs") else None
        if inner is None:
            return None
        return f"(-{inner})" if node.fn == "neg" else f"tl.abs({inner})"

    def _integer_Binary(self, node: t.Binary) -> str | None:
        if node.op not in ("add", "sub", "mul"):
            return None
        a, b = self.integer(node.a), self.integer(node.b)
        return None if a is None or b is None else f"({a} {BINARY[node.op]} {b})"

    def _integer_Entry(self, node: t.Entry) -> str | None:
        """An entry of an integer buffer (`doc[i]`, `table[j // S]`): loaded and held as int32."""
        info = self.spec.tensors.get(node.tensor)
        if info is None or not info.integer or node.grad:
            return None
        offset, mask = self.address(node)
        masked = f", mask={mask}, other=0" if mask else ""
        return f"tl.load(T_{node.tensor} + {offset}{masked}).to(tl.int32)"

    def _integer_Apply(self, node: t.Apply) -> str | None:
        args = [self.integer(a) for a in node.args]
        if any(a is None for a in args):
            return None
        if node.fn in ("floordiv", "mod"):
            return f"_{node.fn}({args[0]}, {args[1]})"
        if node.fn == "clamp":
            return f"tl.minimum(tl.maximum({args[0]}, {args[1]}), {args[2]})"
        return f"tl.{node.fn}imum({args[0]}, {args[1]})"

    def _floor_to_int(self, node: t.Unary) -> str:
        x = self.doprint(node.x).text
        return f"tl.floor({x}).to(tl.int32)" if node.fn == "floor" else f"tl.ceil({x}).to(tl.int32)"

    def subscript(self, s) -> str:
        """A subscript (a coordinate's name, an Affine, or an integer node: `offsets[doc[i]]`, `j // S`) as
        integer arithmetic on the kernel's coordinates."""
        if isinstance(s, str):
            return self.coords[s]
        if isinstance(s, t.Node):
            text = self.integer(s)
            if text is None:
                raise CodegenError(f"no Triton rule for the integer subscript {type(s).__name__}")
            return f"({text})"
        parts = [(p.negative, dim_py(p.dims) if p.index is None else self.coords[p.index] if p.coefficient == 1
                  else f"{p.coefficient} * {self.coords[p.index]}") for p in pieces(s)]
        return f"({signed_sum(parts) or '0'})"

    def address(self, entry: t.Entry, prefix: str = "T") -> tuple[str, str]:
        """(offset, mask) of an entry of a given tensor: `prefix_<name> + offset`, valid where the tile is."""
        name = entry.tensor
        terms = [f"b_ * {prefix}_{name}_bs"]
        for k, s in enumerate(entry.indices):
            sub = self.subscript(s)
            if sub != "(0)":
                terms.append(f"{sub} * {prefix}_{name}_s{k}")
        reads = " ".join(self.subscript(s) for s in entry.indices)
        masks = [m for c, m in (("i_", "(i_ < n_q_)"), ("j_", "(j_ < n_k_)")) if c in reads]
        return " + ".join(terms), " & ".join(masks)

    # --- the rules ------------------------------------------------------------------------------

    def _print_ProductEntry(self, node: ProductEntry) -> Printed:
        return Printed("s_", ATOM)

    def _print_Entry(self, node: t.Entry) -> Printed:
        exact = self._integer_Entry(node)
        if exact is not None:
            return Printed(f"tl.cast({exact}, tl.float32)", self.prec("call"))
        offset, mask = self.address(node)
        masked = f", mask={mask}, other=0.0" if mask else ""
        return Printed(f"tl.load(T_{node.tensor} + {offset}{masked}).to(tl.float32)", ATOM)

    def _print_DropoutEntry(self, node: DropoutEntry) -> Printed:
        """The mask drawn on the tile: 1.0 where Philox keeps position base + index (int64), else 0.0; base and
        seed are entries 0 and 1 of the mask tensor's int64 (offset, seed) at the batch entry."""
        base, seed = (f"tl.load(T_{e.tensor} + {self.address(e)[0]})" for e in (node.base, node.seed))
        keep = f"_dropout_keep_block({seed}, {node.stream}, {base} + {self.position(node.index)}, {node.threshold})"
        return Printed(f"tl.where({keep}, 1.0, 0.0)", self.prec("call"))

    def position(self, node: t.Node) -> str:
        """A flat position (coordinates, integers and dims) as int64 arithmetic: positions reach 2**31."""
        if isinstance(node, t.IndexVar):
            return f"{self.coords[node.name]}.to(tl.int64)"
        if isinstance(node, t.DimValue):
            return dim_py(node.dim)
        if isinstance(node, t.Scalar) and sympy.sympify(node.value).is_integer:
            return str(int(node.value))
        if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
            return f"({self.position(node.a)} {BINARY[node.op]} {self.position(node.b)})"
        raise CodegenError(f"no Triton rule for the dropout position {type(node).__name__}")

    def _print_Scalar(self, node: t.Scalar) -> Printed:
        text = float_py(node.value)
        return Printed(text, self.prec("neg") if text.startswith("-") else ATOM)

    def _print_DimValue(self, node: t.DimValue) -> Printed:
        dim = sympy.sympify(node.dim)
        if dim.is_Integer:
            return Printed(float_py(dim))
        return Printed(f"tl.cast({dim_py(dim)}, tl.float32)", self.prec("call"))

    def _print_IndexVar(self, node: t.IndexVar) -> Printed:
        return Printed(f"tl.cast({self.coords[node.name]}, tl.float32)", self.prec("call"))

    def _print_Unary(self, node: t.Unary) -> Printed:
        x = self.doprint(node.x)
        if node.fn == "neg":
            return Printed("-" + self.parenthesize(x, NEG), self.prec("neg"))
        if not UNARY.get(node.fn):
            raise CodegenError(f"no Triton rule for the function {node.fn}")
        return Printed(UNARY[node.fn].format(x=x.text), self.prec("call"))

    def _print_Binary(self, node: t.Binary) -> Printed:
        exact = self.integer(node) if node.op in ("add", "sub", "mul") else None
        if exact is not None:  # index arithmetic: exact in int, then a value
            return Printed(f"tl.cast({exact}, tl.float32)", self.prec("call"))
        a = self.doprint(node.a)
        if node.op == "pow" and isinstance(node.b, t.Scalar) and node.b.value == 2:
            return Printed(self.infix(a, "*", a, self.prec("mul")), self.prec("mul"))
        b = self.doprint(node.b)
        if node.op == "pow":
            return Printed(f"_pow({a.text}, {b.text})", self.prec("call"))
        level = self.prec(node.op)
        return Printed(self.infix(a, BINARY[node.op], b, level), level)

    def _print_Compare(self, node: t.Compare) -> Printed:
        a, b = self.integer(node.a), self.integer(node.b)
        if a is None or b is None:
            a = self.parenthesize(self.doprint(node.a), ADD)
            b = self.parenthesize(self.doprint(node.b), ADD)
        return Printed(f"{a} {COMPARISON[node.op]} {b}", self.prec("compare"))

    def _print_Logical(self, node: t.Logical) -> Printed:
        parts = [self.fence(self.doprint(x).text) for x in node.args]
        if node.op == "not":
            return Printed(f"{LOGICAL['not']}{parts[0]}", NEG)
        return Printed(f" {LOGICAL[node.op]} ".join(parts), COMPARE)

    def _print_Apply(self, node: t.Apply) -> Printed:
        exact = self.integer(node)
        if exact is not None:  # integer arithmetic (// % min max clamp of integers), then a value
            return Printed(f"tl.cast({exact}, tl.float32)", self.prec("call"))
        args = [self.doprint(a).text for a in node.args]
        if node.fn == "clamp":
            return Printed(f"tl.minimum(tl.maximum({args[0]}, {args[1]}), {args[2]})", self.prec("call"))
        if node.fn not in ("min", "max"):
            raise CodegenError(f"no Triton rule for {node.fn} of real values")
        return Printed(f"tl.{node.fn}imum({args[0]}, {args[1]})", self.prec("call"))

    def _print_Where(self, node: t.Where) -> Printed:
        cond = self.doprint(node.cond).text
        a, b = self.doprint(node.a).text, self.doprint(node.b).text
        return Printed(f"tl.where({cond}, {a}, {b})", self.prec("call"))

    def masked(self, keep: t.Node | None, value: t.Node) -> str:
        """where(keep, value, -inf) on the tile (value itself where nothing is masked)."""
        text = self.tile(value)
        if keep is None:
            return text
        return f'tl.where({self.tile(keep)}, {text}, float("-inf"))'
