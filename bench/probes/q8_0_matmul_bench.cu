// Speed of lucebox's Q8_0 / Q4_K few-column matmul kernel (cpp/kernels/q8_0_matmul.cuh) on the
// Qwen3.6-27B matrix shapes, for 1..64 activation columns: kernel time (activation quantization
// included), Q8_0 bytes streamed per second, and that as a fraction of the device-to-device copy
// bandwidth measured in the same run. Several copies of each matrix rotate so the timed loop reads
// from HBM, not from L2. Correctness is tests/cpp/test_q8_0_matmul.cu; this only times.
// Standalone (no ggml); on the GPU machine:
//     nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icpp/kernels -Itests/cpp \
//          -o /tmp/q8mm bench/probes/q8_0_matmul_bench.cu && /tmp/q8mm [--q4k]
#include "cuda_check.h"
#include "q8_0_matmul.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace q8 = lucebox::kernels::q8_0;

// The Qwen3.6-27B product shapes timed (K -> M, gated: the fused gate/up pair, two weights of M rows; `what`:
// the name ab_sums.py keys a shape's times by).
struct product_shape {
    int K, M;
    bool gated;
    const char * what;
};

constexpr product_shape qwen36_27b_shapes[] = {{5120, 17408, true, "ffn gate+up fused (5120 -> 2x17408)"},
                                               {5120, 17408, false, "ffn_up alone (5120 -> 17408)"},
                                               {17408, 5120, false, "ffn_down (17408 -> 5120)"},
                                               {5120, 16480, false, "DeltaNet stack qkv+z+b+a (5120 -> 16480)"},
                                               {5120, 14336, false, "attention stack q+k+v (5120 -> 14336)"},
                                               {5120, 10240, false, "DeltaNet attn_qkv (5120 -> 10240)"},
                                               {5120, 6144, false, "DeltaNet attn_gate (5120 -> 6144)"},
                                               {6144, 5120, false, "ssm_out / attn_output (6144 -> 5120)"},
                                               {5120, 1024, false, "attn_k / attn_v (5120 -> 1024)"}};

static float time_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

// Microseconds a launch: launch(i) for i = 0..reps-1 on `stream`, timed by the events t0, t1; graph: captured
// into one CUDA graph first, which is launched once untimed (warm-up) and once timed.
template <typename Launch>
static double launch_us(cudaStream_t stream, cudaEvent_t t0, cudaEvent_t t1, int reps, bool graph, Launch launch) {
    cudaGraphExec_t exec = nullptr;
    if (graph) {
        cudaGraph_t g;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
        for (int i = 0; i < reps; ++i) launch(i);
        CHECK_CUDA(cudaStreamEndCapture(stream, &g));
        CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
        CHECK_CUDA(cudaGraphDestroy(g));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
    }
    CHECK_CUDA(cudaEventRecord(t0, stream));
    if (graph) {
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
    } else {
        for (int i = 0; i < reps; ++i) launch(i);
    }
    CHECK_CUDA(cudaEventRecord(t1, stream));
    CHECK_CUDA(cudaEventSynchronize(t1));
    if (exec != nullptr) CHECK_CUDA(cudaGraphExecDestroy(exec));
    return 1e3 * time_ms(t0, t1) / reps;
}


