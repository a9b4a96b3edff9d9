// What a step's attention-mask upload costs on the GPU machine: ggml_backend_tensor_set on a CUDA
// buffer is a cudaMemcpyAsync on the per-thread stream, then a synchronize of that stream. This times
// exactly that for the mask sizes of a 16-row verify ([n_kv, 16] F16: 1 MB at 32768 keys, the
// DFlash draft's block mask is the same size) and of a decode step ([n_kv, 1]), from pageable memory
// (a std::vector, what set_qwen35_inputs and dflash_block_mask hand over now) and from pinned memory
// (cudaMallocHost, what a host buffer type of ggml's CUDA backend would give). The host's writing of
// the mask is bench/probes/mask_staging.cpp. Standalone (no ggml); on the GPU machine:
//     nvcc -O3 -std=c++17 -Itests/cpp -o /tmp/mask_upload bench/probes/mask_upload.cu && /tmp/mask_upload
#include "cuda_check.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int REPS = 200;

// us per upload of `bytes` from src into dst, as ggml_backend_tensor_set does it
double us_per_upload(void * dst, const void * src, size_t bytes) {
    for (int w = 0; w < 5; ++w) {
        CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
        CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < REPS; ++r) {
        CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
        CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    }
    return 1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / REPS;
}

}  // namespace

int main() {
    const uint32_t keys[] = {4096, 32768, 131072};
    const size_t most = size_t(131072) * 16 * 2;
    void * dst = nullptr;
    void * pinned = nullptr;
    CHECK_CUDA(cudaMalloc(&dst, most));
    CHECK_CUDA(cudaMallocHost(&pinned, most));
    std::vector<uint16_t> pageable(most / 2, 0xFC00);  // F16 -inf, as a mask mostly is past the queries
    std::fill_n(static_cast<uint16_t *>(pinned), most / 2, uint16_t(0xFC00));
    std::printf("%8s %5s %10s %14s %12s\n", "keys", "rows", "bytes", "pageable us", "pinned us");
    for (uint32_t n_kv : keys) {
        for (uint32_t rows : {1u, 16u}) {
            const size_t bytes = size_t(n_kv) * rows * 2;
            const double pg = us_per_upload(dst, pageable.data(), bytes), pn = us_per_upload(dst, pinned, bytes);
            std::printf("%8u %5u %10zu %14.1f %12.1f\n", n_kv, rows, bytes, pg, pn);
        }
    }
    CHECK_CUDA(cudaFreeHost(pinned));
    CHECK_CUDA(cudaFree(dst));
    return 0;
}
