// CUDA kernels of the fused DeltaNet step ops (delta_net_step.h has what they compute; its CPU
// functions are the reference). Both are programmatic dependent launches where the device runs
// them (cuda_launch.cuh). A token's results do not depend on T: every token goes through the same
// instructions, whatever the batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_launch.cuh"

namespace lucebox::kernels::delta_net {

namespace cuda_step {

constexpr int HEAD = 128;
constexpr int MAX_D_CONV = 8;
constexpr int MAX_TOKENS = 64;  // a step's tokens (decode, a verify); prefill micro-batches run ggml's ops

struct inputs_args {
    const float * qkv = nullptr;   // token t's conv_dim inputs at qkv + t * qkv_stride
    int64_t qkv_stride = 0;        // floats
    const float * beta = nullptr;  // token t's Hv values at beta + t * beta_stride
    int64_t beta_stride = 0;
    const float * alpha = nullptr;
    int64_t alpha_stride = 0;
    const float * conv_state = nullptr;  // [conv_dim][d_conv-1]
    const float * conv_w = nullptr;      // [conv_dim][d_conv]
    const float * dt_bias = nullptr;     // [Hv]
    const float * a = nullptr;           // [Hv]
    float * conv_dst = nullptr;          // channel c's window values from window_from on at conv_dst + c * conv_dst_stride
    int64_t conv_dst_stride = 0;         // (null with tree_rows: no window written)
    int window_from = 0;
    const int32_t * tree_rows = nullptr;  // a tree: [T][d_conv] node t's window as indices into [carried | tokens]
    float * out = nullptr;  // [T][conv_dim] q | k | v, then g [T][Hv], then beta [T][Hv]
    int T = 0, Hk = 0, Hv = 0, conv_dim = 0, d_conv = 0;
    int block_tokens = 0;  // tokens a conv block convolves (input_block_tokens; run_inputs sets it)
    float eps = 0.0f;
};

struct recurrence_args {
    const float * x = nullptr;  // the inputs kernel's out for x_tokens tokens; 16-byte aligned (read as float4s)
    int x_tokens = 0;
    const float * z = nullptr;  // token t's Hv HEAD values at z + t * z_stride
    int64_t z_stride = 0;
    const float * s0 = nullptr;      // [Hv][HEAD (column)][HEAD (k index)]
    const float * norm_w = nullptr;  // [HEAD]
    float * state_dst = nullptr;     // slot s at state_dst + s * slot_stride, each [Hv][HEAD][HEAD]
    int64_t slot_stride = 0;         // floats
    int state_mode = 0;              // delta_net::state_out: 0 final state into slot 0, 1 the state after token t
                                     // into slot T-1-t, 2 none
    float * out = nullptr;           // [T][Hv HEAD] (replay_layers: none; z and norm_w unused)
    int T = 0, Hk = 0, Hv = 0;
    float eps = 0.0f;
    const int32_t * parents = nullptr;  // a tree (state_mode 1): node t starts from slot T-1-parents[t], or s0 for -1
};

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

template <int N>
__device__ __forceinline__ void warp_sum(float (&v)[N]) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], off);
}

constexpr int INPUT_PREFETCH = 16;  // tokens whose inputs a thread loads before it convolves them
// Tokens a conv block convolves: a step's tokens go to blocks of this many, side by side (a token's
// conv needs only its d_conv inputs, and its L2 norm only its head's channels), so that a verify's
// inputs spread over the multiprocessors as a decode step's do. (A conv destination that overlaps the
// conv state, a decode step's in-place window, keeps every token in one block: that block alone reads
// the carried values it overwrites.)
// (LUCEBOX_INPUT_BLOCK_TOKENS: a probe knob of bench/probes/delta_net_bench.cu. H100, the 27B's 16-token
// verify in the engine: 5.4 us a layer with one block a channel block, 4.8 with runs of 4. The probe,
// us a layer at T = 8 / 16 / 32 / 64, runs of 2: 6.27 / 6.15 / 7.63 / 13.19, 4: 6.15 / 9.37 / 10.73 / 13.55,
// 8: 5.02 / 9.62 / 15.02 / 18.27; in the engine runs of 2 took 4.8 us as runs of 4 do (forty-ninth
// session): docs/benchmarks.md.)
#ifndef LUCEBOX_INPUT_BLOCK_TOKENS
#define LUCEBOX_INPUT_BLOCK_TOKENS 4
#endif
constexpr int INPUT_BLOCK_TOKENS = LUCEBOX_INPUT_BLOCK_TOKENS;
static_assert(INPUT_BLOCK_TOKENS >= 1 && INPUT_BLOCK_TOKENS <= MAX_TOKENS, "a run of 1 to MAX_TOKENS tokens");

