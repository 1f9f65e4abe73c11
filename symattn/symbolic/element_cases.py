"""What the element level tries when a plain exact comparison does not settle a claim.

Contract: two ways, each sound on its own (a proof of what they compare is a
proof of the claim).

Masks as structure: `mask_cases(model)` is, for an `ElementModel` whose masks are computed
from buffers (`Mk = where(keep > 0, 0, -inf)`), one `ElementModel` per case of
those comparisons (`keep_2 > 0` true or false, each independently), or [] when
there are none or more than MAX_ATOMS of them. In a case every mask entry is
exactly 0 or -oo, so every entry is settled exactly: a masked score is -oo, its
weight exactly 0, a row whose keys are all masked has softmax 0 and logsumexp
-oo, and the chain rule reads a masked entry as the constant -oo (a fully masked
row's weights do not move with the scores, so their gradient is 0, as the
derived formula P * (dP - sum(dP * P)) gives). The cases cover every point:
each comparison is true or false there, and the cases include those that no
values of the buffers realise (two comparisons of one entry), where proving
the claim as well costs nothing. `identical_in_every_case(model, sides,
unfold_grads)` is exact identity in each case, `sides(case_model)` giving the
two arrays to compare there (entries of the claim, or a derived gradient and
the chain rule's); its answer is True only when every case is shown.

Free tensors in place of polynomial intermediates, a stronger claim: `generalized(spec)` is the spec with each *polynomial* intermediate
that a nonlinear definition reads made an input (its definition dropped), with
the names of those tensors, or None when there is none. A tensor is polynomial
when its definition uses only `+ - *`, `@`, transposes, slices, concats, sums,
means, numbers and dims on given tensors and other polynomial tensors (Q = X @
W_q, K, V): its entries are polynomials in the given entries, finite for
finite inputs.

Why: the element level compares values that may be NaN region by region, and
needs to tell where a divisor or a sqrt argument is 0 (`symattn.symbolic.signs`).
For `sum(Q * Q, axis=-1)` with Q an input that is "row i of Q is 0"; with
`Q = X @ W_q` it is the zero set of a sum of squares of bilinear forms, which
it cannot tell. A claim whose two sides read Q (and the gradients derived from
it) the same way, shown equal for every value of a free Q, holds in particular
for Q = X @ W_q: every point of the original domain is a point of the
generalized one (the free entries take the values X @ W_q has there). So a
proof of the generalized claim is a proof of the claim; a failure says nothing
(the claim may need Q = X @ W_q). Gradients are the derived formulas, as in the
element level's comparison, so grad(Q) is the same expression either way.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import numpy as np
import sympy

from ..budget import checkpoint
from ..ir import typed as t
from .element import ElementModel

__all__ = ["MAX_ATOMS", "mask_atoms", "mask_cases", "identical_in_every_case", "generalized", "polynomial"]

MAX_ATOMS = 6  # comparisons split into cases: at most 2 ** 6 element models


def mask_atoms(model: ElementModel) -> list[sympy.Basic]:
    """The comparisons of buffer entries that the masked (possibly -oo) entries depend on."""
    spec = model.spec
    buffers = {s for name, info in spec.tensors.items() if info.kind == "buffer" for s in model.leaf[name].flat}
    found: set = set()
    for value in model.exact_values.values():
        if isinstance(value, sympy.Basic) and value.has(sympy.oo, -sympy.oo):
            for atom in value.atoms(sympy.core.relational.Relational):
                if atom.free_symbols and atom.free_symbols <= buffers:
                    found.add(atom)
    return sorted(found, key=sympy.default_sort_key)


def mask_cases(model: ElementModel) -> list[ElementModel]:
    """One element model per case of the mask comparisons (cached on the model)."""
    cached = getattr(model, "mask_case_models", None)
    if cached is not None:
        return cached
    atoms = mask_atoms(model)
    models: list[ElementModel] = []
    if atoms and len(atoms) <= MAX_ATOMS:
        for truth in itertools.product((sympy.true, sympy.false), repeat=len(atoms)):
            checkpoint()
            models.append(ElementModel(model.spec, force=True, progress=False, case=dict(zip(atoms, truth))))
    model.mask_case_models = models
    return models


def identical_in_every_case(model: ElementModel, sides: Callable[[ElementModel], tuple[np.ndarray, np.ndarray]],
                            nodes: tuple = (), unfold_grads: bool = True) -> int:
    """The number of mask cases when `sides` agree exactly in each of them, 0 when not shown.
    `nodes`: what the sides read; a case where a mask they read is still undecided (one of inputs,
    which no case of the buffers decides) shows nothing."""
    models = mask_cases(model)
    for case in models:
        if nodes and case.undecided_masks(nodes):
            return 0
        a, b = sides(case)
        same, _ = case.identical(a, b, unfold_grads=unfold_grads)
        if not same:
            return 0
    return len(models)


# --- free tensors in place of polynomial intermediates ------------------------------------

_LINEAR = (t.MatMul, t.Transpose, t.Slice, t.Concat, t.SumTo, t.MergeHeads, t.SplitHeads, t.Scan)


def polynomial(node: t.Node, poly: set[str]) -> bool:
    """Whether `node` is a polynomial of given tensors and of the tensors named in `poly`."""
    if isinstance(node, t.Tensor):
        return node.name in poly
    if isinstance(node, (t.Scalar, t.DimValue)):
        return node.value.is_finite is not False if isinstance(node, t.Scalar) else True
    if isinstance(node, t.Constant):
        return node.kind in ("ones", "eye")
    if isinstance(node, t.Unary):
        return node.fn == "neg" and polynomial(node.x, poly)
    if isinstance(node, t.Binary):
        return node.op in ("add", "sub", "mul") and polynomial(node.a, poly) and polynomial(node.b, poly)
    if isinstance(node, t.Reduce):
        return node.kind in ("sum", "mean") and polynomial(node.x, poly)
    if isinstance(node, _LINEAR):
        return all(polynomial(c, poly) for c in node.children)
    return False


def generalized(spec: t.TypedSpec) -> tuple[t.TypedSpec, tuple[str, ...]] | None:
    """(the spec with polynomial intermediates read by nonlinear definitions made inputs, their
    names), or None (see the module docstring)."""
    poly = set(spec.given)
    for name, info in spec.tensors.items():
        if info.expr is not None and polynomial(info.expr, poly):
            poly.add(name)
    freed = []
    for name, info in spec.tensors.items():
        if info.expr is None or name not in poly or name in spec.outputs:
            continue
        readers = [other for other, o in spec.tensors.items() if o.expr is not None and name in t.tensors_read(o.expr)]
        if any(reader not in poly for reader in readers):
            freed.append(name)
    if not freed:
        return None
    tensors = {name: (dataclasses.replace(info, kind="input", expr=None) if name in freed else info)
               for name, info in spec.tensors.items()}
    return dataclasses.replace(spec, tensors=tensors), tuple(freed)
