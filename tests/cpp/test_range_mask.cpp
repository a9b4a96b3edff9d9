// The range mask op (cpp/kernels/range_mask.h): `fill` against the definition (clipping, empty
// ranges, a tree's paths after the context), the graph node on the CPU backend (rows split over
// threads) and on lucebox's CUDA kernel (patch 0007's hook; checks nothing without a GPU) the same
// bits as `fill`, chains and trees, at key counts that are and are not multiples of 8, and the
// builder's refusals.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "cuda_kernels.h"
#include "gpu_backend.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "lucebox/errors.h"
#include "range_mask.h"

using namespace lucebox;
namespace rm = lucebox::kernels::range_mask;

namespace {

// ranges of T rows over n_kv keys: chain-like, windows, empty, reversed and out-of-range ones
std::vector<int32_t> random_ranges(int64_t T, int64_t n_kv, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> any(-5, int32_t(n_kv) + 5);
    std::vector<int32_t> r(2 * T);
    for (int64_t t = 0; t < T; ++t) {
        switch (t % 4) {
            case 0: r[2 * t] = 0, r[2 * t + 1] = int32_t(std::min<int64_t>(n_kv, t + 1)); break;  // causal
            case 1: r[2 * t] = any(rng), r[2 * t + 1] = any(rng); break;  // anything, reversed included
            case 2: r[2 * t] = r[2 * t + 1] = int32_t(n_kv / 2); break;   // empty
            default: r[2 * t] = int32_t(n_kv / 3), r[2 * t + 1] = int32_t(n_kv + 100); break;  // clipped
        }
    }
    return r;
}

// a random tree of T nodes in batch order (parents[0] = -1, parents[t] < t)
std::vector<int32_t> random_tree(int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(T, -1);
    for (int64_t t = 1; t < T; ++t) p[t] = int32_t(rng() % uint32_t(t));
    return p;
}

std::vector<uint16_t> run_node(ggml_backend_t be, const std::vector<int32_t> & ranges, int64_t n_kv,
                               const std::vector<int32_t> * parents = nullptr) {
    const int64_t T = int64_t(ranges.size() / 2);
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true});
    ggml_tensor * in = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, T);
    ggml_tensor * par = parents != nullptr ? ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T) : nullptr;
    ggml_tensor * mask = rm::build(ctx, in, n_kv, par);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, mask);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_tensor_set(in, ranges.data(), 0, ggml_nbytes(in));
    if (par != nullptr) ggml_backend_tensor_set(par, parents->data(), 0, ggml_nbytes(par));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<uint16_t> out(size_t(n_kv) * T);
    ggml_backend_tensor_get(mask, out.data(), 0, ggml_nbytes(mask));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return out;
}

std::vector<uint16_t> filled(const std::vector<int32_t> & ranges, int64_t n_kv, const std::vector<int32_t> * parents = nullptr) {
    const int64_t T = int64_t(ranges.size() / 2);
    std::vector<ggml_fp16_t> m(size_t(n_kv) * T);
    rm::fill(ranges.data(), n_kv, 0, T, m.data(), T, parents != nullptr ? parents->data() : nullptr);
    std::vector<uint16_t> out(m.size());
    std::memcpy(out.data(), m.data(), m.size() * 2);
    return out;
}

}  // namespace

TEST_CASE(fill_is_the_definition) {
    const int64_t n_kv = 37;
    const std::vector<int32_t> ranges = random_ranges(24, n_kv, 1);
    const std::vector<uint16_t> m = filled(ranges, n_kv);
    const uint16_t zero = ggml_fp32_to_fp16(0.0f), hidden = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t t = 0; t < 24; ++t) {
        const int64_t lo = std::max<int64_t>(0, ranges[2 * t]), hi = std::min<int64_t>(n_kv, ranges[2 * t + 1]);
        for (int64_t k = 0; k < n_kv; ++k) CHECK(m[t * n_kv + k] == (k >= lo && k < hi ? zero : hidden));
    }
    CHECK(ggml_fp16_to_fp32(hidden) == -INFINITY);
}