inline int input_block_tokens(int T, bool in_place) { return in_place || T < INPUT_BLOCK_TOKENS ? T : INPUT_BLOCK_TOKENS; }

// The blocks of the inputs kernel: one per (head-sized block of conv channels, block_tokens tokens),
// then one per HEAD (token, value head) gate pairs.
__host__ __device__ inline int conv_blocks(int conv_dim, int T, int block_tokens) {
    return conv_dim / HEAD * ((T + block_tokens - 1) / block_tokens);
}
inline int input_blocks(int conv_dim, int Hv, int T, int block_tokens) {
    return conv_blocks(conv_dim, T, block_tokens) + (Hv * T + HEAD - 1) / HEAD;
}

// One block of HEAD threads per head-sized block of conv channels (q heads, k heads, v heads) and
// run of block_tokens tokens [tb, te), thread j its channel; then the gate blocks, a thread per
// (token, value head). The inputs are the previous kernel's outputs (read after the PDL wait, plain
// loads); a conv thread loads INPUT_PREFETCH tokens' inputs at a time, so that their loads are in
// flight together. Window value i (the carried d_conv-1 values, then the T tokens') goes to the conv
// destination from the block of token i - (d_conv-1) (the carried values: the first run's block).
template <int DC>
__global__ void __launch_bounds__(HEAD) inputs_kernel(inputs_args a) {
    extern __shared__ float ys[];  // q / k blocks: [block_tokens][HEAD] conv outputs, for the L2 norm
    cuda::launch_dependents();
    cuda::wait_for_previous();
    const int j = threadIdx.x;
    const int n_blocks = a.conv_dim / HEAD, n_conv = conv_blocks(a.conv_dim, a.T, a.block_tokens);
    const int64_t C = a.conv_dim, G = C * a.T, B = G + int64_t(a.Hv) * a.T;  // where q|k|v, g, beta start
    if (int(blockIdx.x) >= n_conv) {
        const int e = (int(blockIdx.x) - n_conv) * HEAD + j;
        if (e >= a.Hv * a.T) return;
        const int h = e % a.Hv, t = e / a.Hv;
        const float x = a.alpha[int64_t(t) * a.alpha_stride + h] + a.dt_bias[h];
        const float sp = x > 20.0f ? x : logf(1.0f + expf(x));
        a.out[G + int64_t(t) * a.Hv + h] = sp * a.a[h];
        a.out[B + int64_t(t) * a.Hv + h] = 1.0f / (1.0f + expf(-a.beta[int64_t(t) * a.beta_stride + h]));
        return;
    }
    const int u = int(blockIdx.x) % n_blocks;  // the channel block
    const int tb = int(blockIdx.x) / n_blocks * a.block_tokens;
    const int te = tb + a.block_tokens < a.T ? tb + a.block_tokens : a.T;
    const int c = u * HEAD + j;
    // window value r: carried (r < DC-1) or token r - (DC-1)'s input
    auto window_value = [&](int r) {
        return r < DC - 1 ? a.conv_state[int64_t(c) * (DC - 1) + r] : a.qkv[int64_t(r - (DC - 1)) * a.qkv_stride + c];
    };
    float w[DC], win[DC];
#pragma unroll
    for (int i = 0; i < DC; ++i) w[i] = a.conv_w[int64_t(c) * DC + i];
#pragma unroll
    for (int i = 0; i < DC - 1; ++i) win[i] = window_value(tb + i);  // the DC-1 values before token tb
    const bool qk = u < 2 * a.Hk;
    if (a.tree_rows != nullptr) {  // a tree: node t's window from the table, the same sum as a chain's
        for (int t = tb; t < te; ++t) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < DC; ++k) sum += window_value(a.tree_rows[t * DC + k]) * w[k];
            const float y = silu(sum);
            if (qk) ys[(t - tb) * HEAD + j] = y;
            else a.out[int64_t(t) * C + c] = y;
        }
    }
    float * cd = a.conv_dst + int64_t(c) * a.conv_dst_stride;  // window value i at cd[i - window_from]
