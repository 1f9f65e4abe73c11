"""CUDA generation: the path chosen, the nvcc compile gate, and the same kernels run on the CPU.

Every spec in derivations/ is emitted once per session (`emitted`, cheap). The tests that
build kernels are marked slow (`python -m pytest -m slow`): for them each spec's CPU build
(ctypes), its ThreadSanitizer build and its nvcc compile gate run two at a time in the
background while the first of them start (`builds`), cached in one temporary directory.
Results are compared with the float64 reference evaluator (`symattn.check.cuda.reference`),
an independent op-by-op computation, never with the generated code itself. A missing nvcc
or g++ skips the tests that need it, with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import sympy

import symattn
from conftest import EXAMPLES, REPO, run_cli
from symattn.codegen.cuda import emit_cuda
from symattn.codegen.cuda.emit import render
from symattn.codegen.cuda.plan import lower
from symattn.codegen.program import CodegenError, Definition, build_program
from symattn.check.cuda import (_Runner, _concrete, build_cpu, build_directory, compile_gate, find_cxx, find_nvcc, gate_cached,
                                 parse_ptxas, reference, verify_cuda, verify_sizes)
from symattn.check.cuda_sizes import head_dim_sizes, instantiation
from symattn.codegen.cuda.flash import HEAD_DIMS

NVCC = find_nvcc()
CXX = find_cxx()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found: the compile gate needs the CUDA toolkit")
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found: running the kernels on the CPU needs C++20")

FUSED = {"self_attention": "O", "causal": "O", "positional": "O", "cross_attention": "O", "multi_head": "Z",
         # The fused kernels inline score expressions: soft-capping's 50 * tanh(S / 50), the sliding window's
         # index-notation mask, and reads of given tensors (ALiBi's slopes, a padding buffer, a learned bias
         # table, cosine attention's learned temperature), with heads broadcast (GQA, MQA), two products
         # joined (MLA), the row log-sum-exp returned, the weights masked after the softmax (dropout).
         "softcap": "O", "sliding_window": "O",
         "rope_interleaved": "O", "rope_half": "O",
         "kv_cache_decode": "O",  # one query row over the cache and the new key: the core fuses
         "alibi": "O", "cosine": "O", "gqa": "O", "key_padding": "O", "relative_bias": "O",
         "alibi_learned": "O", "causal_bottom_right": "O", "dropout_mask": "O", "lse_output": "O", "mla": "O",
         "mqa": "O", "padding_qk": "O", "prefix_lm": "O", "t5_bias": "O",
         # the mask language: integer buffers read through subscripts, // % clamp, floor of log2 into a table
         "document_offsets": "O", "dilated_window": "O", "window_zero_side": "O", "alibi_exp2": "O",
         "natten_2d": "O", "flamingo_intervals": "O", "t5_buckets": "O",
         "attention_dropout": "O"}  # dropout's mask drawn in the fused kernels
STEMS = [p.stem for p in EXAMPLES]


class Emitted:
    """Each example spec and its emitted CUDA code, by stem."""

    def __init__(self) -> None:
        self.specs = {p.stem: symattn.load(p) for p in EXAMPLES}
        self.codes = {stem: emit_cuda(spec) for stem, spec in self.specs.items()}


class Builds:
    """The emitted code's background builds: (stem, kind) -> Future (kind: plain, tsan, gate)."""

    def __init__(self, emitted: Emitted, root) -> None:
        self.root = root
        self.specs, self.codes = emitted.specs, emitted.codes
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.jobs = {}
        for code in self.codes.values():  # write every build directory before any job reads one
            build_directory(code, root)
        for stem, code in self.codes.items():  # the slowest (TSan) builds first
            if CXX:
                self.jobs[(stem, "tsan")] = self.pool.submit(build_cpu, code, root, True)
        for stem, code in self.codes.items():
            if CXX:
                self.jobs[(stem, "plain")] = self.pool.submit(build_cpu, code, root, False)
            if NVCC:
                self.jobs[(stem, "gate")] = self.pool.submit(gate_cached, code, root)

    def result(self, stem: str, kind: str):
        return self.jobs[(stem, kind)].result()


@pytest.fixture(scope="session")
def emitted() -> Emitted:
    return Emitted()


@pytest.fixture(scope="session")
def builds(emitted, tmp_path_factory):
    built = Builds(emitted, tmp_path_factory.mktemp("cuda"))
    yield built
    built.pool.shutdown(wait=True, cancel_futures=True)


