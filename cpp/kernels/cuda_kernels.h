// lucebox's own CUDA kernels inside ggml's CUDA backend (through ggml patch 0003's MUL_MAT hook):
// Q8_0 products of 1..64 activation columns, plain, fused gate/up SwiGLU and fused residual ADD
// (q8_0_matmul.cuh).
// In a build without CUDA these do nothing.
#pragma once

namespace lucebox::kernels {

// Routes the products the kernels take to them from now on, in every CUDA backend of the process.
// Idempotent and thread-safe; called before a device is first used (placement.cpp).
void install_cuda_kernels();

// Whether installed kernels take products (default: yes). Off: ggml's own kernels run everything,
// for A/B benchmarks and tests; takes effect at the next graph computed (a CUDA graph captured
// before keeps the kernels it captured until ggml captures again).
void set_cuda_kernels_enabled(bool enabled);

}  // namespace lucebox::kernels
