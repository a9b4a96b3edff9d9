// CUDA kernels of the fused gated attention op (attention_step.h; attention_step.cpp's gated_cpu is
// the reference). Flash decoding: the n_kv keys are cut into `splits` chunks (from n_kv alone, so a
// token's bits do not depend on T); a CTA takes one chunk of one KV head for one token and all G
// query heads sharing that head, in tiles of TILE keys staged in shared memory (cp.async, two
// stages): two threads a key for the scores (the K row read once for the G heads), an online
// softmax per head, then every thread two value dims (hd 256; one for 128) for the G heads, keys in
// order. One chunk: the CTA writes
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
constexpr int TILE = 64;  // keys a CTA stages and scores at a time (two threads a key)
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

// 16 bytes global -> shared, asynchronously; src_bytes 0 fills them with zeros (reads nothing).
__device__ __forceinline__ void cp_async16(void * dst, const void * src, int src_bytes) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Shared memory of attend_kernel<HD>: two stages of a TILE-key K and V tile (rows padded by 16
// bytes: a quarter warp's 16-byte reads of 8 rows hit distinct banks), q [MAX_GROUP][HD], the
// scores [MAX_GROUP][TILE], the heads' running max, sum and rescale factor [3][MAX_GROUP].
template <int HD>
__host__ __device__ constexpr int row_bytes() { return HD * 2 + 16; }
template <int HD>
constexpr int attend_smem() {
    return 2 * 2 * TILE * row_bytes<HD>() + (MAX_GROUP * HD + MAX_GROUP * TILE + 3 * MAX_GROUP) * 4;
}

// grid (splits, Hkv, T), WARPS * 32 threads. Per tile of TILE keys (the next one loading meanwhile):
// the scores, two threads a key (each half of the dims, then one exchange: a fixed order), the
// online softmax per head, then the values (thread tid: dims tid * DIMS ..) for the G heads.
template <int HD>
__global__ void __launch_bounds__(WARPS * 32) attend_kernel(gated_args a, int chunk, int splits) {
    constexpr int DIMS = HD / (WARPS * 32);  // value dims a thread (2 or 1)
    constexpr int ROW = row_bytes<HD>(), VECS = HD * 2 / 16;  // a staged row; its 16-byte vectors
    constexpr int HALF = HD / 2;                              // dims a thread scores
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t * tiles = smem;  // [stage][K, V][TILE][ROW]
    float * sq = reinterpret_cast<float *>(smem + 2 * 2 * TILE * ROW);  // [G][HD]
    float * ss = sq + MAX_GROUP * HD;                                 // [G][TILE]
    float * run = ss + MAX_GROUP * TILE;                              // [3][G]: max, sum, factor
    const int G = a.H / a.Hkv;
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    const int j0 = split * chunk, j1 = min(a.n_kv, j0 + chunk);
    const int n_tiles = (j1 - j0 + TILE - 1) / TILE;
    cuda::launch_dependents();
    cuda::wait_for_previous();  // q, the cache rows and the mask are the previous kernels'
    auto stage = [&](int i) {   // tile i into stage i % 2, one commit group
        if (i < n_tiles) {
            uint8_t * st = tiles + (i % 2) * 2 * TILE * ROW;
            const int base = j0 + i * TILE;
            for (int idx = tid; idx < 2 * TILE * VECS; idx += WARPS * 32) {
                const int m = idx / (TILE * VECS), r = (idx / VECS) % TILE, c = idx % VECS;
                const bool in = base + r < j1;
                const __half * src = (m == 0 ? a.k + int64_t(in ? base + r : 0) * a.k_row
                                             : a.v + int64_t(in ? base + r : 0) * a.v_row) + int64_t(kvh) * HD + 8 * c;
                cp_async16(st + (m * TILE + r) * ROW + 16 * c, src, in ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    stage(0);
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
        for (int e = 0; e < DIMS; ++e) acc[g][e] = 0.0f;
    for (int i = 0; i < n_tiles; ++i) {
        stage(i + 1);
        cp_async_wait<1>();  // tile i is in
        __syncthreads();
        const uint8_t * sk = tiles + (i % 2) * 2 * TILE * ROW;
        const uint8_t * sv = sk + TILE * ROW;
        const int base = j0 + i * TILE;
        {  // scores: threads 2r and 2r + 1 take key base + r, halves of its dims
            const int r = tid / 2, half = tid % 2;
            float dot[MAX_GROUP];
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) dot[g] = 0.0f;
            const uint4 * kr = reinterpret_cast<const uint4 *>(sk + r * ROW + half * HALF * 2);
#pragma unroll 4
            for (int c = 0; c < HALF / 8; ++c) {
                const uint4 raw = kr[c];
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
                    const float * qq = sq + g * HD + half * HALF + 8 * c;
#pragma unroll
                    for (int e = 0; e < 8; ++e) dot[g] = fmaf(qq[e], kv[e], dot[g]);
                }
            }
            const bool in = base + r < j1;
            const float mk = in ? __half2float(__ldcg(a.mask + int64_t(t) * a.mask_row + base + r)) : -INFINITY;
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {  // (unrolled: dot and acc stay in registers)
                if (g >= G) break;
                const float other = __shfl_xor_sync(0xffffffffu, dot[g], 1);
                const float full = half == 0 ? dot[g] + other : other + dot[g];  // the same sum in both
                if (half == 0) ss[g * TILE + r] = in ? fmaf(a.scale, full, mk) : -INFINITY;
            }
        }
        __syncthreads();
        // the online softmax, warp w for heads w, w + WARPS, ..: the tile's max, its p, their sum
        for (int g = warp; g < G; g += WARPS) {
            float m = -INFINITY;
            for (int k = lane; k < TILE; k += 32) m = fmaxf(m, ss[g * TILE + k]);
#pragma unroll
            for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float m_old = run[g], m_new = fmaxf(m_old, m);
            float sum = 0.0f;
            for (int k = lane; k < TILE; k += 32) {
                const float p = m_new == -INFINITY ? 0.0f : expf(ss[g * TILE + k] - m_new);
                ss[g * TILE + k] = p;
                sum += p;
            }
#pragma unroll
            for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
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
            for (int e = 0; e < DIMS; ++e) acc[g][e] *= f;
        }
        const int n = min(TILE, j1 - base);
#pragma unroll 4
        for (int k = 0; k < n; ++k) {
            float vv[DIMS];
            if constexpr (DIMS == 2) {
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(sv + k * ROW + 4 * tid));
                vv[0] = f.x;
                vv[1] = f.y;
            } else {
                vv[0] = __half2float(*reinterpret_cast<const __half *>(sv + k * ROW + 2 * tid));
            }
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {
                if (g >= G) break;
                const float p = ss[g * TILE + k];
#pragma unroll
                for (int e = 0; e < DIMS; ++e) acc[g][e] = fmaf(p, vv[e], acc[g][e]);
            }
        }
        __syncthreads();  // the stage and the scores are rewritten next
    }
    cp_async_wait<0>();
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
    constexpr int smem = attend_smem<HD>();
    static unsigned long long configured = 0;  // bit d: device d's shared-memory limit raised
    if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
    if (!(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & (1ull << dev))) {
        const cudaError_t e = cudaFuncSetAttribute(attend_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        __atomic_fetch_or(&configured, 1ull << dev, __ATOMIC_ACQ_REL);
    }
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
