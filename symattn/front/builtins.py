"""The builtin functions of the spec language: one typing rule each.

Contract: `validate_call(validator, call, scope)` returns the typed node for
a call of a builtin, or raises a located `SpecError`. The table `RULES` maps
each function name to its rule; a name not in it is an unknown function.
`scope` is None in matrix notation and the index scope in index notation.
"""

from __future__ import annotations

from typing import Callable

import sympy

from . import syntax as ir
from ..ir import typed as t
from ..ir.functions import FUNCTIONS, OPERATIONS
from ..errors import SpecCheckError, SpecNameError, SpecShapeError
from ..ir.shapes import ShapeMismatch, broadcast, normalize_axis, same_dim
from .check_only import read_backward

__all__ = ["validate_call", "RULES"]


def _err(cls, message: str, pos: ir.Pos, hint: str | None = None):
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


class _Args:
    """A call's positional and keyword arguments, checked against a signature."""

    def __init__(self, call: ir.Call, names: tuple[str, ...], required: int) -> None:
        self.call = call
        positional = [a for a in call.args if not isinstance(a, ir.Keyword)]
        keywords = {}
        for a in call.args:
            if isinstance(a, ir.Keyword):
                if a.name not in names[len(positional):] or a.name in keywords:
                    raise _err(SpecShapeError, f"{call.func}() got an unexpected keyword argument '{a.name}'", a.pos,
                               f"{call.func} takes ({', '.join(names)})")
                keywords[a.name] = a.value
        if len(positional) > len(names):
            raise _err(SpecShapeError, f"{call.func}() takes at most {len(names)} argument"
                       f"{'s' if len(names) != 1 else ''}, got {len(positional)}", call.pos,
                       f"{call.func} takes ({', '.join(names)})")
        self.values: dict[str, ir.Expr] = dict(zip(names, positional))
        self.values.update(keywords)
        missing = [n for n in names[:required] if n not in self.values]
        if missing:
            raise _err(SpecShapeError, f"{call.func}() is missing the argument '{missing[0]}'", call.pos,
                       f"{call.func} takes ({', '.join(names)})")

    def get(self, name: str) -> ir.Expr | None:
        return self.values.get(name)


def _matrix_only(v, call: ir.Call, scope) -> None:
    if scope is not None:
        raise _err(SpecShapeError, f"{call.func}() works on whole tensors; it is not available in index notation",
                   call.func_pos)


def _axis(v, args: _Args, x: t.Node, default: int | None) -> int | None:
    node = args.get("axis")
    if node is None:
        return default if default is None else normalize_axis(default, max(1, len(x.shape)))
    axis = v.int_literal(node, "axis")
    try:
        return normalize_axis(axis, len(x.shape))
    except ShapeMismatch:
        raise _err(SpecShapeError, f"axis {axis} is out of range for {args.call.func}() of a tensor with shape "
                   f"{v.shape_text(x.shape)} ({len(x.shape)} ax{'is' if len(x.shape) == 1 else 'es'})",
                   node.pos) from None


def _elementwise(v, call, scope):
    (x,) = _tensors(v, call, scope, ("x",))
    return t.Unary(call.func, x, x.shape, pos=call.pos)


def _tensors(v, call, scope, names):
    args = _Args(call, names, len(names))
    out = []
    for n in names:
        node = v.expr(args.get(n), scope)
        if isinstance(node, (t.Compare, t.Logical)):
            raise _err(SpecShapeError, "a condition is only allowed as the condition of where(cond, a, b)",
                       node.pos)
        out.append(node)
    return out


def _reduction(v, call, scope):
    if scope is not None and call.func == "sum":
        return _index_sum(v, call, scope)
    if call.func in ("min", "max"):
        positional = [a for a in call.args if not isinstance(a, ir.Keyword)]
        if len(positional) == 2 and not any(isinstance(a, ir.Keyword) for a in call.args):
            return _operation(v, call, scope, call.func)
        if len(positional) == 1 and not any(isinstance(a, ir.Keyword) for a in call.args):
            raise _err(SpecShapeError, f"{call.func}(x) alone: which {call.func} is meant?", call.pos,
                       f"{call.func}(x, axis=-1) is the reduction along an axis, {call.func}(a, b) the elementwise "
                       f"{'least' if call.func == 'min' else 'greatest'} of two tensors")
    _matrix_only(v, call, scope)
    args = _Args(call, ("x", "axis"), 1)
    x = v.expr(args.get("x"), scope)
    if x.shape == ():
        raise _err(SpecShapeError, f"{call.func}() of a scalar; it needs a tensor with an axis", call.pos)
    axis = _axis(v, args, x, None)
    shape = tuple(sympy.Integer(1) if axis is None or k == axis else d for k, d in enumerate(x.shape))
    return t.Reduce(call.func, x, axis, shape, pos=call.pos)


