"""The attention plan: the one place that decides which attention cores fuse, and how.

Contract: `attention_plan(spec)` returns an `AttentionPlan`. Its `cores`
(`find_cores`: each `softmax(score) @ V` with its score in entry form, mask,
reads, head broadcasting and derived backward, see `AttentionCore`) are what
every target computes fused (block by block, never the whole score); `notes`
say, one line per softmax that is not fused, why not. `plan.program(reserved)`
builds the program (`symattn.codegen.program.build_program`) in which

- each core's output is one `FusedAttention` statement (O and its row
  log-sum-exp; a tensor that is the row log-sum-exp is a `FusedLse` of it);
  the core's intermediates (`absorbed`: S, P) are never computed;
- the gradient of each core operand (Q, K, V) and of each learned tensor the
  score reads takes, in place of its paths through the core, a `FusedPart`
  of the core's `FusedAttentionGrad` (FlashAttention-2's backward, with the
  scatter-adds of the learned reads); what flows back into a core is the
  whole gradient of its output (and of its log-sum-exp), also for an output
  that other tensors read; every other path is the derivation's.

The NumPy, torch, Triton and CUDA targets render this plan; none of them
decides anything about fusion itself, and none imports another. `bounds`
gives the blocks a core's mask lets a target skip, statically.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy

from ...ir import typed as t
from ...symbolic.derive import Derivation, derive
from ..program_ir import FusedAttention, FusedAttentionGrad, FusedLse, FusedPart
from .bounds import Bounds, tile_bounds
from .core import KEY, ROW, AttentionCore, DropoutEntry, Product, ProductEntry, Read, coordinate_node, entry_text, head
from .entry import Linear, derivative, integer, linear, positive_constant, scaled, split_mask
from .find import find_cores, substitute
from .gradients import read_again, roles, whole_gradient, written_sum

__all__ = ["AttentionPlan", "attention_plan", "AttentionCore", "DropoutEntry", "Product", "ProductEntry", "Read", "Bounds",
           "tile_bounds", "find_cores", "substitute", "Linear", "linear", "scaled", "derivative", "integer",
           "positive_constant", "split_mask", "coordinate_node", "entry_text", "head", "ROW", "KEY", "roles",
           "read_again", "whole_gradient", "written_sum"]


@dataclass(frozen=True)
class AttentionPlan:
    spec: t.TypedSpec                 # the spec with every core operand and result named
    derivation: Derivation            # of `spec`
    cores: dict[str, AttentionCore]   # core output -> core
    notes: tuple[str, ...]            # why each softmax that is not fused is not
    forward: dict[str, t.Node] = field(default_factory=dict)     # core output (and lse) -> its fused node
    gradients: dict[str, t.Node | None] = field(default_factory=dict)  # tensor -> grad, through cores fused
    absorbed: frozenset[str] = frozenset()  # the cores' intermediates: never computed
    titles: dict[str, str] = field(default_factory=dict)  # core output -> its statement's title

    @property
    def fused(self) -> bool:
        return bool(self.cores)

    def program(self, reserved=()):
        """The program that computes the spec with every core fused (see the module docstring)."""
        from ..program import build_program

        return build_program(self.spec, self.derivation, reserved=reserved, fused=self if self.cores else None)

    def core_of(self, name: str) -> AttentionCore | None:
        """The core whose output, chain or log-sum-exp `name` is."""
        for core in self.cores.values():
            if name in (core.output, core.lse, *core.chain):
                return core
        return None


def attention_plan(spec: t.TypedSpec, derivation: Derivation | None = None) -> AttentionPlan:
    """The plan of `spec` (see the module docstring); `derivation` of `spec` itself saves deriving it twice
    when the spec has no core."""
    named, cores, notes = find_cores(spec)
    if not cores:
        return AttentionPlan(spec, derivation or derive(spec), {}, tuple(notes))
    derivation = derive(named)  # find_cores named the core operands: a spec of its own
    while True:
        plan = _fused(named, derivation, cores, notes)
        stored = _stored(plan)
        if not stored:
            return _drawn_per_entry(plan)
        core, name = stored
        cores = [c for c in cores if c is not core]
        notes = notes + [f"{core.output}: softmax(...) @ V not fused: {name} is needed outside the core"]
        if not cores:
            return AttentionPlan(named, derivation, {}, tuple(notes))


def _fused(named: t.TypedSpec, derivation: Derivation, cores: list[AttentionCore], notes) -> AttentionPlan:
    tensors = named.tensors

    def tensor(name: str) -> t.Tensor:
        return t.Tensor(name, tensors[name].shape)

    core_of = {owner: core for core in cores for owner in (*core.chain, core.output)}
    lse_of = {core.lse: core for core in cores if core.lse is not None}
    forward: dict[str, t.Node] = {}
    grads: dict[str, FusedAttentionGrad] = {}
    wholes: dict[t.Node, t.Node] = {}  # an output read again: the sum of its paths, written out -> fused

    def whole(name: str) -> t.Node | None:
        """grad(name), every path through a core its `FusedPart` (what reads name comes later: built already)."""
        return whole_gradient(name, derivation.gradients[name].paths, core_of, cores, lambda core, index: FusedPart(
            grads[core.output], index, tensors[name].shape), wholes)

    def incoming(name: str) -> t.Node | None:
        """What flows back into a core from its output or log-sum-exp `name`."""
        gradient = derivation.gradients.get(name)
        if gradient is None or gradient.expr is None:
            return None
        return whole(name) if read_again(derivation, name) else t.Grad(name, tensors[name].shape)

    for name in reversed(list(tensors)):  # what reads a tensor comes after it
        read = read_again(derivation, name)
        core = next((c for c in cores if c.output == name), None)
        if core is not None:
            q, k, v, o = (tensor(n) for n in (core.q, core.k, core.v, core.output))
            operands = tuple(tensor(n) for n in core.read_tensors)
            forward[name] = FusedAttention(name, q, k, v, o.shape, operands)
            dlse = incoming(core.lse) if core.lse is not None else None
            do = incoming(name) or t.Grad(name, o.shape)
            grads[name] = FusedAttentionGrad(name, q, k, v, o, do, (), dlse, operands)
        if read and any(owner in core_of for owner, _ in derivation.gradients[name].paths):
            wholes[written_sum(derivation.gradients[name].paths)] = whole(name)
    for lse, core in lse_of.items():
        forward[lse] = FusedLse(forward[core.output], tensors[lse].shape)
    absorbed = frozenset(n for core in cores for n in core.chain)
    gradients = {}
    for name, gradient in derivation.gradients.items():
        if name in absorbed:
            continue
        if any(owner in core_of for owner, _ in gradient.paths):
            gradients[name] = whole(name)
        elif wholes and gradient.expr is not None:
            fused = substitute(gradient.expr, wholes)
            if fused is not gradient.expr:
                gradients[name] = fused
    titles = {c.output: c.text for c in cores}
    return AttentionPlan(named, derivation, {c.output: c for c in cores}, tuple(notes), forward, gradients, absorbed,
                         titles)


def _stored(plan: AttentionPlan) -> tuple[AttentionCore, str] | None:
    """A core intermediate, or a dropout mask a core draws per entry, that something the program computes still
    reads (then that core cannot fuse)."""
    spec = plan.spec
    drawn = {mask: core for core in plan.cores.values() for mask in core.drawn}
    exprs = [e for e in plan.gradients.values() if e is not None]
    exprs += [g.expr for name, g in plan.derivation.gradients.items() if drawn and g.expr is not None
              and name not in plan.gradients and name not in plan.absorbed]
    for name, info in spec.tensors.items():
        if info.expr is not None and name not in plan.absorbed and name not in plan.forward:
            exprs.append(info.expr)
    for expr in exprs:
        for name in t.tensors_read(expr):
            if name in plan.absorbed:
                return plan.core_of(name), name
        for name in _read_outside_cores(expr):
            if name in drawn:
                return drawn[name], name
    return None


def _read_outside_cores(expr: t.Node) -> set[str]:
    """The tensors `expr` reads other than as the operands of a fused core's statements."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (FusedAttention, FusedAttentionGrad)):
            continue
        if isinstance(node, t.Tensor):
            found.add(node.name)
        elif isinstance(node, t.Entry):
            found.add(node.tensor)
            stack.extend(s for s in node.indices if isinstance(s, t.Node))
        stack.extend(node.children)
    return found


def _drawn_per_entry(plan: AttentionPlan) -> AttentionPlan:
    """The plan with each dropout mask that a core draws per entry (`DropoutEntry`) held as (offset, seed) per
    batch entry: in the plan's spec its shape is [2], which the program computes (`DropoutBase`) instead of
    the [N, N] mask."""
    spec = plan.spec
    drawn = {mask for core in plan.cores.values() for mask in core.drawn}
    if not drawn:
        return plan
    tensors = {name: dataclasses.replace(info, shape=(sympy.Integer(2),)) if name in drawn else info
               for name, info in spec.tensors.items()}
    return dataclasses.replace(plan, spec=dataclasses.replace(spec, tensors=tensors))
