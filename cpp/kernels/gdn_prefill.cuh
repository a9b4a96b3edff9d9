// The gated delta net of a prefill micro-batch (ggml's GATED_DELTA_NET, scalar gate, final state
// only, head size 128), with each token's q, k, v, g and beta staged in shared memory for all the
// warps of a CTA (cp.async, two chunks of C tokens in flight) instead of read from global memory
// by every warp at every token: ggml's kernel walks the tokens one by one, each of its 128 warps of
// a head reloading the same q and k (a 27B prefill of 512 tokens: 530 us a layer).
//
// Per (sequence s, V head h, state column j) the recurrence of ggml's CUDA kernel, with the same
// float operations in the same order, compiled with -use_fast_math like ggml's CUDA code (so the same
// bits: tests/cpp/test_gdn_tree.cpp checks that):
//     M[j][i] = S[i][j] (the state stored transposed, as ggml does), kq head = h % Hk (tiled)
//     for t: g = exp(g_t); kv = sum_i M[j][i] k_t[i]; d = (v_t[j] - g kv) beta_t
//            M[j][i] = g M[j][i] + k_t[i] d;  o_t[j] = (sum_i M[j][i] q_t[i]) / sqrt(128)
// Lane l holds M[j][32r + l] (r < 4); sums over i are a per-lane sum over r then a butterfly over
// the 32 lanes (offsets 16, 8, 4, 2, 1), as ggml's warp_reduce_sum.
// Layouts (floats): q/k rows of 128 at q + s3*sq3 + t*sq2 + hk*sq1; v at v + s*sv3 + t*sv2 + h*sv1;
// g and beta at + s*sb3 + t*sb2 + h*sb1; state in [S][128][128] per (s, h) at (s*H + h)*128*128;
// output o[(s*T + t)*H + h][128]; final state out like the state in. Every pointer and row stride
// must be 16-byte aligned (check before launching; ggml's kernel takes the rest).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_launch.cuh"

