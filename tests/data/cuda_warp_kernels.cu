// Test kernels for symattn/runtime/cuda_warp.h (tests/test_cuda_warp.py).
// The same source builds with g++ (the CPU emulation; extern "C" entry points
// for ctypes, and with -DSA_WARP_TEST_MAIN a main() for ThreadSanitizer runs
// and for the misuse checks) and with nvcc -cubin (the kernels only).
#include "cuda_host.h"
#include "cuda_warp.h"

// Which 16-bit float the uint16_t bits hold.
struct Bf16 {
    static __device__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
        sa_mma_m16n8k16_bf16(d, a, b, c);
    }
};
struct F16 {
    static __device__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
        sa_mma_m16n8k16_f16(d, a, b, c);
    }
};

// D = A @ B + C for one 16x8 tile, one warp. a_mode: 0 A by ldmatrix.x4, 1 by
// four x1, 2 by two x2; b_layout: 0 B stored [n][k] (ldmatrix.x2), 1 stored
// [k][n] (ldmatrix.x2.trans). bug 1: the x4 for A addresses matrices 1 and 2
// swapped (the planted fragment-layout bug).
template <typename T>
__global__ void mma_16x8(const uint16_t* A, const uint16_t* B, const float* C, float* D, int a_mode, int b_layout,
                         int bug) {
    alignas(16) __shared__ uint16_t As[16 * 16];
    alignas(16) __shared__ uint16_t Bs[16 * 8];
    const int l = (int)sa_lane_id();
    for (int i = l; i < 16 * 16; i += 32) As[i] = A[i];
    for (int i = l; i < 16 * 8; i += 32) Bs[i] = B[i];
    __syncthreads();
    uint32_t a[4], b[2];
    if (a_mode == 0) {
        int row = l % 16, col = (l / 16) * 8;
        if (bug == 1) row = l % 8 + ((l / 16) & 1) * 8, col = ((l / 8) & 1) * 8;
        sa_ldmatrix_x4(a, &As[row * 16 + col]);
    } else if (a_mode == 1) {
        for (int m = 0; m < 4; ++m) sa_ldmatrix_x1(&a[m], &As[((m & 1) * 8 + l % 8) * 16 + (m >> 1) * 8]);
    } else {
        sa_ldmatrix_x2(&a[0], &As[(l % 16) * 16]);
        sa_ldmatrix_x2(&a[2], &As[(l % 16) * 16 + 8]);
    }
    if (b_layout == 0)
        sa_ldmatrix_x2(b, &Bs[(l % 8) * 16 + ((l / 8) & 1) * 8]);
    else
        sa_ldmatrix_x2_trans(b, &Bs[(l % 16) * 8]);
    const int g = l >> 2, t = l % 4;
    float c[4], d[4];
    for (int i = 0; i < 4; ++i) c[i] = C[(g + (i >= 2) * 8) * 8 + 2 * t + (i & 1)];
    T::mma(d, a, b, c);
    for (int i = 0; i < 4; ++i) D[(g + (i >= 2) * 8) * 8 + 2 * t + (i & 1)] = d[i];
}

