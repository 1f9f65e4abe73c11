"""An attention core whose output other tensors read too: what flows back into the core is all of grad(O).

`O` and `R = O * O`, both outputs: O's gradient is its upstream gradient plus
`2 * grad(R) * O`. The tiled NumPy and torch passes and the fused CUDA kernels
passed the upstream gradient alone into the core's backward, so the gradients
of Q, K and V were wrong (by 40-150% here) while the plain pass was right.
Each target is checked against NumPy written here: the textbook attention
backward in float64 with that whole gradient (the Triton target in
`test_triton_kernels.py`, which alone imports triton).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import symattn
from symattn.codegen.numpy.emit import load_module

from test_numpy_tiled import inputs, reference, tiled

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


# An output that another core reads: its core's backward gets grad_O plus that core's fused part, never
# an [N, N] softmax of the derivation's own path.
READ_BY_A_CORE = {
    "value": HEAD.format(name="value") + """A = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
B = softmax(Q @ K.T / sqrt(d), axis=-1) @ A
output A, B
""",
    "self": HEAD.format(name="self") + """O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
R = softmax(O @ O.T / sqrt(d), axis=-1) @ O
output O, R
""",
}
# and an output that is no core's, read by a core: its paths' sum, written out in grad(Q) and grad(W), held
# the reading core unfused
LINEAR = HEAD.format(name="linear") + """param W[d, d]
O = Q @ W
R = softmax(O @ K.T / sqrt(d), axis=-1) @ V
output O, R
"""


def _plain_numpy(name, q, k, v, g1, g2):
    """The two cores and their gradients by the textbook backward, in float64."""
    def attend(a, b, c):
        s = a @ b.swapaxes(-1, -2) / 2
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True)

    def back(p, a, b, c, do):  # (da, db, dc) of softmax(a @ b.T / 2) @ c
        dp = do @ c.swapaxes(-1, -2)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / 2
        return ds @ b, ds.swapaxes(-1, -2) @ a, p.swapaxes(-1, -2) @ do

    p1 = attend(q, k, v)
    first = p1 @ v
    if name == "value":
        p2 = attend(q, k, first)
        second = p2 @ first
        dq2, dk2, dfirst = back(p2, q, k, first, g2)
        dq, dk, dv = back(p1, q, k, v, g1 + dfirst)
        return (first, second), (dq + dq2, dk + dk2, dv)
    p2 = attend(first, first, first)
    second = p2 @ first
    dfirst = sum(back(p2, first, first, first, g2))
    return (first, second), back(p1, q, k, v, g1 + dfirst)


@pytest.mark.parametrize("name", READ_BY_A_CORE)
def test_an_output_read_by_another_core(name):
    q, k, v, g1 = inputs(n=23, batch=(2,))
    g2 = np.random.default_rng(7).standard_normal(g1.shape)
    (first, second), want = _plain_numpy(name, q, k, v, g1, g2)
    source = symattn.load(READ_BY_A_CORE[name]).emit("numpy")
    outs = list(READ_BY_A_CORE[name].split("output ")[1].strip().split(", "))
    for blocks in ((4, 4), (5, 7)):
        outputs, grads = tiled(load_module(source), *blocks).forward_backward(
            Q=q, K=k, V=v, **{f"grad_{outs[0]}": g1, f"grad_{outs[1]}": g2})
        np.testing.assert_allclose(outputs[outs[0]], first, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(outputs[outs[1]], second, rtol=1e-10, atol=1e-12)
        for got, expected in zip((grads["Q"], grads["K"], grads["V"]), want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11)
    tiled_pass = source[source.index("def _forward_backward_tiled"):]
    assert "_softmax" not in tiled_pass.split("\ndef _as_float")[0]  # both cores stay fused


@pytest.mark.slow  # two passes at N = 4096 (5 s each)
@pytest.mark.parametrize("threads", [1, 2])
def test_an_output_read_by_another_core_keeps_memory_linear(threads):
    """The chain with both outputs takes about what it takes with the second output alone, and grows
    about 4 times from N = 1024 to 4096 (one [N, N] array grows 16 times)."""
    peaks = {}
    cases = [("A, B", READ_BY_A_CORE["value"]), ("B", READ_BY_A_CORE["value"].replace("output A, B", "output B")),
             ("O, R", LINEAR)]
    for outputs, text in cases:
        module = load_module(symattn.load(text).emit("numpy"))
        module.TILED_ABOVE, module.THREADS = 0, threads
        for n in (1024, 4096):
            q, k, v, g = inputs(n=n, d=16, batch=(), dtype=np.float32)
            leaves = dict(Q=q, K=k, V=v, **({"W": np.eye(16, dtype=np.float32)} if "param W" in text else {}))
            upstream = {f"grad_{o}": g for o in outputs.split(", ")}
            module.forward_backward(**leaves, **upstream)
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            module.forward_backward(**leaves, **upstream)
            peaks[outputs, n] = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
    assert peaks["A, B", 4096] < 1.5 * peaks["B", 4096] + (1 << 20), peaks
    assert peaks["A, B", 4096] < 8 * peaks["A, B", 1024], peaks
    assert peaks["O, R", 4096] < 8 * peaks["O, R", 1024], peaks


def test_an_output_read_by_another_core_cuda_plan_stores_no_attention_matrix():
    from symattn.codegen.cuda import emit_cuda

    for text in [*READ_BY_A_CORE.values(), LINEAR]:
        plan = emit_cuda(symattn.load(text).typed).plan
        assert len(plan.cores) == (1 if text == LINEAR else 2)
        square = [b.name for b in plan.workspace if len(b.shape) >= 2 and str(b.shape[-1]) == str(b.shape[-2]) == "N"]
        assert not square, square


@pytest.mark.slow
@pytest.mark.parametrize("name", [*READ_BY_A_CORE, "linear"])
def test_an_output_read_by_another_core_cuda(name):
    """The fp32 kernels and the tensor-core ones (for "self", one tensor is q, k and v of the second core:
    the check's inputs give the three roles one array)."""
    from symattn.check.cuda import find_cxx, verify_cuda

    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot run on the CPU")
    text = LINEAR if name == "linear" else READ_BY_A_CORE[name]
    report = verify_cuda(symattn.load(text).typed, tsan=False, gate=False, head_dims=False)
    assert report.ok, "\n".join(report.lines())


@pytest.mark.slow
def test_an_output_read_again_cuda():
    from symattn.check.cuda import find_cxx, verify_cuda

    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot run on the CPU")
    report = verify_cuda(symattn.load(READ_AGAIN).typed, tsan=False, gate=False, tensor_cores=False, head_dims=False)
    assert report.ok, "\n".join(report.lines())


def test_tensor_core_sizes_keep_the_spec_valid():
    """The tensor-core check sets a core's head dim (d = 32, 64, 128) and moves the other dims so that the
    sizes stay valid: with h = 3 heads of split_heads(O, h), d = 32 would not divide (the host function
    returned SYMATTN_BAD_SIZE and the TSan driver an internal error)."""
    import sympy

    from symattn.check.cuda_tensor_core import head_dim_sizes
    from symattn.codegen.cuda import emit_cuda
    from symattn.ir.sizes import valid_sizes

    text = HEAD.format(name="split_read").replace("dim N = 8, d = 4", "dim N = 8, d = 4, h = 2") + """\
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
S = split_heads(O, h)
Kh = split_heads(K, h)
R = softmax(S @ Kh.T / sqrt(d), axis=-1) @ S
output O, R
"""
    spec = symattn.load(text).typed
    for forward in emit_cuda(spec).plan.tensor_cores:
        for head_dim in (32, 64, 128):
            sizes = head_dim_sizes(spec, forward.core, {"N": 67, "d": 15, "h": 3}, head_dim)
            assert isinstance(sizes, dict), sizes
            assert valid_sizes(spec, sizes)
            subs = {sympy.Symbol(n, positive=True, integer=True): v for n, v in sizes.items()}
            assert sympy.sympify(forward.core.d_qk).subs(subs) == head_dim
