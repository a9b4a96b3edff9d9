// The fused DeltaNet step ops (delta_net_step.h): graph nodes and the CPU reference.
#include "delta_net_step.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "custom_op.h"
#include "lucebox/errors.h"

namespace lucebox::kernels::delta_net {
namespace {

std::atomic<uint64_t> g_cpu_runs{0};

// the node's own parameters (custom_op.h)
void set_params(ggml_tensor * t, const step_params & p) { custom_op::write_params(t, &p, sizeof p); }

void require(bool ok, const char * op, const std::string & what) {
    if (!ok) throw error(std::string("internal: delta_net::") + op + ": " + what);
}

bool rows_f32(const ggml_tensor * t) { return t != nullptr && t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float); }

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

const float * col(const ggml_tensor * t, int64_t j) {
    return reinterpret_cast<const float *>(static_cast<const char *>(t->data) + j * t->nb[1]);
}

}  // namespace

uint64_t cpu_runs() { return g_cpu_runs.load(); }

step_params params_of(const ggml_tensor * dst) {
    step_params p;
    custom_op::read_params(dst, &p, sizeof p);
    return p;
}

int op_of(const ggml_tensor * node) {
    const ggml_custom_op_t fun = custom_op::function_of(node);
    return fun == &inputs_cpu ? 1 : fun == &recurrence_cpu ? 2 : fun == &replay_layers_cpu ? 3 : 0;
}

shape shape_of(const ggml_tensor * dst) {
    shape s;
    s.Hk = params_of(dst).n_k_heads;
    s.key_dim = s.Hk * HEAD;
    if (op_of(dst) == 1) {
        s.T = input_operand(dst, 0)->ne[1];
        s.conv_dim = input_operand(dst, 0)->ne[0];
        s.Hv = input_operand(dst, 1)->ne[0];
        s.d_conv = input_operand(dst, 4)->ne[0];
    } else {
        s.T = params_of(dst).n_tokens;
        s.Hv = op_of(dst) == 3 ? params_of(dst).n_v_heads : dst->src[2]->ne[1];
        s.d_conv = op_of(dst) == 3 ? params_of(dst).d_conv : 0;
        s.conv_dim = (2 * s.Hk + s.Hv) * HEAD;
    }
    return s;
}

ggml_tensor * input_operand(const ggml_tensor * dst, int i) { return dst->src[i + params_of(dst).kept]; }

