"""The fused attention kernels (FlashAttention-2 style) for one `AttentionCore`.

Contract: `score_functions` prints the core's score (where(keep, value,
-inf) of the attention plan, `symattn.codegen.plan`), its derivative, the
derivative by each learned read and the weights' factor as device functions
of (s, head coordinates, i, j, dims, batch entry, the read tensors);
`forward_kernels` and `backward_kernels` return the `Kernel`s of the fused
path:

- forward: one block per SA_ATTN_ROWS query rows of one (batch entry, head),
  one thread per row; grid.x counts all of them (row blocks fastest), so heads
  and batch have no 65535 limit. Tiles of SA_ATTN_KEYS rows of K and V stream through
  shared memory; each thread keeps its query row, its output accumulator and
  the running max m and sum l in registers (online softmax). Writes O and the
  row logsumexp lse = m + log(l). P is never stored. Key tiles outside the
  mask's static bounds (`plan.tile_bounds`) are never visited.
- backward: delta[i] = rowsum(dO * O)[i]; then a dK/dV kernel (one thread per
  key row, tiles of queries in shared memory) and a dQ kernel (one thread per
  query row, tiles of keys), both recomputing P = exp(score - lse) and
  dS = P * (dP - delta) * score'(s), delta = rowsum(dO * O) - dlse; each
  learned tensor the score reads gets dS * d score / d its entry added
  atomically in the dK/dV kernel (into zeros its caller set); the extra
  memory is lse and delta: O(N) per (batch entry, head). An operand
  broadcast over heads is read at its own head; its gradient is written per
  head of the core (the caller sums it).

The head dim is a runtime size: kernels are instantiated for head dims up to
32, 64 and 128 (zero-padded), and the host picks the smallest that fits. Up to
64 a block has SA_ATTN_ROWS (64) threads; the 128 kernels have
SA_ATTN_ROWS_WIDE (32), keep the forward's query row in shared memory, use
tiles half as tall, and accumulate dK/dV 64 columns per pass: every variant
stays within 255 registers without spilling and within 48 KiB of static
shared memory.
"""

from __future__ import annotations

from string import Template
from textwrap import indent
from typing import Sequence

import sympy

from ..plan import AttentionCore, tile_bounds
from ..plan.bounds import I0, I1, J0, J1
from .kernels import Buffer, GridLimit, Kernel
from .names import CNames
from .score import ScoreSource, heads_of, read_args, read_params, score_functions, score_printer
from .syntax import CPrinter, dim_c, numel_c, offset_c

__all__ = ["HEAD_DIMS", "FLASH_PRELUDE", "score_functions", "forward_kernels", "backward_kernels",
           "head_coordinates", "score_printer"]

HEAD_DIMS = (32, 64, 128)

FLASH_PRELUDE = """\
// Fused attention: threads per block (one query or key row each), and tile heights.
#define SA_ATTN_ROWS 64
#define SA_ATTN_ROWS_WIDE 32   // threads per block above head dim 64: the rows' shared memory fits 48 KiB
#define SA_ATTN_ROWS_FOR(head_dim) ((head_dim) > 64 ? SA_ATTN_ROWS_WIDE : SA_ATTN_ROWS)
#define SA_ATTN_KEYS 32   // keys per tile in the forward
#define SA_ATTN_STEP 16   // rows per tile of the other side in the backward kernels
"""


def _head_offset(name: str, buffer: Buffer, rows: str, width: str, heads: tuple[str, str] = ("heads_", "head_")) -> str:
    count, index = heads
    base = f"b_ * {count} + {index}" if buffer.batched else index
    return f"    {name} += ({base}) * (long long){rows} * {width};"


def _param_names(pairs: Sequence[tuple[str, Buffer]]) -> dict[str, str]:
    """Kernel parameter names: the buffer's own, unless one buffer plays two roles (softmax(X @ X.T) @ X)."""
    seen: set[str] = set()
    out = {}
    for role, buffer in pairs:
        name = buffer.name if buffer.name not in seen else f"{buffer.name}_{role.lower()}_"
        seen.add(name)
        out[role] = name
    return out


def _lead_coords(core: AttentionCore, lead: list[str], names: CNames) -> str:
    if not lead:
        return ""
    lines = ["    long long rest_ = head_;"]
    for k in range(len(lead) - 1, 0, -1):
        size = dim_c(core.lead[k], names)
        lines += [f"    const int {lead[k]} = (int)(rest_ % {size});", f"    rest_ /= {size};"]
    lines.append(f"    const int {lead[0]} = (int)rest_;")
    return "\n".join(lines)


