// CUDA kernels of the fused gated attention op (attention_step.h; attention_step.cpp's gated_cpu is
// the reference). Flash decoding: the n_kv keys are cut into `splits` chunks (from n_kv alone, so a
// token's bits do not depend on T); a CTA of WARPS warps takes one chunk of one KV head for TOK
// tokens (1, or 2 sharing the staged rows) and the G query heads sharing that head. Its warps work
// apart, with no block barrier in the key loop: warp w takes the chunk's keys in steps of KEYS
// (keys j0 + KEYS (w + WARPS i) ..), stages their K and V rows in its own shared memory (cp.async,
// two steps ahead), scores them KEY_THREADS threads a key (q from shared memory, read once for all
// warps), keeps its own online softmax per (token, head) in registers and accumulates the values,
// each lane HD / 32 dims. The warps' (max, sum, sums) are then merged in warp order. One chunk: the
// CTA writes the gated output; more: the chunk's (max, sum, unnormalized sums) into `partial`, and
// `combine` adds the chunks in order. A verify (T >= 2) on a device of compute capability >= 8.0
// takes attend_mma_kernel instead (tensor cores, the same chunks and partials; see its comment).
// All are programmatic dependent launches where the device runs them. Header-only (no ggml) so that
// a standalone test can build it.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_mma_layout.h"
#include "attention_split.h"
#include "cuda_launch.cuh"

namespace lucebox::kernels::attention::cuda_step {

constexpr int MAX_GROUP = 8;    // query heads a KV head (attention::MAX_GROUP)
constexpr int MAX_TOKENS = 64;  // attention::MAX_TOKENS
constexpr int WARPS = 4;
constexpr int KEYS = 8;                   // keys a warp takes a step
constexpr int KEY_THREADS = 32 / KEYS;    // threads a key's scores (each a quarter of the dims)
constexpr int MAX_TOK = 2;                // tokens a CTA at most (they share its staged rows)
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

// N = 8 or 4 halves at src (16- or 8-byte aligned shared memory) as floats.
template <int N>
__device__ __forceinline__ void load_halves(const uint8_t * src, float (&out)[N]) {
    static_assert(N == 8 || N == 4, "one 16- or 8-byte load");
    using vec = typename std::conditional<N == 8, uint4, uint2>::type;
    const vec raw = *reinterpret_cast<const vec *>(src);
    const __half2 * h2 = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int e = 0; e < N / 2; ++e) {
        const float2 f = __half22float2(h2[e]);
        out[2 * e] = f.x;
        out[2 * e + 1] = f.y;
    }
}

// Shared memory of attend_kernel<HD, TOK>:
//   staged rows [WARPS][2 steps][K, V][KEYS][ROW] (a row padded by 64 bytes: the 8 lanes of a quarter
//     warp read 64 contiguous bytes of two keys' rows, which then fall on distinct banks);
//   q [TOK][MAX_GROUP][HD] floats; p [WARPS][KEYS][TOK MAX_GROUP] floats (a step's probabilities).
// After the key loop the staged rows hold the warps' merge: sums [WARPS][TOK MAX_GROUP][HD] and
// (max, sum) [WARPS][TOK MAX_GROUP][2].
template <int HD>
__host__ __device__ constexpr int row_bytes() { return HD * 2 + 64; }
template <int HD>
__host__ __device__ constexpr int staged_bytes() { return WARPS * 2 * 2 * KEYS * row_bytes<HD>(); }
template <int HD, int TOK>
constexpr int attend_smem() {
    return staged_bytes<HD>() + (TOK * MAX_GROUP * HD + WARPS * KEYS * TOK * MAX_GROUP) * 4;
}
template <int HD, int TOK>
constexpr bool merge_fits() {
    return (WARPS * TOK * MAX_GROUP * (HD + 2)) * 4 <= staged_bytes<HD>();
}
static_assert(attend_smem<256, MAX_TOK>() <= 99 * 1024, "fits the shared memory of every device of compute capability >= 8.0");
static_assert(merge_fits<256, 1>() && merge_fits<256, 2>() && merge_fits<128, 1>() && merge_fits<128, 2>(),
              "the warps' merge fits in the staged rows");
static_assert(KEY_THREADS * KEYS == 32 && (KEY_THREADS & (KEY_THREADS - 1)) == 0, "a power of two threads a key");

