// The target's rotary embedding: where no rotated pair reads IMRoPE's extra stream
// (qwen35_hparams::rope_reads_positions_only), ggml's NEOX rope of the positions gives the same bits as
// its multi-section rope of the text streams (t = h = w = position, extra = 0); elsewhere they differ,
// so the target keeps the multi-section rope there. And the attention layer's graph has the node forms
// ggml's CUDA backend fuses (norm + weight + rope; for k also its cache write).
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "models/qwen35_model.h"

using namespace lucebox;

namespace {

qwen35_hparams rope_hparams(uint32_t head_dim, uint32_t n_rot, std::array<int32_t, 4> sections) {
    qwen35_hparams hp;
    hp.head_dim = head_dim;
    hp.n_rot = n_rot;
    hp.rope_sections = sections;
    hp.rope_freq_base = 1000000.0f;
    hp.n_ctx_train = 262144;
    return hp;
}

// Both ropes of the same [head_dim, H, T] values at the given positions; whether their bits agree.
bool neox_equals_imrope(const qwen35_hparams & hp, const std::vector<int32_t> & positions) {
    const int64_t H = 3, T = int64_t(positions.size());
    ggml_context * ctx = ggml_init({size_t(64) << 20, nullptr, false});
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hp.head_dim, H, T);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int64_t i = 0; i < ggml_nelements(x); ++i) static_cast<float *>(x->data)[i] = u(rng);
    ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    ggml_tensor * streams = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4 * T);
    for (int64_t t = 0; t < T; ++t) {
        static_cast<int32_t *>(pos->data)[t] = positions[size_t(t)];
        for (int s = 0; s < 4; ++s) static_cast<int32_t *>(streams->data)[s * T + t] = s < 3 ? positions[size_t(t)] : 0;
    }
    int sections[GGML_MROPE_SECTIONS];
    for (int s = 0; s < 4; ++s) sections[s] = hp.rope_sections[size_t(s)];
    ggml_tensor * a = ggml_rope_ext(ctx, x, pos, nullptr, int(hp.n_rot), GGML_ROPE_TYPE_NEOX, int(hp.n_ctx_train),
                                    hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    ggml_tensor * b = ggml_rope_multi(ctx, x, streams, nullptr, int(hp.n_rot), sections, GGML_ROPE_TYPE_IMROPE,
                                      int(hp.n_ctx_train), hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, a);
    ggml_build_forward_expand(gf, b);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    const bool equal = std::memcmp(a->data, b->data, ggml_nbytes(a)) == 0;
    ggml_free(ctx);
    return equal;
}

}  // namespace

TEST_CASE(neox_equals_imrope_exactly_where_no_pair_reads_the_extra_stream) {
    const std::vector<int32_t> positions{1, 7, 100, 4095, 70000};
    struct config {
        uint32_t head_dim, n_rot;
        std::array<int32_t, 4> sections;
        bool positions_only;
    };
    const config configs[] = {
        {256, 64, {11, 11, 10, 0}, true},  // Qwen3.5 / 3.6
        {64, 32, {6, 5, 5, 0}, true},      // the bundled demo model
        {32, 16, {3, 3, 2, 0}, true},      // synth's tiny preset
        {64, 32, {2, 2, 2, 0}, true},      // sectors wrap around (16 pairs, 6 sectors)
        {32, 16, {1, 1, 1, 0}, true},
        {64, 64, {11, 11, 10, 0}, true},   // whole heads
        {32, 16, {2, 2, 2, 2}, false},     // pairs 6, 7 read the extra stream
        {32, 16, {4, 2, 2, 0}, false},     // pair 7 (h, 7 >= 3 * 2)
        {64, 32, {3, 3, 2, 8}, false},
        {64, 32, {16, 0, 0, 0}, false},    // only every third pair reads t
    };
    for (const config & c : configs) {
        const qwen35_hparams hp = rope_hparams(c.head_dim, c.n_rot, c.sections);
        CHECK(hp.rope_reads_positions_only() == c.positions_only);
        CHECK(neox_equals_imrope(hp, positions) == c.positions_only);
    }
}

TEST_CASE(attention_graph_has_the_fusable_norm_rope_forms) {
    for (const bool positions_only : {true, false}) {
        const int64_t E = 64, H = 4, Hkv = 2, hd = 32, T = 3, n_ctx = 256;
        qwen35_hparams hp = rope_hparams(hd, 16, positions_only ? std::array<int32_t, 4>{3, 3, 2, 0}
                                                                : std::array<int32_t, 4>{2, 2, 2, 2});
        hp.n_embd = E;
        hp.n_head = H;
        hp.n_head_kv = Hkv;
        ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 256 + ggml_graph_overhead(), nullptr, true});
        qwen35_layer_weights l;
        l.attn_norm = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, E);
        l.wq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, 2 * H * hd);
        l.wk = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, Hkv * hd);
        l.wv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, Hkv * hd);
        l.wo = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, H * hd, E);
        l.q_norm = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hd);
        l.k_norm = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hd);
        ggml_tensor * k_cache = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Hkv * hd, n_ctx);
        ggml_tensor * v_cache = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Hkv * hd, n_ctx);
        qwen35_inputs in;
        in.pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, positions_only ? T : 4 * T);
        in.kv_rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, T);
        in.kq_mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_ctx, T);
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, T);
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, build_gated_attention(ctx, gf, hp, l, k_cache, v_cache, in, 256,
                                                            graph::rms_normed{x, l.attn_norm, 1e-6f, "attn_norm", 0}, 0));
        int ropes = 0, q_forms = 0, k_forms = 0;
        const int n = ggml_graph_n_nodes(gf);
        for (int i = 0; i < n; ++i) {
            const ggml_tensor * rope = ggml_graph_node(gf, i);
            if (rope->op != GGML_OP_ROPE) continue;
            ++ropes;
            const int mode = reinterpret_cast<const int32_t *>(rope->op_params)[2];
            CHECK(mode == (positions_only ? GGML_ROPE_TYPE_NEOX : GGML_ROPE_TYPE_IMROPE));
            CHECK(rope->src[1] == in.pos);
            // RMS_NORM, MUL (by the head's norm weight), ROPE as consecutive nodes
            const ggml_tensor * mul = i >= 2 ? ggml_graph_node(gf, i - 1) : nullptr;
            const ggml_tensor * norm = i >= 2 ? ggml_graph_node(gf, i - 2) : nullptr;
            const bool norm_rope = mul != nullptr && mul->op == GGML_OP_MUL && rope->src[0] == mul &&
                                   norm->op == GGML_OP_RMS_NORM && mul->src[0] == norm &&
                                   (mul->src[1] == l.q_norm || mul->src[1] == l.k_norm);
            CHECK(norm_rope);
            if (!norm_rope) continue;
            if (mul->src[1] == l.q_norm) {
                ++q_forms;
                continue;
            }
            // k: then a VIEW of the rope and the SET_ROWS of it into the K cache
            const ggml_tensor * view = i + 2 < n ? ggml_graph_node(gf, i + 1) : nullptr;
            const ggml_tensor * set = i + 2 < n ? ggml_graph_node(gf, i + 2) : nullptr;
            CHECK(view != nullptr && view->op == GGML_OP_VIEW && view->src[0] == rope && ggml_is_contiguous(view));
            CHECK(set != nullptr && set->op == GGML_OP_SET_ROWS && set->src[0] == view && set->src[2] == k_cache);
            k_forms += view != nullptr && set != nullptr && set->src[0] == view;
        }
        CHECK(ropes == 2 && q_forms == 1 && k_forms == 1);
        ggml_free(ctx);
    }
}

TEST_MAIN()
