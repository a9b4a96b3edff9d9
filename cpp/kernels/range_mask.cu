// The range mask node (range_mask.h) on CUDA: each thread writes 8 keys of a row (one 16-byte store
// where rows are whole 16-byte vectors), 0 inside the row's range (and, for a tree, at its ancestors'
// keys after it) and -inf elsewhere, the bits of range_mask::fill.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda_kernels.h"
#include "ggml.h"
#include "range_mask.h"

namespace lucebox::kernels {
namespace {

std::atomic<uint64_t> g_mask_runs{0};

constexpr int THREADS = 256, KEYS = 8;  // keys a thread writes

// grid: x over the keys (THREADS * KEYS a block), y over the rows (and on by gridDim.y past 65535)
template <bool VEC>
__global__ void range_mask_kernel(const int32_t * __restrict__ ranges, const int32_t * __restrict__ parents, int64_t n_kv,
                                  int64_t T, __half * __restrict__ out) {
    const __half zero = __float2half(0.0f), hidden = __ushort_as_half(0xFC00u);  // -inf
    const int64_t k0 = (int64_t(blockIdx.x) * THREADS + threadIdx.x) * KEYS;
    if (k0 >= n_kv) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const int64_t lo = min(max(int64_t(ranges[2 * t]), int64_t(0)), n_kv);
        const int64_t hi = min(max(int64_t(ranges[2 * t + 1]), lo), n_kv);
        __half v[KEYS];
#pragma unroll
        for (int i = 0; i < KEYS; ++i) {
            const int64_t k = k0 + i;
            const bool tree_key = parents != nullptr && k >= hi && k < hi + T && range_mask::on_path(parents, T, t, k - hi);
            v[i] = (k >= lo && k < hi) || tree_key ? zero : hidden;
        }
        __half * row = out + t * n_kv;
        if constexpr (VEC) {  // n_kv % 8 == 0: a whole 16-byte vector
            *reinterpret_cast<uint4 *>(row + k0) = *reinterpret_cast<const uint4 *>(v);
        } else {
#pragma unroll
            for (int i = 0; i < KEYS; ++i)
                if (k0 + i < n_kv) row[k0 + i] = v[i];
        }
    }
}

}  // namespace

int range_mask_node(const ggml_tensor * dst, void * stream) {
    if (!range_mask::is_range_mask(dst)) return 0;
    if (stream == nullptr) return 1;  // supports_op
    const int64_t n_kv = dst->ne[0], T = dst->ne[1];
    const dim3 grid(unsigned((n_kv + THREADS * KEYS - 1) / (THREADS * KEYS)), unsigned(T < 65535 ? T : 65535));
    const auto * ranges = static_cast<const int32_t *>(dst->src[0]->data);
    const auto * parents = dst->src[1] != nullptr ? static_cast<const int32_t *>(dst->src[1]->data) : nullptr;
    auto * out = static_cast<__half *>(dst->data);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (n_kv % KEYS == 0) range_mask_kernel<true><<<grid, THREADS, 0, s>>>(ranges, parents, n_kv, T, out);
    else range_mask_kernel<false><<<grid, THREADS, 0, s>>>(ranges, parents, n_kv, T, out);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) GGML_ABORT("lucebox range mask (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    g_mask_runs.fetch_add(1, std::memory_order_relaxed);
    return 1;
}

uint64_t range_mask_runs() { return g_mask_runs.load(); }

}  // namespace lucebox::kernels
