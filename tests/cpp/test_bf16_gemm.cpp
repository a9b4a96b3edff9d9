// The BF16 GEMM route of large quantized products (ggml patch 0004 with lucebox's converter,
// cpp/kernels/): a MUL_MAT of Q8_0 / Q4_K / Q6_K weights (lucebox's converter) and Q5_K weights
// (ggml's converter) with 300 activation columns on the GPU backend, with the route on and off
// (MMQ), against a double-precision reference over the CPU-dequantized weights. One case has more
// than 2^26 weight values, so the route converts and multiplies it in two row chunks (patch 0004:
// equal chunks rounded up to 256 rows, 8448 then 7952); rows around the chunk boundary are among
// those checked. Bound: the route rounds
// weights and activations to BF16 (relative 2^-9 each), so |y - ref| <= 2^-7 * sum_k |w x| + 1e-6;
// MMQ's bound is its q8_1 activation rounding, |y - ref| <= 2^-5 * sum_k |w x|. The two routes must
// also give different bits (the route was taken). Without a GPU it checks nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "check.h"
#include "cuda_kernels.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gpu_backend.h"

namespace {

std::vector<float> product_on(ggml_backend_t be, ggml_type type, const std::vector<uint8_t> & wq, int64_t K, int64_t M,
                              const std::vector<float> & x, int64_t N) {
    ggml_init_params ip{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, type, K, M);
    ggml_tensor * in = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    ggml_tensor * out = ggml_mul_mat(ctx, w, in);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    CHECK(buf != nullptr);
    ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
    ggml_backend_tensor_set(in, x.data(), 0, x.size() * sizeof(float));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<float> y(size_t(M * N));
    ggml_backend_tensor_get(out, y.data(), 0, y.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return y;
}

void check_type(ggml_backend_t be, ggml_type type, int64_t K, int64_t M, uint32_t seed) {
    const int64_t N = 300;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> wf(size_t(K * M)), x(size_t(K * N));
    for (auto & v : wf) v = nd(rng);
    for (auto & v : x) v = nd(rng);
    std::vector<uint8_t> wq(ggml_row_size(type, K) * M);
    ggml_quantize_chunk(type, wf.data(), wq.data(), 0, M, K, nullptr);
    std::vector<float> wd(size_t(K * M));  // what the weights are
    ggml_get_type_traits(type)->to_float(wq.data(), wd.data(), K * M);

    lucebox::kernels::set_bf16_gemm_min_cols(65);
    const std::vector<float> route = product_on(be, type, wq, K, M, x, N);
    lucebox::kernels::set_bf16_gemm_min_cols(0);
    const std::vector<float> mmq = product_on(be, type, wq, K, M, x, N);
    lucebox::kernels::set_cuda_kernels_enabled(true);  // back to the default threshold

    std::vector<int64_t> rows;  // a spread of rows, and those around the 2^26-value chunk boundary
    for (int64_t m = 0; m < M; m += 37) rows.push_back(m);
    // patch 0004's chunking: ceil(M * K / 2^26) chunks of ceil(M / chunks) rows rounded up to 256
    const int64_t chunks = (M * K + (int64_t(1) << 26) - 1) >> 26;
    const int64_t boundary = std::min<int64_t>(M, ((M + chunks - 1) / chunks + 255) / 256 * 256);
    for (int64_t m = boundary - 2; m <= boundary + 1; ++m)
        if (m > 0 && m < M) rows.push_back(m);
    rows.push_back(M - 1);
    double worst_route = 0, worst_mmq = 0;
    for (int64_t m : rows)
        for (int64_t n = 0; n < N; n += 7) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
                const double t = double(wd[size_t(m * K + k)]) * double(x[size_t(n * K + k)]);
                ref += t;
                mag += std::fabs(t);
            }
            const size_t at = size_t(n * M + m);
            worst_route = std::max(worst_route, std::fabs(route[at] - ref) / (mag * 0x1p-7 + 1e-6));
            worst_mmq = std::max(worst_mmq, std::fabs(mmq[at] - ref) / (mag * 0x1p-5 + 1e-6));
        }
    const bool differ = route != mmq;
    std::printf("  %s K=%lld M=%lld N=%lld: route worst %.3f of its bound, MMQ %.3f of its bound, routes %s\n",
                ggml_type_name(type), (long long) K, (long long) M, (long long) N, worst_route, worst_mmq,
                differ ? "differ" : "IDENTICAL");
    CHECK(worst_route <= 1.0);
    CHECK(worst_mmq <= 1.0);
    CHECK(differ);
}

}  // namespace

TEST_CASE(bf16_gemm_route_matches_reference) {
    ggml_backend_t be = lucebox_test::first_gpu_backend("bf16_gemm_route_matches_reference");
    if (be == nullptr) return;
    lucebox::kernels::install_cuda_kernels();
    for (ggml_type t : {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_K}) check_type(be, t, 512, 333, 3);
    check_type(be, GGML_TYPE_Q8_0, 4096, 16400, 5);  // 67.2M values: two row chunks
    check_type(be, GGML_TYPE_Q4_K, 4096, 16400, 6);
    ggml_backend_free(be);
}

int main(int argc, char ** argv) { return lucebox_test::run_all(argc > 1 ? argv[1] : nullptr); }