// With arguments `K M N gated(0|1)`: that one product only (e.g. under ncu). Options first:
// --q4k: Q4_K weights instead of Q8_0; --q5k: Q5_K; --q6k: Q6_K (row-tiled, as the kernel reads it);
// --cols N,N,..: these column counts only; --norm: each
// product also RMS-normalizes its input (the fused layer norm); --graph: the timed launches run as
// one captured CUDA graph (as ggml runs a step), not as stream launches.
// --tiled: the weights read in weight_tiles.h's row-tiled layout (the layout lucebox loads them in
// on a CUDA device; the bytes are random either way). Compile with -DLUCEBOX_Q8_0_PDL=0 for the
// launch A/B, -DLUCEBOX_Q8_0_PERSISTENT=W (0: never persistent CTAs; 1: from one wave on),
// -DLUCEBOX_Q8_0_STAGES=N and -DLUCEBOX_Q8_0_ONE_TILE_MAX_NG=G for the
// pipeline depth and the rows per warp, -DLUCEBOX_Q8_0_ONE_COL=0|1|2 and -DLUCEBOX_Q8_0_ONE_STAGES=N
// for the one-column staging (q8_0_matmul.cuh; a variant of weights_ahead or of other constexpr
// choices goes in a copy of the header, bench/probes/ab.sh NAME=DIR; run tests/cpp/test_q8_0_matmul.cu built
// with the same flags before trusting a variant's times: bench/probes/ab.sh --test does both).
std::vector<int> int_list(const char * s) {
    std::vector<int> v;
    for (const char * p = s; *p;) {
        char * end = nullptr;
        v.push_back(int(std::strtol(p, &end, 10)));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
    }
    return v;
}

