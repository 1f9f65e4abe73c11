"""The generic kernel templates: elementwise map, row reduction, row softmax, tiled matmul.

Contract: each `*_kernel` function takes the pieces the planner printed (C
expressions for entries, coordinate names) and returns a `Kernel`: its CUDA
source and how to launch it. Templates are portable CUDA C: shared memory,
`__syncthreads()` and block-wide reductions only (no warp shuffles, tensor
cores or async copies), so that the CPU emulation in `runtime/cuda_host.h`
runs the same text. Every thread of a block reaches every `__syncthreads()`
(loops whose trip count is uniform over the block; bounds are checked on
loads and stores, never by returning early).

Launch shapes: the batch entry is `blockIdx.y` (map, reduce, softmax, scan) or
part of `blockIdx.z` (matmul, with the leading axes of the product); the host
splits a batch larger than those axes hold into several launches (`Kernel.batch_axis`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from .names import CNames
from .syntax import dim_c, numel_c, offset_c

__all__ = ["Buffer", "Kernel", "GridLimit", "map_kernel", "reduce_kernel", "softmax_kernel", "scan_kernel",
           "matmul_kernel", "batch_sum_kernel",
           "unravel", "PRELUDE", "HELPERS", "helpers_for",
           "column_reduction"]

MAP_THREADS = 128
REDUCE_THREADS = 64
TILE = 32
# `__launch_bounds__(threads, 8)`: at least 8 blocks per SM, so ptxas may use up to 64 (map) or 128
# (reduce) registers. With the thread count alone it capped some kernels at 32 and spilled around the
# slow path of an IEEE division (alibi's softmax, cosine's grad_Q and grad_K).
_MAP_BOUNDS = "SA_MAP_THREADS, 8"
_REDUCE_BOUNDS = "SA_REDUCE_THREADS, 8"


@dataclass(eq=False)
class Buffer:
    """A float32 tensor in device memory: a user argument or a slice of the workspace."""

    name: str                  # C identifier: kernel parameter, host argument or workspace field
    shape: tuple               # per batch entry (sympy dims)
    batched: bool              # a leading batch axis (params and their final gradients have none)
    kind: str                  # input, param, output, upstream, grad (user arguments) or workspace
    note: str = ""             # what it holds, for the README and the layout comment
    phase: str = "forward"     # workspace buffers: written by the forward or by the backward

    @property
    def host(self) -> str:
        return f"ws_.{self.name}" if self.kind == "workspace" else self.name


@dataclass(frozen=True)
class GridLimit:
    """A block count along one grid axis and its limit: beyond it the host returns SYMATTN_GRID_TOO_LARGE."""

    blocks: str                # C expression (host side)
    most: str                  # SA_GRID_X_MAX or SA_GRID_YZ_MAX


@dataclass(eq=False)
class Kernel:
    name: str
    comment: list[str]
    text: str
    writes: list[Buffer]
    reads: list[Buffer]
    grid: tuple[str, str, str]
    block: tuple[str, str, str]
    extra: list[tuple[str, str]] = field(default_factory=list)  # (kernel int parameter, host expression)
    phase: str = "forward"
    variants: list[tuple[str, str]] = field(default_factory=list)  # (host condition, kernel) for dispatch
    takes_dims: bool = True          # the spec's dims follow the extra int arguments
    # The grid axis (1: y, 2: z) that counts batch entries, `per_entry` blocks each: the host launches
    # the kernel once per slice of at most SA_GRID_YZ_MAX / per_entry entries, its pointers advanced.
    batch_axis: int | None = None
    per_entry: str = "1"
    limits: list[GridLimit] = field(default_factory=list)  # checked by the host before any launch

PRELUDE = f"""\
// Launch shapes of the generic kernels.
#define SA_MAP_THREADS {MAP_THREADS}
#define SA_REDUCE_THREADS {REDUCE_THREADS}    // a power of two: block-wide tree reductions
#define SA_TILE {TILE}               // matmul: SA_TILE x SA_TILE outputs per block,
#define SA_TILE_K 16             //   steps of SA_TILE_K along the contraction,
#define SA_TILE_THREADS 8        //   SA_TILE_THREADS x SA_TILE_THREADS threads,
#define SA_MICRO (SA_TILE / SA_TILE_THREADS)  //   each computing SA_MICRO x SA_MICRO outputs
"""

# Helper functions, each emitted only when the generated code calls it.
HELPERS: dict[str, str] = {
    "sa_square": "static __device__ __forceinline__ float sa_square(float x) { return x * x; }",
    "sa_sigmoid": """\
