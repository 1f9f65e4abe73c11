"""Index arithmetic evaluated on the index box at the default sizes: NaN in a subscript, 0 in a divisor.

Contract: `nonfinite(node, ranges, sizes)` returns (the floor or ceil node, the index values) of the first
`floor(x)` / `ceil(x)` in the subscript `node` whose x is NaN or infinite at some index value of `ranges`
(each index over 0 .. its range - 1) at the dims' default sizes `sizes`, else None. `zero_point(node,
ranges, sizes)` returns the first index values (a dict, empty for a node of no index) at which the integer
`node` (a divisor) is 0, else None. Only values of indices, dims and numbers are evaluated, in float64 by
the shared tables the reference evaluator reads (`symattn.ir.functions`: FUNCTIONS[...].float64 and
OPERATIONS[...].float64, so floor division and remainder are Python's); one that reads a tensor, or a box
of more than MAX_POINTS index values, is not scanned (the generated code still refuses a NaN subscript
when it meets one). `clamp` and `min`/`max` bound a subscript's value, but not NaN's: T5's
`clamp(floor(log2(j - i)), 0, R - 1)` is NaN wherever j < i. (The evaluator of `symattn.symbolic` needs a
whole spec and its tensors; this front-end scan runs while the spec is validated.)
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import sympy

from ..ir import typed as t
from ..ir.functions import FUNCTIONS, OPERATIONS

__all__ = ["nonfinite", "zero_point", "MAX_POINTS"]

MAX_POINTS = 1 << 20

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power}


def _value(node: t.Node, at: Mapping[str, np.ndarray], sizes: Mapping[sympy.Symbol, int]):
    """node's values on the index box (broadcast arrays), or None where it reads anything else."""
    if isinstance(node, t.IndexVar):
        return at.get(node.name)
    if isinstance(node, t.DimValue):
        return float(sympy.sympify(node.dim).subs(sizes))
    if isinstance(node, t.Scalar):
        return float(node.value) if sympy.sympify(node.value).is_finite else float(sympy.sympify(node.value))
    if isinstance(node, t.Unary):
        x = _value(node.x, at, sizes)
        if x is None or (node.fn != "neg" and node.fn not in FUNCTIONS):
            return None
        x = np.asarray(x, dtype=np.float64)
        return -x if node.fn == "neg" else FUNCTIONS[node.fn].float64(x)
    if isinstance(node, t.Binary) and node.op in _BINARY:
        a, b = _value(node.a, at, sizes), _value(node.b, at, sizes)
        if a is None or b is None:
            return None
        return _BINARY[node.op](np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    if isinstance(node, t.Apply) and node.fn in OPERATIONS:
        args = [_value(a, at, sizes) for a in node.args]
        if any(a is None for a in args):
            return None
        return OPERATIONS[node.fn].float64(*(np.asarray(a, dtype=np.float64) for a in args))
    return None


def _box(node: t.Node, ranges: Mapping[str, sympy.Expr], sizes: Mapping[sympy.Symbol, int]):
    """(index names, their grids) of the box `node` reads at these sizes, or None where it is not scanned."""
    names = list(dict.fromkeys(n.name for n in t.walk(node) if isinstance(n, t.IndexVar)))
    try:
        extents = [int(sympy.sympify(ranges[n]).subs(sizes)) for n in names]
    except (KeyError, TypeError):
        return None
    if any(e <= 0 for e in extents) or math.prod(extents) > MAX_POINTS:
        return None
    return names, np.meshgrid(*(np.arange(e) for e in extents), indexing="ij") if names else []


def _first(names, grids, where: np.ndarray) -> dict[str, int] | None:
    where = np.broadcast_to(where, np.shape(grids[0]) if grids else ())
    if not where.any():
        return None
    point = np.argwhere(where)[0] if grids else ()
    return {name: int(k) for name, k in zip(names, point)}


def nonfinite(node: t.Node, ranges: Mapping[str, sympy.Expr], sizes: Mapping[sympy.Symbol, int]):
    """The first floor/ceil of `node` whose argument is NaN or infinite on the box, with the index values there."""
    box = _box(node, ranges, sizes)
    if box is None:
        return None
    names, grids = box
    at = dict(zip(names, grids))
    for n in t.walk(node):
        if isinstance(n, t.Unary) and n.fn in ("floor", "ceil"):
            with np.errstate(all="ignore"):
                x = _value(n.x, at, sizes)
            if x is None:
                continue
            found = _first(names, grids, ~np.isfinite(np.asarray(x, dtype=np.float64)))
            if found is not None:
                return n, found
    return None


def zero_point(node: t.Node, ranges: Mapping[str, sympy.Expr], sizes: Mapping[sympy.Symbol, int]):
    """The first index values at which the integer `node` is 0 on the box (at these sizes), else None."""
    box = _box(node, ranges, sizes)
    if box is None:
        return None
    names, grids = box
    with np.errstate(all="ignore"):
        value = _value(node, dict(zip(names, grids)), sizes)
    if value is None:
        return None
    return _first(names, grids, np.asarray(value, dtype=np.float64) == 0)
