"""Derived gradients as spec text: what `symattn derive --gradients` prints.

Contract: `gradient_texts(spec, gradients)` writes every gradient as spec
syntax that parses back: a gradient in matrix form is one line
`grad(T) = expr`; a part the matrix language cannot write is first named by
a check-only definition (`symattn.front.check_only`), printed on the lines
before it:

- an index-notation part, as `dX_1[l:N, m:d] = sum(j, grad(S)[l, j] * ...)`
  (every index with its range), then `grad(X) = dX_1 + P.T @ grad(O) @ W_v.T`;
  a scalar one gets an index over a single entry, `dc_1[z_1:1] = sum(i, ...)`;
- a scatter (the gradient of a read at computed subscripts), in its gather
  form: `db_1[l:2 * N - 1] = sum(i, sum(j, where(j - i + N - 1 == l, ...)))`;
- the slice of an upstream gradient (concat's backward) as it is, `grad(C)[:, 0:d]`
  (the language slices any expression).

Each name `d<T>_<k>` is fresh: no dim, tensor, builtin, keyword, index name
of any gradient, or name given before. The upstream gradient of an output
is a `#` comment (`grad(O)` is given, not derived), and a gradient that is
zero reads `grad(T) = 0    # L does not depend on T`. So appending the
definitions, and `check grad(T) == expr` for each equation, to the spec is
a spec whose checks claim exactly what was derived (tests/symbolic/test_gradient_text.py
proves every one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..front.parse import KEYWORDS
from ..front.validate import BUILTINS
from ..ir import typed as t
from ..ir.gather import gather_form
from ..ir.printing import to_spec
from ..ir.shapes import format_dim

__all__ = ["GradientText", "gradient_texts"]


@dataclass(frozen=True)
class GradientText:
    """One gradient in spec syntax: the check-only definitions it names, then its equation."""

    definitions: tuple[str, ...]
    equation: str

    @property
    def lines(self) -> tuple[str, ...]:
        return (*self.definitions, self.equation)

    def __str__(self) -> str:
        return "\n".join(self.lines)


class _Names:
    """Fresh names `d<T>_<k>` that collide with nothing in the spec or the gradients."""

    def __init__(self, spec: t.TypedSpec, exprs: Sequence[t.Node]) -> None:
        self.taken = set(spec.dims) | set(spec.tensors) | set(BUILTINS) | set(KEYWORDS)
        self.spec_names = frozenset(self.taken)  # what an index may not be called
        for expr in exprs:
            for n in t.walk(expr):
                if isinstance(n, t.IndexDef):
                    self.taken |= {i.name for i in n.indices}
                elif isinstance(n, (t.IndexSum, t.IndexVar)):
                    self.taken.add(n.index.name if isinstance(n, t.IndexSum) else n.name)
                elif isinstance(n, t.Entry):
                    self.taken |= set(t.entry_names(n))

    def fresh(self, tensor: str) -> str:
        return self.first_free(f"d{tensor}_{{}}")

    def first_free(self, pattern: str) -> str:
        k = 1
        while pattern.format(k) in self.taken:
            k += 1
        self.taken.add(pattern.format(k))
        return pattern.format(k)


class _Writer:
    """Names the parts of one gradient that need a definition, and prints those definitions."""

    def __init__(self, tensor: str, names: _Names, dims: list[str]) -> None:
        self.tensor, self.names, self.dims = tensor, names, dims
        self.definitions: list[str] = []

    def define(self, node: t.Node) -> t.Tensor:
        name = self.names.fresh(self.tensor)
        if isinstance(node, t.IndexDef):
            head = ", ".join(f"{i.name}:{format_dim(i.range, self.dims)}" for i in node.indices)
            if not node.indices:  # a scalar: one index over a single entry, read nowhere ([1] is () up to a leading 1)
                head = f"{self.names.first_free('z_{}')}:1"
            self.definitions.append(f"{name}[{head}] = {to_spec(node.body, self.dims)}")
        else:
            self.definitions.append(f"{name} = {to_spec(node, self.dims)}")
        return t.Tensor(name, node.shape)

    def matrix(self, node: t.Node) -> t.Node:
        """`node` with every index-notation part and every sliced expression named."""
        if isinstance(node, t.IndexDef):
            return self.define(node)
        if isinstance(node, t.Scatter):  # entry by entry: what reaches each entry
            return self.define(gather_form(node, avoid=self.names.spec_names))
        return t.map_children(node, self.matrix)


def gradient_texts(spec: t.TypedSpec, gradients: Mapping[str, t.Node | None]) -> dict[str, GradientText]:
    """Every gradient of `gradients` (tensor -> derived expression, None for zero) as spec text."""
    dims = list(spec.dims)
    names = _Names(spec, [e for e in gradients.values() if e is not None])
    out: dict[str, GradientText] = {}
    for tensor, expr in gradients.items():
        if expr is None:
            out[tensor] = GradientText((), f"grad({tensor}) = 0    # L does not depend on {tensor}")
        elif isinstance(expr, t.Grad) and expr.name == tensor and tensor in spec.outputs:
            out[tensor] = GradientText((), f"# grad({tensor}): the upstream gradient of output {tensor}")
        else:
            writer = _Writer(tensor, names, dims)
            rhs = writer.matrix(expr)
            out[tensor] = GradientText(tuple(writer.definitions), f"grad({tensor}) = {to_spec(rhs, dims)}")
    return out
