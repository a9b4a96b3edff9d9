// CUDA kernels of the fused gated attention op (attention_step.h; attention_step.cpp's gated_cpu is
// the reference). Flash decoding: the n_kv keys are cut into `splits` chunks (from n_kv alone, so a
// token's bits do not depend on T); a CTA takes one chunk of one KV head for up to TOKENS tokens
// and all G query heads sharing that head, in tiles of TILE keys staged in shared memory (cp.async, two
// stages): KEY_THREADS threads a key for the scores (the K row read once for the G heads), an online
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
constexpr int TILE = 32;                     // keys a CTA stages and scores at a time
constexpr int KEY_THREADS = WARPS * 32 / TILE;  // threads a key's scores (each a part of the dims)
constexpr int TOKENS = 2;                    // tokens a CTA (they share its staged tiles)
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
// bytes: a quarter warp's 16-byte reads of 8 rows hit distinct banks), q [TOKENS][MAX_GROUP][HD],
// the scores [TOKENS MAX_GROUP][TILE], the (token, head) pairs' running max, sum and rescale factor
// [3][TOKENS MAX_GROUP].
template <int HD>
__host__ __device__ constexpr int row_bytes() { return HD * 2 + 16; }
constexpr int PAIRS = TOKENS * MAX_GROUP;
template <int HD>
constexpr int attend_smem() {
    return 2 * 2 * TILE * row_bytes<HD>() + (PAIRS * HD + PAIRS * TILE + 3 * PAIRS) * 4;
}
static_assert(attend_smem<256>() <= 99 * 1024, "fits the shared memory of every device of compute capability >= 8.0");
static_assert(TILE * KEY_THREADS == WARPS * 32 && (KEY_THREADS & (KEY_THREADS - 1)) == 0, "a power of two threads a key");

// grid (splits, Hkv, ceil(T / TOKENS)), WARPS * 32 threads: a chunk of keys of one KV head for up
// to TOKENS tokens (each staged tile serves them all) and their G query heads. Per tile of TILE keys
// (the next one loading meanwhile): the scores, KEY_THREADS threads a key (each a part of the dims,
// then a butterfly sum: a fixed order), the online softmax per (token, head), then the values (thread tid:
// dims tid * DIMS ..). A token's operations are the same whichever tokens share its CTA.
template <int HD>
__global__ void __launch_bounds__(WARPS * 32, 1) attend_kernel(gated_args a, int chunk, int splits) {
    constexpr int DIMS = HD / (WARPS * 32);  // value dims a thread (2 or 1)
    constexpr int ROW = row_bytes<HD>(), VECS = HD * 2 / 16;  // a staged row; its 16-byte vectors
    constexpr int PART = HD / KEY_THREADS;                    // dims a thread scores
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t * tiles = smem;  // [stage][K, V][TILE][ROW]
    float * sq = reinterpret_cast<float *>(smem + 2 * 2 * TILE * ROW);  // [TOKENS][G][HD]
    float * ss = sq + PAIRS * HD;                                     // [TOKENS G][TILE]
    float * run = ss + PAIRS * TILE;                                  // [3][TOKENS G]: max, sum, factor
    const int G = a.H / a.Hkv;
    const int split = blockIdx.x, kvh = blockIdx.y, t0 = blockIdx.z * TOKENS, tid = threadIdx.x;
    const int nt = min(TOKENS, a.T - t0);  // tokens t0 .. t0 + nt - 1
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
    for (int i = tid; i < nt * G * HD; i += WARPS * 32) {
        const int tt = i / (G * HD), g = (i / HD) % G, d = i % HD;
        sq[(tt * MAX_GROUP + g) * HD + d] =
            __ldcg(a.q + int64_t(t0 + tt) * a.q_token + int64_t(kvh * G + g) * a.q_head + d);
    }
    if (tid < PAIRS) {
        run[tid] = -INFINITY;
        run[PAIRS + tid] = 0.0f;
    }
    float acc[TOKENS][MAX_GROUP][DIMS];
#pragma unroll
    for (int tt = 0; tt < TOKENS; ++tt)
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g)
#pragma unroll
            for (int e = 0; e < DIMS; ++e) acc[tt][g][e] = 0.0f;
    for (int i = 0; i < n_tiles; ++i) {
        stage(i + 1);
        cp_async_wait<1>();  // tile i is in
        __syncthreads();
        const uint8_t * sk = tiles + (i % 2) * 2 * TILE * ROW;
        const uint8_t * sv = sk + TILE * ROW;
        const int base = j0 + i * TILE;
        {  // scores: threads KEY_THREADS r + q take key base + r, part q of its dims, for every (token, head)
            const int r = tid / KEY_THREADS, part = tid % KEY_THREADS;
            float dot[TOKENS][MAX_GROUP];
#pragma unroll
            for (int tt = 0; tt < TOKENS; ++tt)
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g) dot[tt][g] = 0.0f;
            // part q takes the row's 16-byte vectors q, q + KEY_THREADS, ..: the KEY_THREADS parts' q reads
            // at each step are one contiguous 128-byte span (no bank conflict; was 4-way)
            const uint4 * kr = reinterpret_cast<const uint4 *>(sk + r * ROW) + part;
#pragma unroll 2
            for (int c = 0; c < PART / 8; ++c) {
                const uint4 raw = kr[c * KEY_THREADS];
                const __half2 * h2 = reinterpret_cast<const __half2 *>(&raw);
                float kv[8];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 f = __half22float2(h2[e]);
                    kv[2 * e] = f.x;
                    kv[2 * e + 1] = f.y;
                }
#pragma unroll
                for (int tt = 0; tt < TOKENS; ++tt) {
                    if (tt >= nt) break;
#pragma unroll
                    for (int g = 0; g < MAX_GROUP; ++g) {
                        if (g >= G) break;
                        const float * qq = sq + (tt * MAX_GROUP + g) * HD + 8 * (c * KEY_THREADS + part);
#pragma unroll
                        for (int e = 0; e < 8; ++e) dot[tt][g] = fmaf(qq[e], kv[e], dot[tt][g]);
                    }
                }
            }
            const bool in = base + r < j1;
