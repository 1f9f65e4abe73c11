"""A fused core's score on one block of queries x keys, as NumPy or torch code: the tiled path's closures.

Contract: `core_functions(core, outer, name, dims)` returns a `CoreFunctions`:
the lines of the functions a generated module defines (inside its tiled pass,
after the sizes are bound) for one core of the attention plan
(`symattn.codegen.plan`), in the array language of `outer` (an
`ArrayPrinter`), and their names. Every closure takes the block's `s` (the
product entries q @ k.T, already scaled where `scale` is not "1"), `i` (the
query rows, [rows, 1]), `j` (the keys, [1, cols]) and then, for each tensor
the core reads (`AttentionCore.read_tensors`), its entries for the block's
batch entry (torch: for a run of entries, the leading axis, indexed by the
closure's `e` = the entry numbers as [entries, 1, ..., 1]):

- `<O>_score(s, i, j, ...)`: where(keep, value, -inf), the score;
- `<O>_score_grad(s, i, j, ...)`: d value / d s (None: it is 1);
- `<O>_keys(first, last)` (None: every key block is visited): the keys that
  rows first..last may see (`plan.tile_bounds`); blocks outside are skipped,
  which is exact (their weights are 0);
- `<O>_inside(first, last)` and `<O>_score_inside(s, i, j, ...)`: the keys
  every one of those rows sees at each bounding condition, and the score on a
  block of them (no test of those conditions; "None" where it is s itself);
- `<O>_weights(i, j, ...)` (None: none): the factor of the weights after the
  softmax (a dropout mask);
- `<O>_add_<T>(dT, g, i0, i1, j0, j1, i, j, ...)` per learned tensor T the
  score reads, with `<O>_d_<T>`: add the block's g = dS * d value / d T[..]
  into dT (T's shape, for the block's entries): a sum over the block's axes
  where T's subscripts are coordinates, an indexed add at computed ones.

Arrays keep the dtype of `s`: numbers stay Python numbers (weak in both
libraries' promotion), positions stay integers while they only meet + - *
of integers (exact), and are cast to s's dtype where they meet a value.
A node with no rule is a `CodegenError` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ...errors import CodegenError
from ...ir import typed as t
from ...ir.affine import Affine, pieces, signed_sum
from ...ir.integers import integer_valued
from ...ir.printer import ADD, ATOM, COMPARE, MUL, NEG, Printed, Printer
from ..plan import KEY, ROW, AttentionCore, DropoutEntry, ProductEntry, Read, entry_text, linear, scaled, tile_bounds
from ..plan.bounds import I0, I1
from ..plan.entry import conditions
from .syntax import BINARY, COMPARISON, LOGICAL, PYTHON_PRECEDENCE

__all__ = ["CoreFunctions", "core_functions", "BlockPrinter"]


@dataclass(frozen=True)
class Piece(Printed):
    """Printed block code and what it is: "scalar" (a Python number), "index" (an integer array of positions),
    "loose" (an array not in s's dtype: numbers chosen by `where`), "bool" or "value" (in s's dtype)."""

    kind: str = "scalar"


@dataclass(frozen=True)
class CoreFunctions:
    lines: list[str]
    score: str
    score_grad: str   # "None" where d value / d s is 1
    keys: str         # "None" where every key block is visited
    scale: str        # the constant the product is scaled by ("1" when none), applied to the queries
    inside: str = "None"        # "None" where no block is known to satisfy the bounding conditions
    score_inside: str = "None"  # "None" where the score on such a block is s itself
    weights: str = "None"       # "None" where the weights have no factor after the softmax
    adds: tuple[str, ...] = field(default=())  # per learned tensor: its add closure
    live: str = "None"          # "None" where the static bounds are all the block skipping there is


def _fenced(piece: Printed) -> str:
    return piece.text if piece.prec >= ATOM else f"({piece.text})"


def _join(a: str, b: str) -> str:
    for kind in ("value", "loose", "index"):
        if kind in (a, b):
            return kind
    return "loose" if "bool" in (a, b) else "scalar"


class BlockPrinter(Printer):
    """An entry expression of one core on a block; `outer` prints dims and numbers."""

    precedence = {**PYTHON_PRECEDENCE, "pow": ATOM - 1}
    error = CodegenError
    rules = "block"

    def __init__(self, core: AttentionCore, outer, entry: str | None = None) -> None:
        self.core = core
        self.outer = outer
        self.names = {n: outer.p.tensor_vars[n] for n in core.read_tensors}  # the closures' parameters
        self.spell = outer.spell
        self.entry = entry  # torch: the name of the entry index array of a run of entries
        lead = len(core.lead)
        self.coords = {ROW: "i", KEY: "j"}
        for k, dim in enumerate(core.lead):
            after = ", ".join(["None"] * (lead - k + 1))
            self.coords[f"z{k}"] = f"{self.spell.arange.format(n=outer.dim(dim).text)}[:, {after}]"

    def block(self, node: t.Node) -> Piece:
        return self.doprint(node)

    def unknown(self, node, *context):
        raise CodegenError(f"no {self.spell.name} block rule for {type(node).__name__} in an attention score")

    def real(self, piece: Piece) -> Piece:
        """An integer or loose array in s's dtype; a number or a value as it is."""
        if piece.kind in ("index", "loose", "bool"):
            return Piece(self.spell.cast_to.format(x=_fenced(piece), dtype="s.dtype"), ATOM, "value")
        return piece

    # --- leaves --------------------------------------------------------------------------------

    def _print_ProductEntry(self, node: ProductEntry) -> Piece:
        return Piece("s", ATOM, "value")

    def _print_Scalar(self, node: t.Scalar) -> Piece:
        code = self.outer.number(node.value)
        return Piece(code.text, code.prec, "scalar")

    def _print_DimValue(self, node: t.DimValue) -> Piece:
        code = self.outer.dim(node.dim, integer=False)
        return Piece(code.text, code.prec, "scalar")

    def _print_IndexVar(self, node: t.IndexVar) -> Piece:
        return Piece(self.coords[node.name], ATOM, "index")

    def subscript(self, s) -> str:
        """A subscript (a coordinate's name, an Affine, or an integer node: `offsets[doc[i]]`, `j // S`) as
        integer arithmetic on the block's positions."""
        if isinstance(s, str):
            return self.coords[s]
        if isinstance(s, t.Node):
            piece = self.doprint(s)
            if piece.kind not in ("index", "scalar"):
                raise CodegenError(f"the subscript {piece.text} is not integer arithmetic on the block")
            return piece.text
        parts = [(p.negative, self.outer.parenthesize(self.outer.dim(p.dims), MUL) if p.index is None else
                  self.coords[p.index] if p.coefficient == 1 else f"{p.coefficient} * {self.coords[p.index]}")
                 for p in pieces(s)]
        return signed_sum(parts) or "0"

    def _print_Entry(self, node: t.Entry) -> Piece:
        at = [self.subscript(s) for s in node.indices]
        if self.entry is not None:
            at.insert(0, self.entry)
        name = self.names[node.tensor]
        kind = "index" if self.core_integer(node.tensor) else "value"  # an integer buffer's entries stay integers
        if not at:
            return Piece(name, ATOM, kind)
        return Piece(f"{name}[{', '.join(at)}]", ATOM, kind)

    def _print_DropoutEntry(self, node: DropoutEntry) -> Piece:
        """The mask drawn at the block's positions: `_dropout_keep` of the module's seed, a bool array."""
        base = self.doprint(node.base)
        rows, cols = [base.text], []
        for term in _terms(node.index):  # the key's term apart: no [rows, keys] int64 array is made
            (cols if any(isinstance(n, t.IndexVar) and n.name == KEY for n in t.walk(term)) else rows).append(
                self.position(term))
        self.outer.helpers.add("_dropout_keep_outer")
        return Piece(f"_dropout_keep_outer({self.outer.p.seed}, {node.stream}, {' + '.join(rows)}, "
                     f"{' + '.join(cols) or '0'}, {node.threshold})", ATOM, "bool")

    def position(self, node: t.Node) -> str:
        """An integer expression of coordinates, integers and dims (a flat position) as exact integer arithmetic."""
        if isinstance(node, t.IndexVar):
            return self.coords[node.name]
        if isinstance(node, t.DimValue):
            return self.outer.parenthesize(self.outer.dim(node.dim), ATOM)
        if isinstance(node, t.Scalar) and sympy.sympify(node.value).is_integer:
            return str(int(node.value))
        if isinstance(node, t.Unary) and node.fn == "neg":
            return f"-({self.position(node.x)})"
        if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
            return f"({self.position(node.a)} {BINARY[node.op]} {self.position(node.b)})"
        raise CodegenError(f"dropout's position {entry_text(node, [])} is not integer arithmetic on the block")

    def core_integer(self, name: str) -> bool:
        info = self.outer.p.spec.tensors.get(name)
        return info is not None and info.integer

    def _print_Apply(self, node: t.Apply) -> Piece:
        """min, max, clamp, //, % by the operation records' spellings; // and % stay integer arithmetic."""
        args = [self.doprint(a) for a in node.args]
        integer = all(a.kind in ("index", "scalar") for a in args)
        if not integer:
            args = [self.real(a) for a in args]
        template, helper = self.spell.operations[node.fn]
        if helper:
            self.outer.helpers.add(helper)
        return Piece(template.format(*(a.text for a in args)), ATOM, "index" if integer else "value")

    # --- operations ----------------------------------------------------------------------------

    def _print_Unary(self, node: t.Unary) -> Piece:
        x = self.doprint(node.x)
        if node.fn == "neg":
            return Piece("-" + self.parenthesize(x, NEG), self.prec("neg"), x.kind)
        if x.kind == "scalar":
            code = self.spell.scalar(node.fn, x.text)
            return Piece(code.text, code.prec, "scalar")
        if node.fn == "abs" and x.kind == "index":
            return Piece(f"abs({x.text})", ATOM, "index")
        x = self.real(x)
        template, helper = self.spell.functions[node.fn]
        if helper:
            self.outer.helpers.add(helper)
        if node.fn in ("floor", "ceil"):  # integer-valued: an index array (a subscript into a table, T5's buckets)
            return Piece(self.spell.to_index.format(x=template.format(x=x.text)), ATOM, "index")
        return Piece(template.format(x=x.text), ATOM, "value")

    def _print_Binary(self, node: t.Binary) -> Piece:
        a, b = self.doprint(node.a), self.doprint(node.b)
        tensors = self.outer.p.spec.tensors
        exact = node.op in ("add", "sub", "mul") and all(  # integer arithmetic: indices, dims, integers
            p.kind == "index" or (p.kind == "scalar" and (p.text.lstrip("-").isdigit() or integer_valued(x, tensors)))
            for p, x in ((a, node.a), (b, node.b)))
        if exact:
            kind = "index" if "index" in (a.kind, b.kind) else "scalar"
        else:
            a, b = self.real(a), self.real(b)
            kind = _join(a.kind, b.kind)
        if node.op == "pow" and isinstance(node.b, t.Scalar) and node.b.value == 2:
            return Piece(self.infix(a, "*", a, MUL), MUL, kind)
        if node.op == "div" and b.kind == "scalar" and a.kind != "scalar" and _constant(node.b):
            return Piece(self.infix(a, "*", self.outer.reciprocal(node.b), MUL), MUL, kind)
        level = self.prec(node.op)
        return Piece(self.infix(a, BINARY[node.op], b, level), level, kind)

    def _print_Compare(self, node: t.Compare) -> Piece:
        a = self.parenthesize(self.doprint(node.a), ADD)
        b = self.parenthesize(self.doprint(node.b), ADD)
        return Piece(f"{a} {COMPARISON[node.op]} {b}", self.prec("compare"), "bool")

    def _print_Logical(self, node: t.Logical) -> Piece:
        parts = [self.fence(self.doprint(x).text) for x in node.args]
        if node.op == "not":
            return Piece(f"{LOGICAL['not']}{parts[0]}", NEG, "bool")
        return Piece(f" {LOGICAL[node.op]} ".join(parts), COMPARE, "bool")

    def _print_Where(self, node: t.Where) -> Piece:
        cond = self.doprint(node.cond)
        a, b = self.doprint(node.a), self.doprint(node.b)
        kind = _join(a.kind, b.kind)
        if kind == "scalar":
            kind = "loose"  # where of two numbers: an array, not yet in s's dtype
        if kind == "value":
            a, b = self.real(a), self.real(b)
        return Piece(f"{self.spell.where}({cond.text}, {a.text}, {b.text})", ATOM, kind)

    def masked(self, keep: t.Node | None, value: t.Node) -> Piece:
        """where(keep, value, -inf): the score where only `keep` is tested (None: value itself)."""
        v = self.real(self.doprint(value))
        if keep is None:
            return v
        return Piece(f"{self.spell.where}({self.doprint(keep).text}, {v.text}, -{self.spell.numbers['inf']})", ATOM,
                     "value")


