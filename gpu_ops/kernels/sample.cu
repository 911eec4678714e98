// Neighbor sampling without replacement and unique relabeling, on the device.
// Host twin: cpu_ops::sampler (same block layout; different random generator).
//
// Sizes: every array is sized by a capacity the host knows (`n`, `n_a`, `n_b`);
// how much of it is live may be a count on the device (`live_*`: null = all of
// it; a count above the capacity is clamped here and reported by the host), so a
// layer can be sized by a bound and sampled from a frontier whose size only the
// device knows. Positions past the live count are never read.
//
// One layer, from a frontier of destinations (global ids):
// 1. `sample_count_scan`: counts[i] = min(fanout, degree(frontier[i])) for live i
//    (0 when the optional skip mask, null = none, has skip[i] != 0; 0 past the live
//    destinations and at i = n), scanned in the same pass (scan tiles, common.cuh)
//    into the block's indptr (n + 1 entries, indptr[n] = the edge count). One launch
//    up to SCAN_TILE - 1 destinations; beyond, the host scans the tile sums and adds.
// 2. `sample_pick`: one warp per destination writes its sampled neighbors (global
//    ids, in the order they appear in the graph's row) into nbrs[indptr[i]..].
//    degree <= fanout takes the whole row. Otherwise Floyd's algorithm draws
//    k = fanout distinct positions of the row, draw c of destination v being
//    hash_draw(hash_key(layer_key, v), c) (counter-based: independent of the launch
//    shape), then each position is placed by its rank among the k (row order).
//    For k <= 32 the picks stay in registers (pick c in lane c): a warp vote per
//    draw and a shuffle per rank comparison, no scratch memory.
// 3. unique relabel (`unique_*` below) of frontier ++ nbrs.
#include "common.cuh"

// The live count of an array of capacity n: n, or the device count `live`
// (clamped to n).
__device__ __forceinline__ u64 live_count(u64 n, const u64* live) {
    if (live == nullptr) return n;
    const u64 l = *live;
    return l < n ? l : n;
}

// `skip`: null, or n flags; a destination with a non-zero flag samples nothing (its
// vertex is still range-checked, as the host sampler checks every destination).
// Launch: one block of SCAN_THREADS per SCAN_TILE of the n + 1 entries; tile_sums
// (one per tile) may be null with a single tile.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) sample_count_scan(const u64* graph_indptr, u64 num_vertices,
                                             const u32* frontier, u64 n, const u64* live_n,
                                             u32 fanout, const u8* skip, u64* indptr,
                                             u64* tile_sums, u32* fault) {
    const u64 live = live_count(n, live_n);
    const auto count = [=](u64 i) -> u64 {
        if (i >= live) return 0;
        const u32 v = frontier[i];
        if ((u64)v >= num_vertices) {
            report_fault(fault, FAULT_SAMPLE_VERTEX, v, num_vertices);
            return 0;
        }
        if (skip != nullptr && skip[i] != 0) return 0;
        const u64 deg = graph_indptr[v + 1] - graph_indptr[v];
        return deg < (u64)fanout ? deg : (u64)fanout;
    };
    scan_tile_with<u64>(count, n + 1, indptr, tile_sums);
}

