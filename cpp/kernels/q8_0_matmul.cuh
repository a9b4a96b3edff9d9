// Q8_0, Q4_K, Q5_K and Q6_K matrix products with few activation columns (decode: 1 column; a DFlash verify:
// 16; a DDTree verify: up to 64) on the int8 tensor cores, reading each weight byte once.
//
//     y[n, m] = sum_k W[m, k] * x[n, k] (+ bias[n, m])       (plain; bias per column or shared)
//     y[n, m] = (U x_n)[m] * silu((G x_n)[m])                (gated: the SwiGLU FFN's up and gate)
//
// optionally with x_n replaced by its RMS norm times a weight vector (norm_w: the layer norm that
// feeds the product, fused: no normalized copy of x is written).
//
// W: [M rows][K] in ggml's Q8_0 layout (blocks of 34 bytes: fp16 scale d, 32 int8 q; value d*q)
// or Q4_K / Q6_K layout (q8_0_matmul_args.h), rows row_bytes apart, or (a.tiled; Q6_K always) the
// same blocks in weight_tiles.h's row-tiled order, where each staged 16-row piece is one contiguous
// block (Q6_K's in its fragment order). x: [N][K] float; y: [N][M] float. The activations are first
// quantized to int8 (scale amax/127, round to nearest: the rounding of ggml's q8_1) per 32 values
// for Q8_0 weights, per 256 for Q4_K and Q6_K (as ggml's CPU q8_K), into [K/32][8*NG][32] (NG
// groups of 8 columns; Q6_K: each chunk of 8 blocks in its weights' fragment order, x_q6k_offset).
// The product's rows form tiles of 16 or 32 weight rows (gated: 16 rows of U and the same 16 rows
// of G; see stage_bytes); each CTA takes one tile, or where there are more tiles than CTAs fit on
// the device at once, every gridDim.x-th. Its WARPS warps split each tile's K between them: each warp streams
// 256-value chunks of its rows (running on into its next tile's), and the same blocks
// of the quantized activations, into shared memory with 16-byte cp.async (STAGES deep), and
// multiplies them with mma.m16n8k32 (A = 16 weight rows, B = 8 activation columns, one 32-value
// block per instruction). The warps' partial sums are added in a fixed order, so the result of
// column n does not depend on N or on the other columns: a decode step and a verify of the same
// token compute bit-identical products.
//
// More than MAX_COLS (64) columns run as one launch pair per 64 columns, one after another on the
// stream with the same scratch (per max_cols(dev) columns on a device whose shared memory per block
// cannot hold the 64-column launch).
// Requirements (checked by check_args): K % 256 == 0; N >= 1; W (and G) 16-byte
// aligned with row_bytes % 16 == 0. Header-only so that tests/cpp/test_q8_0_matmul.cu can build it
// without ggml; the arguments and their checks are q8_0_matmul_args.h (plain C++), the ggml hook
// that routes MUL_MAT nodes here is q8_0_matmul.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "cuda_launch.cuh"
#include "q8_0_matmul_args.h"
#include "weight_tiles.h"

namespace lucebox::kernels::q8_0 {

constexpr int CHUNK_BYTES = CHUNK_BLOCKS * BLOCK_BYTES;  // 272 = 17 x 16 bytes (q8_0)
// Probe knobs (bench/probes/q8_0_matmul_bench.cu; the defaults are the measured choice):
// LUCEBOX_Q8_0_STAGES: chunks staged per warp (STAGES - 1 in flight while one is multiplied; 3 does not
// compile: a 64-column launch's CTA would outgrow Hopper's 227 KB, the static_assert on worst_smem_bytes);
// LUCEBOX_Q8_0_ONE_TILE_MAX_NG: plain products of up to 8 * this many columns take one m16 tile of
// rows per warp (more CTAs), more columns two (each activation chunk serves 32 rows).
#ifndef LUCEBOX_Q8_0_STAGES
#define LUCEBOX_Q8_0_STAGES 2
#endif
constexpr int WARPS = 4;  // per CTA, splitting K (H200 probe: 8 slower, docs/benchmarks.md)
// LUCEBOX_Q8_0_ST3_MAX_M: Q4_K (and Q5_K) products of <= 8 columns and at most this many rows stage 3 chunks
// per warp (few CTAs, long rows: more bytes in flight; H200 probe at STAGES=3 for everything:
// ssm_out 15.1 -> 11.4 us, attn_gate 13.0 -> 10.1, the large shapes slower; as chosen here, row-tiled,
// the 18 shapes' one-column sum 210.7 -> 183.4 us against -DLUCEBOX_Q8_0_ST3_MAX_M=0); 0: never.
#ifndef LUCEBOX_Q8_0_ST3_MAX_M
#define LUCEBOX_Q8_0_ST3_MAX_M 6144
#endif
// LUCEBOX_Q8_0_SPREAD 1: a product of one wave spreads its CTAs over all multiprocessors
// (cuda::spread_smem). H200 probe, row-tiled, the 18 shapes' one-column sum against 0: Q8_0 217.1 ->
// 202.8 us (ffn_down, 320 CTAs of at most 4 a multiprocessor, 34.3 -> 27.7), Q4_K 166.2 -> 163.0,
// Q6_K 216.6 -> 205.5; capping every grid at 3 or 2 CTAs a multiprocessor was slower (211.4, 240.2).
#ifndef LUCEBOX_Q8_0_SPREAD
#define LUCEBOX_Q8_0_SPREAD 1
#endif
// LUCEBOX_Q8_0_ONE_TILE_MAX_NG 2 (up to 16 columns one m16 tile a warp): H200 probe, row-tiled, the
// 18 shapes' 16-column sum 250.3 -> 237.4 us (Q8_0), 258.3 -> 238.5 (Q4_K), one column unchanged.
#ifndef LUCEBOX_Q8_0_ONE_TILE_MAX_NG
#define LUCEBOX_Q8_0_ONE_TILE_MAX_NG 2
#endif
constexpr int STAGES = LUCEBOX_Q8_0_STAGES;            // chunks in flight per warp
static_assert(STAGES >= 2, "one chunk loads while another is multiplied");
// On compute capability >= 9.0 both kernels are programmatic dependent launches (PDL), like
// ggml's own kernels: the quantization launches while the previous kernel runs and waits for it
// before reading x; the product's CTAs start while the quantization runs and load their first weight
// chunks (weights do not depend on it) before they wait for the quantized activations; and the
// product lets the next kernel launch once all its CTAs have started. H200 probe, product after
// quantization only, in a CUDA graph: 0.5-1.3 us less per product (5 % over the decode shapes),
// no measurable change of a decode step then (docs/benchmarks.md). An L2 bulk prefetch of the rows'
// first chunks instead of the early chunk loads was slower at every depth tried.
// LUCEBOX_Q8_0_PERSISTENT W: a product of at least W times as many tiles as CTAs fit on the device
// at once runs as a grid of the resident CTAs, each looping over tiles with its warps' chunk
// pipelines running on from one tile into the next, not as one CTA per tile (a pipeline fill and
// drain per tile); 0: never. H200 probe, row-tiled, against 0: Q8_0 gate+up (4.1 tiles a CTA) 51.8
// -> 50.8 us at one column, 56.1 -> 53.9 at 16, Q4_K's at 16 44.2 -> 41.8; with 1.5-2 tiles a CTA
// (the stacks, ffn_up alone) slower, up to 18.0 -> 21.8 (Q4_K DeltaNet stack, one column).
#ifndef LUCEBOX_Q8_0_PERSISTENT
#define LUCEBOX_Q8_0_PERSISTENT 3
#endif
// LUCEBOX_Q8_0_ONE_COL: which one-column products (decode) stage their one column of activations
// only (see stage_bytes), with LUCEBOX_Q8_0_ONE_STAGES chunks per warp, instead of a group of 8
// columns: 1 Q6_K's, 2 every format's, 0 none. H200 probe, row-tiled, the 9 shapes' one-column sum
// against 0: Q6_K 193.6 -> 184.8 us at 3 stages (191.4 at 2, 194.3 at 4; ffn_down 28.6 -> 26.6),
// but Q8_0 193.1 -> 200.6 and Q4_K 131.3 -> 141.5 (at 2 stages 202.8 and 149.1: their smaller CTAs
// change how the grids fill the device, e.g. Q4_K's DeltaNet stack one wave of 1030 CTAs, 16.2 ->
// 21.1 us), hence 1.
#ifndef LUCEBOX_Q8_0_ONE_COL
#define LUCEBOX_Q8_0_ONE_COL 1
#endif
#ifndef LUCEBOX_Q8_0_ONE_STAGES
#define LUCEBOX_Q8_0_ONE_STAGES 3
#endif
#ifndef LUCEBOX_Q8_0_PDL  // 0: plain launches (for the probe's A/B)
#define LUCEBOX_Q8_0_PDL 1
#endif

static_assert(CHUNK_BYTES % 16 == 0 && Q4K_BLOCK_BYTES % 16 == 0 && Q5K_BLOCK_BYTES % 16 == 0,
              "a staged row chunk must be whole 16-byte vectors");
static_assert(16 * Q6K_BLOCK_BYTES % 16 == 0, "a staged q6_k tile chunk (16 rows) must be whole 16-byte vectors");

// One stage of a warp: the weight chunk [16 * m_tiles rows][272], the activations' int8
// [8][cols][32] and their scales [8][cols] (cols = 8 * column groups). A warp takes one m16 tile
// of rows for a plain product of <= 8 columns (more CTAs, more chunks in flight per multiprocessor:
// 4 CTAs of 53 KB), else two (a gated product: U's and G's; 9..64 columns: each activation chunk
// serves 32 rows, halving its shared-memory and L2 traffic).
// q4_k / q5_k: 144 / 176-byte row chunks, and the activation sums [8][cols] after the scales. A one-column
// product (decode) stages its one column only (xcols 1; the mma's other 7 columns are zero
// registers): 4.6 KB a Q8_0 stage instead of 6.6, so more chunks fit in flight.
__host__ __device__ constexpr int stage_bytes(int xcols, int m_tiles, weight_type wt = weight_type::q8_0) {
    return 16 * m_tiles * chunk_bytes(wt) + CHUNK_BLOCKS * xcols * (QK + 4 + (has_mins(wt) ? 4 : 0));
}
// A column's sum of squares is added as NORM_PARTS partial sums of quantize_columns' sums (those of
// blocks, or of chunks where the activations have chunk scales: s = p mod NORM_PARTS), each
// thread's loads NORM_BATCH at a time, all in flight before their adds (Q8_0, K = 5120: a partial sum's 20
// blocks in 2 round trips to L2, against ~6 with the compiler's unrolling by 4; chunk sums: 3 in one), neighbouring threads
// on neighbouring columns (one sector for 8 columns' loads, not 8). The batches keep the order of the
// adds: the same bits. H100 probe (--norm, 16 columns, against one load at a time): Q4_K ffn_up 30.6
// -> 26.6 us, DeltaNet stack 29.5 -> 26.4, ssm_out 14.0 -> 11.2; Q6_K ffn_down 45.3 -> 39.8, stack 43.0
// -> 36.9. A product of one staged column (ONE) keeps one load at a time, one column's 8 partial sums on
// 8 neighbouring threads: batched, its Q6_K products were 0.9-2.8 us slower (ffn_down 30.6 -> 33.4).
// 32 loads at a time raised 14 kernels' registers and spilled in two (docs/benchmarks.md).
constexpr int NORM_PARTS = 8;
constexpr int NORM_BATCH = 16;

// The extra weight-only buffers a warp of a launch of `cols` staged columns may keep (matmul's WA):
// its weight chunks are then loaded that many chunks further ahead than its activations (weight_slot,
// and the commit groups in matmul). Only a gated Q4_K or Q5_K product of 16 staged columns (verify's
// gate/up) takes one, and only where its CTAs fit as many a multiprocessor as without it (launch_groups:
// on Hopper 2 of 96.8 / 109.1 KB, as of 78.4 / 86.6; an A100's 164 KB would hold 1 Q4_K CTA of 96.8
// against 2 of 78.4, and 1 Q5_K CTA either way). H100, 5120 ->
// 2x17408: Q4_K 44.1 -> 40.3 us (8 staged columns 37.5 -> 37.1; forty-third session), Q5_K 51.2 ->
// 47.8 (forty-fourth; every other Q5_K launch level). Measured and left at 0 (docs/benchmarks.md):
// gated Q8_0 and Q6_K (their larger CTAs drop to 1 a multiprocessor: 70.5 -> 81.5 and 63.5 -> 64.9 us)
// and plain products (Q6_K ffn_down 16 columns 37.7 -> 47.3 us; Q4_K gains and losses of a few percent
// by shape).
__host__ __device__ constexpr int weights_ahead(int cols, weight_type wt, bool gated) {
    return gated && has_mins(wt) && cols == 16 ? 1 : 0;
}
// The warps' stages, their `ahead` extra weight buffers each, then the columns' RMS norm factors
// [cols] and partial sums [cols][NORM_PARTS].
__host__ __device__ constexpr int smem_bytes(int cols, int m_tiles, weight_type wt = weight_type::q8_0, int stages = STAGES,
                                             bool one = false, int ahead = 0) {
    return WARPS * stages * stage_bytes(one ? 1 : cols, m_tiles, wt) + WARPS * ahead * 16 * m_tiles * chunk_bytes(wt) +
           cols * 4 * (1 + NORM_PARTS);
}

namespace detail {

// c += A (16x32 s8, row-major) * B (32x8 s8, column-major), int32 accumulators.
__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();  // the host side only launches on compute capability >= 8.0
#endif
}

// The same with A unsigned (u8: 0..255).
__device__ __forceinline__ void mma_u8s8(int (&c)[4], const int (&a)[4], int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// c += A (16x16 s8, row-major) * B (16x8 s8, column-major): a0 = row g, k 4t..4t+3; a1 = row g+8,
// same k; b = k 4t..4t+3 of column g; c as in mma_s8.
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], const int (&a)[2], int b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b));
#else
    __trap();
