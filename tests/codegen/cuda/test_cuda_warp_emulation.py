"""runtime/cuda_warp.h: the warp-collective pieces of CUDA (issue 14), checked on the CPU.

The test kernels are tests/data/cuda_warp_kernels.cu, built with g++ through the
emulation and loaded with ctypes. Every result is compared against NumPy: bf16 and
f16 rounding against an independent reference (NumPy's float16 cast; bf16 by
picking the nearer of the two neighbouring bf16 values in float64), mma and
ldmatrix against float64 matrix products of the rounded inputs, shuffles against
NumPy reductions. The planted fragment-layout bugs must fail those comparisons.
ThreadSanitizer and the nvcc build (HMMA, LDSM in the SASS) are marked slow.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from symattn.check.cuda import CXX_FLAGS, find_cxx, find_nvcc
from conftest import REPO

RUNTIME = REPO / "symattn" / "runtime"
SOURCE = REPO / "tests" / "data" / "cuda_warp_kernels.cu"
CXX = find_cxx()
NVCC = find_nvcc()
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found: the emulation needs a C++20 compiler")

POISON = 0xFFFFFFFF  # what a cp.async destination holds until the wait, in the emulation
P = ctypes.c_void_p


def _build(out: Path, *extra: str) -> Path:
    cmd = [CXX, *CXX_FLAGS, "-I", str(RUNTIME), *extra, "-x", "c++", str(SOURCE), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if CXX is None:
        pytest.skip("g++ not found: the emulation needs a C++20 compiler")
    return ctypes.CDLL(str(_build(tmp_path_factory.mktemp("warp") / "libwarp.so", "-shared", "-fPIC")))


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if CXX is None:
        pytest.skip("g++ not found: the emulation needs a C++20 compiler")
    return _build(tmp_path_factory.mktemp("warp") / "warp_main", "-DSA_WARP_TEST_MAIN")


def ptr(a: np.ndarray):
    assert a.flags.c_contiguous and a.ctypes.data % 16 == 0
    return P(a.ctypes.data)


# --- the independent rounding references ---------------------------------------------------


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """bf16 bits of float32 `x`: the nearer of the two bf16 neighbours (ties to even), by value."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return _bf16_nearest(x)


def _bf16_nearest(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32)
    down = (u >> 16).astype(np.int64)  # truncation: same sign, magnitude <= |x|
    up = down + 1

    def value(h):  # magnitude of bf16 bits h (no sign); the pattern past the max stands for 2^128
        m = (h & 0x7FFF).astype(np.uint32) << 16
        v = np.abs(m.view(np.float32).astype(np.float64))
        return np.where((h & 0x7FFF) == 0x7F80, 2.0 ** 128, v)

    ax = np.abs(x.astype(np.float64))
    below, above = ax - value(down), value(up) - ax
    pick_up = (above < below) | ((above == below) & (down % 2 == 1))
    bits = np.where(pick_up, up, down)
    bits = np.where(np.isinf(x), down, bits)
    bits = np.where(np.isnan(x), 0x7FFF, bits)
    return bits.astype(np.uint16)


