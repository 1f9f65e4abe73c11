"""The NumPy target's runtime: the NumPy host's helpers and the tiled pass of its fused cores.

Contract: `RUNTIME` is the `Runtime` of generated NumPy modules
(`symattn.codegen.arrays.numpy_runtime` with `symattn.codegen.numpy.flash`);
`RUNTIME.helper_source(name)` is the source text of one helper (the tiled
pass's helpers import the standard library inside, and threadpoolctl where
it is installed).
"""

from __future__ import annotations

from ..arrays.numpy_runtime import runtime
from . import flash

__all__ = ["RUNTIME", "HELPERS"]

RUNTIME = runtime({name: getattr(flash, name) for name in flash.TILED}, flash.TILED, flash.CALLS)
HELPERS = RUNTIME.HELPERS
