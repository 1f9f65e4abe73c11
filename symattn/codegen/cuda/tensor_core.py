"""The fused attention forward on tensor cores (bf16 / fp16 inputs, fp32 accumulation) for one `AttentionCore`.

Contract: `forward(core, prefix, names, dims, lead, batch, formula)` returns a
`TensorCoreForward`: the CUDA text of a FlashAttention-2 style forward kernel
(a template over the head dim and the input type, instantiated for every
`TC_HEAD_DIMS` and both `TC_DTYPES`) and, for each dtype, the host launch
function `<prefix>_forward_<dtype>` (`host(dtype, checks)`; `checks` are the
spec's size checks, which `emit` owns). The kernel calls the core's score
device function `<prefix>_score` (from `flash.score_functions`), so a spec's
scale, bias, softcap and masks are the very expression the fp32 path runs.

The kernel: a block of 4 warps owns 64 x GROUPS query rows (16 x GROUPS per
warp) of one (batch entry, head); `FORWARD_SHAPES` picks GROUPS (2 up to head
dim 128, as FlashAttention-2's 128-row blocks; 1 at 256), the keys per tile
(64, or 32 where the accumulators would not fit) and whether Q's fragments stay
in registers. Tiles of K and V stream through shared memory with cp.async,
double buffered (the copy of tile t + 1 is in flight while tile t is computed).
Each warp computes S = Q K^T with mma.sync m16n8k16 into fp32 accumulators,
every K fragment loaded by ldmatrix feeding the mma of all its row groups,
applies the score to each accumulator element at its (i, j) (the fragment
layout: lane l holds rows l/4 and l/4 + 8, columns 2 (l % 4) and + 1 of each
8-column tile), masks keys past the end, and runs the online softmax in base 2
with `ex2.approx.ftz` (row max reduced over the 4 lanes of a row with
shuffles; the O accumulator rescaled once per tile). When the score is
c * (Q K^T) + b (`linear_score`: a scale, masks, biases) the softmax runs on
x = s + b / c and each weight is exp2(x * c log2 e - max * c log2 e), one FFMA
and one ex2, as FlashAttention-2 does; other scores (softcap) use x = score *
log2 e. P is rounded to the input type in registers and used directly as the A
operand of P V (the accumulator layout of two 8-column tiles is the A layout of
one 16-wide step); V comes through ldmatrix .trans, each fragment again feeding
every row group. O is normalised, staged through shared memory and written with
128-bit stores in the input type; lse = max * c + log(l) in fp32. A fully
masked row gives O = 0 and lse = -inf, as the fp32 path does; a NaN score gives
NaN.

Masked tiles: `masked_condition` reads the score for a part that is -inf
whatever s is (a `where` branch, or a tensor of constants such as a causal or
window mask, added to the rest), and prints it as `<prefix>_masked(i, j)`.
Where it exists, each warp evaluates it over its rows x keys of a tile
and, when every entry is masked, skips that tile's products and softmax (the
entries would contribute exactly 0). The warps test tile t + 1 while tile t's
copy is in flight and publish the answers in shared memory (one barrier a
tile): a tile no warp of the block needs is not loaded, and its barriers are
skipped too (about half the K/V copies of a long causal sequence). Scores
with no such part (softcap) skip nothing and keep the loop without the test.

Host limits (else `SYMATTN_UNSUPPORTED`, and the fp32 `<spec>_forward` is the
fallback): head dims multiples of 8 up to 256, 16-byte aligned pointers, and a
folded scale c that is positive with c log2 e and 1 / c finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Sequence

from ..plan import AttentionCore
from .flash import Sizes, head_coordinates
from .names import CNames
from .score_forms import SoftmaxParts, masked_condition, scale_check, softmax_parts

__all__ = ["TC_HEAD_DIMS", "TC_DTYPES", "TC_PRELUDE", "TensorCoreForward", "forward", "unsupported", "shared_bytes",
           "ROWS", "PAD",
           "LIVE_TEST", "masked_condition", "ForwardShape", "FORWARD_SHAPES"]

TC_HEAD_DIMS = (32, 64, 96, 128, 256)
TC_DTYPES = ("bf16", "f16")
ROWS = KEYS = 64   # the backward's rows per block and keys per tile (SA_TC_ROWS, SA_TC_KEYS)
PAD = 8            # SA_TC_PAD


@dataclass(frozen=True)
class ForwardShape:
    """How the forward at one head dim splits its work (template arguments of `<prefix>_tc_forward`)."""

    groups: int            # row groups of 16 per warp: each K/V fragment loaded by ldmatrix feeds this many mma
    keys: int              # keys per K/V tile
    q_in_registers: bool   # Q's fragments kept in registers, else reloaded from shared memory per tile

    @property
    def rows(self) -> int:  # query rows per block (4 warps)
        return 4 * 16 * self.groups


# Per head dim, a shape that ptxas keeps within 255 registers without spilling (nvcc 13.0, sm_90; the
# registers are in BENCHMARKS.md): 32 rows a warp up to d = 128 (FlashAttention-2's 128-row blocks).
# From d = 96 the O accumulators alone take d registers: 32-key tiles, and Q's fragments reloaded from
# shared memory per k-step (kept in registers, ptxas spilled at 96 and 128). At 256 the accumulators of 32
# rows would take 256 registers: 16 rows a warp, 64-key tiles.
FORWARD_SHAPES = {
    32: ForwardShape(groups=2, keys=64, q_in_registers=True),
    64: ForwardShape(groups=2, keys=64, q_in_registers=True),
    96: ForwardShape(groups=2, keys=32, q_in_registers=False),
    128: ForwardShape(groups=2, keys=32, q_in_registers=False),
    256: ForwardShape(groups=1, keys=64, q_in_registers=False),
}


def unsupported(core: AttentionCore) -> str | None:
    """Why the tensor-core kernels do not compute `core`, or None: they take Q, K, V and O alone (a score that
    reads tensors, a factor of the weights, heads broadcast or a row log-sum-exp of the spec's are the fp32
    fused kernels' only)."""
    if core.reads:
        return f"its score reads {', '.join(core.read_tensors)}"
    if core.weights is not None:
        return "its weights have a factor after the softmax"
    if any(tuple(lead) != tuple(core.lead) for lead in (core.q_lead, core.k_lead, core.v_lead)):
        return "its operands are broadcast over heads"
    if core.lse is not None:
        return f"the spec reads its row log-sum-exp ({core.lse})"
    return None


def shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of the forward at `head_dim`: the Q tile, two K and two V tiles (sa_tc_shared_bytes)."""
    shape = FORWARD_SHAPES[head_dim]
    return (shape.rows + 4 * shape.keys) * (head_dim + PAD) * 2


TC_PRELUDE = """\
// Tensor-core attention (cuda_warp.h: mma.sync, ldmatrix, cp.async, shuffles, and their CPU emulation).
#include "cuda_warp.h"
#define SA_TC_ROWS @ROWS@      // backward: rows per block (4 warps of 16) and per tile of the other side
#define SA_TC_KEYS @KEYS@      // backward: keys per tile (the forward's shape is per head dim: FORWARD_SHAPES)
#define SA_TC_THREADS 128
#define SA_TC_PAD @PAD@        // elements of padding per shared row: ldmatrix reads 8 rows without bank conflicts
#ifdef __CUDACC__
#define SA_TC_DYNAMIC_SHARED(name, bytes) extern __shared__ __align__(16) unsigned char name[]
#define SA_TC_LAUNCH(kernel, grid, block, smem, stream, ...) \\
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
// Shared memory over 48 KiB must be allowed per kernel before its launch.
#define SA_TC_ALLOW_SHARED(kernel, bytes) \\
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes))
typedef uint4 sa_tc_chunk;
#else
#define SA_TC_DYNAMIC_SHARED(name, bytes) alignas(16) static unsigned char name[bytes]
#define SA_TC_LAUNCH(kernel, grid, block, smem, stream, ...) sa_host::launch(kernel, (grid), (block), __VA_ARGS__)
#define SA_TC_ALLOW_SHARED(kernel, bytes) 0
struct alignas(16) sa_tc_chunk { uint32_t w[4]; };
#endif

