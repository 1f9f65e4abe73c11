"""A fused core's score as CUDA device functions, and how the kernels read the tensors it reads.

Contract: `score_functions(core, prefix, names, dims, order, reads, spec)`
prints `<prefix>_score` (the attention plan's where(keep, value, -inf)),
`<prefix>_score_grad` (d value / d s), `<prefix>_score_d<k>` (d value / d the
k-th learned read) and `<prefix>_weights` (the factor of the weights after
the softmax) as device functions of (s, head coordinates, i, j, dims, and,
when the score reads tensors, the batch entry b_ and their pointers);
`read_params` and `read_args` are those pointers as parameters and as the
arguments of a call; `score_printer` prints an entry expression of the core
(`s_` for the product, `z0_, ..., i_, j_` for the coordinates, a read at its
batch entry); `heads_of` is an operand's own head count and index (1 and 0
on an axis it broadcasts).
"""

from __future__ import annotations

from typing import Sequence

from ...ir import typed as t
from ...errors import CodegenError
from ..plan import AttentionCore, DropoutEntry, ProductEntry, entry_text
from .kernels import Buffer
from .names import CNames
from .syntax import CPrinter, dim_c, numel_c, offset_c

__all__ = ["ScoreSource", "score_printer", "read_params", "read_args", "score_functions", "heads_of"]


class ScoreSource:
    """Reads inside a score: entries of the given tensors the core reads (batched ones at the entry b_)."""

    def __init__(self, core: AttentionCore, reads: list[Buffer], names: CNames, prefix: str = "",
                 dropout=None) -> None:
        self.buffers = dict(zip([n for n in core.read_tensors if n not in core.drawn], reads))
        self.integer = (core.integers - core.drawn).__contains__  # integer buffers: their entries are read as ints
        self.names = names
        self.prefix = prefix
        self.dropout = dropout  # (mask, position) -> the mask's C expression there (the planner's `dropout_read`)

    def draw(self, node: DropoutEntry, position: str) -> str:
        if self.dropout is None:
            raise CodegenError("internal: a dropout mask is drawn where no seed is at hand")
        return self.dropout(node.base.tensor, position)

    def read(self, node, coords):
        if not isinstance(node, t.Tensor) or node.name not in self.buffers:
            return None
        buffer = self.buffers[node.name]
        base = f"b_ * {numel_c(buffer.shape, self.names)} + " if buffer.batched else ""
        return f"{self.prefix}{buffer.name}[{base}{offset_c(coords, buffer.shape, self.names)}]"


def score_printer(core: AttentionCore, names: CNames, reads: list[Buffer] | None = None, dropout=None) -> CPrinter:
    """A printer of the core's entry expressions: `s_` for the product, the coordinates z0_, ..., i_, j_."""
    indices = {"i": "i_", "j": "j_", **{f"z{k}": f"z{k}_" for k in range(len(core.lead))}}
    return CPrinter(names, ScoreSource(core, reads or [], names, dropout=dropout), indices=indices,
                    special={ProductEntry(): "s_"})


def read_params(reads: list[Buffer], grads: bool = False) -> str:
    """`, const float* T, ...`: the parameters of the tensors a score reads (or of their gradients)."""
    if grads:
        return "".join(f", float* __restrict__ {b.name}" for b in reads)
    return "".join(f", const float* __restrict__ {b.name}" for b in reads)


def read_args(reads: list[Buffer], batch: bool = False) -> str:
    """`, b_, T, ...`: what a call of a score device function passes after the dims (nothing without reads,
    unless `batch`: a core that draws dropout needs the batch entry)."""
    return (", b_" if reads or batch else "") + "".join(f", {b.name}" for b in reads)


def score_functions(core: AttentionCore, prefix: str, names: CNames, dims: Sequence[str],
                    dim_order: Sequence[str], reads: list[Buffer], spec, dropout=None) -> tuple[str, list[str]]:
    """The device functions `<prefix>_score`, `_score_grad`, `_score_d<k>` (each learned read) and `_weights`, and
    the head coordinate names."""
    lead = [f"z{k}_" for k in range(len(core.lead))]
    params = ", ".join(["float s_", *[f"int {z}" for z in lead], "int i_", "int j_", *[f"int {d}" for d in dims],
                        *(["long long b_"] if reads or core.drawn else [])]) + read_params(reads)
    head = f"static __device__ __forceinline__ float {prefix}"
    keep = None if core.keep is None else score_printer(core, names, reads, dropout).entry(core.keep)
    value = score_printer(core, names, reads, dropout).entry(core.value)
    score = value if keep is None else f"({keep}) ? {value} : -INFINITY"
    lines = [f"// The score of {core.text}: {entry_text(core.score, dim_order, core)}, s = the product's entry.",
             f"{head}_score({params}) {{", f"    return {score};", "}",
             "// d score / d s, for the backward.",
             f"{head}_score_grad({params}) {{", f"    return {score_printer(core, names, reads, dropout).entry(core.d_product)};",
             "}"]
    for k, read in enumerate(r for r in core.reads if r.derivative is not None):
        lines += [f"// d score / d {entry_text(read.node, dim_order)}: its gradient takes dS times this.",
                  f"{head}_score_d{k}({params}) {{",
                  f"    return {score_printer(core, names, reads, dropout).entry(read.derivative)};", "}"]
    if core.masked_at_run_time:
        keep = score_printer(core, names, reads, dropout).entry(core.keep)
        lines += [f"// Whether the mask keeps the entry ({entry_text(core.keep, dim_order)}), tested per tile: a tile it "
                  "hides whole is skipped.",
                  f"static __device__ __forceinline__ int {prefix}_keep({params}) {{", f"    return ({keep}) ? 1 : 0;",
                  "}"]
    if core.weights is not None:
        lines += [f"// The factor of the weights after the softmax: {entry_text(core.weights, dim_order)}.",
                  f"{head}_weights({params}) {{",
                  f"    return {score_printer(core, names, reads, dropout).entry(core.weights)};", "}"]
    return "\n".join(lines), lead


def heads_of(core: AttentionCore, shape, names: CNames) -> tuple[str, str]:
    """(heads, head index) of an operand of the core: its own head axes (size 1 where broadcast), as C."""
    own = tuple(shape[:-2])
    if own == tuple(core.lead):
        return "heads_", "head_"
    pad = len(core.lead) - len(own)
    index, count = "0", "1"
    for k, dim in enumerate(core.lead):
        mine = own[k - pad] if k >= pad else 1
        if mine == 1:
            continue
        size = dim_c(mine, names)
        index = f"{index} * {size} + z{k}_" if index != "0" else f"z{k}_"
        count = size if count == "1" else f"{count} * {size}"
    return count, index