// grid (splits, Hkv, ceil(T / TOK)), WARPS * 32 threads: a chunk of keys of one KV head for up to
// TOK tokens and their G query heads (see the file's comment). A token's operations are the same
// whichever tokens share its CTA and whatever TOK.
template <int HD, int TOK>
__global__ void __launch_bounds__(WARPS * 32, 1) attend_kernel(gated_args a, int chunk, int splits) {
    constexpr int VD = HD / 32;               // value dims a lane (8 or 4)
    constexpr int ROW = row_bytes<HD>(), VECS = HD * 2 / 16;  // a staged row; its 16-byte vectors
    constexpr int PART = HD / KEY_THREADS;    // dims a thread scores
    constexpr int PAIRS = TOK * MAX_GROUP;    // (token, head) slots
    constexpr int MD = HD / (WARPS * 32);     // dims a thread merges (2 or 1)
    extern __shared__ __align__(16) uint8_t smem[];
    float * sq = reinterpret_cast<float *>(smem + staged_bytes<HD>());  // [TOK][MAX_GROUP][HD]
    float * sp_all = sq + PAIRS * HD;                                   // [WARPS][KEYS][PAIRS]
    const int G = a.H / a.Hkv;
    const int split = blockIdx.x, kvh = blockIdx.y, t0 = blockIdx.z * TOK, tid = threadIdx.x;
    const int nt = min(TOK, a.T - t0);  // tokens t0 .. t0 + nt - 1
    const int lane = tid % 32, warp = tid / 32;
    const int j0 = split * chunk, j1 = min(a.n_kv, j0 + chunk);
    const int len = j1 - j0;
    const int n_steps = len > KEYS * warp ? (len - KEYS * warp + KEYS * WARPS - 1) / (KEYS * WARPS) : 0;
    uint8_t * mine = smem + warp * 2 * 2 * KEYS * ROW;  // this warp's [2 steps][K, V][KEYS][ROW]
    float * sp = sp_all + warp * KEYS * PAIRS;
    const int r = lane / KEY_THREADS, part = lane % KEY_THREADS;  // the key this lane scores, its part
    cuda::launch_dependents();
    cuda::wait_for_previous();  // q, the cache rows, the mask and the gate are the previous kernels'
    auto step_base = [&](int i) { return j0 + KEYS * (warp + WARPS * i); };
    auto stage = [&](int i) {  // step i's rows into buffer i % 2, one commit group (empty past the end)
        if (i < n_steps) {
            uint8_t * st = mine + (i % 2) * 2 * KEYS * ROW;
            const int base = step_base(i);
#pragma unroll
            for (int idx = lane; idx < 2 * KEYS * VECS; idx += 32) {
                const int m = idx / (KEYS * VECS), rr = (idx / VECS) % KEYS, c = idx % VECS;
                const bool in = base + rr < j1;
                const __half * src = (m == 0 ? a.k + int64_t(in ? base + rr : 0) * a.k_row
                                             : a.v + int64_t(in ? base + rr : 0) * a.v_row) + int64_t(kvh) * HD + 8 * c;
                cp_async16(st + (m * KEYS + rr) * ROW + 16 * c, src, in ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    auto mask_of = [&](int i, float (&mk)[TOK]) {  // step i's mask values of this lane's key
        const int j = step_base(i) + r;
#pragma unroll
        for (int tt = 0; tt < TOK; ++tt)
            mk[tt] = i < n_steps && tt < nt && j < j1 ? __half2float(__ldcg(a.mask + int64_t(t0 + tt) * a.mask_row + j))
                                                      : -INFINITY;
    };
    stage(0);
    stage(1);
    {  // q: every load issued before the stores (16-byte vectors; rows of HD floats)
        constexpr int QV = (PAIRS * HD / 4 + WARPS * 32 - 1) / (WARPS * 32);
        float4 qv[QV];
        const int n_vec = nt * G * HD / 4;
#pragma unroll
        for (int x = 0; x < QV; ++x) {
            const int i = tid + x * WARPS * 32;
            if (i < n_vec) {
                const int tt = i / (G * HD / 4), g = (i / (HD / 4)) % G, d4 = i % (HD / 4);
                qv[x] = __ldcg(reinterpret_cast<const float4 *>(a.q + int64_t(t0 + tt) * a.q_token +
                                                                int64_t(kvh * G + g) * a.q_head) + d4);
            }
        }
#pragma unroll
        for (int x = 0; x < QV; ++x) {
            const int i = tid + x * WARPS * 32;
            if (i < n_vec) {
                const int tt = i / (G * HD / 4), g = (i / (HD / 4)) % G, d4 = i % (HD / 4);
                reinterpret_cast<float4 *>(sq + (tt * MAX_GROUP + g) * HD)[d4] = qv[x];
            }
        }
    }
    float mk_next[TOK];
    mask_of(0, mk_next);
    __syncthreads();  // q is in

    float m_run[TOK][MAX_GROUP], l_run[TOK][MAX_GROUP], acc[TOK][MAX_GROUP][VD];
#pragma unroll
    for (int tt = 0; tt < TOK; ++tt)
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            m_run[tt][g] = -INFINITY;
            l_run[tt][g] = 0.0f;
#pragma unroll
            for (int e = 0; e < VD; ++e) acc[tt][g][e] = 0.0f;
        }
    for (int i = 0; i < n_steps; ++i) {
        float mk[TOK];
#pragma unroll
        for (int tt = 0; tt < TOK; ++tt) mk[tt] = mk_next[tt];
        mask_of(i + 1, mk_next);  // the next step's, while this one computes
        cp_async_wait<1>();       // step i's rows are in (step i + 1's may still load)
        __syncwarp();
        const uint8_t * sk = mine + (i % 2) * 2 * KEYS * ROW;
        const uint8_t * sv = sk + KEYS * ROW;
        const int base = step_base(i);
        const bool in = base + r < j1;
        // scores of key base + r, part `part` of its dims (16-byte vectors part, part + KEY_THREADS, ..)
        float s[TOK][MAX_GROUP];
        {
#pragma unroll
            for (int tt = 0; tt < TOK; ++tt)
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g) s[tt][g] = 0.0f;
            const uint4 * kr = reinterpret_cast<const uint4 *>(sk + r * ROW) + part;
#pragma unroll 2
            for (int c = 0; c < PART / 8; ++c) {
                float kv[8];
                load_halves(reinterpret_cast<const uint8_t *>(kr + c * KEY_THREADS), kv);
#pragma unroll
                for (int tt = 0; tt < TOK; ++tt) {
                    if (tt >= nt) break;
#pragma unroll
                    for (int g = 0; g < MAX_GROUP; ++g) {
                        if (g >= G) break;
                        const float4 * qq =
                            reinterpret_cast<const float4 *>(sq + (tt * MAX_GROUP + g) * HD + 8 * (c * KEY_THREADS + part));
                        const float4 qa = qq[0], qb = qq[1];
                        float d = s[tt][g];
                        d = fmaf(qa.x, kv[0], d);
                        d = fmaf(qa.y, kv[1], d);
                        d = fmaf(qa.z, kv[2], d);
                        d = fmaf(qa.w, kv[3], d);
                        d = fmaf(qb.x, kv[4], d);
                        d = fmaf(qb.y, kv[5], d);
                        d = fmaf(qb.z, kv[6], d);
                        d = fmaf(qb.w, kv[7], d);
                        s[tt][g] = d;
                    }
                }
            }
        }
        // per (token, head): the parts' butterfly sum (the same bits in each), the score, the step's
        // max over its KEYS keys and the online softmax; every lane holds the same m_run / l_run bits
#pragma unroll
        for (int tt = 0; tt < TOK; ++tt) {
            if (tt >= nt) break;
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {
                if (g >= G) break;
                float full = s[tt][g];
#pragma unroll
                for (int o = 1; o < KEY_THREADS; o *= 2) full += __shfl_xor_sync(0xffffffffu, full, o);
                const float sc = in ? fmaf(a.scale, full, mk[tt]) : -INFINITY;
                float m = sc;
#pragma unroll
                for (int o = KEY_THREADS; o < 32; o *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                const float m_new = fmaxf(m_run[tt][g], m);
                const float p = m_new == -INFINITY ? 0.0f : expf(sc - m_new);
                float sum = p;
#pragma unroll
                for (int o = KEY_THREADS; o < 32; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                const float factor = m_new == -INFINITY ? 1.0f : expf(m_run[tt][g] - m_new);
                m_run[tt][g] = m_new;
                l_run[tt][g] = fmaf(l_run[tt][g], factor, sum);
                s[tt][g] = factor;
                if (part == 0) sp[r * PAIRS + tt * MAX_GROUP + g] = p;
            }
        }
        __syncwarp();  // the step's p are in
        // the values: lane's dims lane VD .. for every (token, head), the step's keys in order (keys
        // past j1 have p = 0 and zero-filled rows: adding them adds exact zeros)
#pragma unroll
        for (int tt = 0; tt < TOK; ++tt) {
            if (tt >= nt) break;
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {
                if (g >= G) break;
#pragma unroll
                for (int e = 0; e < VD; ++e) acc[tt][g][e] *= s[tt][g];
            }
        }
#pragma unroll 2
        for (int k = 0; k < KEYS; ++k) {
            float vv[VD];
            load_halves(sv + k * ROW + 2 * VD * lane, vv);
#pragma unroll
            for (int tt = 0; tt < TOK; ++tt) {
                if (tt >= nt) break;
                const float * pk = sp + k * PAIRS + tt * MAX_GROUP;
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g) {
                    if (g >= G) break;
                    const float p = pk[g];
#pragma unroll
                    for (int e = 0; e < VD; ++e) acc[tt][g][e] = fmaf(p, vv[e], acc[tt][g][e]);
                }
            }
        }
        __syncwarp();  // the buffer and p are rewritten next
        stage(i + 2);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its staged rows: they take the merge
    float * msum = reinterpret_cast<float *>(smem);  // [WARPS][PAIRS][HD]
    float * mml = msum + WARPS * PAIRS * HD;         // [WARPS][PAIRS][2]
#pragma unroll
    for (int tt = 0; tt < TOK; ++tt) {
        if (tt >= nt) break;
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            if (g >= G) break;
            const int pr = tt * MAX_GROUP + g;
            float * dst = msum + (warp * PAIRS + pr) * HD + lane * VD;
#pragma unroll
            for (int e = 0; e < VD; e += 4)
                *reinterpret_cast<float4 *>(dst + e) = make_float4(acc[tt][g][e], acc[tt][g][e + 1], acc[tt][g][e + 2], acc[tt][g][e + 3]);
            if (lane == 0) {
                mml[(warp * PAIRS + pr) * 2] = m_run[tt][g];
                mml[(warp * PAIRS + pr) * 2 + 1] = l_run[tt][g];
            }
        }
    }
    __syncthreads();
    // thread tid merges dims tid MD .. of every (token, head) over the warps in order
    float gv[TOK][MAX_GROUP][MD];
    if (splits == 1) {  // the gate's loads first, all in flight at once
#pragma unroll
        for (int tt = 0; tt < TOK; ++tt)
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g)
#pragma unroll
                for (int e = 0; e < MD; ++e)
                    gv[tt][g][e] = tt < nt && g < G ? __ldcg(a.gate + int64_t(t0 + tt) * a.gate_token +
                                                             int64_t(kvh * G + g) * a.gate_head + tid * MD + e)
                                                    : 0.0f;
    }
#pragma unroll
    for (int tt = 0; tt < TOK; ++tt) {
        if (tt >= nt) break;
        const int t = t0 + tt;
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            if (g >= G) break;
            const int h = kvh * G + g, pr = tt * MAX_GROUP + g;
            float m = -INFINITY;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) m = fmaxf(m, mml[(w * PAIRS + pr) * 2]);
            float l = 0.0f, o[MD];
#pragma unroll
            for (int e = 0; e < MD; ++e) o[e] = 0.0f;
            if (m != -INFINITY) {
#pragma unroll
                for (int w = 0; w < WARPS; ++w) {
                    const float mw = mml[(w * PAIRS + pr) * 2];
                    if (mw == -INFINITY) continue;
                    const float f = expf(mw - m);
                    l = fmaf(mml[(w * PAIRS + pr) * 2 + 1], f, l);
#pragma unroll
                    for (int e = 0; e < MD; ++e) o[e] = fmaf(msum[(w * PAIRS + pr) * HD + tid * MD + e], f, o[e]);
                }
            }
            if (splits == 1) {
#pragma unroll
                for (int e = 0; e < MD; ++e)
                    a.out[int64_t(t) * a.out_token + int64_t(h) * HD + tid * MD + e] =
                        (l > 0.0f ? o[e] / l : 0.0f) * sigmoid(gv[tt][g][e]);
            } else {
                float * p = a.partial + ((int64_t(t) * a.H + h) * splits + split) * (2 + HD);
                if (tid == 0) {
                    p[0] = m;
                    p[1] = l;
                }
#pragma unroll
                for (int e = 0; e < MD; ++e) p[2 + tid * MD + e] = o[e];
            }
        }
    }
}

