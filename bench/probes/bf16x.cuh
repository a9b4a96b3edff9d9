// Probe only (fifty-eighth and fifty-ninth sessions): one-column Q4_K and Q6_K products whose activations are
// never quantized.
//
//     y[m] = sum_k W[m, k] * x[k]            (plain)
//     y[m] = (U x)[m] * silu((G x)[m])       (gated: Q4_K only)
//
// lucebox's decode products (q8_0_matmul.cuh) first quantize x to int8 in a launch of its own
// (quantize_columns), then multiply on the int8 tensor cores: the quantization costs a decode product
// 1.3-2.3 us on its critical path (docs/benchmarks.md, fiftieth session), ~0.5 ms of a Q4_K_M decode
// step. Here the product stages x as float (256 values a chunk, 1 KB), rounds it to bf16 in registers
// and multiplies on the bf16 tensor cores (mma.m16n8k16, fp32 sums): no quantization launch.
//
// Q4_K: a weight nibble q (0..15) becomes the bf16 128 + q with one mask-and-or (0x4300 | q: exact), two a
// register; the 128 is taken back with the mins through the sub-block's sum of the bf16-rounded x:
//     sum_k (d sc q_k - dmin m) x_k = d sc S' - (128 d sc + dmin m) X,  S' = sum (128 + q_k) x_k, X = sum x_k
// (S' from the mma, X summed by the lanes in a fixed order: a column's bits do not depend on anything
// but the column, so decode and verify could share them).
//
// Fragments (m16n8k16, lane = 4g + t): A a0 = row g, k 2t..2t+1; a1 = row g+8; a2 = row g, k 2t+8..2t+9;
// a3 = row g+8, k 2t+8..; B b0 = k 2t..2t+1 of column g, b1 = k 2t+8..; C c0, c1 = row g, columns 2t,
// 2t+1; c2, c3 = row g+8. The k order is ours. Q4_K: lane t multiplies values 8t..8t+7 of each 32-value
// sub-block (its 8 quant bytes 32 jq + 8t..+7 of a row, low nibbles sub-block 2 jq, high 2 jq + 1), as pairs
// (8t, 8t+2) and (8t+1, 8t+3) in the first k16 step, (8t+4, 8t+6) and (8t+5, 8t+7) in the second:
// bytes 0 and 2 of a quant word are one mask away from a bf16 pair. B's columns 1..7 repeat column 0
// (every lane takes column 0's fragments); their sums are never written.
//
// Q6_K (plain, row-tiled: its pieces in the int8 kernel's fragment order, tiles::q6k_piece_offset): one k16
// step is one group of 16 values with one scale (group G = 8h + 2p + u: values 16 G .. 16 G + 15, scale G);
// lane t multiplies values 4t..4t+3 of each group, (4t, 4t+1) at k 2t..2t+1 and (4t+2, 4t+3) at k 2t+8..2t+9,
// the four quants q (0..63) of one word of its piece vectors. Two byte permutes make them the bf16 128 + q
// (exact) and one bf16x2 fma each takes 160 away: the exact q - 32, so no sums of x are needed. A group's
// mma sums times the group's scale add up in fp32 over the chunk, times d once a chunk. One column reads
// its 4 values of each group straight from the staged floats (the 8 lanes of a t read the same 16 bytes).
//
// More columns (a verify: 2..16 here) cannot stage float x (16 columns: 16 KB a chunk, 7x the weights' bytes
// through L2), so there `convert_columns` (a launch, like the quantization, but without its reductions) writes
// each chunk's bf16 pairs in fragment order (Q4_K: and the sub-block sums), computed exactly as the one-column
// product computes them in registers: column n of a 16-column product has the one-column product's bits.
//
// Staging, tiles, persistence, the one-wave spread and the partial sums' order are q8_0_matmul.cuh's
// matmul<NG, GATED, M_TILES, WT, ST>, which this copies; a fused RMS norm, no bias, N <= 16.
#pragma once

#include "q8_0_matmul.cuh"