#pragma unroll
    for (int i = 0; i < DC - 1; ++i)
        if (a.tree_rows == nullptr && tb == 0 && i >= a.window_from) cd[i - a.window_from] = win[i];  // (may overwrite conv_state: read above, by this block only)
    for (int t0 = tb; t0 < (a.tree_rows == nullptr ? te : tb); t0 += INPUT_PREFETCH) {
        float xv[INPUT_PREFETCH];
#pragma unroll
        for (int i = 0; i < INPUT_PREFETCH; ++i) xv[i] = t0 + i < te ? a.qkv[int64_t(t0 + i) * a.qkv_stride + c] : 0.0f;
#pragma unroll
        for (int i = 0; i < INPUT_PREFETCH; ++i) {
            const int t = t0 + i;
            if (t >= te) break;
            win[DC - 1] = xv[i];
            if (DC - 1 + t >= a.window_from) cd[DC - 1 + t - a.window_from] = win[DC - 1];
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < DC; ++k) sum += win[k] * w[k];
            const float y = silu(sum);
            if (qk) ys[(t - tb) * HEAD + j] = y;
            else a.out[int64_t(t) * C + c] = y;
#pragma unroll
            for (int k = 0; k < DC - 1; ++k) win[k] = win[k + 1];
        }
    }
    if (!qk) return;
    __syncthreads();
    // as graph::l2_norm: rms_norm(x, eps / n) / sqrt(n), one warp per token
    const int warp = j / 32, lane = j % 32;
    for (int t = tb + warp; t < te; t += HEAD / 32) {
        float v[HEAD / 32], ss[1] = {0.0f};
#pragma unroll
        for (int r = 0; r < HEAD / 32; ++r) {
            v[r] = ys[(t - tb) * HEAD + lane + 32 * r];
            ss[0] += v[r] * v[r];
        }
        warp_sum(ss);
        const float scale = rsqrtf(ss[0] / float(HEAD) + a.eps / float(HEAD));
        const float inv_sqrt_n = rsqrtf(float(HEAD));
#pragma unroll
        for (int r = 0; r < HEAD / 32; ++r) a.out[int64_t(t) * C + u * HEAD + lane + 32 * r] = v[r] * scale * inv_sqrt_n;
    }
}

