"""`plan.linear` and `plan.split_mask`: the forms of a core's score every target reads.

`split_mask` takes a mask out of the score (score = where(keep, value, -inf)); `linear` finds c * s + b with
c a positive constant in the kept value, which the tensor-core forward folds into one FFMA and the NumPy and
torch targets into a scale of the queries. The forms found (and refused) are checked by structure here; the
kernels that use them are checked numerically against plain NumPy and torch in the target tests."""

from __future__ import annotations

import pytest
import sympy

import symattn
from symattn.codegen.plan import ProductEntry, attention_plan, linear
from symattn.ir import typed as t

HEAD = "dim N = 6, d = 4\ninput Q[N, d], K[N, d], V[N, d]\n"
EXTRA = "M[i:N, j:N] = where(j <= i, 0, -inf)\nB[i:N, j:N] = (j - i) * 0.5\n"


def _core(score: str, extra: str = EXTRA):
    spec = symattn.load(f"attention forms\n{HEAD}{extra}O = softmax({score}, axis=-1) @ V\noutput O\n")
    (core,) = attention_plan(spec.typed).cores.values()
    return core


@pytest.mark.parametrize("score,scaled,bias,masked", [
    ("Q @ K.T", False, False, False),
    ("Q @ K.T / sqrt(d)", True, False, False),
    ("2 * (Q @ K.T) / sqrt(d) + B", True, True, False),
    ("(Q @ K.T + B) / 3", True, True, False),
    ("Q @ K.T / sqrt(d) - B", True, True, False),
    ("Q @ K.T / sqrt(d) + M", True, False, True),    # the mask is taken out into keep
    ("(Q @ K.T + M) / 3", True, False, True),          # a positive scale keeps -inf -inf
    ("Q @ K.T / sqrt(d) + B + M", True, True, True),
])
def test_linear_forms_are_found(score, scaled, bias, masked):
    core = _core(score)
    found = linear(core.value)
    assert found is not None
    assert (found.scale is not None) == scaled and (found.bias is not None) == bias
    assert (core.keep is not None) == masked


@pytest.mark.parametrize("score", [
    "5 * tanh(Q @ K.T / 5)",          # not linear
    "-(Q @ K.T)",                     # c < 0: the max of x would pick the smallest score
    "B - Q @ K.T",
    "(Q @ K.T) * (0 - 2)",
])
def test_other_scores_keep_the_general_softmax(score):
    assert linear(_core(score).value) is None


def test_a_masked_subtrahend_is_not_split():
    """s - M with M -inf where masked is +inf there, not -inf: no mask is taken out, and no linear form has
    a bias of -inf silently turned into a mask."""
    core = _core("Q @ K.T - M")
    assert core.keep is None


def test_a_scale_read_from_a_tensor_is_not_folded():
    """c must be computable on the host from the dims alone: exp of a scalar tensor is left to the score."""
    tau = t.Entry("tau", ())
    for factor in (t.Unary("exp", tau, ()), tau, t.Unary("sqrt", tau, ())):
        assert linear(t.Binary("mul", ProductEntry(), factor, ())) is None
    dims = t.Unary("exp", t.DimValue(sympy.Symbol("d")), ())
    assert linear(t.Binary("mul", ProductEntry(), dims, ())) is not None
