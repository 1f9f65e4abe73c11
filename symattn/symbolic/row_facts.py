"""Row facts: which lines of a tensor hold a finite entry, and which values are positive.

Contract: `RowFacts(klass, definition)` answers, for typed nodes and for every
finite value of the inputs, params, buffers and upstream gradients and every
size of the dims (positive integers), three questions whose answer True is a
proof and False means "not shown":

- `nonempty(node, axis)`: every line of `node` along `axis` holds at least one
  finite entry. A fully masked row (a key-padding mask whose buffer marks every
  key) is empty; a causal mask's rows and columns are not (the diagonal is 0);
  an index-notation mask is not when one value of the line's index is shown to
  pick a finite branch for every value of the others (`j = i`, `j = 0` or
  `j = range - 1`, decided for all sizes by `symattn.ir.affine.nonnegative`).
  A line of a FINITE node is never empty (dims are positive).
- `positive(node)`: every entry is finite and > 0 (exp of a finite value, a
  row sum of exps whose lines are not empty, the tie count of a max).
- `nonnegative(node)`: every entry is finite and >= 0 (exp of a value that may
  be -inf, squares, softmax weights, sums and products of such).

`klass(node)` is the finiteness class of `symattn.symbolic.finiteness` (FINITE,
MINUS_INF, ANY, defined here so that both modules share them) and
`definition(name)` a tensor's definition (None for a given tensor). The
finiteness analysis reads these facts to tell, for instance, that the row max
of causally masked scores is finite, that `S - max(S, axis=-1)` is then never
NaN, and that `E / sum(E, axis=-1)` with `E = exp(S - max(S, axis=-1))` is
finite; the matrix-level rules of the softmax family (`symattn.prove`) fire
only where these facts hold, so a fully masked row, where they fail, is left to
the counterexample search.
"""

from __future__ import annotations

from typing import Callable

import sympy

from ..ir import affine
from ..ir import typed as t
from ..ir.shapes import same_dim

__all__ = ["FINITE", "MINUS_INF", "ANY", "RowFacts"]

FINITE, MINUS_INF, ANY = 0, 1, 2  # what a node's entries may be, for finite inputs

_POSITIVE_FUNCTIONS = {"exp", "sigmoid", "exp2"}          # > 0 at every finite argument
_NONNEGATIVE_FUNCTIONS = {"exp", "sigmoid", "exp2", "abs", "relu"}  # >= 0 (exp, exp2 even at -inf)
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _number(node: t.Node) -> sympy.Expr | None:
    """The value of a number or a dim expression (dims are positive), else None."""
    if isinstance(node, t.Scalar):
        return sympy.sympify(node.value)
    if isinstance(node, t.DimValue):
        return sympy.sympify(node.dim)
    if isinstance(node, t.Unary) and node.fn == "neg" and node.shape == ():
        inner = _number(node.x)
        return None if inner is None else -inner
    return None


def _positive_number(node: t.Node) -> bool:
    value = _number(node)
    if value is None or not value.is_finite:
        return False
    if value.free_symbols:  # a dim expression: positive at every size
        return affine.nonnegative(value - 1).holds is True if value.is_integer else value.is_positive is True
    return bool(value > 0)


