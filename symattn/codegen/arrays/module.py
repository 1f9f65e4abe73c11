"""What every generated Python module (NumPy, torch, Triton) is made of around its statements.

Contract: `size_keywords(spec)` are the dims a module takes as keywords (no
given tensor has them alone on an axis); `bind_dims` prints the lines that
read each dim from the arrays and check every shape (`_bind`, `_exact`,
`_batch_axes`); `upstream_lines` checks each output's upstream gradient and
casts it to the forward's dtype; `one_batch_check` refuses outputs of
different batch axes; `comment_lines` puts the formula a statement computes
above its code; `helper_sources(used, runtime)` is the source of the runtime
helpers the printed code calls (with those they call, `runtime.CALLS`), in
the runtime's order; `load_module(source)` runs generated text as a module.
The lines are printed with an `ArrayPrinter`, so they read the same in NumPy
and torch.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import sympy

from ...ir import typed as t
from ...ir.shapes import format_dim, format_shape

if TYPE_CHECKING:
    from ..program import Program, Stmt
    from .printer import ArrayPrinter

__all__ = ["size_keywords", "bind_dims", "upstream_lines", "one_batch_check", "comment_lines", "helper_sources",
           "load_module"]


def size_keywords(spec: t.TypedSpec) -> list[str]:
    """Dims that no given tensor's shape has alone on an axis: the module takes them as keywords.

    (`split_heads(X, h)` with no tensor of shape [h, ...]: `forward(X=..., h=4)`, default the spec's size.)
    """
    alone = {d for name in spec.given for d in spec.tensors[name].shape if getattr(d, "is_Symbol", False)}
    return [name for name, info in spec.dims.items() if info.symbol not in alone]


def upstream_lines(spec: t.TypedSpec, program: Program, printer: ArrayPrinter) -> list[str]:
    """Each output's upstream gradient, checked and in the forward pass's dtype."""
    order = list(spec.dims)
    lines = []
    for out in spec.outputs:
        shape = spec.tensors[out].shape
        lines.append(f"{program.grad_vars[out]} = _upstream(\"{program.upstream[out]}\", {program.upstream[out]}, "
                     f"\"{format_shape(shape, order)}\", {printer.shape_tuple(shape)}, dtype)")
    return lines


def one_batch_check(spec: t.TypedSpec, program: Program, printer) -> list[str]:
    """With several outputs, the check that they and their upstream gradients share their batch axes
    (`_one_batch`); nothing for one output, whose paths all carry its gradient's batch axes."""
    if len(spec.outputs) < 2:
        return []
    printer.helpers.add("_one_batch")
    ranks = {o: len(spec.tensors[o].shape) for o in spec.outputs}
    pairs = [f'("{o}", {program.tensor_vars[o]}, {ranks[o]}), ("grad_{o}", {program.grad_vars[o]}, {ranks[o]})'
             for o in spec.outputs]
    return [f"_one_batch([{', '.join(pairs)}])"]


def comment_lines(stmt: Stmt, lines: list[str], consumed: str | None) -> list[str]:
    """The formula a statement computes, where its code does not read as that formula already."""
    from ..index import IndexArray

    plain = len(lines) == 1 and not stmt.rewritten and stmt.labels is None and not isinstance(stmt.node, IndexArray)
    out = []
    if stmt.title and not plain:
        out.append(f"# {stmt.title}")
    if stmt.note:
        out.append(f"#   using {stmt.note}")
    if consumed is not None and len(lines) == 1:
        out.append(f"# (in {consumed}'s buffer: {consumed} is not read again)")
    return out + lines


def bind_dims(spec: t.TypedSpec, program: Program, printer: ArrayPrinter, batch: str | None = None) -> list[str]:
    """Read each dim's size from the first array that has it alone on an axis; check every array against them
    (and keep the broadcast batch axes as `batch`, when named)."""
    order = list(spec.dims)
    bound: set[sympy.Symbol] = set()
    lines: list[str] = []
    later: list[str] = []  # arrays with an axis that could not be checked when they were read

    def call(leaf: str, expected: list[str]) -> str:
        shape = format_shape(spec.tensors[leaf].shape, order)
        tail = "," if len(expected) == 1 else ""
        return f'_bind("{leaf}", {program.tensor_vars[leaf]}, "{shape}", ({", ".join(expected)}{tail}))'

    for leaf in spec.given:
        targets, expected, new = [], [], set()
        for d in map(sympy.sympify, spec.tensors[leaf].shape):
            if d.is_Symbol and d not in bound:
                targets.append(printer.dims[d])
                expected.append("None")
                bound.add(d)
                new.add(d)
            elif d.free_symbols <= bound and not d.free_symbols & new:
                targets.append("_")
                expected.append(printer.dim(d).text)
            else:
                targets.append("_")
                expected.append("None")
                if leaf not in later:
                    later.append(leaf)
        if any(name != "_" for name in targets):
            lines.append(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {call(leaf, expected)}")
        else:
            lines.append(call(leaf, expected))
    for name in size_keywords(spec):
        var = program.dim_vars[name]
        lines.append(f'{var} = _size("{name}", {var})  # no array has an axis of size {name} alone: a keyword')
        printer.helpers.add("_size")
        bound.add(spec.dims[name].symbol)
    lines += exact_dims(spec, printer)
    for leaf in later:
        lines.append(call(leaf, [printer.dim(d).text for d in spec.tensors[leaf].shape]))
    ranks = ", ".join(f'("{leaf}", {program.tensor_vars[leaf]}, {len(spec.tensors[leaf].shape)})'
                      for leaf in spec.given)
    lines.append(f"{batch + ' = ' if batch else ''}_batch_axes({ranks})")
    return lines


def exact_dims(spec: t.TypedSpec, printer: ArrayPrinter) -> list[str]:
    """A check for each quotient of sizes the spec relies on (`d / h`, `(N + 1) / 2`): it must divide.

    Everywhere else such a dim is printed with `//`; this makes a size at which it
    does not divide a ValueError, as the reference evaluator refuses it too.
    """
    from ...ir.sizes import constraints

    # split_heads checks its own width ("not a multiple of 3 heads"), unless an input's shape has it too
    in_leaves = {d for name in spec.given for d in spec.tensors[name].shape}
    seen = {n.shape[-1] for info in spec.tensors.values() if info.expr is not None for n in t.walk(info.expr)
            if isinstance(n, t.SplitHeads)} - in_leaves
    lines = []
    for constraint in constraints(spec):
        num, den = sympy.fraction(sympy.together(constraint.dim))
        if den == 1 or constraint.dim in seen:
            continue
        seen.add(constraint.dim)
        printer.helpers.add("_exact")
        shown = format_dim(constraint.dim, list(spec.dims))
        lines.append(f'_exact("{shown}", {printer.dim(num).text}, {printer.dim(den).text})')
    return lines


def helper_sources(used: set[str], runtime) -> list[str]:
    """The source lines of the helpers `used` and those they call, in the runtime's order (`runtime.HELPERS`)."""
    CALLS, HELPERS, helper_source = runtime.CALLS, runtime.HELPERS, runtime.helper_source

    needed: set[str] = set()
    stack = sorted(used)
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(CALLS.get(name, ()))
    lines: list[str] = []
    for name in HELPERS:
        if name in needed:
            lines += ["", ""] + helper_source(name).split("\n")
    return lines


def load_module(source: str, name: str = "symattn_generated") -> types.ModuleType:
    """Execute generated source as a new module object (nothing is written to disk)."""
    module = types.ModuleType(name)
    module.__file__ = f"<symattn generated {name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module
