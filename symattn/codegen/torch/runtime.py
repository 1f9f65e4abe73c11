"""The torch target's runtime: the torch host's helpers and the tiled pass of its fused cores.

Contract: `RUNTIME` is the `Runtime` of generated torch modules
(`symattn.codegen.arrays.torch_runtime` with `symattn.codegen.torch.flash`);
`RUNTIME.helper_source(name)` is the source text of one helper. It imports
without torch installed (the printer reads the helpers' source text).
"""

from __future__ import annotations

from ..arrays.torch_runtime import runtime
from . import flash

__all__ = ["RUNTIME", "HELPERS"]

RUNTIME = runtime({name: getattr(flash, name) for name in flash.TILED}, flash.TILED, flash.CALLS)
HELPERS = RUNTIME.HELPERS
