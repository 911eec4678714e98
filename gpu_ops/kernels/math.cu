// Dense element-wise math, bias, activations, dropout, softmax cross-entropy, Adam,
// and deterministic column sums. Host twins: cpu_ops::{add_bias, bias_grad, relu,
// elu, dropout, softmax_cross_entropy, Adam}.
#include "common.cuh"

// x[r, c] += bias[c] for r < rows.
extern "C" __global__ void add_bias(float* x, const float* bias, u64 rows, u64 cols) {
    const u64 n = rows * cols;
    for (u64 i = thread_index(); i < n; i += thread_count()) x[i] += bias[i % cols];
}

// Column sums, pass 1: partial[chunk * cols + c] = Σ_{r in chunk} w(r, c) · x[r, c],
// chunks of `chunk_rows` rows (a fixed partition, so the sum order is fixed).
// w(r, c) = w[r * w_stride + c / w_div] when has_w, else 1.
extern "C" __global__ void colsum_partial(const float* x, u64 rows, u64 cols, u64 chunk_rows,
                                          const float* w, u32 has_w, u64 w_stride, u64 w_div,
                                          float* partial) {
    const u64 chunks = (rows + chunk_rows - 1) / chunk_rows;
    const u64 n = chunks * cols;
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const u64 chunk = i / cols;
        const u64 c = i % cols;
        const u64 r0 = chunk * chunk_rows;
        const u64 r1 = min(rows, r0 + chunk_rows);
        float acc = 0.0f;
        if (has_w) {
            for (u64 r = r0; r < r1; ++r) acc += w[r * w_stride + c / w_div] * x[r * cols + c];
        } else {
            for (u64 r = r0; r < r1; ++r) acc += x[r * cols + c];
        }
        partial[i] = acc;
    }
}

// Column sums, pass 2: out[c] (+)= Σ_chunk partial[chunk * cols + c], in chunk order.
extern "C" __global__ void colsum_finish(const float* partial, u64 chunks, u64 cols, float* out,
                                         u32 accumulate) {
    for (u64 c = thread_index(); c < cols; c += thread_count()) {
        float acc = 0.0f;
        for (u64 k = 0; k < chunks; ++k) acc += partial[k * cols + c];
        out[c] = accumulate ? out[c] + acc : acc;
    }
}

// out[i] = float(src[i]) for i < n: bfloat16 bits widened exactly. Each thread takes
// two values (one 4-byte load) when src is 4-byte aligned, else one; an odd last
// value is read alone (never past the buffer).
extern "C" __global__ void widen_bf16(const u16* src, u64 n, float* out) {
    if ((((u64)src) & 3) == 0) {
        const u32* s = reinterpret_cast<const u32*>(src);
        for (u64 i = thread_index(); i < n / 2; i += thread_count()) {
            const u32 w = s[i];
            out[2 * i] = __uint_as_float(w << 16);
            out[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
        }
        if ((n & 1) && thread_index() == 0) out[n - 1] = bf16_to_float(src[n - 1]);
    } else {
        for (u64 i = thread_index(); i < n; i += thread_count()) out[i] = bf16_to_float(src[i]);
    }
}

// x[i] *= alpha for i < n (round to nearest, as on the host: no fused operation).
extern "C" __global__ void scale_in_place(float* x, u64 n, float alpha) {
    for (u64 i = thread_index(); i < n; i += thread_count()) x[i] = __fmul_rn(x[i], alpha);
}

// count[0] += the number of non-finite values (NaN, ±inf: exponent all ones) in x[..n]
// (n < 2^32, checked by the caller). Non-finite values are rare (a diverged step), so
// a thread adds only when it found one.
extern "C" __global__ void count_nonfinite(const float* x, u64 n, u32* count) {
    u32 bad = 0;
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        bad += (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
    }
    if (bad) atomicAdd(count, bad);
}

// ReLU in place: x = x < 0 ? 0 : x (NaN stays NaN, as on the host).
extern "C" __global__ void relu_forward(float* x, u64 n) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const float v = x[i];
        x[i] = v < 0.0f ? 0.0f : v;
    }
}