static __device__ __forceinline__ float sa_sigmoid(float x) {
    // Stable for large |x|: never exp of a large positive number.
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}""",
    "sa_min": """\
// NumPy's minimum and maximum: NaN propagates (fminf and fmaxf would drop it).
static __host__ __device__ __forceinline__ float sa_min(float a, float b) { return a != a || a <= b ? a : b; }""",
    "sa_max": "static __host__ __device__ __forceinline__ float sa_max(float a, float b) { return a != a || a >= b ? a : b; }",
    "sa_imin": "static __host__ __device__ __forceinline__ int sa_imin(int a, int b) { return a < b ? a : b; }",
    "sa_imax": "static __host__ __device__ __forceinline__ int sa_imax(int a, int b) { return a > b ? a : b; }",
    "sa_floordiv": """\
// Python's a // b and a % b on ints (C's / and % round toward 0): the remainder takes the divisor's sign.
// A divisor is 0 only on lanes past a tile's end (`N - i` at i = N; the validator shows every divisor
// inside nonzero), whose results are never stored: they divide by 1 (a division by 0 traps on the CPU).
static __host__ __device__ __forceinline__ int sa_floordiv(int a, int b) {
    b = b != 0 ? b : 1;
    const int q = a / b, r = a - q * b;
    return r != 0 && ((r < 0) != (b < 0)) ? q - 1 : q;
}""",
    "sa_mod": """\
static __host__ __device__ __forceinline__ int sa_mod(int a, int b) {
    b = b != 0 ? b : 1;
    const int r = a % b;
    return r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
}""",
    "sa_finite": "static __device__ __forceinline__ bool sa_finite(float x) { return fabsf(x) < INFINITY; }",
    "sa_sinusoidal": """\
// E[i, 2c] = sin(i / 10000^(2c/d)), E[i, 2c+1] = cos(i / 10000^(2c/d)); in double, rounded once.
static __device__ __forceinline__ float sa_sinusoidal(int i, int column, int width) {
    const double angle = (double)i / pow(10000.0, (double)(2 * (column / 2)) / (double)width);
    return (float)(column % 2 == 0 ? sin(angle) : cos(angle));
}""",
    "sa_block_sum": """\
