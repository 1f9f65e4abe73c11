"""`D = dropout(x, p)`: the definition, and the 0/1 mask it brings into the spec.

Contract: `dropout_definition(validator, stmt)` types a definition whose whole
right side is `dropout(x, p)` (x a tensor expression in matrix notation, p a
number literal in [0, 1)). It declares the definition's mask, an integer
buffer in 0:2 of x's shape whose `TensorInfo.dropout` says what it is, under a
name that nothing in the spec uses (`D_keep`, else `D_keep_2`, ...), and
returns `x * D_keep / (1 - p)`. Claims then hold for every mask, as the
language says, with no rule of their own (a p below 2**-32, 0 included, keeps
every entry at run time: `x / (1 - p)`, no mask); generated code draws the mask from
its seed (`symattn.ir.spec.Dropout`). No definition may name the mask (it
belongs to D alone); a check may, as derivations write it (`grad(P) == grad(D) /
0.9 * D_keep`). `dropout` anywhere else (inside an expression, in index
notation, in a check) is `misplaced`, a located error with the form to write.
"""

from __future__ import annotations

import sympy

from . import syntax as ir
from ..errors import SpecShapeError, SpecNameError
from ..ir import typed as t
from ..ir.spec import Dropout
from .dims import number_value

__all__ = ["is_dropout", "dropout_definition", "misplaced", "hidden_read"]

_FORM = "write it as a definition of its own: `D = dropout(P, 0.1)`, then use D"


def _err(cls, message: str, pos: ir.Pos, hint: str | None = None):
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


def is_dropout(stmt: ir.Define) -> bool:
    return stmt.indices is None and isinstance(stmt.expr, ir.Call) and stmt.expr.func == "dropout"


def _probability(node: ir.Expr) -> sympy.Rational:
    if isinstance(node, ir.Number):
        p = number_value(node)
        if 0 <= p < 1:
            return p
        raise _err(SpecShapeError, f"dropout's p must be in [0, 1), got {node.text}", node.pos,
                   "p is the probability that an entry is dropped (0.1 drops one in ten)")
    raise _err(SpecShapeError, "dropout's p must be a number literal in [0, 1)", node.pos,
               "for example `dropout(P, 0.1)`")


def _mask_name(v, name: str) -> str:
    taken = set(v.later) | set(v.dims) | set(v.tensors)
    candidate, k = f"{name}_keep", 1
    while candidate in taken:
        k += 1
        candidate = f"{name}_keep_{k}"
    return candidate


def dropout_definition(v, stmt: ir.Define) -> t.Node:
    """The typed `x * mask / (1 - p)` of `D = dropout(x, p)`, its mask declared in `v.tensors`."""
    call = stmt.expr
    args = [a for a in call.args if not isinstance(a, ir.Keyword)]
    for a in call.args:  # p may be named, as torch's F.dropout(x, p=0.1)
        if isinstance(a, ir.Keyword):
            if a.name != "p" or len(args) != 1:
                raise _err(SpecShapeError, f"dropout() got an unexpected keyword argument '{a.name}'", a.pos,
                           "dropout takes (x, p)")
            args.append(a.value)
    if len(args) != 2:
        raise _err(SpecShapeError, f"dropout() takes 2 arguments (x, p), got {len(args)}", call.pos,
                   "for example `D = dropout(P, 0.1)`")
    x = v.expr(args[0], None)
    if isinstance(x, (t.Compare, t.Logical)):
        raise _err(SpecShapeError, "dropout's x is a condition, not a tensor", x.pos)
    if v.reads:
        at, what, _ = v.reads[0]
        raise _err(SpecShapeError, f"dropout's x reads {what}, the backward pass; dropout belongs to the forward "
                   "pass", at)
    p = _probability(args[1])
    drop = Dropout(stmt.name.id, p, sum(1 for info in v.tensors.values() if info.dropout is not None))
    if drop.threshold == 0:  # p < 2**-32 (0 included): every entry is kept, no mask to draw
        return t.Binary("div", x, t.Scalar(1 - p, pos=args[1].pos), x.shape, pos=call.pos)
    name = _mask_name(v, stmt.name.id)
    v.tensors[name] = t.TensorInfo(name, "buffer", x.shape, stmt.name.pos, values=(sympy.Integer(0), sympy.Integer(2)),
                                   dropout=drop)
    mask = t.Tensor(name, x.shape, pos=call.pos)
    kept = t.Binary("mul", x, mask, x.shape, pos=call.pos)
    return t.Binary("div", kept, t.Scalar(1 - p, pos=args[1].pos), x.shape, pos=call.pos)


def misplaced(call: ir.Call, scope) -> SpecShapeError:
    """The error for `dropout` anywhere but the whole right side of a matrix-notation definition."""
    where = "in index notation" if scope is not None else "inside an expression or a check"
    return _err(SpecShapeError, f"dropout stands only as the whole right side of a definition, not {where}",
                call.func_pos, _FORM + " (each definition draws its own mask)")


def hidden_read(v, name: str, pos: ir.Pos) -> SpecNameError:
    """The error for a definition that names a dropout mask: it belongs to its dropout definition alone."""
    of = v.tensors[name].dropout.of
    return _err(SpecNameError, f"'{name}' is the mask that `{of} = dropout(...)` draws; no definition may read it",
                pos, f"read it through {of} (a check may name it: its claims hold for every mask)")
