// Feature rows: gather through the device cache, the cache's slot map and rows, and
// device-side row selection. Host twins: cpu_ops::gather_rows and plain loops.
#include "common.cuh"

// Per-block hit/miss counters are summed in shared memory and added to the global
// counters once per block (counters[0] = hits, counters[1] = misses).
#define GATHER_THREADS 256

// out[r] = features[ids[r]] for r < n, one warp per row: from the device cache when
// slot_map[id] != NOT_CACHED (row slot_map[id] of `cache`), else from host memory
// (`host_rows`, a device pointer into pinned / registered host memory, read over the
// bus). An id >= num_rows is a fault and gives a zero row. `T` is the stored value:
// float, or bfloat16 bits (u16) widened to float on the way (half the bytes read).
template <typename T>
__device__ __forceinline__ void gather_rows_t(const u32* slot_map, const T* cache,
                                              const T* host_rows, const u32* ids, u64 n,
                                              u64 num_rows, u64 dim, float* out, u64* counters,
                                              u32* fault, u32* hits_s, u32* misses_s) {
    if (threadIdx.x == 0) {
        *hits_s = 0;
        *misses_s = 0;
    }
    __syncthreads();
    const u32 lane = lane_id();
    for (u64 r = warp_index(); r < n; r += warp_count()) {
        const u32 id = ids[r];
        float* dst = out + r * dim;
        if ((u64)id >= num_rows) {
            if (lane == 0) report_fault(fault, FAULT_GATHER_ID, id, num_rows);
            warp_zero_row(dst, dim);
            continue;
        }
        const u32 slot = slot_map[id];
        if (slot != NOT_CACHED) {
            warp_widen_row(dst, cache + (u64)slot * dim, dim);
            if (lane == 0) atomicAdd(hits_s, 1u);
        } else {
            warp_widen_row(dst, host_rows + (u64)id * dim, dim);
            if (lane == 0) atomicAdd(misses_s, 1u);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (*hits_s) atomicAdd(&counters[0], (u64)*hits_s);
        if (*misses_s) atomicAdd(&counters[1], (u64)*misses_s);
    }
}

// gather_rows_t over float rows.
extern "C" __global__ void gather_rows(const u32* slot_map, const float* cache,
                                       const float* host_rows, const u32* ids, u64 n,
                                       u64 num_rows, u64 dim, float* out, u64* counters,
                                       u32* fault) {
    __shared__ u32 hits_s;
    __shared__ u32 misses_s;
    gather_rows_t(slot_map, cache, host_rows, ids, n, num_rows, dim, out, counters, fault,
                  &hits_s, &misses_s);
}

// gather_rows_t over bfloat16 rows (`device.feature_dtype = "bf16"`).
extern "C" __global__ void gather_rows_bf16(const u32* slot_map, const u16* cache,
                                            const u16* host_rows, const u32* ids, u64 n,
                                            u64 num_rows, u64 dim, float* out, u64* counters,
                                            u32* fault) {
    __shared__ u32 hits_s;
    __shared__ u32 misses_s;
    gather_rows_t(slot_map, cache, host_rows, ids, n, num_rows, dim, out, counters, fault,
                  &hits_s, &misses_s);
}

// slot_map[ids[i]] = NOT_CACHED for i < n (evictions; ids checked on the host).
extern "C" __global__ void cache_evict(u32* slot_map, const u32* ids, u64 n) {
    for (u64 i = thread_index(); i < n; i += thread_count()) slot_map[ids[i]] = NOT_CACHED;
}

// Inserts: cache row slots[i] = host row ids[i], then slot_map[ids[i]] = slots[i];
// one warp per row (ids and slots checked on the host).
template <typename T>
__device__ __forceinline__ void cache_insert_t(const T* host_rows, const u32* ids,
                                               const u32* slots, u64 n, u64 dim, T* cache,
                                               u32* slot_map) {
    for (u64 i = warp_index(); i < n; i += warp_count()) {
        const u32 id = ids[i];
        const u32 slot = slots[i];
        warp_copy_row(cache + (u64)slot * dim, host_rows + (u64)id * dim, dim);
        if (lane_id() == 0) slot_map[id] = slot;
    }
}
extern "C" __global__ void cache_insert(const float* host_rows, const u32* ids, const u32* slots,
                                        u64 n, u64 dim, float* cache, u32* slot_map) {
    cache_insert_t(host_rows, ids, slots, n, dim, cache, slot_map);
}
// The same over bfloat16 rows.
extern "C" __global__ void cache_insert_bf16(const u16* host_rows, const u32* ids,
                                             const u32* slots, u64 n, u64 dim, u16* cache,
                                             u32* slot_map) {
    cache_insert_t(host_rows, ids, slots, n, dim, cache, slot_map);
}

// out[r] = src[idx[r]] for r < n (rows of `dim`), one warp per row; idx >= src_rows
// is a fault and gives a zero row.
extern "C" __global__ void index_select_rows(const float* src, u64 src_rows, u64 dim,
                                             const u32* idx, u64 n, float* out, u32* fault) {
    for (u64 r = warp_index(); r < n; r += warp_count()) {
        const u32 i = idx[r];
        float* dst = out + r * dim;
        if ((u64)i >= src_rows) {
            if (lane_id() == 0) report_fault(fault, FAULT_SELECT_INDEX, i, src_rows);
            warp_zero_row(dst, dim);
            continue;
        }
        warp_copy_row(dst, src + (u64)i * dim, dim);
    }
}

// dst[idx[r]] = src[r] for r < n (rows of `dim`, idx distinct), one warp per row;
// idx >= dst_rows is a fault and the row is skipped.
extern "C" __global__ void index_put_rows(const float* src, u64 dim, const u32* idx, u64 n,
                                          float* dst, u64 dst_rows, u32* fault) {
    for (u64 r = warp_index(); r < n; r += warp_count()) {
        const u32 i = idx[r];
        if ((u64)i >= dst_rows) {
            if (lane_id() == 0) report_fault(fault, FAULT_PUT_INDEX, i, dst_rows);
            continue;
        }
        warp_copy_row(dst + (u64)i * dim, src + r * dim, dim);
    }
}
