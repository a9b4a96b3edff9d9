// Row-tiled weights (cpp/kernels/weight_tiles.h): the reorder is a permutation that keeps every
// 16-row tile in place (so ranges of whole tiles are tiled weights themselves), and the registry
// tells tiled, untiled and tile-cutting weights apart. Plain C++ (the kernels' side is checked by
// tests/cpp/test_q8_0_matmul.cu and test_bf16_dequant.cu on a GPU).
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "check.h"
#include "weight_tiles.h"

namespace tiles = lucebox::kernels::tiles;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto & b : v) b = uint8_t(rng());
    return v;
}

}  // namespace

TEST_CASE(tiling_is_a_permutation_inside_each_tile) {
    for (int64_t cb : {272, 144}) {
        for (int64_t M : {1, 15, 16, 17, 33, 48}) {
            const int64_t row_bytes = 3 * cb;
            const std::vector<uint8_t> src = random_bytes(size_t(M * row_bytes), uint32_t(M + cb));
            std::vector<uint8_t> t(src.size()), back(src.size());
            tiles::to_tiles(src.data(), t.data(), M, row_bytes, cb);
            tiles::from_tiles(t.data(), back.data(), M, row_bytes, cb);
            CHECK(back == src);
            std::set<int64_t> seen;
            for (int64_t row = 0; row < M; ++row)
                for (int64_t c = 0; c < 3; ++c) {
                    const int64_t at = tiles::chunk_offset(row, c, M, row_bytes, cb);
                    const int64_t tile = row / 16, begin = tile * 16 * row_bytes;
                    const int64_t end = std::min(M, (tile + 1) * 16) * row_bytes;
                    CHECK(at >= begin && at + cb <= end);  // stays in its tile's bytes
                    CHECK(at % cb == 0);
                    seen.insert(at);
                }
            CHECK(int64_t(seen.size()) == M * 3);  // every chunk its own place
            if (M > 1) CHECK(t != src);
        }
    }
}

TEST_CASE(q6k_pieces_are_in_fragment_order) {
    // every byte of a piece's 16 rows has its own place in the 3360 bytes
    std::set<int> places;
    for (int s = 0; s < 16; ++s)
        for (int b = 0; b < 210; ++b) places.insert(tiles::q6k_piece_offset(s, b));
    CHECK(places.size() == 3360 && *places.begin() == 0 && *places.rbegin() == 3359);
    // whole tiles (M = 32) and a partial last one (M = 37, its rows stay contiguous): back to the
    // source bytes; lane 4g + t's vector 3h + kind holds, for rows g and g + 8 and halves u,
    // the ql (kind 0, 1) or qh (kind 2) bytes of values 4t..4t+3 of each 16, as the kernel reads them
    const int64_t cb = tiles::Q6K_CHUNK_BYTES, row_bytes = 2 * cb;
    for (int64_t M : {32, 37}) {
        const std::vector<uint8_t> src = random_bytes(size_t(M * row_bytes), uint32_t(M));
        std::vector<uint8_t> t(src.size()), back(src.size());
        tiles::to_tiles(src.data(), t.data(), M, row_bytes, cb);
        tiles::from_tiles(t.data(), back.data(), M, row_bytes, cb);
        CHECK(back == src);
        bool placed = true;
        for (int64_t row = 0; row < M; ++row)
            for (int64_t c = 0; c < 2; ++c) {
                const uint8_t * plain = src.data() + row * row_bytes + c * cb;
                const int s = int(row % 16);
                if (row - s + 16 > M) {  // the partial tile: contiguous chunks
                    const int64_t at = tiles::chunk_offset(row, c, M, row_bytes, cb);
                    placed = placed && std::equal(plain, plain + cb, t.begin() + at);
                    continue;
                }
                const uint8_t * piece = t.data() + tiles::chunk_offset(row - s, c, M, row_bytes, cb);
                const int g = s % 8, hr = s / 8;
                for (int h = 0; h < 2; ++h)
                    for (int kind = 0; kind < 3; ++kind)
                        for (int tl = 0; tl < 4; ++tl)
                            for (int u = 0; u < 2; ++u)
                                for (int i = 0; i < 4; ++i) {
                                    const int l = 16 * u + 4 * tl + i;
                                    const int b = kind < 2 ? 64 * h + 32 * kind + l : 128 + 32 * h + l;
                                    const int at = ((3 * h + kind) * 32 + 4 * g + tl) * 16 + 4 * (2 * hr + u) + i;
                                    placed = placed && piece[at] == plain[b];
                                }
                for (int j = 0; j < 16; ++j) placed = placed && piece[3072 + 16 * s + j] == plain[192 + j];
                placed = placed && piece[3328 + 2 * s] == plain[208] && piece[3329 + 2 * s] == plain[209];
            }
        CHECK(placed);
    }
}

