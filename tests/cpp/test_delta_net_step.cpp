// The fused DeltaNet step ops (cpp/kernels/delta_net_step.h): on the CPU backend against a
// double-precision reference of the layer (conv + SiLU, L2 norms, gates, the gated delta rule,
// gated RMS norm; the conv window and the state written back, or every token's into checkpoints);
// a token's results the same bits whatever the batch (T = 1 steps vs one T-token verify), on
// each backend; lucebox's CUDA kernels against the CPU op (checks nothing without a GPU); the
// builders' refusals.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "check.h"
#include "cuda_kernels.h"
#include "delta_net_step.h"
#include "gpu_backend.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "lucebox/errors.h"
#include "models/qwen35_model.h"

using namespace lucebox;
using lucebox::qwen35_tree_conv_rows;
namespace dn = lucebox::kernels::delta_net;

namespace {

constexpr int64_t N = dn::HEAD;
constexpr float EPS = 1e-6f;

struct layer {
    int64_t Hk = 2, Hv = 4, d_conv = 4;
    int64_t conv_dim() const { return (2 * Hk + Hv) * N; }
    int64_t proj_rows() const { return conv_dim() + Hv * N + 2 * Hv; }  // the stacked product: qkv | z | beta | alpha
    std::vector<float> conv_w, dt_bias, a, norm_w;
};

struct state {
    std::vector<float> conv;  // [conv_dim][d_conv-1]
    std::vector<float> ssm;   // [Hv][N][N]
};

layer random_layer(int64_t Hk, int64_t Hv, int64_t d_conv, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    layer l;
    l.Hk = Hk, l.Hv = Hv, l.d_conv = d_conv;
    l.conv_w.resize(l.conv_dim() * d_conv);
    for (float & e : l.conv_w) e = 0.5f * u(rng);
    l.dt_bias.resize(Hv);
    for (float & e : l.dt_bias) e = u(rng);
    l.a.resize(Hv);
    for (float & e : l.a) e = -0.1f - 0.9f * 0.5f * (u(rng) + 1.0f);
    l.norm_w.resize(N);
    for (float & e : l.norm_w) e = 1.0f + 0.2f * u(rng);
    return l;
}

state random_state(const layer & l, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    state s;
    s.conv.resize(l.conv_dim() * (l.d_conv - 1));
    for (float & e : s.conv) e = u(rng);
    s.ssm.resize(l.Hv * N * N);
    for (float & e : s.ssm) e = 0.3f * u(rng);
    return s;
}

std::vector<float> random_proj(const layer & l, int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> p(l.proj_rows() * T);
    for (float & e : p) e = 2.0f * u(rng);
    return p;
}

// A layer's tensors in a no_alloc context: the stacked projection [proj_rows, T] (qkv | z | beta |
// alpha, viewed apart as the model's stack is), the weights, the state, and checkpoints for `slots`
// tokens; upload() fills them once the context is allocated.
struct layer_tensors {
    ggml_tensor * p, * qkv, * z, * beta, * alpha, * conv_w, * dt_bias, * a, * norm_w, * conv, * ssm, * conv_ckpt, * ssm_ckpt;

    layer_tensors(ggml_context * ctx, const layer & l, int64_t T, int64_t slots) {
        const int64_t C = l.conv_dim();
        const size_t es = sizeof(float);
        p = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, l.proj_rows(), T);
        qkv = ggml_view_2d(ctx, p, C, T, p->nb[1], 0);
        z = ggml_view_2d(ctx, p, l.Hv * N, T, p->nb[1], C * es);
        beta = ggml_view_2d(ctx, p, l.Hv, T, p->nb[1], (C + l.Hv * N) * es);
        alpha = ggml_view_2d(ctx, p, l.Hv, T, p->nb[1], (C + l.Hv * N + l.Hv) * es);
        conv_w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, l.d_conv, C);
        dt_bias = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, l.Hv);
        a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, l.Hv);
        norm_w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N);
        conv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, l.d_conv - 1, C);
        ssm = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N * N, l.Hv);
        conv_ckpt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, l.d_conv - 1 + std::max(T, slots), C);
        ssm_ckpt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, l.Hv * N * N, slots);
    }

    void upload(const layer & l, const state & s0, const std::vector<float> & proj) const {
        ggml_backend_tensor_set(p, proj.data(), 0, ggml_nbytes(p));
        ggml_backend_tensor_set(conv_w, l.conv_w.data(), 0, ggml_nbytes(conv_w));
        ggml_backend_tensor_set(dt_bias, l.dt_bias.data(), 0, ggml_nbytes(dt_bias));
        ggml_backend_tensor_set(a, l.a.data(), 0, ggml_nbytes(a));
        ggml_backend_tensor_set(norm_w, l.norm_w.data(), 0, ggml_nbytes(norm_w));
        ggml_backend_tensor_set(conv, s0.conv.data(), 0, ggml_nbytes(conv));
        ggml_backend_tensor_set(ssm, s0.ssm.data(), 0, ggml_nbytes(ssm));
    }
};