def _variants(name: str, body: str, params: str, args: str, comment: str) -> tuple[str, list[tuple[str, str]]]:
    wrappers, variants = [], []
    for head_dim in HEAD_DIMS:
        kernel = f"{name}_d{head_dim}"
        rows = "SA_ATTN_ROWS" if head_dim <= 64 else "SA_ATTN_ROWS_WIDE"
        wrappers.append(f'extern "C" __global__ void __launch_bounds__({rows}, 1) {kernel}(\n        {params}) {{\n'
                        f"    {body}<{head_dim}, {rows}>({args});\n}}")
        variants.append((f"head_dim_ <= {head_dim}", kernel))
    return f"// {comment}\n" + "\n".join(wrappers), variants


_FORWARD = Template("""\
// $formula
// Forward: one thread per query row i (ROWS per block), tiles of SA_ATTN_KEYS keys in shared memory,
// online softmax (running max m and sum l, the accumulator rescaled whenever m grows).
// Above head dim 64 the query row and the accumulator would not both fit in registers: the row goes
// to shared memory (one column per thread, read through volatile so that ptxas does not hoist it back
// into registers) and the key tiles are half as tall.
template <int HEAD_DIM, int ROWS>
static __device__ __forceinline__ void ${prefix}_forward(
        float* __restrict__ $O, float* __restrict__ $lse, const float* __restrict__ $Q,
        const float* __restrict__ $K, const float* __restrict__ $V,
        int n_q_, int n_k_, int d_qk_, int d_v_, int heads_$dim_params) {
    constexpr bool WIDE_ = HEAD_DIM > 64;
    constexpr int KEYS_ = WIDE_ ? SA_ATTN_KEYS / 2 : SA_ATTN_KEYS;
    __shared__ float k_tile_[KEYS_][HEAD_DIM];
    __shared__ float v_tile_[KEYS_][HEAD_DIM];
    __shared__ float q_own_[WIDE_ ? HEAD_DIM : 1][WIDE_ ? ROWS : 1];  // column t is thread t's query row
$block_coords
$lead_coords
$offsets
    const int i_ = row0_ + threadIdx.x;  // this thread's query row
    float q_[WIDE_ ? 1 : HEAD_DIM], acc_[HEAD_DIM];
#pragma unroll
    for (int c_ = 0; c_ < HEAD_DIM; ++c_) {
        const float q_c_ = i_ < n_q_ && c_ < d_qk_ ? $Q[(long long)i_ * d_qk_ + c_] : 0.0f;
        if constexpr (WIDE_) q_own_[c_][threadIdx.x] = q_c_;
        else q_[c_] = q_c_;
        acc_[c_] = 0.0f;
    }
    const volatile float* q_mine_ = &q_own_[0][0] + (WIDE_ ? threadIdx.x : 0);  // WIDE_: stride ROWS
    float m_ = -INFINITY;  // running max of the scores of row i
    float l_ = 0.0f;       // running sum of exp(score - m_)
$key_range
    for (int j0_ = lo_; j0_ < hi_; j0_ += KEYS_) {
$skip_keys
        for (int e_ = threadIdx.x; e_ < KEYS_ * HEAD_DIM; e_ += ROWS) {
            const int r_ = e_ / HEAD_DIM, c_ = e_ % HEAD_DIM, j_ = j0_ + r_;
            k_tile_[r_][c_] = j_ < n_k_ && c_ < d_qk_ ? $K[(long long)j_ * d_qk_ + c_] : 0.0f;
            v_tile_[r_][c_] = j_ < n_k_ && c_ < d_v_ ? $V[(long long)j_ * d_v_ + c_] : 0.0f;
        }
        __syncthreads();  // the K and V tiles are loaded
        // keys of the tile (none for a thread past the last row: its score may read memory at i_)
        const int keys_ = i_ >= n_q_ ? 0 : hi_ - j0_ < KEYS_ ? hi_ - j0_ : KEYS_;
#pragma unroll 1
        for (int r_ = 0; r_ < keys_; ++r_) {
            float dot_ = 0.0f;
            if constexpr (WIDE_) {
#pragma unroll
                for (int c_ = 0; c_ < HEAD_DIM; ++c_) dot_ += q_mine_[c_ * ROWS] * k_tile_[r_][c_];
            } else {
#pragma unroll
                for (int c_ = 0; c_ < HEAD_DIM; ++c_) dot_ += q_[c_] * k_tile_[r_][c_];
            }
            const float s_ = ${prefix}_score(dot_, ${lead_args}i_, j0_ + r_$score_tail);
            if (s_ > m_) {  // a new running max: rescale what was accumulated so far
                const float rescale_ = expf(m_ - s_);  // 0 while everything so far was masked
                l_ *= rescale_;
#pragma unroll
                for (int c_ = 0; c_ < HEAD_DIM; ++c_) acc_[c_] *= rescale_;
                m_ = s_;
            }
            const float p_ = s_ == -INFINITY ? 0.0f : expf(s_ - m_);  // masked: exactly 0, never NaN
            l_ += p_;
$weigh
#pragma unroll
            for (int c_ = 0; c_ < HEAD_DIM; ++c_) acc_[c_] += pw_ * v_tile_[r_][c_];
        }
        __syncthreads();  // every thread is done with the tiles before they are overwritten
    }
    if (i_ < n_q_) {
        const float inv_ = l_ > 0.0f ? 1.0f / l_ : 0.0f;  // a fully masked row gives zeros
#pragma unroll
        for (int c_ = 0; c_ < HEAD_DIM; ++c_)
            if (c_ < d_v_) $O[(long long)i_ * d_v_ + c_] = acc_[c_] * inv_;
        $lse[i_] = l_ > 0.0f ? m_ + logf(l_) : -INFINITY;
    }
}""")