int main(int argc, char ** argv) {
    bool q4k = false, q5k = false, q6k = false, norm = false, graph = false, tiled = false;
    std::vector<int> only_cols;
    while (argc > 1 && std::strncmp(argv[1], "--", 2) == 0) {
        if (std::strcmp(argv[1], "--q4k") == 0) {
            q4k = true;
        } else if (std::strcmp(argv[1], "--q5k") == 0) {
            q5k = true;
        } else if (std::strcmp(argv[1], "--q6k") == 0) {
            q6k = tiled = true;  // the kernel reads q6_k row-tiled only
        } else if (std::strcmp(argv[1], "--norm") == 0) {
            norm = true;
        } else if (std::strcmp(argv[1], "--graph") == 0) {
            graph = true;
        } else if (std::strcmp(argv[1], "--tiled") == 0) {
            tiled = true;
        } else if (std::strcmp(argv[1], "--cols") == 0 && argc > 2) {
            only_cols = int_list(argv[2]);
            --argc;
            ++argv;
        } else {
            std::fprintf(stderr, "unknown option %s\n", argv[1]);
            return 2;
        }
        --argc;
        ++argv;
    }
    const q8::weight_type type = q6k   ? q8::weight_type::q6_k
                                 : q5k ? q8::weight_type::q5_k
                                 : q4k ? q8::weight_type::q4_k
                                       : q8::weight_type::q8_0;
    std::printf("%s weights%s%s\n", q6k ? "Q6_K" : q5k ? "Q5_K" : q4k ? "Q4_K" : "Q8_0", norm ? ", RMS-normed input" : "",
                tiled ? ", row-tiled layout" : "");
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    double copy_tbs = 0;
    {  // device-to-device copy bandwidth (bytes read + written)
        const size_t bytes = size_t(2) << 30;
        void *a, *b;
        CHECK_CUDA(cudaMalloc(&a, bytes));
        CHECK_CUDA(cudaMalloc(&b, bytes));
        CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaEventRecord(t0));
        for (int i = 0; i < 10; ++i) CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaEventRecord(t1));
        CHECK_CUDA(cudaEventSynchronize(t1));
        copy_tbs = 2.0 * bytes * 10 / (time_ms(t0, t1) * 1e-3) / 1e12;
        cudaFree(a);
        cudaFree(b);
        std::printf("device copy bandwidth: %.2f TB/s (read + write)\n", copy_tbs);
    }
    std::vector<product_shape> chosen(std::begin(qwen36_27b_shapes), std::end(qwen36_27b_shapes));
    std::vector<int> cols = {1, 2, 4, 8, 16, 32, 64};
    if (!only_cols.empty()) cols = only_cols;
    if (argc == 5) {
        chosen = {{std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[4]) != 0, "given"}};
        cols = {std::atoi(argv[3])};
    }
    std::mt19937 rng(3);
    std::printf("%-40s %5s %10s %9s %8s\n", "matrix", "N", "us", "TB/s", "of copy");
    for (const product_shape & s : chosen) {
        const int64_t row_bytes = int64_t(s.K) / q8::K_ALIGN * q8::chunk_bytes(type);
        const size_t mat = size_t(s.M) * row_bytes;
        const int copies = std::max(2, int((size_t(1) << 30) / mat));  // ~1 GB of weights rotating
        uint8_t * w;
        CHECK_CUDA(cudaMalloc(&w, mat * copies * (s.gated ? 2 : 1)));
        {
            std::vector<uint8_t> host(mat);
            for (size_t i = 0; i < mat; ++i) host[i] = uint8_t(rng());
            const __half d = __float2half(0.01f);  // sane fp16 scales (random bytes may be inf/nan)
            for (size_t r = 0; r < size_t(s.M); ++r) {
                if (q6k) {
                    for (int b = 0; b < s.K / q8::K_ALIGN; ++b)  // d of each super-block (any layout: timing only)
                        std::memcpy(host.data() + r * row_bytes + b * q8::Q6K_BLOCK_BYTES + 208, &d, 2);
                    continue;
                }
                if (q4k || q5k) {
                    const int cb = q8::chunk_bytes(type);
                    for (int b = 0; b < s.K / q8::K_ALIGN; ++b) {  // d and dmin of each super-block
                        std::memcpy(host.data() + r * row_bytes + b * cb, &d, 2);
                        std::memcpy(host.data() + r * row_bytes + b * cb + 2, &d, 2);
                    }
                    continue;
                }
                for (int b = 0; b < s.K / 32; ++b) std::memcpy(host.data() + r * row_bytes + b * 34, &d, 2);
            }
            for (int c = 0; c < copies * (s.gated ? 2 : 1); ++c)
                CHECK_CUDA(cudaMemcpy(w + c * mat, host.data(), mat, cudaMemcpyHostToDevice));
        }
        float *x, *y, *norm_w;
        void * scratch;
        CHECK_CUDA(cudaMalloc(&x, size_t(64) * s.K * 4));
        CHECK_CUDA(cudaMalloc(&norm_w, size_t(s.K) * 4));
        {
            const std::vector<float> ones(s.K, 1.0f);
            CHECK_CUDA(cudaMemcpy(norm_w, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
        }
        CHECK_CUDA(cudaMalloc(&y, size_t(64) * s.M * 4));
        {
            q8::matmul_args biggest;  // the scratch grows with N
            biggest.type = type;
            biggest.gate = s.gated ? w : nullptr;
            biggest.K = s.K;
            biggest.M = s.M;
            biggest.N = 64;
            biggest.norm_w = norm ? norm_w : nullptr;
            CHECK_CUDA(cudaMalloc(&scratch, q8::scratch_bytes(biggest)));
        }
        {
            std::vector<float> hx(size_t(64) * s.K);
            std::normal_distribution<float> nd;
            for (auto & v : hx) v = nd(rng);
            CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        }
        for (int N : cols) {
            auto launch = [&](int c) {
                q8::matmul_args a;
                a.type = type;
                a.w = w + size_t(c) * mat * (s.gated ? 2 : 1);
                a.gate = s.gated ? a.w + mat : nullptr;
                a.row_bytes = row_bytes;
                a.K = s.K;
                a.M = s.M;
                a.tiled = tiled;
                a.N = N;
                a.x = x;
                a.x_stride = s.K;
                a.y = y;
                a.y_stride = s.M;
                a.norm_w = norm ? norm_w : nullptr;
                a.norm_eps = 1e-6f;
                CHECK_CUDA(q8::matmul(a, scratch, stream));
            };
            for (int c = 0; c < copies; ++c) launch(c);  // warm-up
            CHECK_CUDA(cudaDeviceSynchronize());
            const int reps = std::max(20, copies * 2);
            const double us = launch_us(stream, t0, t1, reps, graph, [&](int i) { launch(i % copies); });
            const double tbs = double(mat) * (s.gated ? 2 : 1) / (us * 1e-6) / 1e12;  // weight bytes read
            std::printf("%-40s %5d %10.1f %9.2f %7.0f%%\n", s.what, N, us, tbs, 100.0 * tbs / copy_tbs);
        }
        cudaFree(w);
        cudaFree(x);
        cudaFree(y);
        cudaFree(scratch);
        cudaFree(norm_w);
    }
    return 0;
}