namespace lucebox::kernels::q8_0::bf16x {

// bf16x2 of (lo, hi), round to nearest even: lo in the low half
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16_lo(uint32_t p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t p) { return __uint_as_float(p & 0xFFFF0000u); }

// c += A (16x16 bf16, row-major) * B (16x8 bf16, column-major), fp32 sums
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// the nibbles of bytes 0 and 2 of w >> shift as the bf16 pair (128 + q0, 128 + q2)
__device__ __forceinline__ uint32_t nibble_pair(uint32_t w, int shift) { return ((w >> shift) & 0x000F000Fu) | 0x43004300u; }

// A lane's 8 values of a chunk of x (values 8 lane .. 8 lane + 7: sub-block lane / 4, its values
// 8 (lane % 4) ..), times the norm weight's (NORM), as the bf16 pairs (0, 2), (1, 3), (4, 6), (5, 7), and the
// sum of the sub-block's 32 bf16 values (every lane of the 4: the same bits); NORM: the chunk's sum of squares of
// x (not times the weight), every lane. The one definition of a column's rounding and sums (no contraction).
struct x_lane {
    uint4 pairs;  // x: (0, 2), y: (1, 3), z: (4, 6), w: (5, 7)
    float sum;
    float sq;
};
__device__ __forceinline__ float sq4(float4 v) {
    return __fadd_rn(__fadd_rn(__fmul_rn(v.x, v.x), __fmul_rn(v.y, v.y)), __fadd_rn(__fmul_rn(v.z, v.z), __fmul_rn(v.w, v.w)));
}
__device__ __forceinline__ float4 times(float4 v, float4 w) {
    return make_float4(__fmul_rn(v.x, w.x), __fmul_rn(v.y, w.y), __fmul_rn(v.z, w.z), __fmul_rn(v.w, w.w));
}
// The sum of squares of a chunk of x, every lane: lane L's values 8L..8L+7 (v0, v1), then the warp's sum in xor
// order (both formats, one column or many: the same bits)
__device__ __forceinline__ float chunk_sq(float4 v0, float4 v1) {
    float sq = __fadd_rn(sq4(v0), sq4(v1));
#pragma unroll
    for (int o = 1; o < 32; o *= 2) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, o));
    return sq;
}
// Q4_K: the pairs of 8 values (already times the norm weight) and the sum of the sub-block's 32 (the 4 lanes of
// consecutive t, xor order)
__device__ __forceinline__ x_lane q4k_pairs_and_sum(float4 v0, float4 v1) {
    x_lane r;
    r.sq = 0.0f;
    r.pairs = make_uint4(pack_bf16x2(v0.x, v0.z), pack_bf16x2(v0.y, v0.w), pack_bf16x2(v1.x, v1.z), pack_bf16x2(v1.y, v1.w));
    r.sum = ((bf16_lo(r.pairs.x) + bf16_hi(r.pairs.x)) + (bf16_lo(r.pairs.y) + bf16_hi(r.pairs.y))) +
            ((bf16_lo(r.pairs.z) + bf16_hi(r.pairs.z)) + (bf16_lo(r.pairs.w) + bf16_hi(r.pairs.w)));
    r.sum += __shfl_xor_sync(0xffffffffu, r.sum, 1);
    r.sum += __shfl_xor_sync(0xffffffffu, r.sum, 2);
    return r;
}
template <bool NORM>
__device__ __forceinline__ x_lane convert_lane(float4 v0, float4 v1, float4 w0, float4 w1) {
    const float sq = NORM ? chunk_sq(v0, v1) : 0.0f;
    if constexpr (NORM) {
        v0 = times(v0, w0);
        v1 = times(v1, w1);
    }
    x_lane r = q4k_pairs_and_sum(v0, v1);
    r.sq = sq;
    return r;
}

// Q6_K: a lane's 4 values 4t..4t+3 of a group of 16 (v, already times the norm weight) as its B fragment: the bf16
// pairs (4t, 4t+1) (k 2t, 2t+1) and (4t+2, 4t+3) (k 2t+8, 2t+9)
__device__ __forceinline__ uint2 q6k_x_pairs(float4 v) { return make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w)); }

// Q6_K: the 4 quants q = nibble | field << 4 (0..63) of a word of ql (the low, nib_half 0, or high nibbles) and qh
// (2-bit field `field` 0..3), one a byte (both constants in the unrolled loops that call it)
__device__ __forceinline__ uint32_t q6k_quants(uint32_t ql, uint32_t qh, int nib_half, int field) {
    const uint32_t nib = (nib_half == 0 ? ql : ql >> 4) & 0x0F0F0F0Fu;
    const uint32_t hi = field == 0 ? qh << 4 : field == 1 ? qh << 2 : field == 2 ? qh : qh >> 2;
    return nib | (hi & 0x30303030u);
}
// bytes i, i + 1 (i = 0 or 2) of q (quants 0..63) as the bf16 pair (q_i - 32, q_{i+1} - 32): a byte permute
// makes the bf16 128 + q (0x43 above each quant: exact), a bf16x2 fma takes 160 away (exact)
template <int I>
__device__ __forceinline__ uint32_t q6k_pair(uint32_t q) {
    uint32_t p, r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p) : "r"(q), "r"(0x43u), "r"(I == 0 ? 0x4140u : 0x4342u));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(p), "r"(0x3F803F80u), "r"(0xC320C320u));  // p * 1 - 160
    return r;
}

// Converted activations of `cols` staged columns, per 256-value chunk (2 bytes a value in both formats): the pairs,
// Q4_K [8 sub-blocks][cols][4 lanes t] (16 bytes: lane t's x_lane::pairs), Q6_K [16 groups][cols][4 lanes t]
// (8 bytes: q6k_x_pairs), then (Q4_K) the sums [8][cols] floats, then with a norm the chunk's sums of squares
// [cols]: x_chunk_bytes(wt, cols, norm) bytes a chunk.
__host__ __device__ constexpr int x_sq_offset(weight_type wt, int cols) { return CHUNK_BLOCKS * cols * (wt == weight_type::q4_k ? 68 : 64); }
__host__ __device__ constexpr int x_chunk_bytes(weight_type wt, int cols, bool norm) { return x_sq_offset(wt, cols) + (norm ? cols * 4 : 0); }
// A warp's stage of the product: the rows' chunk (16 m_tiles rows), then its x: 256 floats (one: and the norm
// weight's 256), or the converted block of `cols` columns.
__host__ __device__ constexpr int stage_bytes(weight_type wt, int cols, int m_tiles, bool one, bool norm) {
    return 16 * m_tiles * chunk_bytes(wt) + (one ? K_ALIGN * 4 * (norm ? 2 : 1) : x_chunk_bytes(wt, cols, norm));
}
// The product's shared memory: the warps' stages, then (norm) the warps' sums of squares [WARPS][cols] and the
// columns' factors [cols].
__host__ __device__ constexpr int smem_bytes(weight_type wt, int cols, int m_tiles, int stages, bool one, bool norm) {
    return WARPS * stages * stage_bytes(wt, cols, m_tiles, one, norm) + (norm ? (WARPS + 1) * cols * 4 : 0);
}