struct result {
    std::vector<float> out;    // [T][Hv N]
    std::vector<float> conv;   // decode: the new carried window [conv_dim][d_conv-1]; verify: [conv_dim][d_conv-1+T]
    std::vector<float> ssm;    // decode: the final state; verify: slots [T][Hv N N] (slot s = after token T-1-s)
};

// The layer's step on `be` through the two ops; verify: the state is left alone and the windows and
// states go to checkpoint tensors (with a spare slot / column, as the model's are larger than T).
result run_ops(ggml_backend_t be, const layer & l, const state & s0, const std::vector<float> & proj, int64_t T,
               bool verify) {
    ggml_init_params ip{ggml_tensor_overhead() * 32 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    const int64_t C = l.conv_dim(), D = l.Hv * N * N, slots = T + 1, W = l.d_conv - 1 + slots;
    const layer_tensors lt(ctx, l, T, slots);
    ggml_tensor * conv = lt.conv, * ssm = lt.ssm, * conv_ckpt = lt.conv_ckpt, * ssm_ckpt = lt.ssm_ckpt;
    const size_t es = sizeof(float);
    ggml_tensor * xin = dn::inputs(ctx, lt.qkv, lt.beta, lt.alpha, conv, lt.conv_w, lt.dt_bias, lt.a,
                                   verify ? conv_ckpt : conv, l.Hk, verify ? 0 : T, EPS);
    ggml_tensor * state_dst = verify ? ssm_ckpt : ggml_view_2d(ctx, ssm, D, 1, D * es, 0);
    ggml_tensor * out = dn::recurrence(ctx, xin, T, lt.z, ssm, lt.norm_w, state_dst, l.Hk,
                                       verify ? dn::state_out::every_state : dn::state_out::final_state, EPS);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    lt.upload(l, s0, proj);
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    result r;
    r.out.resize(ggml_nelements(out));
    ggml_backend_tensor_get(out, r.out.data(), 0, ggml_nbytes(out));
    std::vector<float> conv_after(ggml_nelements(conv)), ssm_after(ggml_nelements(ssm));
    ggml_backend_tensor_get(conv, conv_after.data(), 0, ggml_nbytes(conv));
    ggml_backend_tensor_get(ssm, ssm_after.data(), 0, ggml_nbytes(ssm));
    if (verify) {
        CHECK(conv_after == s0.conv);  // a verify leaves the state alone
        CHECK(ssm_after == s0.ssm);
        std::vector<float> cw(ggml_nelements(conv_ckpt)), sw(ggml_nelements(ssm_ckpt));
        ggml_backend_tensor_get(conv_ckpt, cw.data(), 0, ggml_nbytes(conv_ckpt));
        ggml_backend_tensor_get(ssm_ckpt, sw.data(), 0, ggml_nbytes(ssm_ckpt));
        for (int64_t c = 0; c < C; ++c)
            r.conv.insert(r.conv.end(), cw.begin() + c * W, cw.begin() + c * W + l.d_conv - 1 + T);
        r.ssm.assign(sw.begin(), sw.begin() + T * D);
    } else {
        r.conv = conv_after;
        r.ssm = ssm_after;
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// The layer in double precision, token by token (the unfused graph's operations).
result reference(const layer & l, const state & s0, const std::vector<float> & proj, int64_t T, bool verify) {
    const int64_t C = l.conv_dim(), R = l.proj_rows(), K = l.Hk * N, P = C + 2 * l.Hv, D = l.Hv * N * N;
    std::vector<double> conv(s0.conv.begin(), s0.conv.end()), S(s0.ssm.begin(), s0.ssm.end()), x(P);
    result r;
    r.out.resize(T * l.Hv * N);
    std::vector<std::vector<double>> windows(C);
    for (int64_t c = 0; c < C; ++c) windows[c].assign(conv.begin() + c * (l.d_conv - 1), conv.begin() + (c + 1) * (l.d_conv - 1));
    std::vector<double> slots;
    for (int64_t t = 0; t < T; ++t) {
        const float * pt = proj.data() + t * R;
        for (int64_t c = 0; c < C; ++c) {
            windows[c].push_back(pt[c]);
            double sum = 0.0;
            for (int64_t i = 0; i < l.d_conv; ++i) sum += windows[c][t + i] * l.conv_w[c * l.d_conv + i];
            x[c] = silu(sum);
        }
        for (int64_t hd = 0; hd < 2 * l.Hk; ++hd) {
            double ss = 0.0;
            for (int64_t j = 0; j < N; ++j) ss += x[hd * N + j] * x[hd * N + j];
            for (int64_t j = 0; j < N; ++j) x[hd * N + j] /= std::sqrt(ss + EPS);
        }
        for (int64_t h = 0; h < l.Hv; ++h) {
            const double al = double(pt[C + l.Hv * N + l.Hv + h]) + l.dt_bias[h];
            const double g = (al > 20.0 ? al : std::log1p(std::exp(al))) * l.a[h];
            const double b = 1.0 / (1.0 + std::exp(-double(pt[C + l.Hv * N + h])));
            const double eg = std::exp(g);
            const double * q = &x[(h % l.Hk) * N], * k = &x[K + (h % l.Hk) * N], * v = &x[2 * K + h * N];
            std::vector<double> o(N);
            for (int64_t j = 0; j < N; ++j) {
                double * col = &S[h * N * N + j * N];
                double kv = 0.0;
                for (int64_t i = 0; i < N; ++i) kv += col[i] * k[i];
                const double delta = (v[j] - eg * kv) * b;
                double at = 0.0;
                for (int64_t i = 0; i < N; ++i) {
                    col[i] = eg * col[i] + k[i] * delta;
                    at += col[i] * q[i];
                }
                o[j] = at / std::sqrt(double(N));
            }
            double ss = 0.0;
            for (double e : o) ss += e * e;
            const double rr = 1.0 / std::sqrt(ss / double(N) + EPS);
            for (int64_t j = 0; j < N; ++j)
                r.out[t * l.Hv * N + h * N + j] = float(o[j] * rr * l.norm_w[j] * silu(pt[C + h * N + j]));
        }
        if (verify) slots.insert(slots.begin(), S.begin(), S.end());  // slot 0 = the latest
    }
    for (int64_t c = 0; c < C; ++c) {
        const std::vector<double> & w = windows[c];
        if (verify) r.conv.insert(r.conv.end(), w.begin(), w.end());
        else r.conv.insert(r.conv.end(), w.end() - (l.d_conv - 1), w.end());
    }
    if (verify) r.ssm.assign(slots.begin(), slots.end());
    else r.ssm.assign(S.begin(), S.end());
    (void) D;
    return r;
}

double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

size_t bits_differ(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size()) return std::max(a.size(), b.size());
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
}

ggml_backend_t cpu_backend() {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    return cpu;
}

// T = 1 steps, one after another, vs one T-token verify from the same state: each token's output and
// state the same bits (slot T-1-t of the verify = the state after step t), the verify's window = the
// carried windows.
void check_batch_independent(ggml_backend_t be, const layer & l, int64_t T, uint32_t seed) {
    const state s0 = random_state(l, seed);
    const std::vector<float> proj = random_proj(l, T, seed + 1);
    const result v = run_ops(be, l, s0, proj, T, true);
    state s = s0;
    const int64_t R = l.proj_rows(), D = l.Hv * N * N, HN = l.Hv * N;
    size_t out_differ = 0, state_differ = 0;
    for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> one(proj.begin() + t * R, proj.begin() + (t + 1) * R);
        const result d = run_ops(be, l, s, one, 1, false);
        out_differ += bits_differ(d.out, std::vector<float>(v.out.begin() + t * HN, v.out.begin() + (t + 1) * HN));
        state_differ += bits_differ(d.ssm, std::vector<float>(v.ssm.begin() + (T - 1 - t) * D, v.ssm.begin() + (T - t) * D));
        s.conv = d.conv;
        s.ssm = d.ssm;
    }
    size_t window_differ = 0;
    const int64_t W = l.d_conv - 1 + T;
    for (int64_t c = 0; c < l.conv_dim(); ++c)
        for (int64_t i = 0; i < l.d_conv - 1; ++i)
            window_differ += std::memcmp(&s.conv[c * (l.d_conv - 1) + i], &v.conv[c * W + T + i], sizeof(float)) != 0;
    std::printf("  T %lld: %zu outputs, %zu state values, %zu window values differ between %lld steps and one verify\n",
                (long long) T, out_differ, state_differ, window_differ, (long long) T);
    CHECK(out_differ == 0);
    CHECK(state_differ == 0);
    CHECK(window_differ == 0);
}

// A verify that keeps its fused inputs (written into `kept`, state_out::none) and its conv windows (a
// checkpoint with two spare columns, as the model's is wider than T), and a commit that replays its
// first m tokens (replay_layers over two layers' rows: the same kept inputs and window source, the
// verify's state and a copy of where it started, two conv states): the verify's outputs and both
// replayed states must be the same bits as a verify that writes every token's state (its outputs, its
// slot T-m), and both conv states that verify's window values [m, m + d_conv - 1).
void check_replay(ggml_backend_t be, const layer & l, int64_t T, uint32_t seed) {
    const state s0 = random_state(l, seed);
    const std::vector<float> proj = random_proj(l, T, seed + 1);
    const result every = run_ops(be, l, s0, proj, T, true);
    const int64_t C = l.conv_dim(), D = l.Hv * N * N, X = (C + 2 * l.Hv) * T;
    for (int64_t m : {int64_t(1), (T + 1) / 2, T}) {
        ggml_init_params ip{ggml_tensor_overhead() * 48 + 2 * ggml_graph_overhead(), nullptr, true};
        ggml_context * ctx = ggml_init(ip);
        const layer_tensors lt(ctx, l, T, T + 2);
        ggml_tensor * kept = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, X + 7);  // as the model's, larger than needed
        const size_t es = sizeof(float);
        ggml_tensor * xin = dn::inputs(ctx, lt.qkv, lt.beta, lt.alpha, lt.conv, lt.conv_w, lt.dt_bias, lt.a,
                                       lt.conv_ckpt, l.Hk, 0, EPS, ggml_view_1d(ctx, kept, X, 0));
        ggml_tensor * ssm = lt.ssm;
        ggml_tensor * out = dn::recurrence(ctx, xin, T, lt.z, ssm, lt.norm_w, ggml_view_2d(ctx, ssm, D, 1, D * es, 0),
                                           l.Hk, dn::state_out::none, EPS);
        ggml_cgraph * verify = ggml_new_graph(ctx);
        ggml_build_forward_expand(verify, out);
        ggml_tensor * ssm2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N * N, l.Hv);
        ggml_tensor * conv2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, l.d_conv - 1, C);
        ggml_tensor * table = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, dn::REPLAY_COLUMNS, 2);
        ggml_cgraph * commit = ggml_new_graph(ctx);
        const int64_t W = lt.conv_ckpt->ne[0];  // d_conv-1 + T + 2
        ggml_build_forward_expand(commit, dn::replay_layers(ctx, table, T, m, l.Hk, l.Hv, l.d_conv, W));
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        lt.upload(l, s0, proj);
        ggml_backend_tensor_set(ssm2, s0.ssm.data(), 0, ggml_nbytes(ssm2));
        const auto address = [](const ggml_tensor * t) { return int64_t(reinterpret_cast<uintptr_t>(t->data)); };
        const int64_t rows[8] = {address(kept), address(ssm),  address(lt.conv_ckpt), address(lt.conv),
                                 address(kept), address(ssm2), address(lt.conv_ckpt), address(conv2)};
        ggml_backend_tensor_set(table, rows, 0, sizeof rows);
        CHECK(ggml_backend_graph_compute(be, verify) == GGML_STATUS_SUCCESS);
        std::vector<float> o(ggml_nelements(out)), untouched(ggml_nelements(ssm)), replayed(ggml_nelements(ssm)),
            replayed2(ggml_nelements(ssm2));
        ggml_backend_tensor_get(out, o.data(), 0, ggml_nbytes(out));
        ggml_backend_tensor_get(ssm, untouched.data(), 0, ggml_nbytes(ssm));
        CHECK(ggml_backend_graph_compute(be, commit) == GGML_STATUS_SUCCESS);
        ggml_backend_tensor_get(ssm, replayed.data(), 0, ggml_nbytes(ssm));
        ggml_backend_tensor_get(ssm2, replayed2.data(), 0, ggml_nbytes(ssm2));
        std::vector<float> window(ggml_nelements(conv2)), window2(ggml_nelements(conv2)), want_window;
        ggml_backend_tensor_get(lt.conv, window.data(), 0, ggml_nbytes(conv2));
        ggml_backend_tensor_get(conv2, window2.data(), 0, ggml_nbytes(conv2));
        const int64_t every_w = l.d_conv - 1 + T;  // run_ops' window columns
        for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < l.d_conv - 1; ++i) want_window.push_back(every.conv[c * every_w + m + i]);
        const std::vector<float> want(every.ssm.begin() + (T - m) * D, every.ssm.begin() + (T - m + 1) * D);
        const size_t out_differ = bits_differ(o, every.out), state_differ = bits_differ(replayed, want),
                     state2_differ = bits_differ(replayed2, want);
        std::printf("  T %lld, replay of %lld: %zu outputs, %zu and %zu state values differ from the verify that keeps "
                    "every state\n",
                    (long long) T, (long long) m, out_differ, state_differ, state2_differ);
        CHECK(untouched == s0.ssm);  // the verify itself writes no state
        CHECK(out_differ == 0);
        CHECK(state_differ == 0);
        CHECK(state2_differ == 0);
        CHECK(bits_differ(window, want_window) == 0);
        CHECK(bits_differ(window2, want_window) == 0);
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
}

}  // namespace

