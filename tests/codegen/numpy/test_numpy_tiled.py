"""The generated NumPy module's tiled attention pass (issue 14) against independent computations.

The tiled pass (`_forward_backward_tiled`: query blocks x key blocks, online
softmax, weights recomputed from the saved log-sum-exp, masked blocks skipped)
is forced on at small sizes by setting the module's TILED_ABOVE to 0 and its
blocks to a few rows, with N not a multiple of either block. It is compared
with a float64 attention written here (forward and the textbook backward),
with the module's plain pass, and with central finite differences; a fully
masked first row must give zeros, logits of 1e4 must stay finite, skipped
blocks must be exactly the fully masked ones, and memory must stay far below
one [N, N] array.
"""

from __future__ import annotations

import copy

import tracemalloc

import numpy as np
import pytest
import sympy

import symattn
from symattn.codegen.numpy.emit import load_module, numpy_source

from conftest import EXAMPLES, module_arguments

CORE = """
attention {name}
dim N = 8, d = 4, w = 5
input Q[N, d], K[N, d], V[N, d]
{defs}
O = softmax({score}, axis=-1) @ V
output O
"""

# name -> (definitions, score, mask(i, j) or None, softcap or None)
VARIANTS = {
    "plain": ("", "Q @ K.T / sqrt(d)", None, None),
    "causal": ("M[i:N, j:N] = where(j <= i, 0, -inf)", "Q @ K.T / sqrt(d) + M", lambda i, j: j <= i, None),
    "strict_causal": ("M[i:N, j:N] = where(j < i, 0, -inf)", "Q @ K.T / sqrt(d) + M", lambda i, j: j < i, None),
    "window": ("M[i:N, j:N] = where(j <= i, where(i - j < w, 0, -inf), -inf)", "Q @ K.T / sqrt(d) + M",
               lambda i, j: (j <= i) & (i - j < 5), None),
    "softcap": ("", "30 * tanh(Q @ K.T / sqrt(d) / 30)", None, 30.0),
    "softcap_strict_causal": ("M[i:N, j:N] = where(j < i, 0, -inf)", "30 * tanh(Q @ K.T / sqrt(d) / 30) + M",
                              lambda i, j: j < i, 30.0),
    "causal_constant": ("", "Q @ K.T / sqrt(d) + causal_mask(N)", lambda i, j: j <= i, None),
    # keys bounded from below only; the last row sees no key
    "anti_causal": ("M[i:N, j:N] = where(j > i, 0, -inf)", "Q @ K.T / sqrt(d) + M", lambda i, j: j > i, None),
}