// How a warp holds its state columns (probe knobs of bench/probes/delta_net_bench.cu; the defaults
// are the measured choice): LUCEBOX_REC_LANES lanes share a group of LUCEBOX_REC_LANE_COLS columns,
// each lane HEAD / REC_LANES k indices of every column of its group. A column's dot products are
// summed in registers, then over its group's lanes by log2(REC_LANES) butterfly shuffles, which leave
// the same bits in every lane of the group (IEEE addition commutes): no broadcast of the deltas. More
// lanes a group: shorter register sums, more shuffles; more columns a group: each staged k and q value
// a lane loads serves that many columns. H100 probe (bash bench/probes/ab.sh
// bench/probes/delta_net_bench.cu 2 ..., 27B heads, us a layer at T = 1 / 16 / 64, replay T = 6):
// 16 lanes x 2 columns 5.89 / 13.61 / 45.05, 2.79; 8 x 1 5.88 / 13.94 / 45.96, 2.85; 4 x 1 6.34 /
// 14.96 / 48.93, 3.18; 8 x 2 6.15 / 15.94 / 53.21, 2.52; 16 x 4 6.22 / 16.47 / 55.38, 2.53; the
// former layout (a warp's 32 lanes on 8 columns, a reduce-scatter and a broadcast of the deltas) 6.19 /
// 16.10 / 54.17, 2.53. Every variant equal to a double-precision reference (within 3e-7). More warps
// for the cluster kernel only (the forty-eighth session, a template per kernel; unrolled by 2 for
// T > 1 as now): 16 x 1 6.14 / 14.69 / 48.33, 3.09; 32 x 1 9.37 / 21.42 / 76.05, 5.33, against 16 x 2's
// 5.89 / 13.06 / 42.79, 2.82 in the same run.
#ifndef LUCEBOX_REC_LANES
#define LUCEBOX_REC_LANES 16
#endif
#ifndef LUCEBOX_REC_LANE_COLS
#define LUCEBOX_REC_LANE_COLS 2
#endif
constexpr int REC_LANES = LUCEBOX_REC_LANES;           // lanes per column group
constexpr int REC_LANE_COLS = LUCEBOX_REC_LANE_COLS;   // columns per group (and per lane)
static_assert(REC_LANES == 4 || REC_LANES == 8 || REC_LANES == 16 || REC_LANES == 32, "a group of 4 to 32 lanes");
constexpr int REC_COLS = 32 / REC_LANES * REC_LANE_COLS;  // state columns per warp
constexpr int REC_VECS = HEAD / 4 / REC_LANES;            // float4s of a column per lane
static_assert(REC_COLS <= HEAD / 4, "a CTA of a 4-CTA cluster holds at least one warp");
constexpr int REC_ROWS = HEAD / 32;  // (the gated norm: values per lane of a token's HEAD outputs)
constexpr int CHUNK = 16;            // tokens staged in shared memory at a time
constexpr int REC_CLUSTER = 4;       // CTAs per value head where the device has thread-block clusters

// A lane's part of its state columns times v: for each column j, the float4s i of S[j] (k indices
// 4 (REC_LANES i + r) .. + 3, r = the lane's rank in its group) times the same float4s of v, in up to
// 4 running sums (i mod 4: short dependency chains) added as (0 + 1) + (2 + 3), then summed over the
// group's lanes (butterfly).
__device__ __forceinline__ void column_dots(const float4 (&S)[REC_LANE_COLS][REC_VECS], const float4 * v, int r,
                                            float (&out)[REC_LANE_COLS]) {
    constexpr int P = REC_VECS < 4 ? REC_VECS : 4;
    float p[REC_LANE_COLS][P];
#pragma unroll
    for (int i = 0; i < REC_VECS; ++i) {
        const float4 w = v[REC_LANES * i + r];
#pragma unroll
        for (int j = 0; j < REC_LANE_COLS; ++j) {
            float d = S[j][i].x * w.x;
            d += S[j][i].y * w.y;
            d += S[j][i].z * w.z;
            d += S[j][i].w * w.w;
            if (i < P) p[j][i] = d;
            else p[j][i % P] += d;
        }
    }
#pragma unroll
    for (int j = 0; j < REC_LANE_COLS; ++j) {
        if constexpr (P == 4) out[j] = (p[j][0] + p[j][1]) + (p[j][2] + p[j][3]);
        else if constexpr (P == 2) out[j] = p[j][0] + p[j][1];
        else out[j] = p[j][0];
    }
#pragma unroll
    for (int off = 1; off < REC_LANES; off *= 2)
#pragma unroll
        for (int j = 0; j < REC_LANE_COLS; ++j) out[j] += __shfl_xor_sync(0xffffffffu, out[j], off);
}