def _cumsum(v, call, scope):
    _matrix_only(v, call, scope)
    args = _Args(call, ("x", "axis", "reverse"), 2)
    x = v.expr(args.get("x"), scope)
    if x.shape == ():
        raise _err(SpecShapeError, "cumsum() of a scalar; it needs a tensor with an axis", call.pos)
    axis = _axis(v, args, x, None)
    flag = args.get("reverse")
    reverse = 0 if flag is None else v.int_literal(flag, "reverse")
    if reverse not in (0, 1):
        raise _err(SpecShapeError, f"reverse must be 0 (a prefix sum) or 1 (a suffix sum), got {reverse}",
                   flag.pos)
    return t.Scan(x, axis, bool(reverse), x.shape, pos=call.pos)


def _index_sum(v, call, scope):
    args = [a for a in call.args]
    explicit = None  # `sum(c:h, ...)`: the range given, for an index read only in subscript arithmetic
    if len(args) == 2 and isinstance(args[0], ir.SliceItem) and isinstance(args[0].start, ir.Name) \
            and args[0].stop is not None:
        explicit = args[0].stop
        args = [args[0].start, args[1]]
    if len(args) != 2 or not isinstance(args[0], ir.Name) or isinstance(args[1], ir.Keyword):
        raise _err(SpecShapeError, "in index notation, sum takes an index and a term: sum(k, expr)", call.pos,
                   "give the index a range, as sum(k:N, expr), when it is read only in subscript arithmetic")
    index = args[0]
    if index.id in scope.ranges:
        raise _err(SpecNameError, f"index '{index.id}' is already in use here", index.pos,
                   "pick a new name for the summed index")
    if index.id in v.dims or index.id in v.tensors or index.id in ("inf", "pi"):
        raise _err(SpecNameError, f"index '{index.id}' clashes with the {v._what(index.id)} of that name",
                   index.pos)
    scope.ranges[index.id] = None
    scope.seen_at[index.id] = index.pos
    if explicit is not None:
        scope.ranges[index.id] = v.dim_expr(explicit, f"the range of {index.id}")
        v.check_size(scope.ranges[index.id], explicit.pos)
    try:
        body = v.expr(args[1], scope)
        rng = scope.ranges[index.id]
        if rng is None:
            raise _err(SpecShapeError, f"cannot infer the range of the summed index '{index.id}'", index.pos,
                       f"use {index.id} as a subscript, as in X[i, {index.id}], or give its range: "
                       f"sum({index.id}:N, ...)")
        for pending in scope.pending:  # computed subscripts that read the summed index: its range, now known
            if index.id in t.subscript_names(pending.value) and index.id not in pending.ranges:
                pending.ranges[index.id] = rng
    finally:
        scope.ranges.pop(index.id, None)
    return t.IndexSum(t.Index(index.id, rng), body, pos=call.pos)


def _operation(v, call, scope, name: str):
    """An elementwise operation of several operands (`min(a, b)`, `clamp(x, lo, hi)`): a `typed.Apply`."""
    record = OPERATIONS[name]
    names = ("a", "b") if record.arity == 2 else ("x", "lo", "hi")
    args = _tensors(v, call, scope, names)
    if record.constant_bounds:
        for arg, node in zip(args[1:], names[1:]):
            read = [n for n in t.tensors_read(arg) if v.tensors[n].kind in ("input", "param")] \
                if all(n in v.tensors for n in t.tensors_read(arg)) else []
            if read or any(isinstance(n, t.Grad) or (isinstance(n, t.Entry) and n.grad) for n in t.walk(arg)):
                raise _err(SpecShapeError, f"the bound {node} of clamp reads '{read[0] if read else 'grad'}', which "
                           "is differentiated; clamp's bounds are constants (numbers, dims, indices, buffers)",
                           arg.pos, "for a bound that is learned write min(max(x, lo), hi)")
    try:
        shape = broadcast(*(a.shape for a in args), op=",", order=v.order)
    except ShapeMismatch as exc:
        raise v.shape_error(exc, call.pos) from None
    return t.Apply(name, tuple(args), shape, pos=call.pos)


def _clamp(v, call, scope):
    return _operation(v, call, scope, "clamp")


def _softmax(v, call, scope):
    _matrix_only(v, call, scope)
    args = _Args(call, ("x", "axis"), 1)
    x = v.expr(args.get("x"), scope)
    if x.shape == ():
        raise _err(SpecShapeError, "softmax() of a scalar; it needs a tensor with an axis", call.pos)
    return t.Softmax(x, _axis(v, args, x, -1), x.shape, pos=call.pos)


