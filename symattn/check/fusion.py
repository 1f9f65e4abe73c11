"""Which targets fuse each attention core: the line every `symattn verify` prints first, the same on all of them.

Contract: `fusion_lines(spec)` is one line per core of the attention plan
(`symattn.codegen.plan`), saying that the NumPy (tiled pass), torch, Triton and
CUDA targets all compute it fused (they render the one plan), and whether the
CUDA target's tensor-core kernels cover it (and why not); then the plan's own
note for each softmax it does not fuse; or that the spec has no core.
"""

from __future__ import annotations

from ..codegen.cuda.tensor_core import unsupported
from ..codegen.plan import attention_plan
from ..ir import typed as t

__all__ = ["fusion_lines", "TARGETS"]

TARGETS = ("numpy", "torch", "triton", "cuda")


def fusion_lines(spec: t.TypedSpec) -> list[str]:
    plan = attention_plan(spec)
    lines = []
    for core in plan.cores.values():
        reason = unsupported(core)
        tensor_cores = "and its tensor-core kernels" if reason is None else f"(tensor-core kernels: no, {reason})"
        lines.append(f"attention plan: {core.text}: fused on {', '.join(TARGETS)} {tensor_cores}")
        lines += [f"  {note}" for note in core.notes]
    lines += [f"attention plan: {note}" for note in plan.notes]
    if not lines:
        lines.append("attention plan: no softmax(score) @ V to fuse")
    return lines