class RowFacts:
    """Lines that hold a finite entry, positive and nonnegative values (see the module docstring)."""

    def __init__(self, klass: Callable[[t.Node], int], definition: Callable[[str], t.Node | None]) -> None:
        self.klass = klass
        self.definition = definition
        self._memo: dict[tuple, tuple[t.Node, bool]] = {}

    def _cached(self, kind: str, node: t.Node, extra, compute) -> bool:
        key = (kind, id(node), extra)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is node:
            return hit[1]
        self._memo[key] = (node, False)  # a cycle (impossible in a valid spec) stays "not shown"
        value = compute()
        self._memo[key] = (node, value)
        return value

    # --- lines with a finite entry ---------------------------------------------------------
    def nonempty(self, node: t.Node, axis: int) -> bool:
        """Every line of `node` along `axis` holds a finite entry."""
        if self.klass(node) == FINITE:
            return True
        if self.klass(node) == ANY or not 0 <= axis < len(node.shape):
            return False
        return self._cached("lines", node, axis, lambda: self._nonempty(node, axis))

    def _along(self, operand: t.Node, node: t.Node, axis: int) -> bool:
        """A broadcast operand's lines along `axis` of `node` hold a finite entry (an axis of size 1
        is a line of one entry, repeated: that entry must be finite)."""
        k = axis - (len(node.shape) - len(operand.shape))
        if k < 0:
            return self.klass(operand) == FINITE
        return self.nonempty(operand, k)

    def _nonempty(self, n: t.Node, axis: int) -> bool:
        if isinstance(n, t.Tensor):
            definition = self.definition(n.name)
            return definition is not None and self.nonempty(definition, axis)
        if isinstance(n, t.Constant):
            return n.kind == "causal_mask"  # row i reads 0 at j = i, column j at i = j
        if isinstance(n, t.Binary):
            a, b = n.a, n.b
            if n.op in ("add", "sub"):
                return (self.klass(b) == FINITE and self._along(a, n, axis)) or (
                    n.op == "add" and self.klass(a) == FINITE and self._along(b, n, axis))
            if n.op in ("mul", "div") and (_positive_number(b) or (n.op == "div" and self.positive(b))):
                return self._along(a, n, axis)
            if n.op == "mul" and _positive_number(a):
                return self._along(b, n, axis)
            return False
        if isinstance(n, t.Transpose):
            rank = len(n.shape)
            swapped = {rank - 1: rank - 2, rank - 2: rank - 1}.get(axis, axis)
            return self.nonempty(n.x, swapped)
        if isinstance(n, t.Reduce):
            if n.axis is None:
                return False
            if n.kind in ("max", "logsumexp"):
                # the reduced line holds a finite entry: its max (and logsumexp >= max) is finite
                return self.nonempty(n.x, n.axis) or (axis != n.axis and self.nonempty(n.x, axis))
            return False
        if isinstance(n, t.Concat):
            if axis == n.axis:
                return any(self.nonempty(p, axis) for p in n.parts if len(p.shape) == len(n.shape))
            return all(self._along(p, n, axis) for p in n.parts)
        if isinstance(n, t.Slice):
            return axis != n.axis and self.nonempty(n.x, axis)
        if isinstance(n, t.IndexDef):
            return self._index_witness(n, axis)
        if isinstance(n, t.Where):
            return False  # a condition on values: a line may pick only the -inf branch
        return False

    # index notation: a value of the line's index at which the body is finite, for all others
    def _index_witness(self, n: t.IndexDef, axis: int) -> bool:
        index = n.indices[axis]
        symbols = {i.name: sympy.Dummy(i.name, integer=True) for i in n.indices}
        box = {symbols[i.name]: sympy.sympify(i.range) for i in n.indices if i.name != index.name}
        others = [i for i in n.indices if i.name != index.name]
        candidates: list[sympy.Expr] = [symbols[o.name] for o in others if same_dim(o.range, index.range)]
        candidates += [sympy.Integer(0), sympy.sympify(index.range) - 1]
        for witness in candidates:
            if self._finite_at(n.body, symbols, {symbols[index.name]: witness}, box):
                return True
        return False

    def _finite_at(self, n: t.Node, symbols: dict[str, sympy.Dummy], subst: dict, box: dict) -> bool:
        """The scalar body of index notation is finite wherever the substituted indices take their
        values, for every value of the other indices (in `box`, symbol -> range) and every size."""
        if self.klass(n) == FINITE:
            return True
        if isinstance(n, t.Where):
            decided = _decide(n.cond, symbols, subst, box)
            if decided is True:
                return self._finite_at(n.a, symbols, subst, box)
            if decided is False:
                return self._finite_at(n.b, symbols, subst, box)
            return self._finite_at(n.a, symbols, subst, box) and self._finite_at(n.b, symbols, subst, box)
        if isinstance(n, t.Binary) and n.op in ("add", "sub"):
            return self._finite_at(n.a, symbols, subst, box) and self._finite_at(n.b, symbols, subst, box)
        if isinstance(n, t.Binary) and n.op in ("mul", "div") and _positive_number(n.b):
            return self._finite_at(n.a, symbols, subst, box)
        return False

    # --- signs ------------------------------------------------------------------------------
    def positive(self, node: t.Node) -> bool:
        """Every entry of `node` is finite and > 0."""
        return self._cached("positive", node, None, lambda: self.klass(node) == FINITE and self._positive(node))

    def _positive(self, n: t.Node) -> bool:
        if isinstance(n, (t.Scalar, t.DimValue)) or (isinstance(n, t.Unary) and n.fn == "neg" and n.shape == ()):
            return _positive_number(n)
        if isinstance(n, t.Tensor):
            definition = self.definition(n.name)
            return definition is not None and self.positive(definition)
        if isinstance(n, t.Constant):
            return n.kind == "ones"
        if isinstance(n, t.Unary):
            if n.fn in _POSITIVE_FUNCTIONS:
                return self.klass(n.x) == FINITE
            return n.fn == "sqrt" and self.positive(n.x)
        if isinstance(n, t.Binary):
            a, b = n.a, n.b
            if n.op == "add":
                return (self.positive(a) and self.nonnegative(b)) or (self.nonnegative(a) and self.positive(b))
            if n.op in ("mul", "div"):
                return self.positive(a) and self.positive(b)
            if n.op == "pow":
                return self.positive(a) and self.klass(b) == FINITE
            return False
        if isinstance(n, t.Reduce):
            if n.kind in ("sum", "mean") and n.axis is not None:
                return self.nonnegative(n.x) and self._line_positive(n.x, n.axis)
            if n.kind in ("max", "min", "sum", "mean"):
                return self.positive(n.x)
            return False
        if isinstance(n, (t.Transpose, t.Slice, t.MergeHeads, t.SplitHeads)):
            return self.positive(n.children[0])
        if isinstance(n, t.Concat):
            return all(self.positive(p) for p in n.parts)
        if isinstance(n, t.Where):
            return self.positive(n.a) and self.positive(n.b)
        return False

    def _line_positive(self, x: t.Node, axis: int) -> bool:
        """Every line of the nonnegative `x` along `axis` holds an entry > 0."""
        if self.positive(x):
            return True
        x = self._resolved(x)
        if isinstance(x, t.Unary) and x.fn in ("exp", "exp2"):
            return self.klass(x.x) <= MINUS_INF and self.nonempty(x.x, axis)
        if isinstance(x, t.Where) and _positive_number(x.a) and _number(x.b) == 0:
            return self._tie_count(x.cond, axis)
        return False

    def _tie_count(self, cond: t.Compare, axis: int) -> bool:
        """`where(X == max(X, axis), 1, 0)` has a 1 in every line along `axis`: the max is attained
        (X may hold -inf, never NaN; a line all -inf has max -inf, equal to each entry)."""
        if cond.op != "==":
            return False
        for x, top in ((cond.a, cond.b), (cond.b, cond.a)):
            top = self._resolved(top)
            if (isinstance(top, t.Reduce) and top.kind in ("max", "min") and top.axis == axis
                    and self._resolved(top.x) == self._resolved(x) and self.klass(x) <= MINUS_INF):
                return True
        return False

    def nonnegative(self, node: t.Node) -> bool:
        """Every entry of `node` is finite and >= 0."""
        return self._cached("nonnegative", node, None,
                            lambda: self.klass(node) == FINITE and self._nonnegative(node))

    def _nonnegative(self, n: t.Node) -> bool:
        if self.positive(n):
            return True
        value = _number(n) if n.shape == () else None
        if value is not None:
            return value.is_finite is True and value.is_nonnegative is True
        if isinstance(n, t.Tensor):
            definition = self.definition(n.name)
            return definition is not None and self.nonnegative(definition)
        if isinstance(n, t.Constant):
            return n.kind in ("ones", "eye")
        if isinstance(n, t.Unary):
            if n.fn in _NONNEGATIVE_FUNCTIONS:
                return True  # klass(n) is FINITE: exp(-inf) = 0
            return n.fn == "sqrt" and self.nonnegative(n.x)
        if isinstance(n, t.Softmax):
            return True
        if isinstance(n, t.Binary):
            a, b = n.a, n.b
            if n.op == "mul" and self._resolved(a) == self._resolved(b):
                return True  # x * x
            if n.op == "pow":
                exponent = _number(b)
                return (exponent is not None and exponent.is_integer is True and exponent.is_even is True) or (
                    self.nonnegative(a) and self.klass(b) == FINITE)
            if n.op in ("add", "mul"):
                return self.nonnegative(a) and self.nonnegative(b)
            if n.op == "div":
                return self.nonnegative(a) and self.positive(b)
            return False
        if isinstance(n, t.Reduce):
            return n.kind in ("sum", "mean", "max", "min") and self.nonnegative(n.x)
        if isinstance(n, t.MatMul):
            return self.nonnegative(n.a) and self.nonnegative(n.b)
        if isinstance(n, (t.Transpose, t.Slice, t.SumTo, t.MergeHeads, t.SplitHeads, t.Scan)):
            return self.nonnegative(n.children[0])
        if isinstance(n, t.Concat):
            return all(self.nonnegative(p) for p in n.parts)
        if isinstance(n, t.Where):
            return self.nonnegative(n.a) and self.nonnegative(n.b)
        return False

    def _resolved(self, node: t.Node) -> t.Node:
        """The node under the definitions of the tensors it names (a tensor that is a definition)."""
        seen = 0
        while isinstance(node, t.Tensor) and seen < 64:
            definition = self.definition(node.name)
            if definition is None:
                return node
            node, seen = definition, seen + 1
        return node


