"""The tensor-core attention kernels (bf16 / f16, mma.sync), run on the CPU through cuda_warp.h's emulation.

Each case is a small spec whose attention core reads Q, K and V as inputs; the
test rounds random inputs to bf16 or f16 in NumPy and compares O and lse (and,
for the backward, dQ, dK, dV given a rounded grad(O)) with a plain NumPy
float64 attention of the rounded inputs and its hand-written gradient (scores,
masks, softcap and their derivatives written here), never with the generated
code or the spec evaluator.
Tolerances (`symattn.check.cuda_tensor_core.TC_TOLERANCE`): bf16 2e-2, f16
5e-3 on O (the kernels round P and O to the input type), 1e-4 on lse (fp32).
The cheap case runs by default; the sweep over specs, dtypes and head dims
and the nvcc/SASS gate are slow. Without g++ (or nvcc) they skip, saying why.
"""

from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest

import symattn
from symattn.check.cuda import build_cpu, compile_gate, find_cxx, find_nvcc
from symattn.check.cuda_tensor_core_tsan import tsan_tensor_cores
from symattn.check.cuda_tensor_core import (LSE_TOLERANCE, TC_TOLERANCE, decode, find_cuobjdump, round_to,
                                            run_backward, run_forward, tensor_core_resources)
from symattn.codegen.cuda import emit_cuda

CXX = find_cxx()
NVCC = find_nvcc()
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found: the CPU emulation needs C++20")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found: the SASS gate needs the CUDA toolkit")


def _attention(scores: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scores) @ v and the row logsumexp in float64; a row of -inf gives 0 and -inf."""
    top = scores.max(axis=-1, keepdims=True)
    dead = np.isneginf(top)
    p = np.exp(scores - np.where(dead, 0.0, top))
    total = p.sum(axis=-1, keepdims=True)
    safe = np.where(dead, 1.0, total)
    out = np.where(dead, 0.0, p / safe) @ v
    lse = np.where(dead, -np.inf, top + np.log(safe))[..., 0]
    return out, lse


def _rows_cols(n_q: int, n_k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n_q)[:, None], np.arange(n_k)[None, :]


def _scaled(q, k, d):
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(d)


def _mask(scores, keep):
    return np.where(keep, scores, -np.inf)


# name: (spec text, scores(q, k, sizes) in float64, d score / d (Q K^T) at each entry)
CASES = {
    "strict_causal": ("""attention strict_causal
dim N = 70, d = 64
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j < i, 0, -inf)     # row 0 sees no key: O = 0, lse = -inf
O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V
output O
""", lambda q, k, s: _mask(_scaled(q, k, s["d"]), _rows_cols(s["N"], s["N"])[1] < _rows_cols(s["N"], s["N"])[0]),
        lambda q, k, s: 1 / np.sqrt(s["d"])),
    "causal": ("""attention causal_tc
dim N = 70, d = 64
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j <= i, 0, -inf)
O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V
output O
""", lambda q, k, s: _mask(_scaled(q, k, s["d"]), _rows_cols(s["N"], s["N"])[1] <= _rows_cols(s["N"], s["N"])[0]),
        lambda q, k, s: 1 / np.sqrt(s["d"])),
    "window": ("""attention window_tc
dim N = 70, d = 64, w = 20
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j <= i, where(i - j < w, 0, -inf), -inf)
O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V
output O
""", lambda q, k, s: _mask(_scaled(q, k, s["d"]), (lambda i, j: (j <= i) & (i - j < s["w"]))(
        *_rows_cols(s["N"], s["N"]))), lambda q, k, s: 1 / np.sqrt(s["d"])),
    "softcap": ("""attention softcap_tc