#endif
}

// c += A (16x8 tf32, row-major) * B (8x8 tf32, column-major), fp32 accumulators: a0 = row g, k t;
// a1 = row g+8, k t; a2 = row g, k t+4; a3 = row g+8, k t+4; b0 = k t of column g, b1 = k t+4; c as
// in mma_s8. The operands are fp32 registers of which the tensor core reads the tf32 bits.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const float (&a)[4], float b0, float b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])), "r"(__float_as_uint(a[3])),
          "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
#else
    __trap();
#endif
}

// Four q6_k quants q = nibble | field << 4 (0..63) -> the signed bytes 4 (q - 32): 4q puts the
// nibble at bits 2..5 and the field at bits 6..7, and 4q - 128 flips bit 7, which qh_flipped
// (qh ^ 0xAAAAAAAA: every field's high bit flipped) already has. nib: the low (0) or high (1)
// nibbles of ql; field: the 2-bit field 0..3 of qh (both constants in the unrolled loops that call
// it). Four operations; the sums are 4x (exact), the weight scale d / 4 (exact).
__device__ __forceinline__ int q6_times4_centered(uint32_t ql, uint32_t qh_flipped, int nib_half, int field_at) {
    const uint32_t nib = nib_half == 0 ? ql << 2 : ql >> 2;
    const uint32_t field = field_at == 3 ? qh_flipped : qh_flipped << (6 - 2 * field_at);
    return int((nib & 0x3C3C3C3Cu) | (field & 0xC0C0C0C0u));
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }  // as ggml's CUDA swiglu

// Signed byte k (0..3, a constant where called) of w, sign-extended by one prmt: selector nibble 0
// picks byte k, nibbles 1..3 (k | 8) replicate its sign bit.
__device__ __forceinline__ int sbyte(uint32_t w, int k) {
    const uint32_t sel = uint32_t(k) | uint32_t(k | 8) << 4 | uint32_t(k | 8) << 8 | uint32_t(k | 8) << 12;
    int r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(sel));
    return r;
}