// `positions`: scratch of the same length as `nbrs`, used only by destinations with
// k > 32 (null when the fanout is at most 32). Invalid frontier vertices and skipped
// destinations were given 0 edges by sample_count_scan and are skipped, as are the
// destinations past the live count.
extern "C" __global__ void sample_pick(const u64* graph_indptr, const u32* graph_indices,
                                       u64 num_vertices, const u32* frontier, u64 n,
                                       const u64* live_n, u64 layer_key,
                                       const u64* block_indptr, u32* positions, u32* nbrs) {
    const u32 lane = lane_id();
    const u64 live = live_count(n, live_n);
    for (u64 i = warp_index(); i < live; i += warp_count()) {
        const u32 v = frontier[i];
        if ((u64)v >= num_vertices) continue;
        const u64 row = graph_indptr[v];
        const u64 deg = graph_indptr[(u64)v + 1] - row;
        const u64 base = block_indptr[i];
        const u64 k = block_indptr[i + 1] - base;
        if (k == 0) continue;
        if (k >= deg) {
            for (u64 t = lane; t < deg; t += WARP_SIZE) nbrs[base + t] = graph_indices[row + t];
            continue;
        }
        // Floyd: for j = deg − k .. deg − 1, draw t in [0, j]; take t unless already
        // taken, else take j. Every lane computes the same draw.
        const u64 key = hash_key(layer_key, v);
        if (k <= WARP_SIZE) {
            // Pick c lives in lane c's register: membership is one vote, no memory.
            u32 mine = 0xffffffffu;
            u64 c = 0;
            for (u64 j = deg - k; j < deg; ++j, ++c) {
                const u32 t = (u32)uniform_below(hash_draw(key, c), j + 1);
                const bool seen = __any_sync(FULL_MASK, (u64)lane < c && mine == t);
                if ((u64)lane == c) mine = seen ? (u32)j : t;
            }
            // Place each position by its rank among the k (distinct): row order.
            u32 rank = 0;
            for (u32 x = 0; x < (u32)k; ++x) rank += __shfl_sync(FULL_MASK, mine, (int)x) < mine;
            if ((u64)lane < k) nbrs[base + rank] = graph_indices[row + mine];
            continue;
        }
        // k > 32: the picks in `positions`; the lanes check membership in
        // parallel; lane 0 appends.
        u32* pos = positions + base;
        u64 c = 0;
        for (u64 j = deg - k; j < deg; ++j, ++c) {
            const u32 t = (u32)uniform_below(hash_draw(key, c), j + 1);
            bool seen = false;
            for (u64 q = lane; q < c; q += WARP_SIZE) seen |= pos[q] == t;
            seen = __any_sync(FULL_MASK, seen);
            if (lane == 0) pos[c] = seen ? (u32)j : t;
            __syncwarp();
        }
        for (u64 q = lane; q < k; q += WARP_SIZE) {
            const u32 p = pos[q];
            u64 rank = 0;
            for (u64 x = 0; x < k; ++x) rank += pos[x] < p ? 1 : 0;
            nbrs[base + rank] = graph_indices[row + p];
        }
    }
}

// ---- unique relabel ------------------------------------------------------------------
// Input: the sequence s = a ++ b (a = targets, distinct; b = candidates) laid out by
// capacity: position p < n_a is target p, position n_a + q is candidate q; of them
// the first live_a targets and live_b candidates are present (`live_count`), the
// other positions are dead and never read. An open-addressing table of cap = 2^k >=
// 2 (n_a + n_b) slots (+1 extra slot for the id 0xffffffff, which is the empty-key
// marker) maps each id to the smallest position where it occurs:
// 1. `unique_insert`: per live position, find or claim the id's slot (atomicCAS,
//    linear probing), remember it in slot_of[p], atomicMin(min_pos[slot], p).
// 2. `unique_flag_scan`: the first-occurrence flags [min_pos[slot_of[p]] == p] of
//    the live positions (0 for dead ones and at p = n_a + n_b) scanned in the same
//    pass into ranks (n_a + n_b + 1 entries; ranks[n_a + n_b] = the unique count).
//    One launch up to SCAN_TILE - 1 positions, else tiles + the host's scan of their
//    sums + `scan_u32_add`.
// 3. `unique_scatter`: unique[ranks[p]] = s[p] for first occurrences (ranks[p + 1]
//    != ranks[p]) below the unique capacity, local[q] = ranks[min_pos[slot_of[n_a +
//    q]]] for every live candidate q, and the counts the host reads (one read,
//    `counts` below).
// Dead positions are flagged 0, so the ranks compact the live ones: the result is
// that of the live targets followed by the live candidates, in the sequential
// first-occurrence order. Every step is a function of the input alone
// (deterministic).
#define EMPTY_KEY 0xffffffffu

