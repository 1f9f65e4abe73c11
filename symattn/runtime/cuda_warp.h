// cuda_warp.h: the warp-collective and tensor-core pieces of CUDA that
// FlashAttention-2-class kernels use, for nvcc (the real instructions) and for
// the CPU emulation of cuda_host.h (include this after cuda_host.h).
//
// API (the same on both sides):
//   sa_bf16, sa_f16                      16-bit floats (nvcc: __nv_bfloat16, __half;
//                                        CPU: a struct holding the uint16_t bits)
//   sa_to_bf16(float), sa_to_f16(float)  round to nearest even (cvt.rn): overflow
//                                        to +-inf, subnormals kept, NaN -> 0x7FFF
//                                        (the canonical NaN of the CUDA headers' host paths)
//   sa_from_bf16(sa_bf16), sa_from_f16(sa_f16) -> float (exact)
//   sa_bf16_as_bits(sa_bf16), sa_f16_as_bits(sa_f16) -> uint16_t and
//   sa_bf16_from_bits(uint16_t), sa_f16_from_bits(uint16_t): the raw bits
//                                        (use these, not the struct's member)
//   sa_pack_bf16x2(lo, hi), sa_pack_f16x2(lo, hi) -> uint32_t, lo in bits 0..15
//                                        (cvt.rn.bf16x2.f32 / __floats2bfloat162_rn)
//   sa_mma_m16n8k16_bf16(d, a, b, c), sa_mma_m16n8k16_f16(d, a, b, c):
//       mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32,
//       float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4];
//       d may be c (accumulate in place)
//   sa_ldmatrix_x1/x2/x4(uint32_t* r, const void* smem_row),
//   sa_ldmatrix_x1_trans/x2_trans/x4_trans(...): ldmatrix.sync.aligned.m8n8.x{1,2,4}{,.trans}.shared.b16
//   sa_shfl_xor(v, lane_mask) for float, int, uint32_t: __shfl_xor_sync(0xffffffff, v, mask)
//   sa_syncwarp(): __syncwarp(0xffffffff) (the CPU side also defines __syncwarp(), full mask only)
//   sa_cp_async_16(smem, gmem), sa_cp_async_16_zfill(smem, gmem, src_bytes),
//   sa_cp_async_commit(), sa_cp_async_wait<N>(), sa_cp_async_wait_all()
//   SA_WARP_SIZE (32), sa_lane_id()
//   sa_ex2_approx(x): ex2.approx.ftz.f32 (CPU: exp2f, subnormal results flushed to 0)
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group); in every
// 32-bit register the element with the lower column (or k) index is in bits 0..15:
//   A (16x16, row-major, 4 regs): a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..2t+1],
//                                 a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B (16x8, k x n, 2 regs):      b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..2t+9][g]
//   C, D (16x8 f32, 4 floats):    c[0], c[1] = C[g][2t], C[g][2t+1];
//                                 c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
//   ldmatrix: lanes 0-7 give the row addresses of matrix 0 (16 bytes each, 16-byte
//   aligned), lanes 8-15 of matrix 1, 16-23 of matrix 2, 24-31 of matrix 3 (x1
//   reads lanes 0-7, x2 lanes 0-15). r[i] holds matrix i: lane l gets
//   M[l/4][2(l%4)], M[l/4][2(l%4)+1]; with .trans it gets M[2(l%4)][l/4], M[2(l%4)+1][l/4].
//   So an A tile stored row-major loads with x4 (lanes 0-15 -> rows 0-15 at
//   column 0, lanes 16-31 -> rows 0-15 at column 8); a B operand stored [n][k]
//   (K in attention) with the non-transposed forms; one stored [k][n] (V) with .trans.
//   The D fragments d0, d1 of two adjacent 16x8 tiles (columns 0-7, 8-15) are
//   the A fragment of their 16x16 product once packed pairwise, as FlashAttention
//   reuses P: a = {pack(d0[0], d0[1]), pack(d0[2], d0[3]), pack(d1[0], d1[1]), pack(d1[2], d1[3])}.
//
// cp.async: the 16 bytes land in shared memory at some point before the
// matching sa_cp_async_wait<N>() of the issuing thread returns; other threads
// see them only after a __syncthreads() that follows the wait.
//
// The CPU emulation (when not __CUDACC__):
//   - a warp is 32 consecutive linear thread ids of the block (as on the GPU);
//     every collective must be called by all 32 lanes (the .sync.aligned rule;
//     a lane that skips it deadlocks the emulation, as it hangs or is undefined
//     on the GPU). Blocks whose size is not a multiple of 32, lanes calling
//     different collectives at the same step, or misaligned addresses abort with
//     a message on stderr.
//   - each collective: every lane writes its operands to its slot in the warp's
//     exchange area (cuda_host.h WarpState), crosses the warp barrier, and reads
//     what it needs from the other lanes' slots. The two halves of the exchange
//     area alternate, so one barrier per collective suffices. Under
//     ThreadSanitizer the lanes ignore that barrier's synchronization and use
//     relaxed atomics on the exchange area: a collective orders no other memory
//     access between lanes, as on the GPU (shfl, mma and ldmatrix are no memory
//     barriers). Shared memory written by one lane and read by another (e.g. by
//     ldmatrix) needs sa_syncwarp() / __syncwarp() or __syncthreads() in between,
//     and TSan reports a data race when it is missing.
//   - mma: each lane computes its own four D elements from the exchanged A and
//     B fragments, in fp32: acc = c[i]; then acc += A[row][k] * B[k][col] for
//     k = 0, 1, ..., 15 in that order, each sum rounded to nearest even. A
//     product of two bf16 (or two f16) values is exact in fp32 (barring fp32
//     overflow/underflow of bf16 products), so the only roundings are those 16
//     additions. Hardware adds the products in its own order and internal
//     precision, so results may differ from the GPU's in the last bits (of the
//     order of K ulps of the largest partial sum); bf16/f16 conversions, by
//     contrast, are bit-exact.
//   - ldmatrix reads the other lanes' rows directly from (emulated) shared memory;
//     only the addresses of the lanes it uses must be 16-byte aligned (x1: 0-7, x2: 0-15).
//   - cp.async is deferred: at issue the destination is overwritten with 0xFF
//     bytes (a NaN in bf16, f16 and f32), at sa_cp_async_wait<N>() the queued
//     copies of the completed groups are done (the source is read then). So a
//     kernel that reads the destination before its wait reads NaN and fails
//     verification, and one that issues a copy into a buffer other threads are
//     still reading without a __syncthreads() in between is a data race for
//     ThreadSanitizer. Copies not waited for when the block ends are dropped.
//   Not emulated: warp divergence and partial masks (the functions take no mask:
//   all 32 lanes, always), the memory-space checks (ldmatrix/cp.async accept any
//   address on the CPU), bank conflicts, timing, and other mma shapes/types.
#pragma once

