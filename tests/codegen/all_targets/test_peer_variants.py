"""Attention variants from attention-gym, flash-attention's tests and FlexAttention's, on every target.

Each variant is a reference spec in derivations/ and, here, a plain dense torch reference written from the
peer's own definition (a bias table gathered, a mask built as a boolean matrix, K repeated over the query
heads): never another target's module. The attention plan fuses every one of them; each target's module
(NumPy's tiled pass, torch's, Triton's kernels under the interpreter, and in the slow step the CUDA kernels
on the CPU) must agree with the reference in float64 (float32 for Triton and CUDA), outputs and the gradient
of every input and param, at sizes that are not multiples of the blocks and with a batch axis; the torch and
Triton modules in bfloat16 too, against the reference run in bfloat16 (Triton's in
tests/codegen/triton/test_triton_peer_variants.py, which sets the interpreter up before triton's import).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import symattn
from symattn.codegen.arrays.module import load_module

from conftest import REPO, run_cuda_on_cpu

torch = pytest.importorskip("torch", reason="the dense references are written in torch")

N, M, B = 37, 41, 2  # queries, keys (where they differ), batch entries: no multiple of any block


def _softmax(s):
    """The stable softmax with a fully masked row giving zeros (the targets' convention, DESIGN.md)."""
    top = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _causal(n, m, offset=0):
    i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
    return j <= i + offset


def _masked(s, keep):
    return torch.where(keep, s, torch.full_like(s, -math.inf))


def _heads(x, w):  # X [b, N, d] @ W [h, d, k] -> [b, h, N, k]
    return torch.einsum("bnd,hdk->bhnk", x, w)


# name -> (shapes of the given tensors (batch axis on inputs and buffers added), reference(t) -> outputs)
def _mqa(t):
    q, k, v = (_heads(t["X"], t[w]) for w in ("W_q", "W_k", "W_v"))
    k, v = k.expand_as(q), v.expand_as(q)  # the one key/value head repeated for every query head
    return {"O": _softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])) @ v}


def _t5(t):
    q, k, v = (_heads(t["X"], t[w]) for w in ("W_q", "W_k", "W_v"))
    n = q.shape[-2]
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None] + n - 1
    bias = t["Bt"][:, offset]  # [h, N, N]: the table read at j - i + N - 1
    return {"O": _softmax(_masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, _causal(n, n))) @ v}


def _relative(t):
    q, k, v = (t["X"] @ t[w] for w in ("W_q", "W_k", "W_v"))
    n = q.shape[-2]
    bias = t["b"][torch.arange(n)[None, :] - torch.arange(n)[:, None] + n - 1]  # [N, N]
    return {"O": _softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias) @ v}


def _alibi_learned(t):
    q, k, v = (_heads(t["X"], t[w]) for w in ("W_q", "W_k", "W_v"))
    n = q.shape[-2]
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().to(q.dtype)
    bias = -t["m"][:, None, None] * distance
    return {"O": _softmax(_masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, _causal(n, n))) @ v}


def _padding(t):
    q, k, v = (t["X"] @ t[w] for w in ("W_q", "W_k", "W_v"))
    real = t["real"] > 0  # [b, N]
    keep = real[:, None, :] & real[:, :, None]  # key j and query i both real
    return {"O": _softmax(_masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), keep)) @ v}


def _mla(t):
    qc, kc, qr, kr, v = (_heads(t["X"], t[w]) for w in ("W_qc", "W_kc", "W_qr", "W_kr", "W_v"))
    s = (qc @ kc.transpose(-1, -2) + qr @ kr.transpose(-1, -2)) / math.sqrt(qc.shape[-1] + qr.shape[-1])
    return {"O": _softmax(s) @ v}


def _lse(t):
    s = t["Q"] @ t["K"].transpose(-1, -2) / math.sqrt(t["Q"].shape[-1])
    return {"O": _softmax(s) @ t["V"], "L": torch.logsumexp(s, dim=-1, keepdim=True)}


