// ggml's MUL_MAT operands -> the arguments of the Q8_0 few-column matmul (q8_0_matmul_args.h), for
// the MUL_MAT hook of ggml patch 0003. Plain C++ (no CUDA) so CPU tests check what it takes.
#pragma once

#include "ggml.h"
#include "q8_0_matmul_args.h"

namespace lucebox::kernels::q8_0 {

// The kernel's format of ggml weights of type t (false: it reads no such weights); tiled: in the
// row-tiled layout (weight_tiles.h). The one place that says which ggml types the kernel reads:
// for the products it takes and for the weights tensor_store tiles.
bool kernel_weight_type(ggml_type t, bool tiled, weight_type & wt);

// Fills `a` and returns true when the kernel takes the product dst = w x (+ bias), or with gate,
// dst = (w x) * silu(gate x): Q8_0 or Q4_K weights [K, M] with whole blocks per row, F32 activations
// [K, N] and result [M, N] (2-D, contiguous rows, any row strides), gate of w's type and strides
// with glu_op GGML_GLU_OP_SWIGLU, bias (the other operand of a fused residual ADD, not with a
// gate) F32 [M] added to every column or [M, N] with contiguous rows (may be dst itself), and
// check_args satisfied (K % 256, N <= 64, 16-byte alignment). With norm_w (F32 [K], contiguous),
// the product's input is ggml_mul(ggml_rms_norm(x, norm_eps), norm_w), normalized inside the
// product. False otherwise: ggml's kernels run. any_n: more than 64 columns too (row-tiled weights,
// which only lucebox's kernel reads; it runs them 64 columns at a time).
bool args_from_ggml(const ggml_tensor * w, const ggml_tensor * gate, int glu_op, const ggml_tensor * bias,
                    const ggml_tensor * x, const ggml_tensor * dst, matmul_args & a,
                    const ggml_tensor * norm_w = nullptr, float norm_eps = 0.0f, bool any_n = false);

}  // namespace lucebox::kernels::q8_0
