"""What the tensor-core kernels read off a core's score: its -inf mask, and its linear form.

Contract: `masked_condition(core, prefix, names, dims, lead)` returns the device
function `<prefix>_masked(head coords, i, j, dims)` (true where the score is -inf
whatever Q @ K.T is: a tile of such entries is skipped), or None.

`linear_score(score, product)` returns a `LinearScore` (c, b) when
`score` is c * s + b for s = `product`, where c is a scalar built from positive
literals and dims (so c > 0 whenever every dim is at least 1) and b does not
read s (a mask, a bias, or nothing); otherwise None. Then

    softmax(score) = softmax(c * x)  with  x = s + b / c,

and with c > 0 the row max of x picks the row max of the score, so the weight of
an entry is exp2(x * (c log2 e) - max x * (c log2 e)): one FFMA and one ex2, as
FlashAttention-2 does it. A -inf of the mask stays -inf in x (b / c = -inf), so
it gives exactly 0; NaN stays NaN. The host still checks at run time that c is
positive and that c log2 e and 1 / c are finite (a dim of 0 would break that)
and otherwise refuses, leaving the fp32 path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sympy

from ...ir import typed as t
from .core import AttentionCore
from .flash import score_printer
from .names import CNames
from .syntax import CPrinter

__all__ = ["LinearScore", "SoftmaxParts", "linear_score", "masked_condition", "scale_check", "softmax_parts"]


@dataclass(frozen=True)
class LinearScore:
    """score = scale * (Q @ K.T) + bias."""

    scale: t.Node | None   # c (shape ()); None for 1
    bias: t.Node | None    # b; None for 0


def _positive(node: t.Node) -> bool:
    """`node` is a scalar that is positive whenever every dim is at least 1 (or the host's test fails)."""
    if node.shape != ():
        return False
    if isinstance(node, t.Scalar):
        return node.value.is_positive is True and node.value.is_finite is True
    if isinstance(node, t.DimValue):  # a dim is at least 1; a dim expression only when sympy finds it positive
        return node.dim.is_Symbol or node.dim.is_positive is True
    if isinstance(node, t.Unary):  # the host computes c too: no tensor may hide in it
        return (node.fn == "sqrt" and _positive(node.x)) or (node.fn == "exp" and node.x.shape == ()
                                                             and _free_of_tensors(node.x))
    if isinstance(node, t.Binary):
        if node.op == "pow":
            return _positive(node.a) and node.b.shape == () and _free_of_tensors(node.b)
        return node.op in ("mul", "div", "add") and _positive(node.a) and _positive(node.b)
    return False


def _free_of_tensors(node: t.Node) -> bool:
    return not any(isinstance(n, (t.Tensor, t.MatMul, t.Entry, t.IndexVar)) for n in t.walk(node))


def _times(a: t.Node | None, b: t.Node, op: str) -> t.Node:
    """a op b for a scale (None = 1)."""
    if a is None:
        return b if op == "mul" else t.Binary("div", t.Scalar(sympy.Integer(1)), b, ())
    return t.Binary(op, a, b, ())


def _scaled_bias(bias: t.Node | None, factor: t.Node, op: str) -> t.Node | None:
    return None if bias is None else t.Binary(op, bias, factor, bias.shape)


def _mul(node: t.Binary, product: t.Node) -> LinearScore | None:
    inner, factor = (node.a, node.b) if product in t.walk(node.a) else (node.b, node.a)
    if product in t.walk(factor) or not _positive(factor):
        return None
    found = linear_score(inner, product)
    return found and LinearScore(_times(found.scale, factor, "mul"), _scaled_bias(found.bias, factor, "mul"))


def _div(node: t.Binary, product: t.Node) -> LinearScore | None:
    if product in t.walk(node.b) or not _positive(node.b):
        return None
    found = linear_score(node.a, product)
    return found and LinearScore(_times(found.scale, node.b, "div"), _scaled_bias(found.bias, node.b, "div"))


def _add(node: t.Binary, product: t.Node) -> LinearScore | None:
    inner, other = (node.a, node.b) if product in t.walk(node.a) else (node.b, node.a)
    if product in t.walk(other) or (node.op == "sub" and inner is node.b):
        return None
    found = linear_score(inner, product)
    if found is None:
        return None
    if node.op == "sub":
        other = t.Unary("neg", other, other.shape)
    bias = other if found.bias is None else t.Binary("add", found.bias, other, node.shape)
    return LinearScore(found.scale, bias)


_BINARY = {"mul": _mul, "div": _div, "add": _add, "sub": _add}


def linear_score(score: t.Node, product: t.Node) -> LinearScore | None:
    """(c, b) with score = c * product + b, c > 0 for dims >= 1 and b free of product; else None."""
    if score == product:
        return LinearScore(None, None)
    if isinstance(score, t.Binary) and score.op in _BINARY:
        return _BINARY[score.op](score, product)
    return None


def scale_check(scale: str | None) -> str:
    """The host's test that the folded scale c is usable (positive, c log2 e and 1 / c finite)."""
    if scale is None:
        return ""
    return (f"    const float c_ = {scale};  // the score is c_ * (Q K^T) + b: folded into the softmax only for c_ > 0\n"
            "    if (!(c_ > 0.0f && c_ * 1.4426950408889634f < INFINITY && 1.0f / c_ < INFINITY))"
            " return SYMATTN_UNSUPPORTED;\n")


@dataclass(frozen=True)
class SoftmaxParts:
    """The forward's softmax, as template text."""

    scale: str | None      # C expression of c when the score is c * (Q K^T) + b, else None
    setup: str             # C lines setting `scale_` (and `c_`, `inv_c_`)
    element: str           # x, the value of one entry the softmax runs on: weight = exp2(x scale_ - max scale_)
    comment: str


def softmax_parts(core: AttentionCore, prefix: str, names: CNames, lead_args: str, dim_args: str,
                  lead: list[str]) -> SoftmaxParts:
    """x = s + b / c with scale_ = c log2 e when the score is c * (Q K^T) + b, else x = score * log2 e
    with scale_ = 1."""
    linear = linear_score(core.score, core.product)
    if linear is None:
        return SoftmaxParts(None, "    const float scale_ = 1.0f;  // x below is the score in base 2",
                            f"{prefix}_score(s_, {lead_args}i_, j_{dim_args}) * LOG2E",
                            "The spec's score at each element's (i, j), in base 2")
    printer = score_printer(core, names)
    scale = "1.0f" if linear.scale is None else printer.entry(linear.scale, ())
    setup = [f"    const float c_ = {scale};  // the score is c_ * (Q K^T) + b, c_ > 0 (the host checks)",
             "    const float scale_ = c_ * LOG2E;"]
    element = "s_"
    if linear.bias is not None:
        setup.append("    const float inv_c_ = 1.0f / c_;")
        element = f"fmaf({printer.entry(linear.bias, (*lead, 'i_', 'j_'))}, inv_c_, s_)"
    return SoftmaxParts(scale, "\n".join(setup), element, "x = s + b / c at each element's (i, j) (score = c x)")


def _masked(node: t.Node, product: t.Node, printer: CPrinter, coords: tuple) -> str | None:
    """A C condition under which `node` is -inf for every finite value of the rest (s = the entry of
    `product` included), or None. Only the -inf of a mask is read: x + -inf is -inf for finite x."""
    if product not in t.walk(node):
        return f"(({printer.entry(node, coords)}) == -INFINITY)"
    if isinstance(node, t.Where) and product not in t.walk(node.cond):
        a, b = (_masked(x, product, printer, coords) for x in (node.a, node.b))
        if a is None and b is None:
            return None
        return f"({printer.entry(node.cond, coords)} ? {a or 'false'} : {b or 'false'})"
    if isinstance(node, t.Binary) and node.op == "add":  # -inf + a finite value; both parts may mask
        parts = [m for m in (_masked(x, product, printer, coords) for x in (node.a, node.b)) if m]
        return " || ".join(parts) or None
    if isinstance(node, t.Binary) and node.op == "sub":
        return _masked(node.a, product, printer, coords)
    return None


def masked_condition(core: AttentionCore, prefix: str, names: CNames, dims: Sequence[str],
                     lead: list[str]) -> str | None:
    """The device function `<prefix>_masked(head coords, i, j, dims)`, or None when the score has no mask."""
    coords = (*lead, "i_", "j_")
    condition = _masked(core.score, core.product, score_printer(core, names), coords)
    if condition is None:
        return None
    params = ", ".join([*[f"int {z}" for z in lead], "int i_", "int j_", *[f"int {d}" for d in dims]])
    return "\n".join([
        f"// True where the score of {core.output} is -inf whatever Q @ K.T is: a tile of such entries is skipped.",
        f"static __device__ __forceinline__ bool {prefix}_masked({params}) {{",
        f"    return {condition};",
        "}"])
