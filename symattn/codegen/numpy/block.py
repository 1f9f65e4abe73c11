"""An attention core's score on one block of queries x keys, as NumPy code: the tiled path's closures.

Contract: `core_functions(core, printer)` returns a `CoreFunctions`: the lines
of the functions a generated module defines (inside its tiled pass, after the
sizes are bound) for one fused core, and their names:

- `<O>_score(s, i, j)`: the score of the block whose product entries are
  `s = (Q @ K.T)[..., i, j]`, `i` the query rows as a column ([rows, 1]), `j`
  the key columns as a row ([1, cols]): the spec's scale, bias, mask, softcap
  evaluated at the block's coordinates (a tensor of constants is recomputed
  from its definition; a head coordinate is `np.arange(h)` on its axis);
- `<O>_score_grad(s, i, j)`: d score / d s there (a number when constant);
- `<O>_keys(first, last)`, only when the mask bounds the keys a query row sees
  (`symattn.codegen.triton.bounds.tile_bounds`: causal, sliding window): the
  range of keys that rows first..last may see; blocks outside it are skipped,
  which is exact (their weights are 0). A mask it cannot read is applied
  entry by entry and no block is skipped.
- with `inside=True` (the NumPy target), when the mask bounds the keys and some
  `where` of the score tests one of those bounds: `<O>_inside(first, last)`,
  the range of keys that every row first..last sees at each such condition
  (`Bounds.key_in_lo`, `key_in_hi`), and `<O>_score_inside(s, i, j)`, the
  score on a block of those keys: each such `where` replaced by the branch its
  condition picks there (a mask by 0), so a block wholly visible pays no mask.
  `score_inside` is "None" where that score is `s` itself.

Arrays keep the dtype of `s`: numbers stay Python numbers (weak in NumPy's
promotion), and an array computed from indices alone is cast to the dtype
where it meets the scores. A node with no rule is a `CodegenError`: the
module then keeps the plain path for the whole spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sympy

from ...ir import typed as t
from ...ir.printer import ADD, ATOM, COMPARE, MUL, NEG, Printed, Printer
from ...ir.printing import to_spec
from ..cuda.core import AttentionCore, score_derivative
from ..cuda.syntax import align
from ..program_ir import CodegenError
from ..triton.bounds import I, J, condition, tile_bounds
from .syntax import PYTHON_PRECEDENCE

__all__ = ["CoreFunctions", "core_functions", "BlockPrinter"]

_COMPARE = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}


@dataclass(frozen=True)
class Piece(Printed):
    """Printed block code and what it is: "scalar" (a Python number), "index" (an array of the indices
    alone, not in the dtype), "bool" (a condition) or "value" (an array in the dtype of s)."""

    kind: str = "scalar"


@dataclass(frozen=True)
class CoreFunctions:
    lines: list[str]
    score: str
    score_grad: str   # "None" where d score / d s is 1 (the score is s plus terms of the indices)
    keys: str         # "None" where every key block is visited
    scale: str        # the constant the product is scaled by ("1" when none), applied to the queries
    inside: str = "None"        # "None" where no block is known to satisfy a condition of the score
    score_inside: str = "None"  # "None" where the score on such a block is s itself


def _neg_inf(node: t.Node) -> bool:
    if isinstance(node, t.Scalar):
        return node.value == -sympy.oo
    return isinstance(node, t.Unary) and node.fn == "neg" and isinstance(node.x, t.Scalar) and node.x.value == sympy.oo


def _zero(node: t.Node) -> bool:
    return isinstance(node, t.Scalar) and node.value == 0


class BlockPrinter(Printer):
    """The score of one core (and its derivative) on a block; `outer` prints dims and numbers."""

    precedence = {**PYTHON_PRECEDENCE, "pow": ATOM - 1}
    error = CodegenError
    rules = "NumPy block"

    def __init__(self, core: AttentionCore, outer, indices: dict[str, str] | None = None,
                 product: t.Node | None = None, known: frozenset = frozenset()) -> None:
        self.core = core
        self.outer = outer
        self.pure = dict(core.pure)
        self.indices = dict(indices or {})
        self.product = product or core.product  # the node printed as `s`
        self.syntax = outer.block_syntax
        self.known = known  # conditions E (E <= 0, over bounds.I and J) that hold on the whole block

    def nested(self, indices: dict[str, str]) -> "BlockPrinter":
        """A printer of a definition in index notation, its indices at these coordinates."""
        return BlockPrinter(self.core, self.outer, indices, self.product, self.known)

    def holds(self, cond: t.Node, negate: bool = False) -> bool:
        """Whether the comparison `cond` (negated: its opposite) holds at every entry of the block."""
        if not self.known:
            return False
        return condition(cond, {name: _symbol(text) for name, text in self.indices.items()}, negate) in self.known

    def coords(self, node: t.Node) -> tuple[str, ...]:
        """The block's coordinates for `node` (broadcastable to the score): heads, then `i`, `j`."""
        lead = self.core.lead
        heads = []
        for k, dim in enumerate(lead):
            after = ", ".join(["None"] * (len(lead) - k + 1))
            arange = self.syntax["arange"].format(n=self.outer.dim(dim).text)
            heads.append(f"{arange}[:, {after}]")
        return align(node.shape, self.core.score.shape, (*heads, "i", "j"))

    def block(self, node: t.Node) -> Piece:
        return self.doprint(node, self.coords(node))

    def doprint(self, node, *context) -> Piece:
        if node == self.product:
            return Piece("s", ATOM, "value")
        if node == self.core.product:
            raise CodegenError("internal: the product outside its scaled form")
        if node.shape == () and _constant(node):  # Python arithmetic, as the plain path prints it
            code = self.outer.doprint(node)
            return Piece(code.text, code.prec, "scalar")
        return super().doprint(node, *context)

    def unknown(self, node, *context):
        raise CodegenError(f"no NumPy block rule for {type(node).__name__} in an attention score")

    def _child(self, child: t.Node, parent: t.Node, coords) -> Piece:
        return self.doprint(child, align(child.shape, parent.shape, coords))

    def cast(self, piece: Piece, kind: str) -> Piece:
        """An index-only array that meets the scores is cast to their dtype (else float32 would become float64)."""
        if kind == "value" and piece.kind == "index":
            return Piece(self.syntax["cast"].format(x=_fenced(piece)), ATOM, "value")
        return piece

    def where(self, cond: str, a: str, b: str) -> str:
        return f"{self.syntax['where']}({cond}, {a}, {b})"

    @property
    def inf(self) -> str:
        return self.syntax["inf"]

    # --- masks: `x + where(c, 0, -inf)` is `np.where(c, x, -np.inf)` ---------------------------

    def mask(self, node: t.Node, coords) -> list[str] | None:
        """The conditions (printed) under which `node` is 0 when it is 0 or -inf (a mask added to the
        scores), those that hold on the whole block left out; None when `node` is not such a mask."""
        if isinstance(node, t.Where):
            inner = align(node.cond.shape, node.shape, coords)
            cond = self.doprint(node.cond, inner)
            a_coords, b_coords = (align(x.shape, node.shape, coords) for x in (node.a, node.b))
            if _neg_inf(node.b):
                rest = [] if _zero(node.a) else self.mask(node.a, a_coords)
                if rest is None or self.holds(node.cond):
                    return rest
                return [self.parenthesize(cond, COMPARE + 1), *rest]
            return None
        if isinstance(node, t.Constant) and node.kind == "causal_mask":
            if sympy.expand(_symbol(coords[-1]) - _symbol(coords[-2])) in self.known:
                return []
            return [f"({coords[-1]} <= {coords[-2]})"]
        if isinstance(node, t.Tensor) and node.name in self.pure:
            definition = self.pure[node.name]
            if isinstance(definition, t.IndexDef):
                inner = self.nested({i.name: c for i, c in zip(definition.indices, coords)})
                return inner.mask(definition.body, ())
            return self.mask(definition, coords)
        return None

    # --- integer index arithmetic ---------------------------------------------------------

    def integer(self, node: t.Node) -> str | None:
        if isinstance(node, t.IndexVar):
            return self.indices[node.name]
        if isinstance(node, t.DimValue):
            return self.outer.dim(node.dim).text
        if isinstance(node, t.Scalar):
            return str(int(node.value)) if node.value.is_Integer else None
        if isinstance(node, t.Unary) and node.fn == "neg":
            inner = self.integer(node.x)
            return None if inner is None else f"(-{inner})"
        if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
            a, b = self.integer(node.a), self.integer(node.b)
            return None if a is None or b is None else f"({a} {_BINARY[node.op]} {b})"
        return None

    # --- the rules ------------------------------------------------------------------------

    def _print_Tensor(self, node: t.Tensor, coords) -> Piece:
        if node.name not in self.pure:
            raise CodegenError(f"the score reads {node.name}, which the tiled path cannot read block by block")
        definition = self.pure[node.name]
        if isinstance(definition, t.IndexDef):
            inner = self.nested({i.name: c for i, c in zip(definition.indices, coords)})
            piece = inner.doprint(definition.body, ())
        else:
            piece = self.doprint(definition, coords)
        return Piece(_fenced(piece), ATOM, piece.kind)

    def _print_Scalar(self, node: t.Scalar, coords) -> Piece:
        code = self.outer.number(node.value)
        return Piece(code.text, code.prec, "scalar")

    def _print_DimValue(self, node: t.DimValue, coords) -> Piece:
        code = self.outer.dim(node.dim, integer=False)
        return Piece(code.text, code.prec, "scalar")

    def _print_IndexVar(self, node: t.IndexVar, coords) -> Piece:
        text = self.indices[node.name]
        return Piece(text, ATOM, "scalar" if text == "0" else "index")

    def _print_Unary(self, node: t.Unary, coords) -> Piece:
        x = self._child(node.x, node, coords)
        if node.fn == "neg":
            return Piece("-" + self.parenthesize(x, NEG), self.prec("neg"), x.kind)
        text = self.outer.unary_template(node.fn).format(x=x.text)
        if x.kind == "scalar":
            return Piece(f"float({text})", ATOM, "scalar")
        return Piece(text, ATOM, "index" if x.kind == "bool" else x.kind)

    def _print_Binary(self, node: t.Binary, coords) -> Piece:
        kids = [align(c.shape, node.shape, coords) for c in (node.a, node.b)]
        if node.op == "add":
            for this, other in ((0, 1), (1, 0)):
                conds = self.mask((node.a, node.b)[other], kids[other])
                if conds is not None:
                    x = self.doprint((node.a, node.b)[this], kids[this])
                    if x.kind == "value":
                        if not conds:
                            return x
                        return Piece(self.where(" & ".join(conds), x.text, f"-{self.inf}"), ATOM, "value")
        a, b = self.doprint(node.a, kids[0]), self.doprint(node.b, kids[1])
        kind = _join(a.kind, b.kind)
        a, b = self.cast(a, kind), self.cast(b, kind)
        if node.op == "pow" and isinstance(node.b, t.Scalar) and node.b.value == 2:
            return Piece(self.infix(a, "*", a, MUL), MUL, kind)
        if node.op == "div" and b.kind == "scalar" and a.kind != "scalar" and _constant(node.b):
            return Piece(self.infix(a, "*", self.outer.reciprocal(node.b), MUL), MUL, kind)
        level = self.prec(node.op)
        return Piece(self.infix(a, _BINARY[node.op], b, level), level, kind)

    def _print_Compare(self, node: t.Compare, coords) -> Piece:
        a, b = self.integer(node.a), self.integer(node.b)
        if a is None or b is None:
            a = self.parenthesize(self._child(node.a, node, coords), ADD)
            b = self.parenthesize(self._child(node.b, node, coords), ADD)
        return Piece(f"{a} {_COMPARE[node.op]} {b}", self.prec("compare"), "bool")

    def _print_Where(self, node: t.Where, coords) -> Piece:
        for branch, negate in ((node.a, False), (node.b, True)):
            if self.holds(node.cond, negate):
                return self._child(branch, node, coords)
        cond = self._child(node.cond, node, coords)
        a, b = self._child(node.a, node, coords), self._child(node.b, node, coords)
        kind = _join(a.kind, b.kind)
        if kind == "scalar":
            kind = "index"  # np.where of two numbers is a float64 array
        a, b = self.cast(a, kind), self.cast(b, kind)
        return Piece(self.where(cond.text, a.text, b.text), ATOM, kind)

    def _print_Transpose(self, node: t.Transpose, coords) -> Piece:
        return self.doprint(node.x, (*coords[:-2], coords[-1], coords[-2]))

    def _print_Constant(self, node: t.Constant, coords) -> Piece:
        if node.kind == "ones":
            return Piece("1.0", ATOM, "scalar")
        if node.kind == "eye":
            return Piece(self.where(f"{coords[0]} == {coords[1]}", "1.0", "0.0"), ATOM, "index")
        if node.kind == "causal_mask":
            if sympy.expand(_symbol(coords[1]) - _symbol(coords[0])) in self.known:
                return Piece("0.0", ATOM, "scalar")
            return Piece(self.where(f"{coords[1]} <= {coords[0]}", "0.0", f"-{self.inf}"), ATOM, "index")
        raise CodegenError(f"no NumPy block rule for the constant {node.kind}")