def _dropout(t):
    q, k, v = (t["X"] @ t[w] for w in ("W_q", "W_k", "W_v"))
    p = _softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
    return {"O": (p * t["Z"] / 0.9) @ v}


def _prefix_lm(t, prefix=7):
    q, k, v = (t["X"] @ t[w] for w in ("W_q", "W_k", "W_v"))
    n = q.shape[-2]
    keep = _causal(n, n) | (torch.arange(n)[None, :] < prefix)
    return {"O": _softmax(_masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), keep)) @ v}


def _bottom_right(t):
    n, m = t["Q"].shape[-2], t["K"].shape[-2]
    s = t["Q"] @ t["K"].transpose(-1, -2) / math.sqrt(t["Q"].shape[-1])
    return {"O": _softmax(_masked(s, _causal(n, m, m - n))) @ t["V"]}


def _gqa(t):
    q, k, v = (torch.einsum("bnd,grdk->bgrnk", t["X"], t[w]) for w in ("W_q", "W_k", "W_v"))
    k, v = k.expand_as(q), v.expand_as(q)
    return {"O": _softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])) @ v}


VARIANTS = {
    "mqa": ({"X": (N, 8), "W_q": (3, 8, 4), "W_k": (1, 8, 4), "W_v": (1, 8, 4)}, _mqa, {}),
    "gqa": ({"X": (N, 8), "W_q": (2, 2, 8, 4), "W_k": (2, 1, 8, 4), "W_v": (2, 1, 8, 4)}, _gqa, {}),
    "t5_bias": ({"X": (N, 6), "W_q": (2, 6, 4), "W_k": (2, 6, 4), "W_v": (2, 6, 4), "Bt": (2, 2 * N - 1)}, _t5, {}),
    "relative_bias": ({"X": (N, 5), "W_q": (5, 4), "W_k": (5, 4), "W_v": (5, 4), "b": (2 * N - 1,)}, _relative, {}),
    "alibi_learned": ({"X": (N, 6), "W_q": (2, 6, 4), "W_k": (2, 6, 4), "W_v": (2, 6, 4), "m": (2,)},
                      _alibi_learned, {}),
    "padding_qk": ({"X": (N, 5), "W_q": (5, 4), "W_k": (5, 4), "W_v": (5, 4), "real": (N,)}, _padding, {}),
    "mla": ({"X": (N, 6), **{w: (2, 6, 3) for w in ("W_qc", "W_kc", "W_qr", "W_kr", "W_v")}}, _mla, {}),
    "lse_output": ({"Q": (N, 5), "K": (M, 5), "V": (M, 5)}, _lse, {}),
    "dropout_mask": ({"X": (N, 5), "W_q": (5, 4), "W_k": (5, 4), "W_v": (5, 4), "Z": (N, N)}, _dropout, {}),
    "prefix_lm": ({"X": (N, 5), "W_q": (5, 4), "W_k": (5, 4), "W_v": (5, 4)}, _prefix_lm, {"L": 7}),
    "causal_bottom_right": ({"Q": (N, 4), "K": (M, 4), "V": (M, 4)}, _bottom_right, {}),
}


def _spec(name):
    return symattn.load(REPO / "derivations" / f"{name}.attn")


def _leaves(name, seed=0):
    """float64 numpy values of the given tensors (inputs and buffers with a batch axis), and upstream gradients."""
    spec = _spec(name).typed
    rng = np.random.default_rng(seed)
    shapes, reference, sizes = VARIANTS[name]
    leaves = {}
    for leaf, shape in shapes.items():
        info = spec.tensors[leaf]
        batch = (B,) if info.kind != "param" else ()
        value = rng.standard_normal(batch + shape)
        if leaf == "real":  # padding, one batch entry with a fully padded stretch, every row kept by one key
            value = np.where(rng.random(batch + shape) < 0.3, -1.0, 1.0)
            value[1, 10:20] = -1.0
        if leaf == "Z":
            value = (rng.random(batch + shape) < 0.8).astype(np.float64)
        leaves[leaf] = value
    outs = reference({k: torch.from_numpy(v) for k, v in leaves.items()})
    upstream = {f"grad_{o}": rng.standard_normal(tuple(x.shape)) for o, x in outs.items()}
    return leaves, upstream, sizes


