"""FlexAttention's mask and score language on the NumPy and torch targets, against the peers' definitions.

Each spec is a reference spec in derivations/ written with this round's constructs (integer buffers, `//`,
`%`, `&` `|`, clamp, floor of log2 as a subscript, exp2, a 0-sized window side); each reference here is a
plain dense torch function written from the peer's own definition (attention-gym's document mask with
offsets, NATTEN's clamped neighbourhood centre, Flamingo's image intervals, T5's log buckets, vLLM's page
table), never another target's module. The generated NumPy module (its tiled pass with blocks 5 x 7, and
its plain pass) and the torch module must agree with it: outputs and the gradient of every input and param,
float64 and (torch) bfloat16, with a batch axis, at sizes that are not block multiples, on integer buffers
drawn to hit the edges (documents of one token, an image with no tokens, rows fully masked).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import symattn
from symattn.codegen.arrays.module import load_module

from conftest import REPO, run_cuda_on_cpu

torch = pytest.importorskip("torch", reason="the dense references are written in torch")

B = 2


def _softmax(s):
    """The stable softmax with a fully masked row giving zeros (the targets' convention, DESIGN.md)."""
    top = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _masked(s, keep):
    return torch.where(keep, s, torch.full_like(s, -math.inf))


def _attend(t, keep=None, bias=0.0):
    q, k, v = t["Q"], t["K"], t["V"]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return {"O": _softmax(s if keep is None else _masked(s, keep)) @ v}


def _ij(n, m=None):
    return torch.arange(n)[:, None], torch.arange(n if m is None else m)[None, :]


def _document_offsets(t):
    """attention-gym's document mask, causal in each document's own positions, with a learned distance slope."""
    doc, off = t["doc"].long(), t["offsets"].long()
    i, j = _ij(doc.shape[-1])
    di, dj = doc[:, :, None], doc[:, None, :]
    pi = i - torch.gather(off, 1, doc)[:, :, None]  # q_idx - offsets[document_id[q_idx]]
    pj = j - torch.gather(off, 1, doc)[:, None, :]
    keep = (di == dj) & (pj <= pi)
    return _attend(t, keep, -t["slope"] * (pi - pj))


def _dilated(t, w=2, r=2):
    i, j = _ij(t["Q"].shape[-2])
    return _attend(t, ((i - j) % r == 0) & ((i - j).abs() <= w * r))


def _window_zero_side(t, w=3, right=0):
    i, j = _ij(t["Q"].shape[-2])  # flash-attention's window_size=(w, 0)
    return _attend(t, (j >= i - w) & (j <= i + right))


def _alibi_exp2(t):
    h, n = t["Q"].shape[-3], t["Q"].shape[-2]
    i, j = _ij(n)
    slopes = torch.tensor([2.0 ** (-8 * (g + 1) / h) for g in range(h)], dtype=t["Q"].dtype)
    return _attend(t, None, -slopes[:, None, None] * (i - j).abs())


def _natten(t, height=3, width=4, radius=1):
    """NATTEN: token n at (n // W, n % W); the window's centre clamped so it stays inside the grid."""
    n = torch.arange(height * width)
    row, col = n // width, n % width
    ci = row.clamp(radius, height - 1 - radius)[:, None]
    cj = col.clamp(radius, width - 1 - radius)[:, None]
    keep = ((row[None, :] - ci).abs() <= radius) & ((col[None, :] - cj).abs() <= radius)
    return _attend(t, keep)


def _flamingo(t):
    """Each text token sees the tokens of its latest image, keys lo[k] .. hi[k] - 1 of image k."""
    x, y = t["X"], t["Y"]
    q, k, v = x @ t["W_q"], y @ t["W_k"], y @ t["W_v"]
    last, lo, hi = t["last"].long(), t["lo"].long(), t["hi"].long()
    j = torch.arange(y.shape[-2])[None, None, :]
    start = torch.gather(lo, 1, last)[:, :, None]
    stop = torch.gather(hi, 1, last)[:, :, None]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return {"O": _softmax(_masked(s, (j >= start) & (j < stop))) @ v}


def _t5_buckets(t, nb=3):
    """T5's bidirectional log buckets: distance d in bucket floor(log2(d + 1)), the far ones in the last."""
    n = t["Q"].shape[-2]
    i, j = _ij(n)
    bucket = torch.floor(torch.log2((i - j).abs().double() + 1)).long().clamp(0, nb - 1)
    return _attend(t, None, t["Bt"][bucket])


def _paged(t, pages=2, size=2):
    """vLLM's paged KV cache: position p of the sequence is slot p % S of pool page table[p // S]."""
    table, seqlen = t["table"].long(), t["seqlen"].long()
    p = torch.arange(pages * size)
    k = torch.stack([t["Kc"][b, table[b, p // size], p % size] for b in range(B)])
    v = torch.stack([t["Vc"][b, table[b, p // size], p % size] for b in range(B)])
    s = t["q"] @ k.transpose(-1, -2) / math.sqrt(t["q"].shape[-1])
    keep = p[None, None, :] < seqlen[:, None, None]
    return {"O": _softmax(_masked(s, keep)) @ v}


# name -> (shapes of the given tensors (batch axis on inputs and buffers added), integer buffers' draws,
#          reference, sizes passed to the module)
N = 23


def _docs(rng, n, d):
    """Sorted document ids with some documents of one token, and offsets (each document's first position)."""
    cuts = np.sort(rng.choice(np.arange(1, n), size=d - 1, replace=False))
    cuts[0] = 1  # the first document is one token
    doc = np.searchsorted(cuts, np.arange(n), side="right")
    offsets = np.array([np.argmax(doc == k) if (doc == k).any() else 0 for k in range(d)])
    return doc, offsets


VARIANTS = {
    "document_offsets": ({"Q": (N, 4), "K": (N, 4), "V": (N, 4), "slope": ()}, _document_offsets, {}),
    "dilated_window": ({"Q": (N, 4), "K": (N, 4), "V": (N, 4)}, _dilated, {}),
    "window_zero_side": ({"Q": (N, 4), "K": (N, 4), "V": (N, 4)}, _window_zero_side, {}),
    "alibi_exp2": ({"Q": (2, N, 4), "K": (2, N, 4), "V": (2, N, 4)}, _alibi_exp2, {}),
    "natten_2d": ({"Q": (12, 3), "K": (12, 3), "V": (12, 3)}, _natten, {}),
    "flamingo_intervals": ({"X": (N, 4), "Y": (29, 4), "W_q": (4, 4), "W_k": (4, 4), "W_v": (4, 4)}, _flamingo, {}),
    "t5_buckets": ({"Q": (N, 4), "K": (N, 4), "V": (N, 4), "Bt": (3,)}, _t5_buckets, {}),
    "paged_decode": ({"q": (1, 3), "Kc": (2, 2, 3), "Vc": (2, 2, 3)}, _paged, {}),
}


def _integers(name, rng):
    """Integer buffers drawn in range, with the edge cases each mask has."""
    if name == "document_offsets":
        docs = [_docs(rng, N, 5) for _ in range(B)]
        return {"doc": np.stack([d for d, _ in docs]), "offsets": np.stack([o for _, o in docs])}
    if name == "flamingo_intervals":
        lo = np.array([[0, 5, 5, 20], [3, 0, 28, 10]])
        hi = np.array([[5, 5, 20, 29], [9, 29, 29, 11]])  # image 1 of entry 0 has no tokens: rows fully masked
        last = rng.integers(0, 4, size=(B, N))
        last[0, :4] = 1
        return {"last": last, "lo": lo, "hi": hi}
    if name == "paged_decode":
        return {"table": np.array([[1, 0], [1, 1]]), "seqlen": np.array([3, 1])}  # a page shared; one filled slot
    return {}


def _spec(name):
    return symattn.load(REPO / "derivations" / f"{name}.attn")


def _leaves(name, seed=0):
    spec = _spec(name).typed
    rng = np.random.default_rng(seed)
    shapes, reference, sizes = VARIANTS[name]
    leaves = {}
    for leaf, shape in shapes.items():
        batch = (B,) if spec.tensors[leaf].kind != "param" else ()
        leaves[leaf] = rng.standard_normal(batch + shape)
    integers = _integers(name, rng)
    outs = reference({**{k: torch.from_numpy(v) for k, v in leaves.items()},
                      **{k: torch.from_numpy(v) for k, v in integers.items()}})
    upstream = {f"grad_{o}": rng.standard_normal(tuple(x.shape)) for o, x in outs.items()}
    return leaves, integers, upstream, sizes


def _reference(name, leaves, integers, upstream, dtype=torch.float64):
    tensors = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in leaves.items()}
    outs = VARIANTS[name][1]({**tensors, **{k: torch.from_numpy(v) for k, v in integers.items()}})
    loss = sum((outs[o] * torch.tensor(upstream[f"grad_{o}"], dtype=dtype)).sum() for o in outs)
    loss.backward()
    return {o: x.detach() for o, x in outs.items()}, {k: t.grad for k, t in tensors.items()}


def _close(got, want, tolerance, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.array_equal(np.isfinite(got), np.isfinite(want)), what
    scale = max(np.abs(want).max(initial=0.0), 1e-3)
    error = np.abs(got - want).max(initial=0.0) / scale
    assert error <= tolerance, f"{what}: relative error {error:.2e} > {tolerance:g}"


def _check(name, outs, grads, want, tolerance, target):
    want_outs, want_grads = want
    for o, value in want_outs.items():
        _close(outs[o], value, tolerance, f"{name} {target} {o}")
    for leaf, value in want_grads.items():
        _close(grads[leaf], value, tolerance * 10, f"{name} {target} grad({leaf})")


def test_the_edge_cases_are_drawn():
    """The draws hold what they are meant to: a one-token document, an empty image, a shared page."""
    rng = np.random.default_rng(0)
    assert any((np.bincount(d) == 1).any() for d in _integers("document_offsets", rng)["doc"])
    images = _integers("flamingo_intervals", rng)
    assert (images["lo"] >= images["hi"]).any() and (images["last"][0, :4] == 1).all()
    pages = _integers("paged_decode", rng)
    assert (pages["table"][1] == pages["table"][1, 0]).all() and pages["seqlen"].min() == 1


@pytest.mark.parametrize("name", VARIANTS)
def test_numpy_module_against_the_peer_definition(name):
    leaves, integers, upstream, sizes = _leaves(name)
    want = _reference(name, leaves, integers, upstream)
    module = load_module(_spec(name).emit("numpy"), f"mask_{name}")
    for tiled in (True, False):
        if tiled:
            module.TILED_ABOVE, module.BLOCK_Q, module.BLOCK_K, module.THREADS = 0, 5, 7, 2
        else:
            module.TILED_ABOVE = 10 ** 9
        outs, grads = module.forward_backward(**leaves, **integers, **upstream, **sizes)
        _check(name, outs, grads, want, 1e-9, f"numpy {'tiled' if tiled else 'plain'}")


@pytest.mark.parametrize("name", VARIANTS)
def test_torch_module_against_the_peer_definition(name):
    from symattn.codegen.torch import load_torch_module

    leaves, integers, upstream, sizes = _leaves(name)
    module = load_torch_module(_spec(name).emit("torch"), f"mask_{name}")
    module.BLOCK_Q, module.BLOCK_K = 5, 7
    for dtype, tolerance in ((torch.float64, 1e-9), (torch.bfloat16, 3e-2)):
        want = _reference(name, leaves, integers, upstream, dtype)
        tensors = {k: torch.tensor(v, dtype=dtype) for k, v in {**leaves, **upstream}.items()}
        ints = {k: torch.from_numpy(v) for k, v in integers.items()}
        outs, grads = module.forward_backward(**tensors, **ints, **sizes)
        _check(name, {k: v.float() for k, v in outs.items()}, {k: v.float() for k, v in grads.items()},
               tuple({k: v.float() for k, v in part.items()} for part in want), tolerance, f"torch {dtype}")


def test_every_index_only_mask_is_fused():
    """The masks that read only positions (and learned tables) take the fused path on NumPy and torch."""
    for name in ("dilated_window", "window_zero_side", "alibi_exp2", "natten_2d", "t5_buckets",
                 "document_offsets", "flamingo_intervals"):
        plan = _spec(name).plan()
        assert len(plan.cores) == 1 and not plan.notes, (name, plan.notes)


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_cuda_kernels_against_the_peer_definition(name, tmp_path):
    """The fp32 CUDA kernels, built for the CPU with the emulation header, through their C API (an integer
    buffer is passed as float32, exact below 2^24)."""
    from symattn.check.cuda import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot run on the CPU")
    spec = _spec(name)
    leaves, integers, upstream, sizes = _leaves(name)
    want = _reference(name, leaves, integers, upstream)
    code = spec.emit("cuda")
    assert code.path == ("generic" if name == "paged_decode" else "fused")
    outs, grads = run_cuda_on_cpu(spec, {**leaves, **integers}, upstream, sizes, B, tmp_path)
    _check(name, outs, grads, want, 1e-5, "cuda")


def test_a_document_mask_skips_the_blocks_it_masks_whole():
    """8 documents at N = 4096: the NumPy tiled pass tests each block's mask at run time (the documents are
    data, so no static bound sees them) and computes at least 4x fewer key blocks than a dense pass, forward
    and backward, with the same result as its plain pass at a size where that is cheap."""
    n, docs, width = 4096, 8, 16
    spec = symattn.load(REPO / "derivations" / "document_offsets.attn", dims={"N": n, "D": docs, "d_k": width})
    module = load_module(spec.emit("numpy"), "mask_blocks")
    module.TILED_ABOVE, module.THREADS = 0, 1
    rng = np.random.default_rng(0)
    doc = np.repeat(np.arange(docs), n // docs)
    offsets = np.arange(docs) * (n // docs)
    q, k, v, do = (rng.standard_normal((n, width)).astype(np.float32) for _ in range(4))
    slope = np.float32(0.01)
    blocks = module._Score.blocks
    for run in (module.forward, module.backward):  # the two-pass forward, then the one-pass forward-backward
        blocks[:] = [0, 0]
        run(Q=q, K=k, V=v, doc=doc, offsets=offsets, slope=slope, **({"grad_O": do} if run is module.backward
                                                                         else {}))
        computed, skipped = blocks
        dense = (-(-n // module.BLOCK_Q)) * (-(-n // module.BLOCK_K))
        assert computed + skipped == dense and computed * 4 <= dense, (run.__name__, blocks, dense)
    # the skipping is exact: against the peer's definition at N = 256, 8 documents of 32, blocks of 32 x 16
    small = symattn.load(REPO / "derivations" / "document_offsets.attn", dims={"N": 256, "D": docs, "d_k": width})
    tiled = load_module(small.emit("numpy"), "mask_blocks_small")
    tiled.TILED_ABOVE, tiled.BLOCK_Q, tiled.BLOCK_K = 0, 32, 16
    leaves = {"Q": q[None, :256], "K": k[None, :256], "V": v[None, :256], "slope": np.array(0.01)}
    integers = {"doc": np.repeat(np.arange(docs), 32)[None], "offsets": (np.arange(docs) * 32)[None]}
    upstream = {"grad_O": do[None, :256].astype(np.float64)}
    want = _reference("document_offsets", {k: v.astype(np.float64) for k, v in leaves.items()}, integers, upstream)
    blocks = tiled._Score.blocks
    got = tiled.forward_backward(**{k: v.astype(np.float64) for k, v in leaves.items()}, **integers, **upstream)
    _check("document_offsets", *got, want, 1e-9, "numpy, blocks skipped")
    assert blocks[1] > 0, blocks


def test_the_torch_module_skips_the_blocks_a_document_mask_masks_whole():
    """The same on the torch module: at N = 4096 with 8 documents its strips skip every key block (forward) and
    query block (backward) the mask masks whole for the group, at least 4x fewer than dense; at N = 256 with
    blocks of 32 x 16 the result is the peer definition's in float64."""
    from symattn.codegen.torch import load_torch_module

    n, docs, width = 4096, 8, 16
    spec = symattn.load(REPO / "derivations" / "document_offsets.attn", dims={"N": n, "D": docs, "d_k": width})
    module = load_torch_module(spec.emit("torch"), "mask_blocks_torch")
    rng = np.random.default_rng(0)
    args = {"doc": torch.tensor(np.repeat(np.arange(docs), n // docs)),
            "offsets": torch.tensor(np.arange(docs) * (n // docs)), "slope": torch.tensor(0.01)}
    args.update({name: torch.tensor(rng.standard_normal((n, width)), dtype=torch.float32) for name in "QKV"})
    blocks = module._Score.blocks
    for run in ("forward", "backward"):
        blocks[:] = [0, 0]
        if run == "forward":
            module.forward(**args)
        else:
            module.backward(**args, grad_O=torch.ones(n, width))
        computed, skipped = blocks
        dense = (-(-n // module.BLOCK_Q)) * (-(-n // module.BLOCK_K)) * (1 if run == "forward" else 2)
        assert computed + skipped == dense and computed * 4 <= dense, (run, blocks, dense)  # (backward(): both)
    small = symattn.load(REPO / "derivations" / "document_offsets.attn", dims={"N": 256, "D": docs, "d_k": width})
    tiled = load_torch_module(small.emit("torch"), "mask_blocks_torch_small")
    tiled.BLOCK_Q, tiled.BLOCK_K = 32, 16
    leaves = {name: rng.standard_normal((1, 256, width)) for name in "QKV"}
    leaves["slope"] = np.array(0.01)
    integers = {"doc": np.repeat(np.arange(docs), 32)[None], "offsets": (np.arange(docs) * 32)[None]}
    upstream = {"grad_O": rng.standard_normal((1, 256, width))}
    want = _reference("document_offsets", leaves, integers, upstream)
    blocks = tiled._Score.blocks
    blocks[:] = [0, 0]
    outs, grads = tiled.forward_backward(**{k: torch.tensor(v) for k, v in {**leaves, **integers, **upstream}.items()})
    _check("document_offsets", {o: v.numpy() for o, v in outs.items()}, {g: v.numpy() for g, v in grads.items()},
           want, 1e-9, "torch, blocks skipped")
    assert blocks[1] > 0, blocks


def test_cuda_kernels_test_a_buffer_mask_per_tile():
    """The fused CUDA kernels of a mask that reads buffers test it per tile (`_keep`, then __syncthreads_or) and
    skip a tile it hides for every row of the block: the forward's key loop, dK/dV's query loop, dQ's key loop;
    an index-only mask bounds the loops statically instead. (The slow step runs them on the CPU emulation and
    under ThreadSanitizer against the peer definitions.)"""
    source = _spec("document_offsets").emit("cuda").files["document_offsets.cu"]
    assert source.count("if (!__syncthreads_or(any_)) continue;") == 3
    assert "document_offsets_O_attn_keep(" in source
    assert "__syncthreads_or" not in _spec("window_zero_side").emit("cuda").files["window_zero_side.cu"]
