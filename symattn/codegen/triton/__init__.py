"""The Triton target: the attention plan's cores as fused Triton kernels (forward, dK/dV, dQ), the rest in torch.

Contract: `emit_triton(spec)` returns a `TritonCode` whose `text` is a standalone Python module (torch + triton):
see `emit` for the cores' calling convention and the full module (forward, backward with the NumPy module's
calling convention; `triton_module(spec)` loads it for `spec.torch(backend="triton")`), `kernels` for the
kernels, `printer` for the score's syntax. It renders the attention plan (`symattn.codegen.plan`) and decides
nothing about fusion itself.
"""

from .emit import TritonCode, core_names, emit_triton, load_source, triton_module

__all__ = ["TritonCode", "core_names", "emit_triton", "load_source", "triton_module"]