dim N = 70, d = 64
input Q[N, d], K[N, d], V[N, d]
O = softmax(5 * tanh(Q @ K.T / sqrt(d) / 5), axis=-1) @ V
output O
""", lambda q, k, s: 5 * np.tanh(_scaled(q, k, s["d"]) / 5),
        lambda q, k, s: (1 - np.tanh(_scaled(q, k, s["d"]) / 5) ** 2) / np.sqrt(s["d"])),
    # keys from L on are padding (an index mask over whole key blocks), n_q != n_k
    "key_padding": ("""attention key_padding_tc
dim N = 70, T = 150, L = 100, d = 64
input Q[N, d], K[T, d], V[T, d]
M[i:N, j:T] = where(j < L, 0, -inf)
O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V
output O
""", lambda q, k, s: _mask(_scaled(q, k, s["d"]), _rows_cols(s["N"], s["T"])[1] < s["L"]),
        lambda q, k, s: 1 / np.sqrt(s["d"])),
    # heads, n_q != n_k, d_v != d_qk
    "cross_heads": ("""attention cross_heads
dim h = 2, N = 70, T = 130, d = 64, e = 32
input Q[h, N, d], K[h, T, d], V[h, T, e]
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
output O
""", lambda q, k, s: _scaled(q, k, s["d"]), lambda q, k, s: 1 / np.sqrt(s["d"])),
}


class Built:
    def __init__(self, root) -> None:
        self.root = root
        self.cache = {}

    def get(self, name: str):
        """The case's spec, code and CPU build (once per case: sizes are arguments at run time)."""
        if name not in self.cache:
            spec = symattn.load(CASES[name][0])
            code = emit_cuda(spec)
            self.cache[name] = (spec, code, ctypes.CDLL(str(build_cpu(code, self.root))))
        return self.cache[name]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return Built(tmp_path_factory.mktemp("tc"))


def _gradients(p: np.ndarray, slope, q, k, v, d_out):
    """dQ, dK, dV of L = <O, d_out> for O = P @ V, P = softmax(score(Q K^T)) (P = 0 where masked)."""
    dp = d_out @ np.swapaxes(v, -1, -2)
    dz = np.where(p > 0, p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * slope, 0.0)
    return dz @ k, np.swapaxes(dz, -1, -2) @ q, np.swapaxes(p, -1, -2) @ d_out


def _probabilities(scores: np.ndarray) -> np.ndarray:
    top = scores.max(axis=-1, keepdims=True)
    dead = np.isneginf(top)
    p = np.exp(scores - np.where(dead, 0.0, top))
    return np.where(dead, 0.0, p / np.where(dead, 1.0, p.sum(axis=-1, keepdims=True)))


def _run_case(built, name: str, dtype: str, sizes: dict[str, int], batch: int, seed: int = 0,
              backward: bool = False):
    spec, code, library = built.get(name)
    (forward,) = code.plan.tensor_cores
    dims = {n: sizes.get(n, spec.typed.sizes[n]) for n in spec.typed.dims}
    lead = (dims["h"],) if "h" in dims else ()
    n_q, n_k = dims["N"], dims.get("T", dims["N"])
    d_qk, d_v = dims["d"], dims.get("e", dims["d"])
    rng = np.random.default_rng(seed)
    bits, values = {}, {}
    for role, shape in (("q", (batch, *lead, n_q, d_qk)), ("k", (batch, *lead, n_k, d_qk)),
                        ("v", (batch, *lead, n_k, d_v))):
        bits[role], values[role] = round_to(2 * rng.standard_normal(shape), dtype)
    got, lse, status = run_forward(library, forward, dtype, list(dims.values()), batch, bits["q"], bits["k"],
                                   bits["v"], (batch, *lead, n_q, d_v))
    assert status == 0
    scores = CASES[name][1](values["q"], values["k"], dims)
    want, want_lse = _attention(scores, values["v"])
    if not backward:
        return decode(got, dtype), lse.astype(np.float64), want, want_lse
    bits["do"], values["do"] = round_to(rng.standard_normal(got.shape), dtype)
    grads, status = run_backward(library, forward, dtype, list(dims.values()), batch, dict(bits, o=got, lse=lse))
    assert status == 0
    want_grads = _gradients(_probabilities(scores), CASES[name][2](values["q"], values["k"], dims), values["q"],
                            values["k"], values["v"], values["do"])
    return grads, dict(zip(("dQ", "dK", "dV"), want_grads))