# --- which path -------------------------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_path_choice(emitted, stem):
    code = emitted.codes[stem]
    if stem in FUSED:
        assert code.path == "fused"
        assert [c.output for c in code.plan.cores] == [FUSED[stem]]
        assert any("_attn_fwd_d64" in name for name in code.kernel_names())
    else:
        assert code.path == "generic" and not code.plan.cores


def test_multi_head_heads_and_batch_fold_into_grid_x(emitted):
    """Row blocks x heads x batch on grid.x (up to 2^31 - 1 blocks), not heads and batch on y and z (65535)."""
    code = emitted.codes["multi_head"]
    (core,) = code.plan.cores
    assert [str(d) for d in core.lead] == ["h"]
    (forward,) = [k for k in code.plan.forward if k.variants]
    assert forward.grid[1:] == ("1", "1")
    assert forward.grid[0].endswith(f"* (h) * {code.plan.batch}")
    rows = "SA_ATTN_ROWS_FOR(d_k)"  # threads (rows) per block of the variant launched: 32 above head dim 64
    assert forward.block == (rows, "1", "1")
    assert [(limit.blocks, limit.most) for limit in forward.limits] == [
        (f"(long long)((N + {rows} - 1) / {rows}) * (h) * {code.plan.batch}", "SA_GRID_X_MAX")]


def test_fused_path_never_stores_the_attention_matrix(emitted):
    for stem in FUSED:
        plan = emitted.codes[stem].plan
        n2 = [b for b in plan.workspace if len(b.shape) >= 2 and b.shape[-1] == b.shape[-2]
              and str(b.shape[-1]) in ("N", "M")]
        assert not n2, f"{stem}: {[b.name for b in n2]} are N x N buffers"


# --- the compile gate -----------------------------------------------------------------------


# --- a lowering of the program IR --------------------------------------------------------

LOWERED = """
dim N = 4, d = 3
input X[N, d]
param W[d, d]
H = tanh(X @ W)
O = H * X
output O
"""


def test_kernels_lower_the_program_they_are_given():
    """The kernels compute what the program's statements define (`Stmt.defines`), not the spec's text."""
    spec = symattn.load(LOWERED, filename="lowered.attn").typed
    program = build_program(spec)
    (stmt,) = [s for s in program.stmts if s.defines == Definition("H", False, spec.tensors["H"].expr)]
    before = render(lower(program))["lowered.cu"]
    stmt.defines = Definition("H", False, dataclasses.replace(stmt.defines.expr, fn="sigmoid"))
    after = render(lower(program))["lowered.cu"]
    assert "tanhf(" in before and "tanhf(" not in after
    assert "expf(" not in before and "expf(" in after  # sigmoid's CUDA spelling


def test_a_tensor_named_like_an_upstream_keyword():
    """backward(grad_O=...) is the NumPy module's keyword: only the NumPy target refuses a tensor grad_O."""
    spec = symattn.load(LOWERED.replace("H", "grad_O"), filename="clash.attn")
    with pytest.raises(CodegenError, match="tensor grad_O has the name of the keyword that passes grad\\(O\\)"):
        spec.emit("numpy")
    assert "clash_grad_O" in emit_cuda(spec).kernel_names()


# Kernels that ptxas compiles with a register spill, by spec: a strict xfail each, so that a new spill
# anywhere else fails, and one that goes away is noticed. Empty since issue 14 (alibi's P and cosine's
# grad_Q/grad_K spilled around an IEEE division's slow path until the generic kernels' __launch_bounds__
# named a minimum of blocks per SM).
KNOWN_SPILLS: dict[str, set[str]] = {}


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("stem", STEMS)
def test_compile_gate(builds, stem):
    gate = builds.result(stem, "gate")
    if stem in KNOWN_SPILLS:
        spilled = {k.name for k in gate.kernels if k.spill_stores or k.spill_loads}
        assert spilled == KNOWN_SPILLS[stem], gate.problems
        assert all("register spills" in p for p in gate.problems), gate.problems
        pytest.xfail(f"known register spills in {sorted(spilled)} (generic scalar kernels)")
    assert gate.ok, gate.problems
    names = {k.name for k in gate.kernels}
    assert set(builds.codes[stem].kernel_names()) <= names
    for kernel in gate.kernels:
        assert kernel.spill_stores == kernel.spill_loads == 0
        assert kernel.shared_bytes <= 48 * 1024 and 0 < kernel.registers <= 255