def _terms(node: t.Node) -> list[t.Node]:
    """The terms of a sum (a flat position: heads, row and key parts)."""
    if isinstance(node, t.Binary) and node.op == "add":
        return _terms(node.a) + _terms(node.b)
    return [node]


def _constant(node: t.Node) -> bool:
    """Numbers and dims only: no coordinate, no read, no product."""
    return all(isinstance(n, (t.Scalar, t.DimValue, t.Unary, t.Binary)) for n in t.walk(node))


def _bound(expr: sympy.Expr, outer, first: str) -> str:
    """A block bound (over I0, I1 and D_<dim>) as Python over the rows first..last."""
    dims = {symbol.name: var for symbol, var in outer.dims.items()}
    rename = {s: sympy.Symbol(first if s == I0 else "last" if s == I1 else dims.get(s.name[2:], s.name))
              for s in expr.free_symbols}
    return str(expr.xreplace(rename))


def _extreme(fn: str, first: str, bounds: list[str]) -> str:
    """`max(0, ...)` or `min(N, ...)`: one end of a range of keys (`min(N)` alone would be a TypeError)."""
    return f"{fn}({', '.join([first] + bounds)})" if bounds else first


def _closure(name: str, params: str, doc: str, body: str) -> list[str]:
    """A closure's lines; its docstring may span lines (`\n`)."""
    first, *rest = doc.split("\n")
    doc_lines = [f'    """{first}"""'] if not rest else [f'    """{first}', *(f"    {x}" for x in rest[:-1]),
                                                          f'    {rest[-1]}"""']
    return [f"def {name}({params}):", *doc_lines, f"    return {body}"]