// Value head h (key head h % Hk) in NC CTAs of HEAD / NC state columns each (NC = 1: one CTA of
// HEAD / REC_COLS warps; NC = REC_CLUSTER: one thread-block cluster of 4 CTAs, compute capability
// >= 9.0, so that the heads' recurrences spread over all SMs); warp w of a CTA owns its columns
// REC_COLS w .. + REC_COLS - 1, lane l = REC_LANES g + r group g of them (REC_LANE_COLS columns)
// and its float4s i of k indices 4 (REC_LANES i + r) .. + 3, i < REC_VECS (in registers for the whole
// batch). Per token:
// kv = S^T k, delta = (v - exp(g) kv) beta, S = exp(g) S + k delta^T, o = S^T q / sqrt(HEAD); then
// RMSNorm(o) * norm_w * SiLU(z) per token over the head's 128 outputs (with NC CTAs: each adds its
// columns' squares, then every CTA adds the NC partial sums in rank order from distributed shared
// memory).
// (The body of recurrence_kernel and replay_layers_kernel: one arithmetic for both. A replay,
// OUTPUTS false, skips S^T q and the norm: the state goes through the same instructions. UNROLL: the
// token loop's unrolling, 2 for a launch of several tokens (a verify), 1 for one (a decode step): the
// same instructions a token either way, so the same bits. H100 probe (delta_net_bench.cu, two rounds),
// us a layer at T = 1 / 16 / 64: not unrolled 5.89 / 13.66 / 45.15, this choice 5.89 / 13.06 / 42.79,
// unrolled by 4 for T > 1 (90 registers) the same as by 2 (the cluster kernel: 114 registers, no spills).)
template <int NC, bool OUTPUTS, int UNROLL>
__device__ __forceinline__ void recurrence_body(const recurrence_args & a) {
    constexpr int WARPS = HEAD / NC / REC_COLS, COLS = HEAD / NC;
    __shared__ float4 sq[CHUNK][HEAD / 4], sk[CHUNK][HEAD / 4];
    __shared__ __align__(16) float sv[CHUNK][HEAD], so[CHUNK][HEAD], sg[CHUNK], sb[CHUNK], part[CHUNK];
    cuda::launch_dependents();
    const int h = blockIdx.x / NC, rank = blockIdx.x % NC, kh = h % a.Hk;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, c0 = rank * COLS;  // my first column
    const int key_dim = a.Hk * HEAD, conv_dim = (2 * a.Hk + a.Hv) * HEAD;
    const int64_t G = int64_t(conv_dim) * a.x_tokens, B = G + int64_t(a.Hv) * a.x_tokens;  // where g and beta start
    const int64_t D = int64_t(HEAD) * HEAD;
    const float scale = rsqrtf(float(HEAD));
    cuda::wait_for_previous();

    const int cr = lane % REC_LANES;                                             // my rank in my group
    const int col0 = c0 + warp * REC_COLS + lane / REC_LANES * REC_LANE_COLS;   // my group's first column
    float4 S[REC_LANE_COLS][REC_VECS];  // S[j][i] = column col0 + j's k indices 4 (REC_LANES i + cr) .. + 3
    auto load_state = [&](const float * from) {  // [HEAD (column)][HEAD (k index)]
        const float4 * f = reinterpret_cast<const float4 *>(from) + col0 * (HEAD / 4) + cr;
#pragma unroll
        for (int j = 0; j < REC_LANE_COLS; ++j)
#pragma unroll
            for (int i = 0; i < REC_VECS; ++i) S[j][i] = f[j * (HEAD / 4) + REC_LANES * i];
    };
    auto store_state = [&](float * to) {
        float4 * f = reinterpret_cast<float4 *>(to) + col0 * (HEAD / 4) + cr;
#pragma unroll
        for (int j = 0; j < REC_LANE_COLS; ++j)
#pragma unroll
            for (int i = 0; i < REC_VECS; ++i) f[j * (HEAD / 4) + REC_LANES * i] = S[j][i];
    };
    load_state(a.s0 + h * D);

    for (int t0 = 0; t0 < a.T; t0 += CHUNK) {
        const int n = a.T - t0 < CHUNK ? a.T - t0 : CHUNK;
        __syncthreads();  // the previous chunk's shared memory is read
        // the chunk's q, k, v rows as float4s, every load of a thread issued before the first store
        constexpr int ROW4 = HEAD / 4, LOADS = (CHUNK * ROW4 + WARPS * 32 - 1) / (WARPS * 32);
        float4 lq[LOADS], lk[LOADS], lv[LOADS];
#pragma unroll
        for (int l = 0; l < LOADS; ++l) {
            const int e = tid + l * WARPS * 32, t = e / ROW4, i = e % ROW4;
            if (e >= n * ROW4) break;
            const float4 * xt = reinterpret_cast<const float4 *>(a.x + int64_t(t0 + t) * conv_dim);
            if constexpr (OUTPUTS) lq[l] = xt[kh * ROW4 + i];
            lk[l] = xt[(key_dim + kh * HEAD) / 4 + i];
            lv[l] = xt[(2 * key_dim + h * HEAD) / 4 + i];
        }
#pragma unroll
        for (int l = 0; l < LOADS; ++l) {
            const int e = tid + l * WARPS * 32, t = e / ROW4, i = e % ROW4;
            if (e >= n * ROW4) break;
            if constexpr (OUTPUTS) sq[t][i] = lq[l];
            sk[t][i] = lk[l];
            reinterpret_cast<float4 *>(sv[t])[i] = lv[l];
        }
        if (tid < n) {
            sg[tid] = expf(a.x[G + int64_t(t0 + tid) * a.Hv + h]);
            sb[tid] = a.x[B + int64_t(t0 + tid) * a.Hv + h];
        }
        __syncthreads();
        auto token = [&](int t) {  // (a lambda: the loop below takes it unrolled or not)
            if (a.parents != nullptr) {  // a tree: node t0 + t continues its parent's state (a slot this thread wrote) or s0
                const int node = t0 + t, p = a.parents[node];
                if (p != node - 1) load_state(p < 0 ? a.s0 + h * D : a.state_dst + int64_t(a.T - 1 - p) * a.slot_stride + h * D);
            }
            const float eg = sg[t], b = sb[t];
            float kv[REC_LANE_COLS], delta[REC_LANE_COLS];
            column_dots(S, sk[t], cr, kv);
#pragma unroll
            for (int j = 0; j < REC_LANE_COLS; ++j) delta[j] = (sv[t][col0 + j] - eg * kv[j]) * b;
#pragma unroll
            for (int i = 0; i < REC_VECS; ++i) {
                const float4 k = sk[t][REC_LANES * i + cr];
#pragma unroll
                for (int j = 0; j < REC_LANE_COLS; ++j) {
                    S[j][i].x = eg * S[j][i].x + k.x * delta[j];
                    S[j][i].y = eg * S[j][i].y + k.y * delta[j];
                    S[j][i].z = eg * S[j][i].z + k.z * delta[j];
                    S[j][i].w = eg * S[j][i].w + k.w * delta[j];
                }
            }
            if constexpr (OUTPUTS) {
                float at[REC_LANE_COLS];
                column_dots(S, sq[t], cr, at);
                if (cr == 0)
#pragma unroll
                    for (int j = 0; j < REC_LANE_COLS; ++j) so[t][col0 + j] = at[j] * scale;
            }
            if (a.state_mode == 1) store_state(a.state_dst + int64_t(a.T - 1 - (t0 + t)) * a.slot_stride + h * D);
        };
        if constexpr (UNROLL == 1) {
            for (int t = 0; t < n; ++t) token(t);
        } else {
#pragma unroll UNROLL
            for (int t = 0; t < n; ++t) token(t);
        }
        if constexpr (!OUTPUTS) continue;
        __syncthreads();
        // the gated norm of the chunk's tokens, a warp per token: the sum of the head's squares
        constexpr int MINE = (CHUNK + WARPS - 1) / WARPS;  // this warp's tokens: warp + m * WARPS
        float total[MINE] = {};
        if constexpr (NC == 1) {
#pragma unroll
            for (int m = 0; m < MINE; ++m) {
                const int t = warp + m * WARPS;
                if (t >= n) break;
                float ss[1] = {0.0f};
#pragma unroll
                for (int r = 0; r < REC_ROWS; ++r) ss[0] += so[t][lane + 32 * r] * so[t][lane + 32 * r];
                warp_sum(ss);
                total[m] = ss[0];
            }
        } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            static_assert(COLS == 32, "a lane per column of the CTA");
            for (int t = warp; t < n; t += WARPS) {
                float ss[1] = {so[t][c0 + lane] * so[t][c0 + lane]};
                warp_sum(ss);
                if (lane == 0) part[t] = ss[0];
            }
            cuda::cluster_sync();  // every CTA's partial sums are written
#pragma unroll
            for (int m = 0; m < MINE; ++m) {
                const int t = warp + m * WARPS;
                if (t < n)
#pragma unroll
                    for (int r = 0; r < NC; ++r) total[m] += cuda::cluster_shared(part, r)[t];
            }
            cuda::cluster_sync();  // read by all before the next chunk writes them
#else
            __trap();  // launched only where clusters exist
#endif
        }
#pragma unroll
        for (int m = 0; m < MINE; ++m) {
            const int t = warp + m * WARPS;
            if (t >= n) break;
            const float rr = rsqrtf(total[m] / float(HEAD) + a.eps);
            const float * zt = a.z + int64_t(t0 + t) * a.z_stride + h * HEAD;
            float * ot = a.out + int64_t(t0 + t) * a.Hv * HEAD + h * HEAD;
            for (int c = c0 + lane; c < c0 + COLS; c += 32) ot[c] = so[t][c] * rr * a.norm_w[c] * silu(zt[c]);
        }
    }
    if (a.state_mode == 0) store_state(a.state_dst + h * D);
}