def test_parse_ptxas():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spec_O_attn_fwd_d64' for 'sm_90'
ptxas info    : Function properties for spec_O_attn_fwd_d64
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'spec_delta' for 'sm_90'
ptxas info    : Function properties for spec_delta
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 29 registers, used 0 barriers, 384 bytes cmem[0]
"""
    fwd, delta = parse_ptxas(text)
    assert (fwd.name, fwd.registers, fwd.shared_bytes, fwd.spill_stores, fwd.spill_loads, fwd.stack_bytes) == \
        ("spec_O_attn_fwd_d64", 168, 16384, 4, 12, 8)
    assert (delta.name, delta.registers, delta.shared_bytes, delta.spill_stores) == ("spec_delta", 29, 0, 0)


def test_compile_gate_skips_without_nvcc(tmp_path):
    gate = compile_gate(tmp_path / "x.cu", nvcc=None) if NVCC is None else None
    if gate is None:
        from symattn.check import cuda as verify_cuda

        original = verify_cuda.find_nvcc
        verify_cuda.find_nvcc = lambda: None
        try:
            gate = verify_cuda.compile_gate(tmp_path / "x.cu")
        finally:
            verify_cuda.find_nvcc = original
    assert gate.ok and "nvcc not found" in gate.skipped


# --- running on the CPU -------------------------------------------------------------------


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("stem", STEMS)
def test_verify_forward_backward_with_and_without_tsan(builds, stem):
    builds.result(stem, "plain"), builds.result(stem, "tsan")
    spec, code = builds.specs[stem], builds.codes[stem]
    report = verify_cuda(spec, code=code, gate=False, tsan=True, workdir=builds.root)
    expected = {*spec.outputs, *(f"grad({x})" for x in spec.typed.differentiable)}
    assert set(report.errors) == expected == set(report.tsan_errors)
    assert report.ok, report.problems
    assert report.tsan_report == ""
    assert all(n % 16 for n in report.sizes.values())
    rows = [sympy.sympify(c.n_q) for c in code.plan.cores]
    if all(r.is_Symbol for r in rows):  # (NATTEN's rows are an H x W grid: no one dim spans the tiles)
        assert max(report.sizes.values()) > 64
    # A fused path runs every head-dim instantiation: the main sizes one, the other runs the rest.
    if code.plan.cores:
        (core,) = code.plan.cores
        main = instantiation(int(sympy.sympify(core.d_qk).subs(
            {spec.typed.dims[n].symbol: v for n, v in report.sizes.items()})))
        assert sorted([main, *(run.head_dim for run in report.head_dim_runs)]) == list(HEAD_DIMS)
        for run in report.head_dim_runs:
            assert set(run.errors) == expected == set(run.tsan_errors)
    else:
        assert report.head_dim_runs == []


@pytest.mark.slow
@needs_cxx
def test_tsan_catches_a_missing_syncthreads(builds):
    """Remove the barrier that keeps the next K/V tile from overwriting the one other threads still read."""
    code = emit_cuda(builds.specs["self_attention"])
    source = code.source_name
    text = code.files[source]
    marker = "__syncthreads();  // every thread is done with the tiles before they are overwritten"
    at = text.index(marker, text.index("_forward("))
    code.files[source] = text[:at] + "/* planted: no barrier */" + text[at + len(marker):]
    report = verify_cuda(builds.specs["self_attention"], code=code, gate=False, tsan=True, workdir=builds.root)
    assert report.tsan_report and "data race" in report.tsan_report
    assert "self_attention_O_attn_forward" in report.tsan_report
    assert "ThreadSanitizer reported a data race" in report.problems and not report.ok


def test_head_dim_sizes_reach_every_instantiation(emitted):
    """The verify sizes and head_dim_sizes together select every HEAD_DIMS instantiation, moving only
    the dims of the head dims (d_k; h in rope's 2 * h; MLA's d_c) and keeping sizes valid."""
    assert HEAD_DIMS == (32, 64, 128)
    for stem in FUSED:
        spec, code = emitted.specs[stem].typed, emitted.codes[stem]
        (core,) = code.plan.cores
        sizes = verify_sizes(spec)
        others = head_dim_sizes(spec, code, sizes)

        def head_dim(values):
            subs = {spec.dims[n].symbol: v for n, v in values.items()}
            return max(int(sympy.sympify(core.d_qk).subs(subs)), int(sympy.sympify(core.d_v).subs(subs)))

        assert sorted(instantiation(head_dim(s)) for s in [sizes, *others]) == [32, 64, 128], stem
        for other in others:
            assert head_dim(other) in (39, 40, 71, 72), (stem, other)
            # Only head dims move, and the sequence lengths shrink (emulation time): 67 -> 41, 45 -> 33.
            moved = {str(x) for d in (core.d_qk, core.d_v) for x in sympy.sympify(d).free_symbols}
            assert {n for n in other if other[n] != sizes[n]} <= moved | {"N", "M", "T"}, (stem, other)
            assert all(other[n] in (41, 33) for n in ("N", "M", "T") if n in other), (stem, other)
    assert head_dim_sizes(emitted.specs["additive"].typed, emitted.codes["additive"], {}) == []


@pytest.mark.slow
@needs_cxx
def test_head_dim_limit(builds):
    """A head dim above the largest instantiation (128) is refused with status -2."""
    spec, code = builds.specs["self_attention"], builds.codes["self_attention"]
    builds.result("self_attention", "plain")
    runner = _Runner(build_cpu(code, builds.root), code)
    p = code.plan
    sizes = {"N": 5, "d": 3, "d_k": 130}
    arrays = {id(b): np.zeros(_concrete(b, sizes, 1), np.float32)
              for b in (*p.inputs, *p.outputs, *p.upstream, *p.gradients)}
    with pytest.raises(RuntimeError, match="returned -2"):
        runner(arrays, [5, 3, 130, 1])


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("stem", ["causal", "multi_head"])
def test_generic_path_for_attention(builds, stem):
    """The generic path is correct for attention too (masks, heads), not just where it is chosen."""
    report = verify_cuda(builds.specs[stem], fused=False, gate=False, tsan=False, workdir=builds.root)
    assert report.path == "generic" and report.ok, report.problems


NEW_SPECS = {
    # Operands written inline, a per-head index-notation bias (ALiBi): fused, heads on the grid.
    "alibi_inline": """