_DELTA = Template("""\
// delta[i] = sum_c grad($O)[i, c] * $O[i, c]  (= rowsum(dP * P), the softmax backward's correction)
extern "C" __global__ void __launch_bounds__(SA_ATTN_ROWS) ${prefix}_delta(
        float* __restrict__ $delta, const float* __restrict__ $O, const float* __restrict__ $dO$dlse_param,
        int n_q_, int d_v_, int heads_) {
$block_coords
$offsets
    const int i_ = row0_ + threadIdx.x;
    if (i_ < n_q_) {
        float total_ = 0.0f;
        for (int c_ = 0; c_ < d_v_; ++c_) total_ += $dO[(long long)i_ * d_v_ + c_] * $O[(long long)i_ * d_v_ + c_];
        $delta[i_] = total_$dlse_term;
    }
}""")

# P and dS of entry (i, j), from s = q_i . k_j, dp = dO_i . v_j; zero where the row is fully masked.
_RECOMPUTE = """\
            float p_ = 0.0f, ds_ = 0.0f, dsc_ = 0.0f, pw_ = 0.0f;  // P, dS (of the product), dS (of the score), P w
            if (i_ < n_q_ && j_ < n_k_ && lse_i_ != -INFINITY) {
                p_ = expf(${prefix}_score(dot_, ${lead_args}i_, j_$score_tail) - lse_i_);
$weigh
                if (p_ != 0.0f) {
                    dsc_ = p_ * (dp_ - delta_i_);
                    ds_ = dsc_ * ${prefix}_score_grad(dot_, ${lead_args}i_, j_$score_tail);
                }
            }
$read_grads"""

