"""The fused attention backward on tensor cores (bf16 / f16 inputs, fp32 accumulation and gradients).

Contract: `backward(forward)` takes the core's `TensorCoreForward` and returns
a `TensorCoreBackward`: the CUDA text of two kernels (instantiated for both
`TC_DTYPES`, the second also for every `BACKWARD_HEAD_DIMS`) and, per dtype,
the host function `<prefix>_backward_<dtype>(Q, K, V, O, dO, lse, dQ, dK, dV,
delta, dims..., batch, stream)`. Q, K, V, O, dO are in the input type (O and
lse as the forward wrote them); dQ, dK, dV are written in fp32; `delta` is
fp32 scratch of [batch, heads..., n_q]. FlashAttention-2's scheme, one pass:

- the host zeroes dQ (`cudaMemsetAsync` on the stream, checked), then
  delta[i] = rowsum(dO * O)[i] (one thread per row);
- `bwd`: a block of 4 warps owns 64 keys (16 per warp), K and V resident in
  shared memory, and streams 64-query tiles of Q and dO (cp.async, double
  buffered), COLS queries at a time (`backward_cols`: 64, or 32 above head
  dim 64 so that S^T and dP^T fit beside the dK and dV accumulators). Per
  part, S^T = K Q^T and dP^T = V dO^T by mma.sync, P recomputed in base 2 as
  the forward's softmax (`score_forms.softmax_parts`: for a score c (Q K^T) + b,
  P = exp2((s + b / c) c log2 e - lse log2 e), one FFMA and one `ex2.approx`,
  and score' = c; otherwise x = score(s) log2 e and the score's derivative
  function, as the fp32 path's), lse and delta loaded once per query column,
  dS = P (dP - delta) score', dV += P^T dO and dK += dS^T Q with P^T and dS^T rounded
  to the input type in registers as the A operand (Q and dO via ldmatrix
  .trans). dS^T also goes, rounded, to shared memory (one buffer per part);
  after a barrier the 4 warps split the part's COLS x head-dim block of
  dQ += dS K (rows, then columns; both operands by ldmatrix .trans, the
  contraction over the block's 64 keys) and add it into dQ with fp32
  `atomicAdd` (RED on the GPU; every key block adds to the same rows).

So S and dP are computed once per (query tile, key tile): 5 products, as
FlashAttention-2, instead of the 7 of a separate dQ pass that recomputes them
(the dQ kernel this replaced). The cost is the atomics (COLS x head dim fp32
reductions per part and block) and dQ's memset.

Masked tiles: with a mask (`tensor_core.masked_condition`), each warp tests
the next query tile over its 16 keys while this tile's copy is in flight
and publishes the answer in shared memory (one barrier a tile); a query tile
no warp of the block needs is neither loaded nor computed, and its barriers
are skipped (the mirror of the forward's skipped key tiles: under a causal
mask a key block does about half the tiles of an unmasked one). A warp whose
16 keys see none of a needed tile skips its products and stores zeros for
its rows of dS^T. The loop still visits every query tile (the test, not a
bound computed from the mask). Head dims up to 128 (`SYMATTN_UNSUPPORTED`
above: at 256 the dK and dV accumulators alone would need 256 registers per
thread), and the forward's test of a folded scale c (`scale_check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Sequence

from .score_forms import scale_check
from .tensor_core import LIVE_TEST, PAD, ROWS, TC_DTYPES, TensorCoreForward

__all__ = ["BACKWARD_HEAD_DIMS", "BACKWARD_PRELUDE", "TensorCoreBackward", "backward", "backward_cols",
           "backward_shared_bytes"]

BACKWARD_HEAD_DIMS = (32, 64, 96, 128)

BACKWARD_PRELUDE = """\
// Tensor-core backward: queries per part of a query tile (S^T and dP^T of a part beside dK and dV), and the
// shared memory: six 64-row tiles (K and V resident, Q and dO double buffered), then dS^T per part.
static __host__ __device__ constexpr int sa_tc_backward_cols(int head_dim) { return head_dim > 64 ? 32 : 64; }
static __host__ __device__ constexpr int sa_tc_backward_shared_bytes(int head_dim) {
    return 6 * SA_TC_ROWS * (head_dim + SA_TC_PAD) * 2 +
           (SA_TC_ROWS / sa_tc_backward_cols(head_dim)) * SA_TC_ROWS * (sa_tc_backward_cols(head_dim) + SA_TC_PAD) * 2;
}
#ifdef __CUDACC__
#define SA_TC_ZERO(pointer, bytes, stream) ((int)cudaMemsetAsync((pointer), 0, (bytes), (stream)))
#else
#define SA_TC_ZERO(pointer, bytes, stream) (std::memset((pointer), 0, (bytes)), 0)
#endif

