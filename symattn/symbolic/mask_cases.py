"""Masks as structure: the element level split into the cases of the comparisons that mask entries.

Contract: `mask_cases(model)` is, for an `ElementModel` whose masks are computed
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
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import sympy

from ..budget import checkpoint
from .element import ElementModel

__all__ = ["MAX_ATOMS", "mask_atoms", "mask_cases", "identical_in_every_case"]

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
                            unfold_grads: bool = True) -> int:
    """The number of mask cases when `sides` agree exactly in each of them, 0 when not shown."""
    models = mask_cases(model)
    for case in models:
        a, b = sides(case)
        same, _ = case.identical(a, b, unfold_grads=unfold_grads)
        if not same:
            return 0
    return len(models)