// The input types: the mma instruction and the rounding of fp32 pairs to one register.
struct sa_tc_bf16 {
    typedef sa_bf16 value;
    static __device__ __forceinline__ float to_float(value x) { return sa_from_bf16(x); }
    static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2],
                                               const float c[4]) { sa_mma_m16n8k16_bf16(d, a, b, c); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return sa_pack_bf16x2(lo, hi); }
};
struct sa_tc_f16 {
    typedef sa_f16 value;
    static __device__ __forceinline__ float to_float(value x) { return sa_from_f16(x); }
    static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2],
                                               const float c[4]) { sa_mma_m16n8k16_f16(d, a, b, c); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return sa_pack_f16x2(lo, hi); }
};

// Bytes of shared memory of the forward at HEAD_DIM: the Q tile of ROWS rows, then two K and two V tiles of KEYS.
static __host__ __device__ constexpr int sa_tc_shared_bytes(int head_dim, int rows, int keys) {
    return (rows + 4 * keys) * (head_dim + SA_TC_PAD) * 2;
}

// Start copying rows [row0, row0 + ROWS) x [0, HEAD_DIM) of a [rows, width] matrix of 2-byte
// elements into a shared tile (row stride HEAD_DIM + SA_TC_PAD), 16 bytes per copy; rows at or past
// `rows` and columns at or past `width` (a multiple of 8) are filled with zeros. When the 16-byte
// chunks of a row divide the block, each thread copies one column of every (128 / chunks)-th row,
// stepping one pointer (few live registers: the forward keeps this loop beside its accumulators).
template <int HEAD_DIM, int ROWS = SA_TC_ROWS>
static __device__ __forceinline__ void sa_tc_load_tile(unsigned char* tile, const unsigned char* matrix,
                                                       int row0, int rows, int width) {
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    if constexpr (SA_TC_THREADS % CHUNKS == 0 && ROWS % (SA_TC_THREADS / CHUNKS) == 0) {
        constexpr int STEP = SA_TC_THREADS / CHUNKS;  // rows per pass of the block
        const int r_ = threadIdx.x / CHUNKS, col_ = (threadIdx.x % CHUNKS) * 8;
        const bool column_ = col_ < width;
        const unsigned char* from_ = matrix + ((long long)(row0 + r_) * width + col_) * 2;
        unsigned char* to_ = tile + (r_ * (HEAD_DIM + SA_TC_PAD) + col_) * 2;
#pragma unroll
        for (int k_ = 0; k_ < ROWS / STEP; ++k_) {
            const bool inside_ = column_ && row0 + r_ + k_ * STEP < rows;
            sa_cp_async_16_zfill(to_ + k_ * STEP * (HEAD_DIM + SA_TC_PAD) * 2, inside_ ? from_ : matrix,
                                 inside_ ? 16 : 0);
            from_ += (long long)STEP * width * 2;
        }
    } else {
#pragma unroll
        for (int c_ = threadIdx.x; c_ < ROWS * CHUNKS; c_ += SA_TC_THREADS) {
            const int r_ = c_ / CHUNKS, col_ = (c_ % CHUNKS) * 8;
            const bool inside_ = row0 + r_ < rows && col_ < width;
            const unsigned char* from_ = inside_ ? matrix + ((long long)(row0 + r_) * width + col_) * 2 : matrix;
            sa_cp_async_16_zfill(tile + (r_ * (HEAD_DIM + SA_TC_PAD) + col_) * 2, from_, inside_ ? 16 : 0);
        }
    }
}
"""
TC_PRELUDE = TC_PRELUDE.replace("@ROWS@", str(ROWS)).replace("@KEYS@", str(KEYS)).replace("@PAD@", str(PAD))

_FORWARD = Template("""\
// $formula
// Forward on tensor cores: 4 warps x (16 x GROUPS) query rows, tiles of KEYS keys (cp.async, double
// buffered), S = Q K^T and O += P V by mma.sync m16n8k16 (each ldmatrix'd K or V fragment feeds GROUPS
// of them), online softmax in base 2 in registers (ex2.approx).
template <int HEAD_DIM, typename TYPE, int GROUPS, int KEYS, bool Q_IN_REGISTERS>
static __device__ __forceinline__ void ${prefix}_tc_forward(
        unsigned char* __restrict__ out_, float* __restrict__ lse_, const unsigned char* __restrict__ q_,
        const unsigned char* __restrict__ k_, const unsigned char* __restrict__ v_,
        int n_q_, int n_k_, int d_qk_, int d_v_, int heads_$dim_params) {
    constexpr int ROWS = 4 * 16 * GROUPS;            // query rows per block
    constexpr int STRIDE = HEAD_DIM + SA_TC_PAD;     // elements per shared row
    constexpr int Q_TILE = ROWS * STRIDE * 2;        // bytes of the Q tile
    constexpr int TILE = KEYS * STRIDE * 2;          // bytes per K or V tile
    constexpr int STEPS = HEAD_DIM / 16;             // k-steps of Q K^T; 16-column pairs of P V
    constexpr float LOG2E = 1.4426950408889634f;
    SA_TC_DYNAMIC_SHARED(shared_, sa_tc_shared_bytes(HEAD_DIM, ROWS, KEYS));
    unsigned char* q_tile_ = shared_;
    unsigned char* kv_ = shared_ + Q_TILE;  // K tiles at kv_ + {0, 1} * TILE, V tiles at kv_ + {2, 3} * TILE
    const int head_ = blockIdx.y;
    const long long b_ = blockIdx.z;  // the batch entry
$lead_coords
    const long long plane_ = b_ * heads_ + head_;
    q_ += plane_ * n_q_ * d_qk_ * 2;
    k_ += plane_ * n_k_ * d_qk_ * 2;
    v_ += plane_ * n_k_ * d_v_ * 2;
    out_ += plane_ * n_q_ * d_v_ * 2;
    lse_ += plane_ * n_q_;
    const int lane_ = sa_lane_id(), warp_ = threadIdx.x / SA_WARP_SIZE;
    const int group_ = lane_ >> 2, pair_ = (lane_ & 3) * 2;  // fragment row, and first column of a pair
    const int q0_ = blockIdx.x * ROWS;
    const int wrow_ = warp_ * 16 * GROUPS;                   // the warp's first row in the block
    const int row0_ = q0_ + wrow_ + group_;  // this lane's rows: row0_ + 16 g and row0_ + 16 g + 8
    const int tiles_ = (n_k_ + KEYS - 1) / KEYS;
$scale_setup
$first
    uint32_t q_frag_[Q_IN_REGISTERS ? GROUPS : 1][Q_IN_REGISTERS ? STEPS : 1][4];
    float o_[GROUPS][HEAD_DIM / 8][4];
#pragma unroll
    for (int g_ = 0; g_ < GROUPS; ++g_)
#pragma unroll
        for (int n_ = 0; n_ < HEAD_DIM / 8; ++n_)
#pragma unroll
            for (int e_ = 0; e_ < 4; ++e_) o_[g_][n_][e_] = 0.0f;
    // Running max of each row (in the units of x below: exp2(x * scale_ - max * scale_) is the weight),
    // and this lane's part of the running sum of the weights.
    float m_[GROUPS][2], l_[GROUPS][2];
#pragma unroll
    for (int g_ = 0; g_ < GROUPS; ++g_)
#pragma unroll
        for (int r_ = 0; r_ < 2; ++r_) m_[g_][r_] = -INFINITY, l_[g_][r_] = 0.0f;
    // ldmatrix addresses: lane l names row l % 8 of 8x8 matrix l / 8.
    const int a_row_ = (lane_ & 7) + ((lane_ >> 3) & 1) * 8, a_col_ = (lane_ >> 4) * 8;  // A of Q, V .trans
    const int b_row_ = (lane_ & 7) + (lane_ >> 4) * 8, b_col_ = ((lane_ >> 3) & 1) * 8;  // B of K

$loop_head        const unsigned char* k_tile_ = kv_ + (t_ & 1) * TILE;
        const unsigned char* v_tile_ = kv_ + (2 + (t_ & 1)) * TILE;
        if (Q_IN_REGISTERS && $first_tile) {  // the first tile this block computes
#pragma unroll
            for (int g_ = 0; g_ < (Q_IN_REGISTERS ? GROUPS : 0); ++g_)
#pragma unroll
                for (int s_ = 0; s_ < STEPS; ++s_)
                    sa_ldmatrix_x4(q_frag_[g_][s_], q_tile_ + ((wrow_ + g_ * 16 + a_row_) * STRIDE + s_ * 16 + a_col_) * 2);
        }
$skip
        {
        // S = Q K^T: GROUPS x KEYS / 8 tiles of 16 x 8, fp32; each K fragment feeds every row group.
        float s_acc_[GROUPS][KEYS / 8][4];
#pragma unroll
        for (int g_ = 0; g_ < GROUPS; ++g_)
#pragma unroll
            for (int n_ = 0; n_ < KEYS / 8; ++n_)
#pragma unroll
                for (int e_ = 0; e_ < 4; ++e_) s_acc_[g_][n_][e_] = 0.0f;
#pragma unroll
        for (int s_ = 0; s_ < STEPS; ++s_) {
            uint32_t a_[GROUPS][4];
#pragma unroll
            for (int g_ = 0; g_ < GROUPS; ++g_) {
                if (Q_IN_REGISTERS) {
#pragma unroll
                    for (int e_ = 0; e_ < 4; ++e_) a_[g_][e_] = q_frag_[Q_IN_REGISTERS ? g_ : 0][Q_IN_REGISTERS ? s_ : 0][e_];
                } else {
                    sa_ldmatrix_x4(a_[g_], q_tile_ + ((wrow_ + g_ * 16 + a_row_) * STRIDE + s_ * 16 + a_col_) * 2);
                }
            }
#pragma unroll
            for (int n_ = 0; n_ < KEYS / 8; n_ += 2) {  // two key tiles per ldmatrix
                uint32_t b_[4];
                sa_ldmatrix_x4(b_, k_tile_ + ((n_ * 8 + b_row_) * STRIDE + s_ * 16 + b_col_) * 2);
#pragma unroll
                for (int g_ = 0; g_ < GROUPS; ++g_) {
                    TYPE::mma(s_acc_[g_][n_], a_[g_], b_, s_acc_[g_][n_]);
                    TYPE::mma(s_acc_[g_][n_ + 1], a_[g_], b_ + 2, s_acc_[g_][n_ + 1]);
                }
            }
        }
        uint32_t p_frag_[GROUPS][KEYS / 16][4];  // P, rounded to the input type
#pragma unroll
        for (int g_ = 0; g_ < GROUPS; ++g_) {
        // $element_comment; keys past the end are masked (a branch of its own, so that the bounds tests
        // stay out of the loop of full tiles).
        float tile_max_[2] = {m_[g_][0], m_[g_][1]};
        if ((t_ + 1) * KEYS <= n_k_) {  // block-uniform: every key of the tile exists
$scores
        } else {
$ragged_scores
        }
        float base_[2];
#pragma unroll
        for (int r_ = 0; r_ < 2; ++r_) {  // the 4 lanes of a row hold its KEYS scores between them
            tile_max_[r_] = fmaxf(tile_max_[r_], sa_shfl_xor(tile_max_[r_], 1));
            tile_max_[r_] = fmaxf(tile_max_[r_], sa_shfl_xor(tile_max_[r_], 2));
            // 2^((m_old - m_new) scale_): 1 while the row is all masked (no -inf - -inf), 0 on its first score.
            const float rescale_ = tile_max_[r_] == -INFINITY ? 1.0f
                                                              : sa_ex2_approx((m_[g_][r_] - tile_max_[r_]) * scale_);
            base_[r_] = tile_max_[r_] == -INFINITY ? 0.0f : tile_max_[r_] * scale_;
            m_[g_][r_] = tile_max_[r_];
            l_[g_][r_] *= rescale_;
#pragma unroll
            for (int n_ = 0; n_ < HEAD_DIM / 8; ++n_) {
                o_[g_][n_][2 * r_] *= rescale_;
                o_[g_][n_][2 * r_ + 1] *= rescale_;
            }
        }
#pragma unroll
        for (int n_ = 0; n_ < KEYS / 8; ++n_)
#pragma unroll
            for (int e_ = 0; e_ < 4; ++e_) {  // one FFMA and one MUFU.EX2; a masked entry gives exactly 0
                const float p_ = sa_ex2_approx(fmaf(s_acc_[g_][n_][e_], scale_, -base_[e_ >> 1]));
                l_[g_][e_ >> 1] += p_;
                s_acc_[g_][n_][e_] = p_;
            }
        // P in the input type: the accumulators of key tiles 2k and 2k + 1 are the A fragment of step k.
#pragma unroll
        for (int k_step_ = 0; k_step_ < KEYS / 16; ++k_step_) {
            p_frag_[g_][k_step_][0] = TYPE::pack(s_acc_[g_][2 * k_step_][0], s_acc_[g_][2 * k_step_][1]);
            p_frag_[g_][k_step_][1] = TYPE::pack(s_acc_[g_][2 * k_step_][2], s_acc_[g_][2 * k_step_][3]);
            p_frag_[g_][k_step_][2] = TYPE::pack(s_acc_[g_][2 * k_step_ + 1][0], s_acc_[g_][2 * k_step_ + 1][1]);
            p_frag_[g_][k_step_][3] = TYPE::pack(s_acc_[g_][2 * k_step_ + 1][2], s_acc_[g_][2 * k_step_ + 1][3]);
        }
        }
        // O += P V; each V fragment feeds every row group.
#pragma unroll
        for (int k_step_ = 0; k_step_ < KEYS / 16; ++k_step_) {
#pragma unroll
            for (int n_ = 0; n_ < HEAD_DIM / 8; n_ += 2) {  // two 8-column tiles of O per ldmatrix
                uint32_t b_[4];
                sa_ldmatrix_x4_trans(b_, v_tile_ + ((k_step_ * 16 + a_row_) * STRIDE + n_ * 8 + a_col_) * 2);
#pragma unroll
                for (int g_ = 0; g_ < GROUPS; ++g_) {
                    TYPE::mma(o_[g_][n_], p_frag_[g_][k_step_], b_, o_[g_][n_]);
                    TYPE::mma(o_[g_][n_ + 1], p_frag_[g_][k_step_], b_ + 2, o_[g_][n_ + 1]);
                }
            }
        }
        }
        __syncthreads();  // every warp is done with tile t before its buffers are refilled
    }