// A warp per (chunk, column n < N) of x [N][x_stride] (norm_w non-null: times it, a weight read before the
// wait): its pairs (and Q4_K sums) into xc (columns N..cols-1 not written). Lane L holds values 8L..8L+7: Q4_K
// sub-block L / 4's, Q6_K group L / 2's values for its lanes t = 2 (L % 2), + 1 (adjacent: one 16-byte store).
template <weight_type WT, bool NORM>
__global__ void convert_columns(const float * x, int64_t x_stride, int K, int N, int cols, const float * __restrict__ norm_w,
                                uint8_t * __restrict__ xc) {
    cuda::launch_dependents();
    const int lane = threadIdx.x % 32;
    const int64_t wid = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (wid >= int64_t(K / K_ALIGN) * N) return;
    const int c = int(wid / N), n = int(wid % N);
    float4 w0 = {}, w1 = {};
    if constexpr (NORM) {
        const float4 * nw = reinterpret_cast<const float4 *>(norm_w + int64_t(c) * K_ALIGN) + 2 * lane;
        w0 = nw[0], w1 = nw[1];
    }
    cuda::wait_for_previous();  // x is the previous kernel's output
    const float4 * src = reinterpret_cast<const float4 *>(x + int64_t(n) * x_stride + int64_t(c) * K_ALIGN) + 2 * lane;
    uint8_t * chunk = xc + int64_t(c) * x_chunk_bytes(WT, cols, NORM);
    float sq = 0.0f;
    if constexpr (WT == weight_type::q4_k) {
        const x_lane v = convert_lane<NORM>(__ldcg(src), __ldcg(src + 1), w0, w1);
        const int s = lane / 4, t = lane % 4;
        *reinterpret_cast<uint4 *>(chunk + ((s * cols + n) * 4 + t) * 16) = v.pairs;
        if (t == 0) reinterpret_cast<float *>(chunk + CHUNK_BLOCKS * cols * 64)[s * cols + n] = v.sum;
        sq = v.sq;
    } else {
        float4 v0 = __ldcg(src), v1 = __ldcg(src + 1);
        if constexpr (NORM) {
            sq = chunk_sq(v0, v1);
            v0 = times(v0, w0);
            v1 = times(v1, w1);
        }
        const uint2 p0 = q6k_x_pairs(v0), p1 = q6k_x_pairs(v1);
        *reinterpret_cast<uint4 *>(chunk + (((lane / 2) * cols + n) * 4 + 2 * (lane % 2)) * 8) = make_uint4(p0.x, p0.y, p1.x, p1.y);
    }
    if (NORM && lane == 0) reinterpret_cast<float *>(chunk + x_sq_offset(WT, cols))[n] = sq;
}

// BF16X_NO_CONVERT 1 (timing only, wrong products): the one-column product multiplies its staged bytes as they are,
// without rounding, sums or shuffles: what the conversion costs a one-column product
#ifndef BF16X_NO_CONVERT
#define BF16X_NO_CONVERT 0
#endif
// BF16X_Q4K_DIRECT 1: the one-column Q4_K product's lanes read the values they multiply from the staged floats
// (lane t of sub-block s: the 8 that convert_lane gives lane 4s + t; the 8 lanes of a t read the same 32 bytes) and
// round and sum them there, as the Q6_K product does, instead of one conversion a chunk and 5 shuffles a sub-block
#ifndef BF16X_Q4K_DIRECT
#define BF16X_Q4K_DIRECT 0
#endif

// Q6_K: one staged chunk's products added into acc (see the file's head). The piece of m tile mt at st + mt 16 CB
// (tiles::q6k_piece_offset's order: lane 4g + t's quant words of rows g, g + 8 are its vectors 3h + kind, words
// [row g u 0, u 1, row g + 8 u 0, u 1]; scales [16 rows][16] at 3072, d [16 rows] at 3328); x after the pieces:
// ONE, 256 floats (NORM: the norm weight's 256 after them), else the converted pairs of COLS columns. A group's
// mma sums times its scale add up over the chunk in fp32, then times d into acc (ONE: column 0, e 0 and 2).
template <int NG, int M_TILES, bool ONE, bool NORM>
__device__ __forceinline__ void q6k_chunk(const uint8_t * st, int lane, float (&acc)[M_TILES][NG][4]) {
    constexpr int CB = Q6K_BLOCK_BYTES, COLS = COL_GROUP * NG;
    static_assert(tiles::Q6K_PIECE_BYTES == 16 * CB, "a staged q6_k piece is one tile's chunk");
    const int g = lane / 4, t = lane % 4;
    const uint8_t * sx = st + 16 * M_TILES * CB;
    float d[M_TILES][2];
    float cacc[M_TILES][NG][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) d[mt][hr] = __half2float(*reinterpret_cast<const __half *>(st + mt * 16 * CB + 3328 + 2 * (g + 8 * hr)));
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) cacc[mt][j][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        uint4 qv[M_TILES][3];  // kind 0: ql[64h + l], 1: ql[64h + 32 + l], 2: qh[32h + l] (l = 16u + 4t + i)
        uint2 scw[M_TILES][2];  // scales 8h..8h+7 of rows g, g + 8
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            const uint8_t * piece = st + mt * 16 * CB;
#pragma unroll
            for (int kind = 0; kind < 3; ++kind) qv[mt][kind] = *reinterpret_cast<const uint4 *>(piece + ((3 * h + kind) * 32 + lane) * 16);
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) scw[mt][hr] = reinterpret_cast<const uint2 *>(piece + 3072 + 16 * (g + 8 * hr))[h];
        }
