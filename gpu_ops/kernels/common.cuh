// Shared definitions of Tandem's CUDA kernels (gpu_ops/kernels/*.cu).
//
// Every kernel source starts with `#include "common.cuh"`; the kernel registry
// (gpu_ops/src/cuda/kernels.rs) pastes this header in its place before handing the
// source to NVRTC, so no include path or standard header is needed.
//
// Conventions (the Rust side's `define_kernels!` table mirrors every signature and a
// unit test checks the two agree, parameter by parameter):
// - every kernel is `extern "C" __global__` (unmangled name = registry name);
// - parameters are `u64` sizes, `u32` / `float` / `double` scalars, and pointers to
//   `float`, `double`, `u32`, `u64`, `u16` (bfloat16 bits) or `u8` (`const` when the
//   kernel only reads);
// - sizes are `u64`; loops are grid-stride (or warp-stride), so any grid size is
//   correct and a 0-sized input does nothing (the host skips such launches anyway);
// - an index that the host cannot check (it lives in device memory) is checked here:
//   an out-of-range one is skipped (its output row becomes zeros) and reported
//   through the backend's fault word (see `report_fault`), which the host reads at
//   its next synchronization and turns into a typed error.

#ifndef TANDEM_COMMON_CUH
#define TANDEM_COMMON_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#define NOT_CACHED 0xffffffffu

// ---- fault codes (mirrored by `Fault` in gpu_ops/src/cuda/device.rs) ----------
#define FAULT_GATHER_ID 1u
#define FAULT_SELECT_INDEX 2u
#define FAULT_PUT_INDEX 3u
#define FAULT_LABEL 4u
#define FAULT_SAMPLE_VERTEX 5u
#define FAULT_PAIR_INDEX 6u

// The fault word: fault[0] = code (0 = none), fault[1..3) = the bad value (lo, hi),
// fault[3..5) = the limit it had to stay below (lo, hi). The first fault wins.
__device__ __forceinline__ void report_fault(u32* fault, u32 code, u64 value, u64 limit) {
    if (atomicCAS(fault, 0u, code) == 0u) {
        fault[1] = (u32)value;
        fault[2] = (u32)(value >> 32);
        fault[3] = (u32)limit;
        fault[4] = (u32)(limit >> 32);
    }
}

// ---- indexing -----------------------------------------------------------------
__device__ __forceinline__ u64 thread_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ u64 thread_count() {
    return (u64)gridDim.x * blockDim.x;
}
__device__ __forceinline__ u32 lane_id() {
    return threadIdx.x & (WARP_SIZE - 1);
}
// Global warp index and warp count (blockDim.x is a multiple of 32).
__device__ __forceinline__ u64 warp_index() {
    return thread_index() / WARP_SIZE;
}
__device__ __forceinline__ u64 warp_count() {
    return thread_count() / WARP_SIZE;
}