def _reference(name, leaves, upstream, dtype=torch.float64):
    """Outputs and the gradient of every input and param of the dense torch reference (autograd)."""
    spec = _spec(name).typed
    tensors = {k: torch.tensor(v, dtype=dtype, requires_grad=spec.tensors[k].kind != "buffer")
               for k, v in leaves.items()}
    outs = VARIANTS[name][1](tensors)
    loss = sum((outs[o] * torch.tensor(upstream[f"grad_{o}"], dtype=dtype)).sum() for o in outs)
    loss.backward()
    grads = {k: t.grad for k, t in tensors.items() if t.grad is not None}
    return {o: x.detach() for o, x in outs.items()}, grads


def _close(got, want, tolerance, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.array_equal(np.isfinite(got), np.isfinite(want)), what
    finite = np.isfinite(want)
    scale = max(np.abs(want[finite]).max(initial=0.0), 1e-3)
    error = np.abs(got[finite] - want[finite]).max(initial=0.0) / scale
    assert error <= tolerance, f"{what}: relative error {error:.2e} > {tolerance:g}"


def _check(name, outs, grads, want_outs, want_grads, tolerance, target):
    for o, want in want_outs.items():
        _close(outs[o], want, tolerance, f"{name} {target} {o}")
    for leaf, want in want_grads.items():
        _close(grads[leaf], want, tolerance * 10, f"{name} {target} grad({leaf})")


def test_the_plan_fuses_every_variant():
    for name in VARIANTS:
        plan = _spec(name).plan()
        assert len(plan.cores) == 1 and not plan.notes, (name, plan.notes)


@pytest.mark.parametrize("name", VARIANTS)
def test_numpy_tiled_pass_against_the_dense_reference(name):
    leaves, upstream, sizes = _leaves(name)
    want = _reference(name, leaves, upstream)
    module = load_module(_spec(name).emit("numpy"), f"peer_{name}")
    module.TILED_ABOVE, module.BLOCK_Q, module.BLOCK_K, module.THREADS = 0, 5, 7, 2
    outs, grads = module.forward_backward(**leaves, **upstream, **sizes)
    _check(name, outs, grads, *want, 1e-9, "numpy")


@pytest.mark.parametrize("name", VARIANTS)
def test_torch_module_against_the_dense_reference(name):
    from symattn.codegen.torch import load_torch_module

    leaves, upstream, sizes = _leaves(name)
    module = load_torch_module(_spec(name).emit("torch"), f"peer_{name}")
    module.BLOCK_Q, module.BLOCK_K = 5, 7
    for dtype, tolerance in ((torch.float64, 1e-9), (torch.bfloat16, 3e-2)):
        want = _reference(name, leaves, upstream, dtype)
        tensors = {k: torch.tensor(v, dtype=dtype) for k, v in leaves.items()}
        outs, grads = module.forward_backward(**tensors, **{k: torch.tensor(v, dtype=dtype)
                                                            for k, v in upstream.items()}, **sizes)
        _check(name, {k: v.float() for k, v in outs.items()}, {k: v.float() for k, v in grads.items()},
               {k: v.float() for k, v in want[0].items()}, {k: v.float() for k, v in want[1].items()}, tolerance,
               f"torch {dtype}")


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_cuda_kernels_against_the_dense_reference(name, tmp_path):
    """The fp32 CUDA kernels, built for the CPU with the emulation header, through their C API."""
    from symattn.check.cuda import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot run on the CPU")
    spec = _spec(name)
    leaves, upstream, sizes = _leaves(name)
    want = _reference(name, leaves, upstream)
    code = spec.emit("cuda")
    assert code.path == "fused"
    outs, grads = run_cuda_on_cpu(spec, leaves, upstream, sizes, B, tmp_path)
    _check(name, outs, grads, *want, 1e-5, "cuda")
