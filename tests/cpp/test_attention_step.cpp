// The fused gated attention op (cpp/kernels/attention_step.h): on the CPU backend against ggml's own
// graph of the same layer (flash attention over the cache's first n_kv rows, the gate's cont, its
// sigmoid and the product), with causal, tree-like and chunk-hiding masks, one and several of the
// CUDA kernels' chunks (attention_split.h), heads of 128 and 256, 1..8 query heads a KV head; a
// token's result the same bits whatever T on the CPU, and on CUDA whatever T >= 2 (within 1e-2 of
// the decode step's); lucebox's CUDA kernels against the CPU op (checks nothing without a GPU); the
// builder's refusals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention_step.h"
#include "check.h"
#include "cuda_kernels.h"
#include "gpu_backend.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "lucebox/errors.h"

using namespace lucebox;
namespace at = lucebox::kernels::attention;

namespace {

struct problem {
    int64_t hd = 128, H = 4, Hkv = 2, T = 1, n_kv = 1, n_ctx = 1;
    float scale = 0.0f;
    std::vector<float> qg;                    // [T][H][2 hd]: each head's query, then its gate (the projection)
    std::vector<ggml_fp16_t> k, v;            // [n_ctx][Hkv hd]; rows >= n_kv are NaN (never read)
    std::vector<ggml_fp16_t> mask;            // [T][n_kv]
};

// mask_kind 0: causal (token t sees keys <= n_kv - T + t); 1: random visible keys (a tree's
// ancestors; key 0 always visible); 2: causal with keys 64..127 hidden from every token (a
// chunk of the CUDA kernels with nothing to see).
problem random_problem(int64_t hd, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv, int mask_kind, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    problem p;
    p.hd = hd, p.H = H, p.Hkv = Hkv, p.T = T, p.n_kv = n_kv, p.n_ctx = n_kv + 5;
    p.scale = 1.0f / std::sqrt(float(hd));
    p.qg.resize(T * H * 2 * hd);
    for (float & e : p.qg) e = nd(rng);
    p.k.resize(p.n_ctx * Hkv * hd);
    p.v.resize(p.n_ctx * Hkv * hd);
    for (int64_t i = 0; i < p.n_ctx * Hkv * hd; ++i) {
        const bool past = i / (Hkv * hd) >= n_kv;
        p.k[i] = ggml_fp32_to_fp16(past ? NAN : nd(rng));
        p.v[i] = ggml_fp32_to_fp16(past ? NAN : nd(rng));
    }
    p.mask.resize(T * n_kv);
    std::bernoulli_distribution seen(0.6);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < n_kv; ++j) {
            bool visible = j <= n_kv - T + t;
            if (mask_kind == 1) visible = j == 0 || seen(rng);
            if (mask_kind == 2 && j >= 64 && j < 128) visible = false;
            p.mask[t * n_kv + j] = ggml_fp32_to_fp16(visible ? 0.0f : -INFINITY);
        }
    return p;
}

// The problem on `be`, through the op (fused) or ggml's graph; returns [T][H hd].
std::vector<float> run(ggml_backend_t be, const problem & p, bool fused) {
    ggml_init_params ip{ggml_tensor_overhead() * 32 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    const size_t es = sizeof(float);
    ggml_tensor * qg = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2 * p.hd * p.H, p.T);
    ggml_tensor * kc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, p.hd * p.Hkv, p.n_ctx);
    ggml_tensor * vc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, p.hd * p.Hkv, p.n_ctx);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, p.n_kv, p.T);
    ggml_tensor * q = ggml_view_3d(ctx, qg, p.hd, p.H, p.T, 2 * p.hd * es, qg->nb[1], 0);
    ggml_tensor * gate = ggml_view_3d(ctx, qg, p.hd, p.H, p.T, 2 * p.hd * es, qg->nb[1], p.hd * es);
    q = ggml_cont_3d(ctx, q, p.hd, p.H, p.T);  // contiguous [hd, H, T], as the roped queries are
    ggml_tensor * out = fused ? at::gated(ctx, q, kc, vc, p.n_kv, mask, gate, p.scale)
                              : at::unfused(ctx, q, kc, vc, p.n_kv, mask, gate, p.scale);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_tensor_set(qg, p.qg.data(), 0, ggml_nbytes(qg));
    ggml_backend_tensor_set(kc, p.k.data(), 0, ggml_nbytes(kc));
    ggml_backend_tensor_set(vc, p.v.data(), 0, ggml_nbytes(vc));
    ggml_backend_tensor_set(mask, p.mask.data(), 0, ggml_nbytes(mask));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<float> r(p.T * p.H * p.hd);
    ggml_backend_tensor_get(out, r.data(), 0, r.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(double(a[i]) - double(b[i]));
        m = std::isnan(d) ? INFINITY : std::max(m, d);
    }
    return m;
}

