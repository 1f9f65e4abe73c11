"""The Triton target: fused attention kernels (forward, dK/dV, dQ) for a spec's attention cores.

`emit_triton(spec)` returns a `TritonCode` whose `text` is a standalone Python module (torch + triton):
see `emit` for the cores' calling convention, `module` for the full module (forward, backward with
the NumPy module's calling convention; `triton_module(spec)` loads it for `spec.torch(backend="triton")`), `kernels` for the kernels, `printer` for the score's syntax.
"""

from .emit import TritonCode, core_names, emit_triton, triton_module
from .module import load_source
from .printer import TritonCodegenError

__all__ = ["TritonCode", "TritonCodegenError", "core_names", "emit_triton", "load_source", "triton_module"]