// ---- The tensor-core kernel for T >= 2 (compute capability >= 8.0) ----
// grid (splits, Hkv, row_blocks(T, G)), WARPS * 32 threads: one chunk of keys (the same chunks and
// partial layout as attend_kernel, so combine_kernel is shared) of one KV head for up to
// mma_layout::ROWS (token, head) rows of that head's group (attention_mma_layout.h: row t G + g;
// rows >= T G are padding, never written). The CTA stages the chunk's keys 16 at a time (K and V
// tiles [16][HD] f16, cp.async, two buffers, one block barrier a tile); warp w scores its 16 rows
// against a tile with mma.sync m16n8k16 (q as f16 A fragments kept in registers, K's B fragments
// by ldmatrix), adds the mask, keeps each row's online softmax (f32; max across a row's 4 lanes,
// each lane its own share of the row's sum), rounds P to f16 A fragments and adds P V into f32
// accumulators (V's B fragments by ldmatrix.trans). A row's operations involve only its own q, its
// own token's mask row and the chunk's keys: its bits do not depend on the other rows of its CTA,
// so on the T; they differ from the decode kernel's (attend_kernel<HD, 1>: f32 q and P) within the
// f16 rounding of q and P. Scores are scale (q . k) + mask as in the CPU reference, with q unscaled.
namespace ml = mma_layout;
static_assert(ml::WARPS == WARPS, "one CTA shape for both kernels");
static_assert(MIN_CHUNK % ml::TILE_KEYS == 0, "chunks of whole tiles (but the last chunk's end)");