$after_loop    // O = acc / l, staged in this warp's rows of the Q tile, then written 16 bytes at a time.
#pragma unroll
    for (int g_ = 0; g_ < GROUPS; ++g_)
#pragma unroll
    for (int r_ = 0; r_ < 2; ++r_) {
        float l_row_ = l_[g_][r_];
        l_row_ += sa_shfl_xor(l_row_, 1);
        l_row_ += sa_shfl_xor(l_row_, 2);
        const float inv_ = l_row_ == 0.0f ? 0.0f : 1.0f / l_row_;  // a fully masked row gives zeros, NaN stays
        uint32_t* staged_ = (uint32_t*)(q_tile_ + ((wrow_ + g_ * 16 + group_ + 8 * r_) * STRIDE + pair_) * 2);
#pragma unroll
        for (int n_ = 0; n_ < HEAD_DIM / 8; ++n_)
            staged_[n_ * 4] = TYPE::pack(o_[g_][n_][2 * r_] * inv_, o_[g_][n_][2 * r_ + 1] * inv_);
        const int i_ = row0_ + g_ * 16 + 8 * r_;
        if ((lane_ & 3) == 0 && i_ < n_q_)  // lse = max * scale_ * ln 2 + log(l)
            lse_[i_] = l_row_ == 0.0f ? -INFINITY : m_[g_][r_] * scale_ * 0.6931471805599453f + logf(l_row_);
    }
    __syncthreads();  // the staged O tile is complete
    constexpr int CHUNKS = HEAD_DIM / 8;