ggml_tensor * inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * beta, ggml_tensor * alpha,
                     ggml_tensor * conv_state, ggml_tensor * conv_w, ggml_tensor * dt_bias, ggml_tensor * a,
                     ggml_tensor * conv_dst, int64_t n_k_heads, int64_t window_from, float eps, ggml_tensor * keep,
                     ggml_tensor * tree_rows) {
    const char * op = "inputs";
    const int64_t T = qkv->ne[1], conv_dim = qkv->ne[0], Hv = beta->ne[0], d_conv = conv_w->ne[0];
    require(conv_dst != nullptr || tree_rows != nullptr, op, "a conv destination (only a tree's may be null)");
    auto matrix = [](const ggml_tensor * t) { return rows_f32(t) && t->ne[2] == 1 && t->ne[3] == 1; };
    for (const ggml_tensor * t : {qkv, beta, alpha, conv_state, conv_w, dt_bias, a})
        require(matrix(t), op, "F32 tensors of 2 dimensions with contiguous rows");
    require(conv_dst == nullptr || matrix(conv_dst), op, "F32 tensors of 2 dimensions with contiguous rows");
    require(tree_rows == nullptr || (tree_rows->type == GGML_TYPE_I32 && ggml_nelements(tree_rows) == d_conv * T &&
                                     ggml_is_contiguous(tree_rows) && keep == nullptr),
            op, "tree_rows I32 [d_conv T], contiguous (and no keep)");
    require(n_k_heads > 0 && conv_dim == (2 * n_k_heads + Hv) * HEAD, op, "conv channels = (2 Hk + Hv) heads of 128");
    require(alpha->ne[0] == Hv && beta->ne[1] == T && alpha->ne[1] == T, op, "beta and alpha [Hv, T]");
    require(d_conv >= 2 && d_conv <= MAX_D_CONV && conv_w->ne[1] == conv_dim && ggml_is_contiguous(conv_w), op,
            "conv weight [d_conv, conv_dim], 2 <= d_conv <= MAX_D_CONV");
    require(conv_state->ne[0] == d_conv - 1 && conv_state->ne[1] == conv_dim && ggml_is_contiguous(conv_state), op,
            "conv state [d_conv-1, conv_dim]");
    require(ggml_nelements(dt_bias) == Hv && ggml_nelements(a) == Hv, op, "dt_bias and a of Hv values");
    require(conv_dst == nullptr || (window_from >= 0 && window_from <= T && conv_dst->ne[1] == conv_dim &&
                                    conv_dst->ne[0] >= d_conv - 1 + T - window_from),
            op, "the conv destination's rows hold the window from window_from");
    const int64_t n_out = (conv_dim + 2 * Hv) * T;
    require(keep == nullptr || (keep->type == GGML_TYPE_F32 && ggml_nelements(keep) == n_out && ggml_is_contiguous(keep)),
            op, "keep: a contiguous F32 tensor of (conv_dim + 2 Hv) T values");
    ggml_tensor * srcs[9] = {qkv, beta, alpha, conv_state, conv_w, dt_bias, a, conv_dst, tree_rows};
    const int n_srcs = tree_rows != nullptr ? 9 : 8;
    ggml_tensor * out = keep != nullptr  // (ggml_custom_inplace makes keep src[0])
                            ? ggml_custom_inplace(ctx, keep, srcs, n_srcs, &inputs_cpu, GGML_N_TASKS_MAX, nullptr)
                            : ggml_custom_4d(ctx, GGML_TYPE_F32, n_out, 1, 1, 1, srcs, n_srcs, &inputs_cpu,
                                             GGML_N_TASKS_MAX, nullptr);
    step_params p;
    p.n_k_heads = static_cast<int32_t>(n_k_heads);
    p.window_from = static_cast<int32_t>(window_from);
    p.kept = keep != nullptr ? 1 : 0;
    p.eps = eps;
    set_params(out, p);
    return out;
}

ggml_tensor * recurrence(ggml_context * ctx, ggml_tensor * x, int64_t x_tokens, ggml_tensor * z, ggml_tensor * s0,
                         ggml_tensor * norm_w, ggml_tensor * state_dst, int64_t n_k_heads, state_out mode, float eps,
                         ggml_tensor * parents) {
    const char * op = "recurrence";
    require(z != nullptr && norm_w != nullptr, op, "z and norm_w");
    for (const ggml_tensor * t : {x, s0, state_dst, z, norm_w})
        require(rows_f32(t) && t->ne[2] == 1 && t->ne[3] == 1, op, "F32 tensors of 2 dimensions with contiguous rows");
    const int64_t Hv = s0->ne[1], T = z->ne[1];
    require(T >= 1 && x_tokens >= T, op, "x_tokens >= T >= 1");
    require(n_k_heads > 0 && Hv % n_k_heads == 0 && x->ne[0] == ((2 * n_k_heads + Hv) * HEAD + 2 * Hv) * x_tokens &&
                ggml_is_contiguous(x),
            op, "x: the inputs op's result for x_tokens tokens");
    require(z->ne[0] == Hv * HEAD, op, "z [Hv HEAD, T]");
    require(s0->ne[0] == HEAD * HEAD && ggml_is_contiguous(s0), op, "s0 [HEAD HEAD, Hv] contiguous");
    require(ggml_nelements(norm_w) == HEAD && ggml_is_contiguous(norm_w), op, "norm_w of HEAD values");
    require(state_dst->ne[0] == HEAD * HEAD * Hv && state_dst->ne[1] >= (mode == state_out::every_state ? T : 1), op,
            "state destination [HEAD HEAD Hv, slots]");
    require(parents == nullptr || (parents->type == GGML_TYPE_I32 && ggml_nelements(parents) == T &&
                                   ggml_is_contiguous(parents) && mode == state_out::every_state),
            op, "parents I32 [T], contiguous, with every_state");
    step_params p;
    p.n_k_heads = static_cast<int32_t>(n_k_heads);
    p.state_mode = static_cast<int32_t>(mode);
    p.x_tokens = static_cast<int32_t>(x_tokens);
    p.n_tokens = static_cast<int32_t>(T);
    p.eps = eps;
    ggml_tensor * srcs[6] = {state_dst, x, s0, z, norm_w, parents};
    ggml_tensor * out = ggml_custom_4d(ctx, GGML_TYPE_F32, Hv * HEAD, T, 1, 1, srcs, parents != nullptr ? 6 : 5,
                                       &recurrence_cpu, GGML_N_TASKS_MAX, nullptr);
    set_params(out, p);
    return out;
}

