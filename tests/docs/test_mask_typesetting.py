"""The mask language typeset as papers write it: floor division as ⌊a/b⌋, the remainder as \\bmod, conditions
joined by ∧ ∨ ¬, exp2 as a power of 2, log2 with its base, subscripts through integer buffers as nested
subscripts. The expected LaTeX is written out by hand here."""

from __future__ import annotations

import pytest

import symattn
from symattn.docs.mathbox import LatexPrinter
from symattn.docs.mathprint import definition_box

SPEC = """\
dim N = 4, D = 2, W = 2
input X[N, 1]
buffer doc[N] in 0:D
buffer offsets[D] in 0:N
A[i:N, j:N] = where((doc[i] == doc[j]) & ~(j > i), 0, -inf)
B[i:N, j:N] = where((i // W == j // W) | (i % W == 0), 0, -inf)
C[i:N, j:N] = exp2(-(i - offsets[doc[i]])) + log2(abs(i - j) + 1)
E[i:N, j:N] = min(i, j) + clamp(X[i, 0], -1, 1) + floor(X[j, 0])
O = X
output O
"""

EXPECTED = {
    "A": "\\operatorname{where}\\left(\\left(doc_{i}=doc_{j}\\right)\\wedge\\neg \\left(j>i\\right), 0, -\\infty\\right)",
    "B": "\\operatorname{where}\\left(\\left(\\left\\lfloor i/W\\right\\rfloor =\\left\\lfloor j/W\\right\\rfloor "
         "\\right)\\vee\\left(i\\bmod W=0\\right), 0, -\\infty\\right)",
    "C": "2^{-\\left(i-offsets_{doc_{i}}\\right)}+\\log_{2}\\left(\\left|i-j\\right|+1\\right)",
    "E": "\\min\\left(i, j\\right)+\\operatorname{clamp}\\left(X_{i,0}, -1, 1\\right)+\\left\\lfloor X_{j,0}"
         "\\right\\rfloor ",
}


@pytest.mark.parametrize("name", EXPECTED)
def test_each_construct_is_typeset(name):
    spec = symattn.load(SPEC).typed
    latex = LatexPrinter().render(definition_box(name, spec.tensors[name], list(spec.dims)))
    assert latex == f"{name}_{{i,j}}={EXPECTED[name]}"
