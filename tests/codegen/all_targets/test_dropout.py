"""`D = dropout(x, p)` on every target, against plain dense references written from FlashAttention's definition.

The reference (FlashAttention's `attention_ref` with dropout, written here in torch) is
`(softmax(S) * Z / (1 - p)) @ V` with Z the 0/1 mask of the contract in `symattn.ir.philox`:
entry n of the dropped tensor's full shape (row-major, batch axes included) is kept iff
Philox-4x32-10 word 0 at counter (n low, n high, stream, 0) under key (seed low, seed high) is at
least floor(p * 2**32). `keep_mask` computes that mask in NumPy; it is held to Random123's published
vectors in tests/ir/test_philox.py, so nothing here compares a target with another target's module.
Every target (NumPy plain and tiled, torch, Triton under the interpreter, CUDA on the CPU in the slow
step) must give the reference's outputs and the gradient of every input and param with the same seed,
sizes that are not block multiples, a batch axis, seeds of 2**63 and more, and several dropout
definitions in one spec (each its own stream, a mask of params with no batch axis). The claims of the
reference spec are checked against NumPy over masks drawn at random, and `check` never refutes with a
mask entry off {0, 1}.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import symattn
from symattn.codegen.arrays.module import load_module
from symattn.ir.philox import dropout_threshold, keep_mask

from conftest import DATA, REPO, run_cuda_on_cpu, run_main

ATTENTION = REPO / "derivations" / "attention_dropout.attn"
LAYER = DATA / "dropout_layer.attn"
SEEDS = (7, 2 ** 63 + 12345, 2 ** 64 - 1)


def _mask(seed, stream, shape, p):
    return keep_mask(seed, stream, tuple(shape), dropout_threshold(p)).astype(np.float64)


# --- the references: FlashAttention's attention_ref with dropout, in torch ---------------------------------


def _attention_reference(torch, t, seed):
    """attention_dropout.attn: causal softmax of Q K^T / sqrt(d_k), dropped with p = 0.1, then @ V."""
    q, k, v = t["Q"], t["K"], t["V"]
    n = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    p = torch.softmax(torch.where(causal, s, torch.full_like(s, -math.inf)), dim=-1)
    z = torch.tensor(_mask(seed, 0, p.shape, 0.1), dtype=p.dtype)
    return {"O": (p * z / (1 - 0.1)) @ v}


def _layer_reference(torch, t, seed):
    """dropout_layer.attn: masks on W_o (no batch axis), on X @ W_v, on the weights and on the output."""
    x = t["X"]
    wd = t["W_o"] * torch.tensor(_mask(seed, 0, t["W_o"].shape, 0.3), dtype=x.dtype) / (1 - 0.3)
    q, k, vx = x @ t["W_q"], x @ t["W_k"], x @ t["W_v"]
    v = vx * torch.tensor(_mask(seed, 1, vx.shape, 0.2), dtype=x.dtype) / (1 - 0.2)
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    pd = p * torch.tensor(_mask(seed, 2, p.shape, 0.1), dtype=x.dtype) / (1 - 0.1)
    a = pd @ v @ wd
    return {"Y": a * torch.tensor(_mask(seed, 3, a.shape, 0.5), dtype=x.dtype) / (1 - 0.5)}


CASES = {
    # name -> (spec, shapes of the given tensors (a batch axis of 2 on inputs), reference)
    "attention": (ATTENTION, {"Q": (2, 2, 37, 5), "K": (2, 2, 37, 5), "V": (2, 2, 37, 5)}, _attention_reference),
    "layer": (LAYER, {"X": (2, 23, 4), "W_q": (4, 4), "W_k": (4, 4), "W_v": (4, 4), "W_o": (4, 4)},
              _layer_reference),
}


def _draw(name, seed=0):
    rng = np.random.default_rng(seed)
    _, shapes, _ = CASES[name]
    given = {n: rng.standard_normal(s) / (2 if n.startswith("W") else 1) for n, s in shapes.items()}
    return given


def _want(torch, name, given, seed, upstream=None):
    """(outputs, gradients) of the reference in float64 by torch autograd; upstream drawn when not given."""
    _, _, reference = CASES[name]
    t = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in given.items()}
    out = reference(torch, t, seed)
    if upstream is None:
        rng = np.random.default_rng(1)
        upstream = {o: rng.standard_normal(tuple(v.shape)) for o, v in out.items()}
    loss = sum((out[o] * torch.tensor(upstream[o])).sum() for o in out)
    grads = torch.autograd.grad(loss, list(t.values()))
    return ({o: v.detach().numpy() for o, v in out.items()}, dict(zip(t, (g.numpy() for g in grads))), upstream)


def _close(got, want, tolerance, what):
    got = np.asarray(got, dtype=np.float64)
    scale = max(float(np.abs(want).max()), 1e-3)
    error = float(np.abs(got - want).max()) / scale
    assert error < tolerance, f"{what}: relative error {error:.2e}"


def _check(got_outs, got_grads, want, tolerance, what):
    outs, grads, _ = want
    for o, value in outs.items():
        _close(got_outs[o], value, tolerance, f"{what} {o}")
    for n, value in grads.items():
        _close(got_grads[n], value, tolerance * 10, f"{what} grad({n})")


# --- the masks ------------------------------------------------------------------------------------------


def test_the_masks_drop_what_p_says():
    """Over 2**20 entries the kept fraction is 1 - p within 6 standard deviations, streams differ, and the two
    words of the seed and of the position each change the mask (bits above 2**32 are used)."""
    n = 1 << 20
    for p in (0.1, 0.5, 0.9):
        kept = _mask(12345, 0, (n,), p).mean()
        assert abs(kept - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n), (p, kept)
    base = _mask(12345, 0, (4096,), 0.5)
    for other in (_mask(12345, 1, (4096,), 0.5), _mask(12345 + 2 ** 32, 0, (4096,), 0.5)):
        assert 0.4 < (base != other).mean() < 0.6
    assert _mask(5, 0, (1,), 0.0).all()  # p = 0 keeps everything


# --- the language ---------------------------------------------------------------------------------------


def test_each_definition_gets_its_own_mask_and_stream():
    typed = symattn.load(LAYER).typed
    masks = {m: typed.tensors[m].dropout for m in typed.dropouts}
    assert [(m, d.of, d.stream) for m, d in masks.items()] == [
        ("Wd_keep", "Wd", 0), ("V_keep", "V", 1), ("Pd_keep", "Pd", 2), ("Y_keep", "Y", 3)]
    assert typed.tensors["Pd_keep"].values == (0, 2) and typed.tensors["Pd_keep"].kind == "buffer"
    assert "Pd_keep" not in typed.arguments and typed.seed_keyword == "seed"


def test_the_mask_name_and_the_seed_keyword_never_collide():
    text = ("dim N = 3\ninput X[N, N], seed[N, N]\nP_keep = X * 1\nP = dropout(X, 0.5)\nO = P + P_keep + seed\n"
            "output O\n")
    typed = symattn.load(text).typed
    assert typed.dropouts == ("P_keep_2",) and typed.seed_keyword == "dropout_seed"
    module = symattn.load(text).numpy()
    x = np.arange(9.0).reshape(3, 3)
    got = module.forward(X=x, seed=x, dropout_seed=99)["O"]
    assert np.array_equal(got, x * _mask(99, 0, (3, 3), 0.5) / 0.5 + x + x)


def test_a_dropout_definition_prints_back_as_written():
    shown = run_main("show", str(ATTENTION))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^  Pd\s+intermediate .* Pd = dropout\(P, 0\.1\)$", shown.stdout, re.M), shown.stdout
    assert re.search(r"^  Pd_keep\s+dropout mask ", shown.stdout, re.M), shown.stdout
    again = symattn.load(ATTENTION.read_text().replace("dropout(P, 0.1)", "dropout(P, p=0.1)"))
    assert again.typed.tensors["Pd"].expr == symattn.load(ATTENTION).typed.tensors["Pd"].expr


# --- check: claims hold for every mask --------------------------------------------------------------------


def _sides(v):
    """Both sides of each claim of attention_dropout.attn in NumPy (grad(O) = G), from a forward written here."""
    q, k, vv, z, g = v["Q"], v["K"], v["V"], v["Z"], v["G"]
    n = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]) + np.where(np.arange(n)[None] <= np.arange(n)[:, None], 0,
                                                                    -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    pd = p * z / 0.9
    o = pd @ vv
    gpd = g @ vv.swapaxes(-1, -2)
    gp = gpd * z / 0.9
    gs = p * (gp - (gp * p).sum(-1, keepdims=True))
    return {
        "grad(V) == Pd.T @ grad(O)": (pd.swapaxes(-1, -2) @ g, pd.swapaxes(-1, -2) @ g),
        "grad(P) * P == grad(Pd) * Pd": (gp * p, gpd * pd),
        "sum(grad(Pd) * Pd, axis=-1) == sum(grad(O) * O, axis=-1)": ((gpd * pd).sum(-1), (g * o).sum(-1)),
        "sum(grad(S), axis=-1) == 0": (gs.sum(-1), 0 * gs.sum(-1)),
        "not sum(Pd, axis=-1) == 1": (pd.sum(-1), np.ones(pd.shape[:-1])),
        "not grad(P) == grad(Pd)": (gp, gpd),
    }


def test_the_reference_specs_claims_against_numpy_over_random_masks():
    """Each claim the spec makes is proved (or, negated, refuted), and NumPy agrees over 200 random 0/1 masks:
    the true ones hold at every draw, each negated one fails at some draw."""
    done = run_main("check", str(ATTENTION))
    assert done.returncode == 0, done.stdout + done.stderr
    rng = np.random.default_rng(0)
    held = {}
    for _ in range(200):
        v = {n: rng.integers(-2, 3, (2, 4, 3)) / 2 for n in "QKVG"}
        v["Z"] = rng.integers(0, 2, (2, 4, 4)).astype(float)
        for claim, (a, b) in _sides(v).items():
            held.setdefault(claim, []).append(np.allclose(a, b, rtol=1e-12, atol=1e-12))
    for claim, results in held.items():
        assert (not all(results)) if claim.startswith("not ") else all(results), claim
    assert "grad(S) == P * (grad(P) - sum(grad(P) * P, axis=-1))" in ATTENTION.read_text()


def test_check_never_refutes_with_a_mask_off_zero_and_one(tmp_path):
    """A claim true only because the mask is 0/1 (Z * Z == Z) is not refuted; a false one is, and its
    counterexample's mask holds 0s and 1s and re-evaluates in plain NumPy."""
    spec = tmp_path / "z.attn"
    spec.write_text(ATTENTION.read_text() + "check Pd * Pd == Pd * P / 0.9\ncheck Pd * P == P * P\n")
    done = run_main("check", str(spec))
    lines = done.stdout.splitlines()
    assert [line for line in lines if re.search(r": (unknown|proved): Pd \* Pd == Pd \* P / 0\.9$", line)], \
        done.stdout
    assert [line for line in lines if "refuted: Pd * P == P * P" in line], done.stdout
    block = done.stdout.split("refuted: Pd * P == P * P", 1)[1]
    mask = re.search(r"Pd_keep = (\[.*\])", block)[1]
    values = np.array(eval(mask))  # noqa: S307 - symattn's own printed list of numbers
    assert set(np.unique(values)) <= {0, 1}
    point = {n: np.array(eval(re.search(rf"\b{n} = (\[.*\])", block)[1])) for n in "QKV"}  # noqa: S307
    v = {**point, "Z": values, "G": np.zeros_like(point["V"])}
    n = v["Q"].shape[-2]
    s = v["Q"] @ v["K"].swapaxes(-1, -2) / math.sqrt(3) + np.where(np.arange(n)[None] <= np.arange(n)[:, None],
                                                                    0, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    assert not np.allclose(p * values / 0.9 * p, p * p)


# --- the targets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_module_plain_and_tiled(name, seed):
    torch = pytest.importorskip("torch", reason="the references are written in torch")
    path = CASES[name][0]
    given = _draw(name)
    want = _want(torch, name, given, seed)
    module = load_module(symattn.load(path).emit("numpy"), f"dropout_{name}")
    upstream = {f"grad_{o}": u for o, u in want[2].items()}
    for tiled in (False, True):
        if tiled:
            module.TILED_ABOVE, module.BLOCK_Q, module.BLOCK_K, module.THREADS = 0, 5, 7, 2
        outs, grads = module.forward_backward(**given, seed=seed, **upstream)
        _check(outs, grads, want, 1e-12, f"numpy {'tiled' if tiled else 'plain'}")
        _check(module.forward(**given, seed=seed), module.backward(**given, seed=seed, **upstream), want, 1e-12,
               "numpy forward() and backward() apart")


@pytest.mark.parametrize("name", CASES)
def test_torch_module_float64_and_bfloat16(name):
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    seed = SEEDS[1]
    given = _draw(name)
    module = load_torch_module(symattn.load(CASES[name][0]).emit("torch"), f"dropout_torch_{name}")
    module.BLOCK_Q, module.BLOCK_K = 4, 3  # blocks that straddle the causal bound and the sizes
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.bfloat16, 5e-2)):
        rounded = {n: torch.tensor(v).to(dtype).double().numpy() for n, v in given.items()}
        want = _want(torch, name, rounded, seed)
        t = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in rounded.items()}
        outs = module.forward(**t, seed=seed)
        loss = sum((outs[o].double() * torch.tensor(want[2][o])).sum() for o in outs)
        loss.backward()
        _check({o: v.detach().double().numpy() for o, v in outs.items()},
               {n: x.grad.double().numpy() for n, x in t.items()}, want, tolerance, f"torch {dtype}")