// acc += A B^T for one warp: A is rows [a_row0, a_row0 + 16) of shared tile `a`, B the first COLS rows
// from `b` (both [rows][HEAD_DIM], HEAD_DIM the contraction); acc is COLS / 8 C fragments of 16 x 8.
template <int HEAD_DIM, typename TYPE, int COLS>
static __device__ __forceinline__ void sa_tc_rows_by_rows(float (&acc)[COLS / 8][4], const unsigned char* a,
                                                          int a_row0, const unsigned char* b, int lane) {
    constexpr int STRIDE = HEAD_DIM + SA_TC_PAD;
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int b_row = (lane & 7) + (lane >> 4) * 8, b_col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int s = 0; s < HEAD_DIM / 16; ++s) {
        uint32_t fa[4];
        sa_ldmatrix_x4(fa, a + ((a_row0 + a_row) * STRIDE + s * 16 + a_col) * 2);
#pragma unroll
        for (int n = 0; n < COLS / 8; n += 2) {
            uint32_t fb[4];
            sa_ldmatrix_x4(fb, b + ((n * 8 + b_row) * STRIDE + s * 16 + b_col) * 2);
            TYPE::mma(acc[n], fa, fb, acc[n]);
            TYPE::mma(acc[n + 1], fa, fb + 2, acc[n + 1]);
        }
    }
}

// out += P B for one warp: P is 16 x COLS held as COLS / 8 C fragments (rounded to the input type
// here: the C layout of two 8-column tiles is the A layout of one 16-deep step), B the COLS rows from
// `b` ([rows = the contraction][HEAD_DIM]), read with ldmatrix .trans.
template <int HEAD_DIM, typename TYPE, int COLS>
static __device__ __forceinline__ void sa_tc_frags_by_tile(float (&out)[HEAD_DIM / 8][4], const float (&p)[COLS / 8][4],
                                                           const unsigned char* b, int lane) {
    constexpr int STRIDE = HEAD_DIM + SA_TC_PAD;
    const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8, b_col = (lane >> 4) * 8;
#pragma unroll
    for (int k = 0; k < COLS / 16; ++k) {
        uint32_t fa[4];
        fa[0] = TYPE::pack(p[2 * k][0], p[2 * k][1]);
        fa[1] = TYPE::pack(p[2 * k][2], p[2 * k][3]);
        fa[2] = TYPE::pack(p[2 * k + 1][0], p[2 * k + 1][1]);
        fa[3] = TYPE::pack(p[2 * k + 1][2], p[2 * k + 1][3]);
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; n += 2) {
            uint32_t fb[4];
            sa_ldmatrix_x4_trans(fb, b + ((k * 16 + b_row) * STRIDE + n * 8 + b_col) * 2);
            TYPE::mma(out[n], fa, fb, out[n]);
            TYPE::mma(out[n + 1], fa, fb + 2, out[n + 1]);
        }
    }
}

