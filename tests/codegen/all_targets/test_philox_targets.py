"""Dropout's generator on the four targets: the same Philox-4x32-10 bits on NumPy, torch, Triton and CUDA.

Each target's implementation is run from what a generated module would hold:
the NumPy and torch helpers from their source text alone (executed in a
namespace holding nothing but the array library), the Triton device function
`PHILOX` in a small kernel module (under TRITON_INTERPRET=1 on CPU tensors,
compiled where triton was imported for a GPU), `runtime/philox.h` in
tests/data/dropout_keep.cu built with g++ through cuda_host.h's emulation and
loaded with ctypes. Every result is compared with Random123's known answers
(tests/kat_vectors) and with the reference `symattn.ir.philox`, which
tests/ir/test_philox.py checks against a scalar rewrite: flat positions at
and above 2**32 (the counter's high word), seeds above 2**32 and 2**63,
streams up to 2**32 - 1, threshold 0 (keep all) and 2**32 - 1; and the
mask of a [batch, rows, cols] tensor computed tile by tile from (b, i, j).
The nvcc build of the header for sm_90 (under a second) runs here too.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # triton fixes its mode at its first import, in this worker

from symattn.check.cuda import CXX_FLAGS, compile_gate, find_cxx, find_nvcc  # noqa: E402
from symattn.codegen.numpy.runtime import RUNTIME as NUMPY_RUNTIME  # noqa: E402
from symattn.codegen.torch.runtime import RUNTIME as TORCH_RUNTIME  # noqa: E402
from symattn.ir.philox import dropout_threshold, keep_at, keep_mask  # noqa: E402
from conftest import REPO  # noqa: E402

HEADERS = REPO / "symattn" / "runtime"
SOURCE = REPO / "tests" / "data" / "dropout_keep.cu"

KAT = [  # counter, key, output: Random123 tests/kat_vectors, "philox4x32 10"
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]

INDEX = np.concatenate([
    np.array([0, 1, 2, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, 2 ** 33 + 7, 3 << 40,
              2 ** 62 + 12345, 2 ** 63 - 1], dtype=np.int64),
    np.random.default_rng(5).integers(0, 2 ** 63 - 1, size=50, dtype=np.int64),
    np.arange(1000, 1200, dtype=np.int64),
])
CASES = [(seed, stream, threshold)
         for seed in (0, 1, 2 ** 32 - 1, 2 ** 32 + 3, 0xFEDCBA9876543210, 2 ** 64 - 1)
         for stream in (0, 1, 2 ** 32 - 1)
         for threshold in (0, 1, dropout_threshold(0.1), 2 ** 31, 2 ** 32 - 1)]
SHAPE = (3, 37, 45)  # [batch, rows, cols]: not multiples of the tiles
TILE_CASES = [(0, 0, dropout_threshold(0.5)), (2 ** 40 + 9, 3, dropout_threshold(0.1)), (2 ** 64 - 1, 1, 0)]


def _exec(source: str, **namespace):
    namespace["__builtins__"] = __builtins__
    exec(compile(source, "<generated helpers>", "exec"), namespace)
    return namespace


def _helpers(runtime, names) -> str:
    source = "\n\n\n".join(runtime.helper_source(n) for n in names)
    assert "symattn" not in source  # copied into generated modules, which import only their array library
    return source


# --- the targets, each as a function (seed, stream, index, threshold) -> bool array --------------------------

@pytest.fixture(scope="module")
def numpy_helpers():
    return _exec(_helpers(NUMPY_RUNTIME, ("_philox4x32_10", "_dropout_keep")), np=np)


@pytest.fixture(scope="module")
def torch_helpers():
    torch = pytest.importorskip("torch", reason="the torch helper needs torch (pip install symattn[torch])")
    return _exec(_helpers(TORCH_RUNTIME, ("_mulhilo32", "_philox4x32_10", "_dropout_keep")), torch=torch)


TRITON_KERNELS = '''
@triton.jit
def keep_at_kernel(seed, stream, threshold, INDEX, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    index = tl.load(INDEX + offs, mask=offs < n, other=0)
    tl.store(OUT + offs, _dropout_keep_block(seed, stream, index, threshold).to(tl.int8), mask=offs < n)


@triton.jit
def keep_tile_kernel(seed, stream, threshold, OUT, rows, cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # one program per (row tile, batch entry), as the attention kernels: positions from (b, i, j)
    b = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    for j0 in range(0, cols, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        index = (b * rows + i[:, None]) * cols + j[None, :]
        inside = (i[:, None] < rows) & (j[None, :] < cols)
        tl.store(OUT + index, _dropout_keep_block(seed, stream, index, threshold).to(tl.int8), mask=inside)


@triton.jit
def philox_kernel(seed, COUNTER, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c0 = tl.load(COUNTER + offs, mask=offs < n, other=0)
    c1 = tl.load(COUNTER + n + offs, mask=offs < n, other=0)
    c2 = tl.load(COUNTER + 2 * n + offs, mask=offs < n, other=0)
    c3 = tl.load(COUNTER + 3 * n + offs, mask=offs < n, other=0)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, c2, c3)
    tl.store(OUT + offs, w0, mask=offs < n)
    tl.store(OUT + n + offs, w1, mask=offs < n)
    tl.store(OUT + 2 * n + offs, w2, mask=offs < n)
    tl.store(OUT + 3 * n + offs, w3, mask=offs < n)


@triton.jit
def randint4x_kernel(seed, INDEX, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    index = tl.load(INDEX + offs, mask=offs < n, other=0)
    w0, _, _, _ = tl.randint4x(seed, index)
    tl.store(OUT + offs, w0, mask=offs < n)
'''


@pytest.fixture(scope="module")
def triton_kernels():
    torch = pytest.importorskip("torch", reason="the Triton target needs torch (pip install symattn[torch])")
    pytest.importorskip("triton", reason="the Triton target needs triton (pip install symattn[torch])")
    from symattn.check.triton import interpreting, load_module
    from symattn.codegen.triton.runtime import PHILOX

    if not interpreting() and not torch.cuda.is_available():
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process and there is no GPU")
    text = "import torch\nimport triton\nimport triton.language as tl\n\n\n" + PHILOX + "\n" + TRITON_KERNELS
    module = load_module(text, interpret=interpreting(), name="philox_test_kernels")
    module.device = "cpu" if interpreting() else "cuda"
    return module


@pytest.fixture(scope="module")
def cuda_library(tmp_path_factory):
    cxx = find_cxx()
    if cxx is None:
        pytest.skip("g++ not found: the CUDA emulation needs a C++20 compiler")
    library = tmp_path_factory.mktemp("philox") / "libdropout_keep.so"
    done = subprocess.run([cxx, *CXX_FLAGS, "-Wall", "-Wextra", "-Werror", "-I", str(HEADERS), "-shared", "-fPIC",
                           "-x", "c++", str(SOURCE), "-o", str(library)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(library))
    u64, u32, ptr = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p
    lib.keep_at.argtypes = [u64, u32, ptr, u32, ptr, ctypes.c_int]
    lib.keep_tiles.argtypes = [u64, u32, u32, ctypes.c_int, ctypes.c_int, ctypes.c_int, ptr]
    lib.philox_words.argtypes = [ptr, ptr, ptr]
    return lib


def _numpy_keep(helpers, seed, stream, index, threshold):
    return helpers["_dropout_keep"](seed, stream, index, threshold)


def _torch_keep(helpers, seed, stream, index, threshold):
    import torch

    return helpers["_dropout_keep"](seed, stream, torch.from_numpy(index), threshold).numpy()


def _triton_keep(kernels, seed, stream, index, threshold):
    import torch

    positions = torch.from_numpy(index).to(kernels.device)
    out = torch.empty(len(index), dtype=torch.int8, device=kernels.device)
    kernels.keep_at_kernel[((len(index) + 63) // 64,)](seed, stream, threshold, positions, out, len(index), BLOCK=64)
    return out.cpu().numpy().astype(bool)


def _cuda_keep(lib, seed, stream, index, threshold):
    positions = np.ascontiguousarray(index, dtype=np.uint64)
    out = np.zeros(len(index), dtype=np.uint8)
    assert lib.keep_at(seed, stream, positions.ctypes.data, threshold, out.ctypes.data, len(index)) == 0
    return out.astype(bool)


TARGETS = {"numpy": ("numpy_helpers", _numpy_keep), "torch": ("torch_helpers", _torch_keep),
           "triton": ("triton_kernels", _triton_keep), "cuda": ("cuda_library", _cuda_keep)}


# --- the tests ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_keep_is_bit_identical_to_the_reference(target, request):
    fixture, keep = TARGETS[target]
    implementation = request.getfixturevalue(fixture)
    for seed, stream, threshold in CASES:
        got = keep(implementation, seed, stream, INDEX, threshold)
        want = keep_at(seed, stream, INDEX, threshold)
        assert got.shape == want.shape and got.dtype == bool
        wrong = np.flatnonzero(got != want)
        assert not wrong.size, (f"{target}: seed {seed}, stream {stream}, threshold {threshold}: "
                                f"{wrong.size} entries differ, first at index {INDEX[wrong[0]]}")
    assert keep(implementation, 5, 0, INDEX, 0).all()  # threshold 0 keeps every entry


def _kat_words_numpy(helpers, counter, key):
    words = [np.array([c], dtype=np.uint64) for c in counter]
    return [int(w[0]) for w in helpers["_philox4x32_10"](*words, *key)]


def _kat_words_torch(helpers, counter, key):
    import torch

    return [int(w[0]) for w in helpers["_philox4x32_10"](*(torch.tensor([c]) for c in counter), *key)]


def _kat_words_triton(kernels, counter, key):
    import torch

    c = torch.tensor([w - 2 ** 32 if w >= 2 ** 31 else w for w in counter], dtype=torch.int32, device=kernels.device)
    out = torch.empty(4, dtype=torch.int32, device=kernels.device)
    kernels.philox_kernel[(1,)](key[0] | key[1] << 32, c, out, 1, BLOCK=16)
    return [int(w) & 0xFFFFFFFF for w in out.cpu()]


def _kat_words_cuda(lib, counter, key):
    c, k = np.array(counter, dtype=np.uint32), np.array(key, dtype=np.uint32)
    out = np.zeros(4, dtype=np.uint32)
    lib.philox_words(c.ctypes.data, k.ctypes.data, out.ctypes.data)
    return out.tolist()


KAT_WORDS = {"numpy": _kat_words_numpy, "torch": _kat_words_torch, "triton": _kat_words_triton,
             "cuda": _kat_words_cuda}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("counter, key, expected", KAT)
def test_known_answers_of_random123_on_every_target(target, counter, key, expected, request):
    implementation = request.getfixturevalue(TARGETS[target][0])
    assert KAT_WORDS[target](implementation, counter, key) == list(expected)


def _tiles_numpy(helpers, seed, stream, threshold):
    # the tiled pass: a tile's positions from (b, i, j) broadcast, never the whole array's arange
    batch, rows, cols = SHAPE
    out = np.zeros(SHAPE, dtype=bool)
    for b in range(batch):
        for i0 in range(0, rows, 16):
            i = np.arange(i0, min(i0 + 16, rows))[:, None]
            j = np.arange(cols)[None, :]
            out[b, i0:i0 + 16] = helpers["_dropout_keep"](seed, stream, (b * rows + i) * cols + j, threshold)
    return out


def _tiles_torch(helpers, seed, stream, threshold):
    import torch

    batch, rows, cols = SHAPE
    b, i, j = torch.arange(batch)[:, None, None], torch.arange(rows)[None, :, None], torch.arange(cols)
    return helpers["_dropout_keep"](seed, stream, (b * rows + i) * cols + j, threshold).numpy()


def _tiles_triton(kernels, seed, stream, threshold):
    import torch

    batch, rows, cols = SHAPE
    out = torch.zeros(SHAPE, dtype=torch.int8, device=kernels.device)
    kernels.keep_tile_kernel[((rows + 15) // 16, batch)](seed, stream, threshold, out, rows, cols,
                                                         BLOCK_M=16, BLOCK_N=16)
    return out.cpu().numpy().astype(bool)


def _tiles_cuda(lib, seed, stream, threshold):
    out = np.zeros(SHAPE, dtype=np.uint8)
    assert lib.keep_tiles(seed, stream, threshold, *SHAPE, out.ctypes.data) == 0
    return out.astype(bool)


TILES = {"numpy": _tiles_numpy, "torch": _tiles_torch, "triton": _tiles_triton, "cuda": _tiles_cuda}


@pytest.mark.parametrize("target", TARGETS)
def test_a_tiled_kernel_draws_the_whole_arrays_mask(target, request):
    implementation = request.getfixturevalue(TARGETS[target][0])
    for seed, stream, threshold in TILE_CASES:
        got = TILES[target](implementation, seed, stream, threshold)
        assert (got == keep_mask(seed, stream, SHAPE, threshold)).all(), (target, seed, stream, threshold)


def test_triton_randint4x_is_the_same_generator_at_stream_zero(triton_kernels):
    """tl.randint4x(seed, offset) is Philox-4x32-10 at counter (offset lo, offset hi, 0, 0): stream 0 of the
    contract, word for word (the device function calls tl.philox to set the stream word)."""
    import torch

    from symattn.ir.philox import philox4x32_10

    positions = torch.from_numpy(INDEX).to(triton_kernels.device)
    for seed in (0, 7, 2 ** 32 + 1, 2 ** 64 - 1):
        out = torch.empty(len(INDEX), dtype=torch.int32, device=triton_kernels.device)
        triton_kernels.randint4x_kernel[((len(INDEX) + 63) // 64,)](seed, positions, out, len(INDEX), BLOCK=64)
        index = INDEX.astype(np.uint64)
        want = philox4x32_10((index & np.uint64(0xFFFFFFFF), index >> np.uint64(32), 0, 0),
                             (seed & 0xFFFFFFFF, seed >> 32))[0]
        assert (out.cpu().numpy().view(np.uint32) == want).all()


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_nvcc_compiles_the_header_for_sm_90(tmp_path):
    if find_nvcc() is None:
        pytest.skip("nvcc not found: the GPU build needs the CUDA toolkit")
    for path in (SOURCE, HEADERS / "cuda_host.h", HEADERS / "philox.h"):
        shutil.copy2(path, tmp_path / path.name)
    gate = compile_gate(tmp_path / SOURCE.name, arch="sm_90")
    assert gate.ok and not gate.skipped, gate.problems
    names = sorted(k.name for k in gate.kernels)  # mangled: _Z14keep_at_kernel..., _Z16keep_tile_kernel...
    assert len(names) == 2 and "keep_at_kernel" in names[0] and "keep_tile_kernel" in names[1], names
    assert all(k.stack_bytes == 0 for k in gate.kernels)  # the four words and the key stay in registers
