"""What the tensor-core kernels read off a core's score: its mask, and its linear form.

Contract: `masked_condition(core, prefix, names, dims, lead)` returns the device
function `<prefix>_masked(head coords, i, j, dims)`, true where the core's
`keep` (the attention plan's mask) does not hold, so that the score is -inf
whatever Q @ K.T is (a tile of such entries is skipped), or None.

`softmax_parts` reads `plan.linear(core.value)`: when the score where it is
kept is c * s + b with c a positive constant of literals and dims and b free
of s (a bias, or nothing), then

    softmax(score) = softmax(c * x)  with  x = s + b / c  (-inf where not kept),

and with c > 0 the row max of x picks the row max of the score, so the weight of
an entry is exp2(x * (c log2 e) - max x * (c log2 e)): one FFMA and one ex2, as
FlashAttention-2 does it. NaN stays NaN. The host still checks at run time that
c is positive and that c log2 e and 1 / c are finite (a dim of 0 would break
that) and otherwise refuses, leaving the fp32 path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..plan import AttentionCore, linear
from .score import score_printer
from .names import CNames

__all__ = ["SoftmaxParts", "masked_condition", "scale_check", "softmax_parts"]


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
    """x = s + b / c with scale_ = c log2 e when the kept score is c * (Q K^T) + b (-inf where not kept), else
    x = score * log2 e with scale_ = 1."""
    found = linear(core.value)
    if found is None:
        return SoftmaxParts(None, "    const float scale_ = 1.0f;  // x below is the score in base 2",
                            f"{prefix}_score(s_, {lead_args}i_, j_{dim_args}) * LOG2E",
                            "The spec's score at each element's (i, j), in base 2")
    printer = score_printer(core, names)
    scale = "1.0f" if found.scale is None else printer.entry(found.scale, ())
    setup = [f"    const float c_ = {scale};  // the score is c_ * (Q K^T) + b, c_ > 0 (the host checks)",
             "    const float scale_ = c_ * LOG2E;"]
    element = "s_"
    if found.bias is not None:
        setup.append("    const float inv_c_ = 1.0f / c_;")
        element = f"fmaf({printer.entry(found.bias, ())}, inv_c_, s_)"
    if core.keep is not None:
        element = f"(({printer.entry(core.keep, ())}) ? {element} : -INFINITY)"
    return SoftmaxParts(scale, "\n".join(setup), element, "x = s + b / c at each element's (i, j) (score = c x)")


def masked_condition(core: AttentionCore, prefix: str, names: CNames, dims: Sequence[str],
                     lead: list[str]) -> str | None:
    """The device function `<prefix>_masked(head coords, i, j, dims)`, or None when the score has no mask."""
    if core.keep is None:
        return None
    condition = f"!({score_printer(core, names).entry(core.keep, ())})"
    params = ", ".join([*[f"int {z}" for z in lead], "int i_", "int j_", *[f"int {d}" for d in dims]])
    return "\n".join([
        f"// True where the score of {core.output} is -inf whatever Q @ K.T is (the plan's mask does not hold): a "
        "tile of such entries is skipped.",
        f"static __device__ __forceinline__ bool {prefix}_masked({params}) {{",
        f"    return {condition};",
        "}"])
