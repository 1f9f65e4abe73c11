"""Divisors of // and % read from integer buffers and from indices, on every target, against the definition.

tests/data/dilated_heads.attn masks with a per-head dilation `(i - j) % dil[g] == 0`, a per-query reach
`(j - i) // back[i] >= -1` with back < 0, and `i // (j + 1) <= 1` (a divisor that reads an index), and adds a
learned bias `slope * ((j - i) % back[i]) + 0.25 * ((j - i - 1) // dil[g])`: // and % meet every sign of
numerator and divisor, where Python's floor (`-7 // 2 == -4`, `7 // -2 == -4`, `7 % -2 == -1`) and C's truncation
differ. The reference is plain torch written here from the definition: the mask and the bias entry by entry with
Python's own `//` and `%` on ints, torch autograd for the gradients; never another target's module. The NumPy
module (its tiled pass with blocks 5 x 7, and its plain pass) and the torch module (float64), the Triton kernels
under TRITON_INTERPRET=1 and the CUDA kernels on the CPU emulation (float32) must agree with it: the output and
the gradients of Q, K, V and slope, with a batch axis, three heads, at N = 23 (no block multiple), on buffers drawn
so that dilations 1 and 3 and both reaches occur. The fused path tests such a mask per block at run time.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import symattn
from symattn.codegen.arrays.module import load_module

from conftest import DATA, run_cuda_on_cpu

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported (the Triton test below)
torch = pytest.importorskip("torch", reason="the reference is written in torch")

SPEC = DATA / "dilated_heads.attn"
B, H, N, D = 2, 3, 23, 2


def _spec():
    return symattn.load(SPEC, dims={"N": N, "h": H})


def _integers(rng):
    """dil per (batch, head) with 1 and 3 in every batch entry; back per (batch, query), -1 and -2 both drawn."""
    dil = np.array([[1, 3, 2], [3, 1, 1]])
    back = rng.integers(-2, 0, size=(B, N))
    back[:, :2] = [-1, -2]
    return {"dil": dil, "back": back}


def _mask_and_bias(dil, back):
    """The spec's mask and remainder, entry by entry with Python's // and % on ints: (keep, (j - i) % back[i]),
    each of shape [B, H, N, N]."""
    keep = np.zeros((B, H, N, N), dtype=bool)
    bias = np.zeros((B, H, N, N))
    for b in range(B):
        for g in range(H):
            d = int(dil[b, g])
            for i in range(N):
                r = int(back[b, i])
                for j in range(N):
                    keep[b, g, i, j] = (i - j) % d == 0 and (j - i) // r >= -1 and i // (j + 1) <= 1
                    bias[b, g, i, j] = (j - i) % r  # times slope
    return keep, bias


def _fixed_bias(dil):
    """0.25 * ((j - i - 1) // dil[g]) per (batch, head, i, j)."""
    out = np.zeros((B, H, N, N))
    for b in range(B):
        for g in range(H):
            for i in range(N):
                for j in range(N):
                    out[b, g, i, j] = 0.25 * ((j - i - 1) // int(dil[b, g]))
    return out


def _reference_outputs(t, integers):
    keep, remainder = _mask_and_bias(integers["dil"], integers["back"])
    fixed = torch.tensor(_fixed_bias(integers["dil"]), dtype=t["Q"].dtype)
    s = t["Q"] @ t["K"].transpose(-1, -2) / math.sqrt(D) + t["slope"] * torch.tensor(remainder, dtype=t["Q"].dtype) \
        + fixed
    s = torch.where(torch.tensor(keep), s, torch.full_like(s, -math.inf))
    top = s.amax(dim=-1, keepdim=True)  # the stable softmax; a fully masked row gives zeros (none here)
    e = torch.exp(s - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    total = e.sum(dim=-1, keepdim=True)
    return {"O": e / torch.where(total == 0, torch.ones_like(total), total) @ t["V"]}


def _case(seed=0):
    rng = np.random.default_rng(seed)
    leaves = {name: rng.standard_normal((B, H, N, D)) for name in "QKV"}
    leaves["slope"] = np.array(0.7)
    integers = _integers(rng)
    upstream = {"grad_O": rng.standard_normal((B, H, N, D))}
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in leaves.items()}
    outs = _reference_outputs(tensors, integers)
    (outs["O"] * torch.tensor(upstream["grad_O"])).sum().backward()
    want = ({"O": outs["O"].detach().numpy()}, {k: t.grad.numpy() for k, t in tensors.items()})
    return leaves, integers, upstream, want


def _check(outs, grads, want, tolerance, target):
    want_outs, want_grads = want
    for name, value in [*want_outs.items(), *want_grads.items()]:
        got = np.asarray((outs if name in want_outs else grads)[name], dtype=np.float64)
        assert got.shape == value.shape, (target, name, got.shape, value.shape)
        scale = max(np.abs(value).max(initial=0.0), 1e-3)
        error = np.abs(got - value).max(initial=0.0) / scale
        limit = tolerance if name in want_outs else tolerance * 10
        assert error <= limit, f"{target} {name}: relative error {error:.2e} > {limit:g}"


def test_the_definition_meets_every_sign_and_both_semantics():
    """The draws make the reference depend on Python's floor: C's truncation would keep other entries and give
    another bias (so a target that truncates fails below), and every row keeps its diagonal."""
    _, integers, _, _ = _case()
    keep, remainder = _mask_and_bias(integers["dil"], integers["back"])
    assert keep[:, :, np.arange(N), np.arange(N)].all()
    truncated = np.zeros_like(keep)
    for b, g, i, j in np.ndindex(*keep.shape):
        d, r = int(integers["dil"][b, g]), int(integers["back"][b, i])
        truncated[b, g, i, j] = (i - j) % d == 0 and int((j - i) / r) >= -1 and i // (j + 1) <= 1
    assert (truncated != keep).any()
    assert (remainder < 0).any() and (remainder <= 0).all()  # the sign of the divisor, not of j - i
    assert (_fixed_bias(integers["dil"]) < 0).any()


def test_the_plan_fuses_it_and_tests_the_mask_per_block():
    (core,) = _spec().plan().cores.values()
    assert core.masked_at_run_time and core.integers == {"dil", "back"}


def test_numpy_module_against_the_definition():
    leaves, integers, upstream, want = _case()
    module = load_module(_spec().emit("numpy"), "integer_divisors")
    for tiled in (True, False):
        if tiled:
            module.TILED_ABOVE, module.BLOCK_Q, module.BLOCK_K, module.THREADS = 0, 5, 7, 1
        else:
            module.TILED_ABOVE = 10 ** 9
        outs, grads = module.forward_backward(**leaves, **integers, **upstream)
        _check(outs, grads, want, 1e-9, f"numpy {'tiled' if tiled else 'plain'}")


def test_torch_module_against_the_definition():
    from symattn.codegen.torch import load_torch_module

    leaves, integers, upstream, want = _case()
    module = load_torch_module(_spec().emit("torch"), "integer_divisors_torch")
    module.BLOCK_Q, module.BLOCK_K = 5, 7
    outs, grads = module.forward_backward(**{k: torch.tensor(v) for k, v in {**leaves, **upstream}.items()},
                                          **{k: torch.from_numpy(v) for k, v in integers.items()})
    _check({k: v.numpy() for k, v in outs.items()}, {k: v.numpy() for k, v in grads.items()}, want, 1e-9, "torch")


def test_triton_kernels_against_the_definition():
    pytest.importorskip("triton", reason="the Triton target needs triton (pip install symattn[torch])")
    from symattn.check.triton import interpreting, load_module as load_triton

    if not interpreting() and not torch.cuda.is_available():
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process")
    leaves, integers, upstream, want = _case()
    module = load_triton(_spec().emit("triton").text, interpret=not torch.cuda.is_available())
    outs, grads = module.forward_backward(**{k: torch.tensor(v, dtype=torch.float32) for k, v in
                                             {**leaves, **upstream}.items()},
                                          **{k: torch.from_numpy(v) for k, v in integers.items()})
    _check({k: v.cpu().numpy() for k, v in outs.items()}, {k: v.cpu().numpy() for k, v in grads.items()}, want,
           2e-5, "triton")


@pytest.mark.slow
def test_cuda_kernels_against_the_definition(tmp_path):
    """The fp32 CUDA kernels (the fused path) built for the CPU with the emulation header, through their C API."""
    from symattn.check.cuda import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot run on the CPU")
    spec = _spec()
    assert spec.emit("cuda").path == "fused"
    leaves, integers, upstream, want = _case()
    outs, grads = run_cuda_on_cpu(spec, {**leaves, **integers}, upstream, {}, B, tmp_path)
    _check(outs, grads, want, 1e-5, "cuda")


@pytest.mark.parametrize("definition", [
    "G[i:N, c:d] = X[i // w[i], c]",
    "G[i:N, j:N, c:d] = X[j % w[i], c]",
    "G[i:N, c:d] = X[(N - 1 - i) // w[i], c]",
    "G[i:N, c:d] = X[(i - N) // w[i] + N, c]",
    "G[i:N, c:d] = X[-(i // neg[i]), c]",
    "G[i:N, c:d] = X[min(i - i % neg[i], N - 1), c]",
])
def test_gathers_through_a_buffer_divisor_on_numpy_and_torch(definition):
    """A subscript divided by a buffer's entry is shown in range (the interval rules at both ends of the
    divisor's range) and gathered, forward and backward, as plain NumPy gathers it with Python's // and %."""
    from symattn.codegen.torch import load_torch_module

    text = ("dim N = 9, d = 2\ninput X[N, d]\nbuffer w[N] in 1:N + 1\nbuffer neg[N] in -2:0\n"
            f"{definition}\noutput G\n")
    spec = symattn.load(text)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 2))
    w, neg = rng.integers(1, 10, size=9), rng.integers(-2, 0, size=9)
    i, j = np.arange(9), np.arange(9)[None, :]  # Python's // and % on NumPy's integers: floor, the divisor's sign
    row = {"X[i // w[i], c]": i // w, "X[j % w[i], c]": j % w[:, None], "X[(N - 1 - i) // w[i], c]": (8 - i) // w,
           "X[(i - N) // w[i] + N, c]": (i - 9) // w + 9, "X[-(i // neg[i]), c]": -(i // neg),
           "X[min(i - i % neg[i], N - 1), c]": np.minimum(i - i % neg, 8)}[definition.split("= ")[1]]
    want = x[row]
    upstream = rng.standard_normal(want.shape)
    grad_x = np.zeros_like(x)
    np.add.at(grad_x, row, upstream)
    module = load_module(spec.emit("numpy"), "divisor_gather")
    outs, grads = module.forward_backward(X=x, w=w, neg=neg, grad_G=upstream)
    assert np.allclose(outs["G"], want) and np.allclose(grads["X"], grad_x)
    tmod = load_torch_module(spec.emit("torch"), "divisor_gather_torch")
    outs, grads = tmod.forward_backward(X=torch.tensor(x), w=torch.tensor(w), neg=torch.tensor(neg),
                                        grad_G=torch.tensor(upstream))
    assert np.allclose(outs["G"].numpy(), want) and np.allclose(grads["X"].numpy(), grad_x)
