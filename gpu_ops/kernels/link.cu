// Link prediction: the pair decoders' row products and their backwards, the
// binary cross-entropy on logits (per pair; summed by math.cu's xent_reduce),
// negative sampling and the removal of excluded edges from a block. Host twins:
// cpu_ops::link (formulas in its module doc).
//
// Pairs index rows of a row-major `rows × dim` matrix h; an id not below `rows`
// is skipped (its output is 0) and reported through the fault word.
#include "common.cuh"

// Whether pair p's ids are rows of h (lane 0 reports the first bad one).
__device__ __forceinline__ bool pair_ok(u32 s, u32 d, u64 rows, u32* fault) {
    if ((u64)s < rows && (u64)d < rows) return true;
    if (lane_id() == 0) report_fault(fault, FAULT_PAIR_INDEX, (u64)s < rows ? d : s, rows);
    return false;
}

// out[p] = <h[src[p]], h[dst[p]]>: one warp per pair, lanes over columns.
extern "C" __global__ void pair_dot(const float* h, u64 rows, u64 dim, const u32* src,
                                    const u32* dst, u64 n, float* out, u32* fault) {
    const u32 lane = lane_id();
    for (u64 p = warp_index(); p < n; p += warp_count()) {
        const u32 s = src[p], d = dst[p];
        float acc = 0.0f;
        if (pair_ok(s, d, rows, fault)) {
            const float* a = h + (u64)s * dim;
            const float* b = h + (u64)d * dim;
            for (u64 c = lane; c < dim; c += WARP_SIZE) acc += a[c] * b[c];
        }
        acc = warp_sum(acc);
        if (lane == 0) out[p] = acc;
    }
}

// dh[src[p]] += dscore[p] · h[dst[p]], dh[dst[p]] += dscore[p] · h[src[p]]:
// one warp per pair, float atomics (rows in several pairs sum in any order).
extern "C" __global__ void pair_dot_backward(const float* h, u64 rows, u64 dim, const u32* src,
                                             const u32* dst, u64 n, const float* dscore,
                                             float* dh, u32* fault) {
    const u32 lane = lane_id();
    for (u64 p = warp_index(); p < n; p += warp_count()) {
        const u32 s = src[p], d = dst[p];
        if (!pair_ok(s, d, rows, fault)) continue;
        const float g = dscore[p];
        const u64 rs = (u64)s * dim, rd = (u64)d * dim;
        for (u64 c = lane; c < dim; c += WARP_SIZE) {
            atomicAdd(&dh[rs + c], g * h[rd + c]);
            atomicAdd(&dh[rd + c], g * h[rs + c]);
        }
    }
}

// Row p of out = h[src[p]] ⊙ h[dst[p]]: one warp per pair.
extern "C" __global__ void pair_hadamard(const float* h, u64 rows, u64 dim, const u32* src,
                                         const u32* dst, u64 n, float* out, u32* fault) {
    const u32 lane = lane_id();
    for (u64 p = warp_index(); p < n; p += warp_count()) {
        const u32 s = src[p], d = dst[p];
        float* o = out + p * dim;
        if (!pair_ok(s, d, rows, fault)) {
            warp_zero_row(o, dim);
            continue;
        }
        const float* a = h + (u64)s * dim;
        const float* b = h + (u64)d * dim;
        for (u64 c = lane; c < dim; c += WARP_SIZE) o[c] = a[c] * b[c];
    }
}

// dh[src[p]] += dz[p] ⊙ h[dst[p]], dh[dst[p]] += dz[p] ⊙ h[src[p]]: one warp
// per pair, float atomics.
extern "C" __global__ void pair_hadamard_backward(const float* h, u64 rows, u64 dim,
                                                  const u32* src, const u32* dst, u64 n,
                                                  const float* dz, float* dh, u32* fault) {
    const u32 lane = lane_id();
    for (u64 p = warp_index(); p < n; p += warp_count()) {
        const u32 s = src[p], d = dst[p];
        if (!pair_ok(s, d, rows, fault)) continue;
        const float* g = dz + p * dim;
        const u64 rs = (u64)s * dim, rd = (u64)d * dim;
        for (u64 c = lane; c < dim; c += WARP_SIZE) {
            atomicAdd(&dh[rs + c], g[c] * h[rd + c]);
            atomicAdd(&dh[rd + c], g[c] * h[rs + c]);
        }
    }
}

