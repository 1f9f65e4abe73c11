"""Which values may be non-finite: a static analysis of typed nodes, shared by every level.

Contract: `Finiteness(spec, definitions)` classifies every node, tensor and
gradient as FINITE (finite for every finite value of the inputs, params,
buffers and upstream gradients), MINUS_INF (finite or -inf, never NaN or
+inf: masks and what adds them) or ANY (may be NaN or infinite: `log`, `sqrt`,
division by a tensor, powers other than natural ones, and whatever reads them
through an operation that does not map -inf to a finite value). `deep(node)`
is the worst class of any node the value depends on, definitions included.

What "equal" means everywhere in symattn: equal at every point of the domain
(finite real values of every input, param, buffer and upstream gradient)
under IEEE float64 semantics, NaN and infinities included, both sides being
the same non-finite value counting as equal; rounding and overflow are not
modelled. The matrix level (`symattn.prove.canonical`) never cancels or drops a term
that is not FINITE; the element level (`symattn.symbolic.element`) proves identities
only of values whose `deep` class is at most MINUS_INF, substituting the exact
values of the others before it compares, and values of class ANY are compared
region by region (`symattn.symbolic.guarded`); the counterexample search
(`symattn.prove.claims`) reports only differences that the float64 evaluator
reproduces.
"""

from __future__ import annotations

from typing import Mapping

import sympy

from ..ir import typed as t
from ..ir.functions import FUNCTIONS, table
from .row_facts import ANY, FINITE, MINUS_INF, RowFacts

__all__ = ["FINITE", "MINUS_INF", "ANY", "Finiteness", "const_value", "finite_real"]


# --- constants ------------------------------------------------------------------

_SYMPY_FN = table("exact", {"neg": lambda x: -x})
_SYMPY_OP = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a ** b,
}


def const_value(node: t.Node) -> sympy.Expr | None:
    """The exact value of a node made only of numbers and dims, or None.

    Also None when a step is not defined for every size of the dims it reads
    (dims are positive integers, nothing more): `1 / (N - 5)`, `sqrt(N - 5)`,
    `log(N - 4)`. SymPy would simplify `(N - 5) / (N - 5)` to 1 and
    `sqrt(N - 5)^2` to N - 5 at once, which float64 does not do at N = 5 or 4.
    """
    if isinstance(node, t.Scalar):
        return sympy.sympify(node.value)
    if isinstance(node, t.DimValue):
        return sympy.sympify(node.dim)
    if isinstance(node, t.Unary) and node.shape == ():
        x = const_value(node.x)
        if x is None or (x.free_symbols and not _defined_for_all_sizes(node.fn, x)):
            return None
        return _SYMPY_FN[node.fn](x)
    if isinstance(node, t.Binary) and node.shape == ():
        a = const_value(node.a)
        if a is None:
            return None
        b = const_value(node.b)
        if b is None:
            return None
        if (a.free_symbols or b.free_symbols) and not _binary_defined_for_all_sizes(node.op, a, b):
            return None
        return _SYMPY_OP[node.op](a, b)
    return None


def _defined_for_all_sizes(fn: str, x: sympy.Expr) -> bool:
    """Whether fn(x) is a finite real for every positive integer value of the dims in x."""
    if fn in ("log",):
        return x.is_positive is True
    if fn in ("sqrt",):
        return x.is_nonnegative is True
    return True


def _binary_defined_for_all_sizes(op: str, a: sympy.Expr, b: sympy.Expr) -> bool:
    if op == "div":
        return b.is_zero is False
    if op == "pow":
        if b.is_integer and b.is_nonnegative:
            return True
        if b.is_integer:
            return a.is_zero is False
        return a.is_positive is True
    return True


def finite_real(value: sympy.Expr) -> bool:
    return value.is_finite is True and value.is_extended_real is True


# --- which nodes may be non-finite ----------------------------------------------


