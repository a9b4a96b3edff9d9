// CUDA kernels of the fused gated attention op (attention_step.h; attention_step.cpp's gated_cpu is
// the reference). Flash decoding: the n_kv keys are cut into `splits` chunks (from n_kv alone, so a
// token's bits do not depend on T); a CTA takes one chunk of one KV head for one token and all G
// query heads sharing that head, in tiles of TILE keys: one lane a key for the scores (the K row
// read once for the G heads, q from shared memory), an online softmax per head, then every thread
// two value dims (hd 256; one for 128) for the G heads, keys in order. One chunk: the CTA writes
// the gated output; more: (max, sum, unnormalized sums) per chunk into `partial`, and `combine`
// adds the chunks in order. Both are programmatic dependent launches where the device runs them.
// Header-only (no ggml) so that a standalone test can build it.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention_split.h"
#include "cuda_launch.cuh"

namespace lucebox::kernels::attention::cuda_step {

constexpr int MAX_GROUP = 8;    // query heads a KV head (attention::MAX_GROUP)
constexpr int MAX_TOKENS = 64;  // attention::MAX_TOKENS
constexpr int WARPS = 4;
constexpr int TILE = 32 * WARPS;  // keys a CTA scores at a time: one a lane
struct gated_args {
    const float * q = nullptr;  // q[t * q_token + h * q_head + d]
    int64_t q_head = 0, q_token = 0;
    const __half * k = nullptr;  // k[j * k_row + kvh * hd + d]
    const __half * v = nullptr;
    int64_t k_row = 0, v_row = 0;
    const __half * mask = nullptr;  // mask[t * mask_row + j]
    int64_t mask_row = 0;
    const float * gate = nullptr;  // gate[t * gate_token + h * gate_head + d]
    int64_t gate_head = 0, gate_token = 0;
    float * out = nullptr;  // out[t * out_token + h * hd + d]
    int64_t out_token = 0;
    float * partial = nullptr;  // [T][H][splits][2 + hd]: max, sum, sums (splits > 1; attention_split.h)
    int hd = 0, H = 0, Hkv = 0, T = 0, n_kv = 0;
    float scale = 0.0f;
};

inline bool supported(int hd, int H, int Hkv, int T) {
    return (hd == 128 || hd == 256) && Hkv > 0 && H % Hkv == 0 && H / Hkv <= MAX_GROUP && T >= 1 && T <= MAX_TOKENS;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// grid (splits, Hkv, T), WARPS * 32 threads; dynamic shared memory: q [G][HD], scores [G][TILE],
// the heads' running max, sum and rescale factor [3][G].
template <int HD>
__global__ void __launch_bounds__(WARPS * 32) attend_kernel(gated_args a, int chunk, int splits) {
    constexpr int DIMS = HD / (WARPS * 32);  // value dims a thread (2 or 1)
    extern __shared__ float sm[];
    const int G = a.H / a.Hkv;
    float * sq = sm;                      // [G][HD]
    float * ss = sq + MAX_GROUP * HD;     // [G][TILE]
    float * run = ss + MAX_GROUP * TILE;  // [3][G]: max, sum, factor
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    cuda::launch_dependents();
    cuda::wait_for_previous();  // q, the cache rows and the mask are the previous kernels'
    for (int i = tid; i < G * HD; i += WARPS * 32) {
        const int g = i / HD, d = i % HD;
        sq[i] = __ldcg(a.q + int64_t(t) * a.q_token + int64_t(kvh * G + g) * a.q_head + d);
    }
    if (tid < MAX_GROUP) {
        run[tid] = -INFINITY;
        run[MAX_GROUP + tid] = 0.0f;
    }
    float acc[MAX_GROUP][DIMS];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; ++g)
#pragma unroll
        for (int i = 0; i < DIMS; ++i) acc[g][i] = 0.0f;
    __syncthreads();
    const int j0 = split * chunk, j1 = min(a.n_kv, j0 + chunk);
    for (int base = j0; base < j1; base += TILE) {
        {  // scores: lane tid takes key base + tid, its K row read once for the G heads
            const int j = base + tid;
            float dot[MAX_GROUP];
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) dot[g] = 0.0f;
            if (j < j1) {
                const uint4 * kr = reinterpret_cast<const uint4 *>(a.k + int64_t(j) * a.k_row + int64_t(kvh) * HD);
#pragma unroll 4
                for (int c = 0; c < HD / 8; ++c) {
                    const uint4 raw = __ldcg(kr + c);
                    const __half2 * h2 = reinterpret_cast<const __half2 *>(&raw);
                    float kv[8];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 f = __half22float2(h2[e]);
                        kv[2 * e] = f.x;
                        kv[2 * e + 1] = f.y;
                    }
#pragma unroll
                    for (int g = 0; g < MAX_GROUP; ++g) {
                        if (g >= G) break;
#pragma unroll
                        for (int e = 0; e < 8; ++e) dot[g] = fmaf(sq[g * HD + 8 * c + e], kv[e], dot[g]);
                    }
                }
            }
            const float mk = j < j1 ? __half2float(__ldcg(a.mask + int64_t(t) * a.mask_row + j)) : -INFINITY;
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {  // (unrolled: dot and acc stay in registers)
                if (g >= G) break;
                ss[g * TILE + tid] = j < j1 ? fmaf(a.scale, dot[g], mk) : -INFINITY;
            }
        }
        __syncthreads();
        // the online softmax, warp w for heads w, w + WARPS, ..: the tile's max, its p, their sum
        for (int g = warp; g < G; g += WARPS) {
            float m = -INFINITY;
            for (int i = lane; i < TILE; i += 32) m = fmaxf(m, ss[g * TILE + i]);
#pragma unroll
            for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float m_old = run[g], m_new = fmaxf(m_old, m);
            float sum = 0.0f;
            for (int i = lane; i < TILE; i += 32) {
                const float p = m_new == -INFINITY ? 0.0f : expf(ss[g * TILE + i] - m_new);
                ss[g * TILE + i] = p;
                sum += p;
            }
#pragma unroll
            for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                const float factor = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
                run[g] = m_new;
                run[MAX_GROUP + g] = run[MAX_GROUP + g] * factor + sum;
                run[2 * MAX_GROUP + g] = factor;
            }
        }
        __syncthreads();
        // the values: thread tid's dims for the G heads, the tile's keys in order
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            if (g >= G) break;
            const float f = run[2 * MAX_GROUP + g];