template <int HD>
__host__ __device__ constexpr int mma_row_bytes() { return HD * 2 + 16; }  // 16 bytes of padding: ldmatrix's 8 rows on distinct banks
// [2 buffers][K, V][TILE_KEYS keys][mma_row_bytes]
template <int HD>
__host__ __device__ constexpr int attend_mma_smem() { return 2 * 2 * ml::TILE_KEYS * mma_row_bytes<HD>(); }
static_assert(attend_mma_smem<256>() <= 48 * 1024, "no shared-memory attribute needed");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Four 8 x 8 b16 matrices from shared memory (attention_mma_layout.h), plain or transposed.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void * p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const void * p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
// d += a b: a 16 x 16 f16 A fragment, (b0, b1) a 16 x 8 f16 B fragment, d a 16 x 8 f32 C fragment.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned half2_bits(__half2 h) { return *reinterpret_cast<unsigned *>(&h); }
#endif

template <int HD>
__global__ void __launch_bounds__(WARPS * 32, 1) attend_mma_kernel(gated_args a, int chunk, int splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int TK = ml::TILE_KEYS;
    constexpr int KS = HD / 16;                                          // the scores' K steps
    constexpr int NT = HD / 8;                                           // the values' N tiles (8 dims)
    constexpr int ROW = mma_row_bytes<HD>(), VECS = HD * 2 / 16;         // a staged row; its 16-byte vectors
    constexpr int BUF = 2 * TK * ROW;                                    // a buffer: K tile, then V tile
    extern __shared__ __align__(16) uint8_t smem[];
    const int G = a.H / a.Hkv, rows = a.T * G;
    const int split = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wrow0 = blockIdx.z * ml::ROWS + warp * ml::WARP_ROWS;  // the warp's first row
    const bool active = wrow0 < rows;                                // (warp-uniform) any row of its own
    const int j0 = split * chunk, j1 = min(a.n_kv, j0 + chunk);
    const int n_tiles = (j1 - j0 + TK - 1) / TK;
    const int place = ml::place_of(lane);
    // the lane's rows x = 0, 1: row wrow0 + group + 8 x, its token (-1: padding) and query head
    auto row_at = [&](int x) { return wrow0 + ml::group_of(lane) + 8 * x; };
    auto head_at = [&](int x) { return kvh * G + ml::head_of_row(row_at(x), G); };
    int tok[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) tok[x] = row_at(x) < rows ? ml::token_of_row(row_at(x), G) : -1;
    cuda::launch_dependents();
    cuda::wait_for_previous();  // q, the cache rows, the mask and the gate are the previous kernels'
    auto stage = [&](int i) {   // tile i's K and V rows into buffer i % 2, one commit group (empty past the end)
        if (i < n_tiles) {
            uint8_t * st = smem + (i % 2) * BUF;
            const int base = j0 + i * TK;
#pragma unroll
            for (int idx = tid; idx < 2 * TK * VECS; idx += WARPS * 32) {
                const int m = idx / (TK * VECS), r = (idx / VECS) % TK, c = idx % VECS;
                const bool in = base + r < j1;  // keys past the chunk: zeros (finite scores, zero values)
                const __half * src = (m == 0 ? a.k + int64_t(in ? base + r : 0) * a.k_row
                                             : a.v + int64_t(in ? base + r : 0) * a.v_row) + int64_t(kvh) * HD + 8 * c;
                cp_async16(st + (m * TK + r) * ROW + 16 * c, src, in ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    // tile i's mask values of the lane's score elements as halves: mk[x][n] = keys 8 n + 2 place + {0, 1}
    // of row x (-inf for keys past the chunk, padding rows and tiles past the end)
    auto mask_of = [&](int i, __half2 (&mk)[2][2]) {
        const int base = j0 + i * TK;
        const __half ninf = __float2half(-INFINITY);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const __half * mrow = a.mask + int64_t(max(tok[x], 0)) * a.mask_row;
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int j = base + 8 * n + 2 * place;
                const bool ok = i < n_tiles && tok[x] >= 0;
                mk[x][n] = __halves2half2(ok && j < j1 ? __ldcg(mrow + j) : ninf, ok && j + 1 < j1 ? __ldcg(mrow + j + 1) : ninf);
            }
        }
    };
    stage(0);
    // q of the lane's rows as A fragments, K step ks: qf[ks][reg] (f16, unscaled; zeros for padding rows)
    unsigned qf[KS][4];
    __half2 mk[2][2];
    if (active) {
        const float * qrow[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) qrow[x] = a.q + int64_t(max(tok[x], 0)) * a.q_token + int64_t(head_at(x)) * a.q_head;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
            for (int reg = 0; reg < 4; ++reg) {
                const ml::rc e = ml::a_elem(lane, 2 * reg);
                const int x = ml::a_half(2 * reg);
                const float2 v = tok[x] >= 0 ? __ldcg(reinterpret_cast<const float2 *>(qrow[x] + 16 * ks + e.col))
                                       : make_float2(0.0f, 0.0f);
                qf[ks][reg] = half2_bits(__floats2half2_rn(v.x, v.y));
            }
        mask_of(0, mk);
    }
    float o[NT][4];  // the lane's C fragments of its rows' unnormalized value sums, dims 8 n ..
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // l_run: the lane's share of the sum
    const ml::rc ksrc = ml::k_ldsm_src(lane), vsrc = ml::v_ldsm_src(lane);
    for (int i = 0; i < n_tiles; ++i) {
        cp_async_wait<0>();  // this thread's copies of tile i are in
        __syncthreads();     // everyone's are; every warp is done with tile i - 1, whose buffer tile i + 1 takes
        stage(i + 1);
        if (!active) continue;
        const uint8_t * sk = smem + (i % 2) * BUF;
        const uint8_t * sv = sk + TK * ROW;
        // scores of keys 0-7 (s[0]) and 8-15 (s[1]) of the tile
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const uint8_t * kp = sk + ksrc.row * ROW + 2 * ksrc.col;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            unsigned b[4];
            ldsm_x4(b, kp + 32 * ks);
            mma_16816(s[0], qf[ks], b[0], b[1]);
            mma_16816(s[1], qf[ks], b[2], b[3]);
        }
        // scale q.k + mask; element e of s[n] is row e / 2, key 8 n + 2 place + e % 2
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 mf = __half22float2(mk[e / 2][n]);
                s[n][e] = fmaf(a.scale, s[n][e], e % 2 ? mf.y : mf.x);
            }
        // online softmax per row: the tile's max over the row's 4 lanes (the same bits in each)
        float factor[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            float mx = fmaxf(fmaxf(s[0][2 * x], s[0][2 * x + 1]), fmaxf(s[1][2 * x], s[1][2 * x + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[x], mx);
            factor[x] = m_new == -INFINITY ? 1.0f : expf(m_run[x] - m_new);
            m_run[x] = m_new;
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int b = 0; b < 2; ++b) s[n][2 * x + b] = m_new == -INFINITY ? 0.0f : expf(s[n][2 * x + b] - m_new);
        }
        // P as the values' A fragment (attention_mma_layout.h's p_source); the sums take the rounded P
        unsigned pa[4];
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
            const ml::p_src ps = ml::p_source(reg);
            const __half2 h = __floats2half2_rn(s[ps.tile][2 * ps.pair], s[ps.tile][2 * ps.pair + 1]);
            pa[reg] = half2_bits(h);
            const float2 hf = __half22float2(h);
            l_run[ps.pair] = reg < 2 ? l_run[ps.pair] * factor[ps.pair] + (hf.x + hf.y) : l_run[ps.pair] + (hf.x + hf.y);
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] *= factor[e / 2];
        const uint8_t * vp = sv + vsrc.row * ROW + 2 * vsrc.col;
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; ++n2) {
            unsigned b[4];
            ldsm_x4_trans(b, vp + 32 * n2);
            mma_16816(o[2 * n2], pa, b[0], b[1]);
            mma_16816(o[2 * n2 + 1], pa, b[2], b[3]);
        }
        mask_of(i + 1, mk);  // the next tile's (in flight over the barrier and the next scores)
    }
    cp_async_wait<0>();
    if (!active) return;  // (no block barrier follows)
    // each row's sum over its 4 lanes (the same bits in each), then the gated output or the chunk's partial
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        float l = l_run[x];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (tok[x] < 0) continue;
        const int t = tok[x], h = head_at(x);
        if (splits == 1) {
            const float * gv = a.gate + int64_t(t) * a.gate_token + int64_t(h) * a.gate_head;
            float * dst = a.out + int64_t(t) * a.out_token + int64_t(h) * HD;
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int b = 0; b < 2; ++b) {
                    const int d = 8 * n + ml::c_elem(lane, 2 * x + b).col;
                    dst[d] = (l > 0.0f ? o[n][2 * x + b] / l : 0.0f) * sigmoid(__ldcg(gv + d));
                }
        } else {
            float * p = a.partial + ((int64_t(t) * a.H + h) * splits + split) * (2 + HD);
            if (place == 0) {
                p[0] = m_run[x];
                p[1] = l;
            }
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int b = 0; b < 2; ++b) p[2 + 8 * n + ml::c_elem(lane, 2 * x + b).col] = o[n][2 * x + b];
        }
    }