// Tokens t .. t + n - 1 of a T-token problem on their own (their queries, gates and mask rows).
problem tokens_of(const problem & p, int64_t t, int64_t n) {
    problem o = p;
    o.T = n;
    o.qg.assign(p.qg.begin() + t * p.H * 2 * p.hd, p.qg.begin() + (t + n) * p.H * 2 * p.hd);
    o.mask.assign(p.mask.begin() + t * p.n_kv, p.mask.begin() + (t + n) * p.n_kv);
    return o;
}
problem token_of(const problem & p, int64_t t) { return tokens_of(p, t, 1); }

// Each token of a T-token run the same bits as that token run alone.
void check_token_independent(ggml_backend_t be, const problem & p) {
    const std::vector<float> all = run(be, p, true);
    size_t differ = 0;
    for (int64_t t = 0; t < p.T; ++t) {
        const std::vector<float> one = run(be, token_of(p, t), true);
        differ += std::memcmp(one.data(), all.data() + t * p.H * p.hd, one.size() * sizeof(float)) != 0;
    }
    std::printf("  T %lld n_kv %lld: %zu tokens differ from the token alone\n", (long long) p.T, (long long) p.n_kv,
                differ);
    CHECK(differ == 0);
}

// On CUDA, where a verify (T >= 2) runs the tensor-core kernel (f16 q and P; compute capability
// >= 8.0): each token of a T-token run the same bits as in runs of 2 and 3 tokens starting at it
// (a row's result does not depend on the rows sharing its CTA), and within 1e-2 of the token alone
// (a decode step: f32 q and P).
void check_token_groupings(ggml_backend_t be, const problem & p) {
    const std::vector<float> all = run(be, p, true);
    const size_t per = size_t(p.H * p.hd);
    size_t differ = 0;
    double vs_alone = 0.0;
    for (int64_t t = 0; t < p.T; ++t) {
        for (int64_t n : {2, 3}) {
            if (t + n > p.T) continue;
            const std::vector<float> some = run(be, tokens_of(p, t, n), true);
            for (int64_t u = 0; u < n; ++u)
                differ += std::memcmp(some.data() + u * per, all.data() + (t + u) * per, per * sizeof(float)) != 0;
        }
        const std::vector<float> one = run(be, token_of(p, t), true);
        const std::vector<float> mine(all.begin() + t * per, all.begin() + (t + 1) * per);
        vs_alone = std::max(vs_alone, max_abs_diff(one, mine));
    }
    std::printf("  T %lld n_kv %lld: %zu token results of 2- and 3-token runs differ from the T-token run; "
                "vs each token alone max abs diff %.3g\n",
                (long long) p.T, (long long) p.n_kv, differ, vs_alone);
    CHECK(differ == 0);
    CHECK(vs_alone < 1e-2);
}

ggml_backend_t cpu_backend() {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    return cpu;
}

struct config {
    int64_t hd, H, Hkv, T, n_kv;
    int mask_kind;
};
const config k_configs[] = {{128, 4, 2, 1, 1, 0},     {128, 4, 2, 7, 33, 1},    {256, 24, 4, 1, 64, 0},
                            {256, 24, 4, 16, 65, 0},   {256, 24, 4, 16, 300, 2}, {128, 8, 8, 3, 130, 1},
                            {256, 8, 1, 64, 2100, 2},  {128, 16, 2, 16, 700, 1}, {256, 24, 4, 1, 4096, 0}};

void print_config(const config & c) {
    std::printf("  hd %lld H %lld Hkv %lld T %lld n_kv %lld mask %d: ", (long long) c.hd, (long long) c.H,
                (long long) c.Hkv, (long long) c.T, (long long) c.n_kv, c.mask_kind);
}

}  // namespace

TEST_CASE(cpu_op_matches_ggml_attention) {
    ggml_backend_t cpu = cpu_backend();
    uint32_t seed = 1;
    for (const config & c : k_configs) {
        const problem p = random_problem(c.hd, c.H, c.Hkv, c.T, c.n_kv, c.mask_kind, seed++);
        const uint64_t before = at::cpu_runs();
        const std::vector<float> fused = run(cpu, p, true);
        CHECK(at::cpu_runs() > before);
        const double d = max_abs_diff(fused, run(cpu, p, false));
        print_config(c);
        std::printf("op vs ggml max abs diff %.3g\n", d);
        CHECK(d < 1e-2);  // ggml's CPU flash attention rounds q and its V sums to F16
    }
    ggml_backend_free(cpu);
}