// Per pair: row_loss = max(x, 0) − x·y + log1p(exp(−|x|)), row_correct =
// (x > 0) == (y > 0.5), and (when has_grad) grad = (σ(x) − y) · inv_n. The sum
// is math.cu's xent_reduce (fixed order, f64, the deferred-loss guard).
extern "C" __global__ void bce_rows(const float* logits, const float* labels, u64 n, float* grad,
                                    u32 has_grad, float inv_n, float* row_loss,
                                    u32* row_correct) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const float x = logits[i], y = labels[i];
        row_loss[i] = __fadd_rn(fmaxf(x, 0.0f) - __fmul_rn(x, y), log1pf(expf(-fabsf(x))));
        row_correct[i] = (x > 0.0f) == (y > 0.5f) ? 1u : 0u;
        if (has_grad) {
            float s;
            if (x >= 0.0f) {
                s = 1.0f / (1.0f + expf(-x));
            } else {
                const float e = expf(x);
                s = e / (1.0f + e);
            }
            grad[i] = (s - y) * inv_n;
        }
    }
}

// Negative t = i·k + j (t < n_pos·k): out_src[t] = src[i] and out_dst[t] =
// uniform_below(bits, num_vertices), or (has_cdf) the v with cdf[v] <= r <
// cdf[v + 1] for r = uniform_below(bits, cdf[num_vertices]), bits =
// hash_draw(key, t). Integer arithmetic only: cpu_ops::sample_negatives draws
// the same vertices.
extern "C" __global__ void negative_draw(const u32* src, u64 n_pos, u64 k, u64 key,
                                         u64 num_vertices, const u64* cdf, u32 has_cdf,
                                         u32* out_src, u32* out_dst) {
    const u64 total = n_pos * k;
    for (u64 t = thread_index(); t < total; t += thread_count()) {
        out_src[t] = src[t / k];
        const u64 bits = hash_draw(key, t);
        u64 v;
        if (has_cdf) {
            const u64 r = uniform_below(bits, cdf[num_vertices]);
            u64 lo = 0, hi = num_vertices;
            while (hi - lo > 1) {
                const u64 mid = lo + (hi - lo) / 2;
                if (cdf[mid] <= r) lo = mid; else hi = mid;
            }
            v = lo;
        } else {
            v = uniform_below(bits, num_vertices);
        }
        out_dst[t] = (u32)v;
    }
}

// flags[e] = 0 when edge e (destination i, local source j) has its key
// (src_ids[i] << 32 | src_ids[j]) among the sorted keys, else 1; one warp per
// destination. flags[num_edges] is the host's (0, so the scan's last value is
// the kept count).
extern "C" __global__ void exclude_flag(const u64* indptr, const u32* indices, u64 num_dst,
                                        const u32* src_ids, const u64* keys, u64 n_keys,
                                        u32* flags) {
    for (u64 i = warp_index(); i < num_dst; i += warp_count()) {
        const u64 hi_word = (u64)src_ids[i] << 32;
        for (u64 e = indptr[i] + lane_id(); e < indptr[i + 1]; e += WARP_SIZE) {
            const u64 key = hi_word | (u64)src_ids[indices[e]];
            u64 lo = 0, hi = n_keys;  // first key >= key
            while (lo < hi) {
                const u64 mid = lo + (hi - lo) / 2;
                if (keys[mid] < key) lo = mid + 1; else hi = mid;
            }
            flags[e] = (lo < n_keys && keys[lo] == key) ? 0u : 1u;
        }
    }
}

// The block compacted by the exclusive scan `pos` of the flags (num_edges + 1
// values): kept edge e goes to new_indices[pos[e]], new_indptr[i] =
// pos[indptr[i]] for i <= num_dst.
extern "C" __global__ void exclude_compact(const u64* indptr, const u32* indices, u64 num_dst,
                                           u64 num_edges, const u32* pos, u64* new_indptr,
                                           u32* new_indices) {
    const u64 items = num_edges > num_dst + 1 ? num_edges : num_dst + 1;
    for (u64 t = thread_index(); t < items; t += thread_count()) {
        if (t < num_edges && pos[t + 1] != pos[t]) new_indices[pos[t]] = indices[t];
        if (t <= num_dst) new_indptr[t] = pos[indptr[t]];
    }
}
