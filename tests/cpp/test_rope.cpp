// The target's rotary embedding: where no rotated pair reads IMRoPE's extra stream
// (qwen35_hparams::rope_reads_positions_only), ggml's NEOX rope of the positions gives the same bits as
// its multi-section rope of the text streams (t = h = w = position, extra = 0); elsewhere they differ,
// so the target keeps the multi-section rope there. And the target's attention layer and the DFlash
// draft have the node forms ggml's CUDA backend fuses (norm + weight + rope; for k also its cache write).
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "models/dflash_model.h"
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

// Whether ROPE node i ropes the MUL by `norm_w` of an RMS_NORM, the three consecutive nodes (ggml's CUDA
// fusion of norm, weight and rope).
bool norm_rope_at(ggml_cgraph * gf, int i, const ggml_tensor * norm_w) {
    if (i < 2) return false;
    const ggml_tensor * rope = ggml_graph_node(gf, i);
    const ggml_tensor * mul = ggml_graph_node(gf, i - 1);
    const ggml_tensor * norm = ggml_graph_node(gf, i - 2);
    return rope->op == GGML_OP_ROPE && mul->op == GGML_OP_MUL && rope->src[0] == mul && mul->src[1] == norm_w &&
           norm->op == GGML_OP_RMS_NORM && mul->src[0] == norm;
}

// Whether ROPE node i is followed by a contiguous VIEW of it and that view's SET_ROWS into `cache` (the
// fusion's cache write).
bool cache_write_after(ggml_cgraph * gf, int i, const ggml_tensor * cache) {
    if (i + 2 >= ggml_graph_n_nodes(gf)) return false;
    const ggml_tensor * view = ggml_graph_node(gf, i + 1);
    const ggml_tensor * set = ggml_graph_node(gf, i + 2);
    return view->op == GGML_OP_VIEW && view->src[0] == ggml_graph_node(gf, i) && ggml_is_contiguous(view) &&
           set->op == GGML_OP_SET_ROWS && set->src[0] == view && set->src[2] == cache;
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
            // RMS_NORM, MUL (by the head's norm weight), ROPE as consecutive nodes; k's then its cache write
            if (norm_rope_at(gf, i, l.q_norm)) {
                ++q_forms;
            } else {
                CHECK(norm_rope_at(gf, i, l.k_norm));
                CHECK(cache_write_after(gf, i, k_cache));
                k_forms += norm_rope_at(gf, i, l.k_norm) && cache_write_after(gf, i, k_cache);
            }
        }
        CHECK(ropes == 2 && q_forms == 1 && k_forms == 1);
        ggml_free(ctx);
    }
}

TEST_CASE(draft_graph_has_the_fusable_norm_rope_forms) {
    // the DFlash draft: q's norm + rope, and k's norm + rope + cache write, for the injected context and
    // for the proposal block, in every layer
    dflash_hparams hp;
    hp.set_schema(dflash_schema::upstream);
    hp.n_embd = 64; hp.n_layer = 2; hp.n_ff = 128; hp.n_head = 4; hp.n_head_kv = 2; hp.head_dim = 32;
    hp.n_rot = 32; hp.block_size = 4; hp.target_layers = {1, 3};
    hp.validate();
    const int64_t E = hp.n_embd, hd = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv, V = 100, kv = 256;
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 1024 + ggml_graph_overhead_custom(8192, false), nullptr, true});
    auto t1 = [&](int64_t n) { return ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n); };
    auto t2 = [&](int64_t a, int64_t b) { return ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a, b); };
    dflash_weights w;
    w.fc = t2(2 * E, E);
    w.enc_norm = t1(E);
    w.output_norm = t1(E);
    w.token_embd = t2(E, V);
    w.output = t2(E, V);
    dflash_state st;
    st.kv_size = uint32_t(kv);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        dflash_layer_weights l;
        l.attn_norm = t1(E); l.ffn_norm = t1(E); l.q_norm = t1(hd); l.k_norm = t1(hd);
        l.wq = t2(E, H * hd); l.wk = t2(E, Hkv * hd); l.wv = t2(E, Hkv * hd); l.wo = t2(H * hd, E);
        l.ffn_gate = t2(E, hp.n_ff); l.ffn_up = t2(E, hp.n_ff); l.ffn_down = t2(hp.n_ff, E);
        w.layers.push_back(l);
        st.k.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Hkv * hd, kv));
        st.v.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Hkv * hd, kv));
    }
    const std::vector<ggml_tensor *> rings{t2(E, 64), t2(E, 64)};
    const dflash_graph g = build_dflash_graph(ctx, hp, w, st, rings, /*n_inject =*/3, hp.block_size, uint32_t(kv), 4096);
    int q_forms = 0, k_forms = 0, ropes = 0;
    for (int i = 0; i < ggml_graph_n_nodes(g.gf); ++i) {
        if (ggml_graph_node(g.gf, i)->op != GGML_OP_ROPE) continue;
        ++ropes;
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            q_forms += norm_rope_at(g.gf, i, w.layers[il].q_norm);
            k_forms += norm_rope_at(g.gf, i, w.layers[il].k_norm) && cache_write_after(g.gf, i, st.k[il]);
        }
    }
    CHECK(ropes == 3 * int(hp.n_layer));
    CHECK(q_forms == int(hp.n_layer));
    CHECK(k_forms == 2 * int(hp.n_layer));  // the injected context's and the block's
    ggml_free(ctx);
}

TEST_MAIN()