// a tree's rows: the context range, then exactly the node's path (walked here from the parents)
TEST_CASE(fill_of_a_tree_is_context_then_path) {
    const int64_t T = 20, n_past = 9, n_kv = 40;
    const std::vector<int32_t> parents = random_tree(T, 3);
    std::vector<int32_t> ranges(2 * T);
    for (int64_t t = 0; t < T; ++t) ranges[2 * t] = 0, ranges[2 * t + 1] = int32_t(n_past);
    const std::vector<uint16_t> m = filled(ranges, n_kv, &parents);
    const uint16_t zero = ggml_fp32_to_fp16(0.0f);
    for (int64_t t = 0; t < T; ++t) {
        std::vector<bool> path(T, false);
        for (int64_t j = t; j >= 0; j = parents[j]) path[j] = true;
        for (int64_t k = 0; k < n_kv; ++k) {
            const bool visible = k < n_past || (k - n_past < T && path[k - n_past]);
            CHECK((m[t * n_kv + k] == zero) == visible);
        }
    }
    CHECK(rm::on_path(parents.data(), T, 5, 0) && !rm::on_path(parents.data(), T, 0, 5));
}

TEST_CASE(cpu_node_equals_fill) {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    for (int threads : {1, 3}) {
        ggml_backend_cpu_set_n_threads(cpu, threads);
        for (const auto & [T, n_kv] : {std::pair<int64_t, int64_t>{1, 256}, {16, 4096}, {7, 1001}, {65, 300}}) {
            const std::vector<int32_t> r = random_ranges(T, n_kv, uint32_t(T + n_kv));
            CHECK(run_node(cpu, r, n_kv) == filled(r, n_kv));
            const std::vector<int32_t> tree = random_tree(T, uint32_t(T));
            CHECK(run_node(cpu, r, n_kv, &tree) == filled(r, n_kv, &tree));
        }
    }
    ggml_backend_free(cpu);
}

TEST_CASE(builder_refusals) {
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 8, nullptr, true});
    CHECK_THROWS(rm::build(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2, 4), 16), error, "I32 ranges");
    CHECK_THROWS(rm::build(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 3, 4), 16), error, "I32 ranges");
    CHECK_THROWS(rm::build(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 4), 0), error, "n_kv > 0");
    ggml_tensor * node = rm::build(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 4), 16);
    CHECK(rm::is_range_mask(node) && node->type == GGML_TYPE_F16 && node->ne[0] == 16 && node->ne[1] == 4);
    CHECK(!rm::is_range_mask(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 16, 4)));
    CHECK_THROWS(rm::build(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 4), 16, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 5)),
                 error, "parents as I32 [T]");
    ggml_free(ctx);
}

// lucebox's CUDA kernel (patch 0007's hook) writes fill's bits, rows of whole 16-byte vectors or not
TEST_CASE(gpu_node_equals_fill) {
    ggml_backend_t gpu = lucebox_test::first_gpu_backend("range_mask gpu_node_equals_fill");
    if (gpu == nullptr) return;
    kernels::install_cuda_kernels();
    for (const auto & [T, n_kv] : {std::pair<int64_t, int64_t>{1, 256}, {16, 32768}, {7, 1001}, {512, 4096}, {3, 5}}) {
        const std::vector<int32_t> r = random_ranges(T, n_kv, uint32_t(3 * T + n_kv));
        const uint64_t before = kernels::range_mask_runs();
        CHECK(run_node(gpu, r, n_kv) == filled(r, n_kv));
        CHECK(kernels::range_mask_runs() == before + 1);  // lucebox's kernel ran it
        const std::vector<int32_t> tree = random_tree(T, uint32_t(T + 1));
        CHECK(run_node(gpu, r, n_kv, &tree) == filled(r, n_kv, &tree));
    }
    ggml_backend_free(gpu);
}

TEST_MAIN()