def _check(got, lse, want, want_lse, dtype):
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    assert np.all(np.isfinite(got))
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error <= TC_TOLERANCE[dtype], error
    finite = np.isfinite(want_lse)
    assert np.abs(lse[finite] - want_lse[finite]).max() / np.abs(want_lse[finite]).max() <= LSE_TOLERANCE
    return error


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@needs_cxx
def test_strict_causal_bf16_head_dim_64(built):
    """The cheap representative: a fully masked first row, N = 70 (two key tiles, the second ragged)."""
    got, lse, want, want_lse = _run_case(built, "strict_causal", "bf16", {"N": 70, "d": 64}, batch=1)
    assert np.isneginf(lse[0, 0]) and np.all(got[0, 0] == 0.0)
    _check(got, lse, want, want_lse, "bf16")


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("name", list(CASES))
def test_tensor_core_forward(built, name, head_dim, dtype):
    sizes = {"N": 100 if name != "cross_heads" else 70, "d": head_dim}
    got, lse, want, want_lse = _run_case(built, name, dtype, sizes, batch=2)
    _check(got, lse, want, want_lse, dtype)


def _check_gradients(grads, want, dtype):
    for label, value in want.items():
        assert np.all(np.isfinite(grads[label])), label
        error = np.abs(grads[label] - value).max() / np.abs(value).max()
        assert error <= TC_TOLERANCE[dtype], (label, error)


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("name", list(CASES))
def test_tensor_core_backward(built, name, head_dim, dtype):
    """dQ, dK, dV from the forward's own O and lse; the strict-causal row 0 gives zero dQ."""
    sizes = {"N": 100 if name != "cross_heads" else 70, "d": head_dim}
    grads, want = _run_case(built, name, dtype, sizes, batch=1, backward=True)
    _check_gradients(grads, want, dtype)
    if name == "strict_causal":
        assert np.all(grads["dQ"][:, 0] == 0.0)


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@needs_cxx
def test_nan_propagates_and_masked_entries_stay_exact(built):
    """A NaN in one query row makes that row's O and lse NaN and leaves the others as NumPy has them
    (the one-FFMA softmax on x = s + b / c with ex2.approx); N = 150: two 128-row blocks, the second ragged."""
    spec, code, library = built.get("causal")
    (forward,) = code.plan.tensor_cores
    n, d = 150, 64
    rng = np.random.default_rng(3)
    (qb, q), (kb, k), (vb, v) = (round_to(2 * rng.standard_normal((1, n, d)), "bf16") for _ in range(3))
    qb[0, 130, 5] = 0x7FC0  # a bf16 NaN in row 130, in the second block
    q[0, 130, 5] = np.nan
    got, lse, status = run_forward(library, forward, "bf16", [n, d], 1, qb, kb, vb, (1, n, d))
    assert status == 0
    got = decode(got, "bf16")
    want, want_lse = _attention(CASES["causal"][1](q, k, {"N": n, "d": d}), v)
    assert np.all(np.isnan(got[0, 130])) and np.isnan(lse[0, 130])
    rest = np.arange(n) != 130
    _check(got[:, rest], lse[:, rest].astype(np.float64), want[:, rest], want_lse[:, rest], "bf16")


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@needs_cxx
def test_backward_strict_causal_f16_head_dim_32(built):
    """The cheap representative of the backward (same build as the forward's)."""
    grads, want = _run_case(built, "strict_causal", "f16", {"N": 70, "d": 32}, batch=1, backward=True)
    _check_gradients(grads, want, "f16")