ggml_tensor * replay_layers(ggml_context * ctx, ggml_tensor * layers, int64_t x_tokens, int64_t T, int64_t n_k_heads,
                            int64_t n_v_heads, int64_t d_conv, int64_t conv_src_stride) {
    const char * op = "replay_layers";
    require(layers->type == GGML_TYPE_I64 && layers->ne[0] == REPLAY_COLUMNS && layers->ne[1] >= 1 &&
                ggml_is_contiguous(layers) && layers->ne[2] == 1 && layers->ne[3] == 1,
            op, "layers [4, n] I64 contiguous");
    require(T >= 1 && x_tokens >= T && x_tokens <= MAX_TOKENS, op, "MAX_TOKENS >= x_tokens >= T >= 1");
    require(n_k_heads > 0 && n_v_heads % n_k_heads == 0, op, "value heads a multiple of the key heads");
    require(d_conv >= 2 && d_conv <= MAX_D_CONV, op, "2 <= d_conv <= MAX_D_CONV");
    require(conv_src_stride >= d_conv - 1 + x_tokens && conv_src_stride <= INT32_MAX, op,
            "a conv window source holds d_conv-1+x_tokens values a channel");
    step_params p;
    p.n_k_heads = static_cast<int32_t>(n_k_heads);
    p.n_v_heads = static_cast<int32_t>(n_v_heads);
    p.state_mode = static_cast<int32_t>(state_out::final_state);
    p.x_tokens = static_cast<int32_t>(x_tokens);
    p.n_tokens = static_cast<int32_t>(T);
    p.d_conv = static_cast<int32_t>(d_conv);
    p.conv_src_stride = static_cast<int32_t>(conv_src_stride);
    ggml_tensor * out = ggml_custom_inplace(ctx, layers, nullptr, 0, &replay_layers_cpu, GGML_N_TASKS_MAX, nullptr);
    set_params(out, p);
    return out;
}

void inputs_cpu(ggml_tensor * dst, int ith, int nth, void *) {
    if (ith == 0) g_cpu_runs.fetch_add(1, std::memory_order_relaxed);
    const ggml_tensor * qkv = input_operand(dst, 0), * beta = input_operand(dst, 1), * alpha = input_operand(dst, 2),
                      * conv_state = input_operand(dst, 3), * conv_w = input_operand(dst, 4),
                      * dt_bias = input_operand(dst, 5), * a = input_operand(dst, 6);
    ggml_tensor * conv_dst = input_operand(dst, 7);
    const ggml_tensor * tree = input_operand(dst, 8);
    const int32_t * tree_rows = tree != nullptr ? static_cast<const int32_t *>(tree->data) : nullptr;
    const shape s = shape_of(dst);
    const step_params p = params_of(dst);
    const int64_t T = s.T, W = s.d_conv - 1 + T, C = s.conv_dim;
    const int64_t n_blocks = s.conv_dim / HEAD;  // head-sized channel blocks, then one unit of gates
    float * out = static_cast<float *>(dst->data);
    std::vector<float> win(static_cast<size_t>(W)), y(static_cast<size_t>(T * HEAD));
    for (int64_t u = ith; u <= n_blocks; u += nth) {
        if (u == n_blocks) {
            const float * bias = static_cast<const float *>(dt_bias->data), * av = static_cast<const float *>(a->data);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < s.Hv; ++h) {
                    out[C * T + t * s.Hv + h] = softplus(col(alpha, t)[h] + bias[h]) * av[h];
                    out[(C + s.Hv) * T + t * s.Hv + h] = sigmoid(col(beta, t)[h]);
                }
            continue;
        }
        for (int64_t j = 0; j < HEAD; ++j) {
            const int64_t c = u * HEAD + j;
            const float * st = static_cast<const float *>(conv_state->data) + c * (s.d_conv - 1);
            const float * w = static_cast<const float *>(conv_w->data) + c * s.d_conv;
            for (int64_t i = 0; i < s.d_conv - 1; ++i) win[i] = st[i];
            for (int64_t t = 0; t < T; ++t) win[s.d_conv - 1 + t] = col(qkv, t)[c];
            for (int64_t t = 0; t < T; ++t) {  // node t's window: win[t + i], or a tree's table
                float sum = 0.0f;
                for (int64_t i = 0; i < s.d_conv; ++i) sum += win[tree_rows ? tree_rows[t * s.d_conv + i] : t + i] * w[i];
                y[t * HEAD + j] = silu(sum);
            }
            if (conv_dst == nullptr) continue;
            float * cd = reinterpret_cast<float *>(static_cast<char *>(conv_dst->data) + c * conv_dst->nb[1]);
            for (int64_t i = p.window_from; i < W; ++i) cd[i - p.window_from] = win[i];
        }
        const bool qk = u < 2 * s.Hk;
        for (int64_t t = 0; t < T; ++t) {
            float * yt = &y[t * HEAD];
            if (qk) {  // as graph::l2_norm: rms_norm(x, eps / n) / sqrt(n)
                float ss = 0.0f;
                for (int64_t j = 0; j < HEAD; ++j) ss += yt[j] * yt[j];
                const float scale = 1.0f / std::sqrt(ss / float(HEAD) + p.eps / float(HEAD));
                const float inv_sqrt_n = 1.0f / std::sqrt(float(HEAD));
                for (int64_t j = 0; j < HEAD; ++j) yt[j] = yt[j] * scale * inv_sqrt_n;
            }
            std::memcpy(out + t * C + u * HEAD, yt, HEAD * sizeof(float));
        }
    }
}