#pragma unroll
            for (int tt = 0; tt < TOKENS; ++tt) {  // (unrolled: dot and acc stay in registers)
                if (tt >= nt) break;
                const float mk =
                    in ? __half2float(__ldcg(a.mask + int64_t(t0 + tt) * a.mask_row + base + r)) : -INFINITY;
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g) {
                    if (g >= G) break;
                    float full = dot[tt][g];  // the parts' butterfly sum: the same bits in each of them
#pragma unroll
                    for (int o = 1; o < KEY_THREADS; o *= 2) full += __shfl_xor_sync(0xffffffffu, full, o);
                    if (part == 0) ss[(tt * MAX_GROUP + g) * TILE + r] = in ? fmaf(a.scale, full, mk) : -INFINITY;
                }
            }
        }
        __syncthreads();
        // the online softmax, warp w for pairs w, w + WARPS, ..: the tile's max, its p, their sum
        for (int u = warp; u < nt * G; u += WARPS) {
            const int pr = (u / G) * MAX_GROUP + u % G;  // the (token, head) pair's slot
            float m = -INFINITY;
            for (int k = lane; k < TILE; k += 32) m = fmaxf(m, ss[pr * TILE + k]);
#pragma unroll
            for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float m_old = run[pr], m_new = fmaxf(m_old, m);
            float sum = 0.0f;
            for (int k = lane; k < TILE; k += 32) {
                const float p = m_new == -INFINITY ? 0.0f : expf(ss[pr * TILE + k] - m_new);
                ss[pr * TILE + k] = p;
                sum += p;
            }
#pragma unroll
            for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                const float factor = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
                run[pr] = m_new;
                run[PAIRS + pr] = run[PAIRS + pr] * factor + sum;
                run[2 * PAIRS + pr] = factor;
            }
        }
        __syncthreads();
        // the values: thread tid's dims for every (token, head), the tile's keys in order