// Block-wide sum over SA_REDUCE_THREADS threads. Every thread of the block calls it and
// gets the result; the final barrier lets the scratch be reused by the next call.
static __device__ float sa_block_sum(float value) {
    __shared__ float partial[SA_REDUCE_THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int half = SA_REDUCE_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    const float total = partial[0];
    __syncthreads();
    return total;
}""",
    "sa_block_max": """\
// Block-wide max, like sa_block_sum.
static __device__ float sa_block_max(float value) {
    __shared__ float partial[SA_REDUCE_THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int half = SA_REDUCE_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
        __syncthreads();
    }
    const float top = partial[0];
    __syncthreads();
    return top;
}""",
    "sa_blocks": """\
// Blocks for a grid-stride loop over `count` items (capped: each block loops).
static unsigned int sa_blocks(long long count, int per_block) {
    long long blocks = (count + per_block - 1) / per_block;
    if (blocks < 1) blocks = 1;
    return (unsigned int)(blocks < 65535 ? blocks : 65535);
}""",
    "sa_round_up": "static size_t sa_round_up(size_t n) { return (n + 63) / 64 * 64; }  // 256-byte aligned buffers",
    "sa_dropout": """\
// Dropout's mask at a flat position: 1 where Philox-4x32-10 keeps it (philox.h: the contract of every
// symattn target), else 0; the seed comes as its two 32-bit words (kernel ints).
static __host__ __device__ __forceinline__ float sa_dropout(int seed_lo, int seed_hi, unsigned stream,
                                                            unsigned long long position, unsigned threshold) {
    const uint64_t seed = ((uint64_t)(uint32_t)seed_hi << 32) | (uint32_t)seed_lo;
    return sa_dropout_keep(seed, stream, position, threshold) ? 1.0f : 0.0f;
}""",
}


def helpers_for(code: str) -> str:
    """The helpers `code` calls (and the helpers they call), in a fixed order."""
    used = [name for name in HELPERS if re.search(rf"\b{name}\(", code)]
    return "\n\n".join(HELPERS[name] for name in used)


def unravel(linear: str, names: Sequence[str], shape: Sequence, cnames: CNames, indent: str,
            wide: bool = True) -> list[str]:
    """Statements that split a linear index into coordinates (row-major); `wide`: a 64-bit index."""
    if not names:
        return []
    if len(names) == 1:
        return [] if names[0] == "0" else [f"{indent}const int {names[0]} = (int){linear};"]
    lines = [f"{indent}{'long long' if wide else 'int'} rest_ = {linear};"]
    for k in range(len(names) - 1, 0, -1):
        if names[k] == "0":  # an axis of size 1: its coordinate is the literal 0
            continue
        size = dim_c(shape[k], cnames)
        lines.append(f"{indent}const int {names[k]} = (int)(rest_ % {size});")
        lines.append(f"{indent}rest_ /= {size};")
    if names[0] != "0":
        lines.append(f"{indent}const int {names[0]} = (int)rest_;")
    return lines


def _signature(name: str, writes, reads, ints: Sequence[str], bounds: str) -> str:
    params = [f"float* __restrict__ {b.name}" for b in writes]
    params += [f"const float* __restrict__ {b.name}" for b in reads]
    params += [f"int {n}" for n in ints]
    joined = ",\n        ".join(params)
    return f'extern "C" __global__ void __launch_bounds__({bounds}) {name}(\n        {joined})'


def _offsets(buffers, names: CNames, batch: str = "b_") -> list[str]:
    return [f"    {b.name} += {batch} * ({numel_c(b.shape, names)});" for b in buffers if b.batched]


def _comment(lines: Sequence[str]) -> str:
    return "\n".join(f"// {line}" for line in lines)


def map_kernel(name, comment, out: Buffer, reads, dims, coords, statements, value, names: CNames, batch: str,
               phase: str) -> Kernel:
    """out[e] = value at the coordinates of e, for every entry e (grid-stride loop)."""
    count = numel_c(out.shape, names)
    body = [_comment(comment), _signature(name, [out], reads, dims, _MAP_BOUNDS) + " {",
            "    const long long b_ = blockIdx.y;  // the batch entry",
            *_offsets([out, *reads], names),
            f"    const long long count_ = {count};",
            "    for (long long e_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; e_ < count_;",
            "         e_ += (long long)gridDim.x * blockDim.x) {",
            *unravel("e_", coords, out.shape, names, "        "),
            *statements,
            f"        {out.name}[e_] = {value};",
            "    }",
            "}"]
    return Kernel(name, list(comment), "\n".join(body), [out], list(reads),
                  (f"sa_blocks({count}, SA_MAP_THREADS)", batch, "1"), ("SA_MAP_THREADS", "1", "1"), phase=phase,
                  batch_axis=1)


def reduce_kernel(name, comment, out: Buffer, reads, dims, out_coords, red_coords, red_shape, value, kind: str,
                  names: CNames, batch: str, phase: str) -> Kernel:
    """out[o] = sum / mean / logsumexp / max / min over the reduced coordinates of value; one block per output
    entry. max and min skip NaN entries (fmaxf), where NumPy's max gives NaN."""
    outputs = numel_c(out.shape, names)
    length = numel_c(red_shape, names)
    lines = [_comment(comment), _signature(name, [out], reads, dims, _REDUCE_BOUNDS) + " {",
             "    const long long b_ = blockIdx.y;  // the batch entry",
             *_offsets([out, *reads], names),
             f"    const long long outputs_ = {outputs};",
             f"    const long long length_ = {length};  // entries reduced into each output",
             "    for (long long o_ = blockIdx.x; o_ < outputs_; o_ += gridDim.x) {",
             *unravel("o_", out_coords, out.shape, names, "        "),
             "        auto value_ = [&](long long r_) -> float {",
             *unravel("r_", red_coords, red_shape, names, "            "),
             f"            return {value};",
             "        };"]
    if kind == "logsumexp":
        lines += ["        float top_ = -INFINITY;",
                  "        for (long long r_ = threadIdx.x; r_ < length_; r_ += blockDim.x) top_ = fmaxf(top_, value_(r_));",
                  "        top_ = sa_block_max(top_);",
                  "        if (!sa_finite(top_)) top_ = 0.0f;  // an all -inf row: log(0) = -inf, not NaN",
                  "        float total_ = 0.0f;",
                  "        for (long long r_ = threadIdx.x; r_ < length_; r_ += blockDim.x) total_ += expf(value_(r_) - top_);",
                  "        total_ = sa_block_sum(total_);",
                  f"        if (threadIdx.x == 0) {out.name}[o_] = logf(total_) + top_;"]
    elif kind in ("max", "min"):
        sign = "" if kind == "max" else "-"  # min(x) = -max(-x)
        lines += ["        float top_ = -INFINITY;",
                  f"        for (long long r_ = threadIdx.x; r_ < length_; r_ += blockDim.x) "
                  f"top_ = fmaxf(top_, {sign}value_(r_));",
                  "        top_ = sa_block_max(top_);",
                  f"        if (threadIdx.x == 0) {out.name}[o_] = {sign}top_;"]
    else:
        result = "total_ / (float)length_" if kind == "mean" else "total_"
        lines += ["        float total_ = 0.0f;",
                  "        for (long long r_ = threadIdx.x; r_ < length_; r_ += blockDim.x) total_ += value_(r_);",
                  "        total_ = sa_block_sum(total_);",
                  f"        if (threadIdx.x == 0) {out.name}[o_] = {result};"]
    lines += ["    }", "}"]
    return Kernel(name, list(comment), "\n".join(lines), [out], list(reads),
                  (f"sa_blocks({outputs}, 1)", batch, "1"), ("SA_REDUCE_THREADS", "1", "1"), phase=phase,
                  batch_axis=1)


def column_reduction(kind: str, red_coords, red_shape, value: str, names: CNames) -> list[str]:
    """Statements of a map kernel that leave sum / mean / logsumexp / max / min of `value` in `total_` (one thread)."""
    length = numel_c(red_shape, names)
    pad = "        "

    def loop(update: str) -> list[str]:
        return [f"{pad}for (long long r_ = 0; r_ < {length}; ++r_) {{",
                *unravel("r_", red_coords, red_shape, names, pad + "    "),
                f"{pad}    {update}",
                f"{pad}}}"]

    if kind == "logsumexp":
        return [f"{pad}float top_ = -INFINITY;", *loop(f"top_ = fmaxf(top_, {value});"),
                f"{pad}if (!sa_finite(top_)) top_ = 0.0f;  // an all -inf line: log(0) = -inf, not NaN",
                f"{pad}float total_ = 0.0f;", *loop(f"total_ += expf({value} - top_);"),
                f"{pad}total_ = logf(total_) + top_;"]
    if kind in ("max", "min"):
        sign = "" if kind == "max" else "-"
        return [f"{pad}float total_ = -INFINITY;", *loop(f"total_ = fmaxf(total_, {sign}({value}));"),
                f"{pad}total_ = {sign}total_;"]
    lines = [f"{pad}float total_ = 0.0f;", *loop(f"total_ += {value};")]
    if kind == "mean":
        lines.append(f"{pad}total_ /= (float)({length});")
    return lines


def softmax_kernel(name, comment, out: Buffer, reads, dims, row_coords, axis_coord, length, value, out_offset,
                   names: CNames, batch: str, phase: str, row_shape) -> Kernel:
    """out = softmax(value) along one axis, stably; an all -inf row gives zeros. One block per row."""
    rows = numel_c(row_shape, names)
    lines = [_comment(comment), _signature(name, [out], reads, dims, _REDUCE_BOUNDS) + " {",
             "    const long long b_ = blockIdx.y;  // the batch entry",
             *_offsets([out, *reads], names),
             f"    const long long rows_ = {rows};",
             f"    const int length_ = {length};",
             "    for (long long o_ = blockIdx.x; o_ < rows_; o_ += gridDim.x) {",
             *unravel("o_", row_coords, row_shape, names, "        "),
             f"        auto value_ = [&](int {axis_coord}) -> float {{ return {value}; }};",
             f"        auto at_ = [&](int {axis_coord}) -> long long {{ return {out_offset}; }};",
             "        float top_ = -INFINITY;",
             "        for (int c_ = threadIdx.x; c_ < length_; c_ += blockDim.x) top_ = fmaxf(top_, value_(c_));",
             "        top_ = sa_block_max(top_);",
             "        if (!sa_finite(top_)) top_ = 0.0f;  // a fully masked row",
             "        float total_ = 0.0f;",
             "        for (int c_ = threadIdx.x; c_ < length_; c_ += blockDim.x) total_ += expf(value_(c_) - top_);",
             "        total_ = sa_block_sum(total_);",
             "        const float scale_ = total_ > 0.0f ? 1.0f / total_ : 0.0f;  // zeros, not NaN, for a masked row",
             "        for (int c_ = threadIdx.x; c_ < length_; c_ += blockDim.x)",
             f"            {out.name}[at_(c_)] = expf(value_(c_) - top_) * scale_;",
             "    }",
             "}"]
    return Kernel(name, list(comment), "\n".join(lines), [out], list(reads),
                  (f"sa_blocks({rows}, 1)", batch, "1"), ("SA_REDUCE_THREADS", "1", "1"), phase=phase,
                  batch_axis=1)


def scan_kernel(name, comment, out: Buffer, reads, dims, line_coords, axis_coord, length, value, out_offset,
                names: CNames, batch: str, phase: str, line_shape, reverse: bool) -> Kernel:
    """out = cumsum(value) along one axis (from the end when `reverse`): one thread per line, which
    walks the axis in order keeping the running total."""
    count = numel_c(line_shape, names)
    walk = "for (int s_ = length_ - 1; s_ >= 0; --s_)" if reverse else "for (int s_ = 0; s_ < length_; ++s_)"
    lines = [_comment(comment), _signature(name, [out], reads, dims, _MAP_BOUNDS) + " {",
             "    const long long b_ = blockIdx.y;  // the batch entry",
             *_offsets([out, *reads], names),
             f"    const long long lines_ = {count};",
             f"    const int length_ = {length};",
             "    for (long long o_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; o_ < lines_;",
             "         o_ += (long long)gridDim.x * blockDim.x) {",
             *unravel("o_", line_coords, line_shape, names, "        "),
             f"        auto value_ = [&](int {axis_coord}) -> float {{ return {value}; }};",
             f"        auto at_ = [&](int {axis_coord}) -> long long {{ return {out_offset}; }};",
             "        float total_ = 0.0f;",
             f"        {walk} {{",
             "            total_ += value_(s_);",
             f"            {out.name}[at_(s_)] = total_;",
             "        }",
             "    }",
             "}"]
    return Kernel(name, list(comment), "\n".join(lines), [out], list(reads),
                  (f"sa_blocks({count}, SA_MAP_THREADS)", batch, "1"), ("SA_MAP_THREADS", "1", "1"), phase=phase,
                  batch_axis=1)


@dataclass
class MatmulTerm:
    """acc = A @ B for one accumulator: entries of A at (row_, k_) and of B at (k_, col_)."""

    acc: str
    formula: str
    inner: str        # the contraction length (C int expression)
    a_entry: str
    b_entry: str
    outer: tuple = ()  # (coordinate, size): leading axes summed too (sum(A @ B, axis=-3) over heads)


def matmul_kernel(name, comment, out: Buffer, reads, dims, lead_coords, lead_shape, rows: str, cols: str,
                  terms: Sequence[MatmulTerm], value: str, names: CNames, batch: str, phase: str) -> Kernel:
    """out = epilogue(acc0, acc1, ...), each acc a matrix product tiled through shared memory.

    Thread (tx, ty) of a block owns the outputs (row0 + ty + 8 r, col0 + tx + 8 c), r, c < SA_MICRO.
    Inside `value` and the operand entries, row_ and col_ (and k_) are the coordinates of one entry.
    `__launch_bounds__(64, 8)` lets ptxas use up to 128 registers; its default capped some at 64 and spilled.
    """
    # 32-bit index arithmetic here: a 64-bit division is a call with a stack frame on the GPU.
    lead = " * ".join(dim_c(d, names) for d in lead_shape) if lead_shape else "1"
    lines = [_comment(comment), _signature(name, [out], reads, dims, "SA_TILE_THREADS * SA_TILE_THREADS, 8") + " {"]
    if lead_shape:
        lines += [f"    const int lead_ = {lead};  // the product's leading axes ride on blockIdx.z with the batch",
                  "    const long long b_ = (int)blockIdx.z / lead_;  // the batch entry",
                  *unravel("((int)blockIdx.z % lead_)", lead_coords, lead_shape, names, "    ", wide=False)]
    else:
        lines.append("    const long long b_ = blockIdx.z;  // the batch entry")
    lines += [*_offsets([out, *reads], names),
              "    const int row0_ = blockIdx.y * SA_TILE, col0_ = blockIdx.x * SA_TILE;",
              "    const int tid_ = threadIdx.y * SA_TILE_THREADS + threadIdx.x;",
              "    __shared__ float a_tile_[SA_TILE][SA_TILE_K + 1];",
              "    __shared__ float b_tile_[SA_TILE_K][SA_TILE + 1];"]
    declared = set()
    for term in terms:
        acc = term.acc
        lines.append(f"    // {acc} {'+' if acc in declared else ''}= {term.formula}")
        if acc not in declared:
            lines.append(f"    float {acc}[SA_MICRO][SA_MICRO] = {{}};")
            declared.add(acc)
        lines += [f"    for (int {coord} = 0; {coord} < {size}; ++{coord})  // summed leading axis"
                  for coord, size in term.outer]
        lines += [f"    for (int k0_ = 0; k0_ < {term.inner}; k0_ += SA_TILE_K) {{",
                  "        for (int e_ = tid_; e_ < SA_TILE * SA_TILE_K; e_ += SA_TILE_THREADS * SA_TILE_THREADS) {",
                  "            const int row_ = row0_ + e_ / SA_TILE_K, k_ = k0_ + e_ % SA_TILE_K;",
                  f"            a_tile_[e_ / SA_TILE_K][e_ % SA_TILE_K] = row_ < {rows} && k_ < {term.inner} ? {term.a_entry} : 0.0f;",
                  "        }",
                  "        for (int e_ = tid_; e_ < SA_TILE_K * SA_TILE; e_ += SA_TILE_THREADS * SA_TILE_THREADS) {",
                  "            const int k_ = k0_ + e_ / SA_TILE, col_ = col0_ + e_ % SA_TILE;",
                  f"            b_tile_[e_ / SA_TILE][e_ % SA_TILE] = k_ < {term.inner} && col_ < {cols} ? {term.b_entry} : 0.0f;",
                  "        }",
                  "        __syncthreads();  // the tiles are loaded",
                  "        for (int kk_ = 0; kk_ < SA_TILE_K; ++kk_) {",
                  "            float a_[SA_MICRO], b_[SA_MICRO];",
                  "#pragma unroll",
                  "            for (int r_ = 0; r_ < SA_MICRO; ++r_) a_[r_] = a_tile_[threadIdx.y + SA_TILE_THREADS * r_][kk_];",
                  "#pragma unroll",
                  "            for (int c_ = 0; c_ < SA_MICRO; ++c_) b_[c_] = b_tile_[kk_][threadIdx.x + SA_TILE_THREADS * c_];",
                  "#pragma unroll",
                  "            for (int r_ = 0; r_ < SA_MICRO; ++r_)",
                  "#pragma unroll",
                  f"                for (int c_ = 0; c_ < SA_MICRO; ++c_) {acc}[r_][c_] += a_[r_] * b_[c_];",
                  "        }",
                  "        __syncthreads();  // every thread is done with the tiles before they are overwritten",
                  "    }"]
    out_offset = offset_c((*lead_coords, "row_", "col_"), out.shape, names)
    lines += ["#pragma unroll",
              "    for (int r_ = 0; r_ < SA_MICRO; ++r_) {",
              "#pragma unroll",
              "        for (int c_ = 0; c_ < SA_MICRO; ++c_) {",
              "            const int row_ = row0_ + threadIdx.y + SA_TILE_THREADS * r_;",
              "            const int col_ = col0_ + threadIdx.x + SA_TILE_THREADS * c_;",
              f"            if (row_ < {rows} && col_ < {cols}) {out.name}[{out_offset}] = {value};",
              "        }",
              "    }",
              "}"]
    grid = (f"({cols} + SA_TILE - 1) / SA_TILE", f"({rows} + SA_TILE - 1) / SA_TILE",
            batch if lead == "1" else f"{batch} * ({lead})")
    limits = [GridLimit(grid[1], "SA_GRID_YZ_MAX")]
    if lead != "1":
        limits.append(GridLimit(lead, "SA_GRID_YZ_MAX"))
    return Kernel(name, list(comment), "\n".join(lines), [out], list(reads), grid,
                  ("SA_TILE_THREADS", "SA_TILE_THREADS", "1"), phase=phase, batch_axis=2, per_entry=lead,
                  limits=limits)


def batch_sum_kernel(name, comment, out: Buffer, per_batch: Buffer, dims, names: CNames, batch_param: str,
                     batch_host: str) -> Kernel:
    """out[e] = sum over the batch of per_batch[b, e]: the gradient of a parameter shared by the batch."""
    count = numel_c(out.shape, names)
    lines = [_comment(comment), _signature(name, [out], [per_batch], [batch_param, *dims], _MAP_BOUNDS) + " {",
             f"    const long long count_ = {count};",
             "    for (long long e_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; e_ < count_;",
             "         e_ += (long long)gridDim.x * blockDim.x) {",
             "        float total_ = 0.0f;",
             f"        for (int b_ = 0; b_ < {batch_param}; ++b_) total_ += {per_batch.name}[b_ * count_ + e_];",
             f"        {out.name}[e_] = total_;",
             "    }",
             "}"]
    return Kernel(name, list(comment), "\n".join(lines), [out], [per_batch],
                  (f"sa_blocks({count}, SA_MAP_THREADS)", "1", "1"), ("SA_MAP_THREADS", "1", "1"),
                  extra=[(batch_param, batch_host)], phase="backward")