def _decide(cond: t.Node, symbols: dict[str, sympy.Dummy], subst: dict, box: dict) -> bool | None:
    """A comparison of index values and dims at the substituted indices, for every value of the other
    indices (each in 0 .. range - 1, `box`) and every size: True, False, or None (not decided)."""
    if isinstance(cond, t.Logical):  # (a) & (b), (a) | (b), ~(a): decided when its parts decide it
        parts = [_decide(c, symbols, subst, box) for c in cond.args]
        if cond.op == "not":
            return None if parts[0] is None else not parts[0]
        if cond.op == "and":
            return False if False in parts else None if None in parts else True
        return True if True in parts else None if None in parts else False
    if not isinstance(cond, t.Compare):
        return None
    sides = [_integer_expr(x, symbols) for x in (cond.a, cond.b)]
    if None in sides:
        return None
    gap = sympy.expand(sides[1].xreplace(subst) - sides[0].xreplace(subst))  # a op b  <->  gap op' 0
    span = _extremes(gap, box)
    if span is None:
        return None
    low, high = span

    def holds(expr):
        return affine.nonnegative(sympy.expand(expr)).holds is True

    op = cond.op
    if op in (">", ">="):
        low, high, op = -high, -low, _MIRRORED[op]
    if op == "<=":  # gap >= 0
        return True if holds(low) else False if holds(-high - 1) else None
    if op == "<":   # gap >= 1
        return True if holds(low - 1) else False if holds(-high) else None
    equal = True if (low == 0 and high == 0) else False if (holds(low - 1) or holds(-high - 1)) else None
    if op == "==" or equal is None:
        return equal
    return not equal


