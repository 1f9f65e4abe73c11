"""Gradients through fused cores: each path that comes back through a core is that core's fused part.

Contract: `whole_gradient(name, paths, core_of, cores, core_part, wholes)` is
grad(name) as the sum of its paths (`Gradient.paths`: (reader, part)), where
every path through a fused core (`core_of`: each core's chain and output ->
the core) is replaced by `core_part(core, index)` for each role `name` plays
in the core (`roles`: 0 q, 1 k, 2 v, then each learned tensor the score
reads), and every other path has each written-out sum in it replaced through
`wholes` (`written_sum` -> `whole_gradient`). `read_again(derivation, name)`
says whether `name` is an output that other tensors read too: then what
flows back into its definition is more than its upstream gradient.
"""

from __future__ import annotations

from ...ir import build as b
from ...ir import typed as t
from .core import AttentionCore
from .find import substitute

__all__ = ["read_again", "written_sum", "whole_gradient", "roles"]


def roles(core: AttentionCore) -> tuple[str, ...]:
    """The tensors a core's fused backward gives gradients of, by index: q, k, v, then the learned reads."""
    return (core.q, core.k, core.v, *core.learned)


def read_again(derivation, name: str) -> bool:
    """Whether `name` is an output that other tensors read too (see the module docstring)."""
    gradient = derivation.gradients.get(name)
    return (name in derivation.spec.outputs and gradient is not None
            and any(owner != "upstream" for owner, _ in gradient.paths))


def written_sum(paths) -> t.Node:
    """The sum of an output's paths as `derive` writes it out inside its readers' gradients."""
    total = None
    for _, part in paths:
        total = b.add(total, part)
    return total


def whole_gradient(name: str, paths, core_of: dict, cores, core_part, wholes: dict, prepare=None) -> t.Node | None:
    """grad(name), every path summed (see the module docstring); `prepare(part)` (None: as it is) is applied
    to each path that does not come through a core."""
    total = None
    for owner, part in paths:
        if owner not in core_of:
            part = substitute(part, wholes) if wholes else part
            total = b.add(total, prepare(part) if prepare else part)
    for core in cores:
        if any(core_of.get(owner) is core for owner, _ in paths):
            for index, role in enumerate(roles(core)):
                if role == name:
                    total = b.add(total, core_part(core, index))
    return total