_DKDV = Template("""\
// Backward, dK and dV: one thread per key row j (ROWS per block), tiles of SA_ATTN_STEP queries in
// shared memory.
//   dV[j] = sum_i P[i, j] dO[i],  dK[j] = sum_i dS[i, j] Q[i],  dS = P * (dP - delta) * score'
// Above head dim 64 the query tiles are half as tall and dK, dV are accumulated 64 columns at a time
// (a pass over the queries per 64 columns, P and dS recomputed): 2 x 128 accumulators do not fit.
template <int HEAD_DIM, int ROWS>
static __device__ __forceinline__ void ${prefix}_backward_dkdv(
        float* __restrict__ $dK, float* __restrict__ $dV, const float* __restrict__ $Q,
        const float* __restrict__ $K, const float* __restrict__ $V, const float* __restrict__ $dO,
        const float* __restrict__ $lse, const float* __restrict__ $delta,
        int n_q_, int n_k_, int d_qk_, int d_v_, int heads_$dim_params) {
    constexpr int STEP_ = HEAD_DIM > 64 ? SA_ATTN_STEP / 2 : SA_ATTN_STEP;
    constexpr int CHUNK_ = HEAD_DIM > 64 ? 64 : HEAD_DIM;  // columns of dK and dV per pass
    __shared__ float k_own_[ROWS][HEAD_DIM + 1];  // row t is thread t's key (padded: no bank conflicts)
    __shared__ float v_own_[ROWS][HEAD_DIM + 1];
    __shared__ float q_tile_[STEP_][HEAD_DIM];
    __shared__ float do_tile_[STEP_][HEAD_DIM];
    __shared__ float lse_tile_[STEP_];
    __shared__ float delta_tile_[STEP_];
$block_coords
$lead_coords
$offsets
    const int t_ = threadIdx.x;
    const int j_ = row0_ + t_;  // this thread's key row
#pragma unroll
    for (int c_ = 0; c_ < HEAD_DIM; ++c_) {
        k_own_[t_][c_] = j_ < n_k_ && c_ < d_qk_ ? $K[(long long)j_ * d_qk_ + c_] : 0.0f;
        v_own_[t_][c_] = j_ < n_k_ && c_ < d_v_ ? $V[(long long)j_ * d_v_ + c_] : 0.0f;
    }
    // Only this thread touches its own rows. Reading them through volatile keeps the compiler from
    // hoisting both rows into registers, which with dK and dV would not fit (spills at HEAD_DIM 64).
    const volatile float* k_mine_ = k_own_[t_];
    const volatile float* v_mine_ = v_own_[t_];
#pragma unroll 1
    for (int c0_ = 0; c0_ < HEAD_DIM; c0_ += CHUNK_) {  // one pass up to head dim 64
        float dk_[CHUNK_], dv_[CHUNK_];
#pragma unroll
        for (int c_ = 0; c_ < CHUNK_; ++c_) {
            dk_[c_] = 0.0f;
            dv_[c_] = 0.0f;
        }
$query_range
        for (int i0_ = lo_; i0_ < hi_; i0_ += STEP_) {
$skip_queries
            for (int e_ = t_; e_ < STEP_ * HEAD_DIM; e_ += ROWS) {
                const int r_ = e_ / HEAD_DIM, c_ = e_ % HEAD_DIM, i_ = i0_ + r_;
                q_tile_[r_][c_] = i_ < n_q_ && c_ < d_qk_ ? $Q[(long long)i_ * d_qk_ + c_] : 0.0f;
                do_tile_[r_][c_] = i_ < n_q_ && c_ < d_v_ ? $dO[(long long)i_ * d_v_ + c_] : 0.0f;
            }
            for (int r_ = t_; r_ < STEP_; r_ += ROWS) {
                lse_tile_[r_] = i0_ + r_ < n_q_ ? $lse[i0_ + r_] : -INFINITY;
                delta_tile_[r_] = i0_ + r_ < n_q_ ? $delta[i0_ + r_] : 0.0f;
            }
            __syncthreads();  // the query tile is loaded
#pragma unroll 1
            for (int r_ = 0; r_ < STEP_; ++r_) {
                const int i_ = i0_ + r_;
                float dot_ = 0.0f, dp_ = 0.0f;
#pragma unroll
                for (int c_ = 0; c_ < HEAD_DIM; ++c_) {
                    dot_ += q_tile_[r_][c_] * k_mine_[c_];
                    dp_ += do_tile_[r_][c_] * v_mine_[c_];
                }
                const float lse_i_ = lse_tile_[r_], delta_i_ = delta_tile_[r_];
$recompute
                // Fresh (volatile) reads: keeping the tile rows in registers since the dot products would
                // not fit beside dK and dV.
                const volatile float* q_row_ = q_tile_[r_] + c0_;
                const volatile float* do_row_ = do_tile_[r_] + c0_;
#pragma unroll
                for (int c_ = 0; c_ < CHUNK_; ++c_) {
                    dv_[c_] += pw_ * do_row_[c_];
                    dk_[c_] += ds_ * q_row_[c_];
                }
            }
            __syncthreads();  // every thread is done with the query tile before it is overwritten
        }
        if (j_ < n_k_) {
#pragma unroll
            for (int c_ = 0; c_ < CHUNK_; ++c_) {
                if (c0_ + c_ < d_qk_) $dK[(long long)j_ * d_qk_ + c0_ + c_] = dk_[c_];
                if (c0_ + c_ < d_v_) $dV[(long long)j_ * d_v_ + c0_ + c_] = dv_[c_];
            }
        }
    }
}""")

