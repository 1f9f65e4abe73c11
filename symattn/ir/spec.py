"""The whole spec in the typed IR: its dims, tensors, outputs and checks.

Contract: `TypedSpec` is what `symattn.front.validate` returns (read through
`symattn.ir.typed` as `t.TypedSpec`): `dims` (name -> `DimInfo`, with its
SymPy symbol: positive, or nonnegative for a dim used only as a number, which
may be 0), `sizes` (the concrete size of each), `tensors` (name -> `TensorInfo`,
in declaration order: inputs, params, buffers, with an integer buffer's value
range, and intermediates with their typed definitions), `outputs` and `checks`
(`CheckInfo`), with the views every stage reads (`given`, `differentiable`,
`concrete_shape`, `integer_range`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import sympy

from .position import Pos

Shape = tuple  # of SymPy dim expressions
Node = Any     # a `symattn.ir.typed.Node` (this module comes before the nodes it holds)

__all__ = ["DimInfo", "Dropout", "TensorInfo", "CheckInfo", "TypedSpec"]


@dataclass(frozen=True)
class DimInfo:
    name: str
    symbol: sympy.Symbol
    default: int
    pos: Pos


@dataclass(frozen=True)
class Dropout:
    """What makes a buffer the 0/1 mask Z of `D = dropout(x, p)` (D = x * Z / (1 - p)): the tensor D it
    belongs to, p (an exact rational in [0, 1)) and its stream (0, 1, 2, ... in spec order); x is
    `typed.dropped(spec, mask)`.

    To every stage that reasons about values the mask is an integer buffer in 0:2 of x's shape (claims
    hold for every Z); generated code never takes it as an argument but draws it from a `seed`:
    entry n (flat, row-major, in the full shape of x at run time) is 1 iff Philox-4x32-10 keeps it
    (`symattn.ir.philox`: `keep_at(seed, stream, n, threshold)`), in the forward pass and again in the
    backward."""

    of: str
    p: sympy.Rational
    stream: int

    @property
    def p_text(self) -> str:
        """p as the exact decimal literal it was written as (its denominator divides a power of 10): 0.1."""
        import decimal

        with decimal.localcontext() as ctx:
            ctx.prec = 60
            text = format(decimal.Decimal(int(self.p.p)) / decimal.Decimal(int(self.p.q)), "f")
        return (text.rstrip("0").rstrip(".") if "." in text else text) or "0"

    @property
    def threshold(self) -> int:
        """The uint32 word 0 is compared with (`symattn.ir.philox.dropout_threshold`)."""
        from .philox import dropout_threshold
        from fractions import Fraction

        return dropout_threshold(Fraction(int(self.p.p), int(self.p.q)))


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of the spec. `kind` is input, param, buffer or intermediate.

    Inputs, params and buffers are *given* (arguments of the forward pass); a
    buffer (a mask, a position table, a KV cache) is never differentiated:
    it has no gradient, and the backward pass takes it as a constant.
    """

    name: str
    kind: str
    shape: Shape
    pos: Pos
    expr: Node | None = None
    is_output: bool = False
    values: tuple[sympy.Expr, sympy.Expr] | None = None  # an integer buffer's entries: low .. high - 1
    dropout: Dropout | None = None  # the buffer is the mask of a `dropout` definition, drawn from the seed

    @property
    def integer(self) -> bool:
        """An integer buffer (`buffer doc[N] in 0:D`): its entries are integers in `values`."""
        return self.values is not None

    @property
    def role(self) -> str:
        return "output" if self.is_output else "dropout mask" if self.dropout is not None else self.kind

    @property
    def has_gradient(self) -> bool:
        """Whether grad(T) is defined: for every tensor but a buffer."""
        return self.kind != "buffer"


@dataclass(frozen=True)
class CheckInfo:
    """A `check`: `kind` is 'equal' (lhs == rhs), 'equivariant' or 'invariant'.

    A symmetry claim permutes the given tensors `sources` together along `dim`
    (one tensor, or a parenthesised group: `equivariant(O, (X, keep))`).
    """

    line: int
    text: str
    negated: bool
    kind: str
    pos: Pos
    lhs: Node | None = None
    rhs: Node | None = None
    output: str | None = None
    sources: tuple[str, ...] = ()
    dim: str | None = None


@dataclass(frozen=True)
class TypedSpec:
    name: str
    filename: str
    source: str
    dims: Mapping[str, DimInfo]
    sizes: Mapping[str, int]
    tensors: Mapping[str, TensorInfo]
    outputs: tuple[str, ...]
    checks: tuple[CheckInfo, ...]
    notes: tuple = ()  # (Pos, message): what is valid but likely not meant (`i / W` of integers: real division)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.tensors.items() if t.kind == "input")

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.tensors.items() if t.kind == "param")

    @property
    def buffers(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.tensors.items() if t.kind == "buffer")

    @property
    def given(self) -> tuple[str, ...]:
        """Inputs, params and buffers, in declaration order: the arguments of the forward pass."""
        return tuple(n for n, t in self.tensors.items() if t.kind in ("input", "param", "buffer"))

    @property
    def arguments(self) -> tuple[str, ...]:
        """The given tensors a generated module takes, in declaration order: every one but dropout's masks,
        which it draws from its `seed` argument (`dropouts`)."""
        return tuple(n for n in self.given if self.tensors[n].dropout is None)

    @property
    def seed_keyword(self) -> str | None:
        """The keyword generated code takes dropout's seed as: `seed`, unless the spec names something so
        (then `dropout_seed`, `dropout_seed_2`, ...); None without dropout."""
        if not self.dropouts:
            return None
        taken = set(self.tensors) | set(self.dims)
        name, k = "seed", 1
        while name in taken:
            k += 1
            name = "dropout_seed" if k == 2 else f"dropout_seed_{k - 1}"
        return name

    @property
    def dropouts(self) -> tuple[str, ...]:
        """The masks of the spec's `dropout` definitions (buffers in 0:2), in stream order."""
        return tuple(n for n, t in self.tensors.items() if t.dropout is not None)

    @property
    def differentiable(self) -> tuple[str, ...]:
        """Inputs and params, in declaration order: the gradients the backward pass returns."""
        return tuple(n for n, t in self.tensors.items() if t.kind in ("input", "param"))

    @property
    def intermediates(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.tensors.items() if t.kind == "intermediate")

    def substitutions(self) -> dict[sympy.Symbol, int]:
        return {info.symbol: self.sizes[name] for name, info in self.dims.items()}

    def size(self, dim: sympy.Expr) -> int:
        """The concrete size of a dim expression at this spec's sizes."""
        value = sympy.sympify(dim).subs(self.substitutions())
        return int(value)

    def concrete_shape(self, shape: Shape) -> tuple[int, ...]:
        return tuple(self.size(d) for d in shape)

    def integer_range(self, name: str) -> tuple[int, int] | None:
        """(low, high) at this spec's sizes for an integer buffer (entries low .. high - 1), else None."""
        info = self.tensors[name]
        return None if info.values is None else (self.size(info.values[0]), self.size(info.values[1]))
