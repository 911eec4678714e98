// GAT edge attention over a block (multi-head), forward and backward. Host twin:
// cpu_ops::attention (the formulas and step numbers below follow its module doc).
// Shapes: z is num_src × W with W = heads · head_dim (head h = columns
// [h·F, (h+1)·F)); a_src, a_dst are heads × head_dim; el is num_src × heads, er is
// num_dst × heads; alpha and du are num_edges × heads (edge-major).
#include "common.cuh"

#define NEGATIVE_SLOPE 0.2f

__device__ __forceinline__ float leaky(float u) {
    return u * (u > 0.0f ? 1.0f : NEGATIVE_SLOPE);
}
__device__ __forceinline__ float leaky_slope(float u) {
    return u > 0.0f ? 1.0f : NEGATIVE_SLOPE;
}

// s[r, h] = a_h · z_{r,h} for r < rows; one warp per (row, head).
extern "C" __global__ void gat_scores(const float* z, u64 rows, u64 heads, u64 head_dim,
                                      const float* a, float* s) {
    const u64 width = heads * head_dim;
    const u64 pairs = rows * heads;
    for (u64 p = warp_index(); p < pairs; p += warp_count()) {
        const u64 r = p / heads;
        const u64 h = p % heads;
        const float* zr = z + r * width + h * head_dim;
        const float* ah = a + h * head_dim;
        float acc = 0.0f;
        for (u64 f = lane_id(); f < head_dim; f += WARP_SIZE) acc += ah[f] * zr[f];
        acc = warp_sum(acc);
        if (lane_id() == 0) s[p] = acc;
    }
}

// alpha[e, h] = softmax over the edges into i of LeakyReLU(el[j, h] + er[i, h]);
// one warp per (destination, head).
extern "C" __global__ void gat_softmax(const u64* indptr, const u32* indices, u64 num_dst,
                                       u64 heads, const float* el, const float* er,
                                       float* alpha) {
    const u32 lane = lane_id();
    const u64 pairs = num_dst * heads;
    for (u64 p = warp_index(); p < pairs; p += warp_count()) {
        const u64 i = p / heads;
        const u64 h = p % heads;
        const u64 e0 = indptr[i];
        const u64 e1 = indptr[i + 1];
        if (e0 == e1) continue;
        const float er_ih = er[i * heads + h];
        float m = __int_as_float(0xff800000);  // -inf
        for (u64 e = e0 + lane; e < e1; e += WARP_SIZE) {
            m = fmaxf(m, leaky(el[(u64)indices[e] * heads + h] + er_ih));
        }
        m = warp_max(m);
        float sum = 0.0f;
        for (u64 e = e0 + lane; e < e1; e += WARP_SIZE) {
            const float q = expf(leaky(el[(u64)indices[e] * heads + h] + er_ih) - m);
            alpha[e * heads + h] = q;
            sum += q;
        }
        sum = warp_sum(sum);
        for (u64 e = e0 + lane; e < e1; e += WARP_SIZE) alpha[e * heads + h] /= sum;
    }
}

// out[i, c] = Σ_{e = (j → i)} alpha[e, h(c)] z[j, c]; zero rows without edges. One
// warp per destination; lanes over the W columns.
extern "C" __global__ void gat_aggregate(const u64* indptr, const u32* indices, u64 num_dst,
                                         u64 heads, u64 head_dim, const float* alpha,
                                         const float* z, float* out) {
    const u64 width = heads * head_dim;
    for (u64 i = warp_index(); i < num_dst; i += warp_count()) {
        const u64 e0 = indptr[i];
        const u64 e1 = indptr[i + 1];
        for (u64 c = lane_id(); c < width; c += WARP_SIZE) {
            const u64 h = c / head_dim;
            float acc = 0.0f;
            for (u64 e = e0; e < e1; ++e) {
                acc += alpha[e * heads + h] * z[(u64)indices[e] * width + c];
            }
            out[i * width + c] = acc;
        }
    }
}

