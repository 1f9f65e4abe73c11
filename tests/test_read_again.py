"""An attention core whose output other tensors read too: what flows back into the core is all of grad(O).

`O` and `R = O * O`, both outputs: O's gradient is its upstream gradient plus
`2 * grad(R) * O`. The tiled NumPy and torch passes and the fused CUDA kernels
passed the upstream gradient alone into the core's backward, so the gradients
of Q, K and V were wrong (by 40-150% here) while the plain pass was right.
Each target is checked against NumPy written here: the textbook attention
backward in float64 with that whole gradient (the Triton target in
`test_triton_target.py`, which alone imports triton).
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.codegen.numpy.emit import load_module

from test_tiled import inputs, reference, tiled

HEAD = """
attention {name}
dim N = 8, d = 4
input Q[N, d], K[N, d], V[N, d]
"""

READ_AGAIN = HEAD.format(name="read_again") + """O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
R = O * O
output O, R
"""


def _attention(q, k, v):
    s = q @ k.swapaxes(-1, -2) / 2
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("blocks", [(4, 4), (5, 7), (64, 64)])
def test_an_output_read_again_against_numpy(blocks):
    """O and R = O * O: grad(O) as a whole is grad_O + 2 * grad_R * O (the textbook backward below)."""
    q, k, v, go = inputs(n=23, batch=(2,))
    gr = np.random.default_rng(5).standard_normal(go.shape)
    o = _attention(q, k, v)
    want = reference(q, k, v, go + 2 * gr * o, None, None)
    mod = load_module(symattn.load(READ_AGAIN).emit("numpy"))
    for module in (mod, tiled(load_module(symattn.load(READ_AGAIN).emit("numpy")), *blocks)):
        outs, grads = module.forward_backward(Q=q, K=k, V=v, grad_O=go, grad_R=gr)
        np.testing.assert_allclose(outs["O"], o, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(outs["R"], o * o, rtol=1e-10, atol=1e-12)
        for got, expected in zip((grads["Q"], grads["K"], grads["V"]), want[1:]):
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def _read_again_case(n=23):
    q, k, v, go = inputs(n=n, batch=(2,))
    gr = np.random.default_rng(5).standard_normal(go.shape)
    o = _attention(q, k, v)
    return (q, k, v, go, gr), (o, o * o, *reference(q, k, v, go + 2 * gr * o, None, None)[1:])


def test_an_output_read_again_torch():
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    (q, k, v, go, gr), want = _read_again_case()
    module = load_torch_module(symattn.load(READ_AGAIN).emit("torch"), "read_again")
    outs, grads = module.forward_backward(**{n: torch.from_numpy(x) for n, x in zip(
        ("Q", "K", "V", "grad_O", "grad_R"), (q, k, v, go, gr))})
    for got, expected in zip((outs["O"], outs["R"], grads["Q"], grads["K"], grads["V"]), want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)
    # through autograd, as training runs it
    tensors = {n: torch.from_numpy(x).requires_grad_() for n, x in zip("QKV", (q, k, v))}
    got = module.forward(**tensors)
    ((got["O"] * torch.from_numpy(go)).sum() + (got["R"] * torch.from_numpy(gr)).sum()).backward()
    for n, expected in zip("QKV", want[2:]):
        np.testing.assert_allclose(tensors[n].grad.numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_an_output_read_again_cuda():
    from symattn.check.cuda import find_cxx, verify_cuda

    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot run on the CPU")
    report = verify_cuda(symattn.load(READ_AGAIN).typed, tsan=False, gate=False, tensor_cores=False, head_dims=False)
    assert report.ok, "\n".join(report.lines())