def _where(v, call, scope):
    args = _Args(call, ("cond", "a", "b"), 3)
    cond = v.expr(args.get("cond"), scope)
    if not isinstance(cond, (t.Compare, t.Logical)):
        raise _err(SpecShapeError, "the condition of where() must be a comparison (< <= > >= == !=), or "
                   "comparisons joined by & | ~", cond.pos)
    a, b = v.expr(args.get("a"), scope), v.expr(args.get("b"), scope)
    try:
        shape = broadcast(cond.shape, a.shape, b.shape, op=",", order=v.order)
    except ShapeMismatch as exc:
        raise v.shape_error(exc, call.pos) from None
    return t.Where(cond, a, b, shape, pos=call.pos)


def _merge_heads(v, call, scope):
    _matrix_only(v, call, scope)
    (x,) = _tensors(v, call, scope, ("x",))
    if len(x.shape) < 3:
        raise _err(SpecShapeError, f"merge_heads() needs [..., h, N, k], got {v.shape_text(x.shape)}", call.pos)
    *batch, h, n, k = x.shape
    return t.MergeHeads(x, (*batch, n, h * k), pos=call.pos)


def _split_heads(v, call, scope):
    _matrix_only(v, call, scope)
    args = _Args(call, ("x", "h"), 2)
    x = v.expr(args.get("x"), scope)
    heads = v.dim_expr(args.get("h"), "the number of heads")
    if len(x.shape) < 2:
        raise _err(SpecShapeError, f"split_heads() needs [..., N, h * k], got {v.shape_text(x.shape)}", call.pos)
    *batch, n, width = x.shape
    per_head = sympy.cancel(width / heads)
    v.check_size(per_head, call.pos)
    return t.SplitHeads(x, heads, (*batch, heads, n, per_head), pos=call.pos)


def _concat(v, call, scope):
    _matrix_only(v, call, scope)
    parts = [v.expr(a, scope) for a in call.args if not isinstance(a, ir.Keyword)]
    keywords = [a for a in call.args if isinstance(a, ir.Keyword)]
    for n, k in enumerate(keywords):
        if k.name != "axis" or n > 0:
            raise _err(SpecShapeError, f"concat() got an unexpected keyword argument '{k.name}'", k.pos)
    if len(parts) < 2:
        raise _err(SpecShapeError, "concat() joins at least two tensors", call.pos)
    rank = len(parts[0].shape)
    if rank == 0 or any(len(p.shape) != rank for p in parts):
        shown = ", ".join(v.shape_text(p.shape) for p in parts)
        raise _err(SpecShapeError, f"concat() needs tensors of the same rank (at least 1), got {shown}", call.pos)
    axis_node = keywords[0].value if keywords else None
    axis = v.int_literal(axis_node, "axis") if axis_node is not None else 0
    try:
        axis = normalize_axis(axis, rank)
    except ShapeMismatch as exc:
        raise v.shape_error(exc, axis_node.pos if axis_node is not None else call.pos) from None
    for p in parts[1:]:
        for k in range(rank):
            if k != axis and not same_dim(p.shape[k], parts[0].shape[k]):
                raise _err(SpecShapeError, f"concat() along axis {axis}: {v.shape_text(parts[0].shape)} and "
                           f"{v.shape_text(p.shape)} differ on axis {k}", call.pos)
    shape = list(parts[0].shape)
    shape[axis] = sum((p.shape[axis] for p in parts), sympy.Integer(0))
    return t.Concat(tuple(parts), axis, tuple(shape), pos=call.pos)


def _transpose(v, call, scope):
    (x,) = _tensors(v, call, scope, ("x",))
    return v.transpose(x, call.pos, call.func_pos, scope)


def _constant(arity: tuple[int, int]):
    def rule(v, call, scope):
        _matrix_only(v, call, scope)
        lo, hi = arity
        if not lo <= len(call.args) <= hi or any(isinstance(a, ir.Keyword) for a in call.args):
            count = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise _err(SpecShapeError, f"{call.func}() takes {count} dim argument{'s' if hi > 1 else ''}", call.pos)
        dims = tuple(v.dim_expr(a, f"an argument of {call.func}()") for a in call.args)
        for d, a in zip(dims, call.args):
            v.check_size(d, a.pos)
        shape = {"sinusoidal": dims, "causal_mask": dims * 2, "eye": dims * 2, "ones": dims}[call.func]
        return t.Constant(call.func, dims, tuple(shape), pos=call.pos)

    return rule


