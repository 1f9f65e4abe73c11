"""Triton syntax for an attention core's score: one tile of the score as a `triton.language` expression.

Contract: `TritonPrinter(core, names).entry(node, coords)` returns the Triton
expression for `node` evaluated on a tile, where `coords` are the kernel's
coordinate variables, one per axis of `node.shape`: the head coordinates
(`z0_`, ... scalars), the query row `i_` (a [BLOCK_M, 1] tensor) and the key
column `j_` (a [1, BLOCK_N] tensor); `"0"` stands for an axis of size 1 that a
broadcast operand reads at 0. Elementwise operations, `where`, comparisons,
transposes and the index constants become tile arithmetic (`tl.where`,
`tl.exp`, ...); the product `Q @ K.T` is the tile `s_` the kernel holds; a
tensor of constants is recomputed from its definition; a given tensor the
score reads (`core.reads`: ALiBi slopes, a learned bias, a key-padding
buffer) is a masked `tl.load` through its pointer `T_<name>`, its batch stride
`T_<name>_bs` and its strides `T_<name>_s<axis>`, and each read is recorded in
`loads` (name -> coordinates) for the backward's gradient scatter. Dims are the
kernel arguments `D_<dim>`. The operations form tables (`UNARY`, `BINARY`,
`COMPARISON`, `CONSTANT`); a node type without a rule is a `TritonCodegenError`
that names it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import sympy

from ...errors import SymAttnError
from ...ir import typed as t
from ...ir.functions import table
from ...ir.printer import ADD, ATOM, COMPARE, NEG, PRECEDENCE, Printed, Printer
from ..cuda.core import AttentionCore
from ..cuda.syntax import align

__all__ = ["TritonCodegenError", "TritonPrinter", "UNARY", "BINARY", "COMPARISON", "CONSTANT", "dim_py",
           "float_py", "operand_args"]


class TritonCodegenError(SymAttnError):
    """A spec (or part of one) that the Triton generator cannot translate; the message says what."""


# fn -> template over the operand (a float32 tile), live over the function records (`triton`). tanh
# and pow go through helpers of the generated module (`_tanh`, `_pow`): libdevice on a GPU, plain
# arithmetic under the interpreter.
UNARY: Mapping[str, str] = table("triton")
BINARY: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
COMPARISON = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
CONSTANT: dict[str, Callable[[Sequence[str]], str]] = {
    "ones": lambda coords: "1.0",
    "eye": lambda coords: f"tl.where({coords[0]} == {coords[1]}, 1.0, 0.0)",
    "causal_mask": lambda coords: f'tl.where({coords[1]} <= {coords[0]}, 0.0, float("-inf"))',
}


def float_py(value: sympy.Expr) -> str:
    """A float literal in Triton source (`float("-inf")` for the infinities)."""
    if value == sympy.oo:
        return 'float("inf")'
    if value == -sympy.oo:
        return 'float("-inf")'
    return repr(float(value))


def dim_py(dim) -> str:
    """A dim expression as Python int arithmetic over the kernel's `D_<dim>` arguments."""
    dim = sympy.sympify(dim)
    num, den = sympy.fraction(sympy.together(dim))
    rename = {s: sympy.Symbol(f"D_{s.name}", integer=True) for s in dim.free_symbols}
    text = str(num.subs(rename))
    return f"(({text}) // ({den.subs(rename)}))" if den != 1 else f"({text})" if not num.is_Atom else text


def operand_args(core: AttentionCore, spec: t.TypedSpec, grad: bool = False) -> list[str]:
    """The kernel arguments of the tensors the score loads: pointer, batch stride, strides (and gradients)."""
    out = []
    for name in core.reads:
        rank = len(spec.tensors[name].shape)
        prefix = "G" if grad else "T"
        out += [f"{prefix}_{name}", f"{prefix}_{name}_bs", *[f"{prefix}_{name}_s{k}" for k in range(rank)]]
    return out