// dy *= [y > 0].
extern "C" __global__ void relu_backward(const float* y, float* dy, u64 n) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        if (!(y[i] > 0.0f)) dy[i] = 0.0f;
    }
}

// ELU in place: x = x if x > 0, else alpha (e^x − 1).
extern "C" __global__ void elu_forward(float* x, u64 n, float alpha) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const float v = x[i];
        if (!(v > 0.0f)) x[i] = alpha * expm1f(v);
    }
}

// dy *= 1 where y > 0, else y + alpha.
extern "C" __global__ void elu_backward(const float* y, float* dy, u64 n, float alpha) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const float o = y[i];
        if (!(o > 0.0f)) dy[i] *= o + alpha;
    }
}

// Inverted dropout: element i is kept when the top 16 bits of hash_draw(key, i) are
// >= threshold (threshold = round(p · 2^16); 2^16 drops everything), and then scaled.
// One warp per 32-element mask word: lane b handles element 32 w + b, so the warp's
// loads and stores of x are contiguous (coalesced), and bit b of mask[w] — the warp's
// ballot — keeps element 32 w + b. Launched with a warp per word.
extern "C" __global__ void dropout_forward(float* x, u64 n, u32 threshold, float scale, u64 key,
                                           u32* mask) {
    const u64 words = (n + 31) / 32;
    const u32 lane = lane_id();
    for (u64 w = warp_index(); w < words; w += warp_count()) {
        const u64 i = w * 32 + lane;
        const bool in = i < n;
        const u32 draw = in ? (u32)(hash_draw(key, i) >> 48) : 0u;
        const bool keep = in && draw >= threshold;
        const u32 bits = __ballot_sync(FULL_MASK, keep);
        if (in) x[i] = keep ? x[i] * scale : 0.0f;
        if (lane == 0) mask[w] = bits;
    }
}

// dy = mask ? dy · scale : 0.
extern "C" __global__ void dropout_backward(const u32* mask, float* dy, u64 n, float scale) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const u32 keep = (mask[i / 32] >> (u32)(i % 32)) & 1u;
        dy[i] = keep ? dy[i] * scale : 0.0f;
    }
}

// A hidden layer's bias, activation and dropout in one pass (one read of x instead
// of four: add_bias, relu/elu, the copy and dropout_forward). Element i of the
// row-major rows × cols matrix: y = act(x[i] + bias[i % cols]) is written back to
// x (the activation's output, kept for its backward); when has_drop, out[i] = y ·
// scale or 0 with dropout_forward's draw, ballot and mask word. act: 0 = ReLU,
// 1 = ELU(alpha). The arithmetic is the unfused kernels' (round-to-nearest add and
// multiplies, no contraction), so the result equals them bit for bit. Launched
// with a warp per 32-element word.
extern "C" __global__ void bias_act_dropout(float* x, const float* bias, u64 rows, u64 cols,
                                            u32 act, float alpha, u32 has_drop, u32 threshold,
                                            float scale, u64 key, float* out, u32* mask) {
    const u64 n = rows * cols;
    const u64 words = (n + 31) / 32;
    const u32 lane = lane_id();
    for (u64 w = warp_index(); w < words; w += warp_count()) {
        const u64 i = w * 32 + lane;
        const bool in = i < n;
        float y = 0.0f;
        if (in) {
            y = __fadd_rn(x[i], bias[i % cols]);
            if (act == 0) {
                y = y < 0.0f ? 0.0f : y;
            } else if (!(y > 0.0f)) {
                y = __fmul_rn(alpha, expm1f(y));
            }
            x[i] = y;
        }
        if (has_drop) {
            const u32 draw = in ? (u32)(hash_draw(key, i) >> 48) : 0u;
            const bool keep = in && draw >= threshold;
            const u32 bits = __ballot_sync(FULL_MASK, keep);
            if (in) out[i] = keep ? __fmul_rn(y, scale) : 0.0f;
            if (lane == 0) mask[w] = bits;
        }
    }
}

