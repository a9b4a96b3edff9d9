// ggml's MUL_MAT operands -> the Q8_0 few-column matmul's arguments (see q8_0_ggml_args.h).
#include "q8_0_ggml_args.h"

#include <cstdint>
#include <initializer_list>

namespace lucebox::kernels::q8_0 {

bool kernel_weight_type(ggml_type t, bool tiled, weight_type & wt) {
    switch (t) {
        case GGML_TYPE_Q8_0: wt = weight_type::q8_0; return true;
        case GGML_TYPE_Q4_K: wt = weight_type::q4_k; return true;
        case GGML_TYPE_Q5_K: wt = weight_type::q5_k; return true;
        case GGML_TYPE_Q6_K: wt = weight_type::q6_k; return tiled;  // 210-byte chunks: row-tiled only
        default: return false;
    }
}

bool args_from_ggml(const ggml_tensor * w, const ggml_tensor * gate, int glu_op, const ggml_tensor * bias,
                    const ggml_tensor * x, const ggml_tensor * dst, matmul_args & a, const ggml_tensor * norm_w,
                    float norm_eps, bool tiled) {
    if (!kernel_weight_type(w->type, tiled, a.type) || x->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32) {
        return false;
    }
    // 2-D operands only: [K, M] weights with contiguous blocks, [K, N] activations, [M, N] result
    for (const ggml_tensor * t : {w, x, dst}) {
        if (t->ne[2] != 1 || t->ne[3] != 1) return false;
    }
    if (w->nb[0] != ggml_type_size(w->type) || x->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float)) {
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
    if (bias != nullptr) {  // the other operand of a fused ADD: F32 [M] (every column) or [M, N]
        if (bias->type != GGML_TYPE_F32 || bias->ne[0] != w->ne[1] || bias->nb[0] != sizeof(float) ||
            bias->ne[2] != 1 || bias->ne[3] != 1 || (bias->ne[1] != 1 && bias->ne[1] != x->ne[1]) ||
            bias->nb[1] % sizeof(float) != 0) {
            return false;
        }
    }
    if (norm_w != nullptr && (norm_w->type != GGML_TYPE_F32 || norm_w->ne[0] != w->ne[0] ||
                              ggml_nelements(norm_w) != norm_w->ne[0] || !ggml_is_contiguous(norm_w))) {
        return false;  // one weight per input row, the same for every column
    }
    // the quantization reads norm_w before it waits for the kernel before it (q8_0_matmul.cuh): a weight
    // or an input set before the graph runs, not a tensor the graph computes
    if (norm_w != nullptr && (norm_w->view_src != nullptr ? norm_w->view_src : norm_w)->op != GGML_OP_NONE) return false;
    if (w->ne[0] > INT32_MAX || w->ne[1] > INT32_MAX || x->ne[1] > INT32_MAX) return false;
    a.tiled = tiled;
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
    a.bias_stride = bias != nullptr && bias->ne[1] > 1 ? int64_t(bias->nb[1] / sizeof(float)) : 0;
    a.norm_w = norm_w != nullptr ? static_cast<const float *>(norm_w->data) : nullptr;
    a.norm_eps = norm_eps;
    if (!tiled && a.N > MAX_COLS) return false;  // ggml's MMQ or BF16 route
    return check_args(a) == nullptr;
}

}  // namespace lucebox::kernels::q8_0
