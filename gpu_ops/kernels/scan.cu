// Exclusive prefix sums of u32 and u64 arrays (used for block indptr, unique
// relabeling and anything else that needs positions). Deterministic: integer sums.
//
// A tile is SCAN_TILE = 16,384 values, scanned by one block of SCAN_THREADS = 1024
// threads (SCAN_ITEMS = 16 consecutive values each). A scan of n values:
// - n <= SCAN_TILE: one launch of `scan_*_tiles` on one block (the single-block
//   scan; its tile total is not needed, tile_sums may be null);
// - else `scan_*_tiles` scans each tile and writes its total to tile_sums[tile],
//   the host scans tile_sums the same way (one block up to 16,384 tiles, i.e.
//   n <= 2^28) and `scan_*_add` adds each tile's offset: 3 launches.
// In-place (out == in) is allowed: a thread reads all its values before writing any,
// and writes only those.
//
// `scan_tile_with` takes the values from a loader, so a producer can be fused into
// the tile pass: sample.cu's `sample_count_scan` (neighbor counts → block indptr)
// and `unique_flag_scan` (first-occurrence flags → ranks) are such fused passes.
#include "common.cuh"

// SCAN_THREADS, SCAN_ITEMS, SCAN_TILE and `scan_tile_with` live in common.cuh.

template <typename T>
__device__ __forceinline__ void scan_add(T* out, u64 n, const T* tile_offsets) {
    for (u64 i = thread_index(); i < n; i += thread_count()) out[i] += tile_offsets[i / SCAN_TILE];
}

extern "C" __global__ void __launch_bounds__(SCAN_THREADS) scan_u32_tiles(const u32* input, u64 n, u32* out, u32* tile_sums) {
    scan_tile_with<u32>([=](u64 i) { return input[i]; }, n, out, tile_sums);
}
extern "C" __global__ void scan_u32_add(u32* out, u64 n, const u32* tile_offsets) {
    scan_add<u32>(out, n, tile_offsets);
}
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) scan_u64_tiles(const u64* input, u64 n, u64* out, u64* tile_sums) {
    scan_tile_with<u64>([=](u64 i) { return input[i]; }, n, out, tile_sums);
}
extern "C" __global__ void scan_u64_add(u64* out, u64 n, const u64* tile_offsets) {
    scan_add<u64>(out, n, tile_offsets);
}