// ---- warp reductions (every lane gets the result) ---------------------------------
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ u32 warp_sum_u32(u32 v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// ---- counter-based random numbers -------------------------------------------------
// SplitMix64's finalizer: a bijective 64-bit mixer.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
// A key for the stream (a, b): distinct pairs give unrelated keys.
__device__ __forceinline__ u64 hash_key(u64 a, u64 b) {
    return mix64(mix64(a + 0x9E3779B97F4A7C15ull) ^ (b * 0xD1B54A32D192ED03ull));
}
// Draw `i` of the stream `key`: 64 random bits, a pure function of (key, i).
__device__ __forceinline__ u64 hash_draw(u64 key, u64 i) {
    return mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
}
// A uniform integer in [0, bound) from 64 random bits (multiply-high; bias below
// bound / 2^64, far under anything measurable).
__device__ __forceinline__ u64 uniform_below(u64 bits, u64 bound) {
    return __umul64hi(bits, bound);
}

// ---- row copies -------------------------------------------------------------------
// One warp copies `dim` floats from `src` to `dst` (float4 when both rows are 16-byte
// aligned and dim is a multiple of 4).
__device__ __forceinline__ void warp_copy_row(float* dst, const float* src, u64 dim) {
    const u32 lane = lane_id();
    if ((dim & 3) == 0 && ((((u64)dst) | ((u64)src)) & 15) == 0) {
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
        for (u64 c = lane; c < dim / 4; c += WARP_SIZE) d4[c] = s4[c];
    } else {
        for (u64 c = lane; c < dim; c += WARP_SIZE) dst[c] = src[c];
    }
}
// One warp copies `dim` bfloat16 values (raw bits) from `src` to `dst` (16 bytes at
// a time when both rows are 16-byte aligned and dim is a multiple of 8).
__device__ __forceinline__ void warp_copy_row(u16* dst, const u16* src, u64 dim) {
    const u32 lane = lane_id();
    if ((dim & 7) == 0 && ((((u64)dst) | ((u64)src)) & 15) == 0) {
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (u64 c = lane; c < dim / 8; c += WARP_SIZE) d[c] = s[c];
    } else {
        for (u64 c = lane; c < dim; c += WARP_SIZE) dst[c] = src[c];
    }
}
// The float of bfloat16 bits `b` (exact: bfloat16 is float's upper half).
__device__ __forceinline__ float bf16_to_float(u32 b) {
    return __uint_as_float(b << 16);
}
// One warp zeroes `dim` floats.
__device__ __forceinline__ void warp_zero_row(float* dst, u64 dim) {
    for (u64 c = lane_id(); c < dim; c += WARP_SIZE) dst[c] = 0.0f;
}

// ---- tile scans (scan.cu; fused producers in sample.cu) ------------------------------
// A tile is SCAN_TILE values scanned by one block of SCAN_THREADS threads,
// SCAN_ITEMS consecutive values each (scan.cu's header says how scans use it).
// Every kernel launched with SCAN_THREADS threads is declared
// `__launch_bounds__(SCAN_THREADS)`: 1,024 threads a block leave 64 registers a
// thread, which the compiler must know to fit (a launch with more fails).
#define SCAN_THREADS 1024
#define SCAN_ITEMS 16
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
    const u32 lane = lane_id();
    for (int o = 1; o < WARP_SIZE; o <<= 1) {
        const T up = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= (u32)o) v += up;
    }
    return v;
}

// One tile per block (blockDim.x must be SCAN_THREADS): out[i] = the exclusive
// prefix of load(j) over the tile's j < i, for the tile's i < n; values at i >= n
// count 0 and are not loaded. tile_sums[tile] = the tile's total (unless null).
template <typename T, typename Load>
__device__ __forceinline__ void scan_tile_with(const Load& load, u64 n, T* out, T* tile_sums) {
    __shared__ T warp_totals[SCAN_THREADS / WARP_SIZE];
    const u64 tile = blockIdx.x;
    const u64 base = tile * SCAN_TILE + (u64)threadIdx.x * SCAN_ITEMS;
    T items[SCAN_ITEMS];
    T total = 0;
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        const u64 i = base + k;
        items[k] = i < n ? load(i) : (T)0;
        total += items[k];
    }
    // Exclusive offset of this thread within the block.
    const T incl = warp_inclusive_scan<T>(total);
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u32 lane = lane_id();
    if (lane == WARP_SIZE - 1) warp_totals[warp] = incl;
    __syncthreads();
    // SCAN_THREADS / WARP_SIZE = 32 warp totals: warp 0 scans them, one a lane.
    if (warp == 0) warp_totals[lane] = warp_inclusive_scan<T>(warp_totals[lane]);
    __syncthreads();
    T run = (incl - total) + (warp > 0 ? warp_totals[warp - 1] : (T)0);
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        const u64 i = base + k;
        if (i < n) out[i] = run;
        run += items[k];
    }
    if (tile_sums != nullptr && threadIdx.x == SCAN_THREADS - 1) tile_sums[tile] = run;
}

#endif  // TANDEM_COMMON_CUH
