// A small SIMT emulator: runs Tandem's CUDA kernels (gpu_ops/kernels/*.cu) as
// host C++ (C++20), so their logic can be tested on a machine without a GPU.
//
// - One block at a time; one OS thread per CUDA thread. `__shared__` variables become
//   function-level statics, which is block-shared memory when blocks run one by one.
// - `__syncthreads` is a block barrier; `__syncwarp`, `__shfl_xor_sync`,
//   `__shfl_up_sync`, `__any_sync` and `__ballot_sync` exchange through a per-warp barrier and slot
//   array, so every lane of a warp must reach them together (divergent use, which
//   is undefined on a GPU, deadlocks here).
// - Atomics are std::atomic_ref; device pointers are host pointers.
//
// It checks what a kernel computes (indexing, loop bounds, warp reductions, races
// that barriers order), not performance, memory coalescing or the memory model's
// finer points. Used by kernel_tests.cpp (run: .ci/kernel-simt).
#pragma once
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
struct Dim { unsigned int x = 0, y = 0, z = 0; };
inline thread_local Dim threadIdx, blockIdx;
inline Dim blockDim, gridDim;

struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

template <class T> inline T min(T a, T b) { return a < b ? a : b; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

struct WarpState {
    std::unique_ptr<std::barrier<>> bar;
    unsigned long long slot[32];
};
inline std::unique_ptr<std::barrier<>> g_block_bar;
inline std::vector<std::unique_ptr<WarpState>> g_warps;

inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warps[threadIdx.x / 32]->bar->arrive_and_wait(); }

template <class T> inline T shfl_generic(T v, unsigned src_lane_fn(unsigned, int), int o, bool up) {
    static_assert(sizeof(T) <= 8);
    auto& w = *g_warps[threadIdx.x / 32];
    unsigned lane = threadIdx.x % 32;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.slot[lane] = bits;
    w.bar->arrive_and_wait();
    unsigned src = src_lane_fn(lane, o);
    T out;
    if (up && (int)lane - o < 0) out = v;
    else { unsigned long long b = w.slot[src]; std::memcpy(&out, &b, sizeof(T)); }
    w.bar->arrive_and_wait();
    return out;
}
inline unsigned xor_lane(unsigned l, int o) { return l ^ (unsigned)o; }
inline unsigned up_lane(unsigned l, int o) { return (int)l - o < 0 ? l : l - o; }
inline unsigned src_lane(unsigned, int o) { return (unsigned)o & 31u; }
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return shfl_generic(v, src_lane, src, false); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) { return shfl_generic(v, xor_lane, o, false); }
template <class T> inline T __shfl_up_sync(unsigned, T v, int o) { return shfl_generic(v, up_lane, o, true); }
inline bool __any_sync(unsigned, bool p) {
    auto& w = *g_warps[threadIdx.x / 32];
    unsigned lane = threadIdx.x % 32;
    w.slot[lane] = p;
    w.bar->arrive_and_wait();
    bool any = false;
    for (int i = 0; i < 32; ++i) any |= w.slot[i] != 0;
    w.bar->arrive_and_wait();
    return any;
}

inline unsigned __ballot_sync(unsigned, bool p) {
    auto& w = *g_warps[threadIdx.x / 32];
    unsigned lane = threadIdx.x % 32;
    w.slot[lane] = p;
    w.bar->arrive_and_wait();
    unsigned bits = 0;
    for (int i = 0; i < 32; ++i) bits |= (w.slot[i] != 0 ? 1u : 0u) << i;
    w.bar->arrive_and_wait();
    return bits;
}

template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned val) {
    std::atomic_ref<unsigned> r(*p);
    r.compare_exchange_strong(cmp, val);
    return cmp;
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> r(*p);
    unsigned cur = r.load();
    while (v < cur && !r.compare_exchange_weak(cur, v)) {}
    return cur;
}

// Kernel launches so far (empty grids are not launched, as on the Rust side).
inline unsigned long long g_launches = 0;

// launch(kernel, blocks, threads, args...)
template <class F, class... A> void launch(F f, unsigned blocks, unsigned threads, A... args) {
    if (blocks == 0) return;
    ++g_launches;
    blockDim = {threads, 1, 1};
    gridDim = {blocks, 1, 1};
    for (unsigned b = 0; b < blocks; ++b) {
        g_block_bar = std::make_unique<std::barrier<>>(threads);
        g_warps.clear();
        for (unsigned w = 0; w < threads / 32; ++w) {
            auto ws = std::make_unique<WarpState>();
            ws->bar = std::make_unique<std::barrier<>>(32);
            g_warps.push_back(std::move(ws));
        }
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t)
            ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; f(args...); });
        for (auto& t : ts) t.join();
    }
}
