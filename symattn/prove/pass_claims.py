"""Checks that read `tangent(...)`: answered on the forward-mode pass written as a spec.

Contract: `reads_tangents(check)` says whether a check reads `tangent(T)`. `on_written_passes(spec, checks)`
returns each written spec such checks are answered on, once, with those checks rewritten for it:

- a check that reads only tangents of forward tensors is answered on the tangent pass of `spec`
  (`symattn.symbolic.passes.tangent_spec`), where tangent(T) is the tensor `tangent_T`;
- a check that also reads a gradient (`tangent(grad(W))`, the Hessian-vector product, or grad(T) beside a
  tangent) is answered on the tangent pass of the backward pass, where grad(T) is the tensor `grad_T` and
  tangent(grad(T)) is `tangent_grad_T`, the Hessian-vector product: the upstream gradients `grad_O` have
  tangent 0 there, as the language says.

A tangent (or gradient) that the written pass does not define is exactly 0: a buffer's, a constant's, and
grad(T) of a tensor the loss does not depend on; it is written `0 * ones(...)`. Everything else about the
verdict (the ladder, the counterexample re-evaluated in plain float64) is `check_spec`'s on that spec, whose
given tensors include the tangents `tangent_X` of every input and param: a counterexample names them.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import build as b
from ..ir import typed as t

__all__ = ["reads_tangents", "on_written_passes"]


def _nodes(check: t.CheckInfo):
    for side in (check.lhs, check.rhs):
        if side is not None:
            yield from t.walk(side)


def reads_tangents(check: t.CheckInfo) -> bool:
    """An equality or a `relative(...)` claim that reads tangent(...) (a symmetry claim cannot: the
    validator refuses it)."""
    return check.kind in ("equal", "relative") and any(isinstance(n, t.Tangent) for n in _nodes(check))


def _rewritten(node, names, gradients: bool, tensors):
    """`node` with tangent(T), and grad(T) where `gradients`, read as the written pass's tensors (of the
    shapes they have there: a scalar's gradient keeps its reduced axes, [1] for ())."""
    if isinstance(node, t.Tangent):
        key = f"tangent({node.x.name})" if isinstance(node.x, t.Tensor) else f"tangent({names.get(f'grad({node.x.name})')})"
        name = names.get(key)
        return b.zeros(node.shape) if name is None else t.Tensor(name, tensors[name].shape)
    if gradients and isinstance(node, t.Grad):
        name = names.get(f"grad({node.name})")
        return b.zeros(node.shape) if name is None else t.Tensor(name, tensors[name].shape)
    if gradients and isinstance(node, t.Entry) and node.grad:
        name = names.get(f"grad({node.tensor})")
        if name is None:
            return b.scalar(0)
        return replace(node, tensor=name, grad=False)
    if not isinstance(node, t.Node):  # an absent side
        return node
    return t.map_children(node, lambda child: _rewritten(child, names, gradients, tensors))


def _reads_gradients(check: t.CheckInfo) -> bool:
    return any(isinstance(n, t.Grad) or (isinstance(n, t.Entry) and n.grad) for n in _nodes(check))


def on_written_passes(spec: t.TypedSpec, checks: list[t.CheckInfo], derivation=None) \
        -> list[tuple[t.TypedSpec, list[int], str]]:
    """For checks that read tangents: each written pass they need, once, as (the written spec whose checks are
    theirs rewritten for it, their positions in `checks`, which pass it is)."""
    from ..front.parse import parse
    from ..front.validate import validate
    from ..symbolic.derive import derive
    from ..symbolic.passes import backward_spec, tangent_spec

    def load(text: str, name: str) -> t.TypedSpec:
        return validate(parse(text, name), name, text, None)

    out = []
    for gradients in (False, True):
        group = [k for k, check in enumerate(checks) if _reads_gradients(check) == gradients]
        if not group:
            continue
        names: dict[str, str] = {}
        base, what, upstream = spec, "the tangent pass (symattn derive --tangent)", frozenset()
        if gradients:
            back = backward_spec(spec, derivation if derivation is not None else derive(spec))
            names.update(back.names)
            base = load(back.text, f"{spec.name}_backward.attn")
            what = "the tangent pass of the backward pass (symattn derive --backward, then --tangent)"
            upstream = frozenset(back.names[f"grad({o})"] for o in spec.outputs)
        written = tangent_spec(base, fixed=upstream)
        names.update(written.names)
        passed = load(written.text, f"{spec.name}_tangent.attn")
        rewritten = tuple(replace(checks[k], lhs=_rewritten(checks[k].lhs, names, gradients, passed.tensors),
                                  rhs=_rewritten(checks[k].rhs, names, gradients, passed.tensors)) for k in group)
        out.append((replace(passed, checks=rewritten), group, what))
    return out