def core_functions(core: AttentionCore, outer, name: str, dims, entry: str | None = None) -> CoreFunctions:
    """The closures of one core (see the module docstring); `name` prefixes them; `entry` (torch) names the
    entry index array of a run of batch entries."""
    order = list(dims)
    reads = "".join(f", {outer.p.tensor_vars[n]}" for n in core.read_tensors)
    params = f"s, i, j{reads}"
    prologue = [] if entry is None or not core.reads else [
        f"    {entry} = {outer.spell.arange.format(n='s.shape[0]')}.view((-1,) + (1,) * (s.dim() - 1))"]
    found = scaled(core.value) or None
    lin = linear(core.value)
    scale, value = "1", core.value
    if lin is not None and lin.scale is not None and _constant(lin.scale):
        c = lin.scale
        one = isinstance(c, t.Binary) and c.op == "div" and isinstance(c.a, t.Scalar) and c.a.value == 1
        scale = (outer.reciprocal(c.b) if one else outer.doprint(c)).text
        value = ProductEntry() if lin.bias is None else t.Binary("add", ProductEntry(), lin.bias, ())
    elif found is not None:  # value reads s only as s * c: the queries are scaled by c
        scale = (outer.reciprocal(found.b) if found.op == "div" else outer.doprint(found.b)).text
        value = _replace(core.value, found, ProductEntry())
    derivative = _derivative(value)
    printer = BlockPrinter(core, outer, entry)
    text = lambda node: entry_text(node, order, core)  # noqa: E731

    def with_entry(lines: list[str]) -> list[str]:
        return lines[:-1] + prologue + lines[-1:] if prologue else lines

    scaled_by = "" if scale == "1" else f", q scaled by {scale}"
    lines = with_entry(_closure(f"{name}_score", params, f"{text(core.score)} at query rows i and keys j\n"
                                f"(s = q @ k.T there{scaled_by}; it may work in the buffer of s).",
                                printer.masked(core.keep, value).text))
    grad = "None"
    if not (isinstance(derivative, t.Scalar) and derivative.value == 1):
        grad = f"{name}_score_grad"
        body = BlockPrinter(core, outer, entry).block(derivative)
        lines += with_entry(_closure(grad, params, f"d score / d s: {entry_text(derivative, order)}.", body.text))
    bounds = tile_bounds(core)
    keys = inside = score_inside = "None"
    if bounds.bounded:
        keys = f"{name}_keys"
        lo = _extreme("max", "0", [_bound(x, outer, "first") for x in bounds.key_lo])
        hi = _extreme("min", outer.dim(core.n_k).text, [_bound(x, outer, "first") for x in bounds.key_hi])
        lines += [f"def {keys}(first, last):",
                  '    """The keys that query rows first..last may see: every other entry of theirs is masked."""',
                  f"    return {lo}, {hi}"]
        if conditions(core.keep) != conditions(bounds.rest):
            lo = _extreme("max", "0", [_bound(x, outer, "first") for x in bounds.key_in_lo])
            hi = _extreme("min", outer.dim(core.n_k).text, [_bound(x, outer, "first") for x in bounds.key_in_hi])
            inside = f"{name}_inside"
            lines += [f"def {inside}(first, last):",
                      '    """The keys every query row first..last sees at each condition that bounds keys."""',
                      f"    return {lo}, {hi}"]
            seen = BlockPrinter(core, outer, entry).masked(bounds.rest, value)
            if seen.text != "s":
                score_inside = f"{name}_score_inside"
                lines += with_entry(_closure(score_inside, params, f"{name}_score on a block of the keys {inside} "
                                             "gives (the bounding conditions hold there).", seen.text))
    weights = "None"
    if core.weights is not None:
        weights = f"{name}_weights"
        body = BlockPrinter(core, outer, entry).real(BlockPrinter(core, outer, entry).block(core.weights))
        lines += with_entry(_closure(weights, params, f"the factor of the weights after the softmax: "
                                     f"{entry_text(core.weights, order)}.", body.text))
    live = "None"
    if core.masked_at_run_time:
        # a mask of buffers (document ids) or of // % min max: tested on each block at run time, which
        # skips the blocks it masks whole (FlexAttention's block mask, computed as the pass goes)
        live = f"{name}_live"
        test = BlockPrinter(core, outer, entry).block(core.keep).text
        lines += with_entry(_closure(live, params, f"Whether rows i x keys j keep an entry ({text(core.keep)}); "
                                     "s is the block of queries.", outer.spell.any.format(x=test)))
    adds = []
    for k, tensor in enumerate(core.learned):
        add = f"{name}_add_{k}"
        lines += _add_closure(core, outer, entry, tensor, add, params, prologue, scale, found, lin)
        adds.append(add)
    return CoreFunctions(lines, f"{name}_score", grad, keys, scale, inside, score_inside, weights, tuple(adds), live)