dim N = 6, d = 4, h = 2, k = 3
input X[N, d]
param W_q[h, d, k], W_k[h, d, k], W_v[h, d, k], W_o[h * k, d]
B[g:h, i:N, j:N] = -(2 ^ (-(g + 1))) * abs(i - j)
Z = softmax((X @ W_q) @ (X @ W_k).T / sqrt(k) + B, axis=-1) @ (X @ W_v)
O = merge_heads(Z) @ W_o
output O
""",
    # A nonlinear score read three times (soft-capping) and a where on it: fused, d score/ds by forward mode.
    "softcap": """
dim N = 5, M = 7, d = 3
input Q[N, d], K[M, d], V[M, d]
S = 3 * tanh(Q @ K.T / 3)
O = softmax(where(S > 1, S, S * 0.5), axis=-1) @ V
output O
""",
    # Everything else: generic kernels for relu, sigmoid, logsumexp, mean, split/merge heads, concat, powers,
    # scalar and vector params, index notation with sums, softmax over axis 0, two outputs.
    "assorted": """
dim N = 6, d = 4, h = 2
input X[N, d], Y[N, d]
param w[d], b, W[d, d]
H = relu(X @ W) + sigmoid(Y) * b
L = logsumexp(H, axis=-1)
m = mean(H, axis=0)
T = split_heads(H, h)
C = concat(H, Y, axis=-1)
U = sum(C ^ 2, axis=-1) - L + exp(-abs(b))
R = merge_heads(T * 2) + X * sin(w) + cos(m)
E[i, j] = sum(k, X[i, k] * Y[j, k]) + where(i == j, 1, 0)
O = softmax(E, axis=0) @ R
output O, U
""",
    # Row 0 has no allowed key: zero weights, zero output, zero gradients, never NaN (both paths).
    "masked_rows": """
dim N = 5, d = 3
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j < i, 0, -inf)
O = softmax(Q @ K.T + M, axis=-1) @ V
output O
""",
    # Batched 3-D inputs, transpose of a batched product, concat along axis 0, a mean over everything;
    # also run through the compile gate (ptxas once spilled in one of these matmuls).
    "batched_3d": """
dim N = 3, d = 2, h = 2
input X[h, N, d], Y[N, d]
param W[d, d]
Z = transpose(X @ W) @ Y
O = concat(Z, Z * 2, axis=0) / mean(Z)
output O
""",
    # Logits in the hundreds: the online softmax stays finite and as accurate as float32 allows.
    "large_logits": """
