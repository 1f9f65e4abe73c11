"""`score_forms.linear_score`: which scores the tensor-core forward folds into one FFMA (c * (Q @ K.T) + b, c > 0).

The forms found (and refused) here are checked by structure; the kernels that use them are checked
numerically against plain NumPy in tests/codegen/cuda/test_cuda_tensor_core.py."""

from __future__ import annotations

import pytest
import sympy

import symattn
from symattn.codegen.cuda import emit_cuda
from symattn.codegen.cuda.score_forms import linear_score
from symattn.ir import typed as t

HEAD = "dim N = 6, d = 4\ninput Q[N, d], K[N, d], V[N, d]\n"


def _core(score: str, extra: str = ""):
    spec = symattn.load(f"attention forms\n{HEAD}{extra}O = softmax({score}, axis=-1) @ V\noutput O\n")
    (forward,) = emit_cuda(spec).plan.tensor_cores
    return forward.core


@pytest.mark.parametrize("score,scale,bias", [
    ("Q @ K.T", None, False),
    ("Q @ K.T / sqrt(d)", "1.0f / sqrtf((float)d)", False),
    ("2 * (Q @ K.T) / sqrt(d) + M", "2.0f / sqrtf((float)d)", True),
    ("(Q @ K.T + M) / 3", "1.0f / 3.0f", True),
    ("Q @ K.T / sqrt(d) - M", "1.0f / sqrtf((float)d)", True),
])
def test_linear_forms_are_found(score, scale, bias):
    core = _core(score, "M[i:N, j:N] = where(j <= i, 0, -inf)\n")
    found = linear_score(core.score, core.product)
    assert found is not None
    assert (found.scale is None) == (scale is None) and (found.bias is not None) == bias


@pytest.mark.parametrize("score", [
    "5 * tanh(Q @ K.T / 5)",          # not linear
    "-(Q @ K.T)",                     # c < 0: the max of x would pick the smallest score
    "M - Q @ K.T",
    "(Q @ K.T) * (0 - 2)",
])
def test_other_scores_keep_the_general_softmax(score):
    core = _core(score, "M[i:N, j:N] = where(j <= i, 0, -inf)\n")
    assert linear_score(core.score, core.product) is None


def test_a_scale_read_from_a_tensor_is_not_folded():
    """c must be computable on the host from the dims alone: exp of a scalar tensor is left to the score."""
    core = _core("Q @ K.T")
    tau = t.Tensor("tau", ())
    for factor in (t.Unary("exp", tau, ()), tau, t.Unary("sqrt", tau, ())):
        score = t.Binary("mul", core.product, factor, core.product.shape)
        assert linear_score(score, core.product) is None
    dims = t.Unary("exp", t.DimValue(sympy.Symbol("d")), ())
    assert linear_score(t.Binary("mul", core.product, dims, core.product.shape), core.product) is not None


def test_the_generated_forward_uses_one_ffma_for_causal():
    code = emit_cuda(_load_causal())
    text = code.files[code.source_name]
    assert "sa_ex2_approx(fmaf(s_acc_[g_][n_][e_], scale_, -base_[e_ >> 1]))" in text
    assert "const float scale_ = c_ * LOG2E;" in text
    assert "return SYMATTN_UNSUPPORTED;" in text.split("c_ > 0.0f && ")[1].split("\n")[0]


def _load_causal():
    return symattn.load("attention c\n" + HEAD + "M[i:N, j:N] = where(j <= i, 0, -inf)\n"
                        "O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V\noutput O\n")