template <int NC, int UNROLL>
__global__ void __launch_bounds__(HEAD / NC / REC_COLS * 32) recurrence_kernel(recurrence_args a) {
    recurrence_body<NC, true, UNROLL>(a);
}

// replay_layers (delta_net_step.h): row i of `layers` = {x, state, conv window source, conv state}
// addresses of one layer.
struct replay_layers_args {
    const int64_t * layers = nullptr;  // [n][4]
    int x_tokens = 0, T = 0, Hk = 0, Hv = 0, d_conv = 0;
    int64_t conv_src_stride = 0;  // floats
};

// Layer blockIdx.y's replay: recurrence_kernel's CTAs of a state-only run (its state in place, no
// outputs), so each layer's state gets the bits a verify of its first T tokens leaves; then the
// layer's CTAs copy its conv window after those tokens (source values [T, T + d_conv - 1) of each
// channel) into its conv state, a value a thread. The table is written once, when the session's
// state is allocated: read before the dependency wait.
template <int NC>
__global__ void __launch_bounds__(HEAD / NC / REC_COLS * 32) replay_layers_kernel(replay_layers_args r) {
    const int64_t * row = r.layers + 4 * blockIdx.y;
    recurrence_args a;
    a.x = reinterpret_cast<const float *>(static_cast<uintptr_t>(row[0]));
    a.state_dst = reinterpret_cast<float *>(static_cast<uintptr_t>(row[1]));
    a.s0 = a.state_dst;
    a.x_tokens = r.x_tokens, a.T = r.T, a.Hk = r.Hk, a.Hv = r.Hv;
    a.state_mode = 0;  // final state into slot 0 (the state itself)
    recurrence_body<NC, false, 1>(a);  // (waits for the verify that wrote x and the conv source)
    const float * src = reinterpret_cast<const float *>(static_cast<uintptr_t>(row[2]));
    float * conv = reinterpret_cast<float *>(static_cast<uintptr_t>(row[3]));
    const int W = r.d_conv - 1, n = (2 * r.Hk + r.Hv) * HEAD * W;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
        conv[e] = src[int64_t(e / W) * r.conv_src_stride + r.T + e % W];
}