def _extremes(gap: sympy.Expr, box: dict) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(least, greatest) of an expression affine in the index symbols of `box`, with integer
    coefficients, over the box (at its corners); None when it is not such an expression."""
    indices = [s for s in box if gap.has(s)]
    if not indices:
        return sympy.sympify(gap), sympy.sympify(gap)
    try:
        poly = sympy.Poly(gap, *indices)
    except sympy.PolynomialError:
        return None
    if poly.total_degree() > 1:
        return None
    low = high = sympy.sympify(poly.as_expr().xreplace({s: 0 for s in indices}))
    for s in indices:
        c = poly.coeff_monomial(s)
        if not (c.is_Integer):
            return None
        top = c * (box[s] - 1)
        low, high = (low + top, high) if c < 0 else (low, high + top)
    if (low.free_symbols | high.free_symbols) & set(indices):
        return None
    return low, high


def _integer_expr(node: t.Node, symbols: dict[str, sympy.Dummy]) -> sympy.Expr | None:
    """An index-notation value of index variables, dims and integers as a SymPy expression
    (indices as the integer symbols `symbols`), else None."""
    if isinstance(node, t.IndexVar):
        return symbols.get(node.name)
    if isinstance(node, t.DimValue):
        return sympy.sympify(node.dim)
    if isinstance(node, t.Scalar):
        value = sympy.sympify(node.value)
        return value if value.is_Integer else None
    if isinstance(node, t.Unary) and node.fn == "neg":
        inner = _integer_expr(node.x, symbols)
        return None if inner is None else -inner
    if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
        a, b = _integer_expr(node.a, symbols), _integer_expr(node.b, symbols)
        if a is None or b is None:
            return None
        return a + b if node.op == "add" else a - b if node.op == "sub" else a * b
    return None
