"""Index factors: the indexed factors of the terms of an index form.

Contract: a `Factor` carries its index tokens, its `risk` (FINITE / MINUS_INF /
ANY from `symattn.symbolic.finiteness`) and its `key`, the canonical text of
what it is (`X`, `grad(X)`, `$exp(...)`); `renamed` replaces one token. The
kinds: tensor and gradient entries, opaque function applications, Kronecker
deltas, index values, the number inf, fixed tensors, and the index maps
(`Mix`, `Embed`, `Equation`) that select entries without arithmetic.
`symattn.prove.index_terms` puts terms of these factors in canonical form.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import sympy

from ..symbolic.finiteness import ANY, FINITE

__all__ = ["Unsupported", "TooBig", "ONE", "ZERO_INDEX", "MAX_TERMS", "MAX_LABELLINGS",
           "Factor", "Reference", "Application", "SoftmaxApplication", "Delta", "Eye", "IndexValue",
           "Infinity", "Constant", "Mix", "Embed", "Equation"]

MAX_TERMS = 20000      # a larger expansion is given up (not proved)
MAX_LABELLINGS = 2000  # relabellings tried per term before settling for one

ONE = sympy.Integer(1)
ZERO_INDEX = "_"       # the only index of a size-1 axis: always 0


class Unsupported(Exception):
    """The expansion cannot be used soundly; the comparison is not proved."""


class TooBig(Unsupported):
    """The expansion grew past MAX_TERMS."""


# --- factors ----------------------------------------------------------------------
#
# Canonical texts (and so proofs and documents) are built from `key` and the
# indices alone: `key[i,j]`, sorted as strings.


class Factor:
    """One indexed factor of a term: `indices` (tokens), `risk` (FINITE / MINUS_INF / ANY)
    and `key`, the canonical text of what it is. Subclasses are frozen, slotted dataclasses."""

    __slots__ = ()
    indices: tuple[str, ...]
    risk: int
    key: str

    def renamed(self, old: str, new: str) -> "Factor":
        """The factor with index token `old` replaced by `new`."""
        if old not in self.indices:
            return self
        return dataclasses.replace(self, indices=tuple(new if x == old else x for x in self.indices))


@dataclass(frozen=True, slots=True)
class Reference(Factor):
    """An entry of a tensor (`X[i,j]`) or of its gradient (`grad(X)[i,j]`) left as a symbol."""

    name: str
    grad: bool
    indices: tuple[str, ...]
    risk: int

    @property
    def key(self) -> str:
        return f"grad({self.name})" if self.grad else self.name


@dataclass(frozen=True, slots=True)
class Application(Factor):
    """An opaque function `op(arguments)`, the arguments keyed by their canonical forms with the
    factor's own indices named by position (`$exp(...)`, `$recip(...)`, `$where<(...)`).

    What rules inside opaque functions read (none of it is part of the factor's identity):
    `parts`, each argument's index form (a tuple of terms; a typed node where the argument is
    keyed by its expression) in the tokens `origin` (the factor's indices when it was made,
    position by position; `renamed` leaves them, so `indices[k]` is what `origin[k]` became)
    and the reduced tokens `local`."""

    op: str
    arguments: str
    indices: tuple[str, ...]
    risk: int
    parts: tuple = field(default=(), compare=False)
    origin: tuple[str, ...] = field(default=(), compare=False)
    local: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"{self.op}({self.arguments})"


@dataclass(frozen=True, slots=True)
class SoftmaxApplication(Factor):
    """`softmax(x, axis)`, with what the row-sum rule needs: the axis, its size, and whether the
    argument's rows hold a finite entry (a fully masked row has softmax 0, not a row summing to 1);
    `parts`, `origin` and `local` as for `Application` (x's form, its reduced token `local`)."""

    axis: int
    size: sympy.Expr
    finite_argument: bool
    arguments: str
    indices: tuple[str, ...]
    risk: int
    parts: tuple = field(default=(), compare=False)
    origin: tuple[str, ...] = field(default=(), compare=False)
    local: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"$softmax[{self.axis}]({self.arguments})"


@dataclass(frozen=True, slots=True)
class Delta(Factor):
    """`[x == y]` from an index map: it selects entries, no arithmetic."""

    indices: tuple[str, str]
    key: ClassVar[str] = "$delta"
    risk: ClassVar[int] = FINITE


@dataclass(frozen=True, slots=True)
class Eye(Factor):
    """`eye(N)[x, y]`: selects by multiplying with 0 and 1 (only a finite term exactly)."""

    indices: tuple[str, str]
    key: ClassVar[str] = "$eye"
    risk: ClassVar[int] = FINITE


@dataclass(frozen=True, slots=True)
class IndexValue(Factor):
    """The value of an index variable of index notation (`i` in `A[i, j] = i * ...`)."""

    indices: tuple[str]
    key: ClassVar[str] = "$index"
    risk: ClassVar[int] = FINITE


@dataclass(frozen=True, slots=True)
class Infinity(Factor):
    """The number inf (with a coefficient of -1: -inf); no indices."""

    indices: tuple[()] = ()
    key: ClassVar[str] = "$inf"
    risk: ClassVar[int] = ANY


@dataclass(frozen=True, slots=True)
class Constant(Factor):
    """A fixed tensor other than `ones` and `eye`: `sinusoidal(N, d)`, `causal_mask(N)`."""

    kind: str
    args: tuple
    indices: tuple[str, ...]
    risk: int

    @property
    def key(self) -> str:
        return f"${self.kind}({','.join(str(a) for a in self.args)})"


@dataclass(frozen=True, slots=True)
class Mix(Factor):
    """`[m == a * block + b]` over indices `(m, a, b)`: merge_heads and split_heads."""

    block: sympy.Expr
    indices: tuple[str, str, str]
    risk: ClassVar[int] = FINITE

    @property
    def key(self) -> str:
        return f"$mix({self.block})"


@dataclass(frozen=True, slots=True)
class Embed(Factor):
    """`[m == c + offset]` over indices `(m, c)`: concat and slices."""

    offset: sympy.Expr
    indices: tuple[str, str]
    risk: ClassVar[int] = FINITE

    @property
    def key(self) -> str:
        return f"$embed({self.offset})"


@dataclass(frozen=True, slots=True)
class Equation(Factor):
    """`[sum(coefficients[k] * indices[k]) + offset == 0]`: the entry a computed subscript reads
    (`b[j - i + N - 1]`) or a scatter adds to. It selects entries, no arithmetic (a scatter adds
    each value where its subscript points, a gather reads it), so it applies to infinite and NaN
    entries alike. A token may repeat; ZERO_INDEX stands for 0. Its canonical text depends on the
    names of its tokens (`symattn.prove.index_equations.equation_text`), not on their order."""

    coefficients: tuple[int, ...]
    offset: sympy.Expr
    indices: tuple[str, ...]
    key: ClassVar[str] = "$eq"
    risk: ClassVar[int] = FINITE