def f16_reference(x: np.ndarray) -> np.ndarray:
    """f16 bits: NumPy's float32 -> float16 cast rounds to nearest even; NaN is canonical 0x7FFF."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), bits).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f16_values(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def edge_values() -> np.ndarray:
    rng = np.random.default_rng(14)
    special = np.array([0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00800000, 0x00000001, 0x807FFFFF,
                        0x3F808000, 0x3F818000, 0x3F808001, 0x3F817FFF, 0x00008000, 0x00018000],
                       dtype=np.uint32).view(np.float32)
    random_bits = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f16_grid = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    finite = np.sort(f16_grid[np.isfinite(f16_grid)])
    midpoints = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # exact: 12 significant bits
    f16_edges = np.array([65504, 65519.996, 65520, 65536, -65520, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                          2.0 ** -26, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -12)], dtype=np.float32)
    small = (rng.uniform(-1, 1, 50_000) * 2.0 ** rng.uniform(-27, -13, 50_000)).astype(np.float32)
    ordinary = rng.standard_normal(50_000).astype(np.float32) * np.float32(100)
    return np.concatenate([special, random_bits, midpoints, np.nextafter(midpoints, np.float32(np.inf)),
                           np.nextafter(midpoints, np.float32(-np.inf)), f16_edges, small, ordinary])


def test_reference_rounding_sanity():
    """The bf16 reference itself on a few values worked out by hand."""
    cases = {1.0: 0x3F80, 1.00390625: 0x3F80, 1.01171875: 0x3F82, 1.0078125: 0x3F81,
             3.4e38: 0x7F80, -np.inf: 0xFF80, 2.0 ** -133: 0x0001, 2.0 ** -134: 0x0000}
    got = bf16_reference(np.array(list(cases), np.float32))
    assert [int(g) for g in got] == list(cases.values())


@needs_cxx
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_conversions_bit_exact(lib, kind):
    x = edge_values()
    got = np.zeros(x.size, np.uint16)
    getattr(lib, f"convert_{kind}")(ptr(x), ptr(got), ctypes.c_long(x.size))
    want = (bf16_reference if kind == "bf16" else f16_reference)(x)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(hex(x.view(np.uint32)[i]), hex(got[i]), hex(want[i])) for i in bad[:8]]


@needs_cxx
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_widening_every_pattern(lib, kind):
    bits = np.arange(2 ** 16, dtype=np.uint16)
    got = np.zeros(bits.size, np.float32)
    getattr(lib, f"widen_{kind}")(ptr(bits), ptr(got), ctypes.c_long(bits.size))
    want = bf16_values(bits) if kind == "bf16" else f16_values(bits)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@needs_cxx
def test_pack_pairs_low_half_first(lib):
    rng = np.random.default_rng(3)
    lo, hi = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    bf, f16 = np.zeros(1000, np.uint32), np.zeros(1000, np.uint32)
    lib.pack_pairs(ptr(lo), ptr(hi), ptr(bf), ptr(f16), ctypes.c_long(1000))
    assert np.array_equal(bf, bf16_reference(lo) | (bf16_reference(hi).astype(np.uint32) << 16))
    assert np.array_equal(f16, f16_reference(lo) | (f16_reference(hi).astype(np.uint32) << 16))


# --- mma and ldmatrix ------------------------------------------------------------------------

ROUND = {0: (bf16_reference, bf16_values), 1: (f16_reference, f16_values)}


def rounded(x: np.ndarray, dtype: int) -> tuple[np.ndarray, np.ndarray]:
    """(bits, float64 values) of `x` rounded to bf16 (dtype 0) or f16 (dtype 1)."""
    to_bits, to_values = ROUND[dtype]
    bits = to_bits(x)
    return bits, to_values(bits).astype(np.float64)


def close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, k: int) -> bool:
    """Within the bound of k + 1 fp32 additions of exact products: (k + 2) * 2^-24 * sum of |terms|."""
    return bool(np.all(np.abs(got - want) <= (k + 2) * 2.0 ** -24 * scale + 1e-30))


def run_16x8(lib, A, B, C, dtype, a_mode, b_layout, bug=0):
    """D = A @ B + C by the one-warp kernel; B is passed as stored: [n][k] (b_layout 0) or [k][n]."""
    a_bits, _ = rounded(A, dtype)
    b_bits, _ = rounded(B.T.copy() if b_layout == 0 else B, dtype)
    D = np.zeros((16, 8), np.float32)
    lib.run_mma_16x8(ptr(np.ascontiguousarray(a_bits)), ptr(np.ascontiguousarray(b_bits)), ptr(C), ptr(D),
                     dtype, a_mode, b_layout, bug)
    return D


@needs_cxx
@pytest.mark.parametrize("dtype", [0, 1], ids=["bf16", "f16"])
@pytest.mark.parametrize("a_mode", [0, 1, 2], ids=["x4", "x1", "x2"])
@pytest.mark.parametrize("b_layout", [0, 1, 2], ids=["b_nk", "b_kn_trans", "b_kn_x1_trans"])
def test_mma_16x8_small_integers_exact(lib, dtype, a_mode, b_layout):
    """Small integers: every product and sum is exact, so D must equal A @ B + C exactly."""
    rng = np.random.default_rng(100 + 10 * a_mode + b_layout)
    A = rng.integers(-8, 9, (16, 16)).astype(np.float32)
    B = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    C = rng.integers(-50, 51, (16, 8)).astype(np.float32)
    D = run_16x8(lib, A, B, C, dtype, a_mode, b_layout)
    assert np.array_equal(D, A.astype(np.float64) @ B + C)


@needs_cxx
@pytest.mark.parametrize("dtype", [0, 1], ids=["bf16", "f16"])
def test_mma_16x8_random_against_float64(lib, dtype):
    rng = np.random.default_rng(7 + dtype)
    A = rng.standard_normal((16, 16)).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    (_, a), (_, b) = rounded(A, dtype), rounded(B, dtype)
    for b_layout in (0, 1, 2):
        D = run_16x8(lib, A, B, C, dtype, 0, b_layout)
        assert close(D, a @ b + C, np.abs(a) @ np.abs(b) + np.abs(C), 16)
        assert not np.array_equal(D, A.astype(np.float64) @ B + C)  # the inputs really were rounded


@needs_cxx
def test_planted_swapped_ldmatrix_operands_caught_16x8(lib):
    rng = np.random.default_rng(9)
    A = rng.standard_normal((16, 16)).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    C = np.zeros((16, 8), np.float32)
    (_, a), (_, b) = rounded(A, 0), rounded(B, 0)
    D = run_16x8(lib, A, B, C, 0, 0, 0, bug=1)
    assert not close(D, a @ b, np.abs(a) @ np.abs(b), 16)


@needs_cxx
@pytest.mark.parametrize("dtype", [0, 1], ids=["bf16", "f16"])
def test_score_fragments_reused_as_a_operand(lib, dtype):
    """S = Q K^T by two mma tiles, packed into an A fragment, times V: small integers, all exact."""
    rng = np.random.default_rng(60 + dtype)
    Q, K = (rng.integers(-3, 4, (16, 16)).astype(np.float32) for _ in range(2))
    V = rng.integers(-3, 4, (16, 8)).astype(np.float32)
    S, O = np.zeros((16, 16), np.float32), np.zeros((16, 8), np.float32)
    q, k, v = (np.ascontiguousarray(rounded(x, dtype)[0]) for x in (Q, K, V))
    lib.run_chain(ptr(q), ptr(k), ptr(v), ptr(S), ptr(O), dtype)
    want_s = Q.astype(np.float64) @ K.T
    assert np.array_equal(S, want_s) and np.abs(want_s).max() <= 144  # 144: exact in bf16 too
    assert np.array_equal(O, want_s @ V)


def run_gemm(lib, A, B_kn, dtype, b_layout, bug=0):
    M, K = A.shape
    N = B_kn.shape[1]
    a_bits, _ = rounded(A, dtype)
    b_bits, _ = rounded(B_kn.T.copy() if b_layout == 0 else B_kn, dtype)
    C = np.zeros((M, N), np.float32)
    assert lib.run_gemm_64(ptr(np.ascontiguousarray(a_bits)), ptr(np.ascontiguousarray(b_bits)), ptr(C),
                           M, N, K, dtype, b_layout, bug) == 0
    return C


def gemm_inputs(M, N, K, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)


@needs_cxx
@pytest.mark.parametrize("dtype,b_layout", [(0, 1), (1, 0)], ids=["bf16-V-x4trans", "f16-K-x4"])
def test_tiled_gemm_64(lib, dtype, b_layout):
    """64x64x64 from shared memory filled by cp.async: ldmatrix.x4 for A, x4 or x4.trans for B."""
    A, B = gemm_inputs(64, 64, 64, 20 + dtype)
    (_, a), (_, b) = rounded(A, dtype), rounded(B, dtype)
    C = run_gemm(lib, A, B, dtype, b_layout)
    assert close(C, a @ b, np.abs(a) @ np.abs(b), 64)


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("dtype,b_layout", [(0, 0), (0, 1), (1, 1)])
def test_tiled_gemm_several_blocks_and_k_tiles(lib, dtype, b_layout):
    A, B = gemm_inputs(128, 128, 192, 30 + dtype + 2 * b_layout)
    (_, a), (_, b) = rounded(A, dtype), rounded(B, dtype)
    C = run_gemm(lib, A, B, dtype, b_layout)
    assert close(C, a @ b, np.abs(a) @ np.abs(b), 192)


@needs_cxx
@pytest.mark.parametrize("bug", [1, 2, 3], ids=["swapped-A-operands", "no-cp-async-wait", "V-without-trans"])
def test_planted_bugs_caught_in_tiled_gemm(lib, bug):
    A, B = gemm_inputs(64, 64, 128, 40)
    (_, a), (_, b) = rounded(A, 0), rounded(B, 0)
    C = run_gemm(lib, A, B, 0, 1, bug)
    assert not close(C, a @ b, np.abs(a) @ np.abs(b), 128)
    if bug == 2:  # read before the wait: the emulation's NaN poison, not stale-but-right data
        assert np.isnan(C).any()


# --- shuffles and cp.async -------------------------------------------------------------------


@needs_cxx
def test_quad_row_max_and_warp_butterflies(lib):
    rng = np.random.default_rng(5)
    S = (rng.integers(-512, 512, (16, 8)) / 8).astype(np.float32)  # sums of these are exact
    ints = rng.integers(-1000, 1000, 32).astype(np.int32)
    stats = np.zeros((32, 4), np.float32)
    sums, xors, rotated = np.zeros(32, np.int32), np.zeros(32, np.uint32), np.zeros(32, np.int32)
    lib.run_quad_rows(ptr(S), ptr(ints), ptr(stats), ptr(sums), ptr(xors), ptr(rotated), 1)
    assert np.array_equal(rotated, np.roll(ints, -3))
    g = np.arange(32) // 4
    want = np.stack([S.max(1)[g], S.max(1)[g + 8], S.sum(1)[g], S.sum(1)[g + 8]], axis=1)
    assert np.array_equal(stats, want)
    assert np.all(sums == ints.sum())
    hashed = ints.astype(np.int64).astype(np.uint64) * np.uint64(2654435761) % np.uint64(2 ** 32)
    assert np.all(xors == np.bitwise_xor.reduce(hashed.astype(np.uint32)))


@needs_cxx
def test_cp_async_is_deferred_to_the_wait(lib):
    src = np.random.default_rng(6).standard_normal(384).astype(np.float32)
    outs = [np.zeros(128, np.float32) for _ in range(5)]
    zfill = np.zeros(512, np.uint8)
    lib.run_cp_groups(ptr(src), *map(ptr, outs), ptr(zfill))
    before, mid0, mid1, after0, after1 = outs
    assert np.all(before.view(np.uint32) == POISON)  # read before any wait: no data yet
    assert np.array_equal(mid0, src[:128])           # wait<1>: the older group has landed ...
    assert np.all(mid1.view(np.uint32) == POISON)    # ... the newest one has not
    nxt = (np.arange(32) + 1) % 32
    assert np.array_equal(after0.reshape(32, 4), src[:128].reshape(32, 4)[nxt])
    assert np.array_equal(after1.reshape(32, 4), src[128:256].reshape(32, 4)[nxt])
    raw = src[256:].view(np.uint8).reshape(32, 16)
    for t, row in enumerate(zfill.reshape(32, 16)):
        n = t % 17
        assert np.array_equal(row[:n], raw[t, :n]) and not row[n:].any(), t


@needs_cxx
@pytest.mark.parametrize("what,message", [(0, "not a multiple of 32"), (1, "different warp-collective")])
def test_misuse_is_refused(driver, what, message):
    done = subprocess.run([str(driver), "misuse", str(what)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr


# --- ThreadSanitizer and nvcc (slow) ---------------------------------------------------------


@needs_cxx
@pytest.mark.slow
def test_thread_sanitizer_finds_no_race(tmp_path):
    exe = _build(tmp_path / "warp_tsan", "-g", "-fsanitize=thread", "-DSA_WARP_TEST_MAIN")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
    done = subprocess.run([str(exe), "small"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and "ThreadSanitizer" not in done.stderr, done.stderr[-3000:]
    A, B = gemm_inputs(64, 128, 128, 50)
    (a_bits, a), (b_bits, b) = rounded(A, 0), rounded(B, 0)
    (tmp_path / "in.bin").write_bytes(a_bits.tobytes() + b_bits.tobytes())
    done = subprocess.run([str(exe), "gemm", "64", "128", "128", "0", "1", str(tmp_path / "in.bin"),
                           str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and "ThreadSanitizer" not in done.stderr, done.stderr[-3000:]
    C = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(64, 128)
    assert close(C, a @ b, np.abs(a) @ np.abs(b), 128)


@needs_cxx
@pytest.mark.slow
def test_thread_sanitizer_sees_missing_barriers(tmp_path):
    """Planted: no __syncthreads() before cp.async refills a tile other warps still read;
    no __syncwarp() between lanes that pass data through shared memory."""
    exe = _build(tmp_path / "warp_tsan", "-g", "-fsanitize=thread", "-DSA_WARP_TEST_MAIN")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
    A, B = gemm_inputs(64, 64, 192, 51)
    (tmp_path / "in.bin").write_bytes(rounded(A, 0)[0].tobytes() + rounded(B, 0)[0].tobytes())
    done = subprocess.run([str(exe), "gemm", "64", "64", "192", "0", "1", str(tmp_path / "in.bin"),
                           str(tmp_path / "out.bin"), "4"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 66 and "data race" in done.stderr, done.stderr[-3000:]
    # Lanes of one warp passing data through shared memory with only a shuffle between.
    done = subprocess.run([str(exe), "nosync"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 66 and "data race" in done.stderr and "quad_rows" in done.stderr, done.stderr[-3000:]


def find_cuobjdump() -> str | None:
    """cuobjdump next to nvcc, on PATH, or the copy Triton ships."""
    for candidate in ([str(Path(NVCC).parent / "cuobjdump")] if NVCC else []) + [shutil.which("cuobjdump") or ""]:
        if candidate and Path(candidate).exists():
            return candidate
    spec = importlib.util.find_spec("triton")
    if spec and spec.submodule_search_locations:
        bundled = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    return None


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the GPU build needs the CUDA toolkit")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_builds_tensor_core_instructions(tmp_path, arch):
    cubin = tmp_path / "warp.cubin"
    done = subprocess.run([NVCC, f"-arch={arch}", "-cubin", "-I", str(RUNTIME), "-o", str(cubin), str(SOURCE)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found: the SASS check needs it")
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, timeout=300).stdout
    for op in ("HMMA.16816.F32.BF16", "HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDSM.16.M88.2",
               "LDSM.16.MT88 ", "LDGSTS.E.BYPASS.128.ZFILL", "SHFL.BFLY", "DEPBAR"):
        assert op in sass, op