@pytest.mark.slow  # the emulated mma over 200 keys (6 s each)
@needs_cxx
@pytest.mark.parametrize("name, sizes", [("key_padding", {"N": 130, "T": 150, "L": 100, "d": 64}),
                                         ("window", {"N": 200, "w": 20, "d": 64})])
def test_backward_adds_dq_over_key_blocks(built, name, sizes):
    """dQ is the sum of every key block's atomic adds into a zeroed buffer (a row of dQ here takes two or
    three key blocks: a plain store, a missing zeroing or a lost block shows); key blocks and query tiles
    that the mask hides entirely are skipped: keys past L (a third key block) get dK = dV = 0 exactly, and
    the window's key blocks see query tiles before and after their live ones."""
    grads, want = _run_case(built, name, "bf16", sizes, batch=2, backward=True)
    _check_gradients(grads, want, "bf16")
    if name == "key_padding":
        assert np.all(grads["dK"][:, 100:] == 0.0) and np.all(grads["dV"][:, 100:] == 0.0)


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@needs_cxx
def test_backward_refuses_head_dim_256(built):
    spec, code, library = built.get("strict_causal")
    (forward,) = code.plan.tensor_cores
    x = np.zeros((1, 70, 256), np.uint16)
    lse = np.zeros((1, 70), np.float32)
    grads, status = run_backward(library, forward, "bf16", [70, 256], 1, dict(q=x, k=x, v=x, o=x, do=x, lse=lse))
    assert status == -4 and np.all(np.isnan(grads["dQ"]))


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("head_dim", [96, 256])
def test_the_other_head_dims(built, head_dim):
    got, lse, want, want_lse = _run_case(built, "causal", "f16", {"N": 90, "d": head_dim}, batch=1)
    _check(got, lse, want, want_lse, "f16")


@pytest.mark.slow
@needs_cxx
def test_a_smaller_head_dim_runs_zero_padded(built):
    """d = 40 takes the head-dim-64 kernel; the padding columns must not leak into O."""
    got, lse, want, want_lse = _run_case(built, "causal", "bf16", {"N": 130, "d": 40}, batch=1)
    _check(got, lse, want, want_lse, "bf16")


@needs_cxx
def test_unsupported_shapes_are_refused(built):
    """A head dim that is not a multiple of 8, or a misaligned pointer: SYMATTN_UNSUPPORTED, O untouched."""
    spec, code, library = built.get("strict_causal")
    (forward,) = code.plan.tensor_cores
    q = np.zeros((1, 70, 20), np.uint16)
    out, lse, status = run_forward(library, forward, "bf16", [70, 20], 1, q, q, q, (1, 70, 20))
    assert status == -4 and not out.any()
    q = np.zeros(70 * 64 + 1, np.uint16)[1:].reshape(1, 70, 64)  # 2 bytes past a 16-byte boundary
    out, lse, status = run_forward(library, forward, "bf16", [70, 64], 1, q, q, q, (1, 70, 64))
    assert status == -4


