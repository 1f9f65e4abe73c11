"""Why a claim proved at the spec's sizes was not proved for all sizes: the rule the matrix level lacks.

Contract: `missing_rule(spec, definitions, finiteness, lhs, rhs)` names, in one
clause, the first construct the two sides compute with (their own nodes, then
the definitions and derived gradients they read) that the canonical index
forms (`symattn.prove.canonical`) have no rule for at every size, in this
order: a division by a value that may be 0 (its cancellations, `x / x`, are
made only where the divisor is shown > 0); sin or cos of a sum (angle addition
is not expanded); sqrt, log or a fractional power of a value that may be 0 or
negative; a softmax, logsumexp or max whose rows may be fully masked; a
`where` on values; and otherwise that the forms differ after every rule. It is
an explanation for the verdict, never a verdict: the element-level proof it
accompanies stands on its own.
"""

from __future__ import annotations

from typing import Mapping

from ..ir import typed as t
from ..ir.printing import to_spec
from ..symbolic.finiteness import MINUS_INF, Finiteness, const_value

__all__ = ["missing_rule"]

_ROWS = {"softmax": "softmax", "logsumexp": "logsumexp", "max": "max", "min": "min"}


def _nodes(spec: t.TypedSpec, definitions: Mapping[str, t.Node | None], sides):
    """The sides' nodes, then those of every definition and derived gradient they read, each once."""
    seen: set[str] = set()
    todo = list(sides)
    while todo:
        for n in t.walk(todo.pop(0)):
            yield n
            key = f"grad({n.name})" if isinstance(n, t.Grad) else n.name if isinstance(n, t.Tensor) else None
            if key is not None and key not in seen:
                seen.add(key)
                definition = definitions.get(key)
                if isinstance(definition, t.Node):
                    todo.append(definition)


def _is_sum(node: t.Node) -> bool:
    return isinstance(node, t.Binary) and node.op in ("add", "sub") or (
        isinstance(node, t.Binary) and node.op == "mul" and const_value(node.a) is not None)


def missing_rule(spec: t.TypedSpec, definitions: Mapping[str, t.Node | None], finiteness: Finiteness,
                 lhs: t.Node, rhs: t.Node) -> str:
    """The rule the matrix level lacks for this claim (see the module docstring)."""
    dims = list(spec.dims)
    rows = finiteness.rows
    found: dict[int, str] = {}
    for n in _nodes(spec, definitions, [lhs, rhs]):
        if isinstance(n, t.Binary) and n.op == "div" and const_value(n.b) is None and not rows.positive(n.b):
            found.setdefault(0, f"a division by {to_spec(n.b, dims)}, which may be 0: the matrix level cancels "
                                "a divisor only where it is shown > 0 (where it is 0 the sides may be NaN, a region "
                                "the element level compares apart)")
        elif isinstance(n, t.Unary) and n.fn in ("sin", "cos", "tan") and _is_sum(n.x):
            found.setdefault(1, f"angle addition in {to_spec(n, dims)} (sin and cos of sums and multiples), which "
                                "the matrix level does not expand")
        elif (isinstance(n, t.Unary) and n.fn in ("sqrt", "log") and not rows.positive(n.x)) or (
                isinstance(n, t.Binary) and n.op == "pow" and not (const_value(n.b) is not None
                                                                    and const_value(n.b).is_Integer)):
            found.setdefault(2, f"{to_spec(n, dims)} of a value that may be 0 or negative, whose algebra "
                                "(sqrt(s)^2 = s) the matrix level does not use")
        elif isinstance(n, (t.Softmax, t.Reduce)) and (isinstance(n, t.Softmax) or n.kind in _ROWS) and \
                n.axis is not None and finiteness.node(n.x) == MINUS_INF and not rows.nonempty(n.x, n.axis):
            found.setdefault(3, f"{to_spec(n, dims)} over rows that may be fully masked, where the row rules "
                                "(sum of weights 1, shifts) do not hold")
        elif isinstance(n, t.Where) and not any(isinstance(m, t.IndexVar) for m in t.walk(n.cond)):
            found.setdefault(4, f"the `where` on values in {to_spec(n, dims)}, which the matrix level does not "
                                "split into its cases")
    if found:
        return found[min(found)]
    return "the canonical index forms of the two sides differ after every rule of the matrix level"
