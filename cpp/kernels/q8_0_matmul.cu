// The MUL_MAT hook (ggml patch 0003) that hands ggml's Q8_0 and Q4_K products of 1..64 columns to
// q8_0_matmul.cuh: plain MUL_MAT nodes; gate/up + SWIGLU on one input; a product and the residual
// ADD that follows it; and a product (or gate/up pair) whose input is an RMS norm times a weight
// vector, normalized inside the product. Everything else (other types, shapes the kernel refuses,
// batched or permuted operands, other GLU ops, a bias with a GLU) returns 0 and stays with ggml.
// Also sets the column count from which ggml runs quantized products as BF16 GEMMs (patch 0004),
// and converts their Q8_0 / Q4_K / Q6_K weights to BF16 for them (bf16_dequant.cuh).
#include "cuda_kernels.h"

#include <atomic>

#include "ggml-cuda.h"
#include "ggml.h"
#include "bf16_dequant.cuh"
#include "q8_0_ggml_args.h"
#include "q8_0_matmul.cuh"

namespace lucebox::kernels {
namespace {

std::atomic<bool> g_enabled{true};

// Quantized products of at least this many columns (prefill micro-batches) run as BF16 cuBLAS GEMMs
// on dequantized weights (ggml patch 0004) instead of ggml's MMQ; products of 1..64 columns are the
// hook's. H200, 27B Q8_0, bench/probes/prefill_gemm_sweep.py: BF16 / MMQ prefill 0.61x at 128-token
// micro-batches, 0.98x at 256, 1.32x at 512 (the weights' dequantization is paid per micro-batch).
constexpr int64_t k_bf16_gemm_min_cols = 256;

}  // namespace

// mma.m16n8k32 and cp.async need compute capability 8.0 (this runs for every MUL_MAT node ggml
// dispatches: the answer is cached per device).
bool device_runs_own_kernels() {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess && q8_0::detail::device_major(dev) >= 8;
}

namespace {

size_t mul_mat_hook(const ggml_tensor * w, const ggml_tensor * gate, int glu_op, const ggml_tensor * bias,
                    const ggml_tensor * x, const ggml_tensor * norm_w, float norm_eps, ggml_tensor * dst,
                    void * scratch, void * stream) {
    if (!g_enabled.load(std::memory_order_relaxed)) return 0;
    q8_0::matmul_args a;
    if (!q8_0::args_from_ggml(w, gate, glu_op, bias, x, dst, a, norm_w, norm_eps)) return 0;
    if (scratch == nullptr) return device_runs_own_kernels() ? q8_0::scratch_bytes(a) : 0;
    const cudaError_t err = q8_0::matmul(a, scratch, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
        // ggml's own error path: it names the error and aborts, as for its kernels' launch failures
        GGML_ABORT("lucebox q8_0 matmul (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    }
    return 1;
}

// Patch 0004's converter: Q8_0, Q4_K and Q6_K weights (contiguous, checked by the patch) to BF16
// with bf16_dequant.cuh; other types stay with ggml's converter.
int bf16_converter(const ggml_tensor * w, void * dst, void * stream) {
    if (!g_enabled.load(std::memory_order_relaxed)) return 0;
    bf16_dequant::format f;
    switch (w->type) {
        case GGML_TYPE_Q8_0: f = bf16_dequant::format::q8_0; break;
        case GGML_TYPE_Q4_K: f = bf16_dequant::format::q4_k; break;
        case GGML_TYPE_Q6_K: f = bf16_dequant::format::q6_k; break;
        default: return 0;
    }
    const cudaError_t err = bf16_dequant::dequantize(f, w->data, ggml_nelements(w), static_cast<__nv_bfloat16 *>(dst),
                                                     static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) GGML_ABORT("lucebox bf16 dequantization (%s): %s", ggml_get_name(w), cudaGetErrorString(err));
    return 1;
}

}  // namespace

void install_cuda_kernels() {
    static std::atomic<bool> installed{false};
    if (installed.exchange(true)) return;
    ggml_backend_cuda_set_mul_mat_hook(&mul_mat_hook);
    ggml_backend_cuda_set_bf16_converter(&bf16_converter);
    install_gdn_prefill();
    set_cuda_kernels_enabled(g_enabled.load());  // and the BF16 GEMM threshold that goes with it
}

void set_cuda_kernels_enabled(bool enabled) {
    g_enabled.store(enabled);
    set_gdn_prefill_enabled(enabled);
    ggml_backend_cuda_set_bf16_gemm_min_cols(enabled ? k_bf16_gemm_min_cols : 0);
}

void set_bf16_gemm_min_cols(int64_t n) { ggml_backend_cuda_set_bf16_gemm_min_cols(n); }

}  // namespace lucebox::kernels