def test_torch_backward_draws_the_masks_again_instead_of_saving_them():
    """The torch module's forward saves no dropout mask for the backward (the plain path's V mask is drawn
    again), and the fused core saves only each batch entry's (offset, seed)."""
    pytest.importorskip("torch", reason="the torch target needs torch")
    source = symattn.load(LAYER).emit("torch")
    saved = re.search(r"The forward pass saves for the backward: ([^.]*)\.", source.replace("\n", " "))[1]
    assert "V_keep" not in saved and "Y_keep" not in saved and "Wd_keep" not in saved, saved
    assert "# the dropout masks again, from the seed (drawn, not saved)" in source


@pytest.mark.parametrize("seed", [-1, 2 ** 64, 0.5, True])
def test_a_seed_out_of_range_is_a_value_error_on_numpy_and_torch(seed):
    given = _draw("attention")
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
        symattn.load(ATTENTION).numpy().forward(**given, seed=seed)
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    module = load_torch_module(symattn.load(ATTENTION).emit("torch"), "seed_range")
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
        module.forward(**{n: torch.tensor(v) for n, v in given.items()}, seed=seed)


def test_spec_torch_module_seeds():
    """spec.torch(): a fresh seed per call in training (torch.manual_seed makes it repeatable), the given one
    when passed, and eval mode asks for one rather than dropping weights silently."""
    torch = pytest.importorskip("torch", reason="spec.torch() needs torch")
    module = symattn.load(ATTENTION).torch(backend="eager")
    t = {n: torch.tensor(v) for n, v in _draw("attention").items()}
    torch.manual_seed(3)
    a = module(**t)["O"]
    torch.manual_seed(3)
    b = module(**t)["O"]
    c = module(**t)["O"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    want, _, _ = _want(torch, "attention", _draw("attention"), SEEDS[2])
    _close(module(**t, seed=SEEDS[2])["O"].numpy(), want["O"], 1e-12, "spec.torch() with a seed")
    module.eval()
    with pytest.raises(TypeError, match="eval mode, and the spec applies dropout"):
        module(**t)


@pytest.mark.parametrize("name", CASES)
def test_triton_kernels_under_the_interpreter(name):
    torch = pytest.importorskip("torch", reason="the Triton target needs torch")
    pytest.importorskip("triton", reason="the Triton target needs triton (pip install symattn[torch])")
    from symattn.check.triton import interpreting, load_module as load_triton

    if not interpreting() and not torch.cuda.is_available():
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process")
    seed = SEEDS[1]
    given = _draw(name)
    rounded = {n: torch.tensor(v).float().double().numpy() for n, v in given.items()}
    want = _want(torch, name, rounded, seed)
    module = load_triton(symattn.load(CASES[name][0]).emit("triton").text, interpret=not torch.cuda.is_available())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = {n: torch.tensor(v, dtype=torch.float32, device=device) for n, v in rounded.items()}
    outs, grads = module.forward_backward(**t, seed=seed, **{f"grad_{o}": torch.tensor(u, dtype=torch.float32,
                                                                                      device=device)
                                                           for o, u in want[2].items()})
    _check({o: v.cpu().double().numpy() for o, v in outs.items()},
           {n: v.cpu().double().numpy() for n, v in grads.items()}, want, 1e-5, "triton fp32")


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_cuda_kernels_on_the_cpu(name, tmp_path):
    torch = pytest.importorskip("torch", reason="the references are written in torch")
    from symattn.check.cuda import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++20 compiler for the CUDA emulation")
    seed = SEEDS[1]
    given = _draw(name)
    rounded = {n: torch.tensor(v).float().double().numpy() for n, v in given.items()}
    want = _want(torch, name, rounded, seed)
    spec = symattn.load(CASES[name][0], dims={"N": CASES[name][1]["Q" if name == "attention" else "X"][-2]})
    outs, grads = run_cuda_on_cpu(spec, rounded, {f"grad_{o}": u for o, u in want[2].items()}, {}, 2, tmp_path,
                                  seed=seed)
    _check(outs, grads, want, 1e-5, "cuda fp32")


def test_the_backward_with_the_mask_drawn_equals_the_backward_with_it_given():
    """attention_dropout's modules (the mask drawn from the seed, forward and again backward) against the same
    spec with the mask a buffer `Z` given the contract's bits: outputs and gradients agree to rounding, on
    NumPy plain and tiled and on torch."""
    given_text = ATTENTION.read_text().replace("Pd = dropout(P, 0.1)", "Pd = P * Z / 0.9").replace(
        "input Q[H, N, d_k], K[H, N, d_k], V[H, N, d_k]", "input Q[H, N, d_k], K[H, N, d_k], V[H, N, d_k]\n"
        "buffer Z[H, N, N]")
    assert "buffer Z" in given_text and "dropout(" not in given_text.split("attention attention_dropout")[1]
    given = _draw("attention")
    seed = SEEDS[1]
    z = _mask(seed, 0, (2, 2, 37, 37), 0.1)
    upstream = {"grad_O": np.random.default_rng(4).standard_normal((2, 2, 37, 5))}
    drawn = load_module(symattn.load(ATTENTION).emit("numpy"), "drawn")
    buffered = load_module(symattn.load(given_text, filename="given.attn").emit("numpy"), "buffered")
    for module in (drawn, buffered):
        module.TILED_ABOVE, module.BLOCK_Q, module.BLOCK_K = 0, 8, 16
    a = drawn.forward_backward(**given, seed=seed, **upstream)
    b = buffered.forward_backward(**given, Z=z, **upstream)
    for x, y in zip(a, b):
        for key in y:
            np.testing.assert_allclose(x[key], y[key], rtol=1e-12, atol=1e-13)
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    t = {n: torch.tensor(v) for n, v in given.items()}
    up = {k: torch.tensor(v) for k, v in upstream.items()}
    tm = load_torch_module(symattn.load(ATTENTION).emit("torch"), "drawn_torch")
    got = tm.forward_backward(**t, seed=seed, **up)
    for x, y in zip(got, b):
        for key in y:
            np.testing.assert_allclose(x[key].numpy(), y[key], rtol=1e-11, atol=1e-12)


def test_p_zero_keeps_every_entry_and_draws_no_mask():
    """dropout(x, 0) (and any p below 2**-32, whose threshold is 0) keeps every entry on every run: no mask, so
    `check D == P` is proved, never refuted with a mask no run can draw."""
    text = ATTENTION.read_text().replace("dropout(P, 0.1)", "dropout(P, 0)").split("check")[0] + "check Pd == P\n"
    spec = symattn.load(text, filename="p0.attn")
    assert not spec.typed.dropouts and spec.typed.seed_keyword is None
    verdict = spec.check()[0]
    assert verdict.verdict == "proved", verdict.method
    tiny = symattn.load(ATTENTION.read_text().replace("dropout(P, 0.1)", "dropout(P, 1e-10)"))
    assert not tiny.typed.dropouts
    assert symattn.load(ATTENTION.read_text().replace("dropout(P, 0.1)", "dropout(P, 1e-9)")).typed.dropouts
