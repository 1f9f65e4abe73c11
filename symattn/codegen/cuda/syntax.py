"""CUDA C syntax for typed-IR expressions: one entry of a tensor as a C expression.

Contract: `CPrinter(names, source).entry(node, coords)` returns the C
expression (float) for the entry of `node` at `coords`, a tuple of C int
expressions, one per axis of `node.shape`. Elementwise operations, `where`,
comparisons, transposes, head merges and splits, slices, concatenations and
constants become arithmetic on the coordinates (NumPy broadcasting by
aligning axes from the right); a tensor, a `grad(T)`, or a subexpression that
another kernel materialised is read from memory through `source.read`.
Index notation is printed with its index names; `sum(k, ...)` becomes a loop
statement collected in `statements`, and the expression reads its
accumulator. The operations form tables (`UNARY`, `BINARY`, `COMPARISON`); a node
type without a rule is an error that names it.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import sympy

from ...ir.functions import table
from ...ir import typed as t
from ...ir.affine import pieces, signed_sum
from ...ir import printer as base
from ...ir.printer import ADD, ATOM, COMPARE, NEG, PRECEDENCE, Printed, Printer
from ...errors import CodegenError
from .names import CNames

__all__ = ["CPrinter", "Source", "UNARY", "BINARY", "COMPARISON", "float_literal", "dim_c",
           "quotients", "numel_c", "offset_c", "align"]


# fn -> template over the operand (float32), read live from the function table
UNARY = table("cuda", {"neg": "-{x}"})
# The infix operators of the shared table; `pow` is the call `powf(a, b)` (`sa_square(a)` for a square), and C
# spells the logical operators its own way.
BINARY = {op: symbol for op, symbol in base.BINARY.items() if op != "pow"}
COMPARISON = base.COMPARISON
LOGICAL = {**base.LOGICAL, "and": "&&", "or": "||", "not": "!"}
CONSTANT: dict[str, Callable[[Sequence[str], Sequence[str]], str]] = {
    "ones": lambda coords, args: "1.0f",
    "eye": lambda coords, args: f"({coords[0]} == {coords[1]} ? 1.0f : 0.0f)",
    "causal_mask": lambda coords, args: f"({coords[1]} <= {coords[0]} ? 0.0f : -INFINITY)",
    "sinusoidal": lambda coords, args: f"sa_sinusoidal({coords[0]}, {coords[1]}, {args[1]})",
}


def float_literal(value: sympy.Expr) -> str:
    if value == sympy.oo:
        return "INFINITY"
    if value == -sympy.oo:
        return "-INFINITY"
    number = float(value)
    text = repr(number)
    if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
        text += ".0"
    return text + "f"


def dim_c(dim: sympy.Expr, names: CNames) -> str:
    """A dim expression (`h * d_k`) as C int arithmetic over the dim arguments.

    A quotient is one integer division over a common denominator, `((N + 1) / 2)`,
    exact for valid sizes (the host code refuses sizes at which it does not divide).
    """
    dim = sympy.sympify(dim)
    num, den = sympy.fraction(sympy.together(dim))
    printer = CDimPrinter(names)
    if den != 1:
        return f"({printer.doprint(num).text} / {printer.doprint(den).text})"
    return printer.doprint(dim).text


def quotients(dims) -> list[tuple[str, sympy.Expr, sympy.Expr]]:
    """(dim, numerator, denominator) of each dim expression that is a quotient (`d / h`), once each."""
    out = {}
    for dim in dims:
        num, den = sympy.fraction(sympy.together(sympy.sympify(dim)))
        if den != 1:
            out.setdefault(sympy.sympify(dim), (num, den))
    return [(dim, num, den) for dim, (num, den) in out.items()]


class CDimPrinter(Printer):
    """Dim expressions (SymPy) as C int arithmetic, every sum and product in brackets."""

    error = CodegenError

    def __init__(self, names: CNames) -> None:
        self.names = names

    def unknown(self, dim, *context) -> Printed:
        raise CodegenError(f"the dim expression {dim} is not integer arithmetic of dims")

    def _print_Integer(self, dim: sympy.Integer) -> Printed:
        return Printed(str(int(dim)))

    def _print_Symbol(self, dim: sympy.Symbol) -> Printed:
        return Printed(self.names.spec("dim", str(dim)))

    def _print_Add(self, dim: sympy.Add) -> Printed:
        return Printed(self.fence(" + ".join(self.doprint(a).text for a in dim.args)))

    def _print_Mul(self, dim: sympy.Expr) -> Printed:
        """A product of integer powers, the factors with negative exponents (and denominators) divided out."""
        top, bottom = [], []
        for factor in sympy.Mul.make_args(dim):
            if factor.is_Rational:
                if factor.p != 1:
                    top.append(str(factor.p))
                if factor.q != 1:
                    bottom.append(str(factor.q))
            elif factor.is_Pow and factor.exp.is_Integer:
                side = top if factor.exp > 0 else bottom
                side += [self.doprint(factor.base).text] * abs(int(factor.exp))
            else:
                top.append(self.doprint(factor).text)
        text = " * ".join(top) or "1"
        return Printed(self.fence(f"{text} / {self.fence(' * '.join(bottom))}" if bottom else text))

    _print_Rational = _print_Mul

    def _print_Pow(self, dim: sympy.Pow) -> Printed:
        return self._print_Mul(dim) if dim.exp.is_Integer else self.unknown(dim)


def numel_c(shape: Sequence[sympy.Expr], names: CNames) -> str:
    """The number of entries of a shape, as a C `long long` expression."""
    if not shape:
        return "1LL"
    return " * ".join(["(long long)" + dim_c(shape[0], names)] + [dim_c(d, names) for d in shape[1:]])


def _atom(coord: str) -> str:
    return coord if coord.replace("_", "a").isalnum() else f"({coord})"


def offset_c(coords: Sequence[str], shape: Sequence[sympy.Expr], names: CNames) -> str:
    """The row-major offset of `coords` in a contiguous tensor of `shape` (long long when rank > 1)."""
    text = None
    for k, (coord, dim) in enumerate(zip(coords, shape)):
        if text is None:
            if coord != "0":
                text = _atom(coord) if k == len(shape) - 1 else f"(long long){_atom(coord)}"
            continue
        scaled = f"{text if ' + ' not in text else f'({text})'} * {dim_c(dim, names)}"
        text = scaled if coord == "0" else f"{scaled} + {_atom(coord)}"
    return text if text is not None else "0"


def align(child_shape, parent_shape, coords: Sequence[str]) -> tuple[str, ...]:
    """A broadcast operand's coordinates: trailing axes line up, size-1 axes read entry 0."""
    lead = len(parent_shape) - len(child_shape)
    out = []
    for k, dim in enumerate(child_shape):
        parent = parent_shape[lead + k]
        out.append("0" if dim == 1 and parent != 1 else coords[lead + k])
    return tuple(out)