// Backward step 1, one warp per (destination i, head h):
// g_e = G_{i,h} · z_{j,h}; ḡ = Σ_e α_e g_e; du_e = α_e (g_e − ḡ) LeakyReLU'(u_e);
// der[i, h] = Σ_e du_e.
extern "C" __global__ void gat_backward_dst(const u64* indptr, const u32* indices, u64 num_dst,
                                            u64 heads, u64 head_dim, const float* z,
                                            const float* grad_out, const float* alpha,
                                            const float* el, const float* er, float* du,
                                            float* der) {
    const u32 lane = lane_id();
    const u64 width = heads * head_dim;
    const u64 pairs = num_dst * heads;
    for (u64 p = warp_index(); p < pairs; p += warp_count()) {
        const u64 i = p / heads;
        const u64 h = p % heads;
        const u64 e0 = indptr[i];
        const u64 e1 = indptr[i + 1];
        const float* g_i = grad_out + i * width + h * head_dim;
        for (u64 e = e0; e < e1; ++e) {
            const float* zj = z + (u64)indices[e] * width + h * head_dim;
            float acc = 0.0f;
            for (u64 f = lane; f < head_dim; f += WARP_SIZE) acc += g_i[f] * zj[f];
            acc = warp_sum(acc);
            if (lane == 0) du[e * heads + h] = acc;
        }
        __syncwarp();
        float gbar = 0.0f;
        for (u64 e = e0 + lane; e < e1; e += WARP_SIZE) gbar += alpha[e * heads + h] * du[e * heads + h];
        gbar = warp_sum(gbar);
        const float er_ih = er[i * heads + h];
        float acc = 0.0f;
        for (u64 e = e0 + lane; e < e1; e += WARP_SIZE) {
            const float u = el[(u64)indices[e] * heads + h] + er_ih;
            const float v = alpha[e * heads + h] * (du[e * heads + h] - gbar) * leaky_slope(u);
            du[e * heads + h] = v;
            acc += v;
        }
        acc = warp_sum(acc);
        if (lane == 0) der[p] = acc;
    }
}

// Backward step 2 (scatter form): for every edge e = (j → i),
// gz[j, c] += α_{e,h(c)} G[i, c] and del[j, h] += du[e, h]; gz and del zeroed first.
// One warp per destination; float atomics (summation order varies run to run).
extern "C" __global__ void gat_backward_src(const u64* indptr, const u32* indices, u64 num_dst,
                                            u64 heads, u64 head_dim, const float* alpha,
                                            const float* grad_out, const float* du, float* gz,
                                            float* del) {
    const u32 lane = lane_id();
    const u64 width = heads * head_dim;
    for (u64 i = warp_index(); i < num_dst; i += warp_count()) {
        const u64 e0 = indptr[i];
        const u64 e1 = indptr[i + 1];
        const float* g_i = grad_out + i * width;
        for (u64 e = e0; e < e1; ++e) {
            const u64 j = indices[e];
            for (u64 c = lane; c < width; c += WARP_SIZE) {
                atomicAdd(&gz[j * width + c], alpha[e * heads + c / head_dim] * g_i[c]);
            }
            for (u64 h = lane; h < heads; h += WARP_SIZE) atomicAdd(&del[j * heads + h], du[e * heads + h]);
        }
    }
}

// Backward step 2, the attention-vector terms: gz[j, c] += del[j, h] a_src[c] +
// [j < num_dst] der[j, h] a_dst[c].
extern "C" __global__ void gat_backward_finish(float* gz, const float* del, const float* der,
                                               const float* a_src, const float* a_dst,
                                               u64 num_src, u64 num_dst, u64 heads,
                                               u64 head_dim) {
    const u64 width = heads * head_dim;
    const u64 n = num_src * width;
    for (u64 idx = thread_index(); idx < n; idx += thread_count()) {
        const u64 j = idx / width;
        const u64 c = idx % width;
        const u64 h = c / head_dim;
        float v = gz[idx] + del[j * heads + h] * a_src[c];
        if (j < num_dst) v += der[j * heads + h] * a_dst[c];
        gz[idx] = v;
    }
}
