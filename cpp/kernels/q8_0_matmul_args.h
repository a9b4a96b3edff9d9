// The arguments of the Q8_0 few-column matmul (q8_0_matmul.cuh) and their checks, in plain C++ so
// that CPU builds and CPU tests see them too. A product the checks refuse stays with ggml.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lucebox::kernels::q8_0 {

constexpr int QK = 32;                      // values per Q8_0 block
constexpr int BLOCK_BYTES = 34;             // fp16 scale + 32 int8
constexpr int CHUNK_BLOCKS = 8;             // blocks of one row the kernel stages at a time
constexpr int COL_GROUP = 8;                // activation columns per mma (its N)
constexpr int MAX_COLS = 64;               // columns of one launch (more: one launch per 64)
constexpr int K_ALIGN = QK * CHUNK_BLOCKS;  // 256: a chunk of a row is whole 16-byte vectors

// The weight formats the kernel reads, in ggml's block layouts:
//   q8_0: blocks of 32 values, 34 bytes (fp16 scale d, 32 int8 q): value d * q;
//   q4_k: super-blocks of 256 values, 144 bytes (fp16 d, fp16 dmin, 12 bytes packing 8 six-bit
//         scales and 8 six-bit mins, 128 bytes of 4-bit q): value of sub-block s (32 values) is
//         d * scale_s * q - dmin * min_s; bytes 32j..32j+31 of the quants hold sub-block 2j in
//         their low nibbles and 2j+1 in their high ones;
//   q5_k: super-blocks of 256 values, 176 bytes: q4_k's d, dmin and 12 scale/min bytes, then 32
//         bytes qh, then q4_k's 128 bytes of low 4 bits; bit s of qh[l] is the fifth bit (16) of
//         value l of sub-block s;
//   q6_k: super-blocks of 256 values, 210 bytes (128 bytes ql: low 4 bits, 64 bytes qh: high 2
//         bits, 16 int8 scales, fp16 d): value d * scale * (q - 32); for half h (128 values) and
//         l < 32, value 128h + 32p + l has the low (p < 2) or high (p >= 2) nibble of
//         ql[64h + 32(p % 2) + l], bits 2p, 2p + 1 of qh[32h + l] and scales[8h + 2p + l / 16].
//         Row-tiled weights only (a row's 210-byte chunks are not 16-byte aligned in ggml's
//         layout; a 16-row tile's chunk is 16 x 210 bytes, in fragment order: weight_tiles.h).
enum class weight_type : uint8_t { q8_0, q4_k, q6_k, q5_k };
constexpr int Q4K_BLOCK_BYTES = 144;
constexpr int Q5K_BLOCK_BYTES = 176;
constexpr int Q6K_BLOCK_BYTES = 210;