#pragma unroll
        for (int tt = 0; tt < TOKENS; ++tt) {
            if (tt >= nt) break;
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {
                if (g >= G) break;
                const float f = run[2 * PAIRS + tt * MAX_GROUP + g];
#pragma unroll
                for (int e = 0; e < DIMS; ++e) acc[tt][g][e] *= f;
            }
        }
        // keys n .. TILE - 1 (past j1) have p = 0 and zero-filled V rows: 4 keys at a time adds exact zeros
        const int n4 = (min(TILE, j1 - base) + 3) / 4;
        for (int k4 = 0; k4 < n4; ++k4) {
            float vv[4][DIMS];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int k = 4 * k4 + x;
                if constexpr (DIMS == 2) {
                    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(sv + k * ROW + 4 * tid));
                    vv[x][0] = f.x;
                    vv[x][1] = f.y;
                } else {
                    vv[x][0] = __half2float(*reinterpret_cast<const __half *>(sv + k * ROW + 2 * tid));
                }
            }
#pragma unroll
            for (int tt = 0; tt < TOKENS; ++tt) {
                if (tt >= nt) break;
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g) {
                    if (g >= G) break;
                    const float4 p4 = *reinterpret_cast<const float4 *>(ss + (tt * MAX_GROUP + g) * TILE + 4 * k4);
                    const float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                    for (int x = 0; x < 4; ++x)
#pragma unroll
                        for (int e = 0; e < DIMS; ++e) acc[tt][g][e] = fmaf(p[x], vv[x][e], acc[tt][g][e]);
                }
            }
        }
        __syncthreads();  // the stage and the scores are rewritten next
    }
    cp_async_wait<0>();
#pragma unroll
    for (int tt = 0; tt < TOKENS; ++tt) {
        if (tt >= nt) break;
        const int t = t0 + tt;
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            if (g >= G) break;
            const int h = kvh * G + g, pr = tt * MAX_GROUP + g;
            const float l = run[PAIRS + pr];
            if (splits == 1) {
#pragma unroll
                for (int e = 0; e < DIMS; ++e) {
                    const int d = tid * DIMS + e;
                    const float gv = __ldcg(a.gate + int64_t(t) * a.gate_token + int64_t(h) * a.gate_head + d);
                    a.out[int64_t(t) * a.out_token + int64_t(h) * HD + d] =
                        (l > 0.0f ? acc[tt][g][e] / l : 0.0f) * sigmoid(gv);
                }
            } else {
                float * p = a.partial + ((int64_t(t) * a.H + h) * splits + split) * (2 + HD);
                if (tid == 0) {
                    p[0] = run[pr];
                    p[1] = l;
                }
#pragma unroll
                for (int e = 0; e < DIMS; ++e) p[2 + tid * DIMS + e] = acc[tt][g][e];
            }
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
    cudaError_t err = cuda::launch(attend_kernel<HD>, dim3(splits, a.Hkv, (a.T + TOKENS - 1) / TOKENS), dim3(WARPS * 32), smem, stream,
                                   cuda::pdl_kernel<attend_kernel<HD>>(dev), a, chunk, splits);
    if (err != cudaSuccess || splits == 1) return err;
    return cuda::launch(combine_kernel<HD>, dim3(a.H, a.T), dim3(HD), 0, stream,
                        cuda::pdl_kernel<combine_kernel<HD>>(dev), a, splits);
}

// Runs the op on `stream`; a.partial holds partial_floats(..) floats when there is more than one chunk.
inline cudaError_t run_gated(const gated_args & a, cudaStream_t stream) {
    if (!supported(a.hd, a.H, a.Hkv, a.T) || a.n_kv < 1 || a.Hkv > 65535 || a.H < a.Hkv) return cudaErrorInvalidValue;
    // cp.async reads 16-byte vectors of the cache rows
    if ((reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v) | uintptr_t(a.k_row * 2) |
         uintptr_t(a.v_row * 2)) & 15)
        return cudaErrorInvalidValue;
    if (partial_floats(a.hd, a.H, a.T, a.n_kv) > 0 && a.partial == nullptr) return cudaErrorInvalidValue;
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    return a.hd == 256 ? launch_hd<256>(a, dev, stream) : launch_hd<128>(a, dev, stream);
}

}  // namespace lucebox::kernels::attention::cuda_step
