"""Generate a standalone PyTorch module from a spec: `symattn emit torch SPEC -o FILE.py`.

Contract: `torch_source(spec)` returns the text of the torch module of
`symattn.codegen.arrays.torch_module` for the attention plan of `spec`
(`symattn.codegen.plan`): every core the plan fuses is computed tiled by the
torch runtime (`symattn.codegen.torch.flash`: blocks of BLOCK_Q queries x
BLOCK_K keys, module constants, online softmax, the weights recomputed in
the backward pass), every other statement by the program's torch code.
`load_torch_module(source)` loads such text as a module.
"""

from __future__ import annotations

from ...errors import CodegenError
from ...ir import typed as t
from ...symbolic.derive import derive
from ..arrays.torch_module import load_torch_module, module_source

__all__ = ["torch_source", "load_torch_module", "BLOCK_Q", "BLOCK_K"]


# The blocks are the unit of skipping (a mask's visible keys); the runtime merges up to 16 adjacent ones along
# the inner loop (keys in the forward pass, queries in the backward) into one product, all batch entries and
# heads together.
BLOCK_Q = 256
BLOCK_K = 128


def torch_source(spec: t.TypedSpec, derivation=None, fused: bool = True) -> str:
    """The text of the generated PyTorch module for `spec` (see the module docstring); `fused=False` computes
    every core as written, [N, N] weights and all (a baseline for benchmarks)."""
    from ..plan import AttentionPlan, attention_plan
    from .printer import RESERVED, TorchPrinter
    from .runtime import RUNTIME

    plan = attention_plan(spec, derivation)
    if not fused and plan.cores:  # the spec as written (the plan's spec has its cores' operands named)
        plan = AttentionPlan(spec, derivation or derive(spec), {}, ())
    program = plan.program(RESERVED)
    constants = [f"BLOCK_Q = {BLOCK_Q}  # query rows per block of the tiled attention",
                 f"BLOCK_K = {BLOCK_K}  # keys per block"]
    try:
        return module_source(plan.spec, program, TorchPrinter(program), RUNTIME, constants)
    except CodegenError as why:
        if not plan.cores:
            raise
        raise CodegenError(f"the torch target cannot print the fused core the attention plan chose: {why}") from why