#if defined(__CUDACC__)
#define LUCEBOX_Q4K_FN __host__ __device__ __forceinline__
#else
#define LUCEBOX_Q4K_FN inline
#endif
// Six-bit scale and min of q4_k sub-block s (0..7) from a super-block's 12 packed scale/min bytes
// (bytes 4..15 of the block, read as 3 little-endian words), in ggml's packing: sub-blocks 0..3 in
// the low six bits of bytes s and s + 4; 4..7 in the nibbles of byte s + 4 plus the top two bits
// of bytes s - 4 (scale) and s (min). Shared by the product and the BF16 conversion.
LUCEBOX_Q4K_FN void q4k_scale_min(int s, const uint32_t (&w)[3], int & scale, int & min) {
    auto byte = [&](int i) { return int((w[i / 4] >> (8 * (i % 4))) & 0xFFu); };
    if (s < 4) {
        scale = byte(s) & 63;
        min = byte(s + 4) & 63;
    } else {
        scale = (byte(s + 4) & 0xF) | ((byte(s - 4) >> 6) << 4);
        min = (byte(s + 4) >> 4) | ((byte(s) >> 6) << 4);
    }
}
// The six-bit scales of sub-blocks 4i..4i+3 (i = 0, 1), one a byte (byte k: sub-block 4i + k), from
// the same 12 bytes: the product unpacks four with three operations instead of one at a time.
LUCEBOX_Q4K_FN uint32_t q4k_scales4(const uint32_t (&w)[3], int i) {
    return i == 0 ? w[0] & 0x3F3F3F3Fu : (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
}
// Four q5_k quants of sub-block s (0..7) as unsigned bytes for the product's mma: qs holds four
// quant bytes (values i..i+3 of sub-blocks 2 (s / 2) and 2 (s / 2) + 1 in their low and high
// nibbles), qh the same values' four qh bytes. Even s: the quants q = nibble + 16 * bit s (0..31);
// odd s: 8q (0..248: the high nibble shifted right by one, the fifth bit at bit 7), so that a
// sub-block's integer sum times q5k_scale_factor(s) is 16 times its plain sum, as Q4_K's are.
// s is a constant where the kernel calls it (its loops are unrolled): three or four operations.
LUCEBOX_Q4K_FN uint32_t q5k_quant_bytes(uint32_t qs, uint32_t qh, int s) {
    const uint32_t bit = s <= 4 ? qh << (4 - s) : qh >> (s - 4);  // bit s of each byte -> bit 4
    return s % 2 == 0 ? (qs & 0x0F0F0F0Fu) | (bit & 0x10101010u) : ((qs >> 1) & 0x78787878u) | ((bit << 3) & 0x80808080u);
}
// What a q5_k sub-block's sum of q5k_quant_bytes is multiplied by, times its six-bit scale: 16 for
// even s (bytes q), 2 for odd s (bytes 8q).
LUCEBOX_Q4K_FN int q5k_scale_factor(int s) { return s % 2 == 0 ? 16 : 2; }
#undef LUCEBOX_Q4K_FN
// bytes of 256 values of one row (one staged chunk)
#if defined(__CUDACC__)
#define LUCEBOX_ARGS_HD __host__ __device__
#else
#define LUCEBOX_ARGS_HD
#endif
LUCEBOX_ARGS_HD constexpr int chunk_bytes(weight_type t) {
    return t == weight_type::q4_k   ? Q4K_BLOCK_BYTES
           : t == weight_type::q5_k ? Q5K_BLOCK_BYTES
           : t == weight_type::q6_k ? Q6K_BLOCK_BYTES
                                    : CHUNK_BLOCKS * BLOCK_BYTES;
}
// Whether the format has a min per sub-block (Q4_K, Q5_K: value d * scale * q - dmin * min), so the
// product also needs the activation blocks' sums.
LUCEBOX_ARGS_HD constexpr bool has_mins(weight_type t) { return t == weight_type::q4_k || t == weight_type::q5_k; }
// Whether the activations are quantized with one scale per 256-value chunk (the super-block
// formats, whose products sum a chunk in integers) rather than per 32 values.
LUCEBOX_ARGS_HD constexpr bool chunk_scaled(weight_type t) { return t != weight_type::q8_0; }
#undef LUCEBOX_ARGS_HD

struct matmul_args {
    weight_type type = weight_type::q8_0;  // of w and gate
    const uint8_t * w = nullptr;     // [M][row_bytes] (U when gated)
    const uint8_t * gate = nullptr;  // [M][row_bytes] (G) or null
    int64_t row_bytes = 0;
    bool tiled = false;              // w and gate in weight_tiles.h's row-tiled layout (M rows each)
    int K = 0, M = 0, N = 0;
    const float * x = nullptr;       // x[n * x_stride + k]
    int64_t x_stride = 0;
    float * y = nullptr;             // y[n * y_stride + m]
    int64_t y_stride = 0;
    const float * bias = nullptr;    // bias[n * bias_stride + m] added to y[n, m], or null (plain only)
    int64_t bias_stride = 0;         // 0: one [M] vector for every column; else a [N][bias_stride] residual
    // Non-null: the product's input is the RMS norm of x times these K weights,
    //     x_n * norm_w / sqrt(mean_k(x_n[k]^2) + norm_eps)     (ggml_rms_norm then ggml_mul),
    // computed inside the product: x_n * norm_w is quantized, the column's factor applied to its sums.
    // Read before the dependent-launch wait: norm_w must not be written by the kernels before (a weight).
    const float * norm_w = nullptr;
    float norm_eps = 0.0f;
};

// Column groups of 8 the kernel is instantiated for: 1, 2, 4 or 8 (N <= 8, 16, 32, more).
inline int col_groups(int N) { return N <= 8 ? 1 : N <= 16 ? 2 : N <= 32 ? 4 : 8; }

// Scratch for the quantized activations (cols = 8 * col_groups(N), at most 64: groups of 64 columns
// reuse it one after another; columns >= N are left as they are, never read as values): xq int8
// [K/32][cols][32] (q6_k: each chunk's [8][cols][32] bytes in the kernel's x_q6k_offset order),
// then their scales
// xd float [K/32][cols] (q4_k, q6_k: the 8 blocks of a 256-value chunk hold the chunk's one scale),
// then for q4_k and q5_k xs float [K/32][cols] (the sums of each block's 32 values, for the mins), then with
// norm_w ss float [K/32][cols] (the sums of each block's 32 squares of x).
inline size_t scratch_bytes(const matmul_args & a) {
    const size_t cols = size_t(COL_GROUP) * col_groups(a.N);
    const size_t nb = size_t(a.K) / QK;
    const size_t per_block = 1 + (has_mins(a.type) ? 1 : 0) + (a.norm_w != nullptr ? 1 : 0);
    return nb * cols * QK + nb * cols * sizeof(float) * per_block;
}

// Null when the product fits this kernel, else why not.
inline const char * check_args(const matmul_args & a) {
    if (a.K <= 0 || a.K % K_ALIGN != 0) return "K must be a positive multiple of 256";
    if (a.M <= 0) return "M must be positive";
    if (a.N < 1) return "N must be positive";
    if (a.type == weight_type::q6_k) {
        if (!a.tiled) return "q6_k weights must be row-tiled";
        if (a.M % 16 != 0) return "q6_k weights need whole 16-row tiles";
        if (a.row_bytes != int64_t(a.K) / K_ALIGN * Q6K_BLOCK_BYTES) return "row stride";
    } else if (a.row_bytes < int64_t(a.K) / K_ALIGN * chunk_bytes(a.type) || a.row_bytes % 16 != 0) {
        return "row stride";
    }
    if (reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return "weights not 16-byte aligned";
    if (a.gate != nullptr && reinterpret_cast<uintptr_t>(a.gate) % 16 != 0) return "gate not 16-byte aligned";
    if (a.x_stride < a.K || a.y_stride < a.M) return "column strides";
    if (a.bias != nullptr && a.gate != nullptr) return "a bias with a gated product";
    if (a.bias != nullptr && a.bias_stride != 0 && a.bias_stride < a.M) return "bias column stride";
    if (a.norm_w != nullptr && !(a.norm_eps >= 0.0f && a.norm_eps < 1.0f)) return "norm eps must be in [0, 1)";
    return nullptr;
}

}  // namespace lucebox::kernels::q8_0