// Whether the kernels take these shapes (the graph builder asks before it adds the ops).
inline bool supported(int d_conv, int conv_dim, int T) {
    return d_conv >= 2 && d_conv <= MAX_D_CONV && conv_dim % HEAD == 0 && T >= 1 && T <= MAX_TOKENS;
}

template <int DC>
cudaError_t launch_inputs(const inputs_args & a, int dev, cudaStream_t stream) {
    const size_t smem = size_t(a.block_tokens) * HEAD * sizeof(float);  // <= 32 KB (MAX_TOKENS)
    return cuda::launch(inputs_kernel<DC>, dim3(input_blocks(a.conv_dim, a.Hv, a.T, a.block_tokens)), dim3(HEAD),
                        smem, stream, cuda::pdl_kernel<inputs_kernel<DC>>(dev), a);
}

// Whether a chain's conv destination overlaps the conv state (the window written in place).
inline bool window_in_place(const inputs_args & a) {
    if (a.tree_rows != nullptr || a.conv_dst == nullptr) return false;
    const auto at = [](const float * p) { return reinterpret_cast<uintptr_t>(p); };
    const uintptr_t d0 = at(a.conv_dst),
                    d1 = at(a.conv_dst + int64_t(a.conv_dim - 1) * a.conv_dst_stride + (a.d_conv - 1 + a.T - a.window_from));
    const uintptr_t s0 = at(a.conv_state), s1 = at(a.conv_state + int64_t(a.conv_dim) * (a.d_conv - 1));
    return d0 < s1 && s0 < d1;
}