// dropout_backward then the activation's backward from its output y, in one pass:
// g = mask ? dy · scale : 0, then ReLU: g = [y > 0] g, ELU(alpha): g = g (y > 0) or
// g (y + alpha). act as in bias_act_dropout. Equal to the two kernels bit for bit.
extern "C" __global__ void dropout_act_backward(const u32* mask, const float* y, float* dy,
                                                u64 n, float scale, u32 act, float alpha) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        const u32 keep = (mask[i / 32] >> (u32)(i % 32)) & 1u;
        float g = keep ? __fmul_rn(dy[i], scale) : 0.0f;
        const float o = y[i];
        if (!(o > 0.0f)) g = act == 0 ? 0.0f : __fmul_rn(g, __fadd_rn(o, alpha));
        dy[i] = g;
    }
}

// One element of act_backward_colsum: dropout_act_backward's math (has_mask) or
// relu_backward / elu_backward's (g unchanged where y > 0).
__device__ __forceinline__ float act_back_one(float g, float o, u32 keep, u32 has_mask,
                                              float scale, u32 act, float alpha) {
    if (has_mask) g = keep ? __fmul_rn(g, scale) : 0.0f;
    if (!(o > 0.0f)) g = act == 0 ? 0.0f : __fmul_rn(g, __fadd_rn(o, alpha));
    return g;
}

// Threads per block of act_backward_colsum (8 warps; the host launches exactly this).
#define ACT_COLSUM_THREADS 256

// A hidden layer's backward below the layer above, with its bias gradient, in one
// launch: dy (row-major rows × cols) goes through dropout_act_backward when has_mask
// (relu_backward / elu_backward alone otherwise), in place, bit for bit those
// kernels, and out[c] (+)= Σ_r dy[r, c] of the result (the bias gradient).
// Work item = (chunk of chunk_rows rows, tile of 32 columns): lane = column
// tile·32 + lane, warp w sums rows [chunk·chunk_rows + w·sub, + sub) in row order
// (sub = chunk_rows / 8), the 8 warp sums are added in warp order into
// partial[chunk·cols + c], and the last block to finish (ticket[0] counts blocks;
// it must be 0 at launch and is 0 again after) adds the chunks in order into out.
// Fixed order throughout: deterministic for a given chunk_rows (a multiple of 8).
extern "C" __global__ void act_backward_colsum(const u32* mask, u32 has_mask, const float* y,
                                               float* dy, u64 rows, u64 cols, float scale,
                                               u32 act, float alpha, u64 chunk_rows,
                                               float* partial, u32* ticket, float* out,
                                               u32 accumulate) {
    __shared__ float sums[ACT_COLSUM_THREADS];
    __shared__ u32 last;
    const u32 lane = lane_id();
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u64 sub = chunk_rows / (ACT_COLSUM_THREADS / WARP_SIZE);
    const u64 chunks = (rows + chunk_rows - 1) / chunk_rows;
    const u64 tiles = (cols + WARP_SIZE - 1) / WARP_SIZE;
    for (u64 item = blockIdx.x; item < chunks * tiles; item += gridDim.x) {
        const u64 chunk = item / tiles;
        const u64 c = (item % tiles) * WARP_SIZE + lane;
        const u64 r0 = chunk * chunk_rows + warp * sub;
        const u64 r1 = min(rows, r0 + sub);
        float acc = 0.0f;
        if (c < cols) {
            // 4 rows at a time: their loads are issued before any store (dy may
            // alias nothing, but the compiler cannot know), then the same per-row
            // math and the same row order of the sum as one row at a time.
            u64 r = r0;
            for (; r + 4 <= r1; r += 4) {
                float g[4], o[4];
                u32 keep[4];
#pragma unroll
                for (u32 j = 0; j < 4; ++j) {
                    const u64 i = (r + j) * cols + c;
                    g[j] = dy[i];
                    o[j] = y[i];
                    keep[j] = has_mask ? (mask[i / 32] >> (u32)(i % 32)) & 1u : 1u;
                }
#pragma unroll
                for (u32 j = 0; j < 4; ++j) {
                    const float v = act_back_one(g[j], o[j], keep[j], has_mask, scale, act, alpha);
                    dy[(r + j) * cols + c] = v;
                    acc = __fadd_rn(acc, v);
                }
            }
            for (; r < r1; ++r) {
                const u64 i = r * cols + c;
                const u32 keep = has_mask ? (mask[i / 32] >> (u32)(i % 32)) & 1u : 1u;
                const float v = act_back_one(dy[i], y[i], keep, has_mask, scale, act, alpha);
                dy[i] = v;
                acc = __fadd_rn(acc, v);
            }
        }
        sums[threadIdx.x] = acc;
        __syncthreads();
        if (warp == 0 && c < cols) {
            float t = 0.0f;
            for (u32 w = 0; w < ACT_COLSUM_THREADS / WARP_SIZE; ++w)
                t = __fadd_rn(t, sums[w * WARP_SIZE + lane]);
            partial[chunk * cols + c] = t;
        }
        __syncthreads();
    }
    // Publish this block's partials, then take a ticket: the last block sums them.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1 ? 1u : 0u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float* part = partial;
    for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
        float t = 0.0f;
        for (u64 k = 0; k < chunks; ++k) t = __fadd_rn(t, part[k * cols + c]);
        out[c] = accumulate ? __fadd_rn(out[c], t) : t;
    }
    if (threadIdx.x == 0) *ticket = 0u;
}