_DQ = Template("""\
// Backward, dQ: one thread per query row i (ROWS per block), tiles of SA_ATTN_STEP keys in shared
// memory (half as tall above head dim 64).
//   dQ[i] = sum_j dS[i, j] K[j]
template <int HEAD_DIM, int ROWS>
static __device__ __forceinline__ void ${prefix}_backward_dq(
        float* __restrict__ $dQ, const float* __restrict__ $Q, const float* __restrict__ $K,
        const float* __restrict__ $V, const float* __restrict__ $dO, const float* __restrict__ $lse,
        const float* __restrict__ $delta, int n_q_, int n_k_, int d_qk_, int d_v_, int heads_$dim_params) {
    constexpr int STEP_ = HEAD_DIM > 64 ? SA_ATTN_STEP / 2 : SA_ATTN_STEP;
    __shared__ float q_own_[ROWS][HEAD_DIM + 1];  // row t is thread t's query (padded)
    __shared__ float do_own_[ROWS][HEAD_DIM + 1];
    __shared__ float k_tile_[STEP_][HEAD_DIM];
    __shared__ float v_tile_[STEP_][HEAD_DIM];
$block_coords
$lead_coords
$offsets
    const int t_ = threadIdx.x;
    const int i_ = row0_ + t_;  // this thread's query row
    float dq_[HEAD_DIM];
#pragma unroll
    for (int c_ = 0; c_ < HEAD_DIM; ++c_) {
        q_own_[t_][c_] = i_ < n_q_ && c_ < d_qk_ ? $Q[(long long)i_ * d_qk_ + c_] : 0.0f;
        do_own_[t_][c_] = i_ < n_q_ && c_ < d_v_ ? $dO[(long long)i_ * d_v_ + c_] : 0.0f;
        dq_[c_] = 0.0f;
    }
    // Only this thread touches its own rows; volatile keeps them in shared memory, not registers.
    const volatile float* q_mine_ = q_own_[t_];
    const volatile float* do_mine_ = do_own_[t_];
    const float lse_i_ = i_ < n_q_ ? $lse[i_] : -INFINITY;
    const float delta_i_ = i_ < n_q_ ? $delta[i_] : 0.0f;
$key_range
    for (int j0_ = lo_; j0_ < hi_; j0_ += STEP_) {
$skip_keys_dq
        for (int e_ = t_; e_ < STEP_ * HEAD_DIM; e_ += ROWS) {
            const int r_ = e_ / HEAD_DIM, c_ = e_ % HEAD_DIM, j_ = j0_ + r_;
            k_tile_[r_][c_] = j_ < n_k_ && c_ < d_qk_ ? $K[(long long)j_ * d_qk_ + c_] : 0.0f;
            v_tile_[r_][c_] = j_ < n_k_ && c_ < d_v_ ? $V[(long long)j_ * d_v_ + c_] : 0.0f;
        }
        __syncthreads();  // the key tile is loaded
#pragma unroll 1
        for (int r_ = 0; r_ < STEP_; ++r_) {
            const int j_ = j0_ + r_;
            float dot_ = 0.0f, dp_ = 0.0f;
#pragma unroll
            for (int c_ = 0; c_ < HEAD_DIM; ++c_) {
                dot_ += q_mine_[c_] * k_tile_[r_][c_];
                dp_ += do_mine_[c_] * v_tile_[r_][c_];
            }
$recompute
            if constexpr (HEAD_DIM > 64) {  // a fresh (volatile) read: the tile row kept since the dot
                const volatile float* k_row_ = k_tile_[r_];  // product would not fit beside dQ
#pragma unroll
                for (int c_ = 0; c_ < HEAD_DIM; ++c_) dq_[c_] += ds_ * k_row_[c_];
            } else {
#pragma unroll
                for (int c_ = 0; c_ < HEAD_DIM; ++c_) dq_[c_] += ds_ * k_tile_[r_][c_];
            }
        }
        __syncthreads();  // every thread is done with the key tile before it is overwritten
    }
    if (i_ < n_q_) {
#pragma unroll
        for (int c_ = 0; c_ < HEAD_DIM; ++c_)
            if (c_ < d_qk_) $dQ[(long long)i_ * d_qk_ + c_] = dq_[c_];
    }
}""")


class Sizes:
    """The core's sizes as host C expressions."""

    def __init__(self, core: AttentionCore, names: CNames) -> None:
        self.n_q = dim_c(core.n_q, names)
        self.n_k = dim_c(core.n_k, names)
        self.d_qk = dim_c(core.d_qk, names)
        self.d_v = dim_c(core.d_v, names)
        self.heads = " * ".join(dim_c(d, names) for d in core.lead) if core.lead else "1"

    def host_args(self) -> list[tuple[str, str]]:
        return [("n_q_", self.n_q), ("n_k_", self.n_k), ("d_qk_", self.d_qk), ("d_v_", self.d_v),
                ("heads_", self.heads)]


def _block_coords(rows: str, per_block: str = "ROWS") -> str:
    """The block's (batch entry, head, first row): grid.x folds all three, the row blocks fastest."""
    return "\n".join([
        "    // grid.x = row blocks x heads x batch (rows fastest): no grid.y/z limit on heads or batch.",
        f"    const unsigned int row_blocks_ = ((unsigned int){rows} + {per_block} - 1) / {per_block};",
        "    const unsigned int entry_ = blockIdx.x / row_blocks_;",
        "    const int head_ = (int)(entry_ % (unsigned int)heads_);",
        "    const long long b_ = entry_ / (unsigned int)heads_;  // the batch entry",
        f"    const int row0_ = (int)(blockIdx.x % row_blocks_) * {per_block};"])


def _per_block(sizes: "Sizes") -> str:
    """Host expression: rows (threads) per block of the head-dim variant the host launches."""
    larger = sizes.d_qk if sizes.d_qk == sizes.d_v else f"({sizes.d_qk} > {sizes.d_v} ? {sizes.d_qk} : {sizes.d_v})"
    return f"SA_ATTN_ROWS_FOR({larger})"


def _grid(rows: str, heads: str, batch: str, per_block: str) -> tuple[str, str, str]:
    return (f"(unsigned int)(({rows} + {per_block} - 1) / {per_block}) * ({heads}) * {batch}", "1", "1")


def _limits(rows: str, heads: str, batch: str, per_block: str) -> list[GridLimit]:
    return [GridLimit(f"(long long)(({rows} + {per_block} - 1) / {per_block}) * ({heads}) * {batch}", "SA_GRID_X_MAX")]


def _bound(expr: sympy.Expr, names: CNames, first: str, last: str) -> str:
    """A block bound of `plan.tile_bounds` (over I0/I1 or J0/J1 and D_<dim>) as C int arithmetic."""
    rename = {}
    for symbol in expr.free_symbols:
        if symbol in (I0, J0):
            rename[symbol] = sympy.Symbol(first)
        elif symbol in (I1, J1):
            rename[symbol] = sympy.Symbol(last)
        else:
            rename[symbol] = sympy.Symbol(names.spec("dim", symbol.name[2:]))
    return str(expr.xreplace(rename))


