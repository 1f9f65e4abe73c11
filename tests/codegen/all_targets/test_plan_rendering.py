"""Defects the cross-check of the targets against each other's peers found, each against plain NumPy or torch.

- index-only score constants on the torch fused path were computed in float32 and cast;
- positions of an unfused mask were a bfloat16 arange in torch (rounding above 256: weight on future keys);
- a target whose printer could not render the plan's core fell back to the plain pass without a word.
(`verify --target triton` of a core that is an unnamed subexpression: test_triton_kernels.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.codegen.arrays import tiled
from symattn.codegen.arrays.module import load_module
from symattn.errors import CodegenError

INDEX_CONSTANT = """attention index_constant
dim N = 6, d = 3
input Q[N, d], K[N, d], V[N, d]
Dk[i:N, j:N] = 1 / (1 + (i - j) * (i - j) * 0.1)
O = softmax(Q @ K.T * Dk, axis=-1) @ V
output O
"""

# a row sum in the score keeps it unfused: the causal mask is an [N, N] array built from positions
UNFUSED_CAUSAL = """attention unfused_causal
dim N = 300, d = 4
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j <= i, 0, -inf)
P = softmax(Q @ K.T + sum(Q, axis=-1) + M, axis=-1)
O = P @ V
output O, P
"""


def _index_constant_reference(q, k, v):
    n = q.shape[-2]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    s = q @ k.swapaxes(-1, -2) * (1 / (1 + (i - j) * (i - j) * 0.1))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def test_index_only_score_constants_stay_float64_in_torch_and_numpy():
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 29, 3)) for _ in range(3))
    want = _index_constant_reference(q, k, v)
    spec = symattn.load(INDEX_CONSTANT)
    assert spec.plan().cores  # the fused path, where the constants are recomputed per block
    module = load_torch_module(spec.emit("torch"), "index_constant")
    got = module.forward(**{n: torch.from_numpy(x) for n, x in zip("QKV", (q, k, v))})["O"]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-13, atol=1e-14)
    numpy_module = load_module(spec.emit("numpy"))
    numpy_module.TILED_ABOVE, numpy_module.BLOCK_Q, numpy_module.BLOCK_K = 0, 5, 7
    np.testing.assert_allclose(numpy_module.forward(Q=q, K=k, V=v)["O"], want, rtol=1e-13, atol=1e-14)


def test_positions_of_an_unfused_mask_are_exact_in_bfloat16():
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    spec = symattn.load(UNFUSED_CAUSAL)
    assert not spec.plan().cores
    module = load_torch_module(spec.emit("torch"), "unfused_causal")
    q, k, v = (torch.randn(300, 4, dtype=torch.bfloat16) for _ in range(3))
    p = module.forward(Q=q, K=k, V=v)["P"].float()
    future = torch.arange(300)[None, :] > torch.arange(300)[:, None]
    assert torch.count_nonzero(p[future]) == 0  # no weight on a future key, at any position
    assert torch.all(p[~future] >= 0) and torch.allclose(p.sum(dim=-1), torch.ones(300), atol=2e-2)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_a_core_the_printer_cannot_render_is_an_error_not_a_silent_plain_pass(target, monkeypatch):
    if target == "torch":
        pytest.importorskip("torch", reason="the torch target needs torch")

    def refuse(*args, **kwargs):
        raise CodegenError("no block rule for the product (planted)")

    monkeypatch.setattr(tiled, "core_functions", refuse)
    with pytest.raises(CodegenError, match="cannot print the fused core the attention plan chose: no block rule"):
        symattn.load(INDEX_CONSTANT).emit(target)