__device__ __forceinline__ u32 seq_at(const u32* a, u64 n_a, const u32* b, u64 p) {
    return p < n_a ? a[p] : b[p - n_a];
}

// Whether position p (< n_a + n_b) is present.
__device__ __forceinline__ bool seq_live(u64 p, u64 n_a, u64 la, u64 lb) {
    return p < n_a ? p < la : p - n_a < lb;
}

extern "C" __global__ void unique_insert(const u32* a, u64 n_a, const u64* live_a,
                                         const u32* b, u64 n_b, const u64* live_b,
                                         u32* keys, u32* min_pos, u64 cap, u32* slot_of) {
    const u64 la = live_count(n_a, live_a), lb = live_count(n_b, live_b);
    const u64 end = n_a + lb;
    for (u64 p = thread_index(); p < end; p += thread_count()) {
        if (!seq_live(p, n_a, la, lb)) continue;
        const u32 id = seq_at(a, n_a, b, p);
        u64 slot;
        if (id == EMPTY_KEY) {
            slot = cap;  // the extra slot
        } else {
            slot = mix64((u64)id) & (cap - 1);
            // The table is at most half full, so this ends within cap probes.
            for (u64 probe = 0; probe < cap; ++probe) {
                const u32 prev = atomicCAS(&keys[slot], EMPTY_KEY, id);
                if (prev == EMPTY_KEY || prev == id) break;
                slot = (slot + 1) & (cap - 1);
            }
        }
        slot_of[p] = (u32)slot;
        atomicMin(&min_pos[slot], (u32)p);
    }
}

// Launch: one block of SCAN_THREADS per SCAN_TILE of the n_a + n_b + 1 entries;
// tile_sums may be null with a single tile.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) unique_flag_scan(const u32* slot_of, const u32* min_pos, u64 n_a,
                                            const u64* live_a, u64 n_b, const u64* live_b,
                                            u32* ranks, u32* tile_sums) {
    const u64 la = live_count(n_a, live_a), lb = live_count(n_b, live_b);
    const u64 all = n_a + n_b;
    const auto flag = [=](u64 p) -> u32 {
        return p < all && seq_live(p, n_a, la, lb) && min_pos[slot_of[p]] == (u32)p ? 1u : 0u;
    };
    scan_tile_with<u32>(flag, all + 1, ranks, tile_sums);
}

// `unique` holds unique_cap ids (a first occurrence ranked beyond is not written;
// the count says so). `counts` (4 entries, written by thread 0): [0] = the
// candidates present (*live_b unclamped, so the host can check it against n_b;
// n_b without live_b), [1] = ranks[n_a] (the distinct live targets: all of them
// when they are distinct), [2] = ranks[n_a + n_b] (the unique count), [3] = the
// targets present (*live_a unclamped; n_a without live_a).
extern "C" __global__ void unique_scatter(const u32* a, u64 n_a, const u64* live_a,
                                          const u32* b, u64 n_b, const u64* live_b,
                                          const u32* slot_of, const u32* min_pos,
                                          const u32* ranks, u64 unique_cap, u32* unique,
                                          u32* local, u64* counts) {
    const u64 la = live_count(n_a, live_a), lb = live_count(n_b, live_b);
    const u64 end = n_a + lb;
    if (thread_index() == 0) {
        counts[0] = live_b == nullptr ? n_b : *live_b;
        counts[1] = ranks[n_a];
        counts[2] = ranks[n_a + n_b];
        counts[3] = live_a == nullptr ? n_a : *live_a;
    }
    for (u64 p = thread_index(); p < end; p += thread_count()) {
        if (!seq_live(p, n_a, la, lb)) continue;
        // ranks is the exclusive scan of the first-occurrence flags, so position p
        // was flagged iff its rank steps up after it.
        const u32 r = ranks[p];
        if (ranks[p + 1] != r && (u64)r < unique_cap) unique[r] = seq_at(a, n_a, b, p);
        if (p >= n_a) local[p - n_a] = ranks[min_pos[slot_of[p]]];
    }
}
