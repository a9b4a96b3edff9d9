// Probe only (fifty-eighth session): a one-column Q4_K product whose activations are never quantized.
//
//     y[m] = sum_k W[m, k] * x[k]            (plain)
//     y[m] = (U x)[m] * silu((G x)[m])       (gated)
//
// lucebox's decode products (q8_0_matmul.cuh) first quantize x to int8 in a launch of its own
// (quantize_columns), then multiply on the int8 tensor cores: the quantization costs a decode product
// 1.3-2.3 us on its critical path (docs/benchmarks.md, fiftieth session), ~0.5 ms of a Q4_K_M decode
// step. Here the product stages x as float (256 values a chunk, 1 KB), rounds it to bf16 in registers
// and multiplies on the bf16 tensor cores (mma.m16n8k16, fp32 sums): no quantization launch.
//
// A weight nibble q (0..15) becomes the bf16 128 + q with one mask-and-or (0x4300 | q: exact), two a
// register; the 128 is taken back with the mins through the sub-block's sum of the bf16-rounded x:
//     sum_k (d sc q_k - dmin m) x_k = d sc S' - (128 d sc + dmin m) X,  S' = sum (128 + q_k) x_k, X = sum x_k
// (S' from the mma, X summed by the lanes in a fixed order: a column's bits do not depend on anything
// but the column, so decode and verify could share them).
//
// Fragments (m16n8k16, lane = 4g + t): A a0 = row g, k 2t..2t+1; a1 = row g+8; a2 = row g, k 2t+8..2t+9;
// a3 = row g+8, k 2t+8..; B b0 = k 2t..2t+1 of column g, b1 = k 2t+8..; C c0, c1 = row g, columns 2t,
// 2t+1; c2, c3 = row g+8. The k order is ours: lane t multiplies values 8t..8t+7 of each 32-value sub-block
// (its 8 quant bytes 32 jq + 8t..+7 of a row, low nibbles sub-block 2 jq, high 2 jq + 1), as pairs
// (8t, 8t+2) and (8t+1, 8t+3) in the first k16 step, (8t+4, 8t+6) and (8t+5, 8t+7) in the second:
// bytes 0 and 2 of a quant word are one mask away from a bf16 pair. B's columns 1..7 repeat column 0
// (every lane takes column 0's fragments); their sums are never written.
//
// Staging, tiles, persistence, the one-wave spread and the partial sums' order are q8_0_matmul.cuh's
// matmul<1, GATED, M_TILES, q4_k, ST>, which this copies; no norm, no bias, N == 1 only.
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

template <bool GATED, int M_TILES, int ST>
__global__ void __launch_bounds__(WARPS * 32) matmul(matmul_args a) {
    extern __shared__ __align__(16) uint8_t smem[];
    static_assert(!GATED || M_TILES == 2, "a gated warp takes 16 rows of U and the same 16 of G");
    constexpr int TILE_ROWS = 16 * M_TILES;
    constexpr int CB = Q4K_BLOCK_BYTES, CHUNK_VECS = CB / 16;
    constexpr int W_BYTES = TILE_ROWS * CB;
    constexpr int X_BYTES = K_ALIGN * 4;  // a chunk of x: 256 floats
    constexpr int STAGE = W_BYTES + X_BYTES;
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
        if (whole) {
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
    };
    // the chunk's 256 floats of x: two 16-byte vectors a lane
    auto issue_x = [&](int i) {
        if (i < n_total) {
            const int chunk = warp + x_k * WARPS;
            if (++x_k == n_mine) x_k = 0;
            uint8_t * st = stages + (i % ST) * STAGE + W_BYTES;
            const float * src = a.x + int64_t(chunk) * K_ALIGN;
            cuda::cp_async16(st + 16 * lane, src + 4 * lane);
            cuda::cp_async16(st + 512 + 16 * lane, src + 128 + 4 * lane);
        }
        cuda::cp_async_commit();
    };

    float acc[M_TILES][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][e] = 0.0f;

#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue_weights(i);
    cuda::wait_for_previous();
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue_x(i);
    int i = 0;
    for (int tl = 0; tl < my_tiles; ++tl) {
        const int r0 = tile_row(tl);
        for (int k = 0; k < n_mine; ++k, ++i) {
            cuda::cp_async_wait<ST - 2>();
            __syncwarp();
            issue_weights(i + ST - 1);
            issue_x(i + ST - 1);
            const uint8_t * st = stages + (i % ST) * STAGE;
            // this lane's 8 values of x: 8 lane .. 8 lane + 7 of the chunk (sub-block lane / 4, its values
            // 8 (lane % 4) ..), as bf16 pairs (0, 2), (1, 3), (4, 6), (5, 7), and their sum over the sub-block
            const float4 * sx = reinterpret_cast<const float4 *>(st + W_BYTES);
            const float4 v0 = sx[2 * lane], v1 = sx[2 * lane + 1];
            const uint32_t px0 = pack_bf16x2(v0.x, v0.z), px1 = pack_bf16x2(v0.y, v0.w);
            const uint32_t px2 = pack_bf16x2(v1.x, v1.z), px3 = pack_bf16x2(v1.y, v1.w);
            float xsum = ((bf16_lo(px0) + bf16_hi(px0)) + (bf16_lo(px1) + bf16_hi(px1))) +
                         ((bf16_lo(px2) + bf16_hi(px2)) + (bf16_lo(px3) + bf16_hi(px3)));
            xsum += __shfl_xor_sync(0xffffffffu, xsum, 1);
            xsum += __shfl_xor_sync(0xffffffffu, xsum, 2);
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
                    // column 0's pairs of sub-block s for lane t, from the lane that packed them
                    const int from = 4 * s + t;
                    const uint32_t b00 = __shfl_sync(0xffffffffu, px0, from), b01 = __shfl_sync(0xffffffffu, px1, from);
                    const uint32_t b10 = __shfl_sync(0xffffffffu, px2, from), b11 = __shfl_sync(0xffffffffu, px3, from);
                    const float xs = __shfl_sync(0xffffffffu, xsum, 4 * s);
                    const int lo = h == 0 ? 0 : 4, hi = h == 0 ? 8 : 12;  // the nibble's shifts
#pragma unroll
                    for (int mt = 0; mt < M_TILES; ++mt) {
                        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_bf16(c, nibble_pair(qw[mt][0].x, lo), nibble_pair(qw[mt][1].x, lo), nibble_pair(qw[mt][0].x, hi),
                                 nibble_pair(qw[mt][1].x, hi), b00, b01);
                        mma_bf16(c, nibble_pair(qw[mt][0].y, lo), nibble_pair(qw[mt][1].y, lo), nibble_pair(qw[mt][0].y, hi),
                                 nibble_pair(qw[mt][1].y, hi), b10, b11);
#pragma unroll
                        for (int hr = 0; hr < 2; ++hr) {
                            int scale, min;
                            q4k_scale_min(s, sc[mt][hr], scale, min);
                            const float ds = dm[mt][hr].x * float(scale);
                            const float bias = __fmaf_rn(128.0f, ds, dm[mt][hr].y * float(min));
                            const float v = __fmaf_rn(ds, c[2 * hr], -bias * xs);  // this sub-block's part of row g + 8 hr
                            acc[mt][2 * hr] += v;
                        }
                    }
                }
            }
        }  // chunks of tile tl

        // the tile's sums: as q8_0_matmul.cuh (NG 1), column 0 only
        constexpr int PER_WARP = M_TILES * 32 * 4;
        static_assert(PER_WARP * 4 <= STAGE, "a warp's partial sums fit one of its stages");
        auto red_of = [&](int w) {
            const int nw = chunks_of(w);
            return reinterpret_cast<float *>(smem + (w * ST + (nw > 0 ? ((tl + 1) * nw - 1) % ST : 0)) * STAGE);
        };
        float * mine = red_of(warp);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                mine[(mt * 32 + lane) * 4 + e] = acc[mt][e];
                acc[mt][e] = 0.0f;
            }
        __syncthreads();
        const float * red[WARPS];