#pragma unroll
        for (int p = 0; p < 4; ++p)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int G = 8 * h + 2 * p + u;  // values 16 G .. 16 G + 15, scale G
                uint2 b[NG];
                if constexpr (ONE) {
                    const float4 * x4 = reinterpret_cast<const float4 *>(sx);
                    float4 v = x4[4 * G + t];
                    if (BF16X_NO_CONVERT) {
                        b[0] = make_uint2(__float_as_uint(v.x), __float_as_uint(v.y));  // (wrong products)
                    } else {
                        if constexpr (NORM) v = times(v, x4[K_ALIGN / 4 + 4 * G + t]);
                        b[0] = q6k_x_pairs(v);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < NG; ++j) b[j] = *reinterpret_cast<const uint2 *>(sx + ((G * COLS + COL_GROUP * j + g) * 4 + t) * 8);
                }
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    uint32_t lo[2], hi[2];
                    float sc[2];
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr) {
                        const uint32_t q = q6k_quants(detail::word_of(qv[mt][p % 2], 2 * hr + u), detail::word_of(qv[mt][2], 2 * hr + u), p / 2, p);
                        lo[hr] = q6k_pair<0>(q);
                        hi[hr] = q6k_pair<2>(q);
                        const int k = 2 * p + u;
                        sc[hr] = float(detail::sbyte(k < 4 ? scw[mt][hr].x : scw[mt][hr].y, k % 4));
                    }
#pragma unroll
                    for (int j = 0; j < NG; ++j) {
                        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_bf16(c, lo[0], lo[1], hi[0], hi[1], b[j].x, b[j].y);
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (!ONE || e % 2 == 0) cacc[mt][j][e] = __fmaf_rn(sc[e / 2], c[e], cacc[mt][j][e]);
                    }
                }
            }
    }
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (!ONE || e % 2 == 0) acc[mt][j][e] = __fmaf_rn(d[mt][e / 2], cacc[mt][j][e], acc[mt][j][e]);
}

