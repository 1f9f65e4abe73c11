"""The Triton target: fused attention kernels (forward, dK/dV, dQ) for a spec's attention cores.

`emit_triton(spec)` returns a `TritonCode` whose `text` is a standalone Python module (torch + triton):
see `emit` for its calling convention, `kernels` for the kernels, `printer` for the score's syntax.
"""

from .emit import TritonCode, core_names, emit_triton
from .printer import TritonCodegenError

__all__ = ["TritonCode", "TritonCodegenError", "core_names", "emit_triton"]
