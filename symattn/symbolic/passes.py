"""The backward pass and the forward-mode (tangent) pass, written as specs.

Contract: `backward_spec(spec, derivation)` and `tangent_spec(spec)` return a
`WrittenSpec`: the text of a spec in the spec language (it parses back, so
derive, check, emit, verify and documents all apply to it) and the notes a
writer owes its user (a generated name that had to differ from the usual one).

- The backward spec (`symattn derive SPEC --backward`): the forward's dims (at
  the spec's sizes), inputs, params and buffers with their kinds, an input
  `grad_O` per output (the upstream gradient), every forward definition, then
  `grad_T = ...` for every tensor the loss depends on, in the order derived
  (index-notation parts first named `dT_1[...] = ...`), and the outputs
  `grad_X` for every input and param. A gradient that is 0 is `0 * ones(...)`.
  Deriving it again is the double backward: its upstream gradients are
  `grad_grad_X`.
- The tangent spec (`--tangent`): the same declarations, an input `tangent_X`
  for every input and param, every forward definition, then `tangent_T = ...`
  for every tensor that depends on an input or param (`symattn.symbolic.tangent`),
  and the outputs O and `tangent_O` for every output (a tangent that is 0 is
  `0 * ones(...)`). The tangent spec of a backward spec is the
  Hessian-vector product (forward over reverse): its `tangent_grad_W` along
  the tangents, with `tangent_grad_O = 0` for the upstream gradients.
- A dropout definition `D = dropout(x, p)` is written out as `D = x * D_keep /
  (1 - p)` with its mask a declared buffer `buffer D_keep[...] in 0:2`: the
  written pass reads the mask the forward drew instead of drawing its own (a
  spec's definitions cannot name a drawn mask).
- Names: `grad_T` and `tangent_T` unless the spec (or an earlier generated
  name) already uses it; then `grad_T_2`, `grad_T_3`, ..., and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from ..front.parse import KEYWORDS
from ..front.validate import BUILTINS
from ..ir import typed as t
from ..ir.printing import to_spec
from ..ir.shapes import format_dim, format_shape
from .derive import Derivation
from .gradient_text import gradient_texts
from .tangent import tangents

__all__ = ["WrittenSpec", "backward_spec", "tangent_spec"]


@dataclass(frozen=True)
class WrittenSpec:
    """A pass written as a spec: its text and the notes about the names it chose."""

    text: str
    notes: tuple[str, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)  # "grad(T)" / "tangent(T)" -> the tensor written for it

    def __str__(self) -> str:
        return self.text


class _Names:
    """Generated tensor names that collide with nothing in the spec or with each other."""

    def __init__(self, spec: t.TypedSpec) -> None:
        self.taken = set(spec.dims) | set(spec.tensors) | set(BUILTINS) | set(KEYWORDS) | {spec.name}
        for info in spec.tensors.values():
            if info.expr is not None:
                for n in t.walk(info.expr):
                    if isinstance(n, t.IndexDef):
                        self.taken |= {i.name for i in n.indices}
                    elif isinstance(n, t.IndexSum):
                        self.taken.add(n.index.name)
        self.renamed: list[tuple[str, str, str]] = []  # (name chosen, what it stands for, the usual name)

    def fresh(self, prefix: str, tensor: str, meaning: str) -> str:
        name, k = f"{prefix}_{tensor}", 1
        while name in self.taken:
            k += 1
            name = f"{prefix}_{tensor}_{k}"
        if k > 1:
            self.renamed.append((name, meaning, f"{prefix}_{tensor}"))
        self.taken.add(name)
        return name

    @property
    def notes(self) -> tuple[str, ...]:
        """One line on the generated names that differ from the usual ones, if any."""
        if not self.renamed:
            return ()
        chosen, meant, usual = (", ".join(r[k] for r in self.renamed) for k in range(3))
        many = len(self.renamed) > 1
        return (f"{chosen} {'are' if many else 'is'} {meant}: the spec already has {usual}",)


def _declarations(spec: t.TypedSpec, what: str, extra: list[str]) -> list[str]:
    """The header, dims and given tensors of a written spec (dropout masks declared as buffers)."""
    order = list(spec.dims)
    lines = [f"# The {what} pass of {spec.name}, written by symattn as a spec.", f"attention {spec.name}_{what}", ""]
    if spec.dims:
        lines.append("dim " + ", ".join(f"{n} = {spec.sizes[n]}" for n in spec.dims))
        lines.append("")
    for kind in ("input", "param", "buffer"):
        items = []
        for name, info in spec.tensors.items():
            if info.kind != kind:
                continue
            item = name + (format_shape(info.shape, order) if info.shape else "")
            if info.integer:
                item += f" in {format_dim(info.values[0], order)}:{format_dim(info.values[1], order)}"
            if info.dropout is not None:
                item += f"    # the mask of {info.dropout.of} = dropout(..., {info.dropout.p_text}), as drawn"
                lines.append(f"buffer {item}")
                continue
            items.append(item)
        if items:
            lines.append(f"{kind} " + ", ".join(items))
    lines += extra
    lines.append("")
    for name, info in spec.tensors.items():
        if info.expr is not None:
            lines.append(_definition(spec, name, info.expr))
    return lines


def _definition(spec: t.TypedSpec, name: str, expr: t.Node) -> str:
    order = list(spec.dims)
    if isinstance(expr, t.IndexDef):
        head = ", ".join(f"{i.name}:{format_dim(i.range, order)}" for i in expr.indices)
        return f"{name}[{head}] = {to_spec(expr.body, order)}"
    return f"{name} = {to_spec(expr, order)}"


def _zeros(shape, order) -> str:
    return "0" if not shape else f"0 * ones({', '.join(format_dim(d, order) for d in shape)})"


def _renamed(node, grads: Mapping[str, str]):
    """`node` with grad(T) read as the tensor grads[T] (and entries of it likewise)."""
    if isinstance(node, t.Grad):
        return t.Tensor(grads[node.name], node.shape)
    if isinstance(node, t.Entry) and node.grad:
        return replace(node, tensor=grads[node.tensor], grad=False,
                       indices=tuple(_renamed(s, grads) if isinstance(s, t.Node) else s for s in node.indices))
    return t.map_children(node, lambda child: _renamed(child, grads))


def _squeezed(spec: t.TypedSpec, lines: list[str], outputs: Mapping[str, str], names: _Names) -> list[str]:
    """The lines with each gradient output given its tensor's shape: a sum over broadcast axes keeps them
    with size 1 (`sum(..., axis=-3)` is [1, N, d] for X[N, d]), so such a gradient is first named whole,
    then its entries picked (`grad_X[z_1:N, z_2:d] = full_grad_X[0, z_1, z_2]`). A scalar keeps its axes of
    size 1 (the language has no way to drop them; they broadcast as a scalar does)."""
    from ..front.parse import parse
    from ..front.validate import validate

    text = "\n".join(lines) + "\n"
    typed = validate(parse(text, "<backward>"), "<backward>", text, None)
    order = list(spec.dims)
    out = []
    for line in lines:
        name = line.split(" = ", 1)[0].strip() if " = " in line and not line.startswith("#") else None
        if name not in outputs:
            out.append(line)
            continue
        got, want = tuple(typed.tensors[name].shape), tuple(spec.tensors[outputs[name]].shape)
        lead = len(got) - len(want)
        if not want or lead <= 0 or got[lead:] != want or any(d != 1 for d in got[:lead]):
            out.append(line)
            continue
        full = names.fresh("full", name, f"{name} before its axes of size 1 are dropped")
        index = [names.fresh("z", str(k + 1), "an index") for k in range(len(want))]
        head = ", ".join(f"{i}:{format_dim(d, order)}" for i, d in zip(index, want))
        out += [f"{full} = {line.split(' = ', 1)[1]}", f"{name}[{head}] = {full}[{', '.join(['0'] * lead + index)}]"]
    return out


def backward_spec(spec: t.TypedSpec, derivation: Derivation) -> WrittenSpec:
    """The backward pass of `spec` as a spec (see the module docstring)."""
    order = list(spec.dims)
    names = _Names(spec)
    grads = {name: names.fresh("grad", name, f"grad({name})") for name, info in spec.tensors.items()
             if info.has_gradient}
    upstream = [f"input {grads[o]}{format_shape(spec.tensors[o].shape, order) if spec.tensors[o].shape else ''}"
                f"    # grad({o}), the upstream gradient of output {o}" for o in spec.outputs]
    lines = _declarations(spec, "backward", upstream)
    lines += ["", "# the gradients, in the order derived"]
    exprs = {name: (None if g.expr is None else _renamed(g.expr, grads)) for name, g in derivation.gradients.items()}
    texts = gradient_texts(spec, exprs)
    for name, g in derivation.gradients.items():
        expr = exprs[name]
        if isinstance(g.expr, t.Grad) and g.expr.name == name and name in spec.outputs:
            continue  # grad(O) of an output is the input grad_O
        if expr is None:
            if name in spec.differentiable:
                lines.append(f"{grads[name]} = {_zeros(spec.tensors[name].shape, order)}    "
                             f"# L does not depend on {name}")
            continue
        text = texts[name]
        lines += list(text.definitions)
        lines.append(f"{grads[name]} = {text.equation.split(' = ', 1)[1]}")
    lines += ["", "output " + ", ".join(grads[n] for n in spec.differentiable)]
    lines = _squeezed(spec, lines, {grads[n]: n for n in spec.differentiable}, names)
    defined = {n for n in grads if n in spec.differentiable or exprs.get(n) is not None}
    return WrittenSpec("\n".join(lines) + "\n", names.notes, {f"grad({n})": grads[n] for n in defined})


def tangent_spec(spec: t.TypedSpec, fixed: frozenset[str] | set[str] = frozenset()) -> WrittenSpec:
    """The forward-mode pass of `spec` as a spec (see the module docstring); the inputs in `fixed` have
    tangent 0 (the upstream gradients of a backward spec, for the Hessian-vector product proper)."""
    order = list(spec.dims)
    names = _Names(spec)
    moving = [n for n in spec.differentiable if n not in fixed]
    tangent_names = {name: names.fresh("tangent", name, f"tangent({name})") for name, info in spec.tensors.items()
                     if name in moving or info.expr is not None}
    given = ["input " + ", ".join(tangent_names[n] + (format_shape(spec.tensors[n].shape, order)
                                                       if spec.tensors[n].shape else "")
                                   for n in moving)] if moving else []
    lines = _declarations(spec, "tangent", given)
    lines += ["", "# the tangents along tangent_X of every input and param, in spec order"]
    found = tangents(spec, tangent_names, fixed)
    for name, tangent in found.items():
        if tangent.expr is not None:
            lines.append(_definition(spec, tangent_names[name], tangent.expr))
        elif name in spec.outputs:
            lines.append(f"{tangent_names[name]} = {_zeros(spec.tensors[name].shape, order)}    "
                         f"# {name} depends on no input or param")
    outputs = [x for o in spec.outputs for x in (o, tangent_names[o])]
    lines += ["", "output " + ", ".join(outputs)]
    defined = {n for n, tangent in found.items() if tangent.expr is not None or n in spec.outputs or n in moving}
    return WrittenSpec("\n".join(lines) + "\n", names.notes, {f"tangent({n})": tangent_names[n] for n in defined})