inline cudaError_t run_inputs(inputs_args a, cudaStream_t stream) {
    if (!supported(a.d_conv, a.conv_dim, a.T)) return cudaErrorInvalidValue;
    a.block_tokens = input_block_tokens(a.T, window_in_place(a));
    int dev = 0;
    const cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    switch (a.d_conv) {
        case 2: return launch_inputs<2>(a, dev, stream);
        case 3: return launch_inputs<3>(a, dev, stream);
        case 4: return launch_inputs<4>(a, dev, stream);
        case 5: return launch_inputs<5>(a, dev, stream);
        case 6: return launch_inputs<6>(a, dev, stream);
        case 7: return launch_inputs<7>(a, dev, stream);
        default: return launch_inputs<8>(a, dev, stream);
    }
}

template <int UNROLL>
cudaError_t launch_recurrence(const recurrence_args & a, int dev, cudaStream_t stream) {
    constexpr auto clustered = recurrence_kernel<REC_CLUSTER, UNROLL>;
    if (cuda::clusters_run<clustered>(dev))
        return cuda::launch_in_clusters(clustered, dim3(a.Hv * REC_CLUSTER), dim3(HEAD / REC_CLUSTER / REC_COLS * 32),
                                        REC_CLUSTER, stream, cuda::pdl_kernel<clustered>(dev), a);
    constexpr auto single = recurrence_kernel<1, 1>;  // (1024 threads of at most 64 registers: not unrolled, unmeasured)
    return cuda::launch(single, dim3(a.Hv), dim3(HEAD / REC_COLS * 32), 0, stream, cuda::pdl_kernel<single>(dev), a);
}

inline cudaError_t run_recurrence(const recurrence_args & a, cudaStream_t stream) {
    if (a.T < 1 || a.T > MAX_TOKENS || a.x_tokens < a.T || a.x_tokens > MAX_TOKENS || a.Hk < 1 || a.out == nullptr ||
        reinterpret_cast<uintptr_t>(a.x) % 16 != 0)
        return cudaErrorInvalidValue;
    if (a.parents != nullptr && a.state_mode != 1) return cudaErrorInvalidValue;  // a tree keeps every node's state
    int dev = 0;
    const cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    return a.T > 1 ? launch_recurrence<2>(a, dev, stream) : launch_recurrence<1>(a, dev, stream);
}

inline cudaError_t run_replay_layers(const replay_layers_args & r, int n_layers, cudaStream_t stream) {
    if (r.T < 1 || r.T > MAX_TOKENS || r.x_tokens < r.T || r.x_tokens > MAX_TOKENS || r.Hk < 1 || n_layers < 1 ||
        n_layers > 65535 || r.d_conv < 2 || r.d_conv > MAX_D_CONV || r.conv_src_stride < r.d_conv - 1 + r.x_tokens)
        return cudaErrorInvalidValue;
    int dev = 0;
    const cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    constexpr auto clustered = replay_layers_kernel<REC_CLUSTER>;
    if (cuda::clusters_run<clustered>(dev))
        return cuda::launch_in_clusters(clustered, dim3(r.Hv * REC_CLUSTER, n_layers),
                                        dim3(HEAD / REC_CLUSTER / REC_COLS * 32), REC_CLUSTER, stream,
                                        cuda::pdl_kernel<clustered>(dev), r);
    return cuda::launch(replay_layers_kernel<1>, dim3(r.Hv, n_layers), dim3(HEAD / REC_COLS * 32), 0, stream,
                        cuda::pdl_kernel<replay_layers_kernel<1>>(dev), r);
}

}  // namespace cuda_step
}  // namespace lucebox::kernels::delta_net
