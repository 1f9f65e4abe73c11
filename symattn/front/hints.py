"""What to suggest when a spec is wrong: the hint lines under validation errors.

Contract: each function takes what the validator knows at the error (names, shapes, the
tensors declared so far) and returns the hint text, or for a spec without an output the
located error itself; none of them raises anything else or looks at the source text. A hint
says what to write instead, in the spec's own names.
"""

from __future__ import annotations

import difflib
from typing import Mapping, Sequence

from . import syntax as ir
from ..errors import SpecNameError
from ..ir import typed as t
from ..ir.shapes import ONE, format_dim, format_shape, same_dim

__all__ = ["did_you_mean", "undeclared", "broadcast", "no_output"]


def did_you_mean(name: str, candidates) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"did you mean '{close[0]}'?" if close else None


def undeclared(name: str, known: Sequence[str], dim: bool) -> str:
    """An unknown name: the nearest known one, and how a new one is declared (a dim where a shape
    wants one, else a tensor)."""
    if dim:
        declare = f"a new dim is declared before it is used, e.g. `dim {name} = 4` (any positive size)"
    else:
        declare = (f"a new tensor is declared before it is used (`input {name}[...]` or `param {name}[...]`) "
                   f"or defined (`{name} = ...`)")
    similar = did_you_mean(name, known)
    return f"{similar} Or: {declare}" if similar else declare


def _axes_within(lower, higher) -> list[int] | None:
    """Axes of `higher`, in order, holding the dims of `lower` one by one (the first match each
    time), or None when some dim of `lower` is not there."""
    axes, start = [], 0
    for dim in lower:
        found = next((k for k in range(start, len(higher)) if same_dim(higher[k], dim)), None)
        if found is None:
            return None
        axes.append(found)
        start = found + 1
    return axes


def broadcast(a: t.Node, b: t.Node, order: Sequence[str], tensors: Mapping[str, t.TensorInfo],
              defining: str | None) -> str:
    """What to write instead of an elementwise operation whose shapes do not broadcast; `defining`
    is the tensor whose definition holds it."""
    lower, higher = (a, b) if len(a.shape) < len(b.shape) else (b, a)
    axes = _axes_within(lower.shape, higher.shape)
    if lower.shape and len(lower.shape) < len(higher.shape) and axes is not None:
        # A per-head (per-row, ...) factor: its dims are in the other operand, not at its end.
        wanted = [lower.shape[axes.index(k)] if k in axes else ONE for k in range(axes[0], len(higher.shape))]
        rank = len(higher.shape)
        letters = ["i", "j"][-rank:] if rank <= 2 else [*"abc"[:rank - 2], "i", "j"] if rank <= 5 else \
            [f"i{k}" for k in range(rank)]
        is_tensor = isinstance(lower, t.Tensor)
        name = lower.name if is_tensor else "the operand"
        end = ", ".join(format_dim(d, order) for d in higher.shape[rank - len(lower.shape):])
        per = ", ".join(format_dim(d, order) for d in lower.shape)
        declared = is_tensor and lower.name in tensors and tensors[lower.name].expr is None
        read = f"{lower.name}[{', '.join(letters[k] for k in axes)}]" if is_tensor else "..."
        return (f"broadcasting lines up the last axes, so {name} {format_shape(lower.shape, order)} meets the "
                f"last ax{'is' if len(lower.shape) == 1 else 'es'} ({end}) of {format_shape(higher.shape, order)}; "
                f"for one value per {per if len(lower.shape) == 1 else '(' + per + ')'}, give it shape "
                f"{format_shape(wanted, order)}"
                + (f" (declare `{lower.name}{format_shape(wanted, order)}`)" if declared else "")
                + f" or write the definition in index notation: `{defining or 'T'}[{', '.join(letters)}] = ... {read}`")
    if len(a.shape) >= 2 and len(b.shape) >= 2 and same_dim(a.shape[-1], b.shape[-2]):
        return "elementwise operators broadcast like NumPy; for a matrix product use @"
    if len(a.shape) >= 2 and len(b.shape) >= 2 and same_dim(a.shape[-1], b.shape[-1]):
        return "elementwise operators broadcast like NumPy; for a matrix product use @ with .T (A @ B.T)"
    return ("elementwise operators broadcast like NumPy: shapes line up from the last axis, and each pair "
            "of dims is equal or one of them is 1")


def no_output(statements: Sequence[ir.Statement], tensors: Mapping[str, t.TensorInfo]) -> SpecNameError:
    """A spec without an `output` line, reported where that line belongs: after the last tensor
    declared or defined (not at a check, which comes after the outputs), naming what nothing reads."""
    tensor_statements = [s for s in statements if isinstance(s, (ir.TensorDecl, ir.Define))]
    last = (tensor_statements or list(statements) or [None])[-1]
    pos = last.pos if last is not None else ir.NOWHERE
    read = {n for info in tensors.values() if info.expr is not None for n in t.tensors_read(info.expr)}
    unread = [n for n, info in tensors.items() if info.expr is not None and n not in read]
    if unread:
        hint = (f"add a line `output {unread[-1]}` after this one ({', '.join(unread)} "
                f"{'is' if len(unread) == 1 else 'are'} computed and read by nothing else)")
    else:
        hint = "add a line `output NAME` after this one, naming what the spec computes"
    return SpecNameError("a spec needs at least one output", line=pos.line, column=1, hint=hint)
