// Runs tullax's printed CUDA C on the CPU, unchanged, for tests (tests/cuda_harness.py compiles it with g++).
//
// What CUDA gives a kernel, emulated: __global__/__device__ are plain functions; blockIdx and threadIdx are
// thread-local variables that the launcher sets before each call of the kernel function (one call per GPU
// thread); blockDim and gridDim are set once per launch; atomicAdd is std::atomic_ref's fetch_add. The
// launcher runs the blocks in a shuffled order, spread over several OS threads, and the threads of a block in
// a shuffled order too, so a result that depends on the order, a missing atomic or any other race shows
// (deterministically under -fsanitize=thread, which the harness uses where it runs).
#ifndef TULLAX_CUDA_HOST_H
#define TULLAX_CUDA_HOST_H

#include <math.h>

#include <algorithm>
#include <atomic>
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

#endif