// out += A B for one warp, A's 16 rows read transposed: A = T^T, T the rows [0, DEPTH) x columns
// [a_col0, a_col0 + 16) of shared `t` ([DEPTH][T_STRIDE]), B the columns [b_col0, b_col0 + COLS) of the DEPTH
// rows of shared `b` ([DEPTH][HEAD_DIM + SA_TC_PAD]); both through ldmatrix .trans. out is COLS / 8 C fragments.
template <int HEAD_DIM, typename TYPE, int T_STRIDE, int COLS, int DEPTH = SA_TC_ROWS>
static __device__ __forceinline__ void sa_tc_trans_by_tile(float (&out)[COLS / 8][4], const unsigned char* t,
                                                           int a_col0, const unsigned char* b, int b_col0, int lane) {
    constexpr int STRIDE = HEAD_DIM + SA_TC_PAD;
    const int a_row = (lane & 7) + (lane >> 4) * 8, a_col = ((lane >> 3) & 1) * 8;
    const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8, b_col = (lane >> 4) * 8;
#pragma unroll
    for (int k = 0; k < DEPTH / 16; ++k) {
        uint32_t fa[4];
        sa_ldmatrix_x4_trans(fa, t + ((k * 16 + a_row) * T_STRIDE + a_col0 + a_col) * 2);
#pragma unroll
        for (int n = 0; n < COLS / 8; n += 2) {
            uint32_t fb[4];
            sa_ldmatrix_x4_trans(fb, b + ((k * 16 + b_row) * STRIDE + b_col0 + n * 8 + b_col) * 2);
            TYPE::mma(out[n], fa, fb, out[n]);
            TYPE::mma(out[n + 1], fa, fb + 2, out[n + 1]);
        }
    }
}
"""

_KERNELS = Template("""\
// delta[i] = rowsum(dO * O)[i] for the tensor-core backward of $output: one thread per query row.
template <typename TYPE>
static __device__ __forceinline__ void ${prefix}_tc_delta(
        float* __restrict__ delta_, const unsigned char* __restrict__ o_, const unsigned char* __restrict__ do_,
        int n_q_, int d_v_, int heads_) {
    const long long plane_ = (long long)blockIdx.z * heads_ + blockIdx.y;
    const typename TYPE::value* o_rows_ = (const typename TYPE::value*)o_ + plane_ * n_q_ * d_v_;
    const typename TYPE::value* do_rows_ = (const typename TYPE::value*)do_ + plane_ * n_q_ * d_v_;
    const int i_ = blockIdx.x * SA_TC_THREADS + threadIdx.x;
    if (i_ < n_q_) {
        float total_ = 0.0f;
        for (int c_ = 0; c_ < d_v_; ++c_) {
            const long long at_ = (long long)i_ * d_v_ + c_;
            total_ += TYPE::to_float(o_rows_[at_]) * TYPE::to_float(do_rows_[at_]);
        }
        delta_[plane_ * n_q_ + i_] = total_;
    }
}

// P and dS of entry (i, j) from s = (Q K^T)[i, j] and dp = (dO V^T)[i, j], in base 2 as the forward: P =
// exp2(x scale_ - lse log2 e) with the forward's x ($element_comment) and lse2 = lse log2 e; 0 outside the
// matrix and on fully masked rows (lse = -inf), and dS = P (dP - delta) score' = 0 where P = 0 (as the fp32 path).
#define ${PREFIX}_TC_RECOMPUTE(s_, dp_, i_, j_, lse2_, delta_i_, p_, ds_) \\
    float p_ = 0.0f, ds_ = 0.0f; \\
    if ((i_) < n_q_ && (j_) < n_k_ && (lse2_) != -INFINITY) { \\
        p_ = sa_ex2_approx(fmaf($element, scale_, -(lse2_))); \\
        if (p_ != 0.0f) ds_ = p_ * ((dp_) - (delta_i_)) * $score_grad; \\
    }

