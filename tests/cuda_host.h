// Runs tullax's printed CUDA C on the CPU, unchanged, for tests (tests/cuda_harness.py compiles it with g++).
//
// What CUDA gives a kernel, emulated: __global__/__device__ are plain functions; blockIdx and threadIdx are
// thread-local variables that the launcher sets before each call of the kernel function (one call per GPU
// thread); blockDim and gridDim are set once per launch; atomicAdd is std::atomic_ref's fetch_add. The
// launcher runs the blocks in a shuffled order, spread over several OS threads, and the threads of a block in
// a shuffled order too, so a result that depends on the order, a missing atomic or any other race shows
// (deterministically under -fsanitize=thread, which the harness uses where it runs).
//
// Kernels whose threads cooperate (shared memory, __syncthreads, warp shuffles) run through tx_launch_blocks:
// one OS thread per GPU thread of a block, __syncthreads a std::barrier of the block, __shfl_xor_sync an
// exchange array and a barrier per warp, TX_SHARED memory one buffer per block. A missing barrier is then a
// race the thread sanitizer reports, or a wrong result.
#ifndef TULLAX_CUDA_HOST_H
#define TULLAX_CUDA_HOST_H

#include <math.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <bit>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

// CUDA's vector types that printed kernels read shared memory through (tx_load_vec), with CUDA's alignment
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) double2 { double x, y; };

struct tx_dim3 {
    unsigned x = 0, y = 0, z = 0;
};

thread_local tx_dim3 blockIdx, threadIdx;
tx_dim3 blockDim, gridDim;

inline float __int_as_float(int bits) { return std::bit_cast<float>(bits); }
inline double __longlong_as_double(long long bits) { return std::bit_cast<double>(bits); }

template <typename T> T atomicAdd(T* address, T value) { return std::atomic_ref<T>(*address).fetch_add(value); }

struct tx_geometry {
    unsigned grid, block, workers, seed;
};

// Runs call(args) once per GPU thread of geometry.grid blocks of geometry.block threads, on geometry.workers
// OS threads (call is a kernel invocation with its arguments unpacked from args). Worker w runs the shuffled
// blocks w, w + workers, ...: the workers never synchronise with each other, so the thread sanitizer sees any
// two conflicting accesses from different blocks as a race.
inline void tx_launch(const tx_geometry& geometry, void (*call)(void**), void** args) {
    gridDim.x = geometry.grid;
    blockDim.x = geometry.block;
    std::mt19937 random(geometry.seed);
    std::vector<unsigned> blocks(geometry.grid);
    std::iota(blocks.begin(), blocks.end(), 0u);
    std::shuffle(blocks.begin(), blocks.end(), random);
    std::vector<std::vector<unsigned>> threads(geometry.grid, std::vector<unsigned>(geometry.block));
    for (auto& order : threads) {
        std::iota(order.begin(), order.end(), 0u);
        std::shuffle(order.begin(), order.end(), random);
    }
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < geometry.workers; ++w) {
        workers.emplace_back([&, w] {
            for (unsigned k = w; k < geometry.grid; k += geometry.workers) {
                blockIdx.x = blocks[k];
                for (unsigned t : threads[k]) {
                    threadIdx.x = t;
                    call(args);
                }
            }
        });
    }
    for (auto& worker : workers) worker.join();
}

// -- cooperating threads ---------------------------------------------------------------------------------
struct tx_block_state {
    explicit tx_block_state(unsigned threads)
        : block(threads), exchange(threads), shared(48 * 1024 / sizeof(long double)) {
        for (unsigned w = 0; w * 32 < threads; ++w) {
            warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - w * 32)));
        }
    }
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<unsigned long long> exchange;  // one slot per thread for a shuffle's value
    std::vector<long double> shared;  // the block's shared memory (48 KiB, CUDA's static limit)
};

thread_local tx_block_state* tx_block_now = nullptr;
thread_local size_t tx_shared_offset = 0;

// Every thread declares the same shared arrays in the same order, so each gets the same address without
// synchronising (a lock here would hide the races the sanitizer must see).
inline void* tx_shared_take(size_t bytes) {
    size_t at = (tx_shared_offset + 15) / 16 * 16;
    tx_shared_offset = at + bytes;
    if (tx_shared_offset > tx_block_now->shared.size() * sizeof(long double)) std::abort();
    return reinterpret_cast<char*>(tx_block_now->shared.data()) + at;
}
#define TX_SHARED(type, name, count) type* name = static_cast<type*>(tx_shared_take(sizeof(type) * (count)))
// extern __shared__: the rest of the block's shared memory (the kernel declares it after its static arrays); a
// kernel that reaches past it aborts in tx_shared_take's check of a later array, or the sanitizer's bounds
inline double* tx_shared_rest() {
    double* at = static_cast<double*>(tx_shared_take(0));
    tx_shared_offset = tx_block_now->shared.size() * sizeof(long double);
    return at;
}
#define TX_DYNAMIC_SHARED(name) double* name = tx_shared_rest()

inline void __syncthreads() { tx_block_now->block.arrive_and_wait(); }

template <typename T> T __shfl_xor_sync(unsigned, T value, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(unsigned long long));
    tx_block_state& state = *tx_block_now;
    unsigned t = threadIdx.x;
    std::memcpy(&state.exchange[t], &value, sizeof(T));
    state.warps[t / 32]->arrive_and_wait();
    T out;
    std::memcpy(&out, &state.exchange[t ^ unsigned(lane_mask)], sizeof(T));
    state.warps[t / 32]->arrive_and_wait();  // nobody overwrites a slot before its partner read it
    return out;
}

// Runs the geometry.block threads of block `block` at once, one OS thread each; run(t) is thread t's work.
// gridDim and blockDim are the launcher's to set, once, before any block runs.
inline void tx_run_block(const tx_geometry& geometry, unsigned block, const std::function<void(unsigned)>& run) {
    tx_block_state state(geometry.block);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < geometry.block; ++t) {
        threads.emplace_back([&, t] {
            blockIdx.x = block;
            threadIdx.x = t;
            tx_block_now = &state;
            tx_shared_offset = 0;
            run(t);
        });
    }
    for (auto& thread : threads) thread.join();
}

// tx_launch for kernels whose threads cooperate: the shuffled blocks spread over geometry.workers OS threads
// as there, each block's threads running together.
inline void tx_launch_blocks(const tx_geometry& geometry, void (*call)(void**), void** args) {
    gridDim.x = geometry.grid;
    blockDim.x = geometry.block;
    std::mt19937 random(geometry.seed);
    std::vector<unsigned> blocks(geometry.grid);
    std::iota(blocks.begin(), blocks.end(), 0u);
    std::shuffle(blocks.begin(), blocks.end(), random);
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < geometry.workers; ++w) {
        workers.emplace_back([&, w] {
            for (unsigned k = w; k < geometry.grid; k += geometry.workers) {
                tx_run_block(geometry, blocks[k], [&](unsigned) { call(args); });
            }
        });
    }
    for (auto& worker : workers) worker.join();
}

#endif