def _range(lo, hi, limit: str, names: CNames, first: str = "row0_", last: str = "(row0_ + ROWS - 1)") -> str:
    """`lo_`, `hi_`: the range of the other side's rows a block of rows `first`..`last` must visit."""
    lines = [f"    int lo_ = 0, hi_ = {limit};  // the rows outside are masked for every row of the block"]
    for bound in lo:
        lines.append(f"    {{ const int b_lo_ = {_bound(bound, names, first, last)}; if (b_lo_ > lo_) lo_ = b_lo_; }}")
    for bound in hi:
        lines.append(f"    {{ const int b_hi_ = {_bound(bound, names, first, last)}; if (b_hi_ < hi_) hi_ = b_hi_; }}")
    return "\n".join(lines)


def _common(core, prefix, names, dims, lead, reads: list[Buffer], grads: list[Buffer] = ()):
    """The template values every kernel of a core shares: its dims (and, after them, the read tensors' pointers
    and, in the dK/dV kernel, their gradients'), the head coordinates, what a score call passes."""
    int_dims = "".join(f", int {d}" for d in dims)
    dim_args = "".join(f", {d}" for d in dims)
    grad_part = "".join(f", {g.name}" for g in grads)
    bounds = tile_bounds(core)
    skips = dict(skip_keys="", skip_queries="", skip_keys_dq="")
    if core.masked_at_run_time:  # a run-time mask: a tile that hides every entry of the block's rows (columns) is skipped
        tail = dim_args + read_args(reads, bool(core.drawn))
        lead_args = "".join(f"{z}, " for z in lead)

        def skip(indent, tile, rows, limit, valid, order):
            args = f"i_, {tile}0_ + r_" if order == "keys" else f"{tile}0_ + r_, j_"
            return (f"{indent}{{  // a tile the mask hides whole for every row of the block is skipped\n"
                    f"{indent}    int any_ = 0;\n"
                    f"{indent}    if ({valid}) for (int r_ = 0; r_ < {rows} && {tile}0_ + r_ < {limit} && !any_; ++r_)\n"
                    f"{indent}        any_ = {prefix}_keep(0.0f, {lead_args}{args}{tail});\n"
                    f"{indent}    if (!__syncthreads_or(any_)) continue;\n"
                    f"{indent}}}")
        skips = dict(skip_keys=skip("        ", "j", "KEYS_", "hi_", "i_ < n_q_", "keys"),
                     skip_queries=skip("            ", "i", "STEP_", "(hi_ < n_q_ ? hi_ : n_q_)", "j_ < n_k_",
                                       "queries"),
                     skip_keys_dq=skip("        ", "j", "STEP_", "(hi_ < n_k_ ? hi_ : n_k_)", "i_ < n_q_", "keys"))
    return dict(**skips, prefix=prefix, dim_params=int_dims + read_params(reads) + read_params(grads, True),
                dim_args=dim_args + "".join(f", {b.name}" for b in reads) + grad_part,
                score_tail=dim_args + read_args(reads, bool(core.drawn)), lead_args="".join(f"{z}, " for z in lead),
                lead_coords=_lead_coords(core, lead, names),
                key_range=_range(bounds.key_lo, bounds.key_hi, "n_k_", names),
                query_range=_range(bounds.query_lo, bounds.query_hi, "n_q_", names))


def _weigh(core, prefix, common, j: str, backward: bool) -> str:
    """The weights' factor after the softmax at entry (i_, j): P w in `pw_` (and dP w in `dp_`)."""
    if core.weights is None:
        return "                pw_ = p_;" if backward else "            const float pw_ = p_;"
    call = f"{prefix}_weights(dot_, {common['lead_args']}i_, {j}{common['score_tail']})"
    if backward:
        return f"                const float w_ = {call};\n                pw_ = p_ * w_;\n                dp_ *= w_;"
    return f"            const float pw_ = p_ * {call};"


def _read_grads(core, prefix, common, names, grads: list[Buffer]) -> str:
    """The atomic adds of dS * d score / d entry into each learned read's gradient (zeros before the kernel)."""
    lines = []
    buffers = dict(zip(core.learned, grads))
    indices = {"i": "i_", "j": "j_", **{f"z{k}": f"z{k}_" for k in range(len(core.lead))}}
    printer = CPrinter(names, ScoreSource(core, [], names), indices=indices)
    for k, read in enumerate(r for r in core.reads if r.derivative is not None):
        g = buffers[read.tensor]
        at = [printer.subscript(x) for x in read.subscripts]
        offset = offset_c(at, g.shape, names)
        base = f"b_ * {numel_c(g.shape, names)} + " if g.batched else ""
        call = f"{prefix}_score_d{k}(dot_, {common['lead_args']}i_, j_{common['score_tail']})"
        # (above head dim 64 the queries are visited once per 64 columns of dK and dV: the first pass adds)
        lines.append(f"            if (c0_ == 0 && dsc_ != 0.0f) atomicAdd(&{g.name}[{base}{offset}], dsc_ * {call});")
    return "\n".join(lines)