class Finiteness:
    """FINITE / MINUS_INF / ANY for every node, following tensors through their definitions."""

    def __init__(self, spec: t.TypedSpec, definitions: Mapping[str, t.Node | None]) -> None:
        self.spec = spec
        self.defs = definitions
        self.memo: dict[int, tuple[t.Node, int]] = {}
        self.named: dict[str, int] = {}
        self.rows = RowFacts(self.node, self.definition)

    def definition(self, name: str) -> t.Node | None:
        """A tensor's forward definition (None for a given tensor)."""
        info = self.spec.tensors.get(name)
        if info is not None and info.expr is not None:
            return info.expr
        value = self.defs.get(name) if (info is None or info.kind == "intermediate") else None
        return value if isinstance(value, t.Node) else None

    def tensor(self, name: str) -> int:
        if name not in self.named:
            self.named[name] = ANY  # a cycle (impossible in a valid spec) stays conservative
            info = self.spec.tensors.get(name)
            expr = info.expr if info is not None else None
            if expr is None and name in self.defs and (info is None or info.kind == "intermediate"):
                expr = self.defs[name]
            if info is None and expr is None:
                self.named[name] = ANY
            else:
                self.named[name] = FINITE if expr is None else self.node(expr)
        return self.named[name]

    def grad(self, name: str) -> int:
        key = f"grad({name})"
        if key not in self.named:
            self.named[key] = ANY
            output = name in self.spec.outputs
            if key in self.defs:
                expr = self.defs[key]
                if expr is None:
                    value = FINITE
                elif isinstance(expr, t.Grad) and expr.name == name:
                    value = FINITE if output else ANY
                else:
                    value = self.node(expr)
            else:
                value = FINITE if output else ANY
            self.named[key] = value
        return self.named[key]

    def deep(self, node: t.Node) -> int:
        """The worst class of any value `node` depends on: its own nodes (conditions
        included), the definitions of the tensors it reads, and, when it reads a
        gradient, every forward definition of the spec (the chain rule reads them all)."""
        worst = FINITE
        for n in t.depends_on(self.spec, [node]):
            worst = max(worst, self.node(n))
            if worst == ANY:
                break
        return worst

    def data_minus_inf(self, node: t.Node) -> bool:
        """Whether a value `node` depends on may be -inf where the data say so rather than at fixed
        entries: a log of a value >= 0 that may be 0 (class MINUS_INF, `log((X - c)^2)` is -inf where
        X = c). Masks are -inf at entries the element level substitutes exactly; a log's -inf is at
        the zero set of its argument, which it does not follow (SymPy writes exp(v) / exp(v) as 1
        whatever v is), so such values are compared region by region, as values of class ANY are."""
        for n in t.depends_on(self.spec, [node]):
            if isinstance(n, t.Unary) and n.fn == "log" and self.node(n) != FINITE:
                return True
        return False

    def node(self, node: t.Node) -> int:
        hit = self.memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        value = self._node(node)
        self.memo[id(node)] = (node, value)
        return value

    def _node(self, n: t.Node) -> int:
        if isinstance(n, t.Tensor):
            return self.tensor(n.name)
        if isinstance(n, t.Grad):
            return self.grad(n.name)
        if isinstance(n, t.Entry):
            return self.grad(n.tensor) if n.grad else self.tensor(n.tensor)
        if isinstance(n, t.Scalar):
            value = sympy.sympify(n.value)
            if finite_real(value):
                return FINITE
            return MINUS_INF if value == -sympy.oo else ANY
        if isinstance(n, (t.DimValue, t.IndexVar, t.Compare, t.Logical)):
            return FINITE
        if isinstance(n, t.Apply):  # integers; min, max and clamp of finite and -inf values are such
            return FINITE if n.fn in ("floordiv", "mod") else max(self.node(a) for a in n.args)
        if isinstance(n, t.Constant):
            return MINUS_INF if n.kind == "causal_mask" else FINITE
        const = const_value(n) if n.shape == () and isinstance(n, (t.Unary, t.Binary)) else None
        if const is not None:
            if finite_real(const):
                return FINITE
            return MINUS_INF if const == -sympy.oo else ANY
        if isinstance(n, t.Unary):
            x = self.node(n.x)
            function = FUNCTIONS.get(n.fn)  # None: neg
            if function is not None and not function.total:  # log, sqrt
                if n.fn == "log" and self.rows.positive(n.x):
                    return FINITE
                if n.fn == "log" and self.rows.nonnegative(n.x):
                    return MINUS_INF  # log(0) = -inf, never NaN
                if n.fn == "sqrt" and self.rows.nonnegative(n.x):
                    return FINITE
                return ANY
            if function is not None and function.absorbs_minus_inf:  # exp(-inf) = 0, tanh(-inf) = -1, ...
                return FINITE if x <= MINUS_INF else ANY
            return FINITE if x == FINITE else ANY  # neg, abs, sin, cos
        if isinstance(n, t.Binary):
            a, b = self.node(n.a), self.node(n.b)
            if n.op == "add":
                return max(a, b)
            if n.op == "sub":
                return a if b == FINITE else ANY
            if n.op in ("mul", "div"):
                cb = const_value(n.b)
                ca = const_value(n.a) if n.op == "mul" else None
                for value, other in ((cb, a), (ca, b)):
                    if value is not None and finite_real(value) and value.is_zero is False:
                        if value.is_positive:
                            return other
                        return FINITE if other == FINITE else ANY
                if n.op == "div":
                    # a finite positive divisor keeps -inf and finite values as they are
                    return a if self.rows.positive(n.b) else ANY
                return FINITE if a == b == FINITE else ANY
            if n.op == "pow":
                exponent = const_value(n.b)
                if exponent is not None and exponent.is_Integer and exponent >= 0 and a == FINITE:
                    return FINITE
                base = const_value(n.a)  # a positive number to a finite power: 10000^(-c / h)
                if base is not None and finite_real(base) and base.is_positive and b == FINITE:
                    return FINITE
                if self.rows.positive(n.a) and b == FINITE:
                    return FINITE  # x ^ y for x > 0
                if exponent is not None and finite_real(exponent) and exponent.is_positive and \
                        self.rows.nonnegative(n.a):
                    return FINITE  # x ^ p for x >= 0 and p > 0: 0 ^ p = 0
                return ANY
        if isinstance(n, t.MatMul):
            return FINITE if self.node(n.a) == self.node(n.b) == FINITE else ANY
        if isinstance(n, t.Reduce):
            x = self.node(n.x)  # sums, maxima and minima of finite and -inf values are finite or -inf
            if x == MINUS_INF and n.kind in ("max", "logsumexp") and n.axis is not None and \
                    self.rows.nonempty(n.x, n.axis):
                return FINITE  # every line holds a finite entry: its max and logsumexp are finite
            return x
        if isinstance(n, t.Softmax):
            return FINITE if self.node(n.x) <= MINUS_INF else ANY
        if isinstance(n, t.Where):
            return max(self.node(n.a), self.node(n.b))
        if isinstance(n, (t.Transpose, t.SumTo, t.Slice, t.MergeHeads, t.SplitHeads, t.IndexSum, t.Scan,
                          t.Scatter)):  # sums, moves and zeros: the class of what is moved or summed
            return self.node(n.children[0])
        if isinstance(n, t.Concat):
            return max(self.node(p) for p in n.parts)
        if isinstance(n, t.IndexDef):
            return self.node(n.body)
        return ANY
