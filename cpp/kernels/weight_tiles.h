// Row-tiled weights: the layout lucebox gives Q8_0, Q4_K, Q5_K and Q6_K product weights on a CUDA device at
// load time, so that the few-column kernel (q8_0_matmul.cuh) reads each staged piece as one
// contiguous block instead of 16 pieces of one row chunk each.
//
// A weight [M rows][row_bytes] (row_bytes = K / 256 * CB, CB the bytes of 256 values of a row: 272
// for Q8_0's eight 34-byte blocks, 144, 176 and 210 for one Q4_K / Q5_K / Q6_K super-block) is cut into tiles of 16 rows
// (the last one R = M - 16 * (M / 16) rows when M % 16 != 0). A tile keeps its own bytes, the same
// 16 * row_bytes bytes at the same place as in ggml's row-major layout, reordered chunk-major:
//
//     ggml:   row s of the tile, chunk c at  s * row_bytes + c * CB
//     tiled:                                 (c * R + s) * CB           (R = rows of the tile)
//
// So every range of whole tiles is itself a valid tiled weight (a stack of projections whose
// members have multiples of 16 rows, or the row chunks of patch 0004's BF16 route), and the bytes of
// 256 values of one row are still CB contiguous bytes in ggml's block format, except for Q6_K:
//
// Q6_K (cb = Q6K_CHUNK_BYTES, 210: no other tiled format has chunks of that size): each whole
// 16-row tile's chunk (a "piece": 16 x 210 bytes at chunk_offset(16 T, c)) holds its rows' bytes
// in the product's fragment order (q6k_piece_offset), so that lane 4g + t of a warp reads all it
// multiplies (rows g and g + 8) as eight aligned 16-byte vectors. Byte b of row 16 T + s's chunk c
// lies at chunk_offset(16 T, c) + q6k_piece_offset(s, b).
//
// Which weights are tiled is known to lucebox only (ggml's own kernels cannot read them): the
// registry below holds their device ranges. The MUL_MAT hook (q8_0_matmul.cu) takes every product of
// a tiled weight, and patch 0004's converter every BF16 conversion of one. Plain C++ (the offsets
// are also compiled into the CUDA kernels); the registry is in weight_tiles.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define LUCEBOX_TILES_FN __host__ __device__ __forceinline__
#else
#define LUCEBOX_TILES_FN inline
#endif

namespace lucebox::kernels::tiles {

constexpr int TILE_ROWS = 16;
constexpr int CHUNK_VALUES = 256;

// Byte offset of row `row`'s chunk `chunk` (256 values, `cb` bytes) in a tiled weight of M rows.
LUCEBOX_TILES_FN int64_t chunk_offset(int64_t row, int64_t chunk, int64_t M, int64_t row_bytes, int64_t cb) {
    const int64_t tile = row / TILE_ROWS, s = row - tile * TILE_ROWS;
    const int64_t rows = M - tile * TILE_ROWS < TILE_ROWS ? M - tile * TILE_ROWS : TILE_ROWS;
    return tile * TILE_ROWS * row_bytes + (chunk * rows + s) * cb;
}

constexpr int64_t Q6K_CHUNK_BYTES = 210;
constexpr int64_t Q6K_PIECE_BYTES = TILE_ROWS * Q6K_CHUNK_BYTES;  // 3360 = 210 x 16

// Where byte b (0..209, ggml's q6_k super-block: ql 0..127, qh 128..191, scales 192..207, d 208..209)
// of row s (0..15) of a Q6_K piece lies in it. Lane 4g + t of the product takes rows g and g + 8 and,
// of every 16 values with one scale (u = 0, 1 of half h's 32-value quarters), values 4t..4t+3; the
// bytes of those (ggml: ql[64h + 32 kind + 16u + 4t + i] (kind 0, 1), qh[32h + 16u + 4t + i] (kind 2),
// i < 4) lie in 16-byte vector 3h + kind of the lane, word 2 (s / 8) + u:
//     [6 vectors][32 lanes][4 words (row g: u 0, 1; row g + 8: u 0, 1)][4 bytes]   3072 bytes
//     [16 rows][16 scales]                                                        256 bytes at 3072
//     [16 rows][fp16 d]                                                            32 bytes at 3328
LUCEBOX_TILES_FN int q6k_piece_offset(int s, int b) {
    if (b >= 192) return b < 208 ? 3072 + 16 * s + (b - 192) : 3328 + 2 * s + (b - 208);
    const int h = b < 128 ? b / 64 : (b - 128) / 32, kind = b < 128 ? (b % 64) / 32 : 2, l = b % 32;
    const int u = l / 16, t = (l % 16) / 4, i = l % 4;
    return ((3 * h + kind) * 32 + 4 * (s % 8) + t) * 16 + 4 * (2 * (s / 8) + u) + i;
}

// ggml's row-major bytes of rows [0, M) -> the tiled layout (dst and src distinct, M * row_bytes
// bytes each); row_bytes % cb == 0. (cb = 210 with M % 16 != 0: the last, partial tile's chunks stay
// contiguous, as for the other formats; the kernels read Q6_K of whole tiles only.)
void to_tiles(const uint8_t * src, uint8_t * dst, int64_t M, int64_t row_bytes, int64_t cb);
// and back (tests)
void from_tiles(const uint8_t * src, uint8_t * dst, int64_t M, int64_t row_bytes, int64_t cb);

// A tiled weight's device range, as registered.
struct range {
    const uint8_t * begin = nullptr;
    int64_t M = 0;          // rows of the whole registered weight
    int64_t row_bytes = 0;
};

// Registry of tiled device ranges (thread-safe). add: after the tiled bytes were uploaded;
// remove_within: every range inside [begin, begin + bytes) (a weights buffer being freed).
void add(const void * begin, int64_t M, int64_t row_bytes);
void remove_within(const void * begin, size_t bytes);
bool any();  // whether any weight is tiled now (a fast no for the hook)
size_t count();

// Where the weight whose rows [0, M) start at `data` (row_bytes apart) lies:
//   not_tiled: outside every tiled range;
//   tiled: inside one, starting on a tile boundary and ending on one or at the range's end, so that
//          it is itself a tiled weight of M rows;
//   misaligned: inside one but cutting a tile (no kernel can read it: an error).
enum class lookup_result { not_tiled, tiled, misaligned };
lookup_result find(const void * data, int64_t M, int64_t row_bytes);

}  // namespace lucebox::kernels::tiles