#pragma unroll
    for (int c_ = threadIdx.x; c_ < ROWS * CHUNKS; c_ += SA_TC_THREADS) {
        const int r_ = c_ / CHUNKS, col_ = (c_ % CHUNKS) * 8;
        if (q0_ + r_ < n_q_ && col_ < d_v_)
            *(sa_tc_chunk*)(out_ + ((long long)(q0_ + r_) * d_v_ + col_) * 2) =
                *(const sa_tc_chunk*)(q_tile_ + (r_ * STRIDE + col_) * 2);
    }
}""")

_SCORES = Template("""\
#pragma unroll
        for (int n_ = 0; n_ < KEYS / 8; ++n_)
#pragma unroll
            for (int e_ = 0; e_ < 4; ++e_) {
                const int i_ = row0_ + g_ * 16 + (e_ >> 1) * 8;
                const int j_ = t_ * KEYS + n_ * 8 + pair_ + (e_ & 1);
                const float s_ = s_acc_[g_][n_][e_];
                (void)i_, (void)j_;  // unused when x is s_
                const float x_ = $x;
                s_acc_[g_][n_][e_] = x_;
                tile_max_[e_ >> 1] = fmaxf(tile_max_[e_ >> 1], x_);
            }""")

_HOST = Template("""\
extern "C" $signature {
$checks
    const int n_q_ = $n_q, n_k_ = $n_k, d_qk_ = $d_qk, d_v_ = $d_v, heads_ = $heads;
    const int head_dim_ = d_qk_ > d_v_ ? d_qk_ : d_v_;
    if (d_qk_ % 8 != 0 || d_v_ % 8 != 0 || head_dim_ > $largest) return SYMATTN_UNSUPPORTED;
    if (((size_t)Q | (size_t)K | (size_t)V | (size_t)O) % 16 != 0) return SYMATTN_UNSUPPORTED;
    if (heads_ > SA_GRID_YZ_MAX || $batch > SA_GRID_YZ_MAX) return SYMATTN_GRID_TOO_LARGE;
    (void)SA_LAST_ERROR();  // clear an error left by earlier work: a failure below is this call's
    const cudaStream_t stream_ = (cudaStream_t)stream;
    const dim3 block_(SA_TC_THREADS);
$scale_check$dispatch
    (void)stream_;  // unused when the CPU emulation builds this file
    return SYMATTN_OK;
}""")


_FIRST = """\
    sa_tc_load_tile<HEAD_DIM, ROWS>(q_tile_, q_, q0_, n_q_, d_qk_);
    sa_tc_load_tile<HEAD_DIM, KEYS>(kv_, k_, 0, n_k_, d_qk_);
    sa_tc_load_tile<HEAD_DIM, KEYS>(kv_ + 2 * TILE, v_, 0, n_k_, d_v_);
    sa_cp_async_commit();
