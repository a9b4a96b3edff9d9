#include "builders.h"

#include <cmath>
#include <cstdio>

#include "lucebox/errors.h"

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

namespace {

// stacked_products with input() called once a product for that product's input
template <class Input>
std::vector<ggml_tensor *> products_of_runs(ggml_context * ctx, const std::vector<ggml_tensor *> & w, const Input & input) {
    std::vector<ggml_tensor *> out(w.size());
    for (size_t i = 0; i < w.size();) {
        ggml_tensor * stack = w[i]->view_src;
        size_t j = i + 1;  // w[i..j) continue each other in one stack
        while (stack != nullptr && j < w.size() && w[j]->view_src == stack &&
               w[j]->view_offs == w[j - 1]->view_offs + ggml_nbytes(w[j - 1])) {
            ++j;
        }
        if (j == i + 1) {
            out[i] = ggml_mul_mat(ctx, w[i], input());
            ++i;
            continue;
        }
        int64_t rows = 0;
        for (size_t k = i; k < j; ++k) {
            rows += w[k]->ne[1];
        }
        ggml_tensor * W = w[i]->view_offs == 0 && rows == stack->ne[1]
                              ? stack
                              : ggml_view_2d(ctx, stack, stack->ne[0], rows, stack->nb[1], w[i]->view_offs);
        ggml_tensor * y = ggml_mul_mat(ctx, W, input());  // [rows, T]
        int64_t row = 0;
        for (size_t k = i; k < j; ++k) {
            out[k] = ggml_view_2d(ctx, y, w[k]->ne[1], y->ne[1], y->nb[1], size_t(row) * y->nb[0]);
            row += w[k]->ne[1];
        }
        i = j;
    }
    return out;
}

}  // namespace

std::vector<ggml_tensor *> stacked_products(ggml_context * ctx, const std::vector<ggml_tensor *> & w, ggml_tensor * x) {
    return products_of_runs(ctx, w, [x] { return x; });
}

std::vector<ggml_tensor *> stacked_products(ggml_context * ctx, const std::vector<ggml_tensor *> & w, const rms_normed & x) {
    return products_of_runs(ctx, w, [&] { return named(rms_norm(ctx, x.x, x.w, x.eps), x.name, x.layer); });
}

ggml_tensor * contiguous(ggml_context * ctx, ggml_tensor * x) { return ggml_is_contiguous(x) ? x : ggml_cont(ctx, x); }

ggml_tensor * cache_rows(ggml_context * ctx, ggml_tensor * x) {
    return ggml_view_2d(ctx, x, x->ne[0] * x->ne[1], x->ne[2], x->nb[2], 0);
}

bool cuda_conv_kernel(int64_t width) { return width == 3 || width == 4 || width == 5 || width == 9 || width == 15; }

ggml_tensor * ssm_conv(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, bool pad_to_kernel) {
    const int64_t width = w->ne[0];
    int64_t run = width;
    while (pad_to_kernel && run < 15 && !cuda_conv_kernel(run)) {
        ++run;
    }
    if (run > width) {
        const int pad = int(run - width);
        x = ggml_pad_ext(ctx, x, pad, 0, 0, 0, 0, 0, 0, 0);  // [run-1+T, channels, S]
        w = ggml_pad_ext(ctx, w, pad, 0, 0, 0, 0, 0, 0, 0);  // [run, channels]
    }
    return ggml_ssm_conv(ctx, x, w);
}

ggml_tensor * copy_by_kernel(ggml_context * ctx, ggml_tensor * src, ggml_tensor * dst) {
    if (dst->ne[3] != 1) {
        throw error("internal: copy_by_kernel needs a destination of at most 3 dimensions");
    }
    if (src->nb[1] == ggml_element_size(src) && !ggml_is_contiguous(dst)) {
        // CUDA's copy takes such a source (a column [1, n], or a transposed view) for a transposed
        // matrix and runs a kernel that writes the destination as if it were contiguous: flattened,
        // the source goes to the general kernel, which keeps the destination's strides
        if (!ggml_is_contiguous(src)) {
            throw error("internal: copy_by_kernel of a transposed view into a strided destination");
        }
        src = ggml_reshape_1d(ctx, src, ggml_nelements(src));
    }
    ggml_tensor * d4 = ggml_view_4d(ctx, dst, dst->ne[0], 1, dst->ne[1], dst->ne[2], dst->nb[1], dst->nb[1], dst->nb[2], 0);
    return ggml_cpy(ctx, src, d4);
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
