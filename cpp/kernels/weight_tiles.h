// Row-tiled weights: the layout lucebox gives Q8_0 and Q4_K product weights on a CUDA device at
// load time, so that the few-column kernel (q8_0_matmul.cuh) reads each staged piece as one
// contiguous block instead of 16 pieces of one row chunk each.
//
// A weight [M rows][row_bytes] (row_bytes = K / 256 * CB, CB the bytes of 256 values of a row: 272
// for Q8_0's eight 34-byte blocks, 144 for one Q4_K super-block) is cut into tiles of 16 rows
// (the last one R = M - 16 * (M / 16) rows when M % 16 != 0). A tile keeps its own bytes, the same
// 16 * row_bytes bytes at the same place as in ggml's row-major layout, reordered chunk-major:
//
//     ggml:   row s of the tile, chunk c at  s * row_bytes + c * CB
//     tiled:                                 (c * R + s) * CB           (R = rows of the tile)
//
// So every range of whole tiles is itself a valid tiled weight (a stack of projections whose
// members have multiples of 16 rows, or the row chunks of patch 0004's BF16 route), and the bytes of
// 256 values of one row are still CB contiguous bytes in ggml's block format.
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

// ggml's row-major bytes of rows [0, M) -> the tiled layout (dst and src distinct, M * row_bytes
// bytes each); row_bytes % cb == 0.
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
