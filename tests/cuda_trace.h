// The memory-traffic tracer's half in C++ (tests/cuda_trace.py builds it): the printed kernel's input pointers
// become tx_traced<T>, whose operator[] records (array, byte offset) in the calling GPU thread's list. One
// block runs, one OS thread per GPU thread (the kernel may wait at barriers); the lists are written out in
// thread order so the Python side can group the k-th load of the 32 lanes of a warp into one warp request.
#ifndef TULLAX_CUDA_TRACE_H
#define TULLAX_CUDA_TRACE_H

#include <cstdio>
#include <vector>

struct tx_trace_record {
    long long array, offset;
};

thread_local std::vector<tx_trace_record>* tx_trace_list = nullptr;

template <typename T> struct tx_traced {
    const T* base;
    long long array;
    template <typename I> T operator[](I i) const {
        // offsets from the array's start: cudaMalloc aligns every buffer to 256 bytes
        tx_trace_list->push_back({array, (long long)i * (long long)sizeof(T)});
        return base[i];
    }
};

// Runs block `block` of the launch (gridDim.x = geometry.grid) with one OS thread per GPU thread.
inline std::vector<std::vector<tx_trace_record>> tx_trace_block(const tx_geometry& geometry, unsigned block,
                                                                void (*call)(void**), void** args) {
    gridDim.x = geometry.grid;
    blockDim.x = geometry.block;
    std::vector<std::vector<tx_trace_record>> lists(geometry.block);
    tx_run_block(geometry, block, [&](unsigned t) { tx_trace_list = &lists[t]; call(args); });
    return lists;
}

#endif
