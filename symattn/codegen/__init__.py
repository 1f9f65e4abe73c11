"""Code generation from a spec: a straight-line program, printed for a target.

Contract: `numpy_source(spec)` is the text of a standalone NumPy module with
`forward`, `backward` and `forward_backward` (DESIGN.md, "Generated NumPy
module"); `load_module(source)` runs such text as a module object. The
target-independent half (`program.build_program`: shared subexpressions,
rewrites, liveness; `index`: index notation as whole-array operations) is
what a CUDA printer would reuse.
"""

from .numpy import load_module, numpy_source
from .program import CodegenError, build_program

__all__ = ["numpy_source", "load_module", "build_program", "CodegenError"]