@pytest.mark.slow
@needs_nvcc
def test_sass_gate(tmp_path):
    """sm_90: HMMA in the SASS, no spills, at most 255 registers, at least one block per SM."""
    code = emit_cuda(symattn.load(CASES["causal"][0]))
    code.write(tmp_path)
    gate = compile_gate(tmp_path / code.source_name)
    assert gate.ok, gate.problems
    rows = {r.kernel: r for r in tensor_core_resources(gate.kernels, code)}
    for dtype in ("bf16", "f16"):
        for head_dim in (64, 128):
            for kind in ("fwd", "bwd"):
                row = rows[f"causal_tc_O_attn_tc_{kind}_{dtype}_d{head_dim}"]
                assert row.registers <= 255 and row.spill_bytes == 0 and row.blocks_per_sm >= 1
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found: the HMMA check needs it (the register and spill checks passed)")
    subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(tmp_path / code.source_name)],
                   check=True, capture_output=True)
    sass = subprocess.run([cuobjdump, "-sass", str(tmp_path / "k.cubin")], check=True, capture_output=True,
                          text=True).stdout
    for name in ("causal_tc_O_attn_tc_fwd_bf16_d64", "causal_tc_O_attn_tc_fwd_bf16_d128",
                 "causal_tc_O_attn_tc_bwd_bf16_d64", "causal_tc_O_attn_tc_bwd_bf16_d128"):
        body = sass.split(f"Function : {name}")[1].split("Function : ")[0]
        assert re.search(r"\bHMMA\.16816\.F32\.BF16\b", body), name
        assert re.search(r"\bLDSM\b", body) and re.search(r"\bLDGSTS\b", body), name
        # The backward adds its part of dQ with fp32 reductions to global memory (RED, the atomicAdd whose
        # result is unused): the CPU emulation runs blocks one after another, so only the SASS shows a
        # plain `+=`, which would lose updates between the key blocks on a GPU.
        assert ("_bwd_" not in name) or re.search(r"\bREDG?\.E\.ADD\.F32\b", body), name


# --- ThreadSanitizer over the bf16 entry points ------------------------------------------------


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("name", ["causal", "cross_heads"])
def test_bf16_forward_and_backward_under_tsan(tmp_path, name):
    """N = 67 (a ragged second query and key tile), head dim 64: no race report, results within tolerance."""
    spec = symattn.load(CASES[name][0])
    code = emit_cuda(spec)
    sizes = {n: v for n, v in {"N": 67, "T": 45, "d": 64, "h": 2, "e": 32}.items() if n in spec.typed.dims}
    race, cases = tsan_tensor_cores(build_cpu(code, tmp_path, tsan=True), code, sizes, batch=2)
    assert race == ""
    (case,) = cases
    assert case.ok and set(case.errors) == {"O", "lse", "dQ", "dK", "dV"}, case.problems


_UNMASKED = """attention plain_tc
dim N = 70, d = 64
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
output O
"""


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("text, marker", [
    (_UNMASKED, "__syncthreads();  // every warp is done with tile t before its buffers are refilled"),
    (CASES["causal"][0], "__syncthreads();  // every warp's dS^T of this part is in shared memory")])
def test_tsan_sees_the_tensor_core_kernels(tmp_path, text, marker):
    """The control: without the unmasked forward's barrier before a K/V buffer is refilled (with a mask the
    next tile's test has one), or the backward's between its dS^T stores and the dQ product that reads every
    warp's (which also orders the Q/dO refills), TSan reports a race."""
    code = emit_cuda(symattn.load(text))
    source = code.files[code.source_name]
    assert marker in source
    code.files[code.source_name] = source.replace(marker, "/* planted: no barrier */")
    race, _ = tsan_tensor_cores(build_cpu(code, tmp_path, tsan=True), code, {"N": 200, "d": 64}, batch=1)
    assert "data race" in race and "_O_attn_tc_" in race


def test_the_generated_forward_uses_one_ffma_for_causal():
    """A causal score c * (Q @ K.T) + mask folds into one FFMA per weight (`score_forms.softmax_parts`)."""
    spec = symattn.load("attention c\ndim N = 6, d = 4\ninput Q[N, d], K[N, d], V[N, d]\n"
                        "M[i:N, j:N] = where(j <= i, 0, -inf)\n"
                        "O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V\noutput O\n")
    code = emit_cuda(spec)
    text = code.files[code.source_name]
    assert "sa_ex2_approx(fmaf(s_acc_[g_][n_][e_], scale_, -base_[e_ >> 1]))" in text
    assert "const float scale_ = c_ * LOG2E;" in text
    assert "return SYMATTN_UNSUPPORTED;" in text.split("c_ > 0.0f && ")[1].split("\n")[0]