class Source(Protocol):
    def read(self, node: t.Node, coords: tuple[str, ...]) -> str | None:
        """A memory read of `node` at `coords`, or None when `node` is computed inline."""


class CPrinter(Printer):
    """Prints one kernel's expressions; `statements` collects the loops of index sums.

    A `Printer` whose rules take the entry's coordinates as context; C differs from the shared
    precedence table only in `pow`, a call here. `special` names nodes whose value a kernel
    already holds (an accumulator); `integer` is a second family of rules, `_integer_<Node>`.
    """

    precedence = {**PRECEDENCE, "pow": ATOM}
    error = CodegenError
    rules = "CUDA"

    def __init__(self, names: CNames, source: Source, indices: dict[str, str] | None = None,
                 special: dict[t.Node, str] | None = None, indent: str = "        ") -> None:
        self.names = names
        self.source = source
        self.indices = dict(indices or {})
        self.special = dict(special or {})
        self.statements: list[str] = []
        self.indent = indent
        self._locals = 0

    def entry(self, node: t.Node, coords: Sequence[str] = ()) -> str:
        return self.doprint(node, tuple(coords)).text

    def doprint(self, node, *context) -> Printed:
        if self.special and node in self.special:
            return Printed(self.special[node], ATOM)
        return super().doprint(node, *context)

    def unknown(self, node, coords) -> Printed:
        text = self.source.read(node, coords)  # a value the planner stored (a fused kernel's result)
        if text is None:
            return super().unknown(node, coords)
        return Printed(text, ATOM)

    def _child(self, child: t.Node, parent: t.Node, coords) -> Printed:
        """An operand, at the coordinates it is read at when broadcast to `parent`."""
        return self.doprint(child, align(child.shape, parent.shape, coords))

    def _dim(self, dim) -> str:
        return dim_c(dim, self.names)

    # --- integer-valued expressions: index arithmetic and comparisons stay in int ---------

    def integer(self, node: t.Node) -> str | None:
        """`node` as C int arithmetic when it is index/dim/integer arithmetic, else None."""
        rule = self.rule("_integer_", type(node))
        return None if rule is None else rule(self, node)

    def _integer_IndexVar(self, node: t.IndexVar) -> str | None:
        return self.indices[node.name]

    def _integer_DimValue(self, node: t.DimValue) -> str | None:
        return self._dim(node.dim)

    def _integer_Scalar(self, node: t.Scalar) -> str | None:
        return str(int(node.value)) if node.value.is_Integer else None

    def _integer_Unary(self, node: t.Unary) -> str | None:
        if node.fn in ("floor", "ceil"):  # of a real: an integer (T5's log buckets)
            return f"(int){node.fn}f({self.doprint(node.x, ()).text})"
        inner = self.integer(node.x) if node.fn in ("neg", "abs") else None
        if inner is None:
            return None
        return f"(-{inner})" if node.fn == "neg" else f"abs({inner})"

    def _integer_Entry(self, node: t.Entry) -> str | None:
        """An entry of an integer buffer (`doc[i]`): held as float32 in device memory (exact below 2^24)."""
        if node.grad or not getattr(self.source, "integer", lambda name: False)(node.tensor):
            return None
        return f"(int){self._print_Entry(node, ()).text}"

    def _integer_Apply(self, node: t.Apply) -> str | None:
        args = [self.integer(a) for a in node.args]
        if any(a is None for a in args):
            return None
        if node.fn in ("floordiv", "mod"):
            return f"sa_{node.fn}({args[0]}, {args[1]})"
        if node.fn == "clamp":
            return f"sa_imin(sa_imax({args[0]}, {args[1]}), {args[2]})"
        return f"sa_i{node.fn}({args[0]}, {args[1]})"

    def _integer_Binary(self, node: t.Binary) -> str | None:
        if node.op not in ("add", "sub", "mul"):
            return None
        a, b = self.integer(node.a), self.integer(node.b)
        if a is None or b is None:
            return None
        return f"({a} {BINARY[node.op]} {b})"

    # --- the rules ------------------------------------------------------------------------

    def _memory(self, node, coords) -> Printed:
        text = self.source.read(node, coords)
        if text is None:
            raise CodegenError(f"no CUDA rule for {type(node).__name__} here")
        return Printed(text, ATOM)

    _print_Tensor = _print_Grad = _print_MatMul = _print_Reduce = _print_Softmax = _print_SumTo = \
        _print_IndexDef = _print_Scan = _memory

    def _print_Scalar(self, node: t.Scalar, coords) -> Printed:
        text = float_literal(node.value)
        return Printed(text, self.prec("neg") if text.startswith("-") else ATOM)

    def _print_DimValue(self, node: t.DimValue, coords) -> Printed:
        return Printed(f"(float){self._dim(node.dim)}", self.prec("cast"))

    def _print_Unary(self, node: t.Unary, coords) -> Printed:
        x = self._child(node.x, node, coords)
        if node.fn == "neg":
            return Printed("-" + self.parenthesize(x, NEG), self.prec("neg"))
        return Printed(UNARY[node.fn].format(x=x.text), self.prec("call"))

    def _print_Binary(self, node: t.Binary, coords) -> Printed:
        a = self._child(node.a, node, coords)
        if node.op == "pow" and isinstance(node.b, t.Scalar) and node.b.value == 2:
            return Printed(f"sa_square({a.text})", self.prec("call"))
        b = self._child(node.b, node, coords)
        if node.op == "pow":
            return Printed(f"powf({a.text}, {b.text})", self.prec("pow"))
        level = self.prec(node.op)
        return Printed(self.infix(a, BINARY[node.op], b, level), level)

    def _print_Compare(self, node: t.Compare, coords) -> Printed:
        a, b = self.integer(node.a), self.integer(node.b)
        if a is None or b is None:
            a = self.parenthesize(self._child(node.a, node, coords), ADD)
            b = self.parenthesize(self._child(node.b, node, coords), ADD)
        return Printed(f"{a} {COMPARISON[node.op]} {b}", self.prec("compare"))

    def _print_Where(self, node: t.Where, coords) -> Printed:
        level = self.prec("where")
        cond = self.parenthesize(self._child(node.cond, node, coords), COMPARE)
        a = self.parenthesize(self._child(node.a, node, coords), level + 1)
        b = self.parenthesize(self._child(node.b, node, coords), level)
        return Printed(self.fence(f"{cond} ? {a} : {b}"), ATOM)

    def _print_Apply(self, node: t.Apply, coords) -> Printed:
        exact = self.integer(node) if node.shape == () else None
        if exact is not None:
            return Printed(f"(float){exact}", self.prec("cast"))
        args = [self._child(a, node, coords).text for a in node.args]
        if node.fn == "clamp":
            return Printed(f"sa_min(sa_max({args[0]}, {args[1]}), {args[2]})", self.prec("call"))
        if node.fn not in ("min", "max"):
            raise CodegenError(f"no CUDA rule for {node.fn} of real values")
        return Printed(f"sa_{node.fn}({args[0]}, {args[1]})", self.prec("call"))

    def _print_Logical(self, node: t.Logical, coords) -> Printed:
        parts = [self.fence(self._child(x, node, coords).text) for x in node.args]
        if node.op == "not":
            return Printed(f"{LOGICAL['not']}{parts[0]}", self.prec("neg"))
        return Printed(self.fence(f" {LOGICAL[node.op]} ".join(parts)), ATOM)

    def _print_Transpose(self, node: t.Transpose, coords) -> Printed:
        swapped = (*coords[:-2], coords[-1], coords[-2])
        return self.doprint(node.x, swapped)

    def _print_MergeHeads(self, node: t.MergeHeads, coords) -> Printed:
        # [..., h, N, k] -> [..., N, h * k]: column c is head c / k, entry c % k.
        *lead, row, col = coords
        per_head = self._dim(node.x.shape[-1])
        return self.doprint(node.x, (*lead, f"{col} / {per_head}", row, f"{col} % {per_head}"))

    def _print_SplitHeads(self, node: t.SplitHeads, coords) -> Printed:
        # [..., N, h * k] -> [..., h, N, k]: head hh, entry kk is column hh * k + kk.
        *lead, head, row, col = coords
        per_head = self._dim(node.shape[-1])
        return self.doprint(node.x, (*lead, row, f"{head} * {per_head} + {col}"))

    def _print_Slice(self, node: t.Slice, coords) -> Printed:
        moved = list(coords)
        moved[node.axis] = f"({coords[node.axis]} + {self._dim(node.start)})"
        return self.doprint(node.x, tuple(moved))

    def _print_Concat(self, node: t.Concat, coords) -> Printed:
        axis = node.axis
        start = sympy.Integer(0)
        pieces = []
        for part in node.parts:
            shifted = list(coords)
            shifted[axis] = coords[axis] if start == 0 else f"({coords[axis]} - {self._dim(start)})"
            stop = start + part.shape[axis]
            pieces.append((self._dim(stop), self._child(part, node, tuple(shifted)).text))
            start = stop
        text = pieces[-1][1]
        for stop, value in reversed(pieces[:-1]):
            text = f"{coords[axis]} < {stop} ? {value} : {text}"
        return Printed(self.fence(text) if len(pieces) > 1 else text, ATOM)

    def _print_Constant(self, node: t.Constant, coords) -> Printed:
        if node.kind not in CONSTANT:
            raise CodegenError(f"no CUDA rule for the constant {node.kind}")
        return Printed(CONSTANT[node.kind](coords, [self._dim(a) for a in node.args]), ATOM)

    # --- index notation -------------------------------------------------------------------

    def _print_IndexVar(self, node: t.IndexVar, coords) -> Printed:
        return Printed(f"(float){self.indices[node.name]}", self.prec("cast"))

    def subscript(self, s) -> str:
        """A subscript (index name, Affine, or integer node: `offsets[doc[i]]`, `j / S`) as C int arithmetic
        on the index variables."""
        if isinstance(s, str):
            return self.indices[s]
        if isinstance(s, t.Node):
            text = self.integer(s)
            if text is None:
                raise CodegenError(f"no CUDA rule for the integer subscript {type(s).__name__}")
            return f"({text})"
        parts = [(p.negative, self._dim(p.dims) if p.index is None else self.indices[p.index] if p.coefficient == 1
                  else f"{p.coefficient} * {self.indices[p.index]}") for p in pieces(s)]
        return f"({signed_sum(parts) or '0'})"

    def _print_DropoutEntry(self, node, coords) -> Printed:
        """A dropout mask drawn at the entry (a fused core's `plan.DropoutEntry`): its source says how."""
        return Printed(self.source.draw(node, self.position(node.index)), ATOM)

    def position(self, node: t.Node) -> str:
        """A flat position (coordinates, integers and dims) as long long arithmetic: positions reach 2**31."""
        if isinstance(node, t.IndexVar):
            return f"(long long){self.indices[node.name]}"
        if isinstance(node, t.DimValue):
            return f"(long long)({self._dim(node.dim)})"
        if isinstance(node, t.Scalar) and sympy.sympify(node.value).is_integer:
            return f"{int(node.value)}LL"
        if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
            return f"({self.position(node.a)} {BINARY[node.op]} {self.position(node.b)})"
        raise CodegenError(f"no CUDA rule for the dropout position {type(node).__name__}")

    def _print_Entry(self, node: t.Entry, coords) -> Printed:
        at = tuple(self.subscript(i) for i in node.indices)
        target = t.Grad(node.tensor, ()) if node.grad else t.Tensor(node.tensor, ())
        text = self.source.read(target, at)
        if text is None:
            raise CodegenError(f"cannot read {node.tensor}[{', '.join(map(str, node.indices))}]")
        return Printed(text, ATOM)

    def _print_IndexSum(self, node: t.IndexSum, coords) -> Printed:
        self._locals += 1
        acc = f"sum{self._locals}_"
        var = self.names.spec("index", node.index.name)
        outer, saved = self.statements, dict(self.indices)
        self.statements = []
        self.indices[node.index.name] = var
        body = self.entry(node.body)
        inner = self.statements
        self.statements, self.indices = outer, saved
        pad = self.indent
        lines = [f"{pad}float {acc} = 0.0f;  // sum({node.index.name}, ...)",
                 f"{pad}for (int {var} = 0; {var} < {self._dim(node.index.range)}; ++{var}) {{"]
        lines += ["\n".join("    " + line for line in s.split("\n")) for s in inner]
        lines += [f"{pad}    {acc} += {body};", f"{pad}}}"]
        self.statements.append("\n".join(lines))
        return Printed(acc, ATOM)
