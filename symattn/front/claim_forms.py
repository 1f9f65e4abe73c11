"""Symmetry claims: `check equivariant(O, X)`, `invariant(O, Y, DIM)`, groups `(X, keep)`;
and `check relative(B)`.

Contract: `symmetry_check(v, stmt, claim)` types one such claim for the validator `v`
(`symattn.front.validate`) and returns its `typed.CheckInfo` (kind, output, the
tensors permuted together, the dim), or raises a located `SpecCheckError`: the
output and every grouped tensor must exist, grouped tensors are declared (input,
param or buffer), named once, and each has an axis of the permuted dim; without
a DIM the first tensor's first axis must be a single dim.
`relative_check(v, stmt, claim)` types `relative(B)`, B any expression of rank >= 2
with at least two rows and two columns, as the equality of two windows,
`B[..., 0:R-1, 0:C-1] == B[..., 1:R, 1:C]` (B[..., i, j] == B[..., i + 1, j + 1]),
so that the claim climbs the same ladder as `A == B` (kind 'relative').
"""

from __future__ import annotations

from . import syntax as ir
from ..errors import SpecCheckError
from ..ir import typed as t
import sympy

from ..ir.shapes import same_dim

__all__ = ["symmetry_check", "relative_check"]


def _err(message: str, pos: ir.Pos, hint: str | None = None) -> SpecCheckError:
    return SpecCheckError(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


def symmetry_check(v, stmt: ir.Check, claim: ir.Call) -> t.CheckInfo:
    """Type `equivariant(O, X[, DIM])` / `invariant(...)`, X a name or a group `(X, keep)`; `v` is the validator."""
    args = claim.args
    usage = (f"{claim.func} takes (OUTPUT, TENSOR) or (OUTPUT, TENSOR, DIM), all names; TENSOR may be a "
             f"group of given tensors permuted together, as in {claim.func}(O, (X, keep))")
    if not 2 <= len(args) <= 3 or not isinstance(args[0], ir.Name) \
            or not isinstance(args[1], (ir.Name, ir.Group)) \
            or (len(args) == 3 and not isinstance(args[2], ir.Name)):
        raise _err(usage, claim.pos)
    out = args[0]
    group = args[1].items if isinstance(args[1], ir.Group) else (args[1],)
    if out.id not in v.tensors:
        raise v.unknown(out.id, out.pos)
    seen: dict[str, ir.Pos] = {}
    for item in group:
        if not isinstance(item, ir.Name):
            raise _err(f"a group lists tensor names, as in {claim.func}(O, (X, keep))", item.pos)
        if item.id not in v.tensors:
            raise v.unknown(item.id, item.pos)
        if v.tensors[item.id].kind not in ("input", "param", "buffer"):
            raise _err(f"'{item.id}' is computed, not declared; permute an input, param or "
                       "buffer", item.pos)
        if item.id in seen:
            first = seen[item.id]
            raise _err(f"'{item.id}' is named twice in the group (first at "
                       f"{first.line}:{first.column})", item.pos)
        seen[item.id] = item.pos
    first_item = group[0]
    first_shape = v.tensors[first_item.id].shape
    if len(args) == 3:
        dim_name = args[2]
        if dim_name.id not in v.dims:
            raise _err(f"'{dim_name.id}' is not a dim", dim_name.pos)
        chosen = dim_name.id
        where = dim_name.pos
    else:
        if not first_shape:
            raise _err(f"'{first_item.id}' is a scalar; there is nothing to permute",
                       first_item.pos)
        first = first_shape[0]
        if not first.is_Symbol:
            shown = first_item.id if len(group) == 1 else "(" + ", ".join(i.id for i in group) + ")"
            raise _err(f"the first axis of {first_item.id} is {first}, not a single dim",
                       first_item.pos, f"name the dim to permute: {claim.func}({out.id}, {shown}, DIM)")
        chosen = str(first)
        where = None
    dim = v.dims[chosen].symbol
    for item in group:
        shape = v.tensors[item.id].shape
        if not any(same_dim(dim, d) for d in shape):
            raise _err(f"{item.id} {v.shape_text(shape)} has no axis of dim {chosen}",
                       where if where is not None and len(group) == 1 else item.pos)
    return t.CheckInfo(stmt.pos.line, stmt.text, stmt.negated, claim.func, stmt.pos,
                       output=out.id, sources=tuple(i.id for i in group), dim=chosen)


def _window(node: t.Node, start: int, pos: ir.Pos) -> t.Node:
    """The last two axes of `node` from `start` to `start + size - 1`: one of the two windows of relative(B)."""
    rank = len(node.shape)
    out = node
    for axis in (rank - 2, rank - 1):
        size = node.shape[axis]
        stop = sympy.expand(size - 1 + start)
        shape = tuple(sympy.expand(size - 1) if k == axis else d for k, d in enumerate(out.shape))
        out = t.Slice(out, axis, sympy.Integer(start), stop, shape, pos=pos)
    return out


def relative_check(v, stmt: ir.Check, claim: ir.Call) -> t.CheckInfo:
    """Type `relative(B)`: B an expression of rank >= 2, compared with itself shifted by one row and column."""
    usage = "relative takes one tensor expression of rank >= 2, as in relative(B) or relative(Qr @ Kr.T)"
    if len(claim.args) != 1 or isinstance(claim.args[0], (ir.Keyword, ir.Group)):
        raise _err(usage, claim.pos)
    arg = claim.args[0]
    node = v.expr(arg, None)
    if isinstance(node, t.Compare):
        raise _err("a comparison is only allowed as the condition of where(cond, a, b)", arg.pos)
    shape = node.shape
    if len(shape) < 2:
        raise _err(f"relative(...) needs rank >= 2 (rows i and columns j); this has shape "
                   f"{v.shape_text(shape)}", arg.pos, usage)
    sizes = v.sizes
    for axis, what in ((-2, "row"), (-1, "column")):
        size = shape[axis].xreplace({info.symbol: sympy.Integer(sizes[n]) for n, info in v.dims.items()})
        if size.is_number and size < 2:
            raise _err(f"relative(...) compares B[..., i, j] with B[..., i + 1, j + 1], but this has one "
                       f"{what} (shape {v.shape_text(shape)})", arg.pos)
    return t.CheckInfo(stmt.pos.line, stmt.text, stmt.negated, "relative", stmt.pos,
                       lhs=_window(node, 0, claim.pos), rhs=_window(node, 1, claim.pos))