"""
_LOOP_HEAD = """\
    for (int t_ = 0; t_ < tiles_; ++t_) {
        if (t_ + 1 < tiles_) {  // the next tile's copy overlaps this tile's math
            const int next_ = (t_ + 1) & 1;
            sa_tc_load_tile<HEAD_DIM, KEYS>(kv_ + next_ * TILE, k_, (t_ + 1) * KEYS, n_k_, d_qk_);
            sa_tc_load_tile<HEAD_DIM, KEYS>(kv_ + (2 + next_) * TILE, v_, (t_ + 1) * KEYS, n_k_, d_v_);
            sa_cp_async_commit();
            sa_cp_async_wait<1>();
        } else {
            sa_cp_async_wait<0>();
        }
        __syncthreads();  // tile t (and, the first time, Q) is in shared memory for every warp
"""

# With a mask, a tile every warp finds fully masked is neither loaded nor computed: at tile t the warps
# test tile t + 1 (`LIVE_TEST`), publish the answers in `live_flags_` and, after a barrier, copy
# tile t + 1 only when one of them needs it; a skipped tile also skips its barriers.
_MASKED_FIRST = Template("""\
    __shared__ int live_flags_[2][SA_TC_THREADS / SA_WARP_SIZE];  // per tile parity: does warp w need it?
    sa_tc_load_tile<HEAD_DIM, ROWS>(q_tile_, q_, q0_, n_q_, d_qk_);
    sa_cp_async_commit();
    bool warp_live_, block_live_, q_ready_ = false;  // q_ready_: Q's fragments are in registers
$first_test
    if (block_live_) {
        sa_tc_load_tile<HEAD_DIM, KEYS>(kv_, k_, 0, n_k_, d_qk_);
        sa_tc_load_tile<HEAD_DIM, KEYS>(kv_ + 2 * TILE, v_, 0, n_k_, d_v_);
        sa_cp_async_commit();
    }
""")
_MASKED_LOOP_HEAD = Template("""\
    for (int t_ = 0; t_ < tiles_; ++t_) {
        const bool this_live_ = block_live_, this_warp_live_ = warp_live_;
        block_live_ = false;
        if (t_ + 1 < tiles_) {
$next_test
        }
        if (block_live_) {  // the next tile's copy overlaps this tile's math
            const int next_ = (t_ + 1) & 1;
            sa_tc_load_tile<HEAD_DIM, KEYS>(kv_ + next_ * TILE, k_, (t_ + 1) * KEYS, n_k_, d_qk_);
            sa_tc_load_tile<HEAD_DIM, KEYS>(kv_ + (2 + next_) * TILE, v_, (t_ + 1) * KEYS, n_k_, d_v_);
            sa_cp_async_commit();
            sa_cp_async_wait<1>();
        } else {
            sa_cp_async_wait<0>();
        }
        if (!this_live_) continue;  // block-uniform: no warp needs tile t
        __syncthreads();  // tile t (and, the first time, Q) is in shared memory for every warp
""")
_MASKED_AFTER_LOOP = """\
    __syncthreads();  // Q's copies are complete before O is staged over them (when no tile was computed)
"""

# Whether any of a warp's `entries` (row, key) pairs, entry e_ at ($coords), escapes the mask, warp-uniform,
# into `warp_live_`; lane 0 publishes it in `live_flags_[parity]`, and after a barrier `block_live_` is their
# OR. The forward tests 16 x GROUPS rows x KEYS keys from `key0`; the backward a key block's
# 16 keys a warp against SA_TC_ROWS queries (`tensor_core_backward`).
LIVE_TEST = Template("""\
        {
            bool live_ = false;
#pragma unroll 4
            for (int e_ = lane_; e_ < $entries; e_ += SA_WARP_SIZE) {
                const int $coords;
                live_ = live_ || (i_ < n_q_ && j_ < n_k_ && !${prefix}_masked(${lead_args}i_, j_$dim_args));
            }
            float any_ = live_ ? 1.0f : 0.0f;
#pragma unroll
            for (int m_ = 16; m_ > 0; m_ >>= 1) any_ = fmaxf(any_, sa_shfl_xor(any_, m_));
            warp_live_ = any_ != 0.0f;
            if (lane_ == 0) live_flags_[$parity][warp_] = warp_live_ ? 1 : 0;
            __syncthreads();
            block_live_ = false;
#pragma unroll
            for (int w_ = 0; w_ < SA_TC_THREADS / SA_WARP_SIZE; ++w_)
                block_live_ = block_live_ || live_flags_[$parity][w_];
        }""")


@dataclass
class TensorCoreForward:
    """The tensor-core forward of one core: kernels, and the host function per dtype."""

    core: AttentionCore
    prefix: str            # the core's prefix: `<prefix>_score`, `<prefix>_forward_bf16`, ...
    text: str              # the device template and its `extern "C"` instantiations
    sizes: Sizes
    dims: list[str]        # C names of the spec's dims (arguments of the host function)
    batch: str
    lead: list[str]        # C names of the head coordinates the score function takes
    lead_coords: str       # C statements setting them from `head_` (the flat head index)
    mask: str | None       # the device function `<prefix>_masked`, when the score has a mask
    scale: str | None = None  # C expression of c when the score is c * (Q K^T) + b (`linear_score`)
    softmax: SoftmaxParts | None = None  # the softmax's x and scale_ (the backward recomputes P with them)

    def kernel(self, dtype: str, head_dim: int) -> str:
        return f"{self.prefix}_tc_fwd_{dtype}_d{head_dim}"

    def kernel_names(self) -> list[str]:
        return [self.kernel(dtype, d) for dtype in TC_DTYPES for d in TC_HEAD_DIMS]

    def signature(self, dtype: str) -> str:
        dims = ", ".join(f"int {d}" for d in (*self.dims, self.batch))
        return (f"int {self.prefix}_forward_{dtype}(const void* Q, const void* K, const void* V, void* O, "
                f"float* lse, {dims}, cudaStream_t stream)")

    def host(self, dtype: str, checks: Sequence[str]) -> str:
        dispatch = []
        args = ("(unsigned char*)O, lse, (const unsigned char*)Q, (const unsigned char*)K, "
                "(const unsigned char*)V, n_q_, n_k_, d_qk_, d_v_, heads_" + "".join(f", {d}" for d in self.dims))
        for k, head_dim in enumerate(TC_HEAD_DIMS):
            name = self.kernel(dtype, head_dim)
            rows, keys = FORWARD_SHAPES[head_dim].rows, FORWARD_SHAPES[head_dim].keys
            test = "else " if k else ""
            test += f"if (head_dim_ <= {head_dim}) " if k < len(TC_HEAD_DIMS) - 1 else ""
            dispatch += [f"    {test}{{",
                         f"        const int smem_ = sa_tc_shared_bytes({head_dim}, {rows}, {keys});",
                         f"        if (smem_ > 48 * 1024 && SA_TC_ALLOW_SHARED({name}, smem_) != 0)",
                         "            return SA_LAST_ERROR();",
                         f"        const dim3 grid_((n_q_ + {rows - 1}) / {rows}, heads_, {self.batch});",
                         f"        SA_TC_LAUNCH({name}, grid_, block_, smem_, stream_, {args});",
                         "        SA_CHECK_LAUNCH();",
                         "    }"]
        return _HOST.substitute(signature=self.signature(dtype), checks="\n".join(checks), n_q=self.sizes.n_q,
                                n_k=self.sizes.n_k, d_qk=self.sizes.d_qk, d_v=self.sizes.d_v,
                                heads=self.sizes.heads, largest=TC_HEAD_DIMS[-1], batch=self.batch,
                                dispatch="\n".join(dispatch), scale_check=scale_check(self.scale))


def forward(core: AttentionCore, prefix: str, names: CNames, dims: Sequence[str], lead: list[str],
                        batch: str, formula: str) -> TensorCoreForward:
    """The tensor-core forward of `core`, whose score device function is `<prefix>_score`."""
    dim_params = "".join(f", int {d}" for d in dims)
    lead_coords = head_coordinates(core, lead, names)
    mask = masked_condition(core, prefix, names, dims, lead)
    forward = TensorCoreForward(core, prefix, "", Sizes(core, names), list(dims), batch, list(lead), lead_coords,
                                mask)
    args_ = dict(prefix=prefix, lead_args="".join(f"{z}, " for z in lead), dim_args="".join(f", {d}" for d in dims))
    softmax = softmax_parts(core, prefix, names, args_["lead_args"], args_["dim_args"], lead)
    forward.scale, forward.softmax = softmax.scale, softmax
    if mask:  # tiles every warp finds masked are not loaded; a warp skips the rest of its masked tiles
        test = lambda key0, parity: LIVE_TEST.substitute(  # noqa: E731
            args_, entries="16 * GROUPS * KEYS", coords=f"i_ = q0_ + wrow_ + e_ / KEYS, j_ = ({key0}) + e_ % KEYS",
            parity=parity)
        parts = dict(first=_MASKED_FIRST.substitute(first_test=test("0", "0")),
                     loop_head=_MASKED_LOOP_HEAD.substitute(next_test=test("(t_ + 1) * KEYS", "(t_ + 1) & 1")),
                     skip="        if (this_warp_live_)  // warp-uniform: the whole warp computes the tile or skips it",
                     after_loop=_MASKED_AFTER_LOOP, first_tile="!q_ready_ && (q_ready_ = true)")
    else:
        parts = dict(first=_FIRST, loop_head=_LOOP_HEAD, skip="", after_loop="", first_tile="t_ == 0")
    body = _FORWARD.substitute(args_, formula=formula, dim_params=dim_params, lead_coords=lead_coords, **parts,
                               scale_setup=softmax.setup, element_comment=softmax.comment,
                               scores=_SCORES.substitute(x=softmax.element),
                               ragged_scores=_SCORES.substitute(x=f"j_ < n_k_ ? {softmax.element} : -INFINITY"))
    if mask:
        body = mask + "\n\n" + body
    params = ("unsigned char* __restrict__ out_, float* __restrict__ lse_, const unsigned char* __restrict__ q_, "
              "const unsigned char* __restrict__ k_,\n        const unsigned char* __restrict__ v_, "
              f"int n_q_, int n_k_, int d_qk_, int d_v_, int heads_{dim_params}")
    args = "out_, lse_, q_, k_, v_, n_q_, n_k_, d_qk_, d_v_, heads_" + "".join(f", {d}" for d in dims)
    wrappers = [f"// {core.output} on tensor cores, for each input type and head dim"]
    for dtype in TC_DTYPES:
        for head_dim in TC_HEAD_DIMS:
            shape = FORWARD_SHAPES[head_dim]
            template = f"{head_dim}, sa_tc_{dtype}, {shape.groups}, {shape.keys}, {str(shape.q_in_registers).lower()}"
            wrappers.append(f'extern "C" __global__ void __launch_bounds__(SA_TC_THREADS) '
                            f"{forward.kernel(dtype, head_dim)}(\n        {params}) {{\n"
                            f"    {prefix}_tc_forward<{template}>({args});\n}}")
    forward.text = body + "\n\n" + "\n".join(wrappers)
    return forward