// dK, dV and dQ on tensor cores in one pass: 4 warps x 16 keys, tiles of 64 queries of Q and dO
// (cp.async, double buffered), taken COLS queries at a time (32 above head dim 64: S^T and dP^T beside dK
// and dV). Each part's dS^T goes through shared memory; after a barrier the 4 warps split the part's
// COLS x HEAD_DIM of dQ += dS K and add it into dQ (zeroed by the host function) with fp32 atomics.
// Query tiles whose entries are all masked for every warp are neither loaded nor computed.
template <int HEAD_DIM, typename TYPE>
static __device__ __forceinline__ void ${prefix}_tc_backward(
        float* __restrict__ dq_, float* __restrict__ dk_, float* __restrict__ dv_,
        const unsigned char* __restrict__ q_, const unsigned char* __restrict__ k_,
        const unsigned char* __restrict__ v_, const unsigned char* __restrict__ do_,
        const float* __restrict__ lse_, const float* __restrict__ delta_,
        int n_q_, int n_k_, int d_qk_, int d_v_, int heads_$dim_params) {
    constexpr int STRIDE = HEAD_DIM + SA_TC_PAD;
    constexpr int TILE = SA_TC_ROWS * STRIDE * 2;
    constexpr int COLS = sa_tc_backward_cols(HEAD_DIM);
    constexpr int DS_STRIDE = COLS + SA_TC_PAD;              // dS^T in shared memory: [64 keys][COLS queries]
    constexpr int DS_TILE = SA_TC_ROWS * DS_STRIDE * 2;
    constexpr int DQ_ROW_GROUPS = COLS / 16;                 // dQ of a part: warps split its rows, then columns
    constexpr int DQ_COLS = HEAD_DIM / (4 / DQ_ROW_GROUPS);
    SA_TC_DYNAMIC_SHARED(shared_, sa_tc_backward_shared_bytes(HEAD_DIM));
    unsigned char* k_tile_ = shared_;
    unsigned char* v_tile_ = shared_ + TILE;
    unsigned char* ds_tiles_ = shared_ + 6 * TILE;            // one per part of a query tile
    const int head_ = blockIdx.y;
    const long long b_ = blockIdx.z;  // the batch entry
$lead_coords
    const long long plane_ = b_ * heads_ + head_;
    q_ += plane_ * n_q_ * d_qk_ * 2;
    k_ += plane_ * n_k_ * d_qk_ * 2;
    v_ += plane_ * n_k_ * d_v_ * 2;
    do_ += plane_ * n_q_ * d_v_ * 2;
    dq_ += plane_ * n_q_ * d_qk_;
    dk_ += plane_ * n_k_ * d_qk_;
    dv_ += plane_ * n_k_ * d_v_;
    lse_ += plane_ * n_q_;
    delta_ += plane_ * n_q_;
    const int lane_ = sa_lane_id(), warp_ = threadIdx.x / SA_WARP_SIZE;
    const int key0_ = blockIdx.x * SA_TC_ROWS + warp_ * 16 + (lane_ >> 2), pair_ = (lane_ & 3) * 2;
    const int dq_row_ = (warp_ % DQ_ROW_GROUPS) * 16, dq_col_ = (warp_ / DQ_ROW_GROUPS) * DQ_COLS;
    const int tiles_ = (n_q_ + SA_TC_ROWS - 1) / SA_TC_ROWS;
    constexpr float LOG2E = 1.4426950408889634f;
$scale_setup
    sa_tc_load_tile<HEAD_DIM>(k_tile_, k_, blockIdx.x * SA_TC_ROWS, n_k_, d_qk_);
    sa_tc_load_tile<HEAD_DIM>(v_tile_, v_, blockIdx.x * SA_TC_ROWS, n_k_, d_v_);
    sa_cp_async_commit();
$first_test
    if (block_live_) {
        sa_tc_load_tile<HEAD_DIM>(shared_ + 2 * TILE, q_, 0, n_q_, d_qk_);
        sa_tc_load_tile<HEAD_DIM>(shared_ + 4 * TILE, do_, 0, n_q_, d_v_);
        sa_cp_async_commit();
    }
    float dk_acc_[HEAD_DIM / 8][4] = {}, dv_acc_[HEAD_DIM / 8][4] = {};
    for (int t_ = 0; t_ < tiles_; ++t_) {
        const bool this_live_ = block_live_, this_warp_live_ = warp_live_;
        block_live_ = t_ + 1 < tiles_;
$next_test
        if (block_live_) {  // the next query tile's copy overlaps this tile's math
            const int next_ = (t_ + 1) & 1;
            sa_tc_load_tile<HEAD_DIM>(shared_ + (2 + next_) * TILE, q_, (t_ + 1) * SA_TC_ROWS, n_q_, d_qk_);
            sa_tc_load_tile<HEAD_DIM>(shared_ + (4 + next_) * TILE, do_, (t_ + 1) * SA_TC_ROWS, n_q_, d_v_);
            sa_cp_async_commit();
            sa_cp_async_wait<1>();
        } else {
            sa_cp_async_wait<0>();
        }
        if (!this_live_) continue;  // block-uniform: no warp needs query tile t
        __syncthreads();  // query tile t (and, the first time, K and V) is in shared memory
        for (int part_ = 0; part_ < SA_TC_ROWS / COLS; ++part_) {
            const unsigned char* q_part_ = shared_ + (2 + (t_ & 1)) * TILE + part_ * COLS * STRIDE * 2;
            const unsigned char* do_part_ = shared_ + (4 + (t_ & 1)) * TILE + part_ * COLS * STRIDE * 2;
            unsigned char* ds_tile_ = ds_tiles_ + part_ * DS_TILE;
            uint32_t* ds_rows_ = (uint32_t*)(ds_tile_ + ((warp_ * 16 + (lane_ >> 2)) * DS_STRIDE + pair_) * 2);
            if (this_warp_live_) {  // warp-uniform: the whole warp computes its 16 keys x COLS queries or skips them
                float s_[COLS / 8][4] = {}, dp_[COLS / 8][4] = {};  // S^T and dP^T: rows keys, columns queries
                sa_tc_rows_by_rows<HEAD_DIM, TYPE, COLS>(s_, k_tile_, warp_ * 16, q_part_, lane_);
                sa_tc_rows_by_rows<HEAD_DIM, TYPE, COLS>(dp_, v_tile_, warp_ * 16, do_part_, lane_);
#pragma unroll
                for (int n_ = 0; n_ < COLS / 8; ++n_) {
                    float lse2_[2], delta2_[2];  // of this lane's two query columns, loaded once for both key rows
#pragma unroll
                    for (int q_ = 0; q_ < 2; ++q_) {
                        const int i_ = t_ * SA_TC_ROWS + part_ * COLS + n_ * 8 + pair_ + q_;
                        lse2_[q_] = i_ < n_q_ ? lse_[i_] * LOG2E : -INFINITY;
                        delta2_[q_] = i_ < n_q_ ? delta_[i_] : 0.0f;
                    }
#pragma unroll
                    for (int e_ = 0; e_ < 4; ++e_) {
                        const int j_ = key0_ + (e_ >> 1) * 8;
                        const int i_ = t_ * SA_TC_ROWS + part_ * COLS + n_ * 8 + pair_ + (e_ & 1);
                        ${PREFIX}_TC_RECOMPUTE(s_[n_][e_], dp_[n_][e_], i_, j_, lse2_[e_ & 1], delta2_[e_ & 1], p_, ds_)
                        s_[n_][e_] = p_;
                        dp_[n_][e_] = ds_;
                    }
                }
#pragma unroll
                for (int n_ = 0; n_ < COLS / 8; ++n_) {  // dS^T rounded to the input type, as the A operand of dQ
                    ds_rows_[n_ * 4] = TYPE::pack(dp_[n_][0], dp_[n_][1]);
                    ds_rows_[n_ * 4 + 4 * DS_STRIDE] = TYPE::pack(dp_[n_][2], dp_[n_][3]);
                }
                sa_tc_frags_by_tile<HEAD_DIM, TYPE, COLS>(dv_acc_, s_, do_part_, lane_);  // dV += P^T dO
                sa_tc_frags_by_tile<HEAD_DIM, TYPE, COLS>(dk_acc_, dp_, q_part_, lane_);  // dK += dS^T Q
            } else {
#pragma unroll
                for (int n_ = 0; n_ < COLS / 8; ++n_) ds_rows_[n_ * 4] = ds_rows_[n_ * 4 + 4 * DS_STRIDE] = 0u;
            }
            __syncthreads();  // every warp's dS^T of this part is in shared memory
            float dq_acc_[DQ_COLS / 8][4] = {};
            sa_tc_trans_by_tile<HEAD_DIM, TYPE, DS_STRIDE, DQ_COLS>(dq_acc_, ds_tile_, dq_row_, k_tile_, dq_col_,
                                                                   lane_);  // dQ = dS K over this block's keys
#pragma unroll
            for (int n_ = 0; n_ < DQ_COLS / 8; ++n_)
#pragma unroll
                for (int e_ = 0; e_ < 4; ++e_) {
                    const int i_ = t_ * SA_TC_ROWS + part_ * COLS + dq_row_ + (lane_ >> 2) + (e_ >> 1) * 8;
                    const int c_ = dq_col_ + n_ * 8 + pair_ + (e_ & 1);
                    if (i_ < n_q_ && c_ < d_qk_) atomicAdd(dq_ + (long long)i_ * d_qk_ + c_, dq_acc_[n_][e_]);
                }
        }
        // No barrier here: every read of tile t's Q and dO precedes the dS^T barrier of its part, so the copy
        // into its buffers at the next tile is ordered after them; the dQ product's reads of dS^T precede the
        // next computed tile's first barrier, before any dS^T store.
    }
#pragma unroll
    for (int n_ = 0; n_ < HEAD_DIM / 8; ++n_)
#pragma unroll
        for (int e_ = 0; e_ < 4; ++e_) {
            const int j_ = key0_ + (e_ >> 1) * 8, c_ = n_ * 8 + pair_ + (e_ & 1);
            if (j_ < n_k_ && c_ < d_qk_) dk_[(long long)j_ * d_qk_ + c_] = dk_acc_[n_][e_];
            if (j_ < n_k_ && c_ < d_v_) dv_[(long long)j_ * d_v_ + c_] = dv_acc_[n_][e_];
        }
}""")

# With a mask: whether any (key, query) of this warp's 16 keys x the 64 queries from `query0` escapes it,
# warp-uniform, into `warp_live_`; lane 0 publishes it in `live_flags_[parity]` and after a barrier
# `block_live_` is their OR (the mirror of the forward's test over its rows x a key tile).
_MASKED_FIRST = """\
    __shared__ int live_flags_[2][SA_TC_THREADS / SA_WARP_SIZE];  // per tile parity: does warp w need it?
    bool warp_live_, block_live_;
