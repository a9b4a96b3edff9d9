// Speed of the fused DeltaNet step's kernels (cpp/kernels/delta_net_step.cuh) on the Qwen3.6-27B
// DeltaNet shape (16 key heads, 48 value heads of 128) for a decode step (1 token) and verifies (2..64
// tokens). First the recurrence: us a layer, what each token after the first adds, and a hash of one
// layer's outputs and final state for each T (T = 16's can be written to DIR), so that two builds of a
// change can be compared; each T's outputs and state are also checked against a double-precision
// reference on the host ("err": the largest difference over the largest reference value, outputs and
// state; "BAD" above 1e-4), so that a variant is known to compute the recurrence before it is timed.
// Then the replay_layers kernel (a chain commit of all 48 layers in one launch) for T kept tokens: us a
// layer, and whether its state is the recurrence's final state to the bit. Then the inputs kernel (conv,
// norms, gates; d_conv 4) for T tokens, writing a verify's whole window into a checkpoint and writing the
// window in place (a decode step at T = 1): us a layer and a hash of its outputs and window. The full
// correctness tests are tests/cpp/test_delta_net_step.cpp (random inputs, unit-norm q and k).
// Standalone (no ggml); on the GPU machine:
//     nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icpp/kernels -Itests/cpp \
//          -o /tmp/gdn bench/probes/delta_net_bench.cu && /tmp/gdn [--once] [--heads HK:HV] [DIR]
// DIR: T = 16's results are written there. --heads: key and value heads (default the 27B's 16:48;
// with 4 CTAs a value head, 48 of them put two CTAs on 60 of the H200's 132 multiprocessors, 33 or
// fewer one each at most).
// --once: no timing, each kernel launched once (recurrence T = 1 and 16, replay_layers T = 6 for one
// layer, then for 48; the recurrence at T = 6 as well, for the bit check), for Nsight Compute
// (build with -lineinfo):
//     ncu --clock-control none --warp-sampling-interval 0 -k regex:"recurrence_kernel|replay_layers" \
//         --set full --import-source yes -o /tmp/gdn /tmp/gdn --once
//     ncu -i /tmp/gdn.ncu-rep --page source --print-source sass --csv > /tmp/gdn_sass.csv
// 48 launches (48 layers' own states) are captured into one CUDA graph, as ggml runs a step (the inputs
// kernel is timed without --once only).
#include "cuda_check.h"
#include "delta_net_step.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ds = lucebox::kernels::delta_net::cuda_step;

namespace {

constexpr int HEAD = ds::HEAD, LAYERS = 48, MAX_T = ds::MAX_TOKENS;

// FNV-1a over the bits of n floats
uint64_t hash_of(const std::vector<float> & v) {
    uint64_t h = 1469598103934665603ull;
    for (float f : v) {
        uint32_t b;
        std::memcpy(&b, &f, 4);
        for (int i = 0; i < 4; ++i) h = (h ^ ((b >> (8 * i)) & 0xFF)) * 1099511628211ull;
    }
    return h;
}

// The recurrence of one layer for T tokens in double precision (recurrence_args' contract, state_mode 0):
// out [T][HV HEAD], state [HV][HEAD (column)][HEAD (k index)].
void reference(const std::vector<float> & x, int x_tokens, int HK, int HV, int T, const std::vector<float> & s0,
               const std::vector<float> & z, const std::vector<float> & norm_w, float eps, std::vector<double> & out,
               std::vector<double> & state) {
    const int64_t CONV = int64_t(2 * HK + HV) * HEAD, G = CONV * x_tokens, B = G + int64_t(HV) * x_tokens;
    out.assign(size_t(T) * HV * HEAD, 0.0);
    state.assign(s0.begin(), s0.end());
    std::vector<double> o(HEAD);
    for (int h = 0; h < HV; ++h) {
        double * S = state.data() + size_t(h) * HEAD * HEAD;
        const int kh = h % HK;
        for (int t = 0; t < T; ++t) {
            const float * row = x.data() + t * CONV;
            const float *q = row + kh * HEAD, *k = row + (HK + kh) * HEAD, *v = row + (2 * HK + h) * HEAD;
            const double eg = std::exp(double(x[G + t * HV + h])), beta = x[B + t * HV + h];
            double ss = 0.0;
            for (int c = 0; c < HEAD; ++c) {
                double kv = 0.0;
                for (int i = 0; i < HEAD; ++i) kv += S[c * HEAD + i] * k[i];
                const double delta = (v[c] - eg * kv) * beta;
                double at = 0.0;
                for (int i = 0; i < HEAD; ++i) {
                    S[c * HEAD + i] = eg * S[c * HEAD + i] + k[i] * delta;
                    at += S[c * HEAD + i] * q[i];
                }
                o[c] = at / std::sqrt(double(HEAD));
                ss += o[c] * o[c];
            }
            const double rr = 1.0 / std::sqrt(ss / HEAD + eps);
            for (int c = 0; c < HEAD; ++c) {
                const double zc = z[(size_t(t) * HV + h) * HEAD + c];
                out[(size_t(t) * HV + h) * HEAD + c] = o[c] * rr * norm_w[c] * zc / (1.0 + std::exp(-zc));
            }
        }
    }
}

// max |a - b| / max |b|
double rel_err(const std::vector<float> & a, const std::vector<double> & b) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i])), m = std::max(m, std::fabs(b[i]));
    return m > 0.0 ? d / m : d;
}

}  // namespace

