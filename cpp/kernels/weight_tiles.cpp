// Row-tiled weights (weight_tiles.h): the host-side reorder and the registry of tiled ranges.
#include "weight_tiles.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace lucebox::kernels::tiles {

namespace {

// Row `row`'s chunk c (ggml's cb bytes at `plain`) to (into_tiles) or from its place in the tiled
// weight: cb contiguous bytes at chunk_offset, or (Q6_K) bytes spread over its piece in fragment
// order, in runs of 4 (q6k_piece_offset keeps b % 4; d's 2 bytes stay together).
void move_chunk(const uint8_t * src, uint8_t * dst, int64_t row, int64_t c, int64_t M, int64_t row_bytes, int64_t cb,
                bool into_tiles) {
    const int64_t plain = row * row_bytes + c * cb, tiled = chunk_offset(row, c, M, row_bytes, cb);
    auto move = [&](int64_t plain_at, int64_t tiled_at, int64_t n) {
        if (into_tiles) std::memcpy(dst + tiled_at, src + plain_at, size_t(n));
        else std::memcpy(dst + plain_at, src + tiled_at, size_t(n));
    };
    const int s = int(row % TILE_ROWS);
    if (cb != Q6K_CHUNK_BYTES || M - (row - s) < TILE_ROWS) {  // (a partial Q6_K tile, which no kernel reads: plain)
        move(plain, tiled, cb);
        return;
    }
    const int64_t piece = tiled - s * cb;
    for (int b = 0; b < 208; b += 4) move(plain + b, piece + q6k_piece_offset(s, b), 4);
    move(plain + 208, piece + q6k_piece_offset(s, 208), 2);
}

}  // namespace

void to_tiles(const uint8_t * src, uint8_t * dst, int64_t M, int64_t row_bytes, int64_t cb) {
    const int64_t chunks = row_bytes / cb;
    auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row)
            for (int64_t c = 0; c < chunks; ++c) move_chunk(src, dst, row, c, M, row_bytes, cb, true);
    };
    // a model load reorders every weight (5 GB/s on one core): large batches on several threads,
    // each taking whole tiles (disjoint bytes)
    const int64_t tiles_n = (M + TILE_ROWS - 1) / TILE_ROWS;
    const int threads = int(std::min<int64_t>({int64_t(std::max(1u, std::thread::hardware_concurrency())), 8,
                                               M * row_bytes / (int64_t(8) << 20), tiles_n}));
    if (threads <= 1) {
        rows(0, M);
        return;
    }
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        const int64_t first = tiles_n * t / threads * TILE_ROWS, last = std::min(M, tiles_n * (t + 1) / threads * TILE_ROWS);
        pool.emplace_back(rows, first, last);
    }
    for (std::thread & th : pool) th.join();
}

void from_tiles(const uint8_t * src, uint8_t * dst, int64_t M, int64_t row_bytes, int64_t cb) {
    const int64_t chunks = row_bytes / cb;
    for (int64_t row = 0; row < M; ++row)
        for (int64_t c = 0; c < chunks; ++c) move_chunk(src, dst, row, c, M, row_bytes, cb, false);
}

namespace {

std::mutex g_mutex;
std::map<const uint8_t *, range> g_ranges;  // by begin
std::atomic<size_t> g_count{0};

}  // namespace

void add(const void * begin, int64_t M, int64_t row_bytes) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto * b = static_cast<const uint8_t *>(begin);
    g_ranges[b] = range{b, M, row_bytes};
    g_count.store(g_ranges.size());
}

void remove_within(const void * begin, size_t bytes) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto * b = static_cast<const uint8_t *>(begin);
    for (auto it = g_ranges.lower_bound(b); it != g_ranges.end() && it->first < b + bytes;) it = g_ranges.erase(it);
    g_count.store(g_ranges.size());
}

bool any() { return g_count.load(std::memory_order_relaxed) != 0; }
size_t count() { return g_count.load(); }

lookup_result find(const void * data, int64_t M, int64_t row_bytes) {
    if (!any()) return lookup_result::not_tiled;
    const auto * p = static_cast<const uint8_t *>(data);
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_ranges.upper_bound(p);
    if (it == g_ranges.begin()) return lookup_result::not_tiled;
    --it;
    const range & r = it->second;
    const int64_t offset = p - r.begin;
    if (offset >= r.M * r.row_bytes) return lookup_result::not_tiled;
    const int64_t tile_bytes = TILE_ROWS * r.row_bytes;
    const int64_t first = offset / r.row_bytes, end = first + M;
    const bool ok = row_bytes == r.row_bytes && offset % tile_bytes == 0 && end <= r.M &&
                    (end % TILE_ROWS == 0 || end == r.M);
    return ok ? lookup_result::tiled : lookup_result::misaligned;
}

}  // namespace lucebox::kernels::tiles