"""


def _live(args, query0, parity):
    """`LIVE_TEST` for a warp's 16 keys of this key block against SA_TC_ROWS queries from `query0`."""
    return LIVE_TEST.substitute(args, entries="16 * SA_TC_ROWS", parity=parity, coords=(
        f"j_ = blockIdx.x * SA_TC_ROWS + warp_ * 16 + e_ / SA_TC_ROWS, i_ = ({query0}) + e_ % SA_TC_ROWS"))


_HOST = Template("""\
extern "C" $signature {
$checks
    const int n_q_ = $n_q, n_k_ = $n_k, d_qk_ = $d_qk, d_v_ = $d_v, heads_ = $heads;
    const int head_dim_ = d_qk_ > d_v_ ? d_qk_ : d_v_;
    if (d_qk_ % 8 != 0 || d_v_ % 8 != 0 || head_dim_ > $largest) return SYMATTN_UNSUPPORTED;
    if (((size_t)Q | (size_t)K | (size_t)V | (size_t)O | (size_t)dO) % 16 != 0) return SYMATTN_UNSUPPORTED;
$scale_check    if (heads_ > SA_GRID_YZ_MAX || $batch > SA_GRID_YZ_MAX) return SYMATTN_GRID_TOO_LARGE;
    (void)SA_LAST_ERROR();  // clear an error left by earlier work: a failure below is this call's
    const cudaStream_t stream_ = (cudaStream_t)stream;
    const dim3 block_(SA_TC_THREADS);
    SA_TC_LAUNCH(${prefix}_tc_delta_$dtype, dim3((n_q_ + SA_TC_THREADS - 1) / SA_TC_THREADS, heads_, $batch), block_, 0,
                 stream_, delta, (const unsigned char*)O, (const unsigned char*)dO, n_q_, d_v_, heads_);
    SA_CHECK_LAUNCH();
    {  // dQ is a sum of the key blocks' atomic adds: zero it first
        const int status_ = SA_TC_ZERO(dQ, sizeof(float) * (size_t)$batch * heads_ * n_q_ * d_qk_, stream_);
        if (status_ != 0) return status_;
    }
    const dim3 grid_k_((n_k_ + SA_TC_ROWS - 1) / SA_TC_ROWS, heads_, $batch);
$dispatch
    (void)stream_;  // unused when the CPU emulation builds this file
    return SYMATTN_OK;
}""")