// Softmax cross-entropy, one warp per row: row_loss[r] = lse_r − z[r, y_r] (computed
// as (m − z_y) + ln Σ exp(z − m)), row_correct[r] = [first arg-max == y_r], and, when
// has_grad, grad[r, j] = (softmax_j − [j = y_r]) · inv_rows. A label >= classes is a
// fault (the row gets loss 0, no gradient change, and the host returns an error).
extern "C" __global__ void xent_rows(const float* logits, u64 rows, u64 classes, const u32* labels,
                                     float* grad, u32 has_grad, float inv_rows, float* row_loss,
                                     u32* row_correct, u32* fault) {
    const u32 lane = lane_id();
    for (u64 r = warp_index(); r < rows; r += warp_count()) {
        const float* z = logits + r * classes;
        const u32 label = labels[r];
        if ((u64)label >= classes) {
            if (lane == 0) {
                report_fault(fault, FAULT_LABEL, label, classes);
                row_loss[r] = 0.0f;
                row_correct[r] = 0;
            }
            continue;
        }
        // Arg-max (first on ties; NaN never wins a comparison).
        float best = 0.0f;  // replaced by the first element a lane sees
        u64 best_j = classes;
        for (u64 j = lane; j < classes; j += WARP_SIZE) {
            const float v = z[j];
            if (best_j == classes || v > best) {
                best = v;
                best_j = j;
            }
        }
        for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, best, o);
            const u64 oj = __shfl_xor_sync(FULL_MASK, best_j, o);
            if (oj < classes && (best_j == classes || ov > best || (ov == best && oj < best_j))) {
                best = ov;
                best_j = oj;
            }
        }
        const float m = best;
        float s = 0.0f;
        for (u64 j = lane; j < classes; j += WARP_SIZE) s += expf(z[j] - m);
        s = warp_sum(s);
        const float log_sum = logf(s);
        if (has_grad) {
            const float shift = m + log_sum;
            float* g = grad + r * classes;
            for (u64 j = lane; j < classes; j += WARP_SIZE) {
                float v = expf(z[j] - shift) * inv_rows;
                if (j == label) v -= inv_rows;
                g[j] = v;
            }
        }
        if (lane == 0) {
            row_loss[r] = (m - z[label]) + log_sum;
            row_correct[r] = best_j == (u64)label ? 1u : 0u;
        }
    }
}