def forward_kernels(core: AttentionCore, prefix: str, q: Buffer, k: Buffer, v: Buffer, out: Buffer, lse: Buffer,
                    reads: list[Buffer], names: CNames, dims: Sequence[str], lead: list[str], batch: str,
                    formula: str) -> Kernel:
    common = _common(core, prefix, names, dims, lead, reads)
    p = _param_names([("O", out), ("lse", lse), ("Q", q), ("K", k), ("V", v)])
    offsets = "\n".join([_head_offset(p["Q"], q, "n_q_", "d_qk_", heads_of(core, q.shape, names)),
                         _head_offset(p["K"], k, "n_k_", "d_qk_", heads_of(core, k.shape, names)),
                         _head_offset(p["V"], v, "n_k_", "d_v_", heads_of(core, v.shape, names)),
                         _head_offset(p["O"], out, "n_q_", "d_v_"), _head_offset(p["lse"], lse, "n_q_", "1")])
    body = _FORWARD.substitute(common, formula=formula, offsets=offsets, block_coords=_block_coords("n_q_"),
                               weigh=_weigh(core, prefix, common, "j0_ + r_", False), **p)
    params = (f"float* __restrict__ {p['O']}, float* __restrict__ {p['lse']}, const float* __restrict__ {p['Q']}, "
              f"const float* __restrict__ {p['K']}, const float* __restrict__ {p['V']}{read_params(reads)},\n        "
              f"int n_q_, int n_k_, int d_qk_, int d_v_, int heads_{''.join(f', int {d}' for d in dims)}")
    args = f"{p['O']}, {p['lse']}, {p['Q']}, {p['K']}, {p['V']}, n_q_, n_k_, d_qk_, d_v_, heads_{common['dim_args']}"
    wrappers, variants = _variants(f"{prefix}_fwd", f"{prefix}_forward", params, args,
                                   f"{core.output} = softmax(score) @ V: the forward at each supported head dim")
    sizes = Sizes(core, names)
    per = _per_block(sizes)
    return Kernel(f"{prefix}_fwd", [formula], body + "\n\n" + wrappers, [out, lse], [q, k, v, *reads],
                  _grid(sizes.n_q, sizes.heads, batch, per), (per, "1", "1"), extra=sizes.host_args(),
                  phase="forward", variants=variants, limits=_limits(sizes.n_q, sizes.heads, batch, per))