#endif
}

// grid (H, T), HD threads: the chunks of (t, h) added in order, normalized, gated. The chunks are
// read BATCH at a time, every load of a batch issued before its sums (an online max across batches).
template <int HD>
__global__ void __launch_bounds__(HD) combine_kernel(gated_args a, int splits) {
    constexpr int BATCH = 16;
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    cuda::launch_dependents();
    cuda::wait_for_previous();  // the partial sums
    const float * p = a.partial + (int64_t(t) * a.H + h) * splits * (2 + HD);
    const float gv = __ldcg(a.gate + int64_t(t) * a.gate_token + int64_t(h) * a.gate_head + d);
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += BATCH) {
        float ms[BATCH], ls[BATCH], os[BATCH];
#pragma unroll
        for (int x = 0; x < BATCH; ++x) {
            const bool in = s0 + x < splits;
            const float * ps = p + (s0 + x) * (2 + HD);
            ms[x] = in ? __ldcg(ps) : -INFINITY;
            ls[x] = in ? __ldcg(ps + 1) : 0.0f;
            os[x] = in ? __ldcg(ps + 2 + d) : 0.0f;
        }
        float mb = m;
#pragma unroll
        for (int x = 0; x < BATCH; ++x) mb = fmaxf(mb, ms[x]);
        if (mb == -INFINITY) continue;  // nothing seen yet
        const float f = m == -INFINITY ? 0.0f : expf(m - mb);
        l *= f;
        o *= f;
#pragma unroll
        for (int x = 0; x < BATCH; ++x) {
            if (ms[x] == -INFINITY) continue;
            const float w = expf(ms[x] - mb);
            l = fmaf(ls[x], w, l);
            o = fmaf(os[x], w, o);
        }
        m = mb;
    }
    a.out[int64_t(t) * a.out_token + int64_t(h) * HD + d] = (l > 0.0f ? o / l : 0.0f) * sigmoid(gv);
}