dim N = 5, d = 3
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T * 100, axis=-1) @ V
output O
""",
}


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("name", list(NEW_SPECS))
def test_specs_beyond_the_examples(builds, name):
    spec = symattn.load(NEW_SPECS[name], filename=f"{name}.attn")
    # large_logits at the other head dims (d = 39, 71) has logits in the thousands, where float32 itself
    # misses the tolerance (plain NumPy float32 against float64 at N = 41, d = 71: grad(Q) 2.3e-4 > 1e-4):
    # it runs at its own sizes only (d = 5, logits in the hundreds). Its tensor-core runs (d = 32..128,
    # logits in the thousands, bf16/f16) are left out for the same reason, stronger: P is nearly one-hot,
    # so the true dS = P * (dP - delta) is nearly 0 while O (hence delta) is stored in 16 bits, as in
    # FlashAttention-2; the gradient error measured against max |gradient| is then of order 1.
    report = verify_cuda(spec, gate=name == "batched_3d" and NVCC is not None, tsan=name == "softcap",
                         workdir=builds.root, head_dims=name != "large_logits",
                         tensor_cores=name != "large_logits")
    assert report.path == ("generic" if name in ("assorted", "batched_3d") else "fused")
    assert report.ok, report.problems
    if name == "masked_rows":
        generic = verify_cuda(spec, fused=False, gate=False, tsan=False, workdir=builds.root)
        assert generic.ok, generic.problems


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@pytest.mark.parametrize("stem", ["causal", "additive", "multi_head"])
def test_reference_gradients_match_finite_differences(stem):
    """The reference that the CUDA results are held to, checked against central differences (float64)."""
    spec = symattn.load(REPO / "derivations" / f"{stem}.attn").typed
    rng = np.random.default_rng(1)
    sizes = dict(spec.sizes)
    leaves = {x: rng.standard_normal(((2,) if spec.tensors[x].kind != "param" else ())
                                     + spec.concrete_shape(spec.tensors[x].shape)) for x in spec.given}
    upstream = {o: rng.standard_normal((2,) + spec.concrete_shape(spec.tensors[o].shape)) for o in spec.outputs}

    def loss(values):
        outputs, _ = reference(spec, sizes, values, upstream, 2)
        return sum(float(np.sum(outputs[o] * upstream[o])) for o in spec.outputs)

    _, grads = reference(spec, sizes, leaves, upstream, 2)
    for name, value in leaves.items():
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            for sign in (1, -1):
                moved = {**leaves, name: value.copy()}
                moved[name][index] += sign * 1e-6
                numeric[index] += sign * loss(moved) / 2e-6
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-6, err_msg=name)


# --- the emitted files ----------------------------------------------------------------------


def test_launch_functions_take_a_stream_and_check_every_launch(emitted):
    """cudaStream_t last in every entry point; a stale error cleared first; a check after every launch."""
    for stem, code in emitted.codes.items():
        p = code.plan
        header, source = code.files[f"{code.prefix}.h"], code.files[code.source_name]
        for which in ("forward", "backward"):
            seed = f", unsigned long long {p.seed}" if p.seed else ""  # dropout's seed, after the batch
            assert re.search(rf"int {code.prefix}_{which}\([^)]*, int {p.batch}{seed}, cudaStream_t {p.stream_arg}\);",
                             header), (stem, which)
            body = source[source.index(f'extern "C" int {code.prefix}_{which}('):]
            body = body[:body.index("\n}\n")]
            first = body.index("SA_LAUNCH(")
            assert body.index("(void)SA_LAST_ERROR();") < first
            checks = body[:body.rindex("return SYMATTN_OK;")]  # every early return (bad sizes, grid limits)
            assert checks.rindex("return") < first
            # One check per launch site; the head-dim variants of a fused kernel are one site.
            sites = len(re.findall(r"^\s*(?:SA_LAUNCH|\{\n\s*const int head_dim_)", body, flags=re.M))
            assert body.count("SA_CHECK_LAUNCH();") == sites, (stem, which)
            assert body.endswith("return SYMATTN_OK;")
        assert "SYMATTN_GRID_TOO_LARGE = -3" in header
        assert "`cudaStream_t`" in code.files["README.md"]


# A driver that includes the emitted .cu with SA_LAUNCH replaced by a line in a log (kernel, grid, the
# first pointer argument): the host code runs, no kernel does, so huge batches cost nothing.
_LAUNCH_LOG = """\
#include "cuda_host.h"
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#undef SA_LAUNCH
#define SA_LAUNCH(kernel, grid, block, stream, first, ...) \\
    std::printf("%s %u %u %u %llu\\n", #kernel, (grid).x, (grid).y, (grid).z, (unsigned long long)(uintptr_t)(first))
#include "SPEC.cu"
int main(int argc, char** argv) {
    float* base = (float*)(uintptr_t)0x100000000ull;  // never dereferenced: no kernel runs
    int d[DIMS];
    for (int k = 0; k < DIMS; ++k) d[k] = std::atoi(argv[k + 1]);
    std::printf("status %d\\n", CALL);
    return 0;
}
"""


def _launch_log(code, tmp_path, dims):
    """[(kernel, (x, y, z), first pointer's offset in floats from the base)] and the forward's status."""
    p = code.plan
    count = len(p.inputs) + len(p.outputs) + 1
    call = f"{p.prefix}_forward({', '.join(['base'] * count)}, {', '.join(f'd[{k}]' for k in range(len(dims)))}, 0)"
    directory = tmp_path / p.prefix
    code.write(directory)
    driver = directory / "log.cpp"
    driver.write_text(_LAUNCH_LOG.replace("SPEC", p.prefix).replace("DIMS", str(len(dims))).replace("CALL", call))
    binary = directory / "log"
    subprocess.run([CXX, "-std=c++20", "-O0", "-pthread", "-Wno-unknown-pragmas", str(driver), "-o", str(binary)],
                   check=True, capture_output=True)
    done = subprocess.run([str(binary), *map(str, dims)], check=True, capture_output=True, text=True)
    lines = done.stdout.split("\n")
    launches = [(n, (int(x), int(y), int(z)), (int(a) - 0x100000000) // 4)
                for n, x, y, z, a in (line.split() for line in lines if line and not line.startswith("status"))]
    status = int(next(line for line in lines if line.startswith("status")).split()[1])
    return launches, status


@pytest.mark.slow
@needs_cxx
def test_a_batch_beyond_65535_is_split_into_launches(tmp_path):
    """A generic kernel's batch rides on grid.y: 65537 entries are two launches, the second one's pointers
    advanced by 65535 entries."""
    spec = symattn.load("dim N = 3, d = 2\ninput X[N, d]\nparam w[d]\nO = tanh(X) * w\noutput O\n",
                        filename="wide.attn")
    code = emit_cuda(spec)
    launches, status = _launch_log(code, tmp_path, [3, 2, 65537])
    assert status == 0
    own = [(grid, offset) for name, grid, offset in launches if name == "wide_O"]
    assert own == [((1, 65535, 1), 0), ((1, 2, 1), 65535 * 3 * 2)]


@pytest.mark.slow
@needs_cxx
def test_fused_grid_and_grid_limits(emitted, tmp_path):
    """multi_head: the fused kernel's grid.x is row blocks x heads x batch; the head-batched matmuls take
    65535 // h entries per launch; sizes beyond a grid limit return SYMATTN_GRID_TOO_LARGE (-3) and
    launch nothing."""
    code = emitted.codes["multi_head"]  # dims N, d, h, d_k, then the batch
    launches, status = _launch_log(code, tmp_path, [67, 6, 3, 2, 40000])
    assert status == 0
    (fused,) = [grid for name, grid, _ in launches if name.endswith("_attn_fwd_d32")]
    assert fused == (2 * 3 * 40000, 1, 1)
    q = [(grid, offset) for name, grid, offset in launches if name == "multi_head_Q"]
    assert [grid[2] for grid, _ in q] == [21845 * 3, (40000 - 21845) * 3]
    launches, status = _launch_log(code, tmp_path, [67, 6, 3, 100, 5])  # head dim 100: 32 rows per block
    assert status == 0
    assert [grid for name, grid, _ in launches if "_attn_" in name and "delta" not in name] == [(3 * 3 * 5, 1, 1)]
    for dims in ([67, 6, 70000, 2, 1],            # h heads on grid.z beside the batch: over 65535
                 [67, 6, 2, 2, 2 ** 30 + 1],     # 2 row blocks x 2 heads x batch: over 2^31 - 1
                 [65535 * 32 + 1, 6, 3, 2, 1]):  # rows / 32 matmul row tiles on grid.y: over 65535
        launches, status = _launch_log(code, tmp_path, dims)
        assert (status, launches) == (-3, []), dims


def test_readme_and_header_name_every_argument(emitted):
    for stem, code in emitted.codes.items():
        readme = code.files["README.md"]
        header = code.files[f"{code.prefix}.h"]
        p = code.plan
        for buffer in (*p.inputs, *p.outputs, *p.upstream, *p.gradients):
            assert f"`{buffer.name}`" in readme and f"float* {buffer.name}" in header
        for dim in (*p.dims, p.batch, p.workspace_arg, p.stream_arg):
            assert f"`{dim}`" in readme
        for kernel in (*p.forward, *p.backward):
            assert f"`{kernel.name}`" in readme
            assert kernel.comment[0] in code.files[code.source_name]


def test_generated_code_embeds_only_identifiers(tmp_path):
    """Hostile names and comments: C keywords as tensor names, comment text that would end a C comment."""
    text = """# */ #include <evil> \\n
attention int
dim float = 3, threadIdx = 2   # */ system("rm");
input x_[float, threadIdx], expf[float, threadIdx], sa_q[float, threadIdx]
O = softmax(x_ @ expf.T, axis=-1) @ sa_q
output O
"""
    code = emit_cuda(symattn.load(text, filename="my spec-1.attn"))
    everything = "".join(code.files.values())
    assert "evil" not in everything and "rm" not in re.findall(r"\w+", everything)
    source = code.files[code.source_name]
    declared = re.findall(r"\b(?:int|float\*|float\* __restrict__)\s+(\w+)", source)
    assert not {"float", "int", "threadIdx", "expf", "x_"} & set(declared)
    assert {"float_v", "threadIdx_v", "expf_v", "x_v"} <= set(declared)
    if CXX:
        code.write(tmp_path)
        done = subprocess.run([CXX, "-std=c++20", "-fsyntax-only", "-Wno-unknown-pragmas", "-x", "c++",
                               str(tmp_path / code.source_name)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_spec_emit_cuda_api(tmp_path):
    spec = symattn.load(REPO / "derivations" / "causal.attn")
    code = spec.emit("cuda")
    assert set(code.files) == {"causal.cu", "causal.h", "cuda_host.h", "cuda_warp.h", "README.md"}
    written = code.write(tmp_path)
    assert sorted(p.name for p in written) == sorted(code.files)
    assert "SA_LAUNCH" in (tmp_path / "cuda_host.h").read_text()


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_cli_emit_cuda(tmp_path):
    out = tmp_path / "kernels"
    done = run_cli("emit", "cuda", "derivations/multi_head.attn", "-o", str(out), "--dim", "N=8")
    assert done.returncode == 0, done.stderr
    assert "fused path" in done.stdout
    assert {p.name for p in out.iterdir()} == {"multi_head.cu", "multi_head.h", "cuda_host.h", "cuda_warp.h",
                                               "README.md"}
    generic = run_cli("emit", "cuda", "derivations/multi_head.attn", "-o", str(tmp_path / "g"), "--cuda-path",
                      "generic")
    assert generic.returncode == 0 and "generic path" in generic.stdout


@pytest.mark.slow
@needs_cxx
def test_cli_verify_cuda(builds, monkeypatch):
    for kind in ("plain", "tsan", "gate"):
        if ("cross_attention", kind) in builds.jobs:
            builds.result("cross_attention", kind)
    monkeypatch.setenv("SYMATTN_CUDA_BUILD_DIR", str(builds.root))  # the session's builds, not new ones
    done = run_cli("verify", "derivations/cross_attention.attn", "--target", "cuda", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"grad\(Y\)\s+\d\.\d\de-\d\d\s+ok", done.stdout)
    assert "ThreadSanitizer: no race" in done.stdout and "result: ok" in done.stdout


# --- benchmarks/gpu.py as far as a CPU goes ------------------------------------------------------


def _gpu_script():
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_plans_and_skips_without_a_gpu():
    gpu = _gpu_script()
    cases = gpu.gc.plan_cases([1024, 4096], [64, 128], 4, 16, causal=True)
    assert [(c.d, c.causal, c.n) for c in cases][:4] == [(64, False, 1024), (64, False, 4096), (64, True, 1024),
                                                         (64, True, 4096)] and len(cases) == 8
    assert cases[0].forward_flops == 4.0 * 4 * 16 * 1024 ** 2 * 64
    assert cases[2].forward_flops == cases[0].forward_flops / 2
    assert cases[2].backward_flops == 10.0 * 4 * 16 * 1024 ** 2 * 64 / 2
    assert gpu.gc.gate({"O": 1e-6, "dQ": 5e-4}, "fp32") is None
    assert gpu.gc.gate({"O": 1e-6, "dQ": 5e-3}, "fp32").startswith("wrong: dQ")
    assert gpu.gc.gate({"O": float("nan")}, "bf16").startswith("wrong")
    if gpu.missing() is None:
        pytest.skip("a GPU is here: run benchmarks/gpu.py itself")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "skipped:" in done.stdout, done.stdout + done.stderr


def test_occupancy_arithmetic():
    """benchmarks/cuda_occupancy.py's sm_90 occupancy, against figures worked by hand."""
    spec = importlib.util.spec_from_file_location("cuda_occupancy", REPO / "benchmarks" / "cuda_occupancy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cuda_occupancy"] = module
    spec.loader.exec_module(module)
    occupancy = module.occupancy
    # 131 registers: 4192 per warp, allocated 4352 (17 x 256); 65536 // 4352 = 15 warps = 7 blocks of 2 warps.
    assert vars(occupancy(131, 8192, 64)) == {"blocks": 7, "warps": 14, "limiter": "registers"}
    # 32 registers, 2-warp blocks: 64 warps' worth of registers, but at most 32 blocks.
    assert vars(occupancy(32, 0, 64)) == {"blocks": 32, "warps": 64, "limiter": "blocks"}
    assert vars(occupancy(32, 0, 128)) == {"blocks": 16, "warps": 64, "limiter": "warps"}
    # 48 KiB + 1 KiB reserved per block: 228 KiB // 49 KiB = 4 blocks.
    assert vars(occupancy(24, 48 * 1024, 64)) == {"blocks": 4, "warps": 8, "limiter": "shared memory"}
    # 255 registers: 8192 per warp; 8 warps; 64 threads: 4 blocks.
    assert vars(occupancy(255, 0, 64)) == {"blocks": 4, "warps": 8, "limiter": "registers"}


@pytest.mark.slow
@needs_cxx
def test_gpu_benchmark_plumbing_on_the_cpu_build(tmp_path):
    """The script's ctypes calls, run on a CPU build with torch CPU tensors, agree with torch SDPA."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    gpu = _gpu_script()
    code = gpu.emit(tmp_path)
    emitted = gpu.Emitted(build_cpu(code, tmp_path), code.prefix)
    run = gpu.Run(n=37, d=20, batch=2)
    q, k, v, d_o, out, grads, workspace = emitted.arguments(run, torch, device="cpu")
    emitted.forward(run, q, k, v, out, workspace, None)
    emitted.backward(run, q, k, v, out, d_o, grads, workspace, None)
    qt, kt, vt = (x.clone().double().requires_grad_(True) for x in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
    want.backward(d_o.double())
    assert torch.allclose(out.double(), want, atol=1e-5)
    for ours, theirs in zip(grads, (qt.grad, kt.grad, vt.grad)):
        assert torch.allclose(ours.double(), theirs, atol=1e-4)
    # The fp64 reference the script gates every kernel with agrees with SDPA too, and the gate refuses a wrong O.
    case = gpu.gc.Case(batch=1, heads=2, n=37, d=20, causal=True)
    q4, k4, v4, do4 = (x.view(case.shape) for x in (q, k, v, d_o))
    want4 = gpu.gc.reference(case, q4, k4, v4, do4, torch)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q4.double(), k4.double(), v4.double(), is_causal=True)
    assert gpu.gc.relative_error(want4[0], sdpa) < 1e-12
    assert gpu.gc.gate({"O": gpu.gc.relative_error(want4[0] * 1.01, want4[0])}, "fp32") is not None


@pytest.mark.slow
@needs_cxx
def test_gpu_benchmark_tensor_core_candidate_on_the_cpu_build(tmp_path):
    """The script's bf16 tensor-core candidate, run on a CPU build (the mma emulation) with torch CPU tensors,
    passes the script's own gate against its fp64 reference; fp32 and an unsupported head dim are n/a."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    gpu = _gpu_script()
    for mask, causal in (("full", False), ("causal", True)):
        code = gpu.emit(tmp_path / mask, mask)
        tc = gpu.TensorCores(build_cpu(code, tmp_path / mask), code)
        case = gpu.gc.Case(batch=1, heads=2, n=70, d=64, causal=causal)
        g = torch.Generator().manual_seed(1)
        q, k, v, d_o = (torch.randn(case.shape, generator=g).to(torch.bfloat16) for _ in range(4))
        kernel = gpu.tensor_core_kernel(tc, case, q, k, v, d_o, torch)
        got = (kernel.forward(), *kernel.backward())
        want = gpu.gc.reference(case, q, k, v, d_o, torch)
        errors = {name: gpu.gc.relative_error(x, w) for name, x, w in zip(("O", "dQ", "dK", "dV"), got, want)}
        assert gpu.gc.gate(errors, "bf16") is None, (mask, errors)
        assert gpu.gc.gate(dict(errors, O=gpu.gc.relative_error(got[0].double() * 1.1, want[0])), "bf16")
        with pytest.raises(gpu.NotAvailable):
            gpu.tensor_core_kernel(tc, case, q.float(), k.float(), v.float(), d_o.float(), torch)
        big = gpu.gc.Case(batch=1, heads=1, n=16, d=256)
        with pytest.raises(gpu.NotAvailable):
            gpu.tensor_core_kernel(tc, big, *(torch.zeros(big.shape, dtype=torch.bfloat16),) * 4, torch)
