"""The Triton target: fused attention kernels run under TRITON_INTERPRET=1 on CPU tensors.

References are plain torch float64 math written here (softmax of the score written out, autograd of
it for the gradients), never the generated code. Sizes are not tile multiples (tiles are 16 under the
interpreter): N = 37, d = 24, with a batch axis.

Triton fixes its interpreter mode when it is first imported, so the variable is set before that
import (each pytest-xdist worker is its own process; nothing else in the suite imports triton).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch", reason="the Triton target needs torch (pip install symattn[torch])")
pytest.importorskip("triton", reason="the Triton target needs triton (pip install symattn[torch])")

import symattn  # noqa: E402
from symattn.check.triton import interpreting, load_module, verify_triton  # noqa: E402
from symattn.codegen.triton import emit_triton  # noqa: E402
from symattn.errors import CodegenError  # noqa: E402
from conftest import REPO

ROOT = REPO
SPECS = {
    "self_attention": ROOT / "derivations" / "self_attention.attn",
    "causal": ROOT / "derivations" / "causal.attn",
    "key_padding": ROOT / "derivations" / "key_padding.attn",
    "multi_head": ROOT / "derivations" / "multi_head.attn",
    "alibi": ROOT / "derivations" / "alibi.attn",
    "softcap": ROOT / "derivations" / "softcap.attn",
    "sliding_window": ROOT / "derivations" / "sliding_window.attn",
}
B, N, D = 2, 37, 24

if not interpreting():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process", allow_module_level=True)

_MODULES: dict[str, object] = {}


def module(name: str):
    if name not in _MODULES:
        _MODULES[name] = load_module(emit_triton(symattn.load(SPECS[name]).typed).text, interpret=True)
    return _MODULES[name]


def _rows_cols():
    return torch.arange(N)[:, None], torch.arange(N)[None, :]


def _causal():
    i, j = _rows_cols()
    return torch.where(j <= i, 0.0, -math.inf).double()


# spec -> (heads, score tensors (name -> maker), score(s, tensors) in float64)
def _score_self(s, t):
    return s / math.sqrt(D)


def _score_causal(s, t):
    return s / math.sqrt(D) + _causal()


def _score_alibi(s, t):
    i, j = _rows_cols()
    return s / math.sqrt(D) + t["m"] * (j - i).double() + _causal()


def _score_softcap(s, t):
    return 50 * torch.tanh(s / math.sqrt(D) / 50)


def _score_window(s, t):
    i, j = _rows_cols()
    return s / math.sqrt(D) + torch.where((j <= i) & (i - j < 2), 0.0, -math.inf).double()


def _score_padding(s, t):
    return s / math.sqrt(D) + torch.where(t["keep"] > 0, 0.0, -math.inf)[..., None, None, :].squeeze(-3)


def _keep():
    keep = torch.ones(B, N, dtype=torch.float64)
    keep[0, 5:9] = -1.0
    keep[1, 30:] = 0.0
    return keep


CASES = {
    "self_attention": ((), {}, _score_self),
    "causal": ((), {}, _score_causal),
    "multi_head": ((3,), {}, _score_self),
    "alibi": ((3,), {"m": lambda: torch.randn(3, 1, 1, dtype=torch.float64)}, _score_alibi),
    "softcap": ((), {}, _score_softcap),
    "sliding_window": ((), {}, _score_window),
    "key_padding": ((), {"keep": _keep}, _score_padding),
}


def reference(score, q, k, v, tensors):
    s = score(q @ k.transpose(-1, -2), tensors)
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1, keepdim=True)


def _inputs(heads, scale=1.0, seed=0):
    torch.manual_seed(seed)
    shape = (B, *heads, N, D)
    q, k, v, do = (torch.randn(shape, dtype=torch.float64) for _ in range(4))
    return q * scale, k, v, do


def _compare(got, want, tol):
    got = got.double()
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    assert torch.equal(got[~finite], want[~finite])
    scale = max(want[finite].abs().max().item(), 1e-3) if finite.any() else 1.0
    assert (got[finite] - want[finite]).abs().max().item() <= tol * scale


@pytest.mark.parametrize("name", list(CASES))
def test_forward_backward_match_float64_reference(name):
    heads, makers, score = CASES[name]
    mod = module(name)
    q, k, v, do = _inputs(heads)
    tensors = {n: make() for n, make in makers.items()}
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    learned = {n: x.clone().requires_grad_() for n, x in tensors.items() if n != "keep"}
    o_ref, lse_ref = reference(score, *leaves, {**tensors, **learned})
    o_ref.backward(do)

    operands = [tensors[n].float() for n in makers]
    o, lse = mod.attention_forward(q.float(), k.float(), v.float(), *operands)
    _compare(o, o_ref.detach(), 2e-5)
    _compare(lse, lse_ref.detach(), 2e-5)
    grads = mod.attention_backward(q.float(), k.float(), v.float(), o, lse, do.float(), *operands)
    for got, leaf in zip(grads[:3], leaves):
        _compare(got, leaf.grad, 5e-5)
    for got, n in zip(grads[3:], makers):
        if n in learned:
            _compare(got, learned[n].grad, 5e-5)
        else:
            assert got is None  # a buffer has no gradient


def test_fully_masked_rows_give_zero_not_nan():
    mod = module("key_padding")
    q, k, v, do = _inputs(())
    keep = _keep()
    keep[1] = -1.0  # every key of batch entry 1 is padding: all its rows are fully masked
    o, lse = mod.attention_forward(q.float(), k.float(), v.float(), keep.float())
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert torch.isneginf(lse[1]).all() and torch.isfinite(lse[0]).all()
    dq, dk, dv, dkeep = mod.attention_backward(q.float(), k.float(), v.float(), o, lse, do.float(), keep.float())
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all() and torch.equal(g[1], torch.zeros_like(g[1]))


def test_large_logits_do_not_overflow():
    mod = module("causal")
    q, k, v, do = _inputs((), scale=1.0)
    q = q / q.norm(dim=-1, keepdim=True) * 1e2
    k = k / k.norm(dim=-1, keepdim=True) * 1e2 * math.sqrt(D) / 1e0  # logits up to 1e4
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ref, lse_ref = reference(_score_causal, *leaves, {})
    assert lse_ref.max().item() > 5e3
    o, lse = mod.attention_forward(q.float(), k.float(), v.float())
    assert torch.isfinite(o).all()
    _compare(o, o_ref.detach(), 1e-4)
    _compare(lse, lse_ref.detach(), 1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
def test_half_precision_inputs_accumulate_in_float32(dtype, tol):
    mod = module("alibi")
    q, k, v, do = _inputs((3,))
    m = torch.rand(3, 1, 1, dtype=torch.float64) * 0.1
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ref, lse_ref = reference(_score_alibi, *leaves, {"m": m})
    o_ref.backward(do)
    o, lse = mod.attention_forward(q.to(dtype), k.to(dtype), v.to(dtype), m.float())
    assert o.dtype == dtype and lse.dtype == torch.float32
    _compare(o.float(), o_ref.detach(), tol)
    grads = mod.attention_backward(q.to(dtype), k.to(dtype), v.to(dtype), o, lse, do.to(dtype), m.float())
    for got, leaf in zip(grads[:3], leaves):
        assert got.dtype == dtype
        _compare(got.float(), leaf.grad, 4 * tol)


def test_autograd_function_gives_the_fused_gradients():
    mod = module("alibi")
    q, k, v, do = _inputs((3,))
    m = torch.randn(3, 1, 1)
    args = [x.float().requires_grad_() for x in (q, k, v)] + [m.clone().requires_grad_()]
    mod.attention(*args).backward(do.float())
    qs, ks, vs, ms = (x.double().detach().requires_grad_() for x in args)
    reference(_score_alibi, qs, ks, vs, {"m": ms})[0].backward(do)
    for got, want in zip(args, (qs, ks, vs, ms)):
        _compare(got.grad, want.grad, 5e-5)


def test_unbatched_inputs_and_window_keyword():
    mod = module("sliding_window")
    q, k, v, do = _inputs(())
    o, lse = mod.attention_forward(q[0].float(), k[0].float(), v[0].float(), w=5)
    i, j = _rows_cols()
    s = q[0] @ k[0].T / math.sqrt(D) + torch.where((j <= i) & (i - j < 5), 0.0, -math.inf).double()
    _compare(o, torch.softmax(s, -1) @ v[0], 2e-5)


def test_tile_skipping_bounds_in_the_kernels():
    text = emit_triton(symattn.load(SPECS["sliding_window"]).typed).text
    assert "lo_ = tl.maximum(lo_, -D_w + I0_ + 1)" in text and "hi_ = tl.minimum(hi_, I1_ + 1)" in text
    assert "hi_ = tl.minimum(hi_, D_w + J1_)" in text
    padding = emit_triton(symattn.load(SPECS["key_padding"]).typed).text
    assert "tl.maximum(lo_" not in padding  # a data-dependent mask skips no tile


def test_spec_without_a_core_is_a_clear_error():
    with pytest.raises(CodegenError, match="no attention core"):
        emit_triton(symattn.load(ROOT / "derivations" / "additive.attn").typed)


@pytest.mark.parametrize("name", ["alibi", "key_padding"])
def test_verify_against_reference_evaluator(name):
    report = verify_triton(symattn.load(SPECS[name]).typed)
    assert report.ok, "\n".join(report.lines())


@pytest.mark.parametrize("path", [ROOT / "derivations" / "document_offsets.attn", ROOT / "tests" / "data" /
                                  "dilated_heads.attn"], ids=["document_offsets", "dilated_heads"])
def test_verify_draws_integer_buffers_from_their_ranges(path):
    """Integer buffers (document ids, divisors read from them) get integers in their declared ranges, which the
    module requires (it refused the normal draws: "an integer buffer, got entries that are not integers")."""
    report = verify_triton(symattn.load(path).typed)
    assert report.ok, "\n".join(report.lines())
    assert any("full module" in row.what for row in report.rows)


def test_cli_emit_and_verify(tmp_path):
    out = tmp_path / "alibi_triton.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "symattn", "emit", "triton", str(SPECS["alibi"]), "-o", str(out)],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "def attention_backward(q, k, v, o, lse, do, m, dlse=None, **dims)" in out.read_text()
    done = subprocess.run([sys.executable, "-m", "symattn", "verify", str(SPECS["causal"]), "--target", "triton"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 of 9 tensors within tolerance" in done.stdout  # the core, then the full module


@pytest.mark.slow
def test_compile_gate_sm90_tensor_cores_no_spills():
    """Every kernel compiled ahead of time for sm_90 in bf16 (a subprocess: this one interprets)."""
    specs = [str(SPECS[n]) for n in ("self_attention", "causal", "alibi", "key_padding", "softcap", "sliding_window")]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_gate.py"), *specs], capture_output=True, text=True,
                          env=env, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "_O_" in line]
    assert len(rows) == 6 * 4 * 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[6] == "0", row  # no spills
        if not cells[1].endswith("_delta"):
            assert "HGMMA" in cells[7] or "HMMA" in cells[7], row


# --- the full module: torch segments around the fused cores ----------------------------------------

def _given(typed, rng):
    """Random NumPy values of every given tensor at N = 37, with a batch axis on inputs and buffers."""
    import numpy as np
    import sympy

    values = {}
    sizes = {typed.dims[k].symbol: v for k, v in {**typed.sizes, "N": N}.items()}
    for name in typed.given:
        info = typed.tensors[name]
        shape = [int(sympy.sympify(d).subs(sizes)) for d in info.shape]
        if info.kind != "param":
            shape = [B, *shape]
        values[name] = np.where(rng.random(shape) < 0.2, -1.0, 1.0) if info.kind == "buffer" \
            else rng.standard_normal(shape)
    return values


@pytest.mark.parametrize("name", ["self_attention", "causal", "alibi", "key_padding"])
def test_full_module_matches_the_numpy_module(name):
    import numpy as np
    from symattn.codegen.numpy.emit import load_module as load_numpy

    spec = symattn.load(SPECS[name])
    full = load_module(emit_triton(spec.typed).text, interpret=True)
    reference = load_numpy(spec.emit("numpy"))
    rng = np.random.default_rng(1)
    given = _given(spec.typed, rng)
    outs = reference.forward(**given)
    upstream = {f"grad_{o}": rng.standard_normal(outs[o].shape) for o in spec.typed.outputs}
    want_out, want_grad = reference.forward_backward(**given, **upstream)
    got_out, got_grad = full.forward_backward(**{k: torch.tensor(v, dtype=torch.float32)
                                                 for k, v in {**given, **upstream}.items()})
    assert set(got_grad) == set(spec.typed.differentiable)
    for got, want in [*((got_out[k], v) for k, v in want_out.items()), *((got_grad[k], v) for k, v in want_grad.items())]:
        _compare(got, torch.from_numpy(np.asarray(want, dtype=np.float64)), 2e-5)
    plain = full.forward(**{k: torch.tensor(v, dtype=torch.float32) for k, v in given.items()})
    for k, v in want_out.items():
        _compare(plain[k], torch.from_numpy(v), 2e-5)


@pytest.mark.parametrize("name", ["alibi", "key_padding"])
def test_spec_torch_triton_backend_matches_eager(name):
    spec = symattn.load(SPECS[name])
    eager = spec.torch(backend="eager")
    fused = spec.torch(backend="triton")
    fused.load_state_dict(eager.state_dict())
    torch.manual_seed(3)
    d = spec.typed.sizes["d"]
    x = torch.randn(B, N, d)
    inputs = {"X": x}
    if name == "key_padding":
        keep = _keep().float()
        inputs["keep"] = keep
    results = []
    for module_ in (eager, fused):
        leaf = x.clone().requires_grad_()
        out = module_(**{**inputs, "X": leaf})["O"]
        out.backward(torch.ones_like(out) + 0.5 * torch.arange(out.shape[-1]))
        results.append((out.detach(), leaf.grad, {n: p.grad.clone() for n, p in module_.named_parameters()}))
        module_.zero_grad()
    (o_e, dx_e, dp_e), (o_f, dx_f, dp_f) = results
    _compare(o_f, o_e.double(), 2e-5)
    _compare(dx_f, dx_e.double(), 5e-5)
    assert set(dp_f) == set(dp_e)
    for n in dp_e:
        _compare(dp_f[n], dp_e[n].double(), 5e-5)


def test_an_output_read_again():
    """O and R = O * O both outputs: what flows back into the core is grad_O + 2 * grad_R * O (plain NumPy
    here: the textbook softmax backward in float64)."""
    import numpy as np

    text = ("attention read_again\ndim N = 8, d = 4\ninput Q[N, d], K[N, d], V[N, d]\n"
            "O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\nR = O * O\noutput O, R\n")
    rng = np.random.default_rng(3)
    q, k, v, go, gr = (rng.standard_normal((2, 23, 4)) for _ in range(5))
    p = np.exp(q @ k.swapaxes(-1, -2) / 2 - (q @ k.swapaxes(-1, -2) / 2).max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = p @ v
    do = go + 2 * gr * o
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / 2
    want = (o, o * o, ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ do)
    module = load_module(emit_triton(symattn.load(text).typed).text, interpret=not torch.cuda.is_available())
    outs, grads = module.forward_backward(**{n: torch.tensor(x, dtype=torch.float32) for n, x in zip(
        ("Q", "K", "V", "grad_O", "grad_R"), (q, k, v, go, gr))})
    for got, expected in zip((outs["O"], outs["R"], grads["Q"], grads["K"], grads["V"]), want):
        got = got.detach().cpu().double().numpy()
        assert np.abs(got - expected).max() / np.abs(expected).max() < 2e-5


def test_verify_a_core_whose_operands_are_one_tensor():
    """R = softmax(O @ O.T / sqrt(d)) @ O: the core's check compares the sum of the three role gradients with
    the finite differences of O (it compared each role with the whole, and failed)."""
    text = ("attention self_read\ndim N = 8, d = 4\ninput Q[N, d], K[N, d], V[N, d]\n"
            "O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\nR = softmax(O @ O.T / sqrt(d), axis=-1) @ O\n"
            "output O, R\n")
    report = verify_triton(symattn.load(text).typed)
    assert report.ok, "\n".join(report.lines())
    assert [r.what for r in report.rows].count("grad(O) through R") == 1


def test_verify_a_core_that_is_an_unnamed_subexpression():
    """`O = 2 * (softmax(Q @ K.T) @ V)`: the plan names the core (`attn`); verify checks it and the module."""
    text = ("attention unnamed\ndim N = 6, d = 3\ninput Q[N, d], K[N, d], V[N, d]\n"
            "O = 2 * (softmax(Q @ K.T, axis=-1) @ V)\noutput O\n")
    report = verify_triton(symattn.load(text).typed)
    assert report.ok, "\n".join(report.lines())
    assert any("attn" in row.what for row in report.rows)


def test_triton_backend_double_backward_and_jvp_against_a_plain_reference():
    """spec.torch(backend="triton"): the forward through the Triton kernels, double backward and forward mode
    through the eager passes written as specs (never zero): against torch autograd and torch.func.jvp on a
    plain torch reference."""
    spec = symattn.load("attention core\ndim N = 16, d = 16\ninput Q[N, d], K[N, d], V[N, d]\n"
                        "O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\noutput O\n")
    module = spec.torch(backend="triton").double()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(16, 16, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))

    def reference(a, b, c):
        return torch.softmax(a @ b.T / 4, dim=-1) @ c
    results = []
    for f in (lambda a, b, c: module(Q=a, K=b, V=c)["O"], reference):
        grads = torch.autograd.grad(f(q, k, v).pow(2).sum(), (q, k, v), create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in grads), (q, k, v))
        tangent = torch.func.jvp(lambda a: f(a, k.detach(), v.detach()), (q.detach(),), (torch.ones_like(q),))[1]
        results.append((second, tangent))
    (got, got_t), (want, want_t) = results
    for a, b in zip(got, want):  # the Triton kernels compute in float32: the first order is good to ~1e-7
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_t, want_t, rtol=1e-9, atol=1e-10)
