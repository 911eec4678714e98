// Exclusive prefix sums of u32 and u64 arrays (used for block indptr, unique
// relabeling and anything else that needs positions). Deterministic: integer sums.
//
// A scan of n values runs in passes: `scan_*_tiles` scans each tile of SCAN_TILE
// values (one block of SCAN_THREADS threads, SCAN_ITEMS each) and writes the tile's
// total to tile_sums[tile]; the host scans tile_sums the same way (recursively) and
// `scan_*_add` adds each tile's offset. In-place (out == in) is allowed: a tile reads
// all its values before writing any.
#include "common.cuh"

#define SCAN_THREADS 256
#define SCAN_ITEMS 4
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

// One tile per block (blockDim.x must be SCAN_THREADS).
template <typename T>
__device__ __forceinline__ void scan_tile(const T* in, u64 n, T* out, T* tile_sums) {
    __shared__ T warp_totals[SCAN_THREADS / WARP_SIZE];
    const u64 tile = blockIdx.x;
    const u64 base = tile * SCAN_TILE + (u64)threadIdx.x * SCAN_ITEMS;
    T items[SCAN_ITEMS];
    T total = 0;
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        const u64 i = base + k;
        items[k] = i < n ? in[i] : (T)0;
        total += items[k];
    }
    // Exclusive offset of this thread within the block.
    const T incl = warp_inclusive_scan<T>(total);
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u32 lane = lane_id();
    if (lane == WARP_SIZE - 1) warp_totals[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T w = lane < SCAN_THREADS / WARP_SIZE ? warp_totals[lane] : (T)0;
        w = warp_inclusive_scan<T>(w);
        if (lane < SCAN_THREADS / WARP_SIZE) warp_totals[lane] = w;
    }
    __syncthreads();
    T run = (incl - total) + (warp > 0 ? warp_totals[warp - 1] : (T)0);
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        const u64 i = base + k;
        if (i < n) out[i] = run;
        run += items[k];
    }
    if (threadIdx.x == SCAN_THREADS - 1) tile_sums[tile] = run;
}

template <typename T>
__device__ __forceinline__ void scan_add(T* out, u64 n, const T* tile_offsets) {
    for (u64 i = thread_index(); i < n; i += thread_count()) out[i] += tile_offsets[i / SCAN_TILE];
}

extern "C" __global__ void scan_u32_tiles(const u32* input, u64 n, u32* out, u32* tile_sums) {
    scan_tile<u32>(input, n, out, tile_sums);
}
extern "C" __global__ void scan_u32_add(u32* out, u64 n, const u32* tile_offsets) {
    scan_add<u32>(out, n, tile_offsets);
}
extern "C" __global__ void scan_u64_tiles(const u64* input, u64 n, u64* out, u64* tile_sums) {
    scan_tile<u64>(input, n, out, tile_sums);
}
extern "C" __global__ void scan_u64_add(u64* out, u64 n, const u64* tile_offsets) {
    scan_add<u64>(out, n, tile_offsets);
}