TEST_CASE(cpu_replay_equals_kept_states) {
    ggml_backend_t cpu = cpu_backend();
    const layer l = random_layer(2, 4, 4, 9);
    for (int64_t T : {1, 6, 16}) check_replay(cpu, l, T, 90 + uint32_t(T));
    ggml_backend_free(cpu);
}

TEST_CASE(cpu_op_matches_reference) {
    ggml_backend_t cpu = cpu_backend();
    for (const auto & [Hk, Hv, d_conv] : {std::tuple<int64_t, int64_t, int64_t>{2, 4, 4}, {1, 3, 3}, {2, 2, 4}}) {
        const layer l = random_layer(Hk, Hv, d_conv, 7 + uint32_t(Hk * 10 + Hv));
        for (int64_t T : {1, 5, 16}) {
            for (bool verify : {false, true}) {
                const state s0 = random_state(l, 100 + uint32_t(T));
                const std::vector<float> proj = random_proj(l, T, 200 + uint32_t(T));
                const result got = run_ops(cpu, l, s0, proj, T, verify);
                const result want = reference(l, s0, proj, T, verify);
                const double d_out = max_abs_diff(got.out, want.out), d_conv_ = max_abs_diff(got.conv, want.conv),
                             d_ssm = max_abs_diff(got.ssm, want.ssm);
                std::printf("  Hk %lld Hv %lld d_conv %lld T %lld %s: max abs diff out %.3g, window %.3g, state %.3g\n",
                            (long long) Hk, (long long) Hv, (long long) d_conv, (long long) T,
                            verify ? "verify" : "decode", d_out, d_conv_, d_ssm);
                CHECK(d_out < 1e-4);
                CHECK(d_conv_ == 0.0);  // copies
                CHECK(d_ssm < 1e-4);
            }
        }
    }
    ggml_backend_free(cpu);
}