def _symbol(coord: str) -> sympy.Expr:
    """A block coordinate as `tile_bounds` writes it: the row i and column j as bounds.I and J."""
    if coord in ("i", "j"):
        return I if coord == "i" else J
    return sympy.Integer(int(coord)) if coord.isdigit() else sympy.Symbol(coord)


def _constant(node: t.Node) -> bool:
    """Numbers and dims only: no index, no tensor, no product."""
    return all(isinstance(n, (t.Scalar, t.DimValue, t.Unary, t.Binary)) for n in t.walk(node))


def _join(a: str, b: str) -> str:
    for kind in ("value", "index"):
        if kind in (a, b):
            return kind
    return "index" if "bool" in (a, b) else "scalar"


def _fenced(piece: Printed) -> str:
    return piece.text if piece.prec >= ATOM else f"({piece.text})"


def _bound(text: str, outer, first: str) -> str:
    """A tile bound from `tile_bounds` (over I0_, I1_ and D_<dim>) as Python over the rows first..last."""
    expr = sympy.sympify(text)
    dims = {symbol.name: var for symbol, var in outer.dims.items()}
    rename = {s: sympy.Symbol(first if s.name == "I0_" else "last" if s.name == "I1_" else
                              dims.get(s.name[2:], s.name)) for s in expr.free_symbols}
    return str(expr.xreplace(rename))