template <typename V>  // word i (0..3) of a 16-byte vector
__device__ __forceinline__ uint32_t word_of(const V & v, int i) {
    return uint32_t(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}

// Q6_K's activation order inside a chunk of 8 blocks and `cols` columns (8 * cols * 32 bytes; the
// weights' fragment order, tiles::q6k_piece_offset): value v (0..31) of block s (0..7) of column
// col, with s = 4h + p and v = 16u + 4t + i, at byte (((2h + p / 2) cols + col) 4 + t) 16 + 8 (p % 2)
// + 4u + i. So lane 4g + t finds its 4 values of both halves u of two blocks 4h + 2 half, + 1 in one
// 16-byte vector, and the 8 lanes of a quarter warp (g, g + 1) read 128 distinct bytes.
__host__ __device__ __forceinline__ int x_q6k_offset(int s, int v, int col, int cols) {
    const int h = s / 4, p = s % 4, u = v / 16, t = (v % 16) / 4, i = v % 4;
    return (((2 * h + p / 2) * cols + col) * 4 + t) * 16 + 8 * (p % 2) + 4 * u + i;
}

// One warp per (block b, column n) of v = x (or x * norm_w; GROUP > 1: a thread block of GROUP warps
// per group of GROUP blocks and column, which share one scale): xq[b][n][0..31], xd[b][n]
// (the group's scale, the same for its blocks: amax / 127 over GROUP * 32 values), xs[b][n] = the
// sum of block b's v when xs is not null, and when norm_w is not null the sums of x^2: ss[b][n] of
// block b (GROUP 1), ss[g][n] of group g (GROUP > 1: its blocks' sums added in order), so that a
// product reads K / 256 of them (in one round trip to L2) where its activations have chunk scales.
// GROUP 1 for Q8_0 weights (their blocks' 32 values), CHUNK_BLOCKS for Q4_K (one scale per 256
// values, as ggml's CPU q8_K: the product then sums a chunk's sub-blocks in integers). Q6K_ORDER:
// each chunk's int8 values in x_q6k_offset's order (Q6_K weights) instead of [block][column][32].
// x is not __restrict__ and is read with ld.global.cg: under PDL this kernel is resident while the
// kernel that writes x still runs, and a restrict-qualified const pointer would be read through the
// non-coherent cache (LDG.E.CONSTANT), which is only valid for data read-only for the kernel's whole
// lifetime (llama.cpp hit races from exactly this).
template <int GROUP, bool Q6K_ORDER>
__global__ void quantize_columns(const float * x, int64_t x_stride, int K, int N, int cols,
                                 int8_t * __restrict__ xq, float * __restrict__ xd, float * __restrict__ xs,
                                 const float * __restrict__ norm_w, float * __restrict__ ss) {
    cuda::launch_dependents();  // the product may start now
    const int lane = threadIdx.x % 32;
    const int n_groups = K / QK / GROUP;
    // GROUP 1: warp wid of the grid = (block wid / N, column wid % N); GROUP > 1: thread block wid =
    // (group wid / N, column wid % N), its warp w the group's block w. The padding columns N..cols-1
    // are not written: the product zero-fills their int8 values, and their scales and sums reach
    // only their own sums, which are never written.
    const int64_t wid = GROUP == 1 ? (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32 : int64_t(blockIdx.x);
    if (wid >= int64_t(n_groups) * N) return;  // (GROUP > 1: the whole thread block)
    const int b = int(wid / N) * GROUP + (GROUP == 1 ? 0 : int(threadIdx.x / 32)), n = int(wid % N);
    // the norm weight (a weight: args_from_ggml takes no computed one) is read before the wait, off the
    // critical path: H100 probe, sums of the 9 shapes with --norm, Q4_K 156.3 -> 154.5 us at one column,
    // 185.4 -> 182.4 at 16 (docs/benchmarks.md)
    const float w = norm_w != nullptr ? norm_w[b * QK + lane] : 0.0f;
    cuda::wait_for_previous();  // x is the previous kernel's output
    float v = __ldcg(x + int64_t(n) * x_stride + int64_t(b) * QK + lane);
    __shared__ float block_sq[GROUP];  // (GROUP > 1, with norm_w: the group's blocks' sums of squares)
    if (norm_w != nullptr) {
        float sq = v * v;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (lane == 0) {
            if constexpr (GROUP == 1) ss[int64_t(b) * cols + n] = sq;
            else block_sq[threadIdx.x / 32] = sq;
        }
        v *= w;
    }
    if (xs != nullptr) {
        float sum = v;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) xs[int64_t(b) * cols + n] = sum;
    }
    float amax = fmaxf(0.0f, fabsf(v));  // a NaN value is dropped, as fmaxf drops it below
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if constexpr (GROUP > 1) {  // the group's maximum over its blocks' (exact: the order does not matter)
        __shared__ float block_max[GROUP];
        if (lane == 0) block_max[threadIdx.x / 32] = amax;
        __syncthreads();
        if (norm_w != nullptr && threadIdx.x == 0) {  // the group's sum of squares: its blocks' in order
            float sq = block_sq[0];
#pragma unroll
            for (int i = 1; i < GROUP; ++i) sq += block_sq[i];
            ss[int64_t(b / GROUP) * cols + n] = sq;
        }
#pragma unroll
        for (int i = 0; i < GROUP; ++i) amax = fmaxf(amax, block_max[i]);
    }
    const float d = amax / 127;
    const int64_t at = int64_t(b) * cols + n;
    const int64_t chunk_at = int64_t(b / CHUNK_BLOCKS) * CHUNK_BLOCKS * cols * QK;
    const int64_t q_at = Q6K_ORDER ? chunk_at + x_q6k_offset(b % CHUNK_BLOCKS, lane, n, cols) : at * QK + lane;
    xq[q_at] = int8_t(amax == 0.0f ? 0.0f : roundf(v / d));
    if (lane == 0) xd[at] = d;
}

// 8 bytes at p + 2 (a Q8_0 block's quants 8t..8t+7 when p = block + 8t): p is 4-byte aligned when
// odd_block is false (the quants then sit 2 bytes off a word), p + 2 is when it is true. Called
// from fully unrolled loops, so odd_block is a constant there.
__device__ __forceinline__ void load_quants(bool odd_block, const uint8_t * p, int & lo, int & hi) {
    if (odd_block) {
        const uint32_t * q = reinterpret_cast<const uint32_t *>(p + 2);
        lo = int(q[0]);
        hi = int(q[1]);
    } else {
        const uint32_t * q = reinterpret_cast<const uint32_t *>(p);
        const uint32_t w0 = q[0], w1 = q[1], w2 = q[2];
        lo = int(__funnelshift_r(w0, w1, 16));
        hi = int(__funnelshift_r(w1, w2, 16));
    }
}

// The activation scales of accumulator columns 8j + 2t and 8j + 2t + 1 from a block's staged scales
// sd[cols]; ONE: sd holds column 0's alone, the other columns' are 0 (never written).
template <bool ONE>
__device__ __forceinline__ float2 x_scales(const float * sd, int j, int t) {
    if constexpr (ONE) return make_float2(t == 0 ? sd[0] : 0.0f, 0.0f);
    else return *reinterpret_cast<const float2 *>(sd + COL_GROUP * j + 2 * t);
}

// A chunk's integer sums of a super-block format into the accumulators: acc += d_row * dx_col *
// isum, d[mt][0 / 1] the weight scale of rows g / g + 8, dx the chunk's activation scale of each
// column (sd: the chunk's staged scales, every block holding it), in accumulator order (see below).
template <bool ONE, int M_TILES, int NG>
__device__ __forceinline__ void add_chunk_sums(float (&acc)[M_TILES][NG][4], const int (&isum)[M_TILES][NG][4],
                                               const float (&d)[M_TILES][2], const float * sd, int t) {
#pragma unroll
    for (int j = 0; j < NG; ++j) {
        const float2 dx = x_scales<ONE>(sd, j, t);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            acc[mt][j][0] = __fmaf_rn(__fmul_rn(d[mt][0], dx.x), float(isum[mt][j][0]), acc[mt][j][0]);
            acc[mt][j][1] = __fmaf_rn(__fmul_rn(d[mt][0], dx.y), float(isum[mt][j][1]), acc[mt][j][1]);
            acc[mt][j][2] = __fmaf_rn(__fmul_rn(d[mt][1], dx.x), float(isum[mt][j][2]), acc[mt][j][2]);
            acc[mt][j][3] = __fmaf_rn(__fmul_rn(d[mt][1], dx.y), float(isum[mt][j][3]), acc[mt][j][3]);
        }
    }
}

// Where warp `warp` stages chunk i's weights with WA > 0 weight-only buffers (weights_ahead):
// buffer i % (ST + WA), the weight parts of its ST stages (STAGE bytes each, the warps' stages first in
// shared memory) first, then its WA buffers of W_BYTES after every warp's stages. (With WA 0 the
// weights share stage i % ST with the activations.)
template <int ST, int WA, int STAGE, int W_BYTES>
__device__ __forceinline__ uint8_t * weight_slot(uint8_t * smem, int warp, int i) {
    const int b = i % (ST + WA);
    return b < ST ? smem + (warp * ST + b) * STAGE : smem + WARPS * ST * STAGE + (warp * WA + b - ST) * W_BYTES;
}