TEST_CASE(cpu_token_results_do_not_depend_on_batch) {
    ggml_backend_t cpu = cpu_backend();
    const layer l = random_layer(2, 4, 4, 3);
    for (int64_t T : {2, 16}) check_batch_independent(cpu, l, T, 50 + uint32_t(T));
    ggml_backend_free(cpu);
}

// A tree verify on the ops (its conv-window table and parents) against decode steps along each
// node's path: node t's output and its checkpoint slot T-1-t hold the bits of the step of token t
// after the steps of its ancestors, from the same state.
void check_tree_equals_paths(ggml_backend_t be, const layer & l, const std::vector<int32_t> & parents, uint32_t seed) {
    const int64_t T = int64_t(parents.size()), R = l.proj_rows(), D = l.Hv * N * N, HN = l.Hv * N;
    const state s0 = random_state(l, seed);
    const std::vector<float> proj = random_proj(l, T, seed + 1);
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 32 + ggml_graph_overhead(), nullptr, true});
    const layer_tensors lt(ctx, l, T, T);
    ggml_tensor * rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, l.d_conv * T);
    ggml_tensor * par = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    ggml_tensor * xin = dn::inputs(ctx, lt.qkv, lt.beta, lt.alpha, lt.conv, lt.conv_w, lt.dt_bias, lt.a, nullptr, l.Hk, 0, EPS,
                                   nullptr, rows);
    ggml_tensor * out = dn::recurrence(ctx, xin, T, lt.z, lt.ssm, lt.norm_w, lt.ssm_ckpt, l.Hk, dn::state_out::every_state,
                                       EPS, par);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    lt.upload(l, s0, proj);
    const std::vector<int32_t> table = qwen35_tree_conv_rows(parents, uint32_t(l.d_conv));
    ggml_backend_tensor_set(rows, table.data(), 0, ggml_nbytes(rows));
    ggml_backend_tensor_set(par, parents.data(), 0, ggml_nbytes(par));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<float> tree_out(ggml_nelements(out)), slots(ggml_nelements(lt.ssm_ckpt)), ssm_after(ggml_nelements(lt.ssm));
    ggml_backend_tensor_get(out, tree_out.data(), 0, ggml_nbytes(out));
    ggml_backend_tensor_get(lt.ssm_ckpt, slots.data(), 0, ggml_nbytes(lt.ssm_ckpt));
    ggml_backend_tensor_get(lt.ssm, ssm_after.data(), 0, ggml_nbytes(lt.ssm));
    CHECK(ssm_after == s0.ssm);  // a verify leaves the state alone
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    size_t differ = 0;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> path;
        for (int64_t j = t; j >= 0; j = parents[j]) path.insert(path.begin(), j);
        state s = s0;
        result step;
        for (int64_t j : path) {
            step = run_ops(be, l, s, std::vector<float>(proj.begin() + j * R, proj.begin() + (j + 1) * R), 1, false);
            s.conv = step.conv, s.ssm = step.ssm;
        }
        differ += bits_differ(step.out, std::vector<float>(tree_out.begin() + t * HN, tree_out.begin() + (t + 1) * HN));
        differ += bits_differ(step.ssm, std::vector<float>(slots.begin() + (T - 1 - t) * D, slots.begin() + (T - t) * D));
    }
    std::printf("  tree of %lld nodes: %zu values differ from the decode steps along the paths\n", (long long) T, differ);
    CHECK(differ == 0);
}