def reference(q, k, v, do, mask, cap):
    """softmax(score) @ v and its gradients, in float64, as textbooks write them (one [N, N] array)."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    scale = q.shape[-1] ** -0.5
    s = q @ k.swapaxes(-1, -2) * scale
    r = cap * np.tanh(s / cap) if cap else s
    n_q, n_k = s.shape[-2:]
    if mask is not None:
        r = np.where(mask(np.arange(n_q)[:, None], np.arange(n_k)[None, :]), r, -np.inf)
    top = r.max(axis=-1, keepdims=True)
    e = np.exp(r - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total == 0, 1, total)
    o = p @ v
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    dr = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    ds = dr * (1 - np.tanh(s / cap) ** 2) if cap else dr
    return o, ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, dv


def module(name: str):
    defs, score, _, _ = VARIANTS[name]
    source = numpy_source(symattn.load(CORE.format(name=name, defs=defs, score=score)).typed)
    return load_module(source)


def tiled(mod, block_q=8, block_k=16):
    mod.TILED_ABOVE, mod.BLOCK_Q, mod.BLOCK_K = 0, block_q, block_k
    return mod


def inputs(n=37, d=4, batch=(2, 3), dtype=np.float64, seed=0, size=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(batch + (n, d)) * s).astype(dtype) for s in (size, size, 1, 1)]


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("blocks", [(8, 16), (5, 7), (64, 64)])
def test_tiled_against_a_float64_reference_and_the_plain_pass(name, blocks):
    q, k, v, do = inputs()
    mod = module(name)
    plain_o, plain_g = mod.forward_backward(Q=q, K=k, V=v, grad_O=do)
    o, g = tiled(mod, *blocks).forward_backward(Q=q, K=k, V=v, grad_O=do)
    want = reference(q, k, v, do, *VARIANTS[name][2:])
    for got, expected, plain in zip((o["O"], g["Q"], g["K"], g["V"]), want,
                                    (plain_o["O"], plain_g["Q"], plain_g["K"], plain_g["V"])):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got, plain, rtol=1e-10, atol=1e-12)


def test_fully_masked_first_row_gives_zeros_not_nan():
    q, k, v, do = inputs(n=19)
    o, g = tiled(module("strict_causal"), 4, 4).forward_backward(Q=q, K=k, V=v, grad_O=do)
    assert np.all(o["O"][..., 0, :] == 0) and np.all(g["Q"][..., 0, :] == 0)
    assert all(np.all(np.isfinite(x)) for x in (o["O"], *g.values()))
    assert np.all(g["K"][..., -1, :] == 0) and np.all(g["V"][..., -1, :] == 0)  # the last key: no row sees it


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["plain", "causal", "softcap"])
def test_logits_of_1e4_stay_finite_and_exact(name, dtype):
    q, k, v, do = inputs(n=33, d=4, dtype=dtype, size=70.0)  # |q . k| / 2 up to about 1e4
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    assert np.abs(q64 @ k64.swapaxes(-1, -2)).max() / 2 > 5e3
    o, g = tiled(module(name)).forward_backward(Q=q, K=k, V=v, grad_O=do)
    want = reference(q, k, v, do, *VARIANTS[name][2:])
    assert o["O"].dtype == dtype and g["Q"].dtype == dtype
    tol = 1e-9 if dtype == np.float64 else 2e-2
    for got, expected in zip((o["O"], g["Q"], g["K"], g["V"]), want):
        assert np.all(np.isfinite(got))
        scale = max(np.abs(expected).max(), 1.0)
        assert np.abs(got - expected).max() / scale < tol


@pytest.mark.parametrize("name", ["causal", "window", "softcap", "softcap_strict_causal"])
def test_tiled_backward_against_finite_differences(name):
    q, k, v, do = inputs(n=11, d=3, batch=(2,), seed=3)
    mod = tiled(module(name), 4, 3)
    _, grads = mod.forward_backward(Q=q, K=k, V=v, grad_O=do)
    args = {"Q": q, "K": k, "V": v}
    rng = np.random.default_rng(1)
    h = 1e-6
    for tensor in args:
        for _ in range(4):
            at = tuple(rng.integers(0, s) for s in args[tensor].shape)
            plus = {n: a.copy() for n, a in args.items()}
            minus = {n: a.copy() for n, a in args.items()}
            plus[tensor][at] += h
            minus[tensor][at] -= h
            loss = [np.sum(mod.forward(**x)["O"] * do) for x in (plus, minus)]
            numeric = (loss[0] - loss[1]) / (2 * h)
            assert abs(grads[tensor][at] - numeric) < 1e-6 * max(1.0, abs(numeric))


@pytest.mark.parametrize("name, skipped", [("plain", False), ("causal", True), ("window", True),
                                           ("causal_constant", True), ("strict_causal", True),
                                           ("softcap_strict_causal", True)])
@pytest.mark.parametrize("blocks", [(4, 4), (8, 16), (5, 7)])
def test_only_fully_masked_blocks_are_skipped(name, skipped, blocks, monkeypatch):
    mod = tiled(module(name), *blocks)
    mask = VARIANTS[name][2]
    visited, unmasked = [], []
    forward = mod._flash_forward

    def spy(q, k, v, reads, core, *rest):
        score, score_inside = core.score, core.score_inside

        def recording(s, i, j, *read):
            visited.append((i.ravel().copy(), j.ravel().copy()))
            return score(s, i, j, *read)

        def recording_inside(s, i, j, *read):  # a block given no mask: every entry of it must be visible
            visited.append((i.ravel().copy(), j.ravel().copy()))
            unmasked.append(visited[-1])
            return s if score_inside is None else score_inside(s, i, j, *read)
        spied = copy.copy(core)
        spied.score, spied.score_inside = recording, recording_inside
        return forward(q, k, v, reads, spied, *rest)

    monkeypatch.setattr(mod, "_flash_forward", spy)
    n = 37
    q, k, v, _ = inputs(n=n, batch=())
    mod.forward(Q=q, K=k, V=v)
    seen = np.zeros((n, n), int)
    for rows, cols in visited:
        seen[np.ix_(rows, cols)] += 1
        if mask is not None:  # no visited block is fully masked
            assert mask(rows[:, None], cols[None, :]).any()
    for rows, cols in unmasked:
        assert mask(rows[:, None], cols[None, :]).all()
    assert seen.max() == 1  # no entry twice
    if mask is not None:  # every entry that is not masked is visited
        live = mask(np.arange(n)[:, None], np.arange(n)[None, :])
        assert np.all(seen[live] == 1)
    assert (not seen.all()) == skipped
    if name != "window":  # (its blocks of visible keys are narrower than a block: none here)
        assert bool(unmasked) == (mask is not None)


def test_threshold_chooses_the_pass(monkeypatch):
    mod = module("plain")
    calls = []
    tiled_pass = mod._forward_backward_tiled
    monkeypatch.setattr(mod, "_forward_backward_tiled", lambda *a: calls.append(1) or tiled_pass(*a))
    q, k, v, _ = inputs(n=16, batch=(2,))
    mod.forward(Q=q, K=k, V=v)
    assert not calls  # 2 x 16 x 16 score entries: plain
    mod.TILED_ABOVE = 2 * 16 * 16 - 1
    mod.forward(Q=q, K=k, V=v)
    assert calls == [1]


@pytest.mark.parametrize("threads", [1, 2])
def test_tiled_memory_is_linear_in_n(threads):
    """The tiled pass keeps a few blocks of rows x keys (the one pass: two of 64 rows x all keys, a pair for
    each thread): its peak grows about 4 times when N does (how much the two threads' widest blocks overlap
    in time varies), where one [N, N] array grows 16 times, and stays well under one."""
    peaks = []
    for n in (1024, 4096):
        q, k, v, do = inputs(n=n, d=16, batch=(), dtype=np.float32)
        mod = tiled(module("causal"), 64, 128)
        mod.THREADS = threads  # 2: two blocks at once, and dk, dv of the entry the two runs share summed apart
        mod.forward_backward(Q=q, K=k, V=v, grad_O=do)  # warm
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        mod.forward_backward(Q=q, K=k, V=v, grad_O=do)
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    one_square = 4096 * 4096 * 4
    assert peaks[1] < one_square / 8, f"peak {peaks[1]} bytes against one [N, N] array of {one_square}"
    assert peaks[1] < 8 * peaks[0], peaks


def _fusing_examples():
    out = []
    for path in EXAMPLES:
        spec = symattn.load(path.read_text(encoding="utf-8"))
        if "_forward_backward_tiled" in numpy_source(spec.typed):
            out.append(path.stem)
    return out


FUSING = _fusing_examples()


def test_the_examples_that_fuse():
    assert {"self_attention", "causal", "multi_head", "sliding_window", "softcap"} <= set(FUSING)


@pytest.mark.parametrize("name", FUSING)
def test_every_fusing_example_tiled_against_its_plain_pass(name):
    path = next(p for p in EXAMPLES if p.stem == name)
    spec = symattn.load(path.read_text(encoding="utf-8")).typed
    mod = load_module(numpy_source(spec))
    sizes = {n: (37 if n == "N" else 29 if n == "M" else int(v)) for n, v in spec.sizes.items()}
    subs = {spec.dims[n].symbol: v for n, v in sizes.items()}
    rng = np.random.default_rng(0)
    args = {}
    for leaf in spec.given:
        shape = tuple(int(sympy.sympify(d).subs(subs)) for d in spec.tensors[leaf].shape)
        batch = (2,) if spec.tensors[leaf].kind == "input" else ()
        info = spec.tensors[leaf]
        if info.integer:  # document ids, offsets, intervals: integers in their range at these sizes
            low, high = (int(sympy.sympify(v).subs(subs)) for v in info.values)
            args[leaf] = rng.integers(low, high, size=shape)
        else:
            args[leaf] = rng.standard_normal(batch + shape)
    args = module_arguments(spec, args)  # (a dropout mask is drawn by the module, from the seed)
    keywords = {n: sizes[n] for n in sizes if f"{n}=" in numpy_source(spec).split("def forward(")[1].split(")")[0]}
    outs = mod.forward(**args, **keywords)
    upstream = {f"grad_{o}": rng.standard_normal(outs[o].shape) for o in spec.outputs}
    plain = mod.forward_backward(**args, **upstream, **keywords)
    got = tiled(mod, 8, 16).forward_backward(**args, **upstream, **keywords)
    for want, have in zip(plain, got):
        for key in want:
            assert np.all(np.isfinite(have[key]))
            np.testing.assert_allclose(have[key], want[key], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("blocks", [(5, 7, None), (1, 1, None), (2, 1, 1)])
def test_torch_module_tiled_against_the_float64_reference(name, blocks):
    """Blocks of 5 x 7: one strip (16 blocks merged) covers the 23 rows or keys; blocks of 1 x 1 and 2 x 1:
    two strips in each pass (the forward's online softmax across strips, the backward's query strips), and
    with a budget of 1 one batch entry per group (six groups)."""
    torch = pytest.importorskip("torch")
    from symattn.codegen.torch import load_torch_module

    defs, score, mask, cap = VARIANTS[name]
    source = symattn.load(CORE.format(name=name, defs=defs, score=score)).emit("torch")
    assert "_flash_forward(" in source and "_flash_backward(" in source
    tm = load_torch_module(source, f"tiled_{name}")
    tm.BLOCK_Q, tm.BLOCK_K, budget = blocks
    if budget is not None:
        groups = tm._groups
        tm._groups = lambda q, lead, per: groups(q, lead, per, budget)
    q, k, v, do = inputs(n=23)
    outs, grads = tm.forward_backward(Q=torch.from_numpy(q), K=torch.from_numpy(k), V=torch.from_numpy(v),
                                      grad_O=torch.from_numpy(do))
    want = reference(q, k, v, do, mask, cap)
    for got, expected in zip((outs["O"], grads["Q"], grads["K"], grads["V"]), want):
        got = got.numpy()
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    # differentiable through autograd, as the module's `forward` is
    tensors = {n: torch.from_numpy(x).requires_grad_() for n, x in zip("QKV", (q, k, v))}
    (tm.forward(**tensors)["O"] * torch.from_numpy(do)).sum().backward()
    np.testing.assert_allclose(tensors["K"].grad.numpy(), want[2], rtol=1e-10, atol=1e-12)


def test_a_table_read_through_a_clamp_with_dim_bounds_is_tiled():
    """`Bt[clamp(j - i, -H, H) + H]` with H a dim: the tiled pass printed the clamp as real arithmetic
    (`-H` and `+ H` as floats) and refused the core, so `emit numpy` failed; against plain NumPy from the
    definition, forward and gradients, at a size that is no block multiple."""
    import symattn

    spec = symattn.load("attention c\ndim N = 37, d = 5, H = 3\ninput X[N, d]\nparam W[d, d], Bt[2 * H + 1]\n"
                        "B[i:N, j:N] = Bt[clamp(j - i, -H, H) + H]\nP = softmax((X @ W) @ X.T + B, axis=-1)\n"
                        "O = P @ X\noutput O\n")
    module = spec.numpy()
    assert hasattr(module, "_forward_backward_tiled")
    module.TILED_ABOVE, module.BLOCK_Q, module.BLOCK_K = 0, 8, 16
    rng = np.random.default_rng(0)
    x, w, bt, g = rng.standard_normal((37, 5)), rng.standard_normal((5, 5)), rng.standard_normal(7), \
        rng.standard_normal((37, 5))
    rel = np.clip(np.arange(37)[None, :] - np.arange(37)[:, None], -3, 3) + 3
    s = x @ w @ x.T + bt[rel]
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out, grads = module.forward_backward(X=x, W=w, Bt=bt, grad_O=g)
    np.testing.assert_allclose(out["O"], p @ x, rtol=1e-10, atol=1e-12)
    g_p = g @ x.T
    g_s = p * (g_p - (g_p * p).sum(-1, keepdims=True))
    np.testing.assert_allclose(grads["Bt"], np.bincount(rel.ravel(), g_s.ravel(), minlength=7), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(grads["W"], x.T @ g_s @ x, rtol=1e-9, atol=1e-11)
