"""Check-only definitions: definitions that read the backward pass.

Contract: a definition that reads `grad(T)`, an entry `grad(T)[i, j]` (in
index notation), or another check-only definition is *check-only*: it is not
part of the forward pass (`symattn.front.validate` keeps it out of
`TypedSpec.tensors`, so nothing derives, generates or permutes it), and a
check that names it sees its typed expression in its place. This is how
`symattn derive --gradients` writes the index-notation parts of a gradient
(`dX_1[l:N, m:d] = sum(j, grad(S)[l, j] * ...)`, then `grad(X) = dX_1 + ...`)
so that the printout is spec text. The rules here are called by the
validator: `read_backward` records a read, `grad_entry` types `grad(T)[i, j]`,
`output_reads_backward` is the located error for an output that is
check-only, at the read that brought grad into the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import syntax as ir
from ..errors import SpecCheckError, SpecError, SpecShapeError
from ..ir import typed as t

__all__ = ["CheckOnly", "CHECK_ONLY_HINT", "read_backward", "grad_entry", "output_reads_backward"]

CHECK_ONLY_HINT = ("a definition that reads grad(...) is check-only: it is not part of the forward pass, "
                   "and only checks and other check-only definitions may use it")


@dataclass(frozen=True)
class CheckOnly:
    """A check-only definition: its typed expression (an IndexDef in index notation), and the
    first read that made it check-only, `grad(X)` itself or another check-only definition `via`."""

    name: str
    node: t.Node
    read: str
    at: ir.Pos
    via: str | None = None


def _err(cls, message: str, pos: ir.Pos, hint: str | None = None) -> SpecError:
    return cls(message, line=pos.line, column=pos.column, hint=hint, length=pos.length)


def read_backward(v, pos: ir.Pos, what: str, via: str | None = None) -> None:
    """A read of grad(...) (or of the check-only definition `via`): inside a definition it makes
    that definition check-only; elsewhere only a check may read it."""
    if v.reads is not None:
        v.reads.append((pos, what, via))
    elif not v.in_check:
        raise _err(SpecCheckError, f"{what} is only available in checks and check-only definitions", pos,
                   CHECK_ONLY_HINT)


def grad_entry(v, node: ir.CallSubscript, scope) -> t.Entry:
    """`grad(T)[i, j]`: an entry of an upstream gradient, in index notation."""
    call = node.call
    if call.func != "grad":
        raise _err(SpecShapeError, f"{call.func}(...)[...]: only grad(T) has entries to pick", node.pos,
                   f"name the result, T = {call.func}(...), and pick T[i, j] in index notation")
    if scope is None:
        raise _err(SpecShapeError, "grad(...)[...] picks one entry, which is index notation", node.pos,
                   "define a check-only tensor in index notation: T[i, j] = ... grad(X)[i, j] ...")
    whole = v.expr(call, None)  # typed by the builtin's rule, and recorded as a read of grad
    entry = v.expr(ir.Subscript(whole.name, node.indices, pos=node.pos), scope)
    return replace(entry, grad=True)


def output_reads_backward(v, output: ir.Name) -> SpecError:
    """The error for an output that is check-only, located at the read that brought grad into
    the forward pass: the output's own read of grad, or else the read of a check-only
    definition that reads grad itself, by the forward tensor nearest to that definition."""
    reader, read = output.id, v.check_only[output.id]
    if read.via is None:
        return _err(SpecCheckError, f"'{output.id}' is an output (declared at {output.pos.line}:"
                    f"{output.pos.column}), so it cannot read {read.read}", read.at, CHECK_ONLY_HINT)
    while v.check_only[read.via].via is not None:
        reader, read = read.via, v.check_only[read.via]
    source = v.check_only[read.via]
    who = (f"output '{reader}'" if reader == output.id
           else f"'{reader}' is part of the forward pass (output '{output.id}' depends on it), so it")
    return _err(SpecCheckError, f"{who} cannot read {read.read}, a check-only definition (it reads "
                f"{source.read} at {source.at.line}:{source.at.column})", read.at, CHECK_ONLY_HINT)