@dataclass
class TensorCoreBackward:
    forward: TensorCoreForward
    text: str

    @property
    def prefix(self) -> str:
        return self.forward.prefix

    def kernel(self, which: str, dtype: str, head_dim: int | None = None) -> str:
        return f"{self.prefix}_tc_{which}_{dtype}" + (f"_d{head_dim}" if head_dim else "")

    def kernel_names(self) -> list[str]:
        return [self.kernel("delta", dtype) for dtype in TC_DTYPES] + [
            self.kernel("bwd", dtype, d) for dtype in TC_DTYPES for d in BACKWARD_HEAD_DIMS]

    def signature(self, dtype: str) -> str:
        f = self.forward
        dims = ", ".join(f"int {d}" for d in (*f.dims, f.batch))
        return (f"int {self.prefix}_backward_{dtype}(const void* Q, const void* K, const void* V, const void* O, "
                f"const void* dO, const float* lse, float* dQ, float* dK, float* dV, float* delta, {dims}, "
                "cudaStream_t stream)")

    def host(self, dtype: str, checks: Sequence[str]) -> str:
        f = self.forward
        dims = "".join(f", {d}" for d in f.dims)
        reads = ("(const unsigned char*)Q, (const unsigned char*)K, (const unsigned char*)V, "
                 "(const unsigned char*)dO, lse, delta, n_q_, n_k_, d_qk_, d_v_, heads_" + dims)
        dispatch = []
        for k, head_dim in enumerate(BACKWARD_HEAD_DIMS):
            last = k == len(BACKWARD_HEAD_DIMS) - 1
            test = ("else " if k else "") + ("" if last else f"if (head_dim_ <= {head_dim}) ")
            name = self.kernel("bwd", dtype, head_dim)
            dispatch += [f"    {test}{{",
                         f"        const int smem_ = sa_tc_backward_shared_bytes({head_dim});",
                         f"        if (smem_ > 48 * 1024 && SA_TC_ALLOW_SHARED({name}, smem_) != 0)",
                         "            return SA_LAST_ERROR();",
                         f"        SA_TC_LAUNCH({name}, grid_k_, block_, smem_, stream_, dQ, dK, dV, {reads});",
                         "        SA_CHECK_LAUNCH();",
                         "    }"]
        s = f.sizes
        return _HOST.substitute(signature=self.signature(dtype), checks="\n".join(checks), n_q=s.n_q, n_k=s.n_k,
                                d_qk=s.d_qk, d_v=s.d_v, heads=s.heads, largest=BACKWARD_HEAD_DIMS[-1],
                                batch=f.batch, prefix=self.prefix, dtype=dtype, dispatch="\n".join(dispatch),
                                scale_check=scale_check(f.scale))