TEST_CASE(cpu_tree_equals_steps_along_its_paths) {
    ggml_backend_t cpu = cpu_backend();
    const layer l = random_layer(2, 4, 4, 61);
    check_tree_equals_paths(cpu, l, {-1, 0, 0, 1, 1, 2, 5, 3, 7, 0}, 300);  // branches, and a root sibling
    check_tree_equals_paths(cpu, l, {-1, 0, 1, 2, 3, 4}, 301);                 // a chain as a tree
    check_tree_equals_paths(cpu, random_layer(1, 3, 3, 62), {-1, 0, 0, 0, 2, 4, 4}, 302);  // conv of 3
    ggml_backend_free(cpu);
}

TEST_CASE(builders_refuse_bad_shapes) {
    ggml_init_params ip{ggml_tensor_overhead() * 48, nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    const int64_t Hk = 1, Hv = 2, C = (2 * Hk + Hv) * N, T = 3;
    auto f32 = [&](int64_t a, int64_t b) { return ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a, b); };
    ggml_tensor * qkv = f32(C, T), * beta = f32(Hv, T), * alpha = f32(Hv, T), * conv = f32(3, C), * w = f32(4, C),
                * dt = f32(Hv, 1), * a = f32(Hv, 1);
    CHECK(dn::inputs(ctx, qkv, beta, alpha, conv, w, dt, a, conv, Hk, T, EPS) != nullptr);
    CHECK_THROWS(dn::inputs(ctx, qkv, beta, alpha, conv, w, dt, a, conv, 2, T, EPS), error, "conv channels");
    CHECK_THROWS(dn::inputs(ctx, qkv, f32(Hv, T + 1), alpha, conv, w, dt, a, conv, Hk, T, EPS), error, "beta and alpha");
    CHECK_THROWS(dn::inputs(ctx, qkv, beta, alpha, f32(2, C), w, dt, a, conv, Hk, T, EPS), error, "conv state");
    CHECK_THROWS(dn::inputs(ctx, qkv, beta, alpha, f32(8, C), f32(9, C), dt, a, f32(8, C), Hk, T, EPS), error,
                 "d_conv <= MAX_D_CONV");
    CHECK_THROWS(dn::inputs(ctx, qkv, beta, alpha, conv, w, dt, a, conv, Hk, 0, EPS), error, "window_from");
    ggml_tensor * half = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, C, T);
    CHECK_THROWS(dn::inputs(ctx, half, beta, alpha, conv, w, dt, a, conv, Hk, T, EPS), error, "F32");
    ggml_tensor * keep = f32((C + 2 * Hv) * T, 1);
    CHECK(dn::inputs(ctx, qkv, beta, alpha, conv, w, dt, a, conv, Hk, T, EPS, keep) != nullptr);
    CHECK_THROWS(dn::inputs(ctx, qkv, beta, alpha, conv, w, dt, a, conv, Hk, T, EPS, f32((C + 2 * Hv) * T + 1, 1)),
                 error, "keep:");
    ggml_tensor * x = f32((C + 2 * Hv) * T, 1), * z = f32(Hv * N, T), * s = f32(N * N, Hv), * nw = f32(N, 1);
    ggml_tensor * dst = f32(N * N * Hv, 1), * ckpt = f32(N * N * Hv, T);
    const auto fin = dn::state_out::final_state, every = dn::state_out::every_state;
    CHECK(dn::recurrence(ctx, x, T, z, s, nw, dst, Hk, fin, EPS) != nullptr);
    CHECK_THROWS(dn::recurrence(ctx, x, T, z, s, nw, dst, Hk, every, EPS), error, "state destination");
    CHECK(dn::recurrence(ctx, x, T, z, s, nw, ckpt, Hk, every, EPS) != nullptr);
    CHECK_THROWS(dn::recurrence(ctx, f32(C, T), T, z, s, nw, dst, Hk, fin, EPS), error, "x:");
    CHECK_THROWS(dn::recurrence(ctx, x, T + 1, f32(Hv * N, T + 1), s, nw, dst, Hk, fin, EPS), error, "x:");
    CHECK_THROWS(dn::recurrence(ctx, x, T - 1, z, s, nw, dst, Hk, fin, EPS), error, "x_tokens >= T");
    CHECK_THROWS(dn::recurrence(ctx, x, T, f32(Hv * N + 1, T), s, nw, dst, Hk, fin, EPS), error, "z [");
    ggml_tensor * table = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 4, 3);
    const int64_t dc = 4, cs = dc - 1 + T;  // the conv's length, the narrowest window source
    CHECK(dn::replay_layers(ctx, table, T, 2, Hk, Hv, dc, cs) != nullptr);
    CHECK_THROWS(dn::replay_layers(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 3), T, 2, Hk, Hv, dc, cs), error,
                 "I64");
    CHECK_THROWS(dn::replay_layers(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_I64, 2, 3), T, 2, Hk, Hv, dc, cs), error,
                 "[4, n]");
    CHECK_THROWS(dn::replay_layers(ctx, table, T, T + 1, Hk, Hv, dc, cs), error, "x_tokens >= T");
    CHECK_THROWS(dn::replay_layers(ctx, table, dn::MAX_TOKENS + 1, 2, Hk, Hv, dc, dc - 1 + dn::MAX_TOKENS + 1), error,
                 "MAX_TOKENS");
    CHECK_THROWS(dn::replay_layers(ctx, table, T, 2, 2, 3, dc, cs), error, "multiple of the key heads");
    CHECK_THROWS(dn::replay_layers(ctx, table, T, 2, Hk, Hv, dn::MAX_D_CONV + 1, cs + dn::MAX_D_CONV), error,
                 "d_conv <= MAX_D_CONV");
    CHECK_THROWS(dn::replay_layers(ctx, table, T, 2, Hk, Hv, dc, cs - 1), error, "d_conv-1+x_tokens values");
    ggml_free(ctx);
}