namespace {

// Partial sums of the recurrence's dot products: value i goes to sum i % DOT_LANES, and the sums are
// added pairwise at the end. A fixed order (every batch and thread count gives the same bits) that
// the compiler turns into vector instructions, where one running sum would chain every addition.
constexpr int64_t DOT_LANES = 8;
static_assert(HEAD % DOT_LANES == 0 && (DOT_LANES & (DOT_LANES - 1)) == 0, "lanes: a power of 2 that tiles a head");

float dot(const float * a, const float * b) {
    float acc[DOT_LANES] = {};
    for (int64_t i = 0; i < HEAD; i += DOT_LANES)
        for (int64_t l = 0; l < DOT_LANES; ++l) acc[l] += a[i + l] * b[i + l];
    for (int64_t w = DOT_LANES / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
    return acc[0];
}

// Value head h's recurrence over tokens t0 .. T-1 of x (the inputs op's result for XT tokens) from
// the state S (HEAD HEAD floats, per column c its k indices; updated in place); after each token t,
// o holds its HEAD outputs S^T q / sqrt(HEAD) and after_token(t) runs. The one arithmetic of the
// recurrence and replay_layers ops on the CPU.
template <class AfterToken>
void head_recurrence(const float * xd, int64_t XT, int64_t t0, int64_t T, const shape & s, int64_t h, float * S, float * o,
                     AfterToken && after_token) {
    const int64_t kh = h % s.Hk, C = s.conv_dim;
    const float scale = 1.0f / std::sqrt(float(HEAD));
    for (int64_t t = t0; t < T; ++t) {
        const float * xt = xd + t * C;
        const float * q = xt + kh * HEAD, * k = xt + s.key_dim + kh * HEAD, * v = xt + 2 * s.key_dim + h * HEAD;
        const float eg = std::exp(xd[C * XT + t * s.Hv + h]), b = xd[(C + s.Hv) * XT + t * s.Hv + h];
        for (int64_t c = 0; c < HEAD; ++c) {  // S[c][i]: column c of the state, k index i fastest
            float * sc = &S[c * HEAD];
            const float delta = (v[c] - eg * dot(sc, k)) * b;
            for (int64_t i = 0; i < HEAD; ++i) sc[i] = eg * sc[i] + k[i] * delta;
            o[c] = dot(sc, q) * scale;
        }
        after_token(t);
    }
}

}  // namespace

void recurrence_cpu(ggml_tensor * dst, int ith, int nth, void *) {
    if (ith == 0) g_cpu_runs.fetch_add(1, std::memory_order_relaxed);
    ggml_tensor * state_dst = dst->src[0];
    const ggml_tensor * x = dst->src[1], * s0 = dst->src[2], * z = dst->src[3], * norm_w = dst->src[4];
    const shape s = shape_of(dst);
    const step_params p = params_of(dst);
    const int64_t T = s.T, D = HEAD * HEAD;
    const state_out mode = static_cast<state_out>(p.state_mode);
    const float * xd = static_cast<const float *>(x->data);
    float * out = static_cast<float *>(dst->data);
    const int32_t * parents = dst->src[5] != nullptr ? static_cast<const int32_t *>(dst->src[5]->data) : nullptr;
    auto slot = [&](int64_t t) {  // token t's state (every_state)
        return reinterpret_cast<float *>(static_cast<char *>(state_dst->data) + (T - 1 - t) * state_dst->nb[1]);
    };
    std::vector<float> S(static_cast<size_t>(D)), o(static_cast<size_t>(HEAD));
    for (int64_t h = ith; h < s.Hv; h += nth) {
        const float * s0h = static_cast<const float *>(s0->data) + h * D;
        std::memcpy(S.data(), s0h, D * sizeof(float));
        const auto after_token = [&](int64_t t) {
            if (mode == state_out::every_state) std::memcpy(slot(t) + h * D, S.data(), D * sizeof(float));
            const float * nw = static_cast<const float *>(norm_w->data);
            float ss = 0.0f;
            for (int64_t c = 0; c < HEAD; ++c) ss += o[c] * o[c];
            const float r = 1.0f / std::sqrt(ss / float(HEAD) + p.eps);
            const float * zt = col(z, t) + h * HEAD;
            for (int64_t c = 0; c < HEAD; ++c) out[t * s.Hv * HEAD + h * HEAD + c] = o[c] * r * nw[c] * silu(zt[c]);
        };
        if (parents == nullptr) {
            head_recurrence(xd, p.x_tokens, 0, T, s, h, S.data(), o.data(), after_token);
        } else {  // a tree: node t continues its parent's state (kept in its slot) or s0
            for (int64_t t = 0; t < T; ++t) {
                if (parents[t] != t - 1) {
                    const float * from = parents[t] < 0 ? s0h : slot(parents[t]) + h * D;
                    std::memcpy(S.data(), from, D * sizeof(float));
                }
                head_recurrence(xd, p.x_tokens, t, t + 1, s, h, S.data(), o.data(), after_token);
            }
        }
        if (mode == state_out::final_state)
            std::memcpy(static_cast<float *>(state_dst->data) + h * D, S.data(), D * sizeof(float));
    }
}

void replay_layers_cpu(ggml_tensor * dst, int ith, int nth, void *) {
    if (ith == 0) g_cpu_runs.fetch_add(1, std::memory_order_relaxed);
    const ggml_tensor * layers = dst->src[0];
    const int64_t * rows = static_cast<const int64_t *>(layers->data);
    const shape s = shape_of(dst);
    const step_params p = params_of(dst);
    const int64_t D = HEAD * HEAD, n = layers->ne[1];
    std::vector<float> o(static_cast<size_t>(HEAD));
    const auto address = [&](int64_t l, int64_t column) {
        return reinterpret_cast<float *>(static_cast<uintptr_t>(rows[REPLAY_COLUMNS * l + column]));
    };
    for (int64_t u = ith; u < n * s.Hv; u += nth) {  // (layer, value head) units; a head's state in place
        const int64_t l = u / s.Hv, h = u % s.Hv;
        head_recurrence(address(l, 0), p.x_tokens, 0, s.T, s, h, address(l, 1) + h * D, o.data(), [](int64_t) {});
    }
    const int64_t W = p.d_conv - 1;
    for (int64_t l = ith; l < n; l += nth) {  // the conv windows after the T kept tokens
        const float * src = address(l, 2);
        float * conv = address(l, 3);
        for (int64_t c = 0; c < s.conv_dim; ++c)
            std::memcpy(conv + c * W, src + c * p.conv_src_stride + s.T, W * sizeof(float));
    }
}

}  // namespace lucebox::kernels::delta_net