// C[M][N] = A[M][K] @ B, M, N, K multiples of 64; 64x64 tiles per block of 4
// warps (16 rows each), k-tiles of 64 double-buffered with cp.async. b_layout:
// 0 B stored [N][K] (as K in attention, ldmatrix.x4), 1 stored [K][N] (as V,
// ldmatrix.x4.trans). bug: 1 swapped A ldmatrix operands, 2 no cp.async wait
// before the tile is used, 3 B stored [K][N] read with the non-transposed form.
template <typename T>
__global__ void __launch_bounds__(128) gemm_64(const uint16_t* A, const uint16_t* B, float* C, int M, int N, int K,
                                               int b_layout, int bug) {
    alignas(16) __shared__ uint16_t As[2][64 * 64];
    alignas(16) __shared__ uint16_t Bs[2][64 * 64];
    const int tid = (int)threadIdx.x, w = tid / 32, l = (int)sa_lane_id();
    (void)M;  // the grid covers the rows
    const int m0 = (int)blockIdx.y * 64, n0 = (int)blockIdx.x * 64;
    auto issue = [&](int kt, int buf) {  // 2 x 512 chunks of 16 bytes, 4 + 4 per thread
        for (int c = tid; c < 512; c += 128) {
            const int r = c / 8, col = (c % 8) * 8;
            sa_cp_async_16(&As[buf][r * 64 + col], &A[(size_t)(m0 + r) * K + kt * 64 + col]);
            const uint16_t* src = b_layout == 0 ? &B[(size_t)(n0 + r) * K + kt * 64 + col]
                                                : &B[(size_t)(kt * 64 + r) * N + n0 + col];
            sa_cp_async_16(&Bs[buf][r * 64 + col], src);
        }
    };
    float acc[8][4] = {};
    const int tiles = K / 64;
    issue(0, 0);
    sa_cp_async_commit();
    for (int kt = 0; kt < tiles; ++kt) {
        if (kt + 1 < tiles) issue(kt + 1, (kt + 1) % 2);
        sa_cp_async_commit();  // possibly empty: keeps wait<1> meaning "tile kt has landed"
        if (bug != 2) sa_cp_async_wait<1>();
        __syncthreads();
        const uint16_t* as = As[kt % 2];
        const uint16_t* bs = Bs[kt % 2];
        for (int kk = 0; kk < 4; ++kk) {
            uint32_t a[4];
            int row = 16 * w + l % 16, col = kk * 16 + (l / 16) * 8;
            if (bug == 1) row = 16 * w + l % 8 + ((l / 16) & 1) * 8, col = kk * 16 + ((l / 8) & 1) * 8;
            sa_ldmatrix_x4(a, &as[row * 64 + col]);
            for (int p = 0; p < 4; ++p) {
                uint32_t b[4];
                if (b_layout == 0) {
                    sa_ldmatrix_x4(b, &bs[(16 * p + (l / 16) * 8 + l % 8) * 64 + kk * 16 + ((l / 8) & 1) * 8]);
                } else {
                    const uint16_t* at = &bs[(kk * 16 + ((l / 8) & 1) * 8 + l % 8) * 64 + 16 * p + (l / 16) * 8];
                    if (bug == 3)
                        sa_ldmatrix_x4(b, at);
                    else
                        sa_ldmatrix_x4_trans(b, at);
                }
                T::mma(acc[2 * p], a, &b[0], acc[2 * p]);
                T::mma(acc[2 * p + 1], a, &b[2], acc[2 * p + 1]);
            }
        }
        __syncthreads();  // the buffer is refilled by the next iteration's issue
    }
    sa_cp_async_wait<0>();
    const int g = l >> 2, t = l % 4;
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 4; ++i)
            C[(size_t)(m0 + 16 * w + g + (i >= 2) * 8) * N + n0 + 8 * j + 2 * t + (i & 1)] = acc[j][i];
}

// FlashAttention's row statistics of a 16x8 f32 tile held in the mma C layout:
// the max and sum of each row over its quad (shfl_xor 1, 2); plus warp-wide
// butterflies on int (sum) and uint32 (xor). out per lane: 4 floats, then int, uint.
__global__ void quad_rows(const float* S, const int* ints, float* row_stats, int* sums, uint32_t* xors) {
    const int l = (int)sa_lane_id(), g = l >> 2, t = l % 4;
    const float* top = &S[g * 8 + 2 * t];
    const float* bottom = &S[(g + 8) * 8 + 2 * t];
    float mx0 = fmaxf(top[0], top[1]), mx1 = fmaxf(bottom[0], bottom[1]);
    float s0 = top[0] + top[1], s1 = bottom[0] + bottom[1];
    for (int mask = 1; mask <= 2; mask <<= 1) {
        mx0 = fmaxf(mx0, sa_shfl_xor(mx0, mask));
        mx1 = fmaxf(mx1, sa_shfl_xor(mx1, mask));
        s0 += sa_shfl_xor(s0, mask);
        s1 += sa_shfl_xor(s1, mask);
    }
    row_stats[4 * l + 0] = mx0;
    row_stats[4 * l + 1] = mx1;
    row_stats[4 * l + 2] = s0;
    row_stats[4 * l + 3] = s1;
    int s = ints[l];
    uint32_t x = (uint32_t)ints[l] * 2654435761u;
    for (int mask = 16; mask >= 1; mask >>= 1) {
        s += sa_shfl_xor(s, mask);
        x ^= sa_shfl_xor(x, mask);
    }
    sums[l] = s;
    xors[l] = x;
}

