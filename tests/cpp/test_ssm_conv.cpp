// graph::ssm_conv (src/graph/builders.h), the DeltaNet conv of every width: against the definition (a
// causal depthwise conv summed in double) for widths 2..15, token counts 1..9 and two sequences, on the
// CPU as it is and padded with zero taps to the next width of ggml's CUDA kernels (shape, tap alignment
// and the sums checked where a CPU runs them), and padded on the GPU backend, where ggml's CUDA conv
// has no kernel for most of these widths unpadded (checks nothing without a GPU).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "check.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gpu_backend.h"
#include "graph/builders.h"

using namespace lucebox;

namespace {

constexpr int64_t CHANNELS = 96;

struct conv_case {
    int64_t width, T, S;
    std::vector<float> x;  // [width-1+T, CHANNELS, S]
    std::vector<float> w;  // [width, CHANNELS]
};

conv_case random_case(int64_t width, int64_t T, int64_t S, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    conv_case c{width, T, S, std::vector<float>(size_t((width - 1 + T) * CHANNELS * S)),
                std::vector<float>(size_t(width * CHANNELS))};
    for (float & v : c.x) v = nd(rng);
    for (float & v : c.w) v = nd(rng);
    return c;
}

// out[s][t][ch] = sum_k x[s][ch][t + k] * w[ch][k], in double: [CHANNELS, T, S]
std::vector<double> reference(const conv_case & c) {
    const int64_t n = c.width - 1 + c.T;
    std::vector<double> out(size_t(CHANNELS * c.T * c.S));
    for (int64_t s = 0; s < c.S; ++s)
        for (int64_t t = 0; t < c.T; ++t)
            for (int64_t ch = 0; ch < CHANNELS; ++ch) {
                double sum = 0;
                for (int64_t k = 0; k < c.width; ++k)
                    sum += double(c.x[size_t((s * CHANNELS + ch) * n + t + k)]) * double(c.w[size_t(ch * c.width + k)]);
                out[size_t((s * c.T + t) * CHANNELS + ch)] = sum;
            }
    return out;
}

std::vector<float> run(ggml_backend_t be, const conv_case & c, bool pad) {
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true});
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.width - 1 + c.T, CHANNELS, c.S);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.width, CHANNELS);
    ggml_tensor * y = graph::ssm_conv(ctx, x, w, pad);
    CHECK(y->ne[0] == CHANNELS && y->ne[1] == c.T && y->ne[2] == c.S);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_tensor_set(x, c.x.data(), 0, ggml_nbytes(x));
    ggml_backend_tensor_set(w, c.w.data(), 0, ggml_nbytes(w));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<float> out(size_t(ggml_nelements(y)));
    ggml_backend_tensor_get(y, out.data(), 0, ggml_nbytes(y));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return out;
}

// F32 sums of <= 15 products of unit normals: within 1e-5 of the double sums (a tap off by one is off
// by the products themselves, ~1)
bool close(const std::vector<float> & got, const std::vector<double> & want) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(double(got[i]) - want[i]) <= 1e-5 * (1 + std::fabs(want[i])))) return false;
    return true;
}

void check_widths(ggml_backend_t be, bool pad) {
    for (int64_t width = 2; width <= 15; ++width)
        for (const int64_t T : {1, 4, 9}) {
            const conv_case c = random_case(width, T, 2, uint32_t(width * 16 + T));
            const std::vector<float> got = run(be, c, pad);
            const bool ok = close(got, reference(c));
            CHECK(ok);
            if (!ok) std::printf("  width %lld, T %lld, pad %d: not the reference\n", (long long) width, (long long) T, pad);
        }
}

}  // namespace

TEST_CASE(cpu_every_width) {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    check_widths(cpu, false);
    check_widths(cpu, true);
    ggml_backend_free(cpu);
}

TEST_CASE(gpu_every_width_padded) {
    ggml_backend_t gpu = lucebox_test::first_gpu_backend("ssm_conv gpu_every_width_padded");
    if (gpu == nullptr) return;
    check_widths(gpu, true);
    ggml_backend_free(gpu);
}

TEST_MAIN()