// Fragments of m16n8k32 (lane = 4g + t): A a0 = row g, k 4t..4t+3; a1 = row g+8, same k; a2 = row
// g, k 16+4t..; a3 = row g+8, k 16+4t..; B b0 = k 4t..4t+3 of column g, b1 = k 16+4t.. of column g;
// C c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8. The k order inside a block is ours to choose
// as long as A and B agree: lane t holds the block's values 8t..8t+3 in its first slot and
// 8t+4..8t+7 in its second, so each lane reads 8 consecutive bytes of a weight row and of a column.
//
// q4_k (Q4K): a chunk is one 144-byte super-block per row; its 8 sub-blocks meet the chunk's 8
// activation blocks one mma each (the 4-bit quants as unsigned bytes with one mask: q for the low
// nibbles, 16q for the high ones). q5_k (Q5K, MINS as q4_k): a 176-byte super-block, its fifth bits
// (qh) merged into the same bytes (q5k_quant_bytes: q for even sub-blocks, 8q for odd ones, their
// sums times 16 and 2 times the scale). The activations have one scale per chunk
// (quantize_columns<CHUNK_BLOCKS>), so the sub-blocks' integer sums times their 6-bit scales add up
// exactly in int32 (16x, see the loop); the chunk's sum is scaled once by d / 16 and the activations'
// scale, and dmin times the sum over the
// sub-blocks of min_s times the activation block's float sum (one tf32 mma, see below) is subtracted.
// With a.norm_w, ss holds quantize_columns' sums of squares (per block, or per chunk for chunk-scaled
// formats) and every column's sums are scaled by its norm factor rsqrt(sum / K + eps). The threads load
// those sums while the first weight chunks are in flight (NORM_PARTS partial sums per column, sums p, p + 8, ..),
// and add the partials in order after the main loop: a fixed order, so the factor of column n does
// not depend on N either.
template <int NG, bool GATED, int M_TILES, weight_type WT, int ST = STAGES, bool ONE = false, int WA = 0>
__global__ void __launch_bounds__(WARPS * 32)
matmul(matmul_args a, const int8_t * __restrict__ xq, const float * __restrict__ xd, const float * __restrict__ xs,
       const float * ss) {  // ss: quantize_columns' output, read after griddepcontrol.wait: not restrict, ld.global.cg
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int COLS = COL_GROUP * NG;
    // ONE (N == 1): the activations hold one column ([K/32][1][32], quantize_columns with cols 1)
    // and so do the stages; lanes g > 0 take zeros for the mma's B columns 1..7
    static_assert(!ONE || NG == 1, "one column is one column group");
    constexpr int XC = ONE ? 1 : COLS;
    static_assert(!GATED || M_TILES == 2, "a gated warp takes 16 rows of U and the same 16 of G");
    constexpr int TILE_ROWS = 16 * M_TILES;
    constexpr bool Q5K = WT == weight_type::q5_k, Q6K = WT == weight_type::q6_k;
    constexpr bool MINS = has_mins(WT);  // q4_k (Q4K in the comments) or Q5K
    constexpr int CB = chunk_bytes(WT), CHUNK_VECS = CB / 16;
    constexpr int STAGE = stage_bytes(XC, M_TILES, WT);
    constexpr int W_BYTES = TILE_ROWS * CB;
    constexpr int X_BYTES = CHUNK_BLOCKS * XC * QK;
    constexpr int X_VECS = X_BYTES / 16, D_VECS = CHUNK_BLOCKS * XC * 4 / 16;
    static_assert(CHUNK_BLOCKS * 4 % 16 == 0, "a chunk's scales of one column are whole 16-byte vectors");
    constexpr int OUT_ROWS = GATED ? TILE_ROWS / 2 : TILE_ROWS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const bool x_lane = !ONE || g == 0;  // this lane's B column (g) is a staged one
    auto x_col = [&](int j) { return ONE ? 0 : COL_GROUP * j + g; };  // its staged column
    const int n_chunks = a.K / K_ALIGN;
    // the chunks of a tile warp w takes (w, w + WARPS, ..): the same for every tile
    auto chunks_of = [&](int w) { return n_chunks > w ? (n_chunks - w + WARPS - 1) / WARPS : 0; };
    const int n_mine = chunks_of(warp);
    // this CTA's tiles of OUT_ROWS rows: blockIdx.x, + gridDim.x, .. (launch_groups: one tile a CTA,
    // or a grid of the CTAs that fit on the device at once); a warp's chunks of all of them form one
    // stream, which keeps its pipeline full across tiles
    const int n_tiles = (a.M + OUT_ROWS - 1) / OUT_ROWS;
    const int my_tiles = int(blockIdx.x) < n_tiles ? (n_tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
    const int n_total = my_tiles * n_mine;
    auto tile_row = [&](int tl) { return (int(blockIdx.x) + tl * int(gridDim.x)) * OUT_ROWS; };
    uint8_t * stages = smem + warp * ST * STAGE;
    // WA (weights_ahead, launch_groups): chunk i's weights in buffer i % (ST + WA) (weight_slot), its
    // activations in stage i % ST; weights are issued WA chunks ahead of the activations (see issue)
    static_assert(!ONE || WA == 0, "a one-column stage cannot hold the partial sums (RED_AT)");
    // the next kernel (ggml's launch with PDL, or the next quantization) may launch once every CTA
    // here has started; it waits for this grid's completion before it reads anything
    cuda::launch_dependents();

    // The i-th chunk of this warp (of tile i / n_mine: chunk warp + (i % n_mine) * WARPS) into stage
    // i % ST. Staged row s comes from global row r0 + s, r0 the tile's first row (gated: rows 16..31
    // are the gate's rows r0..r0+15); rows past M repeat row M-1 (their sums are never written).
    // Activation columns >= N are zero-filled, not read. Chunks are issued in order, the weights and
    // the activations each from a cursor (tile, chunk) that moves on by one chunk per call.
    int w_tl = 0, w_k = 0, x_k = 0;
    auto issue_weights = [&](int i) {
        if (i >= n_total) return;
        const int chunk = warp + w_k * WARPS, r0 = tile_row(w_tl);
        if (++w_k == n_mine) w_k = 0, ++w_tl;
        uint8_t * st = stages + (i % ST) * STAGE;
        if constexpr (WA > 0) st = weight_slot<ST, WA, STAGE, W_BYTES>(smem, warp, i);
        // The chunk's pieces of 16 rows (plain: rows r0.., r0 + 16..; gated: U's rows r0.. and G's).
        // In the row-tiled layout a piece of a whole 16-row tile is 16 x CB contiguous bytes; q6_k
        // (tiled, M % 16 == 0) always is, a piece past M repeating the last tile.
        static_assert(tiles::TILE_ROWS == 16, "a staged piece is one tile of the row-tiled layout");
        constexpr int PIECES = TILE_ROWS / 16, PIECE_VECS = CB;  // (16 rows x CB bytes / 16)
        const uint8_t * piece[PIECES];
        bool whole = a.tiled;
#pragma unroll
        for (int p = 0; p < PIECES; ++p) {
            const int row0 = GATED ? r0 : r0 + 16 * p;
            whole = whole && (Q6K || row0 + 16 <= a.M);
            piece[p] = (GATED && p == 1 ? a.gate : a.w) +
                       tiles::chunk_offset(Q6K ? min(row0, a.M - 16) : row0, chunk, a.M, a.row_bytes, CB);
        }
        if (Q6K || whole) {
#pragma unroll
            for (int c = 0; c < (PIECES * PIECE_VECS + 31) / 32; ++c) {
                const int idx = lane + 32 * c;
                if (PIECES * PIECE_VECS % 32 != 0 && idx >= PIECES * PIECE_VECS) break;
                const int p = idx / PIECE_VECS;
                cuda::cp_async16(st + 16 * idx, piece[p] + 16 * (idx - p * PIECE_VECS));
            }
        } else {  // rows row_bytes apart, or a tile's last partial piece: row by row, rows past M repeat M-1
#pragma unroll
            for (int c = 0; c < (TILE_ROWS * CHUNK_VECS + 31) / 32; ++c) {
                const int idx = lane + 32 * c;
                if (TILE_ROWS * CHUNK_VECS % 32 != 0 && idx >= TILE_ROWS * CHUNK_VECS) break;
                const int s = idx / CHUNK_VECS, v = idx - s * CHUNK_VECS;
                const bool from_gate = GATED && s >= TILE_ROWS / 2;
                const int row = min(r0 + (GATED ? s % (TILE_ROWS / 2) : s), a.M - 1);
                const int64_t at = a.tiled ? tiles::chunk_offset(row, chunk, a.M, a.row_bytes, CB)
                                           : int64_t(row) * a.row_bytes + int64_t(chunk) * CB;
                const uint8_t * src = (from_gate ? a.gate : a.w) + at + 16 * v;
                cuda::cp_async16(st + 16 * idx, src);
            }
        }
    };
    // its activations (quantize_columns' output) into the same stage, and the commit. Up to 32 columns
    // (X_IMM) each lane's addresses are the chunk's base plus 16 x lane and its vector lane + 32 c lies
    // at + 512 c, so every copy's offset is an immediate of the instruction (offsets of 16 x idx made
    // ptxas compute each address in 64 bits; H100 probe, sums of the 9 shapes: Q4_K 16 columns 176.9 ->
    // 174.9 us, Q6_K 263.2 -> 258.0, Q8_0 within 0.5; docs/benchmarks.md). The 64-column launches (32
    // vectors a lane) keep the offsets of 16 x idx: with immediates ptxas spills more in their Q6_K,
    // Q5_K and gated Q4_K kernels (0 -> 100, 28 -> 68, 12 -> 24 bytes), and they were not timed.
    constexpr bool X_IMM = NG <= 4;
    constexpr int D_LOADS = chunk_scaled(WT) ? (XC * 4 + 15) / 16 : D_VECS;
    auto issue_x = [&](int i) {
        if (i < n_total) {
            const int chunk = warp + x_k * WARPS;
            if (++x_k == n_mine) x_k = 0;
            uint8_t * st = stages + (i % ST) * STAGE + W_BYTES + (X_IMM ? 16 * lane : 0);
            const int8_t * xsrc = xq + int64_t(chunk) * X_BYTES + (X_IMM ? 16 * lane : 0);
#pragma unroll
            for (int c = 0; c < (X_VECS + 31) / 32; ++c) {
                const int idx = lane + 32 * c;
                if (X_VECS % 32 != 0 && idx >= X_VECS) break;
                const int col = Q6K ? (idx / 4) % XC : (idx / 2) % XC;  // this vector's column
                const int at = X_IMM ? 512 * c : 16 * idx;
                cuda::cp_async16(st + at, xsrc + at, col < a.N ? 16 : 0);
            }
            // the scales: every block's (Q8_0), or block 0's alone where the chunk's blocks share one
            // (the products read no other), then the sums (MINS)
            st += X_BYTES;
            const float * dsrc = xd + int64_t(chunk) * CHUNK_BLOCKS * XC + (X_IMM ? 4 * lane : 0);
            if constexpr (X_IMM) {
#pragma unroll
                for (int c = 0; c < (D_LOADS + 31) / 32; ++c)
                    if (D_LOADS % 32 == 0 || lane + 32 * c < D_LOADS) cuda::cp_async16(st + 512 * c, dsrc + 128 * c);
            } else {
                for (int idx = lane; idx < D_LOADS; idx += 32) cuda::cp_async16(st + 16 * idx, dsrc + 4 * idx);
            }
            if (MINS) {
                const float * ssrc = xs + int64_t(chunk) * CHUNK_BLOCKS * XC + (X_IMM ? 4 * lane : 0);
                st += 16 * D_VECS;
                if constexpr (X_IMM) {
#pragma unroll
                    for (int c = 0; c < (D_VECS + 31) / 32; ++c)
                        if (D_VECS % 32 == 0 || lane + 32 * c < D_VECS) cuda::cp_async16(st + 512 * c, ssrc + 128 * c);
                } else {
                    for (int idx = lane; idx < D_VECS; idx += 32) cuda::cp_async16(st + 16 * idx, ssrc + 4 * idx);
                }
            }
        }
        cuda::cp_async_commit();
    };
    // chunk i's weights and activations, one commit group; WA > 0: chunk i's activations, then chunk
    // i + WA's weights in a group of their own after them, so that waiting for chunk i's activations
    // covers chunk i's weights (committed earlier) and leaves chunks i + 1 .. i + WA's in flight
    auto issue = [&](int i) {
        if constexpr (WA == 0) {
            issue_weights(i);
            issue_x(i);
        } else {
            issue_x(i);
            issue_weights(i + WA);
            cuda::cp_async_commit();
        }
    };

    float acc[M_TILES][NG][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;

    // the first chunks: weights, then (PDL) the wait for quantize_columns (a no-op when not
    // launched as its dependent), then their activations; one commit group per chunk
#pragma unroll
    for (int i = 0; i < ST - 1 + WA; ++i) issue_weights(i);
    cuda::wait_for_previous();
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) {
        issue_x(i);
        if constexpr (WA > 0) cuda::cp_async_commit();  // (empty: keeps two groups a chunk, as issue does)
    }
    // the columns' partial sums of squares (while the first chunks load), added after the main loop
    float * norm_factor = reinterpret_cast<float *>(smem + WARPS * (ST * STAGE + WA * W_BYTES));
    float * norm_part = norm_factor + COLS;  // [COLS][NORM_PARTS]
    if (a.norm_w != nullptr) {
        const int nb = chunk_scaled(WT) ? a.K / K_ALIGN : a.K / QK;  // quantize_columns' sums: a chunk's or a block's
        constexpr int BATCH = ONE ? 1 : NORM_BATCH;  // (see NORM_BATCH)
        for (int cp = threadIdx.x; cp < COLS * NORM_PARTS; cp += WARPS * 32) {
            // neighbouring threads read neighbouring floats: columns (batched), or one column's blocks (ONE)
            const int c = ONE ? cp / NORM_PARTS : cp % COLS, p = ONE ? cp % NORM_PARTS : cp / COLS;
            float sq = 0.0f;
            if (c < a.N)  // padded columns: never written
                for (int b0 = p; b0 < nb; b0 += BATCH * NORM_PARTS) {
                    float v[BATCH];  // sums b0, b0 + NORM_PARTS, ..: all loads in flight, then the adds
#pragma unroll
                    for (int u = 0; u < BATCH; ++u) {
                        const int b = b0 + u * NORM_PARTS;
                        v[u] = b < nb ? __ldcg(ss + b * XC + c) : 0.0f;
                    }
#pragma unroll
                    for (int u = 0; u < BATCH; ++u) sq += v[u];  // (past the last sum + 0: the same sum)
                }
            norm_part[c * NORM_PARTS + p] = sq;
        }
        __syncthreads();
        for (int c = threadIdx.x; c < COLS; c += WARPS * 32) {  // (read after the first tile's barrier)
            float sq = norm_part[c * NORM_PARTS];
#pragma unroll
            for (int p = 1; p < NORM_PARTS; ++p) sq += norm_part[c * NORM_PARTS + p];
            norm_factor[c] = rsqrtf(sq / float(a.K) + a.norm_eps);
        }
    }
    int i = 0;  // this warp's chunk over all its tiles
    for (int tl = 0; tl < my_tiles; ++tl) {
    const int r0 = tile_row(tl);
    for (int k = 0; k < n_mine; ++k, ++i) {
        // chunk i's group and all before it; after it: one group for each of the next ST - 2 chunks,
        // or (WA > 0) chunk i + WA's weights and two groups for each of the next ST - 2 chunks
        cuda::cp_async_wait<(WA > 0 ? 2 * ST - 3 : ST - 2)>();
        __syncwarp();  // chunk i visible to the whole warp; everyone is done with chunk i-1's stage
        issue(i + ST - 1);
        const uint8_t * st = stages + (i % ST) * STAGE;
        const int8_t * sx = reinterpret_cast<const int8_t *>(st + W_BYTES);
        const float * sd = reinterpret_cast<const float *>(st + W_BYTES + X_BYTES);
        if constexpr (WA > 0) st = weight_slot<ST, WA, STAGE, W_BYTES>(smem, warp, i);  // (st: the weights from here)
        if constexpr (MINS) {
            const float * sums = sd + CHUNK_BLOCKS * XC;  // the activation blocks' sums (for the mins)
            float2 dm[M_TILES][2];                         // (d, dmin) of rows g and g + 8
            uint32_t sc[M_TILES][2][3];                    // their packed scales and mins
            uint32_t sc4[M_TILES][2][2];                   // their sub-blocks' scales, a byte each (q4k_scales4)
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const uint8_t * row = st + (16 * mt + g + 8 * hr) * CB;
                    dm[mt][hr] = __half22float2(*reinterpret_cast<const __half2 *>(row));
#pragma unroll
                    for (int i = 0; i < 3; ++i) sc[mt][hr][i] = reinterpret_cast<const uint32_t *>(row + 4)[i];
#pragma unroll
                    for (int i = 0; i < 2; ++i) sc4[mt][hr][i] = q4k_scales4(sc[mt][hr], i);
                }
            // The chunk's sub-block sums times their scales, 16x: a sub-block's high nibbles enter the
            // mma unshifted, as unsigned bytes 16q (one mask, no shift), and its low nibbles' sum is
            // multiplied by 16 times its scale instead (|sum| <= 8 * 63 * 32 * 15 * 127 * 16 < 2^31;
            // Q5K: bytes q and 8q, sums times 16 and 2 times the scale, |sum| <= 8 * 63 * 32 * 31 *
            // 127 * 16 < 2^31). d / 16 scales the chunk's sum back: a power of two, so the products
            // are those of the plain sums to the bit.
            constexpr int QS_AT = Q5K ? 48 : 16;  // the quant bytes' offset in a row's chunk
            uint2 qh[M_TILES][2];                  // Q5K: qh bytes 8t .. + 7 of rows g, g + 8
            if constexpr (Q5K) {
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr)
                        qh[mt][hr] = *reinterpret_cast<const uint2 *>(st + (16 * mt + g + 8 * hr) * CB + 16 + 8 * t);
            }
            int isum[M_TILES][NG][4] = {};
#pragma unroll
            for (int jq = 0; jq < 4; ++jq) {
                uint2 qw[M_TILES][2];  // quant bytes 32jq + 8t .. + 7 of rows g, g + 8
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr)
                        qw[mt][hr] = *reinterpret_cast<const uint2 *>(st + (16 * mt + g + 8 * hr) * CB + QS_AT + 32 * jq + 8 * t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int s = 2 * jq + h;  // sub-block = activation block of the chunk
                    int bf[NG][2];
#pragma unroll
                    for (int j = 0; j < NG; ++j) {
                        const int2 v = *reinterpret_cast<const int2 *>(sx + (s * XC + x_col(j)) * QK + 8 * t);
                        bf[j][0] = x_lane ? v.x : 0;
                        bf[j][1] = x_lane ? v.y : 0;
                    }
#pragma unroll
                    for (int mt = 0; mt < M_TILES; ++mt) {
                        int af[4];
                        if constexpr (Q5K) {
                            af[0] = int(q5k_quant_bytes(qw[mt][0].x, qh[mt][0].x, s));
                            af[2] = int(q5k_quant_bytes(qw[mt][0].y, qh[mt][0].y, s));
                            af[1] = int(q5k_quant_bytes(qw[mt][1].x, qh[mt][1].x, s));
                            af[3] = int(q5k_quant_bytes(qw[mt][1].y, qh[mt][1].y, s));
                        } else {
                            const uint32_t nib = h == 0 ? 0x0F0F0F0Fu : 0xF0F0F0F0u;  // (q or 16q)
                            af[0] = int(qw[mt][0].x & nib);
                            af[2] = int(qw[mt][0].y & nib);
                            af[1] = int(qw[mt][1].x & nib);
                            af[3] = int(qw[mt][1].y & nib);
                        }
                        // the scales of sub-block s of rows g, g + 8 times 16 (s even: bytes q), 1
                        // (Q4K, s odd: bytes 16q) or 2 (Q5K, s odd: bytes 8q), as a shift of the byte
                        // (s % 4 is 0 or 2 where the shift is 4, so the top byte never overflows)
                        constexpr int FACTOR_BITS[2] = {4, Q5K ? 1 : 0};
                        auto scale_of = [&](const uint32_t (&w4)[2]) {
                            return int((w4[s / 4] << FACTOR_BITS[h]) >> (8 * (s % 4))) & (0x3F << FACTOR_BITS[h]);
                        };
                        const int sl = scale_of(sc4[mt][0]), sh = scale_of(sc4[mt][1]);
#pragma unroll
                        for (int j = 0; j < NG; ++j) {
                            int c[4] = {0, 0, 0, 0};
                            mma_u8s8(c, af, bf[j][0], bf[j][1]);
                            isum[mt][j][0] += c[0] * sl;
                            isum[mt][j][1] += c[1] * sl;
                            isum[mt][j][2] += c[2] * sh;
                            isum[mt][j][3] += c[3] * sh;
                        }
                    }
                }
            }
            float d[M_TILES][2];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) d[mt][0] = dm[mt][0].x * 0.0625f, d[mt][1] = dm[mt][1].x * 0.0625f;
            add_chunk_sums<ONE>(acc, isum, d, sd, t);
            // The mins: acc[row][n] -= dmin_row * sum_s min_s,row * sums[s][n] over the chunk's 8
            // sub-blocks, as one tf32 mma.m16n8k8 (k = the sub-blocks; A = the 6-bit mins, exact in
            // tf32) on the sums split into a tf32 head and the rest (two mma: ~fp32 accuracy)
            // instead of 8 float FMAs per accumulator. A lane holds sub-blocks t and t + 4.
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                float am[4];  // a0 = (row g, s = t), a1 = (row g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    int scale, min;
                    q4k_scale_min(t + 4 * (q / 2), sc[mt][q % 2], scale, min);
                    am[q] = float(min);
                }
