// Quantized weights -> BF16, at close to the copy rate: the weights of a prefill micro-batch's
// product before its BF16 cuBLAS GEMM (ggml patch 0004 asks lucebox's converter first; ggml's own
// converter reads a Q8_0 27B's FFN at a third of the copy rate).
//
//     dst[i] = bf16(value i of the blocks at src)           (round to nearest even)
//
// Formats, in ggml's block layouts (the arrays are contiguous runs of blocks):
//   q8_0: 34-byte blocks of 32 values: fp16 d, 32 int8 q; value d * q;
//   q4_k: 144-byte super-blocks of 256: fp16 d, fp16 dmin, 12 bytes of six-bit scales and mins,
//         128 bytes of 4-bit q (bytes 32j..32j+31: sub-block 2j in the low nibbles, 2j+1 in the
//         high ones); value of sub-block s: d * scale_s * q - dmin * min_s;
//   q5_k: 176-byte super-blocks of 256: q4_k's first 16 bytes, 32 bytes qh, then q4_k's 128 bytes
//         of low 4 bits; bit s of qh[l] is the fifth bit (16) of value l of sub-block s;
//   q6_k: 210-byte super-blocks of 256: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16
//         int8 scales (one per 16 values), fp16 d; value d * scale * (q - 32), where for half h
//         (128 values) and l < 32: value 128h + l      = ql[64h + l] low nibble,  qh[32h + l] bits 0-1;
//                                  value 128h + 32 + l = ql[64h + 32 + l] low,  qh bits 2-3;
//                                  value 128h + 64 + l = ql[64h + l] high,      qh bits 4-5;
//                                  value 128h + 96 + l = ql[64h + 32 + l] high, qh bits 6-7;
//                                  scale of value 128h + 32k + l: scales[8h + 2k + l / 16].
// Row-tiled weights (weight_tiles.h): each row's 256 values are one chunk in the same format, but
// for Q6_K's whole tiles, whose chunks are spread over their piece (tiles::q6k_piece_offset).
// One thread writes 32 consecutive values (four 16-byte stores), so a warp writes 2 KB at once
// (and, but for Q6_K's tiles, reads its blocks' bytes contiguously). Header-only, without ggml:
// tests/cpp/test_bf16_dequant.cu checks it against ggml's CPU dequantization; the ggml glue is in
// q8_0_matmul.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "weight_tiles.h"
#include "q8_0_matmul_args.h"  // q4k_scale_min