def backward_cols(head_dim: int) -> int:
    """Queries per part of a query tile in the backward (sa_tc_backward_cols)."""
    return 32 if head_dim > 64 else 64


def backward_shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of the backward kernel (sa_tc_backward_shared_bytes): six tiles, then dS^T per part."""
    cols = backward_cols(head_dim)
    return 6 * ROWS * (head_dim + PAD) * 2 + (ROWS // cols) * ROWS * (cols + PAD) * 2


def backward(forward: TensorCoreForward) -> TensorCoreBackward:
    """The tensor-core backward of `forward`'s core (same score device functions, same head coordinates)."""
    dims = forward.dims
    dim_params = "".join(f", int {d}" for d in dims)
    args = dict(prefix=forward.prefix, lead_args="".join(f"{z}, " for z in forward.lead),
                dim_args="".join(f", {d}" for d in dims))
    if forward.mask is None:
        tests = dict(first_test="    bool warp_live_ = true, block_live_ = true;", next_test="")
    else:
        tests = dict(first_test=_MASKED_FIRST + _live(args, "0", "0"),
                     next_test="        if (block_live_)\n" + _live(args, "(t_ + 1) * SA_TC_ROWS", "(t_ + 1) & 1"))
    softmax = forward.softmax
    grad = "c_" if softmax.scale else f"{forward.prefix}_score_grad(s_, {args['lead_args']}i_, j_{args['dim_args']})"
    body = _KERNELS.substitute(args, PREFIX=forward.prefix.upper(), output=forward.core.output,
                               dim_params=dim_params, lead_coords=forward.lead_coords, **tests,
                               scale_setup=softmax.setup, element=softmax.element, score_grad=grad,
                               element_comment=softmax.comment)
    result = TensorCoreBackward(forward, "")
    reads = ("const unsigned char* __restrict__ q_, const unsigned char* __restrict__ k_, "
             "const unsigned char* __restrict__ v_,\n        const unsigned char* __restrict__ do_, "
             "const float* __restrict__ lse_, const float* __restrict__ delta_, "
             f"int n_q_, int n_k_, int d_qk_, int d_v_, int heads_{dim_params}")
    read_args = "q_, k_, v_, do_, lse_, delta_, n_q_, n_k_, d_qk_, d_v_, heads_" + "".join(f", {d}" for d in dims)
    wrappers = [f"// The backward of {forward.core.output} on tensor cores, for each input type and head dim"]
    for dtype in TC_DTYPES:
        wrappers.append('extern "C" __global__ void __launch_bounds__(SA_TC_THREADS) '
                        f'{result.kernel("delta", dtype)}(\n'
                        "        float* __restrict__ delta_, const unsigned char* __restrict__ o_, "
                        "const unsigned char* __restrict__ do_, int n_q_, int d_v_, int heads_) {\n"
                        f"    {forward.prefix}_tc_delta<sa_tc_{dtype}>(delta_, o_, do_, n_q_, d_v_, heads_);\n}}")
        for head_dim in BACKWARD_HEAD_DIMS:
            wrappers.append(f'extern "C" __global__ void __launch_bounds__(SA_TC_THREADS, 1) '
                            f"{result.kernel('bwd', dtype, head_dim)}(\n"
                            "        float* __restrict__ dq_, float* __restrict__ dk_, float* __restrict__ dv_, "
                            f"{reads}) {{\n"
                            f"    {forward.prefix}_tc_backward<{head_dim}, sa_tc_{dtype}>"
                            f"(dq_, dk_, dv_, {read_args});\n}}")
    result.text = body + "\n\n" + "\n".join(wrappers)
    return result