#include <cstdint>

#define SA_WARP_SIZE 32

#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __nv_bfloat16 sa_bf16;
typedef __half sa_f16;

__host__ __device__ __forceinline__ sa_bf16 sa_to_bf16(float x) { return __float2bfloat16_rn(x); }
__host__ __device__ __forceinline__ sa_f16 sa_to_f16(float x) { return __float2half_rn(x); }
__host__ __device__ __forceinline__ float sa_from_bf16(sa_bf16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ float sa_from_f16(sa_f16 x) { return __half2float(x); }

__host__ __device__ __forceinline__ uint16_t sa_bf16_as_bits(sa_bf16 x) { return __bfloat16_as_ushort(x); }
__host__ __device__ __forceinline__ uint16_t sa_f16_as_bits(sa_f16 x) { return __half_as_ushort(x); }
__host__ __device__ __forceinline__ sa_bf16 sa_bf16_from_bits(uint16_t u) { return __ushort_as_bfloat16(u); }
__host__ __device__ __forceinline__ sa_f16 sa_f16_from_bits(uint16_t u) { return __ushort_as_half(u); }

__host__ __device__ __forceinline__ uint32_t sa_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
__host__ __device__ __forceinline__ uint32_t sa_pack_f16x2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// 2^x by the SFU (ex2.approx.ftz.f32: about 2 ulp; -inf -> +0, NaN -> NaN, subnormal results flushed to 0).
__device__ __forceinline__ float sa_ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned int sa_lane_id() {
    unsigned int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

__device__ __forceinline__ void sa_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                     const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void sa_mma_m16n8k16_f16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                    const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ uint32_t sa_smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void sa_ldmatrix_x1(uint32_t* r, const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(sa_smem_addr(smem_row)));
}
__device__ __forceinline__ void sa_ldmatrix_x2(uint32_t* r, const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(sa_smem_addr(smem_row)));
}
__device__ __forceinline__ void sa_ldmatrix_x4(uint32_t* r, const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa_smem_addr(smem_row)));
}
__device__ __forceinline__ void sa_ldmatrix_x1_trans(uint32_t* r, const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(sa_smem_addr(smem_row)));
}
__device__ __forceinline__ void sa_ldmatrix_x2_trans(uint32_t* r, const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(sa_smem_addr(smem_row)));
}
__device__ __forceinline__ void sa_ldmatrix_x4_trans(uint32_t* r, const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa_smem_addr(smem_row)));
}

