// ggml_top_k as lucebox relies on it (draft top-k of a DDTree step, sampling candidates): for every
// row the k indices of the k largest values, in any order. Checked against a sort on the CPU
// backend, and on a GPU backend when the build and machine have one (our ggml patch 0002 runs the
// CUDA op for all rows at once through a radix select; wide rows, several rows, k up to 128).
// And ggml_argmax (greedy decoding's token): the GPU's index equals the CPU's, ties included (patch
// 0006: rows longer than 8192 over several blocks, ties to the last column as on the CPU).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "check.h"
#include "gpu_backend.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

// rows x cols distinct values (a shuffled ramp, so the top k is unique), some of them negative.
std::vector<float> distinct_rows(int64_t cols, int64_t rows, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> v(size_t(cols * rows));
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = float(c) * 0.25f - float(cols) * 0.1f;
        std::shuffle(row.begin(), row.end(), rng);
        std::copy(row.begin(), row.end(), v.begin() + r * cols);
    }
    return v;
}

// out = op(ctx, in) of an F32 [cols, rows] input on `backend` (null: CPU): its I32 elements.
template <typename Op>
std::vector<int32_t> run_index_op(const std::vector<float> & x, int64_t cols, int64_t rows, ggml_backend_t backend, Op op) {
    ggml_init_params ip{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * in = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, rows);
    ggml_tensor * out = op(ctx, in);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_t cpu = backend == nullptr ? ggml_backend_cpu_init() : nullptr;
    ggml_backend_t be = backend != nullptr ? backend : cpu;
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_tensor_set(in, x.data(), 0, x.size() * sizeof(float));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<int32_t> res(static_cast<size_t>(ggml_nelements(out)));
    ggml_backend_tensor_get(out, res.data(), 0, res.size() * sizeof(int32_t));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    if (cpu != nullptr) ggml_backend_free(cpu);
    return res;
}

// ggml_top_k on `backend` (null: CPU): [k, rows] indices, each row sorted ascending for comparison.
std::vector<int32_t> run_top_k(const std::vector<float> & x, int64_t cols, int64_t rows, int k, ggml_backend_t backend) {
    std::vector<int32_t> res =
        run_index_op(x, cols, rows, backend, [k](ggml_context * ctx, ggml_tensor * in) { return ggml_top_k(ctx, in, k); });
    for (int64_t r = 0; r < rows; ++r) std::sort(res.begin() + r * k, res.begin() + (r + 1) * k);
    return res;
}

std::vector<int32_t> reference(const std::vector<float> & x, int64_t cols, int64_t rows, int k) {
    std::vector<int32_t> res;
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> idx(static_cast<size_t>(cols));
        std::iota(idx.begin(), idx.end(), 0);
        const float * row = x.data() + r * cols;
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        std::sort(idx.begin(), idx.begin() + k);
        res.insert(res.end(), idx.begin(), idx.begin() + k);
    }
    return res;
}

struct shape {
    int64_t cols, rows;
    int k;
};
const std::vector<shape> SHAPES{{1000, 3, 8}, {5000, 1, 64}, {5000, 15, 8}, {151936, 16, 64}, {248320, 15, 8},
                                {248320, 16, 128}, {248320, 1, 96}, {300000, 2, 40}};

// ggml_argmax on `backend` (null: CPU): one index per row.
std::vector<int32_t> run_argmax(const std::vector<float> & x, int64_t cols, int64_t rows, ggml_backend_t backend) {
    return run_index_op(x, cols, rows, backend, [](ggml_context * ctx, ggml_tensor * in) { return ggml_argmax(ctx, in); });
}

// distinct_rows with, in rows wider than 8192, the maximum planted again before and after it.
std::vector<float> rows_with_tied_maxima(int64_t cols, int64_t rows, uint32_t seed) {
    std::vector<float> x = distinct_rows(cols, rows, seed);
    if (cols <= 8192) return x;
    for (int64_t r = 0; r < rows; ++r) {
        float * row = x.data() + r * cols;
        const int64_t at = std::max_element(row, row + cols) - row;
        row[(at + cols / 3) % cols] = row[at];
        row[(at + 2 * cols / 3 + r) % cols] = row[at];
    }
    return x;
}

const std::vector<std::pair<int64_t, int64_t>> ARGMAX_SHAPES{{100, 3}, {8192, 2}, {8193, 1}, {248320, 1},
                                                             {248320, 16}, {300001, 2}};

}  // namespace

TEST_CASE(argmax_cpu_takes_the_last_of_tied_maxima) {
    std::vector<float> x(20000, 0.0f);
    x[5] = x[700] = x[19000] = 3.0f;
    CHECK(run_argmax(x, 20000, 1, nullptr) == std::vector<int32_t>{19000});
}

TEST_CASE(argmax_gpu_matches_cpu) {
    ggml_backend_t be = lucebox_test::first_gpu_backend("argmax_gpu_matches_cpu");
    if (be == nullptr) {
        return;
    }
    for (const auto & [cols, rows] : ARGMAX_SHAPES) {
        const std::vector<float> x = rows_with_tied_maxima(cols, rows, uint32_t(cols + rows));
        const bool ok = run_argmax(x, cols, rows, be) == run_argmax(x, cols, rows, nullptr);
        if (!ok) std::fprintf(stderr, "  cols %lld rows %lld: GPU argmax differs\n", (long long) cols, (long long) rows);
        CHECK(ok);
    }
    ggml_backend_free(be);
}

TEST_CASE(cpu_matches_sort) {
    for (const shape & s : SHAPES) {
        const std::vector<float> x = distinct_rows(s.cols, s.rows, uint32_t(s.cols + s.k));
        CHECK(run_top_k(x, s.cols, s.rows, s.k, nullptr) == reference(x, s.cols, s.rows, s.k));
    }
}

TEST_CASE(gpu_matches_sort) {
    ggml_backend_t be = lucebox_test::first_gpu_backend("gpu_matches_sort");
    if (be == nullptr) {
        return;
    }
    for (const shape & s : SHAPES) {
        const std::vector<float> x = distinct_rows(s.cols, s.rows, uint32_t(s.cols + s.k));
        const bool ok = run_top_k(x, s.cols, s.rows, s.k, be) == reference(x, s.cols, s.rows, s.k);
        if (!ok) std::fprintf(stderr, "  cols %lld rows %lld k %d: GPU top-k differs\n", (long long) s.cols, (long long) s.rows, s.k);
        CHECK(ok);
    }
    ggml_backend_free(be);
}

int main(int argc, char ** argv) { return lucebox_test::run_all(argc > 1 ? argv[1] : nullptr); }