// cp.async groups, 32 threads, 4 floats (16 bytes) per thread per group:
// before: own group-0 chunk read before any wait; mid0, mid1: own chunks of
// groups 0 and 1 after wait<1>; after0, after1: the next lane's chunks after
// wait<0> and __syncthreads(); zfill: 16 bytes per thread, src_bytes = tid % 17.
__global__ void cp_groups(const float* src, float* before, float* mid0, float* mid1, float* after0, float* after1,
                          unsigned char* zfill) {
    alignas(16) __shared__ float buf[2][32 * 4];
    alignas(16) __shared__ unsigned char zbuf[32 * 16];
    const int t = (int)threadIdx.x, next = (t + 1) % 32;
    sa_cp_async_16(&buf[0][4 * t], &src[4 * t]);
    sa_cp_async_commit();
    sa_cp_async_16(&buf[1][4 * t], &src[128 + 4 * t]);
    sa_cp_async_commit();
    for (int i = 0; i < 4; ++i) before[4 * t + i] = buf[0][4 * t + i];
    sa_cp_async_wait<1>();
    for (int i = 0; i < 4; ++i) mid0[4 * t + i] = buf[0][4 * t + i], mid1[4 * t + i] = buf[1][4 * t + i];
    sa_cp_async_16_zfill(&zbuf[16 * t], &src[256 + 4 * t], t % 17);
    sa_cp_async_wait_all();
    __syncthreads();
    for (int i = 0; i < 4; ++i) after0[4 * t + i] = buf[0][4 * next + i], after1[4 * t + i] = buf[1][4 * next + i];
    for (int i = 0; i < 16; ++i) zfill[16 * next + i] = zbuf[16 * next + i];
}

// Misuse the emulation must refuse: a block of 48 threads, and lanes calling
// different collectives at the same step.
__global__ void misuse(int what, float* out) {
    const int l = (int)sa_lane_id();
    float v = (float)l;
    if (what == 0 || l != 5) {
        v = sa_shfl_xor(v, 1);
    } else {
        alignas(16) __shared__ uint16_t rows[8 * 8];
        uint32_t r[1];
        sa_ldmatrix_x1(r, &rows[(l % 8) * 8]);
        v = (float)r[0];
    }
    out[threadIdx.x] = v;
}

#ifdef __CUDACC__
// nvcc -cubin builds only the kernels: instantiate the templates.
template __global__ void mma_16x8<Bf16>(const uint16_t*, const uint16_t*, const float*, float*, int, int, int);
template __global__ void mma_16x8<F16>(const uint16_t*, const uint16_t*, const float*, float*, int, int, int);
template __global__ void gemm_64<Bf16>(const uint16_t*, const uint16_t*, float*, int, int, int, int, int);
template __global__ void gemm_64<F16>(const uint16_t*, const uint16_t*, float*, int, int, int, int, int);
#else

extern "C" int run_mma_16x8(const uint16_t* A, const uint16_t* B, const float* C, float* D, int dtype, int a_mode,
                            int b_layout, int bug) {
    if (dtype == 0)
        SA_LAUNCH(mma_16x8<Bf16>, dim3(1), dim3(32), nullptr, A, B, C, D, a_mode, b_layout, bug);
    else
        SA_LAUNCH(mma_16x8<F16>, dim3(1), dim3(32), nullptr, A, B, C, D, a_mode, b_layout, bug);
    return 0;
}

extern "C" int run_gemm_64(const uint16_t* A, const uint16_t* B, float* C, int M, int N, int K, int dtype,
                           int b_layout, int bug) {
    if (M % 64 || N % 64 || K % 64) return 1;
    const dim3 grid((unsigned)(N / 64), (unsigned)(M / 64));
    if (dtype == 0)
        SA_LAUNCH(gemm_64<Bf16>, grid, dim3(128), nullptr, A, B, C, M, N, K, b_layout, bug);
    else
        SA_LAUNCH(gemm_64<F16>, grid, dim3(128), nullptr, A, B, C, M, N, K, b_layout, bug);
    return 0;
}

