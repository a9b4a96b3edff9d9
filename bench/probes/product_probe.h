// What the product probes (q8_0_matmul_bench.cu; bf16x_probe.cu on branch wip/bf16x) share: the Qwen3.6-27B product shapes they
// time (K -> M, gated: the fused gate/up pair, two weights of M rows; `what`: the name ab_sums.py keys a shape's
// times by), and the timing of `reps` back-to-back launches, as stream launches or as one captured CUDA graph
// (as ggml runs a step), and a product's arguments in the probes' dense layout.
#pragma once

#include "cuda_check.h"
#include "q8_0_matmul_args.h"

#include <cuda_runtime.h>

namespace lucebox::probes {

struct product_shape {
    int K, M;
    bool gated;
    const char * what;
};

inline constexpr product_shape qwen36_27b_shapes[] = {{5120, 17408, true, "ffn gate+up fused (5120 -> 2x17408)"},
                                                      {5120, 17408, false, "ffn_up alone (5120 -> 17408)"},
                                                      {17408, 5120, false, "ffn_down (17408 -> 5120)"},
                                                      {5120, 16480, false, "DeltaNet stack qkv+z+b+a (5120 -> 16480)"},
                                                      {5120, 14336, false, "attention stack q+k+v (5120 -> 14336)"},
                                                      {5120, 10240, false, "DeltaNet attn_qkv (5120 -> 10240)"},
                                                      {5120, 6144, false, "DeltaNet attn_gate (5120 -> 6144)"},
                                                      {6144, 5120, false, "ssm_out / attn_output (6144 -> 5120)"},
                                                      {5120, 1024, false, "attn_k / attn_v (5120 -> 1024)"}};

// The arguments of shape s's product at N columns on x [N][K] (dense), into y [N][M] (dense); norm_w: the RMS
// norm's K weights (eps 1e-6) or null. w and gate are the caller's to set (its copies' layout).
inline kernels::q8_0::matmul_args shape_args(kernels::q8_0::weight_type type, const product_shape & s,
                                             int64_t row_bytes, bool tiled, int N, const float * x, float * y,
                                             const float * norm_w) {
    kernels::q8_0::matmul_args a;
    a.type = type;
    a.row_bytes = row_bytes;
    a.tiled = tiled;
    a.K = s.K;
    a.M = s.M;
    a.N = N;
    a.x = x;
    a.x_stride = s.K;
    a.y = y;
    a.y_stride = s.M;
    a.norm_w = norm_w;
    a.norm_eps = 1e-6f;
    return a;
}

// Microseconds a launch: launch(i) for i = 0..reps-1 on `stream`, timed by the events t0, t1; graph: captured
// into one CUDA graph first, which is launched once untimed (warm-up) and once timed.
template <typename Launch>
double launch_us(cudaStream_t stream, cudaEvent_t t0, cudaEvent_t t1, int reps, bool graph, Launch launch) {
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
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    return 1e3 * ms / reps;
}

}  // namespace lucebox::probes