#pragma unroll
                for (int j = 0; j < NG; ++j) {
                    float bh[2], bl[2];  // sub-blocks t and t + 4 of column COL_GROUP * j + g
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                        const float v = x_lane ? sums[(t + 4 * q) * XC + x_col(j)] : 0.0f;
                        bh[q] = __uint_as_float(__float_as_uint(v) & 0xFFFFE000u);  // tf32's 10 mantissa bits
                        bl[q] = v - bh[q];                                            // (exact)
                    }
                    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_tf32(c, am, bh[0], bh[1]);
                    mma_tf32(c, am, bl[0], bl[1]);
                    acc[mt][j][0] = __fmaf_rn(-dm[mt][0].y, c[0], acc[mt][j][0]);
                    acc[mt][j][1] = __fmaf_rn(-dm[mt][0].y, c[1], acc[mt][j][1]);
                    acc[mt][j][2] = __fmaf_rn(-dm[mt][1].y, c[2], acc[mt][j][2]);
                    acc[mt][j][3] = __fmaf_rn(-dm[mt][1].y, c[3], acc[mt][j][3]);
                }
            }
        } else if constexpr (Q6K) {
            // sub-block s = 4h + p (32 values) in two halves u of 16 values, one k16 mma each (a
            // scale per 16 values); the halves' sums times their int8 scales add up in int32
            // (|sum| <= 4 * 16 * 16 * 32 * 127 * 128: the quants are 4 (q - 32)), scaled once a chunk by
            // d / 4 and the activations' scale. The staged pieces are in fragment order
            // (tiles::q6k_piece_offset): this lane's quant words of rows g and g + 8 are its vectors
            // 3h + kind (words [row g u 0, u 1, row g + 8 u 0, u 1]); the activations too
            // (x_q6k_offset): its 4 values of column n in blocks 4h + 2 half + (0, 1), halves u 0, 1,
            // are one vector.
            static_assert(tiles::Q6K_PIECE_BYTES == 16 * CB, "a staged q6_k piece is one tile's chunk");
            float dq[M_TILES][2];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const uint8_t * d_at = st + mt * 16 * CB + 3328 + 2 * (g + 8 * hr);  // row g + 8 hr's d
                    dq[mt][hr] = 0.25f * __half2float(*reinterpret_cast<const __half *>(d_at));
                }
            int isum[M_TILES][NG][4] = {};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint4 qv[M_TILES][3];  // kind 0: ql[64h + l], 1: ql[64h + 32 + l], 2: qh[32h + l] (l = 16u + 4t)
                // scales 8h..8h+7 of rows g, g + 8 (a gated product of more than 32 columns: read where
                // used, as bytes, so that its registers do not spill)
                constexpr bool SC_BYTES = GATED && NG > 4;
                uint2 scw[M_TILES][2];
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    const uint8_t * piece = st + mt * 16 * CB;
#pragma unroll
                    for (int kind = 0; kind < 3; ++kind)
                        qv[mt][kind] = *reinterpret_cast<const uint4 *>(piece + ((3 * h + kind) * 32 + lane) * 16);
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr)
                        if (!SC_BYTES) scw[mt][hr] = reinterpret_cast<const uint2 *>(piece + 3072 + 16 * (g + 8 * hr))[h];
                }
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    // column x_col(j)'s values of blocks 4h + 2 half (.x: u 0, .y: u 1) and + 1 (.z, .w):
                    // one vector, or (more than 16 columns, fewer registers) two halves where used
                    constexpr bool WHOLE = NG <= 2;
                    int4 xv[WHOLE ? NG : 1];
