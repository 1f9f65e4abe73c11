// philox.h: dropout's random bits, Philox-4x32-10, for nvcc (a GPU) and for the CPU
// emulation of cuda_host.h (include it after cuda_host.h), the same bits on both.
//
// The contract is symattn.ir.philox's, which the NumPy, torch and Triton targets follow too:
//   - Philox-4x32-10 exactly as Random123 defines it: 10 rounds, each
//     (hi0, lo0) = 0xD2511F53 * c0, (hi1, lo1) = 0xCD9E8D57 * c2 (32 x 32 -> 64 bits),
//     c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), the key bumped between rounds by the
//     Weyl constants (k0 += 0x9E3779B9, k1 += 0xBB67AE85; bumping after the tenth too
//     changes nothing);
//   - key = (seed & 0xFFFFFFFF, seed >> 32) for a 64-bit seed;
//   - counter = (index & 0xFFFFFFFF, index >> 32, stream, 0): `index` is the entry's flat
//     row-major position in the tensor's full shape, leading batch axes included (a
//     kernel computes it from (batch, i, j)), `stream` names the dropout definition
//     (0, 1, 2, ... in spec order);
//   - an entry is kept iff output word 0 >= threshold, the uint32 the host computes once
//     (symattn.ir.philox.dropout_threshold(p) = min(floor(p * 2**32), 2**32 - 1)):
//     kernels are handed the integer threshold, never p.
//
// API (__host__ __device__, the same on both sides):
//   sa_philox4x32 { uint32_t word[4]; }             four 32-bit words (a counter or an output)
//   sa_philox4x32_10(counter, key0, key1) -> sa_philox4x32
//   sa_dropout_keep(seed, stream, index, threshold) -> bool   (uint64_t, uint32_t, uint64_t, uint32_t)
// The high word of each product is __umulhi on the device, a 64-bit product on the host.
#pragma once

#include <stdint.h>

#if !defined(__CUDACC__) && !defined(__host__)  // compiled for the CPU without cuda_host.h
#define __host__
#define __device__
#endif

struct sa_philox4x32 {
    uint32_t word[4];
};

__host__ __device__ inline uint32_t sa_philox_mulhi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

__host__ __device__ inline sa_philox4x32 sa_philox4x32_10(sa_philox4x32 counter, uint32_t key0, uint32_t key1) {
    uint32_t c0 = counter.word[0], c1 = counter.word[1], c2 = counter.word[2], c3 = counter.word[3];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int round = 0; round < 10; ++round) {
        const uint32_t hi0 = sa_philox_mulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = sa_philox_mulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ key0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ key1;
        c3 = lo0;
        key0 += 0x9E3779B9u;
        key1 += 0xBB67AE85u;
    }
    sa_philox4x32 out = {{c0, c1, c2, c3}};
    return out;
}

__host__ __device__ inline bool sa_dropout_keep(uint64_t seed, uint32_t stream, uint64_t index, uint32_t threshold) {
    const sa_philox4x32 counter = {{(uint32_t)index, (uint32_t)(index >> 32), stream, 0u}};
    return sa_philox4x32_10(counter, (uint32_t)seed, (uint32_t)(seed >> 32)).word[0] >= threshold;
}
