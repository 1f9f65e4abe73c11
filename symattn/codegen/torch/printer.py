"""The PyTorch printer: the array printer in torch's spelling, with the fused cores as the torch tiled pass.

Contract: `TorchPrinter(program)` prints the same program IR as the NumPy
printer, with the same decisions (which statements run in place, which
buffers are freed, how batch axes line up), in torch's spelling
(`symattn.codegen.arrays.syntax.TORCH`: every function's own torch template,
`dim=`/`keepdim=`, new tensors made with `device=device`, positions kept as
integers until they meet a value); its fused cores call the tiled pass of
`symattn.codegen.torch.runtime` (the closures see a run of batch entries, `e`).
It adds the softmax forms of the torch module's recompute plan
(`softmax_with_lse`, `softmax_from_lse`). `RESERVED` lists the names a
generated torch module uses for itself.
"""

from __future__ import annotations

from ...ir.printer import ATOM
from ..arrays.syntax import TORCH
from ..arrays.tiled import TiledPrinter
from ..program_ir import Program, Stmt
from .runtime import RUNTIME

__all__ = ["TorchPrinter", "RESERVED"]

RESERVED = TORCH.reserved | set(RUNTIME.HELPERS)


class TorchPrinter(TiledPrinter):
    """Print one `Program` as torch code (see the module docstring)."""

    rules = "torch printing"
    settings = "BLOCK_Q, BLOCK_K"  # (torch runs each block on its own threads)
    entry = "e"

    def __init__(self, program: Program) -> None:
        super().__init__(program, TORCH)

    def softmax_with_lse(self, k: int, stmt: Stmt, lse: str) -> list[str]:
        """`P, lse = _softmax_lse_(S, axis)`: the weights in S's buffer (S is not read again) and the row
        log-sum-exp that the backward pass recomputes them from."""
        self.k = k
        self.consumed = None
        node = stmt.node
        axis = node.axis - len(node.x.shape)
        x = self.doprint(node.x)
        self.helpers.add("_softmax_lse_")
        self.owned[stmt.var] = True
        self.owned[lse] = True
        if self._dead(node.x):
            self._union(stmt.var, node.x.name)
            return [f"{stmt.var}, {lse} = _softmax_lse_({x.text}, axis={axis})"]
        return [f"{stmt.var}, {lse} = _softmax_lse_({self.parenthesize(x, ATOM)}.clone(), axis={axis})"]

    def softmax_from_lse(self, stmt: Stmt, lse: str) -> list[str]:
        """`P = exp(S - lse)` in S's buffer: the weights again, from the saved row log-sum-exp."""
        self.helpers.add("_softmax_from_lse_")
        scores = stmt.node.x.name
        self.owned[stmt.var] = True
        self._union(stmt.var, scores)
        return [f"{stmt.var} = _softmax_from_lse_({scores}, {lse})"]
