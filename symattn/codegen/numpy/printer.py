"""The NumPy printer: the array printer in NumPy's spelling, with the fused cores as the NumPy tiled pass.

Contract: `NumPyPrinter(program)` prints a `Program` as NumPy statements
(`symattn.codegen.arrays.printer`, spelling `NUMPY`); its fused cores call
the tiled pass of `symattn.codegen.numpy.flash` with the module constants
`BLOCK_Q, BLOCK_K, THREADS`. `RESERVED` lists the names a generated NumPy
module uses for itself.
"""

from __future__ import annotations

from ..arrays.syntax import NUMPY
from ..arrays.tiled import TiledPrinter
from .runtime import RUNTIME

__all__ = ["NumPyPrinter", "RESERVED"]

RESERVED = NUMPY.reserved | set(RUNTIME.HELPERS)


class NumPyPrinter(TiledPrinter):
    rules = "NumPy printing"
    settings = "BLOCK_Q, BLOCK_K, THREADS"

    def __init__(self, program) -> None:
        super().__init__(program, NUMPY)