TEST_CASE(cpu_token_results_do_not_depend_on_batch) {
    ggml_backend_t cpu = cpu_backend();
    check_token_independent(cpu, random_problem(256, 24, 4, 16, 300, 1, 40));
    check_token_independent(cpu, random_problem(128, 4, 2, 5, 70, 2, 41));
    ggml_backend_free(cpu);
}

TEST_CASE(builder_refuses_what_it_does_not_take) {
    ggml_init_params ip{ggml_tensor_overhead() * 24, nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 128, 4, 2);
    ggml_tensor * gate = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 128, 4, 2);
    ggml_tensor * kc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 256, 50);
    ggml_tensor * vc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 256, 50);
    ggml_tensor * kq8 = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 256, 50);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 40, 2);
    CHECK(at::gated(ctx, q, kc, vc, 40, mask, gate, 0.1f) != nullptr);
    CHECK_THROWS(at::gated(ctx, q, kq8, vc, 40, mask, gate, 0.1f), error, "does not take");
    CHECK_THROWS(at::gated(ctx, q, kc, vc, 51, mask, gate, 0.1f), error, "n_kv");
    CHECK_THROWS(at::gated(ctx, q, kc, vc, 41, mask, gate, 0.1f), error, "mask");
    ggml_tensor * q64 = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 4, 2);
    ggml_tensor * g64 = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 4, 2);
    CHECK_THROWS(at::gated(ctx, q64, kc, vc, 40, mask, g64, 0.1f), error, "does not take");
    ggml_tensor * q3 = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 128, 3, 2);  // 3 heads on 2 KV heads
    ggml_tensor * g3 = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 128, 3, 2);
    CHECK_THROWS(at::gated(ctx, q3, kc, vc, 40, mask, g3, 0.1f), error, "does not take");
    ggml_tensor * qbig = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 128 * 4 * 2 + 1);
    ggml_tensor * qoff = ggml_view_3d(ctx, qbig, 128, 4, 2, 128 * 4, 128 * 4 * 4, 4);  // 4 bytes in
    CHECK_THROWS(at::gated(ctx, qoff, kc, vc, 40, mask, gate, 0.1f), error, "aligned");
    CHECK(!at::supported(256, 24, 4, GGML_TYPE_F16, GGML_TYPE_F16, at::MAX_TOKENS + 1));
    CHECK(!at::supported(256, 18, 2, GGML_TYPE_F16, GGML_TYPE_F16, 1));  // 9 query heads a KV head
    CHECK(at::supported(256, 24, 4, GGML_TYPE_F16, GGML_TYPE_F16, 16));
    ggml_free(ctx);
}

TEST_CASE(gpu_matches_cpu) {
    ggml_backend_t gpu = lucebox_test::first_gpu_backend("attention_step gpu_matches_cpu");
    if (gpu == nullptr) return;
    kernels::install_cuda_kernels();
    ggml_backend_t cpu = cpu_backend();
    uint32_t seed = 100;
    for (const config & c : k_configs) {
        const problem p = random_problem(c.hd, c.H, c.Hkv, c.T, c.n_kv, c.mask_kind, seed++);
        const uint64_t before = kernels::attention_step_runs();
        const std::vector<float> g = run(gpu, p, true);
        const bool ran = kernels::attention_step_runs() == before + 1;
        const double d = max_abs_diff(g, run(cpu, p, true));
        print_config(c);
        std::printf("GPU vs CPU op max abs diff %.3g%s\n", d, ran ? "" : " (lucebox's kernels did not run)");
        CHECK(ran);
        // a decode step: f32 throughout; a verify: the tensor-core kernel rounds q and P to f16
        CHECK(d < (c.T == 1 ? 1e-4 : 1e-2));
    }
    check_token_groupings(gpu, random_problem(256, 24, 4, 16, 300, 1, 140));
    check_token_groupings(gpu, random_problem(256, 24, 4, 16, 4096, 0, 141));
    check_token_groupings(gpu, random_problem(128, 4, 2, 5, 70, 2, 142));
    check_token_groupings(gpu, random_problem(256, 8, 1, 17, 2047, 1, 143));  // 17 x 8 rows: 3 row blocks, a tail tile
    ggml_backend_free(cpu);
    ggml_backend_free(gpu);
}

TEST_MAIN()
