// Speed of lucebox's fused gated attention kernels (cpp/kernels/attention_step.cuh) on the
// Qwen3.6-27B attention shape (24 query heads, 4 KV heads of 256, F16 cache) for decode and verify
// token counts and cache depths: us per layer (attend + combine), and the K/V bytes read per second.
// Correctness is tests/cpp/test_attention_step.cpp; this only times (random values, causal mask).
// The kernel column: "mma" where a verify takes the tensor-core kernel (compute capability >= 8.0),
// "cores" for the CUDA-core kernels (a decode step, older devices).
// Standalone (no ggml); on the GPU machine:
//     nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icpp/kernels -Itests/cpp \
//          -o /tmp/attn bench/probes/attention_bench.cu && /tmp/attn [--graph]
// --graph: 16 launches (16 layers' caches) captured into one CUDA graph, as ggml runs a step.
#include "attention_step.cuh"
#include "cuda_check.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace cs = lucebox::kernels::attention::cuda_step;

int main(int argc, char ** argv) {
    const bool graph = argc > 1 && std::strcmp(argv[1], "--graph") == 0;
    constexpr int HD = 256, H = 24, HKV = 4, LAYERS = 16, MAX_KV = 8192, MAX_T = 64;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const size_t cache = size_t(MAX_KV) * HKV * HD;  // halves a layer
    std::vector<__half> hc(cache);
    for (auto & v : hc) v = __float2half(nd(rng));
    __half *k, *v, *mask;
    float *q, *gate, *out;
    CHECK_CUDA(cudaMalloc(&k, cache * 2 * LAYERS));
    CHECK_CUDA(cudaMalloc(&v, cache * 2 * LAYERS));
    for (int l = 0; l < LAYERS; ++l) {
        CHECK_CUDA(cudaMemcpy(k + l * cache, hc.data(), cache * 2, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(v + l * cache, hc.data(), cache * 2, cudaMemcpyHostToDevice));
    }
    CHECK_CUDA(cudaMalloc(&mask, size_t(MAX_T) * MAX_KV * 2));
    CHECK_CUDA(cudaMalloc(&q, size_t(MAX_T) * H * HD * 4));
    CHECK_CUDA(cudaMalloc(&gate, size_t(MAX_T) * H * HD * 4));
    const int64_t most_partial = lucebox::kernels::attention::partial_floats(HD, H, MAX_T, MAX_KV);
    CHECK_CUDA(cudaMalloc(&out, (size_t(MAX_T) * H * HD + most_partial) * 4));
    {
        std::vector<float> hq(size_t(MAX_T) * H * HD);
        for (auto & x : hq) x = nd(rng);
        CHECK_CUDA(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(gate, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    }
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    int dev = 0;
    CHECK_CUDA(cudaGetDevice(&dev));
    std::printf("%6s %6s %8s %7s %10s %9s\n", "T", "n_kv", "splits", "kernel", "us/layer", "KV TB/s");
    for (int T : {1, 2, 16, 64})
        for (int n_kv : {64, 256, 512, 1024, 2048, 4096, 8192}) {
            {  // causal: token t sees keys <= n_kv - T + t
                std::vector<__half> hm(size_t(T) * n_kv);
                for (int t = 0; t < T; ++t)
                    for (int j = 0; j < n_kv; ++j) hm[size_t(t) * n_kv + j] = __float2half(j <= n_kv - T + t ? 0.0f : -INFINITY);
                CHECK_CUDA(cudaMemcpy(mask, hm.data(), hm.size() * 2, cudaMemcpyHostToDevice));
            }
            auto launch = [&](int l) {
                cs::gated_args a;
                a.q = q, a.q_head = HD, a.q_token = int64_t(H) * HD;
                a.k = k + l * cache, a.v = v + l * cache, a.k_row = a.v_row = int64_t(HKV) * HD;
                a.mask = mask, a.mask_row = n_kv;
                a.gate = gate, a.gate_head = HD, a.gate_token = int64_t(H) * HD;
                a.out = out, a.out_token = int64_t(H) * HD;
                a.partial = out + size_t(T) * H * HD;
                a.hd = HD, a.H = H, a.Hkv = HKV, a.T = T, a.n_kv = n_kv, a.scale = 0.0625f;
                CHECK_CUDA(cs::run_gated(a, stream));
            };
            for (int l = 0; l < LAYERS; ++l) launch(l);  // warm-up
            CHECK_CUDA(cudaStreamSynchronize(stream));
            cudaGraphExec_t exec = nullptr;
            if (graph) {
                cudaGraph_t g;
                CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
                for (int l = 0; l < LAYERS; ++l) launch(l);
                CHECK_CUDA(cudaStreamEndCapture(stream, &g));
                CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
                CHECK_CUDA(cudaGraphDestroy(g));
                CHECK_CUDA(cudaGraphLaunch(exec, stream));
                CHECK_CUDA(cudaStreamSynchronize(stream));
            }
            constexpr int REPS = 10;
            CHECK_CUDA(cudaEventRecord(t0, stream));
            for (int r = 0; r < REPS; ++r) {
                if (graph) CHECK_CUDA(cudaGraphLaunch(exec, stream));
                else
                    for (int l = 0; l < LAYERS; ++l) launch(l);
            }
            CHECK_CUDA(cudaEventRecord(t1, stream));
            CHECK_CUDA(cudaEventSynchronize(t1));
            if (exec != nullptr) CHECK_CUDA(cudaGraphExecDestroy(exec));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
            const double us = 1e3 * ms / (REPS * LAYERS);
            int chunk = 0, splits = 0;
            lucebox::kernels::attention::split_of(n_kv, chunk, splits);
            const double bytes = 2.0 * n_kv * HKV * HD * 2;  // K and V read once
            std::printf("%6d %6d %8d %7s %10.2f %9.2f\n", T, n_kv, splits, cs::takes_mma<HD>(T, dev) ? "mma" : "cores", us,
                        bytes / (us * 1e-6) / 1e12);
        }
    return 0;
}