TEST_CASE(a_large_weight_tiles_the_same_on_several_threads) {
    // 4101 rows of 16 Q8_0 chunks (17.8 MB: the threaded path, split on tile boundaries; a partial
    // last tile): back to the source bytes, and every chunk where chunk_offset says
    const int64_t cb = 272, row_bytes = 16 * cb, M = 4101;
    const std::vector<uint8_t> src = random_bytes(size_t(M * row_bytes), 9);
    std::vector<uint8_t> t(src.size()), back(src.size());
    tiles::to_tiles(src.data(), t.data(), M, row_bytes, cb);
    tiles::from_tiles(t.data(), back.data(), M, row_bytes, cb);
    CHECK(back == src);
    bool placed = true;
    for (int64_t row = 0; row < M; row += 97)
        for (int64_t c = 0; c < 16; c += 5)
            placed = placed && std::equal(src.begin() + row * row_bytes + c * cb, src.begin() + row * row_bytes + (c + 1) * cb,
                                          t.begin() + tiles::chunk_offset(row, c, M, row_bytes, cb));
    CHECK(placed);
}

TEST_CASE(whole_tiles_tile_alone) {
    // rows [0, 32) and [32, 45) tiled alone are the 45 rows tiled together (a stack of two members)
    const int64_t cb = 272, row_bytes = 2 * cb;
    const std::vector<uint8_t> src = random_bytes(size_t(45 * row_bytes), 5);
    std::vector<uint8_t> all(src.size()), parts(src.size());
    tiles::to_tiles(src.data(), all.data(), 45, row_bytes, cb);
    tiles::to_tiles(src.data(), parts.data(), 32, row_bytes, cb);
    tiles::to_tiles(src.data() + 32 * row_bytes, parts.data() + 32 * row_bytes, 13, row_bytes, cb);
    CHECK(all == parts);
}

TEST_CASE(the_registry_knows_tiled_ranges) {
    alignas(64) static uint8_t buffer[1 << 16];
    const int64_t row_bytes = 272;
    CHECK(tiles::find(buffer, 40, row_bytes) == tiles::lookup_result::not_tiled);
    tiles::add(buffer + 1024, 40, row_bytes);  // rows 0..39: tiles of 16, 16, 8
    CHECK(tiles::any() && tiles::count() == 1);
    using R = tiles::lookup_result;
    CHECK(tiles::find(buffer + 1024, 40, row_bytes) == R::tiled);                      // the whole weight
    CHECK(tiles::find(buffer + 1024, 16, row_bytes) == R::tiled);                      // its first tile
    CHECK(tiles::find(buffer + 1024 + 16 * row_bytes, 24, row_bytes) == R::tiled);     // the rest (to its end)
    CHECK(tiles::find(buffer + 1024 + 16 * row_bytes, 20, row_bytes) == R::misaligned);  // ends inside a tile
    CHECK(tiles::find(buffer + 1024 + row_bytes, 16, row_bytes) == R::misaligned);       // starts inside one
    CHECK(tiles::find(buffer + 1024, 41, row_bytes) == R::misaligned);                   // past its end
    CHECK(tiles::find(buffer + 1024, 20, 2 * row_bytes) == R::misaligned);               // other rows
    CHECK(tiles::find(buffer, 3, row_bytes) == R::not_tiled);                            // before it
    CHECK(tiles::find(buffer + 1024 + 40 * row_bytes, 8, row_bytes) == R::not_tiled);    // after it
    tiles::add(buffer + 30000, 16, row_bytes);
    CHECK(tiles::count() == 2);
    tiles::remove_within(buffer, 20000);  // frees the first range only
    CHECK(tiles::count() == 1);
    CHECK(tiles::find(buffer + 1024, 40, row_bytes) == R::not_tiled);
    CHECK(tiles::find(buffer + 30000, 16, row_bytes) == R::tiled);
    tiles::remove_within(buffer, sizeof buffer);
    CHECK(!tiles::any());
}

int main(int argc, char ** argv) { return lucebox_test::run_all(argc > 1 ? argv[1] : nullptr); }