int main(int argc, char ** argv) {
    bool once = false;
    const char * dump = nullptr;  // a directory: T = 16's out and state as raw floats
    int HK = 16, HV = 48;         // key and value heads (the 27B's; --heads HK:HV for others)
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--once") {
            once = true;
        } else if (arg == "--heads" && i + 1 < argc) {
            if (std::sscanf(argv[++i], "%d:%d", &HK, &HV) != 2 || HK < 1 || HV < 1 || HV > 1024) {
                std::fprintf(stderr, "--heads takes HK:HV (key and value heads), got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            dump = argv[i];
        }
    }
    const int CONV = (2 * HK + HV) * HEAD;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    // x: [MAX_T][CONV] q | k | v, then g (log decay) [MAX_T][HV], then beta [MAX_T][HV]
    const size_t x_floats = size_t(MAX_T) * CONV + 2 * size_t(MAX_T) * HV;
    std::vector<float> hx(x_floats);
    for (int t = 0; t < MAX_T; ++t) {
        float * row = hx.data() + size_t(t) * CONV;
        for (int head = 0; head < 2 * HK; ++head) {  // q and k heads: unit norm, as the inputs kernel makes them
            float ss = 0.0f;
            for (int i = 0; i < HEAD; ++i) ss += (row[head * HEAD + i] = nd(rng)) * row[head * HEAD + i];
            for (int i = 0; i < HEAD; ++i) row[head * HEAD + i] /= std::sqrt(ss);
        }
        for (int i = 2 * HK * HEAD; i < CONV; ++i) row[i] = nd(rng);
    }
    float * g = hx.data() + size_t(MAX_T) * CONV;
    for (int i = 0; i < MAX_T * HV; ++i) g[i] = -0.2f * ud(rng);
    for (int i = 0; i < MAX_T * HV; ++i) g[MAX_T * HV + i] = ud(rng);
    const size_t state = size_t(HV) * HEAD * HEAD;
    std::vector<float> hs(state), hz(size_t(MAX_T) * HV * HEAD), hn(HEAD);
    for (auto & v : hs) v = 0.05f * nd(rng);
    for (auto & v : hz) v = nd(rng);
    for (auto & v : hn) v = 1.0f + 0.1f * nd(rng);

    float *x, *z, *s0, *norm_w, *dst, *out;
    CHECK_CUDA(cudaMalloc(&x, x_floats * 4));
    CHECK_CUDA(cudaMalloc(&z, hz.size() * 4));
    CHECK_CUDA(cudaMalloc(&s0, state * 4 * LAYERS));
    CHECK_CUDA(cudaMalloc(&dst, state * 4 * LAYERS));
    CHECK_CUDA(cudaMalloc(&norm_w, HEAD * 4));
    CHECK_CUDA(cudaMalloc(&out, size_t(MAX_T) * HV * HEAD * 4));
    CHECK_CUDA(cudaMemcpy(x, hx.data(), x_floats * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(z, hz.data(), hz.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(norm_w, hn.data(), HEAD * 4, cudaMemcpyHostToDevice));
    for (int l = 0; l < LAYERS; ++l) CHECK_CUDA(cudaMemcpy(s0 + l * state, hs.data(), state * 4, cudaMemcpyHostToDevice));

    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    // us a layer of launch(l) for the LAYERS layers, captured into one CUDA graph (as ggml runs a step)
    auto layer_us = [&](auto launch) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < LAYERS; ++l) CHECK_CUDA(launch(l));
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int w = 0; w < 3; ++w) CHECK_CUDA(cudaGraphLaunch(exec, stream));
        constexpr int REPS = 20;
        CHECK_CUDA(cudaEventRecord(e0, stream));
        for (int r = 0; r < REPS; ++r) CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        CHECK_CUDA(cudaGraphExecDestroy(exec));
        CHECK_CUDA(cudaGraphDestroy(graph));
        return 1000.0 * ms / (REPS * LAYERS);
    };
    auto args = [&](int T, int l) {
        ds::recurrence_args a;
        a.x = x;  // x's token stride is CONV; g and beta follow MAX_T tokens
        a.x_tokens = MAX_T;
        a.z = z;
        a.z_stride = int64_t(HV) * HEAD;
        a.s0 = s0 + l * state;
        a.norm_w = norm_w;
        a.state_dst = dst + l * state;
        a.slot_stride = int64_t(state);
        a.state_mode = 0;
        a.out = out;
        a.T = T;
        a.Hk = HK;
        a.Hv = HV;
        a.eps = 1e-6f;
        return a;
    };
    std::printf("recurrence kernel, %d value heads of %d, %d layers in one graph\n", HV, HEAD, LAYERS);
    std::printf("%4s %10s %14s %18s   %s\n", "T", "us/layer", "us/extra token", "hash (out, state)", "err (out, state)");
    double us1 = 0.0;
    for (int T : {1, 2, 4, 8, 16, 32, 64}) {
        if (once && T != 1 && T != 16) continue;
        // one layer's results, for the hash
        CHECK_CUDA(ds::run_recurrence(args(T, 0), stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        std::vector<float> ho(size_t(T) * HV * HEAD), hd(state);
        CHECK_CUDA(cudaMemcpy(ho.data(), out, ho.size() * 4, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hd.data(), dst, state * 4, cudaMemcpyDeviceToHost));
        const uint64_t h = hash_of(ho) ^ (hash_of(hd) * 31);
        std::vector<double> ro, rs;
        reference(hx, MAX_T, HK, HV, T, hs, hz, hn, 1e-6f, ro, rs);
        const double eo = rel_err(ho, ro), es = rel_err(hd, rs);
        char err[64];
        std::snprintf(err, sizeof err, "%.1e %.1e%s", eo, es, eo > 1e-4 || es > 1e-4 ? " BAD" : "");
        if (dump != nullptr && T == 16) {
            for (auto [name, v] : {std::pair{"out16.f32", &ho}, std::pair{"state16.f32", &hd}}) {
                const std::string path = std::string(dump) + "/" + name;
                FILE * f = std::fopen(path.c_str(), "wb");
                if (f == nullptr || std::fwrite(v->data(), 4, v->size(), f) != v->size()) std::exit(1);
                std::fclose(f);
            }
        }
        if (once) {
            std::printf("%4d %10s %14s   %016llx   %s\n", T, "-", "-", (unsigned long long) h, err);
            continue;
        }

        const double us = layer_us([&](int l) { return ds::run_recurrence(args(T, l), stream); });
        if (T == 1) us1 = us;
        std::printf("%4d %10.2f %14.3f   %016llx   %s\n", T, us, T > 1 ? (us - us1) / (T - 1) : 0.0,
                    (unsigned long long) h, err);
    }

    // replay_layers: a chain commit of the 48 layers in one launch (each state in place, each conv
    // window copied from one shared source). Its state for T must be the recurrence's final state
    // for T to the bit (layer 0 from s0); the timing's launches run on from whatever state is left.
    constexpr int D_CONV = 4, SRC_STRIDE = D_CONV - 1 + MAX_T;
    const int WINDOW = CONV * (D_CONV - 1);
    float *conv_src, *conv;
    int64_t * table;
    CHECK_CUDA(cudaMalloc(&conv_src, size_t(CONV) * SRC_STRIDE * 4));
    CHECK_CUDA(cudaMalloc(&conv, size_t(WINDOW) * LAYERS * 4));
    CHECK_CUDA(cudaMalloc(&table, 4 * LAYERS * sizeof(int64_t)));
    CHECK_CUDA(cudaMemset(conv_src, 0, size_t(CONV) * SRC_STRIDE * 4));
    std::vector<int64_t> rows;
    for (int l = 0; l < LAYERS; ++l)
        for (const float * p : {static_cast<const float *>(x), static_cast<const float *>(dst + l * state),
                                static_cast<const float *>(conv_src), static_cast<const float *>(conv + l * WINDOW)})
            rows.push_back(int64_t(reinterpret_cast<uintptr_t>(p)));
    CHECK_CUDA(cudaMemcpy(table, rows.data(), rows.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    ds::replay_layers_args r;
    r.layers = table;
    r.x_tokens = MAX_T, r.Hk = HK, r.Hv = HV, r.d_conv = D_CONV, r.conv_src_stride = SRC_STRIDE;
    std::printf("replay_layers kernel, %d layers in one launch\n", LAYERS);
    std::printf("%4s %10s %26s\n", "T", "us/layer", "state = recurrence's (bits)");
    for (int T : {1, 2, 4, 6, 8, 16}) {
        if (once && T != 6) continue;
        r.T = T;
        std::vector<float> want(state), got(state);
        CHECK_CUDA(ds::run_recurrence(args(T, 0), stream));
        CHECK_CUDA(cudaMemcpyAsync(want.data(), dst, state * 4, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaMemcpyAsync(dst, s0, state * 4, cudaMemcpyDeviceToDevice, stream));
        CHECK_CUDA(ds::run_replay_layers(r, 1, stream));
        CHECK_CUDA(cudaMemcpyAsync(got.data(), dst, state * 4, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const bool same = std::memcmp(want.data(), got.data(), state * 4) == 0;
        if (once) {
            CHECK_CUDA(ds::run_replay_layers(r, LAYERS, stream));
            CHECK_CUDA(cudaStreamSynchronize(stream));
            std::printf("%4d %10s %26s\n", T, "-", same ? "yes" : "NO");
            continue;
        }
        for (int w = 0; w < 3; ++w) CHECK_CUDA(ds::run_replay_layers(r, LAYERS, stream));
        constexpr int REPS = 20;
        CHECK_CUDA(cudaEventRecord(e0, stream));
        for (int i = 0; i < REPS; ++i) CHECK_CUDA(ds::run_replay_layers(r, LAYERS, stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        std::printf("%4d %10.2f %26s\n", T, 1000.0 * ms / (REPS * LAYERS), same ? "yes" : "NO");
    }

    // The inputs kernel (causal conv + SiLU, q/k L2 norms, g and beta) of the same heads, d_conv 4, each
    // layer its own conv state: a verify's (the whole window into a checkpoint, window_from 0) and an in-place
    // window's (window_from T, the conv state itself: a decode step at T = 1). The hash covers the outputs
    // and the window written, from the same starting state, so that two builds can be compared to the bit.
    const int64_t CW = int64_t(CONV) * (D_CONV - 1), CKPT = D_CONV - 1 + MAX_T, IOUT = (int64_t(CONV) + 2 * HV) * MAX_T;
    std::vector<float> h_qkv(size_t(MAX_T) * CONV), h_ba(2 * size_t(MAX_T) * HV), h_cs(static_cast<size_t>(CW)),
        h_cw(size_t(CONV) * D_CONV), h_dtb(HV), h_a(HV);
    for (std::vector<float> * v : {&h_qkv, &h_ba, &h_cs, &h_dtb})
        for (auto & e : *v) e = nd(rng);
    for (auto & e : h_cw) e = 0.5f * nd(rng);
    for (auto & e : h_a) e = -1.0f - ud(rng);
    float *qkv, *ba, *cstate, *cstate0, *cw, *dtb, *aa, *ckpt, *iout;
    CHECK_CUDA(cudaMalloc(&qkv, h_qkv.size() * 4));
    CHECK_CUDA(cudaMalloc(&ba, h_ba.size() * 4));
    CHECK_CUDA(cudaMalloc(&cstate, size_t(CW) * LAYERS * 4));
    CHECK_CUDA(cudaMalloc(&cstate0, size_t(CW) * 4));
    CHECK_CUDA(cudaMalloc(&cw, h_cw.size() * 4));
    CHECK_CUDA(cudaMalloc(&dtb, HV * 4));
    CHECK_CUDA(cudaMalloc(&aa, HV * 4));
    CHECK_CUDA(cudaMalloc(&ckpt, size_t(CONV) * CKPT * 4));
    CHECK_CUDA(cudaMalloc(&iout, size_t(IOUT) * 4));
    CHECK_CUDA(cudaMemcpy(qkv, h_qkv.data(), h_qkv.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(ba, h_ba.data(), h_ba.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(cstate0, h_cs.data(), size_t(CW) * 4, cudaMemcpyHostToDevice));
    for (int l = 0; l < LAYERS; ++l) CHECK_CUDA(cudaMemcpy(cstate + l * CW, cstate0, size_t(CW) * 4, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaMemcpy(cw, h_cw.data(), h_cw.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dtb, h_dtb.data(), HV * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(aa, h_a.data(), HV * 4, cudaMemcpyHostToDevice));
    auto in_args = [&](int T, int l, bool in_place) {
        ds::inputs_args a;
        a.qkv = qkv, a.qkv_stride = CONV;  // token t's row at qkv + t CONV
        a.beta = ba, a.beta_stride = HV, a.alpha = ba + MAX_T * HV, a.alpha_stride = HV;
        a.conv_state = cstate + l * CW, a.conv_w = cw, a.dt_bias = dtb, a.a = aa;
        if (in_place) a.conv_dst = cstate + l * CW, a.conv_dst_stride = D_CONV - 1, a.window_from = T;
        else a.conv_dst = ckpt, a.conv_dst_stride = CKPT, a.window_from = 0;
        a.out = iout;
        a.T = T, a.Hk = HK, a.Hv = HV, a.conv_dim = CONV, a.d_conv = D_CONV, a.eps = 1e-6f;
        return a;
    };
    // one launch from layer 0's starting state: the hash of its outputs and of the window it wrote
    auto inputs_hash = [&](int T, bool in_place) {
        CHECK_CUDA(cudaMemcpy(cstate, cstate0, size_t(CW) * 4, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(ds::run_inputs(in_args(T, 0, in_place), stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        std::vector<float> o(size_t(CONV + 2 * HV) * T), w(in_place ? size_t(CW) : size_t(CONV) * CKPT);
        CHECK_CUDA(cudaMemcpy(o.data(), iout, o.size() * 4, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(w.data(), in_place ? cstate : ckpt, w.size() * 4, cudaMemcpyDeviceToHost));
        return hash_of(o) ^ (hash_of(w) * 31);
    };
    if (!once) {
        std::printf("inputs kernel, %d conv channels, d_conv %d, %d layers in one graph\n", CONV, D_CONV, LAYERS);
        std::printf("%4s %16s %16s %18s %18s\n", "T", "us/layer verify", "us/layer in place", "hash verify", "hash in place");
        for (int T : {1, 2, 4, 8, 16, 32, 64}) {
            CHECK_CUDA(cudaMemset(ckpt, 0, size_t(CONV) * CKPT * 4));  // (a verify writes 3 + T values a channel)
            const uint64_t hv = inputs_hash(T, false), hp = inputs_hash(T, true);
            const double uv = layer_us([&](int l) { return ds::run_inputs(in_args(T, l, false), stream); });
            const double up = layer_us([&](int l) { return ds::run_inputs(in_args(T, l, true), stream); });
            std::printf("%4d %16.2f %16.2f   %016llx   %016llx\n", T, uv, up, (unsigned long long) hv,
                        (unsigned long long) hp);
        }
    }
    return 0;
}
