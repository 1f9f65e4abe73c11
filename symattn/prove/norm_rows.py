"""Row norms as divisors, for all sizes: proved where the norm is > 0, NaN on both sides where it is 0.

Contract: `norm_divisors(nodes)` lists the divisors among typed nodes that are
the norm of a row of a FINITE tensor Q along its last axis,
`sqrt(sum(Q * Q, axis=-1))` or `sum(Q * Q, axis=-1)` (a `Norm`, with Q); its
zero set is "row of Q is 0". `nan_on_zero_rows(node, norm, resolve)` is True
only if every entry of `node` in a row where Q's row is 0 is NaN, at every
point; False means "not shown".

The rule this serves (`symattn.prove.canonical`): a claim `A == B` whose forms
agree when the norm D is taken as finite and > 0 (its reciprocal a finite
factor, which may be distributed and cancelled), where every reciprocal of D
the forms read is read at the entry's own row (a top-level factor at the
claim's row tokens, never inside the argument of a function nor at a
contracted index), and whose sides are NaN on every zero row of Q, holds at
every point: at an entry of a row where D > 0 the forms compute its value (the
only value of D they read is that row's, finite and > 0), and at an entry of a
row where D = 0 both sides are NaN, which IEEE-equal (see
`symattn.symbolic.finiteness`). So the QK-norm backward written out,
`grad(Q) == (grad(Qn) - Qn * sum(grad(Qn) * Qn)) / sqrt(sum(Q * Q))`, is proved
for all sizes, whatever grad(Qn) is (NaN and infinities included: it is kept
as a factor that may be non-finite).

Why NaN: on a zero row Q's entries are +-0 and D is +0 (squares of +-0 are +0,
so are their sums and sqrt), so `Q / D` is 0 / 0, NaN in every entry. NaN then
reaches an entry through `+ - * /` with any other operand (NaN is absorbing
in IEEE float64, `0 * NaN` and `NaN / 0` included), neg, exp, log and sqrt,
and a sum or mean along the last axis only (every entry of the row being NaN); an
operand broadcast along a row axis reads another row and is no witness. Not
through `pow` (1 ^ NaN is 1), comparisons, `where`, max or min, nor sums over a
row axis. Rounding (underflow of the squares) is not modelled, as elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..ir import typed as t
from ..ir.shapes import same_dim
from ..symbolic.finiteness import FINITE, Finiteness

__all__ = ["Norm", "norm_divisors", "nan_on_zero_rows"]

_NAN_FUNCTIONS = {"neg", "exp", "log", "sqrt"}  # NaN in, NaN out, in float64 and in every backend


@dataclass(frozen=True)
class Norm:
    """A divisor D that is 0 exactly on the rows where Q is 0: `sqrt(sum(Q * Q, axis=-1))` or the sum."""

    divisor: t.Node
    q: t.Node


def _sum_of_squares(node: t.Node) -> t.Node | None:
    """Q for `sum(Q * Q, axis=-1)` kept as an axis of size 1, else None."""
    if not (isinstance(node, t.Reduce) and node.kind == "sum" and node.axis is not None):
        return None
    square = node.x
    if not (isinstance(square, t.Binary) and square.op == "mul" and square.a == square.b):
        return None
    q = square.a
    if node.axis != len(q.shape) - 1 or len(node.shape) != len(q.shape) or len(q.shape) < 2:
        return None
    return q


def _norm(node: t.Node, risk: Finiteness) -> Norm | None:
    inner = node.x if isinstance(node, t.Unary) and node.fn == "sqrt" else node
    q = _sum_of_squares(inner)
    if q is None or risk.node(q) != FINITE:
        return None
    return Norm(node, q)


def norm_divisors(nodes: Iterable[t.Node], risk: Finiteness) -> list[Norm]:
    """The row norms (see the module docstring) that divide in `nodes` and their subtrees, each once."""
    found: list[Norm] = []
    for root in nodes:
        for n in t.walk(root):
            if isinstance(n, t.Binary) and n.op == "div":
                norm = _norm(n.b, risk)
                if norm is not None and norm not in found:
                    found.append(norm)
    return found


def _rows_aligned(operand: t.Node, node: t.Node, rows: int) -> bool:
    """The operand has the node's row axes (the first `rows` axes of a node of rank rows + 1), unbroadcast."""
    return len(operand.shape) == len(node.shape) == rows + 1 and all(
        same_dim(a, b) and a != 1 for a, b in zip(operand.shape[:rows], node.shape[:rows]))


def nan_on_zero_rows(node: t.Node, norm: Norm, resolve: Callable[[t.Node], t.Node | None]) -> bool:
    """Every entry of `node` in a row where Q's row is 0 is NaN (see the module docstring). `resolve` gives
    a tensor's or a gradient's definition (None where there is none)."""
    rows = len(norm.q.shape) - 1
    memo: dict[int, tuple[t.Node, bool]] = {}

    def nan(n: t.Node, depth: int = 0) -> bool:
        hit = memo.get(id(n))
        if hit is not None and hit[0] is n:
            return hit[1]
        memo[id(n)] = (n, False)  # a cycle stays "not shown"
        value = depth < 200 and len(n.shape) == rows + 1 and _nan(n, depth)
        memo[id(n)] = (n, value)
        return value

    def witness(operand: t.Node, n: t.Node, depth: int) -> bool:
        return _rows_aligned(operand, n, rows) and nan(operand, depth + 1)

    def _nan(n: t.Node, depth: int) -> bool:
        if isinstance(n, (t.Tensor, t.Grad)):
            definition = resolve(n)
            return definition is not None and definition.shape == n.shape and nan(definition, depth + 1)
        if isinstance(n, t.Binary) and n.op == "div" and n.a == norm.q and n.b == norm.divisor:
            return True  # 0 / 0 in every entry of a zero row
        if isinstance(n, t.Binary) and n.op in ("add", "sub", "mul", "div"):
            return witness(n.a, n, depth) or witness(n.b, n, depth)
        if isinstance(n, t.Unary) and n.fn in _NAN_FUNCTIONS:
            return witness(n.x, n, depth)
        if isinstance(n, t.Reduce) and n.kind in ("sum", "mean") and n.axis == rows:
            return witness(n.x, n, depth)
        if isinstance(n, t.SumTo) and len(n.x.shape) == len(n.shape) and n.shape[rows] == 1 and all(
                same_dim(a, b) for a, b in zip(n.x.shape[:rows], n.shape[:rows])):
            return witness(n.x, n, depth)  # summed along the last axis only
        return False

    return nan(node)
