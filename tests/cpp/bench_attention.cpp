// The fused gated attention op (cpp/kernels/attention_step.h) against what the model runs
// (ggml's flash attention, then the gate's cont, sigmoid and product), on the first GPU backend, for
// the 27B's attention shape (heads of 256, 24 query heads on 4 KV heads, F16 caches, a causal mask):
// LAYERS layers' own caches in one graph, as a step has 16. Prints us a layer, the minimum and the
// median over the repetitions of one synchronous graph compute each (ggml's host work included, as
// in a model step), and ggml / op; the outputs' max |diff| as a sanity check. The model takes the op
// only where this shows it faster (nowhere, so far). Not a test (not registered with CTest).
// Usage: bench_attention [repetitions, default 20]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attention_step.h"
#include "cuda_kernels.h"
#include "gpu_backend.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

namespace at = lucebox::kernels::attention;

namespace {

constexpr int64_t HD = 256, H = 24, HKV = 4, LAYERS = 16;

struct timing {
    double min_us = 0.0, median_us = 0.0;  // a layer
    std::vector<float> out0;               // layer 0's output
};

// One graph of LAYERS layers' attention for T tokens over n_kv rows, fused or ggml's.
timing run(ggml_backend_t be, int64_t T, int64_t n_kv, bool fused, int reps, const std::vector<ggml_fp16_t> & kv_data,
           const std::vector<float> & qg_data) {
    ggml_init_params ip{ggml_tensor_overhead() * (16 * LAYERS + 16) + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    const size_t es = sizeof(float);
    ggml_tensor * qg = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2 * HD * H, T);  // [T][H][query, gate]
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, T);
    ggml_tensor * q = ggml_cont_3d(ctx, ggml_view_3d(ctx, qg, HD, H, T, 2 * HD * es, qg->nb[1], 0), HD, H, T);
    ggml_tensor * gate = ggml_view_3d(ctx, qg, HD, H, T, 2 * HD * es, qg->nb[1], HD * es);
    std::vector<ggml_tensor *> caches, outs;
    ggml_cgraph * gf = ggml_new_graph(ctx);
    for (int64_t l = 0; l < LAYERS; ++l) {
        ggml_tensor * kc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, HD * HKV, n_kv);
        ggml_tensor * vc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, HD * HKV, n_kv);
        caches.push_back(kc);
        caches.push_back(vc);
        ggml_tensor * out = fused ? at::gated(ctx, q, kc, vc, n_kv, mask, gate, 0.0625f)
                                  : at::unfused(ctx, q, kc, vc, n_kv, mask, gate, 0.0625f);
        outs.push_back(out);
        ggml_build_forward_expand(gf, out);
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    if (buf == nullptr) {
        std::fprintf(stderr, "bench_attention: out of device memory (T %lld, n_kv %lld)\n", (long long) T, (long long) n_kv);
        std::exit(1);
    }
    ggml_backend_tensor_set(qg, qg_data.data(), 0, ggml_nbytes(qg));
    for (ggml_tensor * c : caches) ggml_backend_tensor_set(c, kv_data.data(), 0, ggml_nbytes(c));
    {  // causal: token t sees keys <= n_kv - T + t
        std::vector<ggml_fp16_t> m(size_t(T * n_kv));
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < n_kv; ++j) m[t * n_kv + j] = ggml_fp32_to_fp16(j <= n_kv - T + t ? 0.0f : -INFINITY);
        ggml_backend_tensor_set(mask, m.data(), 0, ggml_nbytes(mask));
    }
    for (int w = 0; w < 3; ++w) ggml_backend_graph_compute(be, gf);  // warm-up (and ggml's CUDA graph)
    std::vector<double> us(reps);
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
            std::fprintf(stderr, "bench_attention: graph compute failed\n");
            std::exit(1);
        }
        const auto t1 = std::chrono::steady_clock::now();
        us[r] = std::chrono::duration<double, std::micro>(t1 - t0).count() / LAYERS;
    }
    std::sort(us.begin(), us.end());
    timing t;
    t.min_us = us.front();
    t.median_us = us[us.size() / 2];
    t.out0.resize(size_t(T * H * HD));
    ggml_backend_tensor_get(outs[0], t.out0.data(), 0, t.out0.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return t;
}

}  // namespace

int main(int argc, char ** argv) {
    const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
    ggml_backend_t gpu = lucebox_test::first_gpu_backend("bench_attention");
    if (gpu == nullptr) return 0;
    lucebox::kernels::install_cuda_kernels();
    const int64_t max_kv = 8192, max_t = 64;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<ggml_fp16_t> kv(size_t(max_kv * HD * HKV));
    for (auto & x : kv) x = ggml_fp32_to_fp16(nd(rng));
    std::vector<float> qg(size_t(max_t * H * 2 * HD));
    for (auto & x : qg) x = nd(rng);
    std::printf("%4s %6s %14s %14s %8s %10s\n", "T", "n_kv", "op us min/med", "ggml us min/med", "ggml/op", "max|diff|");
    for (int64_t T : {1, 2, 4, 8, 16, 32, 64})
        for (int64_t n_kv : {256, 512, 1024, 2048, 4096, 8192}) {
            const timing f = run(gpu, T, n_kv, true, reps, kv, qg);
            const timing g = run(gpu, T, n_kv, false, reps, kv, qg);
            double d = 0.0;
            for (size_t i = 0; i < f.out0.size(); ++i) d = std::max(d, double(std::fabs(f.out0[i] - g.out0[i])));
            std::printf("%4lld %6lld %6.1f/%6.1f %6.1f/%6.1f %7.2fx %10.3g\n", (long long) T, (long long) n_kv, f.min_us,
                        f.median_us, g.min_us, g.median_us, g.min_us / f.min_us, d);
            std::fflush(stdout);
        }
    ggml_backend_free(gpu);
    return 0;
}
