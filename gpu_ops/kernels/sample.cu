// Neighbor sampling without replacement and unique relabeling, on the device.
// Host twin: cpu_ops::sampler (same block layout; different random generator).
//
// One layer, from a frontier of destinations (global ids):
// 1. `sample_count`: counts[i] = min(fanout, degree(frontier[i])), or 0 when the
//    optional skip mask (null = none) has skip[i] != 0; counts[n] = 0. The host scans
//    counts into the block's indptr (n + 1 entries).
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

// `skip`: null, or n flags; a destination with a non-zero flag samples nothing (its
// vertex is still range-checked, as the host sampler checks every destination).
extern "C" __global__ void sample_count(const u64* graph_indptr, u64 num_vertices,
                                        const u32* frontier, u64 n, u32 fanout,
                                        const u8* skip, u64* counts, u32* fault) {
    for (u64 i = thread_index(); i <= n; i += thread_count()) {
        if (i == n) {
            counts[n] = 0;
            continue;
        }
        const u32 v = frontier[i];
        if ((u64)v >= num_vertices) {
            report_fault(fault, FAULT_SAMPLE_VERTEX, v, num_vertices);
            counts[i] = 0;
            continue;
        }
        if (skip != nullptr && skip[i] != 0) {
            counts[i] = 0;
            continue;
        }
        const u64 deg = graph_indptr[v + 1] - graph_indptr[v];
        counts[i] = deg < (u64)fanout ? deg : (u64)fanout;
    }
}

// `positions`: scratch of the same length as `nbrs`, used only by destinations with
// k > 32 (null when the fanout is at most 32). Invalid frontier vertices and skipped
// destinations were given 0 edges by sample_count and are skipped.
extern "C" __global__ void sample_pick(const u64* graph_indptr, const u32* graph_indices,
                                       u64 num_vertices, const u32* frontier, u64 n,
                                       u64 layer_key, const u64* block_indptr, u32* positions,
                                       u32* nbrs) {
    const u32 lane = lane_id();
    for (u64 i = warp_index(); i < n; i += warp_count()) {
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
// Input: the sequence s = a ++ b (a = targets, distinct; b = candidates), N = n_a + n_b
// positions. An open-addressing table of cap = 2^k >= 2N slots (+1 extra slot for the
// id 0xffffffff, which is the empty-key marker) maps each id to the smallest position
// where it occurs:
// 1. `unique_insert`: per position, find or claim the id's slot (atomicCAS, linear
//    probing), remember it in slot_of[p], atomicMin(min_pos[slot], p).
// 2. `unique_flag`: flags[p] = [min_pos[slot_of[p]] == p] (first occurrences) for
//    p < N, and 0 for N <= p <= n_a + n_b (so the flags need no zeroing);
// 3. the host scans the n_a + n_b + 1 flags in place into ranks (ranks[N] and every
//    later entry = the unique count);
// 4. `unique_scatter`: unique[ranks[p]] = s[p] for first occurrences (ranks[p + 1] !=
//    ranks[p]), and
//    local[q] = ranks[min_pos[slot_of[n_a + q]]] for every candidate q.
// `live_b`: null, or a device count of the candidates actually present (at most n_b;
// n_b is then the capacity the buffers were sized by). Sampling passes the edge count
// its scan left on the device, so the host sizes everything by an upper bound and
// reads the counts once, after the flags are scanned (`relabel_counts`).
// Every step is a function of the input alone, so the result is deterministic (and
// equals the sequential first-occurrence order).
#define EMPTY_KEY 0xffffffffu

__device__ __forceinline__ u32 seq_at(const u32* a, u64 n_a, const u32* b, u64 p) {
    return p < n_a ? a[p] : b[p - n_a];
}

// The candidates present: n_b, or the device count `live_b` (clamped to n_b).
__device__ __forceinline__ u64 live_count(u64 n_b, const u64* live_b) {
    if (live_b == nullptr) return n_b;
    const u64 live = *live_b;
    return live < n_b ? live : n_b;
}

extern "C" __global__ void unique_insert(const u32* a, u64 n_a, const u32* b, u64 n_b,
                                         const u64* live_b, u32* keys, u32* min_pos, u64 cap,
                                         u32* slot_of) {
    const u64 total = n_a + live_count(n_b, live_b);
    for (u64 p = thread_index(); p < total; p += thread_count()) {
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

// Writes all n_a + n_b + 1 flags (the scan's input): 0 past the live positions.
extern "C" __global__ void unique_flag(const u32* slot_of, const u32* min_pos, u64 n_a,
                                       u64 n_b, const u64* live_b, u32* flags) {
    const u64 total = n_a + live_count(n_b, live_b);
    const u64 all = n_a + n_b;
    for (u64 p = thread_index(); p <= all; p += thread_count()) {
        flags[p] = p < total && min_pos[slot_of[p]] == (u32)p ? 1u : 0u;
    }
}

extern "C" __global__ void unique_scatter(const u32* a, u64 n_a, const u32* b, u64 n_b,
                                          const u64* live_b, const u32* slot_of,
                                          const u32* min_pos, const u32* ranks, u32* unique,
                                          u32* local) {
    const u64 total = n_a + live_count(n_b, live_b);
    for (u64 p = thread_index(); p < total; p += thread_count()) {
        // ranks is the exclusive scan of the first-occurrence flags (total + 1
        // entries), so position p was flagged iff its rank steps up after it.
        if (ranks[p + 1] != ranks[p]) unique[ranks[p]] = seq_at(a, n_a, b, p);
        if (p >= n_a) local[p - n_a] = ranks[min_pos[slot_of[p]]];
    }
}

// The three counts the host needs after the flags are scanned, for one read:
// out[0] = the candidates present (*live_b unclamped, so the host can check it
// against the capacity; n_b without live_b), out[1] = ranks[n_a] (the distinct
// targets: n_a when they are distinct), out[2] = ranks[n_a + n_b] (the unique count).
// One thread.
extern "C" __global__ void relabel_counts(const u64* live_b, u64 n_b, const u32* ranks,
                                          u64 n_a, u64* out) {
    if (thread_index() != 0) return;
    out[0] = live_b == nullptr ? n_b : *live_b;
    out[1] = ranks[n_a];
    out[2] = ranks[n_a + n_b];
}