namespace lucebox::kernels::gdn_prefill {

constexpr int HEAD = 128;         // S_v = S_k
constexpr int WARPS = 8;          // state columns per CTA
constexpr int C = 16;             // tokens per staged chunk
constexpr int MIN_TOKENS = 64;    // shorter batches stay with ggml's kernel

struct args {
    const float * q = nullptr, * k = nullptr, * v = nullptr, * g = nullptr, * beta = nullptr;
    const float * state_in = nullptr;
    float * out = nullptr;        // attention output
    float * state_out = nullptr;  // final state
    int64_t H = 0, Hk = 0, T = 0, n_seqs = 0, rq3 = 1;  // rq3: sequences per q/k sequence
    int64_t sq1 = 0, sq2 = 0, sq3 = 0, sv1 = 0, sv2 = 0, sv3 = 0, sb1 = 0, sb2 = 0, sb3 = 0;
    float scale = 0.0f;
};

// Whether the kernel can take these arguments (alignment and sizes); false: use ggml's kernel.
inline bool supported(const args & a) {
    auto aligned = [](const void * p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    return a.T >= MIN_TOKENS && a.H > 0 && a.Hk > 0 && a.n_seqs > 0 && a.rq3 > 0 && aligned(a.q) && aligned(a.k) &&
           aligned(a.v) && a.sq1 % 4 == 0 && a.sq2 % 4 == 0 && a.sq3 % 4 == 0 && a.sv1 % 4 == 0 && a.sv2 % 4 == 0 &&
           a.sv3 % 4 == 0;
}

namespace detail {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset, 32);
    return x;
}

// One chunk's staged inputs.
struct chunk {
    float k[C][HEAD];
    float q[C][HEAD];
    float v[C][WARPS];
    float g[C];
    float beta[C];
};

__global__ void __launch_bounds__(WARPS * 32) gated_delta_net(args a) {
    __shared__ __align__(16) chunk sm[2];
    const int h = blockIdx.x, seq = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int col0 = blockIdx.z * WARPS, col = col0 + warp;
    const int64_t hk = h % a.Hk, sk = seq / a.rq3;
    const float * q0 = a.q + sk * a.sq3 + hk * a.sq1;
    const float * k0 = a.k + sk * a.sq3 + hk * a.sq1;
    const float * v0 = a.v + seq * a.sv3 + h * a.sv1 + col0;
    const int64_t gb0 = seq * a.sb3 + h * a.sb1;
    const int n_chunks = int((a.T + C - 1) / C);

    auto stage = [&](int c) {  // chunk c into sm[c % 2]; tokens past T are zeros
        if (c < n_chunks) {
            chunk & d = sm[c % 2];
            for (int idx = threadIdx.x; idx < C * HEAD / 4; idx += WARPS * 32) {
                const int tt = idx / (HEAD / 4), e = 4 * (idx % (HEAD / 4));
                const int64_t t = int64_t(c) * C + tt;
                const int bytes = t < a.T ? 16 : 0;
                const int64_t tc = t < a.T ? t : 0;
                cuda::cp_async16(&d.k[tt][e], k0 + tc * a.sq2 + e, bytes);
                cuda::cp_async16(&d.q[tt][e], q0 + tc * a.sq2 + e, bytes);
            }
            if (threadIdx.x < C * WARPS / 4) {
                const int tt = threadIdx.x / (WARPS / 4), e = 4 * (threadIdx.x % (WARPS / 4));
                const int64_t t = int64_t(c) * C + tt;
                cuda::cp_async16(&d.v[tt][e], v0 + (t < a.T ? t : 0) * a.sv2 + e, t < a.T ? 16 : 0);
            }
            if (threadIdx.x < C) {
                const int64_t t = int64_t(c) * C + threadIdx.x;
                d.g[threadIdx.x] = t < a.T ? a.g[gb0 + t * a.sb2] : 0.0f;
                d.beta[threadIdx.x] = t < a.T ? a.beta[gb0 + t * a.sb2] : 0.0f;
            }
        }
        cuda::cp_async_commit();
    };

    const int64_t st = (int64_t(seq) * a.H + h) * HEAD * HEAD + int64_t(col) * HEAD;
    float s[HEAD / 32];
#pragma unroll
    for (int r = 0; r < HEAD / 32; ++r) s[r] = a.state_in[st + r * 32 + lane];
    float * out = a.out + (int64_t(seq) * a.T * a.H + h) * HEAD + col;

    stage(0);
    for (int c = 0; c < n_chunks; ++c) {
        stage(c + 1);
        cuda::cp_async_wait<1>();
        __syncthreads();  // chunk c (cp.async and the plain g/beta stores) visible to every warp
        const chunk & d = sm[c % 2];
        const int n = int(a.T - int64_t(c) * C < C ? a.T - int64_t(c) * C : C);
        for (int tt = 0; tt < n; ++tt) {
            float k_reg[HEAD / 32], q_reg[HEAD / 32];
#pragma unroll
            for (int r = 0; r < HEAD / 32; ++r) {
                k_reg[r] = d.k[tt][r * 32 + lane];
                q_reg[r] = d.q[tt][r * 32 + lane];
            }
            const float beta_val = d.beta[tt];
            const float g_val = expf(d.g[tt]);
            float kv_shard = 0.0f;
#pragma unroll
            for (int r = 0; r < HEAD / 32; ++r) kv_shard += s[r] * k_reg[r];
            const float kv_col = warp_sum(kv_shard);
            const float delta_col = (d.v[tt][warp] - g_val * kv_col) * beta_val;
            float attn_partial = 0.0f;
#pragma unroll
            for (int r = 0; r < HEAD / 32; ++r) {
                s[r] = g_val * s[r] + k_reg[r] * delta_col;
                attn_partial += s[r] * q_reg[r];
            }
            const float attn_col = warp_sum(attn_partial);
            if (lane == 0) out[(int64_t(c) * C + tt) * HEAD * a.H] = attn_col * a.scale;
        }
        __syncthreads();  // everyone is done with sm[c % 2] before stage(c + 2) refills it
    }
#pragma unroll
    for (int r = 0; r < HEAD / 32; ++r) a.state_out[st + r * 32 + lane] = s[r];
}

}  // namespace detail

// Runs the recurrence on stream; supported(a) must hold.
inline cudaError_t run(const args & a, cudaStream_t stream) {
    const dim3 grid(unsigned(a.H), unsigned(a.n_seqs), HEAD / WARPS);
    detail::gated_delta_net<<<grid, WARPS * 32, 0, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace lucebox::kernels::gdn_prefill