#pragma unroll
                    for (int j = 0; j < NG; ++j)
                        if constexpr (WHOLE)
                            xv[j] = *reinterpret_cast<const int4 *>(sx + x_q6k_offset(4 * h + 2 * half, 4 * t, x_col(j), XC));
#pragma unroll
                    for (int pp = 0; pp < 2; ++pp) {
                        const int p = 2 * half + pp;
                        int2 xw[NG];
#pragma unroll
                        for (int j = 0; j < NG; ++j) {
                            if constexpr (WHOLE)
                                xw[j] = pp == 0 ? make_int2(xv[j].x, xv[j].y) : make_int2(xv[j].z, xv[j].w);
                            else
                                xw[j] = *reinterpret_cast<const int2 *>(sx + x_q6k_offset(4 * h + p, 4 * t, x_col(j), XC));
                            if (!x_lane) xw[j] = make_int2(0, 0);
                        }
#pragma unroll
                        for (int u = 0; u < 2; ++u) {
                            int bf[NG];
#pragma unroll
                            for (int j = 0; j < NG; ++j) bf[j] = u == 0 ? xw[j].x : xw[j].y;
#pragma unroll
                            for (int mt = 0; mt < M_TILES; ++mt) {
                                int af[2], sc[2];
#pragma unroll
                                for (int hr = 0; hr < 2; ++hr) {
                                    const uint32_t ql = word_of(qv[mt][pp], 2 * hr + u);  // kind p % 2
                                    const uint32_t qh = word_of(qv[mt][2], 2 * hr + u) ^ 0xAAAAAAAAu;  // q6_times4_centered
                                    af[hr] = q6_times4_centered(ql, qh, p / 2, p);
                                    const int k = 2 * p + u;  // scale 8h + k
                                    const uint8_t * row_scales = st + mt * 16 * CB + 3072 + 16 * (g + 8 * hr) + 8 * h;
                                    sc[hr] = SC_BYTES ? int(*reinterpret_cast<const int8_t *>(row_scales + k))
                                                      : sbyte(k < 4 ? scw[mt][hr].x : scw[mt][hr].y, k % 4);
                                }
#pragma unroll
                                for (int j = 0; j < NG; ++j) {
                                    int c[4] = {0, 0, 0, 0};
                                    mma_s8_k16(c, af, bf[j]);
                                    isum[mt][j][0] += c[0] * sc[0];
                                    isum[mt][j][1] += c[1] * sc[0];
                                    isum[mt][j][2] += c[2] * sc[1];
                                    isum[mt][j][3] += c[3] * sc[1];
                                }
                            }
                        }
                    }
                }
            }
            add_chunk_sums<ONE>(acc, isum, dq, sd, t);
        } else {
#pragma unroll
        for (int jb = 0; jb < CHUNK_BLOCKS; ++jb) {
            int bf[NG][2];
            float2 dx[NG];
#pragma unroll
            for (int j = 0; j < NG; ++j) {
                const int2 v = *reinterpret_cast<const int2 *>(sx + (jb * XC + x_col(j)) * QK + 8 * t);
                bf[j][0] = x_lane ? v.x : 0;
                bf[j][1] = x_lane ? v.y : 0;
                dx[j] = x_scales<ONE>(sd + jb * XC, j, t);
            }
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                const uint8_t * lo_row = st + (16 * mt + g) * CB + jb * BLOCK_BYTES;
                const uint8_t * hi_row = lo_row + 8 * CB;
                int af[4];
                load_quants(jb % 2 == 1, lo_row + 8 * t, af[0], af[2]);
                load_quants(jb % 2 == 1, hi_row + 8 * t, af[1], af[3]);
                const float dw_lo = __half2float(*reinterpret_cast<const __half *>(lo_row));
                const float dw_hi = __half2float(*reinterpret_cast<const __half *>(hi_row));
#pragma unroll
                for (int j = 0; j < NG; ++j) {
                    int c[4] = {0, 0, 0, 0};
                    mma_s8(c, af, bf[j][0], bf[j][1]);
                    acc[mt][j][0] = __fmaf_rn(__fmul_rn(dw_lo, dx[j].x), float(c[0]), acc[mt][j][0]);
                    acc[mt][j][1] = __fmaf_rn(__fmul_rn(dw_lo, dx[j].y), float(c[1]), acc[mt][j][1]);
                    acc[mt][j][2] = __fmaf_rn(__fmul_rn(dw_hi, dx[j].x), float(c[2]), acc[mt][j][2]);
                    acc[mt][j][3] = __fmaf_rn(__fmul_rn(dw_hi, dx[j].y), float(c[3]), acc[mt][j][3]);
                }
            }
        }
        }
    }  // chunks of tile tl

    // The tile's sums. Each warp's partials go into the stage it multiplied last (no copy is in
    // flight into it, and it takes none before the second barrier below), then the CTA's threads
    // add them in warp order: the same order for every tile, grid and column count.
    // red[w][mt][j][lane][e]: accumulator e of lane 4g+t in tile (mt, j) is staged row
    // 16mt + g + 8*(e/2), column 8j + 2t + e%2
    constexpr int PER_WARP = M_TILES * NG * 32 * 4;
    // (WA > 0: in the stage's activation part, since a weight copy may be in flight into its weight part)
    constexpr int RED_AT = WA > 0 ? W_BYTES : 0;
    static_assert(PER_WARP * 4 <= STAGE - RED_AT, "a warp's partial sums fit one of its stages");
    auto red_of = [&](int w) {  // warp w's last stage of tile tl (stage 0, never used, if it takes no chunk)
        const int nw = chunks_of(w);
        return reinterpret_cast<float *>(smem + (w * ST + (nw > 0 ? ((tl + 1) * nw - 1) % ST : 0)) * STAGE + RED_AT);
    };
    float * mine = red_of(warp);
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                mine[((mt * NG + j) * 32 + lane) * 4 + e] = acc[mt][j][e];
                acc[mt][j][e] = 0.0f;
            }
    __syncthreads();
    const float * red[WARPS];