def _grad(v, call, scope):
    """grad(T): in a check, or in a definition, which reading it makes check-only."""
    if len(call.args) != 1 or not isinstance(call.args[0], ir.Name):
        raise _err(SpecCheckError, "grad() takes one tensor name, as in grad(Q)", call.pos)
    name = call.args[0]
    if name.id in v.check_only:
        raise _err(SpecCheckError, f"grad of '{name.id}': it is a check-only definition, not a tensor of the "
                   "forward pass", name.pos)
    if name.id not in v.tensors:
        if name.id in v.dims:
            raise _err(SpecCheckError, f"grad of '{name.id}': it is a dim, not a tensor", name.pos)
        raise _err(SpecCheckError, f"grad of unknown tensor '{name.id}'", name.pos,
                   v.unknown(name.id, name.pos).hint)
    if not v.tensors[name.id].has_gradient:
        raise _err(SpecCheckError, f"grad of '{name.id}': it is a buffer, a given tensor that is never "
                   "differentiated, so it has no gradient", name.pos,
                   f"declare {name.id} as an input or param to differentiate it")
    shape = v.tensors[name.id].shape
    if scope is not None and shape != ():
        raise _err(SpecShapeError, f"grad({name.id}) has shape {v.shape_text(shape)}; in index notation write one "
                   f"entry, as grad({name.id})[{', '.join('ijkl'[:len(shape)]) if len(shape) <= 4 else '...'}]",
                   call.pos)
    read_backward(v, call.func_pos, f"grad({name.id})")
    return t.Grad(name.id, shape, pos=call.pos)


def _tangent(v, call, scope):
    """tangent(T) or tangent(grad(T)), in a check only: the forward-mode derivative along free tangents."""
    arg = call.args[0] if len(call.args) == 1 else None
    inner = arg.args[0] if isinstance(arg, ir.Call) and arg.func == "grad" and len(arg.args) == 1 else arg
    if not isinstance(inner, ir.Name) or (isinstance(arg, ir.Call) and arg.func != "grad"):
        raise _err(SpecCheckError, "tangent() takes one tensor name or grad of one, as in tangent(P) or "
                   "tangent(grad(W))", call.pos)
    if v.reads is not None or not v.in_check:
        raise _err(SpecCheckError, "tangent(...) stands only in checks", call.func_pos,
                   "the forward-mode pass as a whole is `symattn derive SPEC --tangent`")
    if scope is not None:
        raise _err(SpecShapeError, "tangent(...) is a whole tensor; checks about tangents are in matrix notation",
                   call.pos)
    if inner.id in v.check_only or inner.id not in v.tensors:
        if inner.id in v.dims:
            raise _err(SpecCheckError, f"tangent of '{inner.id}': it is a dim, not a tensor", inner.pos)
        if inner.id in v.check_only:
            raise _err(SpecCheckError, f"tangent of '{inner.id}': it is a check-only definition, not a tensor "
                       "of the forward pass", inner.pos)
        raise _err(SpecCheckError, f"tangent of unknown tensor '{inner.id}'", inner.pos,
                   v.unknown(inner.id, inner.pos).hint)
    x = _grad(v, arg, scope) if isinstance(arg, ir.Call) else t.Tensor(inner.id, v.tensors[inner.id].shape)
    return t.Tangent(x, x.shape, pos=call.pos)


def _symmetry(v, call, scope):
    raise _err(SpecCheckError, f"{call.func}(...) is a claim; it can only stand alone in a check", call.func_pos,
               f"write `check {call.func}(...)` on its own line")


RULES: dict[str, Callable] = {
    **{name: _reduction for name in t.REDUCTIONS},
    "cumsum": _cumsum,
    "softmax": _softmax,
    "where": _where,
    "clamp": _clamp,
    "merge_heads": _merge_heads,
    "split_heads": _split_heads,
    "concat": _concat,
    "transpose": _transpose,
    "sinusoidal": _constant((2, 2)),
    "causal_mask": _constant((1, 1)),
    "eye": _constant((1, 1)),
    "ones": _constant((1, 8)),
    "grad": _grad,
    "tangent": _tangent,
    "equivariant": _symmetry,
    "invariant": _symmetry,
    "relative": _symmetry,
}


def validate_call(v, call: ir.Call, scope) -> t.Node:
    if call.func == "dropout":
        from .dropout import misplaced

        raise misplaced(call, scope)
    rule = RULES.get(call.func) or (_elementwise if call.func in FUNCTIONS else None)
    if rule is None:
        if call.func in v.tensors or call.func in v.dims:
            raise _err(SpecNameError, f"'{call.func}' is not a function", call.func_pos,
                       f"to pick entries write {call.func}[i, j] in index notation; to multiply write *")
        from difflib import get_close_matches

        # A higher cutoff than difflib's 0.6, which offers 'softmax' for 'max'.
        close = get_close_matches(call.func, list(RULES), n=1, cutoff=0.75)
        raise _err(SpecNameError, f"unknown function '{call.func}'", call.func_pos,
                   f"did you mean '{close[0]}'?" if close else
                   "the builtins are " + ", ".join(sorted([*FUNCTIONS, *(n for n in RULES if n not in ("equivariant", "invariant", "relative")), "dropout"])))
    return rule(v, call, scope)