// ONE (N == 1): x staged as float (and the norm weight's chunk, NORM), converted in registers (convert_lane);
// else NG groups of 8 columns of convert_columns' output (xc). NORM: the input is x's RMS norm times a.norm_w:
// each warp adds its chunks' sums of squares in its chunk order (the first tile's pass), the warps' sums are
// added in warp order, and every column's sums are scaled by rsqrt(sum / K + eps) at the end, as
// q8_0_matmul.cuh's norm (in another order).
template <weight_type WT, int NG, bool GATED, int M_TILES, int ST, bool ONE, bool NORM>
__global__ void __launch_bounds__(WARPS * 32, WT == weight_type::q6_k ? 1 : 0) matmul(matmul_args a, const uint8_t * xc) {
    extern __shared__ __align__(16) uint8_t smem[];
    static_assert(!GATED || M_TILES == 2, "a gated warp takes 16 rows of U and the same 16 of G");
    static_assert(!ONE || NG == 1, "one column is one column group");
    static_assert(WT == weight_type::q4_k || (WT == weight_type::q6_k && !GATED), "Q4_K, or plain Q6_K");
    constexpr bool Q6K = WT == weight_type::q6_k;
    constexpr int COLS = COL_GROUP * NG;
    constexpr int TILE_ROWS = 16 * M_TILES;
    constexpr int CB = chunk_bytes(WT), CHUNK_VECS = CB / 16;  // (Q6_K: whole pieces only, CHUNK_VECS unused)
    constexpr int W_BYTES = TILE_ROWS * CB;
    constexpr int STAGE = stage_bytes(WT, COLS, M_TILES, ONE, NORM);
    constexpr int X_BYTES = STAGE - W_BYTES;  // (see stage_bytes)
    constexpr int X_VECS = X_BYTES / 16;
    constexpr int OUT_ROWS = GATED ? TILE_ROWS / 2 : TILE_ROWS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int n_chunks = a.K / K_ALIGN;
    auto chunks_of = [&](int w) { return n_chunks > w ? (n_chunks - w + WARPS - 1) / WARPS : 0; };
    const int n_mine = chunks_of(warp);
    const int n_tiles = (a.M + OUT_ROWS - 1) / OUT_ROWS;
    const int my_tiles = int(blockIdx.x) < n_tiles ? (n_tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
    const int n_total = my_tiles * n_mine;
    auto tile_row = [&](int tl) { return (int(blockIdx.x) + tl * int(gridDim.x)) * OUT_ROWS; };
    uint8_t * stages = smem + warp * ST * STAGE;
    cuda::launch_dependents();

    int w_tl = 0, w_k = 0, x_k = 0;
    auto issue_weights = [&](int i) {
        if (i >= n_total) return;
        const int chunk = warp + w_k * WARPS, r0 = tile_row(w_tl);
        if (++w_k == n_mine) w_k = 0, ++w_tl;
        uint8_t * st = stages + (i % ST) * STAGE;
        constexpr int PIECES = TILE_ROWS / 16, PIECE_VECS = CB;
        const uint8_t * piece[PIECES];
        bool whole = a.tiled;
#pragma unroll
        for (int p = 0; p < PIECES; ++p) {
            const int row0 = GATED ? r0 : r0 + 16 * p;
            whole = whole && row0 + 16 <= a.M;
            piece[p] = (GATED && p == 1 ? a.gate : a.w) + tiles::chunk_offset(row0, chunk, a.M, a.row_bytes, CB);
        }
        if (Q6K || whole) {  // (Q6_K: whole tiles only, in fragment order)
#pragma unroll
            for (int c = 0; c < (PIECES * PIECE_VECS + 31) / 32; ++c) {
                const int idx = lane + 32 * c;
                if (PIECES * PIECE_VECS % 32 != 0 && idx >= PIECES * PIECE_VECS) break;
                const int p = idx / PIECE_VECS;
                cuda::cp_async16(st + 16 * idx, piece[p] + 16 * (idx - p * PIECE_VECS));
            }
        } else {
#pragma unroll
            for (int c = 0; c < (TILE_ROWS * CHUNK_VECS + 31) / 32; ++c) {
                const int idx = lane + 32 * c;
                if (TILE_ROWS * CHUNK_VECS % 32 != 0 && idx >= TILE_ROWS * CHUNK_VECS) break;
                const int s = idx / CHUNK_VECS, v = idx - s * CHUNK_VECS;
                const bool from_gate = GATED && s >= TILE_ROWS / 2;
                const int row = min(r0 + (GATED ? s % (TILE_ROWS / 2) : s), a.M - 1);
                const int64_t at = a.tiled ? tiles::chunk_offset(row, chunk, a.M, a.row_bytes, CB)
                                           : int64_t(row) * a.row_bytes + int64_t(chunk) * CB;
                cuda::cp_async16(st + 16 * idx, (from_gate ? a.gate : a.w) + at + 16 * v);
            }
        }
        if constexpr (ONE && NORM) {  // the norm weight's chunk (a weight, as the rows)
            const float * nw = a.norm_w + int64_t(chunk) * K_ALIGN;
            cuda::cp_async16(st + W_BYTES + 1024 + 16 * lane, nw + 4 * lane);
            cuda::cp_async16(st + W_BYTES + 1536 + 16 * lane, nw + 128 + 4 * lane);
        }
    };
    // the chunk's x: 256 floats (ONE), or its converted block, columns >= N zero-filled, not read
    auto issue_x = [&](int i) {
        if (i < n_total) {
            const int chunk = warp + x_k * WARPS;
            if (++x_k == n_mine) x_k = 0;
            uint8_t * st = stages + (i % ST) * STAGE + W_BYTES;
            if constexpr (ONE) {
                const float * src = a.x + int64_t(chunk) * K_ALIGN;
                cuda::cp_async16(st + 16 * lane, src + 4 * lane);
                cuda::cp_async16(st + 512 + 16 * lane, src + 128 + 4 * lane);
            } else {
                const uint8_t * src = xc + int64_t(chunk) * X_BYTES;
#pragma unroll
                for (int c = 0; c < (X_VECS + 31) / 32; ++c) {
                    const int idx = lane + 32 * c;
                    if (X_VECS % 32 != 0 && idx >= X_VECS) break;
                    // pairs: Q4_K vector (s cols + col) 4 + t, Q6_K (G cols + col) 2 + t / 2 (32 cols vectors in both);
                    // sums and squares: 4 columns a vector
                    const int col = idx < CHUNK_BLOCKS * COLS * 4 ? (idx / (Q6K ? 2 : 4)) % COLS : (4 * (idx - CHUNK_BLOCKS * COLS * 4)) % COLS;
                    cuda::cp_async16(st + 16 * idx, src + 16 * idx, col < a.N ? 16 : 0);
                }
            }
        }
        cuda::cp_async_commit();
    };

    float acc[M_TILES][NG][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;

#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue_weights(i);
    cuda::wait_for_previous();
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue_x(i);
    float ssq = 0.0f;  // (NORM) this warp's sum of squares: ONE, of column 0 (every lane); else of column `lane`
    float * norm_part = reinterpret_cast<float *>(smem + WARPS * ST * STAGE);  // [WARPS][COLS] (see smem_bytes)
    float * norm_factor = norm_part + WARPS * COLS;                             // [COLS]
    int i = 0;
    for (int tl = 0; tl < my_tiles; ++tl) {
        const int r0 = tile_row(tl);
        for (int k = 0; k < n_mine; ++k, ++i) {
            cuda::cp_async_wait<ST - 2>();
            __syncwarp();
            issue_weights(i + ST - 1);
            issue_x(i + ST - 1);
            const uint8_t * st = stages + (i % ST) * STAGE;
            x_lane mine_x = {};  // (ONE, Q4_K) this lane's pairs and sub-block sum
            if constexpr (ONE) {
                const float4 * sx = reinterpret_cast<const float4 *>(st + W_BYTES);
                const float4 * nw = sx + K_ALIGN / 4;  // (NORM)
                if constexpr (Q6K || (BF16X_Q4K_DIRECT && !BF16X_NO_CONVERT)) {  // (the pairs where used, below)
                    if (NORM && tl == 0) ssq = __fadd_rn(ssq, chunk_sq(sx[2 * lane], sx[2 * lane + 1]));
                } else {
                    if (BF16X_NO_CONVERT) mine_x.pairs = reinterpret_cast<const uint4 *>(sx)[lane];  // (wrong products)
                    else mine_x = convert_lane<NORM>(sx[2 * lane], sx[2 * lane + 1], NORM ? nw[2 * lane] : float4{}, NORM ? nw[2 * lane + 1] : float4{});
                    if (NORM && tl == 0) ssq = __fadd_rn(ssq, mine_x.sq);
                }
            } else if constexpr (NORM) {
                if (tl == 0 && lane < COLS) ssq = __fadd_rn(ssq, reinterpret_cast<const float *>(st + W_BYTES + x_sq_offset(WT, COLS))[lane]);
            }
            if constexpr (Q6K) {
                q6k_chunk<NG, M_TILES, ONE, NORM>(st, lane, acc);
            } else {
            // the rows' super-block heads: (d, dmin) and the packed scales of rows g, g + 8 of each m tile
            float2 dm[M_TILES][2];
            uint32_t sc[M_TILES][2][3];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const uint8_t * row = st + (16 * mt + g + 8 * hr) * CB;
                    dm[mt][hr] = __half22float2(*reinterpret_cast<const __half2 *>(row));
#pragma unroll
                    for (int w = 0; w < 3; ++w) sc[mt][hr][w] = reinterpret_cast<const uint32_t *>(row + 4)[w];
                }
#pragma unroll
            for (int jq = 0; jq < 4; ++jq) {
                uint2 qw[M_TILES][2];  // quant bytes 32 jq + 8t .. + 7 of rows g, g + 8
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr)
                        qw[mt][hr] = *reinterpret_cast<const uint2 *>(st + (16 * mt + g + 8 * hr) * CB + 16 + 32 * jq + 8 * t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int s = 2 * jq + h;  // the sub-block
                    const int lo = h == 0 ? 0 : 4, hi = h == 0 ? 8 : 12;  // the nibble's shifts
                    // the sub-block's weight fragments of each m tile, both k16 steps
                    uint32_t af[M_TILES][2][4];
                    float ds[M_TILES][2], bias[M_TILES][2];
#pragma unroll
                    for (int mt = 0; mt < M_TILES; ++mt) {
                        af[mt][0][0] = nibble_pair(qw[mt][0].x, lo), af[mt][0][1] = nibble_pair(qw[mt][1].x, lo);
                        af[mt][0][2] = nibble_pair(qw[mt][0].x, hi), af[mt][0][3] = nibble_pair(qw[mt][1].x, hi);
                        af[mt][1][0] = nibble_pair(qw[mt][0].y, lo), af[mt][1][1] = nibble_pair(qw[mt][1].y, lo);
                        af[mt][1][2] = nibble_pair(qw[mt][0].y, hi), af[mt][1][3] = nibble_pair(qw[mt][1].y, hi);
#pragma unroll
                        for (int hr = 0; hr < 2; ++hr) {
                            int scale, min;
                            q4k_scale_min(s, sc[mt][hr], scale, min);
                            ds[mt][hr] = dm[mt][hr].x * float(scale);
                            bias[mt][hr] = __fmaf_rn(128.0f, ds[mt][hr], dm[mt][hr].y * float(min));
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NG; ++j) {
                        uint4 b;     // column 8j + g's pairs of sub-block s for lane t (ONE: column 0's, every g)
                        float2 xs;   // the sub-block sums of columns 8j + 2t, + 1 (ONE: column 0's twice)
                        if constexpr (ONE) {
                          if (BF16X_NO_CONVERT) {
                            b = mine_x.pairs;
                            xs.x = xs.y = 0.0f;
                          } else if (BF16X_Q4K_DIRECT) {
                            const float4 * x4 = reinterpret_cast<const float4 *>(st + W_BYTES) + 8 * s + 2 * t;  // values 32 s + 8 t ..
                            float4 v0 = x4[0], v1 = x4[1];
                            if constexpr (NORM) v0 = times(v0, x4[K_ALIGN / 4]), v1 = times(v1, x4[K_ALIGN / 4 + 1]);
                            const x_lane v = q4k_pairs_and_sum(v0, v1);
                            b = v.pairs;
                            xs.x = xs.y = v.sum;
                          } else {
                            const int from = 4 * s + t;
                            b = make_uint4(__shfl_sync(0xffffffffu, mine_x.pairs.x, from), __shfl_sync(0xffffffffu, mine_x.pairs.y, from),
                                           __shfl_sync(0xffffffffu, mine_x.pairs.z, from), __shfl_sync(0xffffffffu, mine_x.pairs.w, from));
                            xs.x = xs.y = __shfl_sync(0xffffffffu, mine_x.sum, 4 * s);
                          }
                        } else {
                            const uint8_t * sx = st + W_BYTES;
                            b = *reinterpret_cast<const uint4 *>(sx + ((s * COLS + COL_GROUP * j + g) * 4 + t) * 16);
                            xs = *reinterpret_cast<const float2 *>(sx + CHUNK_BLOCKS * COLS * 64 + 4 * (s * COLS + COL_GROUP * j + 2 * t));
                        }
#pragma unroll
                        for (int mt = 0; mt < M_TILES; ++mt) {
                            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                            mma_bf16(c, af[mt][0][0], af[mt][0][1], af[mt][0][2], af[mt][0][3], b.x, b.y);
                            mma_bf16(c, af[mt][1][0], af[mt][1][1], af[mt][1][2], af[mt][1][3], b.z, b.w);
                            // this sub-block's part of rows g + 8 hr, columns 2t, 2t + 1 (ONE: column 0 in e 0, 2)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                if (ONE && e % 2 == 1) continue;
                                const int hr = e / 2;
                                acc[mt][j][e] += __fmaf_rn(ds[mt][hr], c[e], -bias[mt][hr] * (e % 2 == 0 ? xs.x : xs.y));
                            }
                        }
                    }
                }
            }
            }  // Q4_K
        }  // chunks of tile tl

        // the tile's sums: as q8_0_matmul.cuh
        constexpr int PER_WARP = M_TILES * NG * 32 * 4;
        static_assert(PER_WARP * 4 <= STAGE, "a warp's partial sums fit one of its stages");
        auto red_of = [&](int w) {
            const int nw = chunks_of(w);
            return reinterpret_cast<float *>(smem + (w * ST + (nw > 0 ? ((tl + 1) * nw - 1) % ST : 0)) * STAGE);
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
        if (NORM && tl == 0 && lane < (ONE ? 1 : COLS)) norm_part[warp * COLS + lane] = ssq;
        __syncthreads();
        if (NORM && tl == 0) {
            for (int c = threadIdx.x; c < COLS; c += WARPS * 32) {
                float sq = norm_part[c];
#pragma unroll
                for (int w = 1; w < WARPS; ++w) sq = __fadd_rn(sq, norm_part[w * COLS + c]);
                norm_factor[c] = rsqrtf(sq / float(a.K) + a.norm_eps);
            }
            __syncthreads();
        }
        const float * red[WARPS];
#pragma unroll
        for (int w = 0; w < WARPS; ++w) red[w] = red_of(w);
        constexpr int OUT_TILES = GATED ? M_TILES / 2 : M_TILES;
        for (int idx = threadIdx.x; idx < OUT_TILES * NG * 128; idx += WARPS * 32) {
            const int e = idx % 4, l = (idx / 4) % 32, j = (idx / 128) % NG, mt = idx / (128 * NG);
            const int m = r0 + 16 * mt + l / 4 + 8 * (e / 2);
            const int n = COL_GROUP * j + 2 * (l % 4) + e % 2;
            const float nf = NORM ? norm_factor[n] : 1.0f;
            float v = red[0][idx];
#pragma unroll
            for (int w = 1; w < WARPS; ++w) v += red[w][idx];
            v *= nf;
            if (GATED) {
                const int at_gate = idx + NG * 128;
                float gv = red[0][at_gate];
#pragma unroll
                for (int w = 1; w < WARPS; ++w) gv += red[w][at_gate];
                v *= detail::silu(gv * nf);
            }
            if (n < a.N && m < a.M) a.y[int64_t(n) * a.y_stride + m] = v;
        }
        __syncthreads();
    }  // tiles
    cuda::cp_async_wait<0>();
}

// BF16X_PLAIN_M_TILES: the 16-row tiles a warp of a plain product takes (2: each chunk of x serves 32 rows)
#ifndef BF16X_PLAIN_M_TILES
#define BF16X_PLAIN_M_TILES 1
#endif
template <weight_type WT, int NG, bool GATED, int ST, bool ONE, bool NORM>
cudaError_t launch_st(const matmul_args & a, const uint8_t * xc, cudaStream_t stream) {
    constexpr int M_TILES = GATED ? 2 : BF16X_PLAIN_M_TILES;
    constexpr auto kernel = matmul<WT, NG, GATED, M_TILES, ST, ONE, NORM>;
    constexpr int SMEM = smem_bytes(WT, COL_GROUP * NG, M_TILES, ST, ONE, NORM);
    constexpr int OUT_ROWS = GATED ? 16 : 16 * M_TILES;
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = detail::raise_smem_limit<kernel>(dev, SMEM);
    if (err != cudaSuccess) return err;
    int grid = (a.M + OUT_ROWS - 1) / OUT_ROWS;
    if (LUCEBOX_Q8_0_PERSISTENT > 0) {
        const int most = cuda::resident_ctas<kernel>(dev, WARPS * 32, SMEM) * cuda::device_attribute<cudaDevAttrMultiProcessorCount>(dev);
        if (most > 0 && grid >= LUCEBOX_Q8_0_PERSISTENT * most) grid = most;
    }
    const int smem = LUCEBOX_Q8_0_SPREAD ? cuda::spread_smem<kernel>(dev, grid, WARPS * 32, SMEM) : SMEM;
    return detail::launch(kernel, dim3(grid), dim3(WARPS * 32), smem, stream, detail::pdl_kernel<kernel>(dev), a, xc);
}

// BF16X_STAGES N: every launch stages N chunks a warp (0: as the int8 kernel)
#ifndef BF16X_STAGES
#define BF16X_STAGES 0
#endif
template <weight_type WT, int NG, bool ONE, bool NORM>
cudaError_t launch_cols(const matmul_args & a, const uint8_t * xc, cudaStream_t stream) {
    // stages as the int8 kernel's: Q4_K 3 for products of one column group up to LUCEBOX_Q8_0_ST3_MAX_M rows; Q6_K's
    // one column LUCEBOX_Q8_0_ONE_STAGES (its one-column launch, detail::one_column)
    const int st = BF16X_STAGES > 0 ? BF16X_STAGES
                   : WT == weight_type::q6_k ? (ONE ? LUCEBOX_Q8_0_ONE_STAGES : STAGES)
                   : NG == 1 && a.M <= LUCEBOX_Q8_0_ST3_MAX_M ? 3 : STAGES;
    if constexpr (WT == weight_type::q6_k) {
        if (st == 4) return launch_st<WT, NG, false, 4, ONE, NORM>(a, xc, stream);
        if (st == 3) return launch_st<WT, NG, false, 3, ONE, NORM>(a, xc, stream);
        return launch_st<WT, NG, false, 2, ONE, NORM>(a, xc, stream);
    } else {
        const bool gated = a.gate != nullptr;
        if (st == 4) return gated ? launch_st<WT, NG, true, 4, ONE, NORM>(a, xc, stream) : launch_st<WT, NG, false, 4, ONE, NORM>(a, xc, stream);
        if (st == 3) return gated ? launch_st<WT, NG, true, 3, ONE, NORM>(a, xc, stream) : launch_st<WT, NG, false, 3, ONE, NORM>(a, xc, stream);
        return gated ? launch_st<WT, NG, true, 2, ONE, NORM>(a, xc, stream) : launch_st<WT, NG, false, 2, ONE, NORM>(a, xc, stream);
    }
}
template <weight_type WT, int NG, bool ONE>
cudaError_t launch_normed(const matmul_args & a, const uint8_t * xc, cudaStream_t stream) {
    return a.norm_w != nullptr ? launch_cols<WT, NG, ONE, true>(a, xc, stream) : launch_cols<WT, NG, ONE, false>(a, xc, stream);
}
template <weight_type WT>
cudaError_t convert(const matmul_args & a, int cols, uint8_t * xc, cudaStream_t stream) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const int64_t warps = int64_t(a.K / K_ALIGN) * a.N;
    const dim3 grid(unsigned((warps * 32 + 255) / 256));
    constexpr auto normed = convert_columns<WT, true>, plain = convert_columns<WT, false>;
    return a.norm_w != nullptr ? detail::launch(normed, grid, dim3(256), 0, stream, detail::pdl_kernel<normed>(dev), a.x, a.x_stride, a.K, a.N, cols, a.norm_w, xc)
                               : detail::launch(plain, grid, dim3(256), 0, stream, detail::pdl_kernel<plain>(dev), a.x, a.x_stride, a.K, a.N, cols, a.norm_w, xc);
}
template <weight_type WT>
cudaError_t matmul_of(const matmul_args & a, void * scratch, cudaStream_t stream) {
    if (a.N == 1) return launch_normed<WT, 1, true>(a, nullptr, stream);
    const int cols = COL_GROUP * col_groups(a.N);
    uint8_t * xc = static_cast<uint8_t *>(scratch);
    const cudaError_t err = convert<WT>(a, cols, xc, stream);
    if (err != cudaSuccess) return err;
    return cols == 8 ? launch_normed<WT, 1, false>(a, xc, stream) : launch_normed<WT, 2, false>(a, xc, stream);
}

// Scratch of convert_columns for a product of a.N <= 16 columns.
inline size_t scratch_bytes(const matmul_args & a) {
    return size_t(a.K / K_ALIGN) * x_chunk_bytes(a.type, COL_GROUP * col_groups(a.N), a.norm_w != nullptr);
}

// The product of a Q4_K or (plain, row-tiled, whole 16-row tiles) Q6_K a of 1..16 columns (no bias; x and norm_w
// 16-byte aligned, x_stride % 4 == 0): one launch for one column, convert_columns then the product for more
// (scratch: scratch_bytes(a)).
inline cudaError_t matmul(const matmul_args & a, void * scratch, cudaStream_t stream) {
    if (check_args(a) != nullptr || a.N > 16 || a.bias != nullptr || a.x_stride % 4 != 0) return cudaErrorInvalidValue;
    if (a.type == weight_type::q4_k) return matmul_of<weight_type::q4_k>(a, scratch, stream);
    if (a.type == weight_type::q6_k && a.gate == nullptr) return matmul_of<weight_type::q6_k>(a, scratch, stream);  // (check_args: tiled, M % 16 == 0)
    return cudaErrorInvalidValue;
}

}  // namespace lucebox::kernels::q8_0::bf16x