def _replace(node: t.Node, old: t.Node, new: t.Node) -> t.Node:
    from ..plan import substitute

    return substitute(node, {old: new})


def _derivative(value: t.Node) -> t.Node:
    from ..plan import derivative

    d = derivative(value, ProductEntry())
    return d if d is not None else t.Scalar(sympy.Integer(0))


def _add_closure(core: AttentionCore, outer, entry, tensor: str, name: str, params: str, prologue, scale, found,
                 lin) -> list[str]:
    """`name(dT, g, i0, i1, j0, j1, s, i, j, ...)`: every read of `tensor` adds g * d value / d that entry into dT."""
    lines = [f"def {name}(dT, g, i0, i1, j0, j1, {params}):",
             f'    """Add into dT (the gradient of {tensor} for the block\'s entries) g * d score / d {tensor} at each '
             'of its reads: g is dS on the block."""', *prologue]
    for read in (r for r in core.reads if r.tensor == tensor and r.derivative is not None):
        d = read.derivative
        if scale != "1":  # the closures see s already scaled: d value / d T is the same function of it
            d = _rescaled(d, found, lin)
        factor = BlockPrinter(core, outer, entry).block(d)
        contribution = "g" if factor.kind == "scalar" and factor.text == "1" else f"g * {_fenced(factor)}"
        lines.append("    " + _add_line(core, outer, entry, read, contribution))
    return lines