// lucebox's CUDA kernels (patch 0007's hook) against the CPU op, and their own batch independence.
TEST_CASE(gpu_matches_cpu) {
    ggml_backend_t gpu = lucebox_test::first_gpu_backend("delta_net_step gpu_matches_cpu");
    if (gpu == nullptr) return;
    kernels::install_cuda_kernels();
    ggml_backend_t cpu = cpu_backend();
    for (const auto & [Hk, Hv, d_conv] : {std::tuple<int64_t, int64_t, int64_t>{2, 4, 4}, {16, 48, 4}, {1, 3, 3}}) {
        const layer l = random_layer(Hk, Hv, d_conv, 11 + uint32_t(Hk + Hv));
        for (int64_t T : {1, 7, 16, 40, 64}) {
            for (bool verify : {false, true}) {
                const state s0 = random_state(l, 300 + uint32_t(T));
                const std::vector<float> proj = random_proj(l, T, 400 + uint32_t(T));
                const uint64_t before = kernels::delta_net_step_runs();
                const result g = run_ops(gpu, l, s0, proj, T, verify);
                const bool ran = kernels::delta_net_step_runs() == before + 2;
                const result c = run_ops(cpu, l, s0, proj, T, verify);
                const double d_out = max_abs_diff(g.out, c.out), d_conv_ = max_abs_diff(g.conv, c.conv),
                             d_ssm = max_abs_diff(g.ssm, c.ssm);
                std::printf("  Hk %lld Hv %lld T %lld %s: GPU vs CPU max abs diff out %.3g, window %.3g, state %.3g%s\n",
                            (long long) Hk, (long long) Hv, (long long) T, verify ? "verify" : "decode", d_out, d_conv_,
                            d_ssm, ran ? "" : " (lucebox's kernels did not run)");
                CHECK(ran);
                CHECK(d_out < 1e-4);
                CHECK(d_conv_ == 0.0);
                CHECK(d_ssm < 1e-4);
            }
        }
    }
    check_batch_independent(gpu, random_layer(16, 48, 4, 5), 16, 77);
    // a tree on the kernels (its window table and parents): every node the decode steps' bits along its path
    check_tree_equals_paths(gpu, random_layer(2, 4, 4, 61), {-1, 0, 0, 1, 1, 2, 5, 3, 7, 0}, 310);
    check_tree_equals_paths(gpu, random_layer(16, 48, 4, 63), {-1, 0, 1, 1, 0, 4, 2, 6, 6, 3, 9, 0, 11, 12, 8, 14, 10}, 311);
    for (int64_t T : {1, 6, 16}) check_replay(gpu, random_layer(16, 48, 4, 6), T, 120 + uint32_t(T));
    ggml_backend_free(cpu);
    ggml_backend_free(gpu);
}

TEST_MAIN()
