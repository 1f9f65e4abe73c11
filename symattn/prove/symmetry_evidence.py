"""Concrete evidence for permutation claims: the element-level witness and the counterexample search.

Contract: `element_witness(spec, output, sources, dim, invariant)` checks, at the
spec's sizes, the exact identity O(Pi X) = Pi O(X) (or = O(X)) for a
transposition and an n-cycle, which generate every permutation: True, False
(the levels disagree: a bug), or None with the reason it was not settled.
`find_counterexample(...)` looks for a permutation and inputs (multiples of 1/2)
at which float64 shows the two sides differ; it runs at `search_sizes` (the
spec's, or smaller ones the size guard picks, but never for an output that
reads sizes as values). `symattn.prove.equivariance` calls both. `sources` is
one given tensor or a group of them, and `permuted_axes` says which axes the
permutation Pi moves (both levels use it): a tensor named alone, along its
first axis of size D; every tensor of a group, along every axis of size D (a
mask M [N, N] becomes Pi M Pi^T). Every other given tensor (a buffer the claim
does not name included) keeps its values.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from ..errors import SizeGuardError
from ..ir import typed as t
from ..ir.shapes import same_dim
from ..ir.sizes import SEARCH_BUDGET, SizeChoice, fit_sizes, reads_sizes, user_sizes
from ..symbolic.element import guard, same_entry, settled, shared_xreplace, symbol_name
from ..symbolic.element import MAX_ASSIGNMENTS, count_assignments, exact_integers, integer_assignments
from ..symbolic.evaluate import NUMERIC, SYMBOLIC, Evaluator
from .verdicts import Counterexample

__all__ = ["element_witness", "find_counterexample", "search_sizes", "permuted_axes"]


def _permuted(array: np.ndarray, perm: list[int], axes: list[int]) -> np.ndarray:
    out = np.asarray(array)
    for axis in axes:
        out = np.take(out, perm, axis=axis)
    return out


def _axes_of(shape, symbol) -> list[int]:
    return [k for k, d in enumerate(shape) if same_dim(d, symbol)]


def permuted_axes(spec: t.TypedSpec, sources: str | tuple[str, ...], dim: str) -> dict[str, tuple[int, ...]]:
    """Each tensor a claim permutes and the axes Pi moves: a tensor named alone, its first axis of size
    `dim` (`equivariant(O, X)` permutes the rows of X); each tensor of a group, every axis of size `dim`
    (`equivariant(O, (X, M))` moves a mask M [N, N] as Pi M Pi^T: the positions it indexes move)."""
    sources = (sources,) if isinstance(sources, str) else tuple(sources)
    symbol = spec.dims[dim].symbol
    axes = {name: tuple(_axes_of(spec.tensors[name].shape, symbol)) for name in sources}
    return axes if len(sources) > 1 else {name: found[:1] for name, found in axes.items()}


def element_witness(spec: t.TypedSpec, output: str, sources: str | tuple[str, ...], dim: str, invariant: bool,
                    force: bool = False) -> tuple[bool | None, str]:
    """Exact identity for a transposition and an n-cycle at the spec's sizes (None: not attempted)."""
    n = spec.sizes[dim]
    if n < 2:
        return True, f"{dim}={n}: every permutation is the identity"
    try:
        guard(spec, force)
    except SizeGuardError as err:
        return None, str(err)
    assignments = integer_assignments(spec)
    if assignments is None:
        return None, (f"the integer buffers take {count_assignments(spec):,} values at {_sizes(spec)}, more "
                      f"than the {MAX_ASSIGNMENTS} the element level enumerates")
    for integers in assignments:
        found = _one_assignment(spec, output, sources, dim, invariant, n, integers)
        if found is not None:
            return found
    return True, (f"exact identity for a transposition and a {n}-cycle (which generate every permutation) "
                  f"at {_sizes(spec)}")


def _one_assignment(spec, output, sources, dim, invariant, n, integers):
    """(False or None, why) when the identity is not exact at one assignment of the integer buffers, else None."""
    # Only the given tensors' symbols are needed (not an ElementModel's slots and local formulas).
    leaf = {}
    for name in spec.given:
        shape = spec.concrete_shape(spec.tensors[name].shape)
        if name in integers:
            leaf[name] = exact_integers(integers[name])
            continue
        leaf[name] = np.empty(shape, dtype=object)
        for index in np.ndindex(*shape) if shape else [()]:
            leaf[name][index] = sympy.Symbol(symbol_name(name, index), real=True)
    symbol = spec.dims[dim].symbol
    ev = Evaluator(spec, SYMBOLIC)
    ev.run(leaf)
    base = np.asarray(ev.values[output], dtype=object)
    out_axes = [] if invariant else _axes_of(spec.tensors[output].shape, symbol)
    axes = permuted_axes(spec, sources, dim)
    generators = {"the transposition (1 2)": [1, 0] + list(range(2, n)),
                  f"the cycle (1 2 ... {n})": list(range(1, n)) + [0]}
    for label, perm in generators.items():
        if any(name in integers for name in axes):  # integers are values, not symbols to rename: evaluate again
            again = Evaluator(spec, SYMBOLIC)
            again.run({**leaf, **{name: _permuted(leaf[name], perm, list(a)) for name, a in axes.items()}})
            left = np.asarray(again.values[output], dtype=object)
        else:
            mapping = {}
            for name, moved_axes in axes.items():
                moved = _permuted(leaf[name], perm, list(moved_axes))
                mapping.update({old: new for old, new in zip(leaf[name].flat, moved.flat)})
            replace = shared_xreplace(mapping, known=[e for e in base.flat if isinstance(e, sympy.Basic)])
            left = np.vectorize(lambda e: replace(sympy.sympify(e)), otypes=[object])(base)
        right = _permuted(base, perm, out_axes)
        for a, b in zip(left.flat, right.flat):
            if same_entry(a, b):
                continue
            if not (settled(a) and settled(b)):  # -oo or NaN inside an expression: nothing exact to say
                return None, f"entries that hold -inf or NaN inside expressions at {_sizes(spec)}"
            return False, f"not an exact identity for {label} at {_sizes(spec)}"
    return None


