// The test kernels of runtime/philox.h (tests/codegen/all_targets/test_philox_targets.py): built with
// g++ through cuda_host.h's emulation and loaded with ctypes, and compiled by nvcc for sm_90.
#include "cuda_host.h"
#include "philox.h"

// One thread per position: out[n] = whether dropout keeps the entry at flat position index[n].
__global__ void keep_at_kernel(uint64_t seed, uint32_t stream, const uint64_t* index, uint32_t threshold,
                               uint8_t* out, int n) {
    const int at = blockIdx.x * blockDim.x + threadIdx.x;
    if (at < n) out[at] = sa_dropout_keep(seed, stream, index[at], threshold) ? 1 : 0;
}

// The mask of a [batch, rows, cols] tensor, one block per (row tile, batch entry): each thread
// computes its entries' positions from (batch, i, j), as a tiled attention kernel would.
__global__ void keep_tile_kernel(uint64_t seed, uint32_t stream, uint32_t threshold, int rows, int cols,
                                 int tile_rows, uint8_t* out) {
    const uint64_t b = blockIdx.y;
    for (int i = blockIdx.x * tile_rows; i < (int)(blockIdx.x + 1) * tile_rows && i < rows; ++i)
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            const uint64_t index = (b * rows + i) * cols + j;
            out[index] = sa_dropout_keep(seed, stream, index, threshold) ? 1 : 0;
        }
}

extern "C" int keep_at(uint64_t seed, uint32_t stream, const uint64_t* index, uint32_t threshold,
                       uint8_t* out, int n) {
    SA_LAUNCH(keep_at_kernel, dim3((n + 63) / 64), dim3(64), 0, seed, stream, index, threshold, out, n);
    return SA_LAST_ERROR();
}

extern "C" int keep_tiles(uint64_t seed, uint32_t stream, uint32_t threshold, int batch, int rows, int cols,
                          uint8_t* out) {
    const int tile_rows = 8;
    SA_LAUNCH(keep_tile_kernel, dim3((rows + tile_rows - 1) / tile_rows, batch), dim3(32), 0, seed, stream,
              threshold, rows, cols, tile_rows, out);
    return SA_LAST_ERROR();
}

// The generator itself, on the host side of the header: words[0..3] = Philox-4x32-10(counter, key).
extern "C" void philox_words(const uint32_t* counter, const uint32_t* key, uint32_t* words) {
    const sa_philox4x32 c = {{counter[0], counter[1], counter[2], counter[3]}};
    const sa_philox4x32 out = sa_philox4x32_10(c, key[0], key[1]);
    for (int k = 0; k < 4; ++k) words[k] = out.word[k];
}