def _rescaled(d: t.Node, found, lin) -> t.Node:
    """d in terms of the scaled product s' = c s: s = s' / c."""
    if lin is not None and lin.scale is not None:
        scale = lin.scale
    else:
        scale = found.b if found.op == "mul" else t.Binary("div", t.Scalar(sympy.Integer(1)), found.b, ())
    return _replace(d, ProductEntry(), t.Binary("div", ProductEntry(), scale, ()))


def _add_line(core: AttentionCore, outer, entry, read: Read, contribution: str) -> str:
    """One read's scatter: a sum over the block axes when every subscript is a coordinate (in order) or 0 on an
    axis of size 1, else an indexed add at the computed positions."""
    spell = outer.spell
    lead = len(core.lead)
    position = {f"z{k}": k - lead - 2 for k in range(lead)} | {ROW: -2, KEY: -1}
    shape = outer.p.spec.tensors[read.tensor].shape
    used = [s for s in read.subscripts if isinstance(s, str)]
    zeros_ok = all(isinstance(s, str) or (isinstance(s, Affine) and not s.indices and s.offset == 0 and d == 1)
                   for s, d in zip(read.subscripts, shape))
    ordered = [position[s] for s in used] == sorted(position[s] for s in used) and len(set(used)) == len(used)
    if zeros_ok and ordered:
        absent = tuple(a for a in position.values() if a not in [position[s] for s in used])
        value = f"({contribution})"
        if absent:
            value = spell.sum_dropped.format(x=contribution, axes=absent[0] if len(absent) == 1 else absent)
        inserted = [":" if isinstance(s, str) else "None" for s in read.subscripts]
        if "None" in inserted:
            value = f"{value}[..., {', '.join(inserted)}]"
        window = {ROW: "i0:i1", KEY: "j0:j1"}
        target = ", ".join(["..."] + [window.get(s, ":") if isinstance(s, str) else ":" for s in read.subscripts])
        return f"dT[{target}] += {value}"
    printer = BlockPrinter(core, outer, entry)
    flat = None
    for s, dim in zip(read.subscripts, shape):
        sub = printer.subscript(s)
        flat = sub if flat is None else f"({flat}) * {outer.parenthesize(outer.dim(dim), MUL + 1)} + {sub}"
    if entry is not None:
        size = " * ".join(outer.parenthesize(outer.dim(d), MUL + 1) for d in shape) or "1"
        flat = f"{entry} * ({size})" + (f" + {flat}" if flat is not None else "")
    flat = flat or "0"
    if spell.name == "torch":
        return (f"dT.view(-1).index_add_(0, torch.broadcast_to({flat}, g.shape).reshape(-1), "
                f"({contribution}).reshape(-1))")
    return f"np.add.at(dT.reshape(-1), np.broadcast_to({flat}, g.shape).ravel(), ({contribution}).ravel())"