def scaled_product(core: AttentionCore) -> t.Binary | None:
    """`(Q @ K.T) * c` or `(Q @ K.T) / c` for a constant c, when the score reads the product only so: the
    scale is then applied to the queries once, and the score is a function of the scaled product."""
    parents = [n for n in t.walk(core.score) if core.product in n.children]
    if not parents or core.score == core.product:
        return None
    first = parents[0]
    if not (isinstance(first, t.Binary) and first.op in ("mul", "div") and first.a == core.product
            and first.b.shape == () and _constant(first.b)):
        return None
    return first if all(p == first for p in parents) else None


def core_functions(core: AttentionCore, outer, name: str, dims: Sequence[str], inside: bool = False) -> CoreFunctions:
    """The closures of one core (see the module docstring); `name` prefixes them; `inside`: also those
    of the blocks that satisfy every condition bounding the keys."""
    order = list(dims)
    scaled = scaled_product(core)
    product = scaled or core.product
    scale = "1"
    if scaled is not None:
        scale = (outer.reciprocal(scaled.b) if scaled.op == "div" else outer.doprint(scaled.b)).text
    score = BlockPrinter(core, outer, product=product).block(core.score)
    derivative = score_derivative(core, product)
    lines = [f"def {name}_score(s, i, j):",
             f'    """{to_spec(core.score, order)} at query rows i ([rows, 1]) and key columns j ([1, cols]), given',
             f'    s = {to_spec(product, order)} there (it may work in the buffer of s)."""',
             f"    return {score.text}"]
    grad = "None"
    if derivative is None or not (isinstance(derivative, t.Scalar) and derivative.value == 1):
        grad = f"{name}_score_grad"
        shown = to_spec(derivative, order) if derivative is not None else "0"
        printed = BlockPrinter(core, outer, product=product).block(derivative) if derivative is not None \
            else Piece("0", ATOM)
        lines += [f"def {grad}(s, i, j):",
                  f'    """d score / d s: {shown}."""',
                  f"    return {printed.text}"]
    bounds = tile_bounds(core)
    keys = "None"
    if bounds.key_lo or bounds.key_hi:
        keys = f"{name}_keys"
        lo = _extreme("max", "0", [_bound(x, outer, "first") for x in bounds.key_lo])
        hi = _extreme("min", outer.dim(core.n_k).text, [_bound(x, outer, "first") for x in bounds.key_hi])
        lines += [f"def {keys}(first, last):",
                  '    """The keys that query rows first..last may see: every other entry of theirs is masked."""',
                  f"    return {lo}, {hi}"]
    if not inside or not bounds.key_conditions:
        return CoreFunctions(lines, f"{name}_score", grad, keys, scale)
    seen = BlockPrinter(core, outer, product=product, known=frozenset(bounds.key_conditions)).block(core.score)
    if seen.text == score.text:
        return CoreFunctions(lines, f"{name}_score", grad, keys, scale)
    lo = _extreme("max", "0", [_bound(x, outer, "first") for x in bounds.key_in_lo])
    hi = _extreme("min", outer.dim(core.n_k).text, [_bound(x, outer, "first") for x in bounds.key_in_hi])
    lines += [f"def {name}_inside(first, last):",
              '    """The keys that every query row first..last sees at each condition of the mask that bounds keys."""',
              f"    return {lo}, {hi}"]
    score_inside = "None"
    if seen.text != "s":
        score_inside = f"{name}_score_inside"
        lines += [f"def {score_inside}(s, i, j):",
                  f'    """{name}_score on a block of the keys {name}_inside gives (those conditions hold there)."""',
                  f"    return {seen.text}"]
    return CoreFunctions(lines, f"{name}_score", grad, keys, scale, f"{name}_inside", score_inside)


def _extreme(fn: str, first: str, bounds: list[str]) -> str:
    """`max(0, ...)` or `min(N, ...)`: one end of a range of keys, `first` where the mask gives no bound
    (`min(N)` alone would be a TypeError)."""
    return f"{fn}({', '.join([first] + bounds)})" if bounds else first