def backward_kernels(core: AttentionCore, prefix: str, q: Buffer, k: Buffer, v: Buffer, out: Buffer, d_out: Buffer,
                     lse: Buffer, delta: Buffer, dq: Buffer, dk: Buffer, dv: Buffer, reads: list[Buffer],
                     grads: list[Buffer], d_lse: Buffer | None, names: CNames, dims: Sequence[str], lead: list[str],
                     batch: str) -> list[Kernel]:
    """The delta, dK/dV and dQ kernels; `reads` the tensors the score reads, `grads` the gradients of the learned
    ones (zeros: they are added into), `d_lse` the gradient of the row log-sum-exp (None: 0)."""
    common = _common(core, prefix, names, dims, lead, reads)
    common_dkdv = _common(core, prefix, names, dims, lead, reads, grads)
    sizes = Sizes(core, names)
    per = _per_block(sizes)
    grid_q, grid_k = _grid(sizes.n_q, sizes.heads, batch, per), _grid(sizes.n_k, sizes.heads, batch, per)
    limits_q, limits_k = _limits(sizes.n_q, sizes.heads, batch, per), _limits(sizes.n_k, sizes.heads, batch, per)
    p = _param_names([("dQ", dq), ("dK", dk), ("dV", dv), ("Q", q), ("K", k), ("V", v), ("O", out),
                      ("dO", d_out), ("lse", lse), ("delta", delta)])

    delta_offsets = [_head_offset(p["delta"], delta, "n_q_", "1"), _head_offset(p["O"], out, "n_q_", "d_v_"),
                     _head_offset(p["dO"], d_out, "n_q_", "d_v_")]
    dlse = dict(dlse_param="", dlse_term="")
    if d_lse is not None:
        delta_offsets.append(_head_offset(d_lse.name, d_lse, "n_q_", "1"))
        dlse = dict(dlse_param=f", const float* __restrict__ {d_lse.name}", dlse_term=f" - {d_lse.name}[i_]")
    delta_text = _DELTA.substitute(common, offsets="\n".join(delta_offsets),
                                   block_coords=_block_coords("n_q_", "SA_ATTN_ROWS"), **dlse, **p)
    delta_kernel = Kernel(f"{prefix}_delta", [f"delta = rowsum(grad({core.output}) * {core.output})"
                                              + (" - grad(lse)" if d_lse is not None else "")], delta_text,
                          [delta], [out, d_out, *([d_lse] if d_lse is not None else [])],
                          _grid(sizes.n_q, sizes.heads, batch, "SA_ATTN_ROWS"), ("SA_ATTN_ROWS", "1", "1"),
                          extra=[("n_q_", sizes.n_q), ("d_v_", sizes.d_v), ("heads_", sizes.heads)],
                          phase="backward", takes_dims=False,
                          limits=_limits(sizes.n_q, sizes.heads, batch, "SA_ATTN_ROWS"))

    operands = [_head_offset(p["Q"], q, "n_q_", "d_qk_", heads_of(core, q.shape, names)),
                _head_offset(p["K"], k, "n_k_", "d_qk_", heads_of(core, k.shape, names)),
                _head_offset(p["V"], v, "n_k_", "d_v_", heads_of(core, v.shape, names)),
                _head_offset(p["dO"], d_out, "n_q_", "d_v_"),
                _head_offset(p["lse"], lse, "n_q_", "1"), _head_offset(p["delta"], delta, "n_q_", "1")]
    int_dims = "".join(f", int {d}" for d in dims)
    operand_params = (f"const float* __restrict__ {p['Q']}, const float* __restrict__ {p['K']}, "
                      f"const float* __restrict__ {p['V']}, const float* __restrict__ {p['dO']},\n        "
                      f"const float* __restrict__ {p['lse']}, const float* __restrict__ {p['delta']}"
                      f"{read_params(reads)}, int n_q_, int n_k_, int d_qk_, int d_v_, int heads_{int_dims}")

    def call_args(c) -> str:
        return (f"{p['Q']}, {p['K']}, {p['V']}, {p['dO']}, {p['lse']}, {p['delta']}, "
                f"n_q_, n_k_, d_qk_, d_v_, heads_{c['dim_args']}")

    recompute_dkdv = Template(_RECOMPUTE).substitute(common_dkdv, weigh=_weigh(core, prefix, common_dkdv, "j_", True),
                                                     read_grads=_read_grads(core, prefix, common_dkdv, names, grads))
    dkdv_offsets = "\n".join([_head_offset(p["dK"], dk, "n_k_", "d_qk_"), _head_offset(p["dV"], dv, "n_k_", "d_v_"),
                              *operands])
    dkdv_body = _DKDV.substitute(common_dkdv, offsets=dkdv_offsets, recompute=indent(recompute_dkdv, "    "),
                                 block_coords=_block_coords("n_k_"), **p)
    dkdv_wrappers, dkdv_variants = _variants(
        f"{prefix}_bwd_dkdv", f"{prefix}_backward_dkdv",
        f"float* __restrict__ {p['dK']}, float* __restrict__ {p['dV']}{read_params(grads, True)}, " + operand_params,
        f"{p['dK']}, {p['dV']}, " + call_args(common_dkdv), "dK and dV at each supported head dim")
    dkdv = Kernel(f"{prefix}_bwd_dkdv", [f"grad({core.k}), grad({core.v}) through {core.output}"],
                  dkdv_body + "\n\n" + dkdv_wrappers, [dk, dv, *grads], [q, k, v, d_out, lse, delta, *reads], grid_k,
                  (per, "1", "1"), extra=sizes.host_args(), phase="backward", variants=dkdv_variants,
                  limits=limits_k)

    recompute_dq = Template(_RECOMPUTE).substitute(common, weigh=_weigh(core, prefix, common, "j_", True),
                                                   read_grads="")
    dq_offsets = "\n".join([_head_offset(p["dQ"], dq, "n_q_", "d_qk_"), *operands])
    dq_body = _DQ.substitute(common, offsets=dq_offsets, recompute=recompute_dq, block_coords=_block_coords("n_q_"),
                             **p)
    dq_wrappers, dq_variants = _variants(
        f"{prefix}_bwd_dq", f"{prefix}_backward_dq", f"float* __restrict__ {p['dQ']}, " + operand_params,
        f"{p['dQ']}, " + call_args(common), "dQ at each supported head dim")
    dq_kernel = Kernel(f"{prefix}_bwd_dq", [f"grad({core.q}) through {core.output}"], dq_body + "\n\n" + dq_wrappers,
                       [dq], [q, k, v, d_out, lse, delta, *reads], grid_q, (per, "1", "1"),
                       extra=sizes.host_args(), phase="backward", variants=dq_variants, limits=limits_q)
    return [delta_kernel, dkdv, dq_kernel]


def head_coordinates(core: AttentionCore, lead: list[str], names: CNames) -> str:
    """C statements setting each head coordinate (`z0_`, ...) from the flat head index `head_`."""
    return _lead_coords(core, lead, names)