namespace lucebox::kernels::bf16_dequant {

enum class format : uint8_t { q8_0, q4_k, q6_k, q5_k };

__host__ __device__ constexpr int values_per_block(format f) { return f == format::q8_0 ? 32 : 256; }
__host__ __device__ constexpr int block_bytes(format f) {
    return f == format::q8_0 ? 34 : f == format::q4_k ? 144 : f == format::q5_k ? 176 : 210;
}

namespace detail {

__device__ __forceinline__ float half_at(const uint8_t * p) {
    __half h;
    memcpy(&h, p, 2);  // 2-byte aligned in every format here
    return __half2float(h);
}

// Eight floats -> 16 bytes of bf16.
__device__ __forceinline__ void store8(__nv_bfloat16 * dst, const float (&v)[8]) {
    uint4 out;
    __nv_bfloat162 p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    memcpy(&out, p, 16);
    *reinterpret_cast<uint4 *>(dst) = out;
}

// Bytes of 256 values of a row: eight q8_0 blocks or one super-block.
__host__ __device__ constexpr int64_t chunk_bytes(format f) { return f == format::q8_0 ? 272 : block_bytes(f); }

// The block holding values 32i..32i+31 (q8_0: its 34-byte block; else its super-block):
// consecutive blocks, or (tiled_M > 0) a row-tiled weight of tiled_M rows, row_bytes apart
// (weight_tiles.h), whose 256 values of a row are one contiguous chunk.
template <format F>
__device__ __forceinline__ const uint8_t * block_at(const uint8_t * src, int64_t i, int64_t tiled_M, int64_t row_bytes) {
    constexpr int64_t CB = chunk_bytes(F);
    if (tiled_M == 0) return F == format::q8_0 ? src + 34 * i : src + CB * (i / 8);
    const int64_t groups_per_row = row_bytes / CB * 8;
    const int64_t row = i / groups_per_row, g = i - row * groups_per_row;
    const uint8_t * chunk = src + tiles::chunk_offset(row, g / 8, tiled_M, row_bytes, CB);
    return F == format::q8_0 ? chunk + 34 * (g % 8) : chunk;
}

// Thread i: values 32i..32i+31 (n_groups = values / 32).
template <format F>
__global__ void dequantize(const uint8_t * __restrict__ src, int64_t n_groups, __nv_bfloat16 * __restrict__ dst,
                           int64_t tiled_M, int64_t row_bytes) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_groups) return;
    __nv_bfloat16 * out = dst + 32 * i;
    if constexpr (F == format::q8_0) {
        const uint8_t * b = block_at<F>(src, i, tiled_M, row_bytes);
        const float d = half_at(b);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = d * float(int8_t(b[2 + 8 * c + j]));
            store8(out + 8 * c, v);
        }
    } else if constexpr (F == format::q4_k || F == format::q5_k) {
        constexpr bool Q5 = F == format::q5_k;
        const uint8_t * b = block_at<F>(src, i, tiled_M, row_bytes);
        const int s = int(i % 8);  // sub-block
        const uint32_t * packed = reinterpret_cast<const uint32_t *>(b + 4);  // 4-byte aligned blocks
        const uint32_t words[3] = {packed[0], packed[1], packed[2]};
        int sc, mn;
        q8_0::q4k_scale_min(s, words, sc, mn);
        const float d = half_at(b) * float(sc), m = half_at(b + 2) * float(mn);
        const uint8_t * q = b + (Q5 ? 48 : 16) + 32 * (s / 2);
        const int shift = 4 * (s % 2);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int fifth = Q5 ? ((b[16 + 8 * c + j] >> s) & 1) << 4 : 0;  // (q5_k: qh[l], bit s)
                v[j] = __fsub_rn(__fmul_rn(d, float(((q[8 * c + j] >> shift) & 0xF) | fifth)), m);  // no FMA: as ggml's CPU
            }
            store8(out + 8 * c, v);
        }
    } else {
        // byte j of the super-block: in ggml's layout, or (a whole tile of a tiled weight) at its
        // place in the 16-row piece's fragment order (weight_tiles.h); ql and qh as words of 4 values
        const uint8_t * b = block_at<F>(src, i, tiled_M, row_bytes);
        int s = -1;  // the row within its piece (fragment order)
        if (tiled_M != 0) {
            const int64_t row = i / (row_bytes / tiles::Q6K_CHUNK_BYTES * 8);
            if (row - row % tiles::TILE_ROWS + tiles::TILE_ROWS <= tiled_M) {
                s = int(row % tiles::TILE_ROWS);
                b -= tiles::Q6K_CHUNK_BYTES * s;  // the piece
            }
        }
        auto at = [&](int j) { return s >= 0 ? b + tiles::q6k_piece_offset(s, j) : b + j; };
        auto word = [&](int j) {  // bytes j..j+3, j % 4 == 0 (2-byte aligned in ggml's layout)
            const uint8_t * p = at(j);
            return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
        };
        const int g = int(i % 8), h = g / 4, k = g % 4;  // values 128h + 32k .. + 31
        const int ql = 64 * h + 32 * (k % 2), qh = 128 + 32 * h;
        const float d = half_at(at(208));
        const int lshift = 4 * (k / 2), hshift = 2 * k;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float ds = d * float(int8_t(*at(192 + 8 * h + 2 * k + c / 2)));  // values l < 16: the first scale
            float v[8];
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                const int l = 8 * c + 4 * w;
                const uint32_t lo = word(ql + l), hi = word(qh + l);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int q = int((lo >> (8 * e + lshift)) & 0xF) | int(((hi >> (8 * e + hshift)) & 3) << 4);
                    v[4 * w + e] = ds * float(q - 32);
                }
            }
            store8(out + 8 * c, v);
        }
    }
}

}  // namespace detail

// Dequantizes n_values values (a multiple of values_per_block(f)) of contiguous blocks at src into
// dst (16-byte aligned, row-major values), asynchronously on stream. tiled_M > 0: src is a
// row-tiled weight (weight_tiles.h) of tiled_M rows, row_bytes apart.
inline cudaError_t dequantize(format f, const void * src, int64_t n_values, __nv_bfloat16 * dst, cudaStream_t stream,
                              int64_t tiled_M = 0, int64_t row_bytes = 0) {
    if (n_values <= 0 || n_values % values_per_block(f) != 0) return cudaErrorInvalidValue;
    if (tiled_M != 0 && (tiled_M < 0 || row_bytes <= 0 || row_bytes % detail::chunk_bytes(f) != 0 ||
                         n_values != tiled_M * (row_bytes / detail::chunk_bytes(f)) * 256))
        return cudaErrorInvalidValue;
    const int64_t n_groups = n_values / 32;
    const int threads = 256;
    const unsigned blocks = unsigned((n_groups + threads - 1) / threads);
    const auto * s = static_cast<const uint8_t *>(src);
    switch (f) {
        case format::q8_0: detail::dequantize<format::q8_0><<<blocks, threads, 0, stream>>>(s, n_groups, dst, tiled_M, row_bytes); break;
        case format::q4_k: detail::dequantize<format::q4_k><<<blocks, threads, 0, stream>>>(s, n_groups, dst, tiled_M, row_bytes); break;
        case format::q5_k: detail::dequantize<format::q5_k><<<blocks, threads, 0, stream>>>(s, n_groups, dst, tiled_M, row_bytes); break;
        case format::q6_k: detail::dequantize<format::q6_k><<<blocks, threads, 0, stream>>>(s, n_groups, dst, tiled_M, row_bytes); break;
    }
    return cudaGetLastError();
}

}  // namespace lucebox::kernels::bf16_dequant