#pragma unroll
        for (int w = 0; w < WARPS; ++w) red[w] = red_of(w);
        constexpr int OUT_TILES = GATED ? M_TILES / 2 : M_TILES;
        for (int idx = threadIdx.x; idx < OUT_TILES * 128; idx += WARPS * 32) {
            const int e = idx % 4, l = (idx / 4) % 32, mt = idx / 128;
            const int m = r0 + 16 * mt + l / 4 + 8 * (e / 2);
            const int n = 2 * (l % 4) + e % 2;
            float v = red[0][idx];
#pragma unroll
            for (int w = 1; w < WARPS; ++w) v += red[w][idx];
            if (GATED) {
                const int at_gate = idx + 128;
                float gv = red[0][at_gate];
#pragma unroll
                for (int w = 1; w < WARPS; ++w) gv += red[w][at_gate];
                v *= detail::silu(gv);
            }
            if (n == 0 && m < a.M) a.y[m] = v;
        }
        __syncthreads();
    }  // tiles
    cuda::cp_async_wait<0>();
}

// BF16X_PLAIN_M_TILES: the 16-row tiles a warp of a plain product takes (2: each chunk of x serves 32 rows)
#ifndef BF16X_PLAIN_M_TILES
#define BF16X_PLAIN_M_TILES 1
#endif
template <bool GATED, int ST>
cudaError_t launch_st(const matmul_args & a, cudaStream_t stream) {
    constexpr int M_TILES = GATED ? 2 : BF16X_PLAIN_M_TILES;
    constexpr auto kernel = matmul<GATED, M_TILES, ST>;
    constexpr int SMEM = WARPS * ST * (16 * M_TILES * Q4K_BLOCK_BYTES + K_ALIGN * 4);
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
    return detail::launch(kernel, dim3(grid), dim3(WARPS * 32), smem, stream, detail::pdl_kernel<kernel>(dev), a);
}

// The product of a one-column Q4_K a (no norm, no bias), stages as the int8 kernel's (3 up to
// LUCEBOX_Q8_0_ST3_MAX_M rows; BF16X_STAGES overrides).
#ifndef BF16X_STAGES
#define BF16X_STAGES 0
#endif
inline cudaError_t matmul(const matmul_args & a, cudaStream_t stream) {
    if (a.type != weight_type::q4_k || a.N != 1 || a.norm_w != nullptr || a.bias != nullptr) return cudaErrorInvalidValue;
    const bool gated = a.gate != nullptr;
    const int st = BF16X_STAGES > 0 ? BF16X_STAGES : a.M <= LUCEBOX_Q8_0_ST3_MAX_M ? 3 : STAGES;
    if (st == 4) return gated ? launch_st<true, 4>(a, stream) : launch_st<false, 4>(a, stream);
    if (st == 3) return gated ? launch_st<true, 3>(a, stream) : launch_st<false, 3>(a, stream);
    return gated ? launch_st<true, 2>(a, stream) : launch_st<false, 2>(a, stream);
}

}  // namespace lucebox::kernels::q8_0::bf16x
