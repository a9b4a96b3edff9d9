// The MUL_MAT hook (ggml patch 0003) that hands ggml's Q8_0 products of 1..64 columns to
// q8_0_matmul.cuh: plain MUL_MAT nodes, and the products ggml's CUDA backend fuses for one column
// (gate/up + SWIGLU; + a following ADD, the residual of a decode step). Everything else (other
// types, shapes the kernel refuses, batched or permuted operands, other GLU ops, a bias with a
// GLU) returns 0 and stays with ggml.
#include "cuda_kernels.h"

#include <atomic>

#include "ggml-cuda.h"
#include "ggml.h"
#include "q8_0_matmul.cuh"

namespace lucebox::kernels {
namespace {

std::atomic<bool> g_enabled{true};

// The kernel's arguments for this product, or false when the kernel does not take it.
bool q8_0_args(const ggml_tensor * w, const ggml_tensor * gate, int glu_op, const ggml_tensor * bias,
               const ggml_tensor * x, const ggml_tensor * dst, q8_0::matmul_args & a) {
    if (w->type != GGML_TYPE_Q8_0 || x->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32) return false;
    // 2-D operands only: [K, M] weights with contiguous blocks, [K, N] activations, [M, N] result
    for (const ggml_tensor * t : {w, x, dst}) {
        if (t->ne[2] != 1 || t->ne[3] != 1) return false;
    }
    if (w->nb[0] != ggml_type_size(GGML_TYPE_Q8_0) || x->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float)) {
        return false;
    }
    if (x->ne[0] != w->ne[0] || dst->ne[0] != w->ne[1] || dst->ne[1] != x->ne[1]) return false;
    if (x->nb[1] % sizeof(float) != 0 || dst->nb[1] % sizeof(float) != 0) return false;
    if (gate != nullptr) {
        if (glu_op != GGML_GLU_OP_SWIGLU || gate->type != w->type) return false;
        for (int d = 0; d < 4; ++d) {
            if (gate->ne[d] != w->ne[d] || gate->nb[d] != w->nb[d]) return false;
        }
    }
    if (bias != nullptr) {  // F32 [M], contiguous, one column (ggml fuses the ADD for one column only)
        if (bias->type != GGML_TYPE_F32 || bias->ne[0] != w->ne[1] || ggml_nelements(bias) != w->ne[1] ||
            !ggml_is_contiguous(bias) || x->ne[1] != 1) {
            return false;
        }
    }
    if (w->ne[0] > INT32_MAX || w->ne[1] > INT32_MAX || x->ne[1] > INT32_MAX) return false;
    a.w = static_cast<const uint8_t *>(w->data);
    a.gate = gate != nullptr ? static_cast<const uint8_t *>(gate->data) : nullptr;
    a.row_bytes = int64_t(w->nb[1]);
    a.K = int(w->ne[0]);
    a.M = int(w->ne[1]);
    a.N = int(x->ne[1]);
    a.x = static_cast<const float *>(x->data);
    a.x_stride = int64_t(x->nb[1] / sizeof(float));
    a.y = static_cast<float *>(dst->data);
    a.y_stride = int64_t(dst->nb[1] / sizeof(float));
    a.bias = bias != nullptr ? static_cast<const float *>(bias->data) : nullptr;
    return q8_0::check_args(a) == nullptr;
}

size_t mul_mat_hook(const ggml_tensor * w, const ggml_tensor * gate, int glu_op, const ggml_tensor * bias,
                    const ggml_tensor * x, ggml_tensor * dst, void * scratch, void * stream) {
    if (!g_enabled.load(std::memory_order_relaxed)) return 0;
    q8_0::matmul_args a;
    if (!q8_0_args(w, gate, glu_op, bias, x, dst, a)) return 0;
    if (scratch == nullptr) {
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 8) {
            return 0;  // mma.m16n8k32 needs compute capability 8.0
        }
        return q8_0::scratch_bytes(a);
    }
    const cudaError_t err = q8_0::matmul(a, scratch, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
        // ggml's own error path: it names the error and aborts, as for its kernels' launch failures
        GGML_ABORT("lucebox q8_0 matmul (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    }
    return 1;
}

}  // namespace

void install_cuda_kernels() {
    static std::atomic<bool> installed{false};
    if (!installed.exchange(true)) ggml_backend_cuda_set_mul_mat_hook(&mul_mat_hook);
}

void set_cuda_kernels_enabled(bool enabled) { g_enabled.store(enabled); }
bool cuda_kernels_enabled() { return g_enabled.load(); }

}  // namespace lucebox::kernels
