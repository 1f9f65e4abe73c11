// cuda_host.h: lets one CUDA source build with nvcc (for a GPU) or with a C++20
// compiler (for the CPU), unchanged.
//
// Under nvcc it only includes <cuda_runtime.h> and defines SA_LAUNCH as the
// triple-chevron launch. Under g++/clang it emulates the part of CUDA the
// symattn kernels use, faithfully enough for ThreadSanitizer to see every race:
//   - each block's threads are real std::threads, one per CUDA thread;
//   - __syncthreads() is std::barrier::arrive_and_wait() on the block's barrier;
//   - __shared__ is `static`: one copy, used by one block at a time, because the
//     blocks of a launch run one after another (a barrier separates them);
//   - threadIdx/blockIdx are thread_local, blockDim/gridDim are per launch;
//   - atomicAdd is std::atomic_ref, math comes from <cmath>;
//   - each run of 32 consecutive linear thread ids is a warp with its own
//     barrier and exchange area (WarpState), used only by cuda_warp.h's
//     warp-collective functions; kernels that do not include it never touch them.
// A kernel must reach every __syncthreads() from every thread of its block (no
// early return before a barrier), as CUDA requires; here a violation deadlocks.
#pragma once

#ifdef __CUDACC__

#include <cuda_runtime.h>
#define SA_LAUNCH(kernel, grid, block, stream, ...) kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#define SA_LAST_ERROR() ((int)cudaGetLastError())

#else  // the CPU emulation

#include <atomic>
#include <barrier>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <vector>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

typedef struct CUstream_st* cudaStream_t;  // as the CUDA runtime declares it; launches ignore the stream

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned int x, y, z;
};

namespace sa_host {
inline thread_local uint3 thread_idx{0, 0, 0};
inline thread_local uint3 block_idx{0, 0, 0};
inline dim3 block_dim{1, 1, 1};
inline dim3 grid_dim{1, 1, 1};
inline std::barrier<>* block_barrier = nullptr;
inline thread_local unsigned int linear_tid = 0;  // x + y*blockDim.x + z*blockDim.x*blockDim.y

// The barrier of one warp. Not std::barrier: libstdc++'s waits share a global
// table of waiter counters, whose atomics would make ThreadSanitizer see an
// ordering between lanes of different warps that the program does not have
// (and so miss races between warps). Here the only shared atomics are the
// warp's own: arrivals count with acq_rel read-modify-writes, the last one
// publishes the next generation (release), waiters read it (acquire); a
// futex (Linux) or yielding (elsewhere) only saves the CPU while waiting.
class WarpBarrier {
  public:
    explicit WarpBarrier(int lanes) : lanes_(lanes) {}
    void arrive_and_wait() {
        const int generation = generation_.load(std::memory_order_acquire);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) == lanes_ - 1) {
            arrived_.store(0, std::memory_order_relaxed);
            generation_.fetch_add(1, std::memory_order_release);
#ifdef __linux__
            syscall(SYS_futex, reinterpret_cast<int*>(&generation_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#endif
            return;
        }
        while (generation_.load(std::memory_order_acquire) == generation) {
#ifdef __linux__
            syscall(SYS_futex, reinterpret_cast<int*>(&generation_), FUTEX_WAIT_PRIVATE, generation, nullptr, nullptr, 0);
#else
            std::this_thread::yield();
#endif
        }
    }

  private:
    const int lanes_;
    std::atomic<int> arrived_{0};
    std::atomic<int> generation_{0};
};
static_assert(sizeof(std::atomic<int>) == sizeof(int), "the futex waits on the atomic's int");

// One warp of the running block: its barrier and a double-buffered exchange
// area (cuda_warp.h alternates the two halves, so one barrier per collective
// suffices). The last warp of a block whose size is not a multiple of 32 has
// fewer lanes; cuda_warp.h refuses to run collectives in such blocks.
struct WarpState {
    explicit WarpState(int lanes) : barrier(lanes) {}
    WarpBarrier barrier;
    alignas(64) uint32_t slot[2][32][16];
};
inline std::deque<WarpState>* warp_states = nullptr;

// Run `body` (one kernel launch, arguments bound) over `grid` x `block`: blockDim
// threads, each running the blocks in order; the barrier at the end of each block
// keeps blocks from overlapping. Not a template, so it is compiled once per file.
inline void run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
    const unsigned int threads = block.x * block.y * block.z;
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    if (threads == 0 || blocks == 0) return;
    std::barrier<> barrier((std::ptrdiff_t)threads);
    block_dim = block;
    grid_dim = grid;
    block_barrier = &barrier;
    std::deque<WarpState> warps;  // a deque: WarpState (a barrier) cannot move
    for (unsigned int first = 0; first < threads; first += 32)
        warps.emplace_back((int)(threads - first < 32 ? threads - first : 32));
    warp_states = &warps;
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned int t = 0; t < threads; ++t) {
        workers.emplace_back([=, &barrier, &body] {
            thread_idx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            linear_tid = t;
            for (unsigned int z = 0; z < grid.z; ++z)
                for (unsigned int y = 0; y < grid.y; ++y)
                    for (unsigned int x = 0; x < grid.x; ++x) {
                        block_idx = uint3{x, y, z};
                        body();
                        barrier.arrive_and_wait();
                    }
        });
    }
    for (auto& w : workers) w.join();
    block_barrier = nullptr;
    warp_states = nullptr;
}

// launch(kernel, grid, block, args...): what `kernel<<<grid, block>>>(args...)` does on a GPU.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, Args... args) {
    run_grid(grid, block, [=] { kernel(args...); });
}
}  // namespace sa_host

#define threadIdx (sa_host::thread_idx)
#define blockIdx (sa_host::block_idx)
#define blockDim (sa_host::block_dim)
#define gridDim (sa_host::grid_dim)

inline void __syncthreads() { sa_host::block_barrier->arrive_and_wait(); }

// __syncthreads_or(p): a barrier that returns nonzero iff p is nonzero for some thread of the block. One
// flag per block: set after a first barrier (every earlier reader is done), read after a second, cleared
// by thread 0 after a third (before any thread can reach the next call's first barrier).
inline int __syncthreads_or(int predicate) {
    static std::atomic<int> flag_{0};
    sa_host::block_barrier->arrive_and_wait();
    if (predicate) flag_.fetch_or(1);
    sa_host::block_barrier->arrive_and_wait();
    const int any_ = flag_.load();
    sa_host::block_barrier->arrive_and_wait();
    if (sa_host::linear_tid == 0) flag_.store(0);
    return any_;
}

inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}

#define SA_LAUNCH(kernel, grid, block, stream, ...) sa_host::launch(kernel, (grid), (block), __VA_ARGS__)
#define SA_LAST_ERROR() 0

#endif  // __CUDACC__