class TritonPrinter(Printer):
    """Prints the score of one core, and its derivatives, as tile expressions."""

    precedence = {**PRECEDENCE, "pow": ATOM}
    error = TritonCodegenError
    rules = "Triton"

    def __init__(self, core: AttentionCore, spec: t.TypedSpec, indices: dict[str, str] | None = None) -> None:
        self.core = core
        self.spec = spec
        self.pure = dict(core.pure)
        self.indices = dict(indices or {})
        self.special = {core.product: "s_"}
        self.loads: dict[str, tuple[str, ...]] = {}

    def entry(self, node: t.Node, coords: Sequence[str] = ()) -> str:
        return self.doprint(node, tuple(coords)).text

    def tile(self, node: t.Node) -> str:
        """`node` (broadcastable to the score's shape) on the kernel's tile: head coordinates, `i_`, `j_`."""
        lead = tuple(f"z{k}_" for k in range(len(self.core.lead)))
        return self.entry(node, align(node.shape, self.core.score.shape, (*lead, "i_", "j_")))

    def doprint(self, node, *context) -> Printed:
        if node in self.special:
            return Printed(self.special[node], ATOM)
        return super().doprint(node, *context)

    def _child(self, child: t.Node, parent: t.Node, coords) -> Printed:
        return self.doprint(child, align(child.shape, parent.shape, coords))

    # --- integer-valued expressions: index arithmetic stays in int ----------------------------

    def integer(self, node: t.Node) -> str | None:
        rule = self.rule("_integer_", type(node))
        return None if rule is None else rule(self, node)

    def _integer_IndexVar(self, node: t.IndexVar) -> str | None:
        return self.indices[node.name]

    def _integer_DimValue(self, node: t.DimValue) -> str | None:
        return dim_py(node.dim)

    def _integer_Scalar(self, node: t.Scalar) -> str | None:
        return str(int(node.value)) if node.value.is_Integer else None

    def _integer_Unary(self, node: t.Unary) -> str | None:
        inner = self.integer(node.x) if node.fn == "neg" else None
        return None if inner is None else f"(-{inner})"

    def _integer_Binary(self, node: t.Binary) -> str | None:
        if node.op not in ("add", "sub", "mul"):
            return None
        a, b = self.integer(node.a), self.integer(node.b)
        return None if a is None or b is None else f"({a} {BINARY[node.op]} {b})"

    # --- reads ----------------------------------------------------------------------------

    def _print_Tensor(self, node: t.Tensor, coords) -> Printed:
        if node.name in self.pure:
            definition = self.pure[node.name]
            if isinstance(definition, t.IndexDef):
                inner = TritonPrinter(self.core, self.spec, {i.name: c for i, c in zip(definition.indices, coords)})
                return Printed(self.fence(inner.entry(definition.body)), ATOM)
            return Printed(self.fence(self.entry(definition, coords)), ATOM)
        if node.name in self.core.reads:
            return Printed(self.load(node.name, coords), ATOM)
        raise TritonCodegenError(f"the score reads {node.name}, which the fused kernel cannot load")

    def load(self, name: str, coords: tuple[str, ...]) -> str:
        seen = self.loads.setdefault(name, coords)
        if seen != coords:
            raise TritonCodegenError(f"the score reads {name} at two different positions; the fused kernel "
                                     "reads each given tensor at one")
        offset = " + ".join(f"{c} * T_{name}_s{k}" for k, c in enumerate(coords) if c != "0")
        masks = [f"({c} < n_q_)" if "i_" in c else f"({c} < n_k_)" for c in coords if c in ("i_", "j_")]
        address = f"T_{name} + b_ * T_{name}_bs" + (f" + {offset}" if offset else "")
        mask = f", mask={' & '.join(masks)}, other=0.0" if masks else ""
        return f"tl.load({address}{mask}).to(tl.float32)"

    def unknown(self, node, *context) -> Printed:
        raise TritonCodegenError(f"no Triton rule for {type(node).__name__} in an attention score")

    # --- the rules ------------------------------------------------------------------------

    def _print_Scalar(self, node: t.Scalar, coords) -> Printed:
        text = float_py(node.value)
        return Printed(text, self.prec("neg") if text.startswith("-") else ATOM)

    def _print_DimValue(self, node: t.DimValue, coords) -> Printed:
        dim = sympy.sympify(node.dim)
        if dim.is_Integer:
            return Printed(float_py(dim))
        return Printed(f"tl.cast({dim_py(dim)}, tl.float32)", self.prec("call"))

    def _print_IndexVar(self, node: t.IndexVar, coords) -> Printed:
        return Printed(f"tl.cast({self.indices[node.name]}, tl.float32)", self.prec("call"))

    def _print_Unary(self, node: t.Unary, coords) -> Printed:
        x = self._child(node.x, node, coords)
        if node.fn == "neg":
            return Printed("-" + self.parenthesize(x, NEG), self.prec("neg"))
        if not UNARY.get(node.fn):
            raise TritonCodegenError(f"no Triton rule for the function {node.fn}")
        return Printed(UNARY[node.fn].format(x=x.text), self.prec("call"))

    def _print_Binary(self, node: t.Binary, coords) -> Printed:
        a = self._child(node.a, node, coords)
        if node.op == "pow" and isinstance(node.b, t.Scalar) and node.b.value == 2:
            return Printed(self.infix(a, "*", a, self.prec("mul")), self.prec("mul"))
        b = self._child(node.b, node, coords)
        if node.op == "pow":
            return Printed(f"_pow({a.text}, {b.text})", self.prec("call"))
        level = self.prec(node.op)
        return Printed(self.infix(a, BINARY[node.op], b, level), level)

    def _print_Compare(self, node: t.Compare, coords) -> Printed:
        a, b = self.integer(node.a), self.integer(node.b)
        if a is None or b is None:
            a = self.parenthesize(self._child(node.a, node, coords), ADD)
            b = self.parenthesize(self._child(node.b, node, coords), ADD)
        return Printed(f"{a} {COMPARISON[node.op]} {b}", self.prec("compare"))

    def _print_Where(self, node: t.Where, coords) -> Printed:
        cond = self.parenthesize(self._child(node.cond, node, coords), COMPARE)
        a = self._child(node.a, node, coords).text
        b = self._child(node.b, node, coords).text
        return Printed(f"tl.where({cond}, {a}, {b})", self.prec("call"))

    def _print_Transpose(self, node: t.Transpose, coords) -> Printed:
        return self.doprint(node.x, (*coords[:-2], coords[-1], coords[-2]))

    def _print_Constant(self, node: t.Constant, coords) -> Printed:
        if node.kind not in CONSTANT:
            raise TritonCodegenError(f"no Triton rule for the constant {node.kind}")
        return Printed(CONSTANT[node.kind](coords), self.prec("call"))