def _sizes(spec: t.TypedSpec) -> str:
    return ", ".join(f"{k}={v}" for k, v in spec.sizes.items())


def search_sizes(spec: t.TypedSpec, dim: str) -> SizeChoice:
    """The sizes of the counterexample search: the spec's, unless the size guard picks smaller ones.

    The permuted dim keeps at least 2 (a permutation of one position is the identity).
    """
    return fit_sizes(spec, SEARCH_BUDGET, fixed=user_sizes(spec), at_least={dim: min(2, spec.sizes[dim])})


def _permutation_text(perm: list[int], dim: str) -> str:
    """`[2, 1, 3, 4]` (the 1-based image of each position) for a few positions; the transposition
    or the cycle by name for many (the note would otherwise list every position)."""
    if len(perm) <= 12:
        return f"{[p + 1 for p in perm]} (1-based image of each {dim} position)"
    if perm[:2] == [1, 0]:
        return f"the transposition (1 2) of the {dim} positions"
    return f"the cycle (1 2 ... {len(perm)}) of the {dim} positions"


def find_counterexample(spec: t.TypedSpec, output: str, sources: str | tuple[str, ...], dim: str,
                        invariant: bool) -> Counterexample | None:
    """A permutation and exact small inputs at which the claim visibly fails (float64 evaluation).

    It runs at `search_sizes`: the spec's sizes, or smaller ones the size guard
    picked (the counterexample's note then says so).
    """
    choice = search_sizes(spec, dim)
    if choice.shrunk:
        if reads_sizes(spec, [t.Tensor(output, spec.tensors[output].shape)]):
            return None  # at other sizes the output is another function: X * (N - 10^9) is not 0 at N = 59
        spec = dataclasses.replace(spec, sizes=choice.sizes)
    n = spec.sizes[dim]
    if n < 2:
        return None
    symbol = spec.dims[dim].symbol
    rng = np.random.default_rng(20261129)
    out_axes = [] if invariant else _axes_of(spec.tensors[output].shape, symbol)
    axes = permuted_axes(spec, sources, dim)
    perms = [[1, 0] + list(range(2, n)), list(range(1, n)) + [0]]
    for attempt in range(6):
        leaves = {name: rng.integers(-2, 3, size=spec.concrete_shape(spec.tensors[name].shape)) / 2.0
                  if spec.integer_range(name) is None else
                  rng.integers(*spec.integer_range(name), size=spec.concrete_shape(spec.tensors[name].shape))
                  for name in spec.given}
        perm = perms[attempt % 2]
        base = Evaluator(spec, NUMERIC).run(leaves)[output]
        moved = dict(leaves)
        for name, moved_axes in axes.items():
            moved[name] = _permuted(leaves[name], perm, list(moved_axes))
        left = Evaluator(spec, NUMERIC).run(moved)[output]
        right = _permuted(base, perm, out_axes)
        gap = np.abs(np.asarray(left) - np.asarray(right))
        gap = np.where(np.isnan(gap), 0.0, gap)
        scale = max(1.0, float(np.nanmax(np.abs(right))) if np.size(right) else 1.0)
        if gap.size and gap.max() > 1e-6 * scale:
            index = np.unravel_index(int(np.argmax(gap)), gap.shape)
            side = f"{output}({', '.join('Pi ' + name for name in axes)})"
            plain = f"{output}({', '.join(axes)})"
            other = plain if invariant else f"Pi {plain}"
            where = " and ".join(f"ax{'es' if len(a) > 1 else 'is'} {', '.join(map(str, a))} of {name}"
                                 for name, a in axes.items())
            extra = {"permutation": perm, "axis": next(iter(axes.values()))[0]}
            if len(axes) > 1:
                extra["axes"] = {name: list(a) for name, a in axes.items()}
            return Counterexample(
                sizes=dict(spec.sizes),
                inputs={k: np.asarray(v).tolist() for k, v in leaves.items()},
                lhs=np.asarray(left).tolist(), rhs=np.asarray(right).tolist(),
                note=(f"permutation Pi = {_permutation_text(perm, dim)} on {where}; {side} and {other} "
                      f"differ by {gap.max():.3g} at entry {list(map(int, index))} (float64 rounding is ~1e-15)"),
                extra=extra,
            )
    return None
