// Feature rows: gather through the device cache, the cache's slot map and rows, and
// device-side row selection. Host twins: cpu_ops::gather_rows and plain loops.
#include "common.cuh"

// Per-block hit/miss counters are summed in shared memory and added to the global
// counters once per block (counters[0] = hits, counters[1] = misses).
#define GATHER_THREADS 256

// out[r] = features[ids[r]] for r < n: from the device cache when slot_map[id] !=
// NOT_CACHED (row slot_map[id] of `cache`), else from host memory (`host_rows`, a
// device pointer into pinned / registered host memory, read over the bus). An id
// >= num_rows is a fault and gives a zero row. `T` is the stored value: float, or
// bfloat16 bits (u16) widened to float on the way (half the bytes read).
//
// A warp takes GATHER_GROUP (32) rows at a time: lane j reads id j and its slot (one
// coalesced read and 32 lookups in flight together, instead of two dependent reads
// per row), then the warp copies the rows GATHER_UNROLL at a time, each lane loading
// its 16-byte unit of every one of those rows before storing any, so a lane keeps
// GATHER_UNROLL loads in flight. (One warp per row, as before, kept one row's
// three dependent reads in flight per warp: 0.47x of a device copy on an H100.)
#define GATHER_GROUP 32
#define GATHER_UNROLL 8

// Unit `c` of a stored row, 16 bytes, written to the float row `dst`: 4 floats as
// they are, or 8 bfloat16 values widened to 8 floats (the last argument only picks
// the stored type).
__device__ __forceinline__ void store_unit(float* dst, u64 c, uint4 v, const float*) {
    reinterpret_cast<uint4*>(dst)[c] = v;
}
__device__ __forceinline__ void store_unit(float* dst, u64 c, uint4 p, const u16*) {
    float4* d = reinterpret_cast<float4*>(dst);
    // Little-endian: the lower half of each word is the earlier value.
    d[2 * c] = make_float4(__uint_as_float(p.x << 16), __uint_as_float(p.x & 0xffff0000u),
                           __uint_as_float(p.y << 16), __uint_as_float(p.y & 0xffff0000u));
    d[2 * c + 1] = make_float4(__uint_as_float(p.z << 16), __uint_as_float(p.z & 0xffff0000u),
                               __uint_as_float(p.w << 16), __uint_as_float(p.w & 0xffff0000u));
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(u16 v) { return bf16_to_float(v); }

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
    // Values per 16-byte unit; rows go 16 bytes at a time when every row start is
    // 16-byte aligned (aligned bases and a width that is a multiple of the unit).
    const u64 per = 16 / sizeof(T);
    const bool wide = dim % per == 0 && ((((u64)out) | ((u64)cache) | ((u64)host_rows)) & 15) == 0;
    const u64 units = dim / per;
    const u64 groups = (n + GATHER_GROUP - 1) / GATHER_GROUP;
    for (u64 g = warp_index(); g < groups; g += warp_count()) {
        const u64 base = g * GATHER_GROUP;
        const u32 rows = (u32)min((u64)GATHER_GROUP, n - base);
        // Lane j resolves row base + j: its source (0: a zero row) and hit/miss.
        u64 src = 0;
        bool hit = false, miss = false;
        if (lane < rows) {
            const u32 id = ids[base + lane];
            if ((u64)id >= num_rows) {
                report_fault(fault, FAULT_GATHER_ID, id, num_rows);
            } else {
                const u32 slot = slot_map[id];
                hit = slot != NOT_CACHED;
                miss = !hit;
                src = hit ? (u64)(cache + (u64)slot * dim) : (u64)(host_rows + (u64)id * dim);
            }
        }
        const u32 h = __ballot_sync(FULL_MASK, hit), m = __ballot_sync(FULL_MASK, miss);
        if (lane == 0) {
            if (h) atomicAdd(hits_s, (u32)__popc(h));
            if (m) atomicAdd(misses_s, (u32)__popc(m));
        }
        for (u32 k = 0; k < rows; k += GATHER_UNROLL) {
            u64 s[GATHER_UNROLL];
            for (u32 q = 0; q < GATHER_UNROLL; ++q) s[q] = __shfl_sync(FULL_MASK, src, (int)((k + q) & 31u));
            const u32 live = min((u32)GATHER_UNROLL, rows - k);
            if (wide) {
                for (u64 c = lane; c < units; c += WARP_SIZE) {
                    uint4 v[GATHER_UNROLL];
                    for (u32 q = 0; q < GATHER_UNROLL; ++q) {
                        v[q] = make_uint4(0u, 0u, 0u, 0u);
                        if (q < live && s[q] != 0) v[q] = reinterpret_cast<const uint4*>(s[q])[c];
                    }
                    for (u32 q = 0; q < live; ++q) store_unit(out + (base + k + q) * dim, c, v[q], cache);
                }
            } else {
                for (u32 q = 0; q < live; ++q) {
                    float* dst = out + (base + k + q) * dim;
                    if (s[q] == 0) {
                        warp_zero_row(dst, dim);
                    } else {
                        const T* row = reinterpret_cast<const T*>(s[q]);
                        for (u64 c = lane; c < dim; c += WARP_SIZE) dst[c] = to_float(row[c]);
                    }
                }
            }
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
