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

// A printed vector read (tx_load_vec) of a traced input: ONE request record at the vector's first byte (an aligned
// vector of at most 16 bytes lies in one 32-byte sector); the alignment test reads the real address
template <typename V, typename T, typename I> V tx_load_vec(const tx_traced<T>& s, I i) {
    tx_trace_list->push_back({s.array, (long long)i * (long long)sizeof(T)});
    return *reinterpret_cast<const V*>(s.base + i);
}
template <typename T> bool tx_aligned16(const tx_traced<T>& p) {
    return (reinterpret_cast<unsigned long long>(p.base) & 15ull) == 0;
}

// Shared-memory READS are recorded too, in a second list per thread: (element size, byte offset from the block's
// shared memory), and WRITES in a third (exact per request where every lane writes as often as the others, as a
// block tile's copy does; a window copy's lanes outside the patch skip theirs, which shifts the k-th write of
// later ones); a pointer taken from the array (a cooperative reduction's partials) is not traced.
thread_local std::vector<tx_trace_record>* tx_shared_list = nullptr;
thread_local std::vector<tx_trace_record>* tx_shared_write_list = nullptr;

template <typename T> struct tx_shared_traced {
    T* base;
    struct ref {
        T* p;
        operator T() const {
            const char* start = reinterpret_cast<const char*>(tx_block_now->shared.data());
            tx_shared_list->push_back({(long long)sizeof(T), (long long)(reinterpret_cast<const char*>(p) - start)});
            return *p;
        }
        ref& operator=(T v) {
            const char* start = reinterpret_cast<const char*>(tx_block_now->shared.data());
            tx_shared_write_list->push_back({(long long)sizeof(T), (long long)(reinterpret_cast<const char*>(p) - start)});
            *p = v;
            return *this;
        }
    };
    template <typename I> ref operator[](I i) const { return ref{base + i}; }
    operator T*() const { return base; }
    template <typename U> explicit operator U*() const { return reinterpret_cast<U*>(base); }  // (float*)tx_red
};
// A printed vector read (tx_load_vec) of a traced shared array: one record of the vector's size
template <typename V, typename T, typename I> V tx_load_vec(const tx_shared_traced<T>& s, I i) {
    const char* start = reinterpret_cast<const char*>(tx_block_now->shared.data());
    tx_shared_list->push_back({(long long)sizeof(V), (long long)(reinterpret_cast<const char*>(s.base + i) - start)});
    return *reinterpret_cast<const V*>(s.base + i);
}
#undef TX_SHARED
#define TX_SHARED(type, name, count) \
    tx_shared_traced<type> name{static_cast<type*>(tx_shared_take(sizeof(type) * (count)))}

// Runs block `block` of the launch (gridDim.x = geometry.grid) with one OS thread per GPU thread: each thread's
// global loads in lists[t], its shared reads in lists[geometry.block + t], its shared writes in
// lists[2 * geometry.block + t].
inline std::vector<std::vector<tx_trace_record>> tx_trace_block(const tx_geometry& geometry, unsigned block,
                                                                void (*call)(void**), void** args) {
    gridDim.x = geometry.grid;
    blockDim.x = geometry.block;
    std::vector<std::vector<tx_trace_record>> lists(3 * geometry.block);
    tx_run_block(geometry, block, [&](unsigned t) {
        tx_trace_list = &lists[t];
        tx_shared_list = &lists[geometry.block + t];
        tx_shared_write_list = &lists[2 * geometry.block + t];
        call(args);
    });
    return lists;
}

#endif
