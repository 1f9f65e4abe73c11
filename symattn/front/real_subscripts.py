"""The floor or ceil of a real inside a subscript, scanned for NaN and infinities at the default sizes.

Contract: `nonfinite(node, ranges, sizes)` returns (the floor or ceil node, the index values) of the first
`floor(x)` / `ceil(x)` in the subscript `node` whose x is NaN or infinite at some index value of `ranges`
(each index over 0 .. its range - 1) at the dims' default sizes `sizes`, else None. Only arguments of
indices, dims and numbers are evaluated (NumPy float64, the functions' own NumPy spellings); one that reads
a tensor, or a box of more than MAX_POINTS index values, is not scanned (the generated code still refuses
a NaN subscript when it meets one). `clamp` and `min`/`max` bound a subscript's value, but not NaN's:
T5's `clamp(floor(log2(j - i)), 0, R - 1)` is NaN wherever j < i.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import sympy

from ..ir import typed as t
from ..ir.functions import FUNCTIONS

__all__ = ["nonfinite", "MAX_POINTS"]

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
        if x is None:
            return None
        if node.fn == "neg":
            return -np.asarray(x, dtype=np.float64)
        record = FUNCTIONS.get(node.fn)
        if record is None or not record.numpy or record.numpy_helper:
            return None
        return eval(record.numpy.format(x="x"), {"np": np}, {"x": np.asarray(x, dtype=np.float64)})  # noqa: S307
    if isinstance(node, t.Binary) and node.op in _BINARY:
        a, b = _value(node.a, at, sizes), _value(node.b, at, sizes)
        if a is None or b is None:
            return None
        return _BINARY[node.op](np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    if isinstance(node, t.Apply) and node.fn in ("min", "max", "clamp", "floordiv", "mod"):
        args = [_value(a, at, sizes) for a in node.args]
        if any(a is None for a in args):
            return None
        args = [np.asarray(a, dtype=np.float64) for a in args]
        if node.fn == "clamp":
            return np.minimum(np.maximum(args[0], args[1]), args[2])  # NaN stays NaN, as np.clip does
        return {"min": np.minimum, "max": np.maximum, "floordiv": np.floor_divide, "mod": np.mod}[node.fn](*args)
    return None


def nonfinite(node: t.Node, ranges: Mapping[str, sympy.Expr], sizes: Mapping[sympy.Symbol, int]):
    """The first floor/ceil of `node` whose argument is NaN or infinite on the box, with the index values there."""
    names = list(dict.fromkeys(n.name for n in t.walk(node) if isinstance(n, t.IndexVar)))
    try:
        extents = [int(sympy.sympify(ranges[n]).subs(sizes)) for n in names]
    except (KeyError, TypeError):
        return None
    if any(e <= 0 for e in extents) or math.prod(extents) > MAX_POINTS:
        return None
    grids = np.meshgrid(*(np.arange(e) for e in extents), indexing="ij") if names else []
    at = dict(zip(names, grids))
    for n in t.walk(node):
        if isinstance(n, t.Unary) and n.fn in ("floor", "ceil"):
            with np.errstate(all="ignore"):
                x = _value(n.x, at, sizes)
            if x is None:
                continue
            bad = ~np.isfinite(np.broadcast_to(np.asarray(x, dtype=np.float64), np.shape(grids[0]) if grids else ()))
            if bad.any():
                where = np.argwhere(bad)[0] if grids else ()
                return n, {name: int(k) for name, k in zip(names, where)}
    return None