#pragma unroll
    for (int w = 0; w < WARPS; ++w) red[w] = red_of(w);
    constexpr int OUT_TILES = GATED ? M_TILES / 2 : M_TILES;
    for (int idx = threadIdx.x; idx < OUT_TILES * NG * 128; idx += WARPS * 32) {
        const int e = idx % 4, l = (idx / 4) % 32, j = (idx / 128) % NG, mt = idx / (128 * NG);
        const int m = r0 + 16 * mt + l / 4 + 8 * (e / 2);
        const int n = COL_GROUP * j + 2 * (l % 4) + e % 2;
        const float nf = a.norm_w != nullptr ? norm_factor[n] : 1.0f;
        float v = red[0][idx];
#pragma unroll
        for (int w = 1; w < WARPS; ++w) v += red[w][idx];
        v *= nf;
        if (GATED) {
            const int at_gate = idx + NG * 128;  // m tile 1: the gate's same row
            float gv = red[0][at_gate];
#pragma unroll
            for (int w = 1; w < WARPS; ++w) gv += red[w][at_gate];
            v *= silu(gv * nf);
        }
        // y may be the bias itself (an in-place residual add): each element is read and then
        // written by this one thread
        if (n < a.N && m < a.M)
            a.y[int64_t(n) * a.y_stride + m] = a.bias != nullptr ? v + a.bias[int64_t(n) * a.bias_stride + m] : v;
    }
    __syncthreads();  // every thread is done with the partials before a warp stages a chunk over them
    }  // tiles
    cuda::cp_async_wait<0>();  // (only empty groups are left)
}

using cuda::device_attribute;
using cuda::device_major;
using cuda::device_smem_optin;

// The m16 row tiles a warp of a launch of ng column groups takes: two for a gated product (U's rows and
// G's) and for more than LUCEBOX_Q8_0_ONE_TILE_MAX_NG groups, else one (matmul's M_TILES).
constexpr int warp_m_tiles(int ng, bool gated) { return gated || ng > LUCEBOX_Q8_0_ONE_TILE_MAX_NG ? 2 : 1; }

// The most shared memory a launch for products of up to 8 * ng columns asks for: plain or gated,
// every weight format, either stage count (as launch_gated chooses them).
constexpr int worst_smem_bytes(int ng) {
    int worst = 0;
    for (weight_type wt : {weight_type::q8_0, weight_type::q4_k, weight_type::q5_k, weight_type::q6_k})
        for (int gated = 0; gated < 2; ++gated) {
            const int m_tiles = warp_m_tiles(ng, gated != 0);
            const int st3 = has_mins(wt) && ng == 1 && LUCEBOX_Q8_0_ST3_MAX_M > 0 ? 3 : STAGES;
            const int ahead = weights_ahead(COL_GROUP * ng, wt, gated != 0);  // (where a launch takes them)
            const int a = smem_bytes(COL_GROUP * ng, m_tiles, wt, STAGES, false, ahead),
                      b = smem_bytes(COL_GROUP * ng, m_tiles, wt, st3, false, ahead);
            worst = worst > a ? worst : a;
            worst = worst > b ? worst : b;
        }
    return worst;
}

}  // namespace detail

static_assert(detail::worst_smem_bytes(MAX_COLS / COL_GROUP) <= 227 * 1024, "64-column launches fit a Hopper block's shared memory");

// Most columns one launch pair takes on device dev, as its shared memory allows: 64 on Hopper
// (227 KB a block), 32 on an A100 (163 KB), 8 on compute capability 8.6 / 8.9 (99 KB); 0: none.
inline int max_cols(int dev) {
    const int optin = detail::device_smem_optin(dev);
    for (int ng = MAX_COLS / COL_GROUP; ng >= 1; ng /= 2)
        if (detail::worst_smem_bytes(ng) <= optin) return COL_GROUP * ng;
    return 0;
}

namespace detail {

// Whether this device runs these kernels as programmatic dependent launches: cuda::pdl_device,
// unless LUCEBOX_Q8_0_PDL is 0 (the probe's A/B).
inline bool pdl_device(int dev) { return LUCEBOX_Q8_0_PDL && cuda::pdl_device(dev); }

template <auto Kernel>
bool pdl_kernel(int dev) { return LUCEBOX_Q8_0_PDL && cuda::pdl_kernel<Kernel>(dev); }

using cuda::launch;

// Raises Kernel's dynamic shared-memory limit on device dev to what its launches use (smem, or all
// the device allows: cuda::spread_smem pads a launch's shared memory), once per device, before any
// launch or occupancy query.
template <auto Kernel>
cudaError_t raise_smem_limit(int dev, int smem) {
    static unsigned long long configured = 0;  // bit d: device d done (devices 0..63)
    if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
    if (!(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & (1ull << dev))) {
        const cudaError_t err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     LUCEBOX_Q8_0_SPREAD ? device_smem_optin(dev) : smem);
        if (err != cudaSuccess) return err;
        __atomic_fetch_or(&configured, 1ull << dev, __ATOMIC_ACQ_REL);
    }
    return cudaSuccess;
}

// One launch of matmul<.., WA = AHEAD> (raise_smem_limit done), its CTAs spread over the multiprocessors.
template <int NG, bool GATED, weight_type WT, int ST, bool ONE, int AHEAD>
cudaError_t launch_tiles(int dev, const matmul_args & a, const int8_t * xq, const float * xd, const float * xs,
                         const float * ss, cudaStream_t stream) {
    constexpr int M_TILES = warp_m_tiles(NG, GATED);
    constexpr auto kernel = matmul<NG, GATED, M_TILES, WT, ST, ONE, AHEAD>;
    constexpr int SMEM = smem_bytes(COL_GROUP * NG, M_TILES, WT, ST, ONE, AHEAD);
    constexpr int OUT_ROWS = GATED ? 16 : 16 * M_TILES;
    // one CTA per tile of OUT_ROWS rows, or (persistent) at most as many CTAs as fit at once, each
    // looping over tiles
    int grid = (a.M + OUT_ROWS - 1) / OUT_ROWS;
    if (LUCEBOX_Q8_0_PERSISTENT > 0) {
        const int most = cuda::resident_ctas<kernel>(dev, WARPS * 32, SMEM) * device_attribute<cudaDevAttrMultiProcessorCount>(dev);
        if (most > 0 && grid >= LUCEBOX_Q8_0_PERSISTENT * most) grid = most;
    }
    const int smem = LUCEBOX_Q8_0_SPREAD ? cuda::spread_smem<kernel>(dev, grid, WARPS * 32, SMEM) : SMEM;
    return launch(kernel, dim3(grid), dim3(WARPS * 32), smem, stream, pdl_kernel<kernel>(dev), a, xq, xd, xs, ss);
}