extern "C" int run_quad_rows(const float* S, const int* ints, float* row_stats, int* sums, uint32_t* xors) {
    SA_LAUNCH(quad_rows, dim3(1), dim3(32), nullptr, S, ints, row_stats, sums, xors);
    return 0;
}

extern "C" int run_cp_groups(const float* src, float* before, float* mid0, float* mid1, float* after0, float* after1,
                             unsigned char* zfill) {
    SA_LAUNCH(cp_groups, dim3(1), dim3(32), nullptr, src, before, mid0, mid1, after0, after1, zfill);
    return 0;
}

extern "C" void convert_bf16(const float* x, uint16_t* bits, long n) {
    for (long i = 0; i < n; ++i) bits[i] = sa_to_bf16(x[i]).bits;
}
extern "C" void convert_f16(const float* x, uint16_t* bits, long n) {
    for (long i = 0; i < n; ++i) bits[i] = sa_to_f16(x[i]).bits;
}
extern "C" void widen_bf16(const uint16_t* bits, float* x, long n) {
    for (long i = 0; i < n; ++i) x[i] = sa_from_bf16(sa_bf16{bits[i]});
}
extern "C" void widen_f16(const uint16_t* bits, float* x, long n) {
    for (long i = 0; i < n; ++i) x[i] = sa_from_f16(sa_f16{bits[i]});
}
extern "C" void pack_pairs(const float* lo, const float* hi, uint32_t* bf16, uint32_t* f16, long n) {
    for (long i = 0; i < n; ++i) bf16[i] = sa_pack_bf16x2(lo[i], hi[i]), f16[i] = sa_pack_f16x2(lo[i], hi[i]);
}

#ifdef SA_WARP_TEST_MAIN
#include <cstdio>
#include <cstring>
#include <vector>

// gemm M N K DTYPE B_LAYOUT IN OUT: A then B (uint16 bits) from IN, C (float) to OUT.
// misuse WHAT: WHAT 0 runs 48 threads, 1 a warp whose lane 5 calls ldmatrix.
// small: quad_rows and cp_groups on fixed inputs (for ThreadSanitizer), sums printed.
int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "small") == 0) {
        std::vector<float> S(128), src(384), stats(128), f(5 * 128);
        std::vector<int> ints(32), sums(32);
        std::vector<uint32_t> xors(32);
        std::vector<unsigned char> z(512);
        for (int i = 0; i < 128; ++i) S[i] = (float)((i * 37) % 29) - 14.0f;
        for (int i = 0; i < 384; ++i) src[i] = (float)i;
        for (int i = 0; i < 32; ++i) ints[i] = i * i - 100;
        run_quad_rows(S.data(), ints.data(), stats.data(), sums.data(), xors.data());
        run_cp_groups(src.data(), &f[0], &f[128], &f[256], &f[384], &f[512], z.data());
        std::printf("%g %d %g\n", stats[0], sums[0], f[384]);
        return 0;
    }
    if (argc == 3 && std::strcmp(argv[1], "misuse") == 0) {
        float out[64];
        const int what = std::atoi(argv[2]);
        SA_LAUNCH(misuse, dim3(1), dim3(what == 0 ? 48 : 32), nullptr, what, out);
        return 0;
    }
    if (argc != 9 || std::strcmp(argv[1], "gemm") != 0) return 2;
    const int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]);
    std::vector<uint16_t> A((size_t)M * K), B((size_t)K * N);
    std::vector<float> C((size_t)M * N);
    FILE* in = std::fopen(argv[7], "rb");
    if (!in || std::fread(A.data(), 2, A.size(), in) != A.size() || std::fread(B.data(), 2, B.size(), in) != B.size())
        return 3;
    std::fclose(in);
    if (run_gemm_64(A.data(), B.data(), C.data(), M, N, K, std::atoi(argv[5]), std::atoi(argv[6]), 0) != 0) return 4;
    FILE* out = std::fopen(argv[8], "wb");
    if (!out || std::fwrite(C.data(), 4, C.size(), out) != C.size()) return 5;
    std::fclose(out);
    return 0;
}
#endif  // SA_WARP_TEST_MAIN
#endif  // __CUDACC__
