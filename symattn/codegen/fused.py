"""Attention cores as single operations of the program: what a target that evaluates them tiled builds.

Contract: `fused_plan(spec)` returns a `FusedPlan`, or None when
the spec has no attention core (`symattn.codegen.cuda.core.find_cores`, the
cores whose score is a per-entry function of one `Q @ K.T`, its indices and
constants). `build_program(plan.spec, plan.derivation, fused=plan)` then
builds a program in which

- each core's output is one `FusedAttention` statement (O and its row
  log-sum-exp); the core's intermediates (S, P) are never computed;
- the gradient of each core operand (Q, K, V) takes, in place of its paths
  through the core, a `FusedPart` of the core's `FusedAttentionGrad` (dQ, dK,
  dV in one operation, FlashAttention-2's backward); every other path is the
  derivation's, as in the plain program.

This is the split the CUDA target's planner makes (`Stored`), at the level of
the program IR, so that a target prints the fused statements its own way (the
NumPy module: query blocks x key blocks through BLAS, online softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import typed as t
from ..ir.printing import to_spec
from ..symbolic.derive import Derivation, derive
from .cuda.core import AttentionCore, find_cores, read_again, substitute, whole_gradient, written_sum
from .program_ir import FusedAttention, FusedAttentionGrad, FusedPart

__all__ = ["FusedPlan", "fused_plan"]


@dataclass(frozen=True)
class FusedPlan:
    spec: t.TypedSpec                 # the spec with every core operand and result named
    derivation: Derivation            # of `spec`
    cores: dict[str, AttentionCore]   # core output -> core
    forward: dict[str, t.Node]        # core output -> its FusedAttention
    gradients: dict[str, t.Node | None]  # tensor -> grad(tensor), paths through a core replaced by FusedPart
    absorbed: frozenset[str]          # the cores' intermediates: never computed
    titles: dict[str, str]            # core output -> what its statement computes, in spec syntax


def fused_plan(spec: t.TypedSpec) -> FusedPlan | None:
    """The cores of `spec` as fused operations, or None when it has none (see the module docstring)."""
    named, cores, _ = find_cores(spec)
    if not cores:
        return None
    derivation = derive(named)  # find_cores named the core operands: a spec of its own
    tensors = named.tensors

    def tensor(name: str) -> t.Tensor:
        return t.Tensor(name, tensors[name].shape)

    core_of = {owner: core for core in cores for owner in (*core.chain, core.output)}
    forward: dict[str, t.Node] = {}
    grads: dict[str, FusedAttentionGrad] = {}

    # An output that other tensors read: the derivation writes the sum of its paths out inside each of its
    # readers' own gradients; where a path comes through a core, that sum holds the core unfused (an
    # [N, N] softmax), so it is replaced by `whole`, its paths through cores their FusedParts.
    wholes: dict[t.Node, t.Node] = {}

    def whole(name: str) -> t.Node | None:
        """grad(name), every path through a core its `FusedPart` (what reads name comes later: built already)."""
        return whole_gradient(name, derivation.gradients[name].paths, core_of, cores, lambda core, index: FusedPart(
            grads[core.output], index, tensors[name].shape), wholes)

    for name in reversed(list(tensors)):  # what reads a tensor comes after it
        read = read_again(derivation, name)
        core = next((c for c in cores if c.output == name), None)
        if core is not None:
            q, k, v, o = (tensor(n) for n in (core.q, core.k, core.v, core.output))
            forward[name] = FusedAttention(name, q, k, v, o.shape)
            # what flows back into it: for an output read again, more than its upstream gradient, which is all
            # that the program's grad(output) is; any other tensor's grad(output) is whole already
            grads[name] = FusedAttentionGrad(name, q, k, v, o, whole(name) if read else t.Grad(name, o.shape))
        if read and any(owner in core_of for owner, _ in derivation.gradients[name].paths):
            wholes[written_sum(derivation.gradients[name].paths)] = whole(name)
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
    dims = list(named.dims)
    titles = {c.output: f"{c.output} = softmax({to_spec(c.score, dims)}, axis=-1) @ {c.v}" for c in cores}
    return FusedPlan(named, derivation, {c.output: c for c in cores}, forward, gradients, absorbed, titles)
