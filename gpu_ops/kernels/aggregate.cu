// Neighbor aggregation over a block (sum, mean, GCN-normalized), forward and
// backward, and the block's degree data. Host twin: cpu_ops::aggregate (formulas in
// its module doc; degrees counted in the block and clamped to >= 1 where they divide).
//
// A block on the device: indptr (num_dst + 1 u64), indices (num_edges u32 local source
// ids), out_deg (num_src u32) and src_w (num_src f32, 1 / sqrt(max(d_out, 1))).
#include "common.cuh"

#define KIND_SUM 0u
#define KIND_MEAN 1u
#define KIND_GCN 2u

// out_deg[indices[e]] += 1 (out_deg zeroed by the host). Integer atomics: exact.
extern "C" __global__ void block_out_degree(const u32* indices, u64 num_edges, u32* out_deg) {
    for (u64 e = thread_index(); e < num_edges; e += thread_count()) {
        atomicAdd(&out_deg[indices[e]], 1u);
    }
}

// src_w[j] = 1 / sqrt(max(out_deg[j], 1)), computed in f64 as the host does.
extern "C" __global__ void block_src_weight(const u32* out_deg, u64 num_src, float* src_w) {
    for (u64 j = thread_index(); j < num_src; j += thread_count()) {
        const u32 d = out_deg[j] > 0 ? out_deg[j] : 1u;
        src_w[j] = (float)(1.0 / sqrt((double)d));
    }
}

// The destination factor of row i: 1 (sum), 1 / max(d_in, 1) (mean) or
// 1 / sqrt(max(d_in, 1)) (gcn), computed in f64 as the host does.
__device__ __forceinline__ float dst_factor(u32 kind, u64 d_in) {
    const double d = (double)(d_in > 0 ? d_in : 1);
    if (kind == KIND_MEAN) return (float)(1.0 / d);
    if (kind == KIND_GCN) return (float)(1.0 / sqrt(d));
    return 1.0f;
}

// out[i] = post(i) · Σ_{e in row i} w(j) x[j], w(j) = src_w[j] for gcn, else 1.
// One warp per destination row; lanes over columns (float4 when aligned).
extern "C" __global__ void aggregate_forward(const u64* indptr, const u32* indices,
                                             const float* src_w, u64 num_dst, u64 dim, u32 kind,
                                             const float* x, float* out) {
    const u32 lane = lane_id();
    const bool gcn = kind == KIND_GCN;
    const bool vec4 = (dim & 3) == 0 && ((((u64)x) | ((u64)out)) & 15) == 0;
    for (u64 i = warp_index(); i < num_dst; i += warp_count()) {
        const u64 e0 = indptr[i];
        const u64 e1 = indptr[i + 1];
        const float post = dst_factor(kind, e1 - e0);
        if (vec4) {
            const u64 d4 = dim / 4;
            const float4* x4 = reinterpret_cast<const float4*>(x);
            float4* o4 = reinterpret_cast<float4*>(out + i * dim);
            for (u64 c = lane; c < d4; c += WARP_SIZE) {
                float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (u64 e = e0; e < e1; ++e) {
                    const u64 j = indices[e];
                    const float w = gcn ? src_w[j] : 1.0f;
                    const float4 v = x4[j * d4 + c];
                    acc.x += w * v.x;
                    acc.y += w * v.y;
                    acc.z += w * v.z;
                    acc.w += w * v.w;
                }
                o4[c] = make_float4(acc.x * post, acc.y * post, acc.z * post, acc.w * post);
            }
        } else {
            float* o = out + i * dim;
            for (u64 c = lane; c < dim; c += WARP_SIZE) {
                float acc = 0.0f;
                for (u64 e = e0; e < e1; ++e) {
                    const u64 j = indices[e];
                    const float w = gcn ? src_w[j] : 1.0f;
                    acc += w * x[j * dim + c];
                }
                o[c] = acc * post;
            }
        }
    }
}

// grad_x[j] += c_e · grad_out[i] for every edge e = (j → i), c_e = post(i) · w(j);
// grad_x must be zeroed first. One warp per destination row; float atomics, so the
// summation order (and the last bits) vary from run to run.
extern "C" __global__ void aggregate_backward(const u64* indptr, const u32* indices,
                                              const float* src_w, u64 num_dst, u64 dim,
                                              u32 kind, const float* grad_out, float* grad_x) {
    const u32 lane = lane_id();
    const bool gcn = kind == KIND_GCN;
    for (u64 i = warp_index(); i < num_dst; i += warp_count()) {
        const u64 e0 = indptr[i];
        const u64 e1 = indptr[i + 1];
        const float post = dst_factor(kind, e1 - e0);
        const float* g = grad_out + i * dim;
        for (u64 e = e0; e < e1; ++e) {
            const u64 j = indices[e];
            const float coef = gcn ? post * src_w[j] : post;
            float* gx = grad_x + j * dim;
            for (u64 c = lane; c < dim; c += WARP_SIZE) atomicAdd(&gx[c], coef * g[c]);
        }
    }
}

// The block with a self-loop per destination: row i of the new block is row i of the
// old one followed by source i (new_indptr[i] = indptr[i] + i). One warp per row.
extern "C" __global__ void block_add_self_loops(const u64* indptr, const u32* indices,
                                                u64 num_dst, u64* new_indptr,
                                                u32* new_indices) {
    const u32 lane = lane_id();
    for (u64 i = warp_index(); i <= num_dst; i += warp_count()) {
        const u64 e0 = indptr[i];
        if (lane == 0) new_indptr[i] = e0 + i;
        if (i == num_dst) continue;
        const u64 e1 = indptr[i + 1];
        const u64 out = e0 + i;
        for (u64 e = e0 + lane; e < e1; e += WARP_SIZE) new_indices[out + (e - e0)] = indices[e];
        if (lane == 0) new_indices[out + (e1 - e0)] = (u32)i;
    }
}