#pragma unroll
            for (int i = 0; i < DIMS; ++i) acc[g][i] *= f;
        }
        const int n = min(TILE, j1 - base);
        for (int i = 0; i < n; ++i) {
            const __half * vr = a.v + int64_t(base + i) * a.v_row + int64_t(kvh) * HD + tid * DIMS;
            float vv[DIMS];
            if constexpr (DIMS == 2) {
                const float2 f = __half22float2(__ldcg(reinterpret_cast<const __half2 *>(vr)));
                vv[0] = f.x;
                vv[1] = f.y;
            } else {
                vv[0] = __half2float(__ldcg(vr));
            }
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {
                if (g >= G) break;
                const float p = ss[g * TILE + i];
#pragma unroll
                for (int e = 0; e < DIMS; ++e) acc[g][e] = fmaf(p, vv[e], acc[g][e]);
            }
        }
        __syncthreads();  // the scores' tile is rewritten next
    }
#pragma unroll
    for (int g = 0; g < MAX_GROUP; ++g) {
        if (g >= G) break;
        const int h = kvh * G + g;
        const float l = run[MAX_GROUP + g];
        if (splits == 1) {
#pragma unroll
            for (int e = 0; e < DIMS; ++e) {
                const int d = tid * DIMS + e;
                const float gv = __ldcg(a.gate + int64_t(t) * a.gate_token + int64_t(h) * a.gate_head + d);
                a.out[int64_t(t) * a.out_token + int64_t(h) * HD + d] = (l > 0.0f ? acc[g][e] / l : 0.0f) * sigmoid(gv);
            }
        } else {
            float * p = a.partial + ((int64_t(t) * a.H + h) * splits + split) * (2 + HD);
            if (tid == 0) {
                p[0] = run[g];
                p[1] = l;
            }
#pragma unroll
            for (int e = 0; e < DIMS; ++e) p[2 + tid * DIMS + e] = acc[g][e];
        }
    }
}

// grid (H, T), HD threads: the chunks of (t, h) added in order, normalized, gated.
template <int HD>
__global__ void __launch_bounds__(HD) combine_kernel(gated_args a, int splits) {
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    cuda::launch_dependents();
    cuda::wait_for_previous();  // the partial sums
    const float * p = a.partial + (int64_t(t) * a.H + h) * splits * (2 + HD);
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, __ldcg(p + s * (2 + HD)));
    float l = 0.0f, o = 0.0f;
    if (m != -INFINITY)
        for (int s = 0; s < splits; ++s) {
            const float ms = __ldcg(p + s * (2 + HD));
            if (ms == -INFINITY) continue;
            const float w = expf(ms - m);
            l = fmaf(__ldcg(p + s * (2 + HD) + 1), w, l);
            o = fmaf(__ldcg(p + s * (2 + HD) + 2 + d), w, o);
        }
    const float gv = __ldcg(a.gate + int64_t(t) * a.gate_token + int64_t(h) * a.gate_head + d);
    a.out[int64_t(t) * a.out_token + int64_t(h) * HD + d] = (l > 0.0f ? o / l : 0.0f) * sigmoid(gv);
}

template <int HD>
cudaError_t launch_hd(const gated_args & a, int dev, cudaStream_t stream) {
    int chunk = 0, splits = 0;
    split_of(a.n_kv, chunk, splits);
    const int smem = (MAX_GROUP * HD + MAX_GROUP * TILE + 3 * MAX_GROUP) * int(sizeof(float));
    cudaError_t err = cuda::launch(attend_kernel<HD>, dim3(splits, a.Hkv, a.T), dim3(WARPS * 32), smem, stream,
                                   cuda::pdl_kernel<attend_kernel<HD>>(dev), a, chunk, splits);
    if (err != cudaSuccess || splits == 1) return err;
    return cuda::launch(combine_kernel<HD>, dim3(a.H, a.T), dim3(HD), 0, stream,
                        cuda::pdl_kernel<combine_kernel<HD>>(dev), a, splits);
}

// Runs the op on `stream`; a.partial holds partial_floats(..) floats when there is more than one chunk.
inline cudaError_t run_gated(const gated_args & a, cudaStream_t stream) {
    if (!supported(a.hd, a.H, a.Hkv, a.T) || a.n_kv < 1) return cudaErrorInvalidValue;
    if (partial_floats(a.hd, a.H, a.T, a.n_kv) > 0 && a.partial == nullptr) return cudaErrorInvalidValue;
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    return a.hd == 256 ? launch_hd<256>(a, dev, stream) : launch_hd<128>(a, dev, stream);
}

}  // namespace lucebox::kernels::attention::cuda_step
