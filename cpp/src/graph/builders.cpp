#include "builders.h"

#include <cmath>
#include <cstdio>

namespace lucebox::graph {

ggml_tensor * named(ggml_tensor * t, const char * name, int layer) {
    if (layer >= 0) {
        ggml_format_name(t, "%s-%d", name, layer);
    } else {
        ggml_set_name(t, name);
    }
    return t;
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    ggml_tensor * y = ggml_rms_norm(ctx, x, eps);
    return w != nullptr ? ggml_mul(ctx, y, w) : y;
}

ggml_tensor * l2_norm(ggml_context * ctx, ggml_tensor * x, float eps) {
    const float n = static_cast<float>(x->ne[0]);
    // rms_norm(x, eps/n) / sqrt(n) == x / sqrt(sum(x^2) + eps)
    return ggml_scale(ctx, ggml_rms_norm(ctx, x, eps / n), 1.0f / std::sqrt(n));
}

ggml_tensor * swiglu_ffn(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w_gate, ggml_tensor * w_up,
                         ggml_tensor * w_down, int layer) {
    ggml_tensor * gate = named(ggml_mul_mat(ctx, w_gate, x), "ffn_gate", layer);
    ggml_tensor * up = named(ggml_mul_mat(ctx, w_up, x), "ffn_up", layer);
    ggml_tensor * act = named(ggml_swiglu_split(ctx, gate, up), "ffn_act", layer);
    return named(ggml_mul_mat(ctx, w_down, act), "ffn_out", layer);
}

size_t graph_meta_bytes() {
    return ggml_tensor_overhead() * MAX_GRAPH_NODES + ggml_graph_overhead_custom(MAX_GRAPH_NODES, false);
}

void forget_allocation(ggml_context * ctx) {
    for (ggml_tensor * t = ctx ? ggml_get_first_tensor(ctx) : nullptr; t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
        t->data = nullptr;
        t->buffer = nullptr;
    }
}

}  // namespace lucebox::graph