template <int HD, int TOK>
cudaError_t launch_attend(const gated_args & a, int dev, int chunk, int splits, cudaStream_t stream) {
    constexpr int smem = attend_smem<HD, TOK>();
    static unsigned long long configured = 0;  // bit d: device d's shared-memory limit raised
    if (!(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & (1ull << dev))) {
        const cudaError_t e =
            cudaFuncSetAttribute(attend_kernel<HD, TOK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        __atomic_fetch_or(&configured, 1ull << dev, __ATOMIC_ACQ_REL);
    }
    return cuda::launch(attend_kernel<HD, TOK>, dim3(splits, a.Hkv, (a.T + TOK - 1) / TOK), dim3(WARPS * 32), smem,
                        stream, cuda::pdl_kernel<attend_kernel<HD, TOK>>(dev), a, chunk, splits);
}

template <int HD>
cudaError_t launch_attend_mma(const gated_args & a, int dev, int chunk, int splits, cudaStream_t stream) {
    const dim3 grid(splits, a.Hkv, ml::row_blocks(a.T, a.H / a.Hkv));
    return cuda::launch(attend_mma_kernel<HD>, grid, dim3(WARPS * 32), attend_mma_smem<HD>(), stream,
                        cuda::pdl_kernel<attend_mma_kernel<HD>>(dev), a, chunk, splits);
}

// Whether T tokens take the tensor-core kernel on device dev: a verify (T >= 2) where the kernel
// runs code for compute capability >= 8.0 (mma.sync m16n8k16, ldmatrix, cp.async).
template <int HD>
bool takes_mma(int T, int dev) {
    return T >= 2 && cuda::code_at_least<attend_mma_kernel<HD>, 80>(dev);
}

template <int HD>
cudaError_t launch_hd(const gated_args & a, int dev, cudaStream_t stream) {
    int chunk = 0, splits = 0;
    split_of(a.n_kv, chunk, splits);
    if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
    // a decode step: one token a CTA on CUDA cores; a verify: the tensor-core kernel, else (devices
    // before 8.0) two tokens a CTA on CUDA cores sharing the staged rows
    cudaError_t err = a.T == 1            ? launch_attend<HD, 1>(a, dev, chunk, splits, stream)
                      : takes_mma<HD>(a.T, dev) ? launch_attend_mma<HD>(a, dev, chunk, splits, stream)
                                              : launch_attend<HD, MAX_TOK>(a, dev, chunk, splits, stream);
    if (err != cudaSuccess || splits == 1) return err;
    return cuda::launch(combine_kernel<HD>, dim3(a.H, a.T), dim3(HD), 0, stream,
                        cuda::pdl_kernel<combine_kernel<HD>>(dev), a, splits);
}

// Runs the op on `stream`; a.partial holds partial_floats(..) floats when there is more than one chunk.
inline cudaError_t run_gated(const gated_args & a, cudaStream_t stream) {
    if (!supported(a.hd, a.H, a.Hkv, a.T) || a.n_kv < 1 || a.Hkv > 65535 || a.H < a.Hkv) return cudaErrorInvalidValue;
    // cp.async reads 16-byte vectors of the cache rows; q is read in 16-byte vectors
    if ((reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v) | uintptr_t(a.k_row * 2) |
         uintptr_t(a.v_row * 2) | reinterpret_cast<uintptr_t>(a.q) | uintptr_t(a.q_head * 4) | uintptr_t(a.q_token * 4)) & 15)
        return cudaErrorInvalidValue;
    if (partial_floats(a.hd, a.H, a.T, a.n_kv) > 0 && a.partial == nullptr) return cudaErrorInvalidValue;
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    return a.hd == 256 ? launch_hd<256>(a, dev, stream) : launch_hd<128>(a, dev, stream);
}

}  // namespace lucebox::kernels::attention::cuda_step
