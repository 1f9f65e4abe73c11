"""Which tiles of a masked score are fully masked: loop bounds for the fused kernels.

Contract: `tile_bounds(core)` reads the conditions every unmasked entry of the
score must satisfy (a `where(c, x, -inf)`, an added `where(c, 0, -inf)` mask,
`causal_mask(N)`, through scales by positive constants and tensors of
constants defined in index notation) and keeps those that are linear in the
query row i and key column j with unit coefficient on the bounded index
(`j <= i`, `i - j < w`). It returns a `Bounds`: Python expressions over the
tile's first and last row (`I0_`, `I1_`) for the key range a query tile must
visit, and over the tile's first and last column (`J0_`, `J1_`) for the query
range a key tile must visit, each as lower bounds (inclusive) and upper bounds
(exclusive), dims as `D_<dim>`. Skipping the tiles outside them is exact: every
entry there is -inf, weight 0. Conditions it cannot read (a key-padding
buffer) give no bound: those tiles are visited and masked entry by entry.

It also gives, over I0_ and I1_, the keys every row of a query tile sees at
every condition that bounds keys (`key_in_lo`, `key_in_hi`: the opposite
corner of each bound), and those conditions (`key_conditions`, each as E with
E <= 0 over the query row `I` and key column `J`). On a tile inside that range
each of those conditions holds at every entry, so a `where` on one of them
(`condition` reads it, as the same E) may be replaced by its branch there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ...ir import typed as t
from ..cuda.core import AttentionCore

__all__ = ["Bounds", "tile_bounds", "condition", "I", "J"]

_I, _J = sympy.Symbol("i", integer=True), sympy.Symbol("j", integer=True)
_I0, _I1 = sympy.Symbol("I0_", integer=True), sympy.Symbol("I1_", integer=True)
_J0, _J1 = sympy.Symbol("J0_", integer=True), sympy.Symbol("J1_", integer=True)

# Compare op -> E(a, b) with the condition equivalent to E <= 0 over the integers
_AS_LE = {
    "<=": lambda a, b: a - b,
    "<": lambda a, b: a - b + 1,
    ">=": lambda a, b: b - a,
    ">": lambda a, b: b - a + 1,
}
_NEGATED = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}


@dataclass
class Bounds:
    """Loop bounds as Python expressions (lists combined by max for lower, min for upper bounds)."""

    key_lo: list[str] = field(default_factory=list)    # over I0_, I1_
    key_hi: list[str] = field(default_factory=list)
    query_lo: list[str] = field(default_factory=list)  # over J0_, J1_
    query_hi: list[str] = field(default_factory=list)
    key_in_lo: list[str] = field(default_factory=list)  # over I0_, I1_: keys every row of the tile sees
    key_in_hi: list[str] = field(default_factory=list)
    key_conditions: list[sympy.Expr] = field(default_factory=list)  # E (E <= 0) behind the key bounds


def _neg_inf(node: t.Node) -> bool:
    if isinstance(node, t.Scalar):
        return node.value == -sympy.oo
    return isinstance(node, t.Unary) and node.fn == "neg" and isinstance(node.x, t.Scalar) and node.x.value == sympy.oo


def _positive_constant(node: t.Node) -> bool:
    if isinstance(node, t.Scalar):
        return bool(node.value.is_positive)
    if isinstance(node, t.DimValue):
        return True
    if isinstance(node, t.Unary) and node.fn in ("sqrt", "exp"):
        return _positive_constant(node.x) or node.fn == "exp" and _constant(node.x)
    return False


def _constant(node: t.Node) -> bool:
    return isinstance(node, (t.Scalar, t.DimValue))


class _Conditions:
    def __init__(self, pure: tuple = ()) -> None:
        self.pure = dict(pure)

    def integer(self, node: t.Node, indices: dict) -> sympy.Expr | None:
        if isinstance(node, t.IndexVar):
            return indices.get(node.name)
        if isinstance(node, t.DimValue):
            dim = sympy.sympify(node.dim)
            return dim.subs({s: sympy.Symbol(f"D_{s.name}", integer=True) for s in dim.free_symbols})
        if isinstance(node, t.Scalar):
            return node.value if node.value.is_Integer else None
        if isinstance(node, t.Unary) and node.fn == "neg":
            inner = self.integer(node.x, indices)
            return None if inner is None else -inner
        if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
            a, b = self.integer(node.a, indices), self.integer(node.b, indices)
            if a is None or b is None:
                return None
            return {"add": a + b, "sub": a - b, "mul": a * b}[node.op]
        return None

    def compare(self, node: t.Node, indices: dict, negate: bool) -> list[sympy.Expr]:
        if not isinstance(node, t.Compare) or node.op not in _AS_LE:
            return []
        a, b = self.integer(node.a, indices), self.integer(node.b, indices)
        if a is None or b is None:
            return []
        op = _NEGATED[node.op] if negate else node.op
        return [sympy.expand(_AS_LE[op](a, b))]

    def required(self, node: t.Node, coords: tuple, indices: dict) -> list[sympy.Expr]:
        """Conditions E <= 0 that hold wherever `node` (at `coords`) is not -inf."""
        from ..cuda.syntax import align

        if isinstance(node, t.Where):
            if _neg_inf(node.b):
                return self.compare(node.cond, indices, False) + self.required(node.a, coords, indices)
            if _neg_inf(node.a):
                return self.compare(node.cond, indices, True) + self.required(node.b, coords, indices)
            return []
        if isinstance(node, t.Binary):
            kids = [(c, align(c.shape, node.shape, coords)) for c in (node.a, node.b)]
            if node.op == "add":
                return [e for c, at in kids for e in self.required(c, at, indices)]
            if node.op == "sub":
                return self.required(*kids[0], indices)
            if node.op in ("mul", "div") and _positive_constant(node.b):
                return self.required(*kids[0], indices)
            if node.op == "mul" and _positive_constant(node.a):
                return self.required(*kids[1], indices)
            return []
        if isinstance(node, t.Transpose):
            return self.required(node.x, (*coords[:-2], coords[-1], coords[-2]), indices)
        if isinstance(node, t.Constant) and node.kind == "causal_mask":
            return [sympy.expand(coords[1] - coords[0])]
        if isinstance(node, t.Tensor) and node.name in self.pure:
            definition = self.pure[node.name]
            if isinstance(definition, t.IndexDef):
                inner = {i.name: c for i, c in zip(definition.indices, coords)}
                return self.required(definition.body, (), inner)
            return self.required(definition, coords, indices)
        return []


I, J = _I, _J  # the query row and key column of the expressions in `key_conditions`


def condition(node: t.Node, indices: dict[str, sympy.Expr], negate: bool = False) -> sympy.Expr | None:
    """The comparison `node` (negated: its opposite) as E, E <= 0 over the integers, with index
    variables read from `indices` (name -> expression over I, J); None when it is not such a
    comparison of integer index arithmetic."""
    found = _Conditions().compare(node, indices, negate)
    return found[0] if found else None


def tile_bounds(core: AttentionCore) -> Bounds:
    lead = tuple(sympy.Symbol(f"z{k}_") for k in range(len(core.lead)))
    found = _Conditions(core.pure).required(core.score, (*lead, _I, _J), {})
    bounds = Bounds()
    for expr in dict.fromkeys(found):
        if not expr.free_symbols & {_I, _J} or not expr.is_polynomial(_I, _J):
            continue
        a, b = expr.coeff(_I), expr.coeff(_J)
        rest = expr - a * _I - b * _J
        if {_I, _J} & (a.free_symbols | b.free_symbols | rest.free_symbols) or not (a.is_Integer and b.is_Integer):
            continue
        # keys for a query tile: b * j <= -(a * i + rest)
        if b in (1, -1):
            limit = -(a * _I + rest) * b          # j <= limit (b = 1) or j >= limit (b = -1)
            at_max, at_min = (_I1, _I0) if -a * b >= 0 else (_I0, _I1)
            if b == 1:
                bounds.key_hi.append(str(limit.subs(_I, at_max) + 1))
                bounds.key_in_hi.append(str(limit.subs(_I, at_min) + 1))
            else:
                bounds.key_lo.append(str(limit.subs(_I, at_min)))
                bounds.key_in_lo.append(str(limit.subs(_I, at_max)))
            bounds.key_conditions.append(expr)
        # queries for a key tile: a * i <= -(b * j + rest)
        if a in (1, -1):
            limit = -(b * _J + rest) * a
            at_max, at_min = (_J1, _J0) if -b * a >= 0 else (_J0, _J1)
            if a == 1:
                bounds.query_hi.append(str(limit.subs(_J, at_max) + 1))
            else:
                bounds.query_lo.append(str(limit.subs(_J, at_min)))
    return bounds
