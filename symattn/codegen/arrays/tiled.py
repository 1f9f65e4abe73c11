"""The fused cores of a Python module computed tiled by its runtime: the statements both NumPy and torch print.

Contract: `TiledPrinter` is an `ArrayPrinter` whose fused statements call the
tiled pass of the module's runtime (`_flash_forward`, `_flash_backward`,
`_flash_forward_backward`, with the same arguments in the NumPy and the torch
runtime): each core's closures (`symattn.codegen.arrays.block`) once per
function, gathered into a `_Score`, then

    O, O_lse = _flash_forward(q, k, v, reads, O_core, <settings>)
    dQ, dK, dV, *dT = _flash_backward(q, k, v, O, O_lse, dO, dlse, reads, O_core, <settings>)
    O, O_lse, dQ, dK, dV, *dT = _flash_forward_backward(q, k, v, dO, dlse, reads, O_core, <settings>)

where `reads` are (array, rank) of each tensor the score reads and `dT` the
gradients of the learned ones (each of its array's shape). Q, K and V with
fewer head axes than the output (MQA written `K[N, d]`) get axes of size 1
inserted, which their gradients lose again. A target sets `settings` (the
module constants the helpers take last) and `entry` (torch: the closures see
a run of batch entries).
"""

from __future__ import annotations

from ..program_ir import FusedAttention, FusedPart
from .block import core_functions
from .printer import ArrayPrinter
from .syntax import Code

__all__ = ["TiledPrinter"]


class TiledPrinter(ArrayPrinter):
    settings = "BLOCK_Q, BLOCK_K"
    entry: str | None = None

    def __init__(self, program, spell) -> None:
        super().__init__(program, spell)
        self.closures: dict[str, list[str]] = {}     # fused core -> the lines that define its closures
        self.defined: set[str] = set()               # cores whose closures the function printed so far defines
        self.one_pass: frozenset[str] = frozenset()  # cores whose backward follows their forward (`one_pass`)
        self.squeeze: dict[str, tuple[int, ...]] = {}  # fused gradient variable -> head axes inserted, per part

    def _operand(self, node, rank: int, core) -> str:
        """q, k or v with the head axes it lacks inserted (size 1)."""
        code = self.doprint(node)
        missing = len(core.lead) - (rank - 2)
        return code.text if missing <= 0 else self.new_axes(code, missing, 2).text

    def fused_statement(self, var: str, node) -> list[str]:
        core = self.p.cores[node.core]
        lse = self.lse_name(node.core)
        if node.core not in self.closures:
            name = var if var.isidentifier() else "core"
            made = core_functions(core, self, name, self.spec.dims, self.entry)
            self.helpers.add("_Score")
            adds = "".join(f"({a}, {core.read_tensors.index(n)}), " for a, n in zip(made.adds, core.learned))
            self.closures[node.core] = made.lines + [
                f"{name}_core = _Score({made.score}, {made.score_grad}, {made.keys}, {made.inside}, "
                f"{made.score_inside}, {made.scale}, {len(core.lead)}, {made.weights}, ({adds})"
                + (f", live={made.live})" if made.live != "None" else ")")]
            self.fused[f"core:{node.core}"] = (f"{name}_core",)
        score = self.fused[f"core:{node.core}"][0]
        lines = [] if node.core in self.defined else list(self.closures[node.core])
        self.defined.add(node.core)
        spec = self.spec.tensors
        ranks = [len(spec[n].shape) for n in (core.q, core.k, core.v)]
        q, k, v = (self._operand(x, r, core) for x, r in zip((node.q, node.k, node.v), ranks))
        reads = "".join(f"({self.doprint(x).text}, {len(spec[n].shape)}), "
                        for x, n in zip(node.operands, core.read_tensors))
        reads = f"({reads})"
        if isinstance(node, FusedAttention):
            if node.core in self.one_pass:  # computed with its backward, the next statement
                return lines
            self.helpers.add("_flash_forward")
            return lines + [f"{var}, {lse} = _flash_forward({q}, {k}, {v}, {reads}, {score}, {self.settings})"]
        roles = [getattr(core, r) for r in ("q", "k", "v")] + list(core.learned)
        grads = tuple(self.p.names.numbered(f"d{role}_via_{node.core}") for role in roles)
        self.fused[var] = grads
        self.squeeze[var] = tuple(max(0, len(core.lead) - (r - 2)) for r in ranks) + (0,) * len(core.learned)
        do = self.doprint(node.do).text
        dlse = self.doprint(node.dlse).text if node.dlse is not None else "None"
        if node.core in self.one_pass:
            self.helpers.add("_flash_forward_backward")
            o = self.doprint(node.o).text
            return lines + [f"{o}, {lse}, {', '.join(grads)} = _flash_forward_backward({q}, {k}, {v}, {do}, {dlse}, "
                            f"{reads}, {score}, {self.settings})"]
        self.helpers.add("_flash_backward")
        o = self.doprint(node.o).text
        return lines + [f"{', '.join(grads)}, = _flash_backward({q}, {k}, {v}, {o}, {lse}, {do}, {dlse}, {reads}, "
                        f"{score}, {self.settings})"]

    def _print_FusedPart(self, node: FusedPart) -> Code:
        name = self.fused[node.x.name][node.index]
        missing = self.squeeze.get(node.x.name, ())[node.index:node.index + 1]
        if missing and missing[0]:
            return Code(f"{name}[..., {', '.join(['0'] * missing[0])}, :, :]", self.prec("slice"), fresh=False)
        return Code(name, fresh=False)