// Deterministic sum of the per-row results (one block of XENT_REDUCE_THREADS
// threads): thread t sums rows t, t + T, ... in f64, then a fixed-shape tree.
#define XENT_REDUCE_THREADS 256
// `guard` (may be null): set to 1 when the loss sum is not finite, and never
// cleared here — the sticky flag `adam_multi` reads, so that a non-finite loss
// stops every later update until the host, reading the loss batches later,
// clears it (the deferred-loss protocol, gpu_ops/src/model/mod.rs).
extern "C" __global__ void xent_reduce(const float* row_loss, const u32* row_correct, u64 rows,
                                       double* out_loss, u64* out_correct, u32* guard) {
    __shared__ double loss_s[XENT_REDUCE_THREADS];
    __shared__ u64 corr_s[XENT_REDUCE_THREADS];
    const u32 t = threadIdx.x;
    double l = 0.0;
    u64 c = 0;
    if (blockIdx.x == 0) {
        for (u64 r = t; r < rows; r += XENT_REDUCE_THREADS) {
            l += (double)row_loss[r];
            c += row_correct[r];
        }
    }
    loss_s[t] = l;
    corr_s[t] = c;
    __syncthreads();
    for (u32 s = XENT_REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            loss_s[t] += loss_s[t + s];
            corr_s[t] += corr_s[t + s];
        }
        __syncthreads();
    }
    if (blockIdx.x == 0 && t == 0) {
        const double sum = loss_s[0];
        *out_loss = sum;
        *out_correct = corr_s[0];
        // sum − sum is 0 exactly when the sum is finite (NaN and ±inf give NaN).
        if (guard != nullptr && !(sum - sum == 0.0)) *guard = 1u;
    }
}

// Adam with L2 decay (PyTorch `Adam`): g += wd θ; m = β1 m + (1 − β1) g;
// v = β2 v + (1 − β2) g²; θ −= step_size · m / (√v · inv_bias2_sqrt + eps), with
// step_size = lr / (1 − β1^t) and inv_bias2_sqrt = 1 / √(1 − β2^t) computed on the
// host in f64 (as cpu_ops::Adam does).
__device__ __forceinline__ void adam_element(float* param, const float* grad, float* m, float* v,
                                             u64 i, float beta1, float beta2,
                                             float one_minus_beta1, float one_minus_beta2,
                                             float eps, float weight_decay, float step_size,
                                             float inv_bias2_sqrt) {
    const float p = param[i];
    const float g = grad[i] + weight_decay * p;
    const float mi = beta1 * m[i] + one_minus_beta1 * g;
    const float vi = beta2 * v[i] + one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * mi / (sqrtf(vi) * inv_bias2_sqrt + eps);
}

extern "C" __global__ void adam_step(float* param, const float* grad, float* m, float* v, u64 n,
                                     float beta1, float beta2, float one_minus_beta1,
                                     float one_minus_beta2, float eps, float weight_decay,
                                     float step_size, float inv_bias2_sqrt) {
    for (u64 i = thread_index(); i < n; i += thread_count()) {
        adam_element(param, grad, m, v, i, beta1, beta2, one_minus_beta1, one_minus_beta2, eps,
                     weight_decay, step_size, inv_bias2_sqrt);
    }
}

// Multi-tensor Adam: one launch updates every tensor of a model, element for
// element what `adam_step` does to each. `table` holds four addresses per tensor
// (param, grad, m, v: 4·tensors words) followed by `tensors + 1` element offsets
// (an exclusive prefix sum of the lengths; the last is `total`). Element `i` of
// the concatenation belongs to the last tensor `t` with `offsets[t] <= i` (an
// empty tensor is never the last such one). With a `guard` (may be null) that
// is not 0 — a non-finite loss, `xent_reduce` — nothing is updated.
extern "C" __global__ void adam_multi(const u64* table, u32 tensors, u64 total, const u32* guard,
                                      float beta1, float beta2, float one_minus_beta1,
                                      float one_minus_beta2, float eps, float weight_decay,
                                      float step_size, float inv_bias2_sqrt) {
    if (guard != nullptr && *guard != 0u) return;
    const u64* offsets = table + 4 * (u64)tensors;
    for (u64 i = thread_index(); i < total; i += thread_count()) {
        u32 lo = 0, hi = tensors;
        while (hi - lo > 1) {
            const u32 mid = (lo + hi) / 2;
            if (offsets[mid] <= i) lo = mid; else hi = mid;
        }
        const u64* e = table + 4 * (u64)lo;
        adam_element((float*)e[0], (const float*)e[1], (float*)e[2], (float*)e[3], i - offsets[lo],
                     beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, step_size,
                     inv_bias2_sqrt);
    }
}