__device__ __forceinline__ float sa_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
__device__ __forceinline__ int sa_shfl_xor(int v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
__device__ __forceinline__ uint32_t sa_shfl_xor(uint32_t v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

__device__ __forceinline__ void sa_syncwarp() { __syncwarp(0xffffffffu); }

__device__ __forceinline__ void sa_cp_async_16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa_smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void sa_cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa_smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void sa_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void sa_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void sa_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

#else  // the CPU emulation

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct sa_bf16 {
    uint16_t bits;
};
struct sa_f16 {
    uint16_t bits;
};

namespace sa_warp {

inline uint32_t float_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float bits_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

// cvt.rn.bf16.f32: round to nearest even on the float32 bits; NaN -> canonical 0x7FFF.
inline uint16_t bf16_bits(float x) {
    const uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// cvt.rn.f16.f32: round to nearest even, overflow to inf, f16 subnormals kept, NaN -> 0x7FFF.
inline uint16_t f16_bits(float x) {
    const uint32_t u = float_bits(x);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7fffu;
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520 (or inf): +-inf
    if (ax >= 0x38800000u) {                                    // >= 2^-14: a normal f16
        uint32_t r = (ax >> 13) - (112u << 10);
        const uint32_t rest = ax & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;
        return (uint16_t)(sign | r);
    }
    if (ax <= 0x33000000u) return (uint16_t)sign;  // <= 2^-25: rounds to zero
    const uint32_t e = ax >> 23;                   // 102..112
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value = mant * 2^(e-150) = k * 2^-24
    uint32_t k = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (k & 1u))) ++k;
    return (uint16_t)(sign | k);
}

inline float from_bf16_bits(uint16_t h) { return bits_float((uint32_t)h << 16); }

inline float from_f16_bits(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
    const float magnitude = (float)mant * 0x1p-24f;  // exact
    return sign ? -magnitude : magnitude;
}

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "cuda_warp.h emulation: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

enum Kind : uint32_t {
    kShfl = 1, kMmaBf16, kMmaF16, kLdX1, kLdX2, kLdX4, kLdX1T, kLdX2T, kLdX4T, kSyncWarp
};

inline thread_local unsigned int collectives_done = 0;  // per lane: which half of the exchange area is next

// Under ThreadSanitizer the barrier of a collective must not order the lanes'
// other memory accesses (the GPU does not): the lanes ignore its
// synchronization, and the exchange area is read and written with relaxed
// atomics, which TSan does not report. sa_syncwarp() keeps the ordering.
#if defined(__SANITIZE_THREAD__)
#define SA_WARP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SA_WARP_TSAN 1
#endif
#endif
#ifdef SA_WARP_TSAN
extern "C" void AnnotateIgnoreSyncBegin(const char* file, int line);
extern "C" void AnnotateIgnoreSyncEnd(const char* file, int line);
#endif

// The words the 32 lanes published at one step (word 0: the kind).
struct Gathered {
    uint32_t word[32][8];
};

inline sa_host::WarpState& my_warp() {
    const unsigned int threads = sa_host::block_dim.x * sa_host::block_dim.y * sa_host::block_dim.z;
    if (threads % 32 != 0 || sa_host::warp_states == nullptr)
        fail("warp-collective function in a block whose size is not a multiple of 32");
    return (*sa_host::warp_states)[sa_host::linear_tid / 32];
}

// One step of a warp collective: publish this lane's `words` (at most 7), cross
// the warp barrier, and return what all 32 lanes published at this step.
inline Gathered exchange(Kind kind, const uint32_t* words, int count) {
    sa_host::WarpState& warp = my_warp();
    uint32_t(*slots)[16] = warp.slot[collectives_done++ & 1u];
    uint32_t* mine = slots[sa_host::linear_tid % 32];
    std::atomic_ref<uint32_t>(mine[0]).store(kind, std::memory_order_relaxed);
    for (int i = 0; i < count; ++i) std::atomic_ref<uint32_t>(mine[1 + i]).store(words[i], std::memory_order_relaxed);
#ifdef SA_WARP_TSAN
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
#endif
    warp.barrier.arrive_and_wait();
#ifdef SA_WARP_TSAN
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
#endif
    Gathered all;
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i <= count; ++i)
            all.word[l][i] = std::atomic_ref<uint32_t>(slots[l][i]).load(std::memory_order_relaxed);
    for (int l = 0; l < 32; ++l)
        if (all.word[l][0] != kind) fail("lanes of one warp called different warp-collective functions at the same step");
    return all;
}

// __syncwarp(): a barrier of the warp that orders memory (and still checks that
// every lane is at a sa_syncwarp at this step).
inline void syncwarp() {
    exchange(kSyncWarp, nullptr, 0);
    my_warp().barrier.arrive_and_wait();
}

inline unsigned int lane() { return sa_host::linear_tid % 32; }

template <float (*Decode)(uint16_t)>
inline void mma_m16n8k16(Kind kind, float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    const uint32_t words[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const Gathered all = exchange(kind, words, 6);
    const uint32_t(*slots)[8] = all.word;
    auto half = [](uint32_t word, int k) { return (uint16_t)(k & 1 ? word >> 16 : word & 0xffffu); };
    // A[row][k] lives in lane 4*(row%8) + (k%8)/2, register (row>=8) + 2*(k>=8), half k%2.
    auto A = [&](int row, int k) {
        return Decode(half(slots[4 * (row % 8) + (k % 8) / 2][1 + (row >= 8) + 2 * (k >= 8)], k));
    };
    // B[k][col] lives in lane 4*col + (k%8)/2, register k>=8, half k%2.
    auto B = [&](int k, int col) { return Decode(half(slots[4 * col + (k % 8) / 2][5 + (k >= 8)], k)); };
    const int g = (int)lane() >> 2, t = (int)lane() % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
        out[i] = acc;
    }
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

template <int Matrices, bool Trans>
inline void ldmatrix(Kind kind, uint32_t* r, const void* smem_row) {
    const uintptr_t p = (uintptr_t)smem_row;
    const uint32_t words[2] = {(uint32_t)(p & 0xffffffffu), (uint32_t)((uint64_t)p >> 32)};
    const Gathered all = exchange(kind, words, 2);
    const uint32_t(*slots)[8] = all.word;
    if (lane() < 8u * Matrices && p % 16 != 0) fail("ldmatrix: a row address is not 16-byte aligned");
    auto row = [&](int m, int i) {  // row i of matrix m: the address lane 8m+i gave
        return (const uint16_t*)(uintptr_t)((uint64_t)slots[8 * m + i][1] | ((uint64_t)slots[8 * m + i][2] << 32));
    };
    const int l = (int)lane();
    for (int m = 0; m < Matrices; ++m) {
        uint16_t lo, hi;
        if (Trans) {
            lo = row(m, 2 * (l % 4))[l / 4];
            hi = row(m, 2 * (l % 4) + 1)[l / 4];
        } else {
            lo = row(m, l / 4)[2 * (l % 4)];
            hi = row(m, l / 4)[2 * (l % 4) + 1];
        }
        r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
}

inline uint32_t shfl_xor_bits(uint32_t v, int lane_mask) {
    if (lane_mask < 0 || lane_mask > 31) fail("shfl_xor: lane_mask outside 0..31");
    return exchange(kShfl, &v, 1).word[lane() ^ (unsigned int)lane_mask][1];
}

// cp.async: per thread, the copies issued and not yet waited for.
struct PendingCopy {
    void* dst;
    const void* src;
    int src_bytes;
    long long group;  // -1 until committed
};
struct CopyQueue {
    std::vector<PendingCopy> copies;
    long long committed = 0;  // groups committed so far in this block
    uint3 block{0xffffffffu, 0xffffffffu, 0xffffffffu};
};
inline thread_local CopyQueue copy_queue;

// The queue of this thread in the current block (a new block drops what the last left).
inline CopyQueue& queue() {
    CopyQueue& q = copy_queue;
    const uint3 b = sa_host::block_idx;
    if (q.block.x != b.x || q.block.y != b.y || q.block.z != b.z) {
        q.copies.clear();
        q.committed = 0;
        q.block = b;
    }
    return q;
}

inline void cp_async(void* smem, const void* gmem, int src_bytes) {
    if (src_bytes < 0 || src_bytes > 16) fail("cp.async: src_bytes outside 0..16");
    if ((uintptr_t)smem % 16 != 0 || (uintptr_t)gmem % 16 != 0)
        fail("cp.async (16 bytes): an address is not 16-byte aligned");
    static const unsigned char poison[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                             0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    std::memcpy(smem, poison, 16);  // the destination holds no data until the wait
    queue().copies.push_back(PendingCopy{smem, gmem, src_bytes, -1});
}

inline void cp_async_commit() {
    CopyQueue& q = queue();
    for (PendingCopy& c : q.copies)
        if (c.group < 0) c.group = q.committed;
    ++q.committed;
}

// Complete every committed group but the newest `pending` ones, in issue order.
inline void cp_async_wait(long long pending) {
    CopyQueue& q = queue();
    std::vector<PendingCopy> left;
    for (const PendingCopy& c : q.copies) {
        if (c.group >= 0 && c.group < q.committed - pending) {
            unsigned char bytes[16] = {0};
            if (c.src_bytes > 0) std::memcpy(bytes, c.src, (size_t)c.src_bytes);
            std::memcpy(c.dst, bytes, 16);
        } else {
            left.push_back(c);
        }
    }
    q.copies.swap(left);
}

}  // namespace sa_warp

inline sa_bf16 sa_to_bf16(float x) { return sa_bf16{sa_warp::bf16_bits(x)}; }
inline sa_f16 sa_to_f16(float x) { return sa_f16{sa_warp::f16_bits(x)}; }
inline float sa_from_bf16(sa_bf16 x) { return sa_warp::from_bf16_bits(x.bits); }
inline float sa_from_f16(sa_f16 x) { return sa_warp::from_f16_bits(x.bits); }
inline uint16_t sa_bf16_as_bits(sa_bf16 x) { return x.bits; }
inline uint16_t sa_f16_as_bits(sa_f16 x) { return x.bits; }
inline sa_bf16 sa_bf16_from_bits(uint16_t u) { return sa_bf16{u}; }
inline sa_f16 sa_f16_from_bits(uint16_t u) { return sa_f16{u}; }
inline uint32_t sa_pack_bf16x2(float lo, float hi) {
    return (uint32_t)sa_warp::bf16_bits(lo) | ((uint32_t)sa_warp::bf16_bits(hi) << 16);
}
inline uint32_t sa_pack_f16x2(float lo, float hi) {
    return (uint32_t)sa_warp::f16_bits(lo) | ((uint32_t)sa_warp::f16_bits(hi) << 16);
}

// ex2.approx.ftz.f32 on the CPU: exp2f, with the flush of subnormal results to zero (the
// approximation's last bits are not emulated: its error, about 2 ulp, is far below bf16 and f16).
inline float sa_ex2_approx(float x) {
    const float y = exp2f(x);
    return y < 1.17549435e-38f ? 0.0f : y;  // NaN stays NaN (the comparison is false)
}

inline unsigned int sa_lane_id() { return sa_warp::lane(); }

inline void sa_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    sa_warp::mma_m16n8k16<sa_warp::from_bf16_bits>(sa_warp::kMmaBf16, d, a, b, c);
}
inline void sa_mma_m16n8k16_f16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    sa_warp::mma_m16n8k16<sa_warp::from_f16_bits>(sa_warp::kMmaF16, d, a, b, c);
}

inline void sa_ldmatrix_x1(uint32_t* r, const void* smem_row) { sa_warp::ldmatrix<1, false>(sa_warp::kLdX1, r, smem_row); }
inline void sa_ldmatrix_x2(uint32_t* r, const void* smem_row) { sa_warp::ldmatrix<2, false>(sa_warp::kLdX2, r, smem_row); }
inline void sa_ldmatrix_x4(uint32_t* r, const void* smem_row) { sa_warp::ldmatrix<4, false>(sa_warp::kLdX4, r, smem_row); }
inline void sa_ldmatrix_x1_trans(uint32_t* r, const void* smem_row) {
    sa_warp::ldmatrix<1, true>(sa_warp::kLdX1T, r, smem_row);
}
inline void sa_ldmatrix_x2_trans(uint32_t* r, const void* smem_row) {
    sa_warp::ldmatrix<2, true>(sa_warp::kLdX2T, r, smem_row);
}
inline void sa_ldmatrix_x4_trans(uint32_t* r, const void* smem_row) {
    sa_warp::ldmatrix<4, true>(sa_warp::kLdX4T, r, smem_row);
}

inline float sa_shfl_xor(float v, int lane_mask) {
    return sa_warp::bits_float(sa_warp::shfl_xor_bits(sa_warp::float_bits(v), lane_mask));
}
inline int sa_shfl_xor(int v, int lane_mask) { return (int)sa_warp::shfl_xor_bits((uint32_t)v, lane_mask); }
inline uint32_t sa_shfl_xor(uint32_t v, int lane_mask) { return sa_warp::shfl_xor_bits(v, lane_mask); }

inline void sa_syncwarp() { sa_warp::syncwarp(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    if (mask != 0xffffffffu) sa_warp::fail("__syncwarp: only the full mask 0xffffffff is emulated");
    sa_warp::syncwarp();
}

inline void sa_cp_async_16(void* smem, const void* gmem) { sa_warp::cp_async(smem, gmem, 16); }
inline void sa_cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    sa_warp::cp_async(smem, gmem, src_bytes);
}
inline void sa_cp_async_commit() { sa_warp::cp_async_commit(); }
template <int N>
inline void sa_cp_async_wait() {
    static_assert(N >= 0, "cp.async.wait_group N needs N >= 0");
    sa_warp::cp_async_wait(N);
}
inline void sa_cp_async_wait_all() {
    sa_warp::cp_async_commit();
    sa_warp::cp_async_wait(0);
}

#endif  // __CUDACC__