// The launch for a product of NG column groups: with weights_ahead's buffers where the format and
// shape take them and the device fits as many of those CTAs a multiprocessor as of the plain ones
// (a CTA less a multiprocessor lost more than the buffers gained wherever measured).
template <int NG, bool GATED, weight_type WT, int ST = STAGES, bool ONE = false>
cudaError_t launch_groups(const matmul_args & a, const int8_t * xq, const float * xd, const float * xs,
                          const float * ss, cudaStream_t stream) {
    constexpr int M_TILES = warp_m_tiles(NG, GATED);
    constexpr int AHEAD = ONE ? 0 : weights_ahead(COL_GROUP * NG, WT, GATED);
    constexpr int SMEM = smem_bytes(COL_GROUP * NG, M_TILES, WT, ST, ONE, 0);
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = raise_smem_limit<matmul<NG, GATED, M_TILES, WT, ST, ONE, 0>>(dev, SMEM);
    if (err != cudaSuccess) return err;
    if constexpr (AHEAD > 0) {
        constexpr int SMEM_AHEAD = smem_bytes(COL_GROUP * NG, M_TILES, WT, ST, ONE, AHEAD);
        err = raise_smem_limit<matmul<NG, GATED, M_TILES, WT, ST, ONE, AHEAD>>(dev, SMEM_AHEAD);
        if (err != cudaSuccess) return err;
        const int with = cuda::resident_ctas<matmul<NG, GATED, M_TILES, WT, ST, ONE, AHEAD>>(dev, WARPS * 32, SMEM_AHEAD);
        const int without = cuda::resident_ctas<matmul<NG, GATED, M_TILES, WT, ST, ONE, 0>>(dev, WARPS * 32, SMEM);
        if (with > 0 && with >= without) return launch_tiles<NG, GATED, WT, ST, ONE, AHEAD>(dev, a, xq, xd, xs, ss, stream);
    }
    return launch_tiles<NG, GATED, WT, ST, ONE, 0>(dev, a, xq, xd, xs, ss, stream);
}

// The stages of a one-column product (one_column): LUCEBOX_Q8_0_ONE_STAGES, and at least 3 for
// Q4_K and Q5_K products of <= LUCEBOX_Q8_0_ST3_MAX_M rows.
constexpr int one_stages(weight_type wt, bool few_rows) {
    return has_mins(wt) && few_rows && LUCEBOX_Q8_0_ONE_STAGES < 3 ? 3 : LUCEBOX_Q8_0_ONE_STAGES;
}

constexpr bool one_column_type(weight_type wt) {  // (LUCEBOX_Q8_0_ONE_COL)
    return LUCEBOX_Q8_0_ONE_COL == 2 || (LUCEBOX_Q8_0_ONE_COL == 1 && wt == weight_type::q6_k);
}
// Whether a product of a.N == 1 columns on device dev runs with one staged column (its format's
// choice, and the launch fits the device's shared memory; else it runs as a column group of 8, like
// N = 2..8).
inline bool one_column(const matmul_args & a, int dev) {
    if (!one_column_type(a.type) || a.N != 1) return false;
    const bool few_rows = a.M <= LUCEBOX_Q8_0_ST3_MAX_M;
    const int m_tiles = warp_m_tiles(1, a.gate != nullptr);
    return smem_bytes(COL_GROUP, m_tiles, a.type, one_stages(a.type, few_rows), true) <= device_smem_optin(dev);
}

template <bool GATED, weight_type WT>
cudaError_t launch_gated(const matmul_args & a, bool one, const int8_t * xq, const float * xd, const float * xs,
                         const float * ss, cudaStream_t stream) {
    if constexpr (one_column_type(WT))
        if (one)
            return a.M <= LUCEBOX_Q8_0_ST3_MAX_M ? launch_groups<1, GATED, WT, one_stages(WT, true), true>(a, xq, xd, xs, ss, stream)
                                                 : launch_groups<1, GATED, WT, one_stages(WT, false), true>(a, xq, xd, xs, ss, stream);
    if constexpr (has_mins(WT) && LUCEBOX_Q8_0_ST3_MAX_M > 0 && STAGES != 3)
        if (col_groups(a.N) == 1 && a.M <= LUCEBOX_Q8_0_ST3_MAX_M) return launch_groups<1, GATED, WT, 3>(a, xq, xd, xs, ss, stream);
    switch (col_groups(a.N)) {
        case 1: return launch_groups<1, GATED, WT>(a, xq, xd, xs, ss, stream);
        case 2: return launch_groups<2, GATED, WT>(a, xq, xd, xs, ss, stream);
        case 4: return launch_groups<4, GATED, WT>(a, xq, xd, xs, ss, stream);
        default: return launch_groups<8, GATED, WT>(a, xq, xd, xs, ss, stream);
    }
}

}  // namespace detail

// Runs the product of at most 64 columns on `stream` (activation quantization, then the product).
inline cudaError_t matmul_group(const matmul_args & a, void * scratch, cudaStream_t stream) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const bool one = detail::one_column(a, dev);
    const int cols = one ? 1 : COL_GROUP * col_groups(a.N);  // the quantized activations' columns
    const size_t nb = size_t(a.K) / QK;
    int8_t * xq = static_cast<int8_t *>(scratch);
    float * xd = reinterpret_cast<float *>(xq + nb * cols * QK);
    const bool mins = has_mins(a.type), per_chunk = chunk_scaled(a.type);
    float * xs = mins ? xd + nb * cols : nullptr;
    float * ss = a.norm_w != nullptr ? xd + nb * cols * (mins ? 2 : 1) : nullptr;
    // one warp per block and column; Q4_K / Q6_K: a thread block of CHUNK_BLOCKS warps per chunk and
    // column (the chunk's blocks share one scale), Q6_K's in its fragment order
    auto quantize = [&](auto group, auto q6k_order) {
        constexpr int GROUP = decltype(group)::value;
        constexpr auto kernel = detail::quantize_columns<GROUP, decltype(q6k_order)::value>;
        const int threads = GROUP > 1 ? GROUP * 32 : 256;
        const int64_t warps = int64_t(nb) * a.N;  // the columns' blocks (not the padding's)
        const dim3 grid(unsigned((warps * 32 + threads - 1) / threads));
        return detail::launch(kernel, grid, dim3(threads), 0, stream, detail::pdl_kernel<kernel>(dev), a.x, a.x_stride, a.K,
                              a.N, cols, xq, xd, xs, a.norm_w, ss);
    };
    using chunk = std::integral_constant<int, CHUNK_BLOCKS>;
    err = a.type == weight_type::q6_k ? quantize(chunk{}, std::true_type{})
          : per_chunk                 ? quantize(chunk{}, std::false_type{})
                                      : quantize(std::integral_constant<int, 1>{}, std::false_type{});
    if (err != cudaSuccess) return err;
    const bool gated = a.gate != nullptr;
    switch (a.type) {
        case weight_type::q4_k:
            return gated ? detail::launch_gated<true, weight_type::q4_k>(a, one, xq, xd, xs, ss, stream)
                         : detail::launch_gated<false, weight_type::q4_k>(a, one, xq, xd, xs, ss, stream);
        case weight_type::q5_k:
            return gated ? detail::launch_gated<true, weight_type::q5_k>(a, one, xq, xd, xs, ss, stream)
                         : detail::launch_gated<false, weight_type::q5_k>(a, one, xq, xd, xs, ss, stream);
        case weight_type::q6_k:
            return gated ? detail::launch_gated<true, weight_type::q6_k>(a, one, xq, xd, xs, ss, stream)
                         : detail::launch_gated<false, weight_type::q6_k>(a, one, xq, xd, xs, ss, stream);
        default:
            return gated ? detail::launch_gated<true, weight_type::q8_0>(a, one, xq, xd, xs, ss, stream)
                         : detail::launch_gated<false, weight_type::q8_0>(a, one, xq, xd, xs, ss, stream);
    }
}

// Runs the product on `stream`: per group of at most max_cols(device) columns, the activation quantization, then
// the product (the next group's quantization waits for it before it overwrites the scratch); scratch
// holds scratch_bytes(a) bytes, 16-byte aligned. check_args(a) must have returned null.
inline cudaError_t matmul(const matmul_args & a, void * scratch, cudaStream_t stream) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const int cols = max_cols(dev);  // 64 but where the device's shared memory is smaller
    if (cols == 0) return cudaErrorNotSupported;
    for (int n0 = 0; n0 < a.N; n0 += cols) {
        matmul_args group = a;
        group.N = a.N - n0 < cols ? a.N - n0 : cols;
        group.x = a.x + int64_t(n0) * a.x_stride;
        group.y = a.y + int64_t(n0) * a.y_stride;
        if (a.bias != nullptr && a.bias_stride != 0) group.bias = a.bias + int64_t(n0) * a.bias_stride;
        err = matmul_group(group, scratch, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

}  // namespace lucebox::kernels::q8_0
