// qwen35: the Qwen3.5 / Qwen3.6 dense hybrid target.
// Layer pattern: Gated DeltaNet layers with a gated full-attention layer every
// `full_attention_interval` layers (or as listed in attention.recurrent_layers).
// GGUF conventions (from the upstream converter): norm gains are stored as 1+w, ssm_a = -exp(A_log),
// V heads are in tiled order (V head h uses K head h % n_k_heads).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "lucebox/models.h"
#include "../graph/builders.h"
#include "../graph/inputs.h"
#include "cuda_kernels.h"
#include "delta_net_step.h"
#include "range_mask.h"
#include "qwen35_model.h"

namespace lucebox {

namespace {

const char * ARCH = "qwen35";

std::string key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

// A per-layer hyperparameter stored either as a scalar or as an array over all layers. For an
// array, the entries of the layers selected by `used` must agree (and be non-zero).
uint32_t read_uniform_u32(const gguf_file & f, const std::string & k, const std::vector<bool> & used) {
    const int64_t id = f.has_key(k) ? 0 : -1;
    if (id < 0) {
        return f.get_u32(k);  // throws "missing required key"
    }
    bool is_array = true;
    try {
        f.get_array_size(k);
    } catch (const gguf_error &) {
        is_array = false;
    }
    if (!is_array) {
        return f.get_u32(k);
    }
    const std::vector<int64_t> vals = f.get_int_array(k);
    if (vals.size() < used.size()) {
        throw gguf_error(f.where() + "key '" + k + "' has " + std::to_string(vals.size()) +
                         " entries, expected one per layer (" + std::to_string(used.size()) + ")");
    }
    int64_t value = -1;
    for (size_t i = 0; i < used.size(); ++i) {
        if (!used[i]) {
            continue;
        }
        if (value < 0) {
            value = vals[i];
        } else if (vals[i] != value) {
            throw unsupported_error(f.where() + "key '" + k + "' varies across layers (" + std::to_string(value) +
                                    " vs " + std::to_string(vals[i]) + " at layer " + std::to_string(i) +
                                    "); per-layer sizes are not supported");
        }
    }
    if (value <= 0 || value > 0xffffffffLL) {
        throw gguf_error(f.where() + "key '" + k + "' must be positive, found " + std::to_string(value));
    }
    return static_cast<uint32_t>(value);
}

void require(bool cond, const std::string & what) {
    if (!cond) {
        throw config_error("qwen35 hyperparameters: " + what);
    }
}

}  // namespace

bool qwen35_hparams::fused_delta_net_shape() const {
    // (ssm_d_state is the key and the value head size: the conv channels are then (2 Hk + Hv) heads)
    return ssm_d_state == kernels::delta_net::HEAD && ssm_d_conv <= kernels::delta_net::MAX_D_CONV;
}

uint32_t qwen35_hparams::n_attention_layers() const {
    return static_cast<uint32_t>(std::count(is_recurrent.begin(), is_recurrent.end(), false));
}

bool qwen35_hparams::rope_reads_positions_only() const {
    const int32_t s_t = rope_sections[0], s_h = rope_sections[1], s_w = rope_sections[2];
    const int32_t sect_dims = s_t + s_h + s_w + rope_sections[3];
    if (sect_dims <= 0) {
        return false;
    }
    // ggml's IMRoPE: pair i's sector is i % sect_dims; it reads h where sector % 3 == 1 and sector < 3 s_h,
    // w where % 3 == 2 and < 3 s_w, t where % 3 == 0 and < 3 s_t, the extra stream elsewhere
    for (uint32_t pair = 0; pair < n_rot / 2; ++pair) {
        const int32_t sector = int32_t(pair) % sect_dims;
        const int32_t section = sector % 3 == 0 ? s_t : sector % 3 == 1 ? s_h : s_w;
        if (sector >= 3 * section) {
            return false;
        }
    }
    return true;
}

void qwen35_hparams::validate() const {
    require(n_vocab > 0, "n_vocab must be > 0");
    require(n_embd > 0, "n_embd must be > 0");
    require(n_layer > 0, "n_layer must be > 0");
    require(n_ff > 0, "n_ff must be > 0");
    require(is_recurrent.size() == n_layer,
            "the layer pattern has " + std::to_string(is_recurrent.size()) + " entries, expected n_layer = " +
                std::to_string(n_layer));
    require(n_ctx_train > 0, "context_length must be > 0");
    require(rms_eps > 0.0f, "layer_norm_rms_epsilon must be > 0");
    if (n_attention_layers() > 0) {
        require(n_head > 0 && n_head_kv > 0, "attention head counts must be > 0");
        require(n_head % n_head_kv == 0, "head_count (" + std::to_string(n_head) +
                                             ") must be a multiple of head_count_kv (" +
                                             std::to_string(n_head_kv) + ")");
        require(head_dim > 0 && head_dim % 2 == 0, "attention head dim must be even and > 0");
        require(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0,
                "rope.dimension_count (" + std::to_string(n_rot) + ") must be even and in (0, head_dim=" +
                    std::to_string(head_dim) + "]");
        int32_t sum = 0;
        for (int32_t s : rope_sections) {
            require(s >= 0, "rope.dimension_sections must be non-negative");
            sum += s;
        }
        require(sum > 0, "rope.dimension_sections must not all be zero");
        require(sum <= int32_t(n_rot), "rope.dimension_sections sum to " + std::to_string(sum) +
                                           ", more than rope.dimension_count = " + std::to_string(n_rot) +
                                           " (ggml's multi-section rope needs them to fit)");
        require(rope_freq_base > 0.0f, "rope.freq_base must be > 0");
    }
    if (n_recurrent_layers() > 0) {
        require(ssm_d_conv >= 2, "ssm.conv_kernel must be >= 2");
        require(ssm_d_state > 0, "ssm.state_size must be > 0");
        require(ssm_n_k_heads > 0 && ssm_n_v_heads > 0, "ssm head counts must be > 0");
        require(ssm_n_v_heads % ssm_n_k_heads == 0,
                "ssm.time_step_rank (V heads, " + std::to_string(ssm_n_v_heads) +
                    ") must be a multiple of ssm.group_count (K heads, " + std::to_string(ssm_n_k_heads) + ")");
    }
}

qwen35_hparams read_qwen35(const gguf_file & f) {
    const std::string arch = f.get_string("general.architecture");
    if (arch == "qwen35moe") {
        throw unsupported_error(f.where() + "architecture 'qwen35moe' (Qwen3.5 MoE) is not supported yet; "
                                            "expected the dense 'qwen35'");
    }
    if (arch != ARCH) {
        throw gguf_error(f.where() + "architecture is '" + arch + "', expected 'qwen35'");
    }

    qwen35_hparams hp;
    hp.n_ctx_train = f.get_u32(key("context_length"));
    hp.n_embd = f.get_u32(key("embedding_length"));
    const uint32_t n_layer_all = f.get_u32(key("block_count"));
    hp.n_nextn = f.find_u32(key("nextn_predict_layers")).value_or(0);
    if (n_layer_all == 0 || hp.n_nextn >= n_layer_all) {
        throw gguf_error(f.where() + "key '" + key("block_count") + "' = " + std::to_string(n_layer_all) +
                         " must exceed nextn_predict_layers = " + std::to_string(hp.n_nextn));
    }
    hp.n_layer = n_layer_all - hp.n_nextn;
    if (n_layer_all > f.tensors().size()) {  // each layer has >= 9 tensors: bounds per-layer work on corrupt files
        throw gguf_error(f.where() + "key '" + key("block_count") + "' = " + std::to_string(n_layer_all) +
                         " exceeds the " + std::to_string(f.tensors().size()) + " tensors in the file");
    }

    // Layer pattern: explicit list, else every interval-th layer is attention.
    if (f.has_key(key("attention.recurrent_layers"))) {
        std::vector<bool> all = f.get_bool_array(key("attention.recurrent_layers"));
        if (all.size() != n_layer_all) {
            throw gguf_error(f.where() + "key '" + key("attention.recurrent_layers") + "' has " +
                             std::to_string(all.size()) + " entries, expected block_count = " +
                             std::to_string(n_layer_all));
        }
        hp.is_recurrent.assign(all.begin(), all.begin() + hp.n_layer);
    } else {
        const uint32_t interval = f.find_u32(key("full_attention_interval")).value_or(4);
        if (interval == 0) {
            throw gguf_error(f.where() + "key '" + key("full_attention_interval") + "' must be > 0");
        }
        hp.is_recurrent.resize(hp.n_layer);
        for (uint32_t i = 0; i < hp.n_layer; ++i) {
            hp.is_recurrent[i] = (i + 1) % interval != 0;
        }
    }

    std::vector<bool> all_layers(n_layer_all, false);
    std::fill(all_layers.begin(), all_layers.begin() + hp.n_layer, true);
    std::vector<bool> attn_layers(n_layer_all, false);
    for (uint32_t i = 0; i < hp.n_layer; ++i) {
        attn_layers[i] = !hp.is_recurrent[i];
    }
    const bool any_attn = std::find(attn_layers.begin(), attn_layers.end(), true) != attn_layers.end();

    hp.n_ff = read_uniform_u32(f, key("feed_forward_length"), all_layers);
    hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
    if (any_attn) {
        hp.n_head = read_uniform_u32(f, key("attention.head_count"), attn_layers);
        hp.n_head_kv = f.has_key(key("attention.head_count_kv"))
                           ? read_uniform_u32(f, key("attention.head_count_kv"), attn_layers)
                           : hp.n_head;
        const uint32_t hd_default = hp.n_head ? hp.n_embd / hp.n_head : 0;
        hp.head_dim = f.find_u32(key("attention.key_length")).value_or(hd_default);
        const uint32_t v_dim = f.find_u32(key("attention.value_length")).value_or(hp.head_dim);
        if (v_dim != hp.head_dim) {
            throw unsupported_error(f.where() + "attention key_length " + std::to_string(hp.head_dim) +
                                    " != value_length " + std::to_string(v_dim) + " is not supported");
        }
        hp.n_rot = f.find_u32(key("rope.dimension_count")).value_or(hp.head_dim);
        hp.rope_freq_base = f.find_f32(key("rope.freq_base")).value_or(10000.0f);
        hp.attn_scale = f.find_f32(key("attention.scale")).value_or(0.0f);
        const std::vector<int64_t> sections = f.get_int_array(key("rope.dimension_sections"));
        if (sections.size() != 4 && sections.size() != 3) {
            throw gguf_error(f.where() + "key '" + key("rope.dimension_sections") + "' has " +
                             std::to_string(sections.size()) + " entries, expected 4");
        }
        for (size_t i = 0; i < sections.size(); ++i) {
            if (sections[i] < 0 || sections[i] > 1 << 20) {
                throw gguf_error(f.where() + "key '" + key("rope.dimension_sections") + "' entry " +
                                 std::to_string(i) + " = " + std::to_string(sections[i]) + " is out of range");
            }
            hp.rope_sections[i] = static_cast<int32_t>(sections[i]);
        }
    }
    if (hp.n_recurrent_layers() > 0) {
        hp.ssm_d_conv = f.get_u32(key("ssm.conv_kernel"));
        hp.ssm_d_state = f.get_u32(key("ssm.state_size"));
        hp.ssm_n_v_heads = f.get_u32(key("ssm.time_step_rank"));
        hp.ssm_n_k_heads = f.get_u32(key("ssm.group_count"));
        const uint32_t inner = f.get_u32(key("ssm.inner_size"));
        if (inner != hp.ssm_d_state * hp.ssm_n_v_heads) {
            throw gguf_error(f.where() + "key '" + key("ssm.inner_size") + "' = " + std::to_string(inner) +
                             ", expected state_size * time_step_rank = " +
                             std::to_string(hp.ssm_d_state * hp.ssm_n_v_heads));
        }
    }

    const gguf_tensor_entry * embd = f.find_tensor("token_embd.weight");
    if (embd == nullptr) {
        throw gguf_error(f.where() + "missing tensor 'token_embd.weight'");
    }
    if (embd->ne[1] <= 0 || embd->ne[1] > 0x7fffffff) {
        throw gguf_error(f.where() + "tensor 'token_embd.weight' has an invalid vocabulary dimension " +
                         embd->shape_string());
    }
    hp.n_vocab = static_cast<uint32_t>(embd->ne[1]);
    hp.has_output = f.find_tensor("output.weight") != nullptr;
    for (const char * special : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id",
                                 "tokenizer.ggml.padding_token_id"}) {
        if (f.has_key(special) && f.get_u32(special) >= hp.n_vocab) {
            throw gguf_error(f.where() + "key '" + special + "' = " + std::to_string(f.get_u32(special)) +
                             " is outside the vocabulary of " + std::to_string(hp.n_vocab) + " tokens");
        }
    }
    if (f.has_key("tokenizer.ggml.tokens")) {
        const size_t n_tokens = f.get_array_size("tokenizer.ggml.tokens");
        if (n_tokens != hp.n_vocab) {
            throw gguf_error(f.where() + "key 'tokenizer.ggml.tokens' has " + std::to_string(n_tokens) +
                             " tokens but token_embd.weight has " + std::to_string(hp.n_vocab) + " rows");
        }
    }

    try {
        hp.validate();
    } catch (const config_error & e) {
        throw gguf_error(f.where() + e.what());
    }
    check_tensors(f, qwen35_tensor_specs(hp));
    return hp;
}

std::vector<std::vector<std::string>> qwen35_projection_stacks(const qwen35_hparams & hp) {
    std::vector<std::vector<std::string>> stacks;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        if (hp.is_recurrent[il]) {
            stacks.push_back({p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight", p + "ssm_alpha.weight"});
        } else {
            stacks.push_back({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"});
        }
    }
    return stacks;
}

std::vector<tensor_spec> qwen35_tensor_specs(const qwen35_hparams & hp) {
    using R = tensor_role;
    const int64_t E = hp.n_embd, V = hp.n_vocab;
    std::vector<tensor_spec> s;
    s.push_back({"token_embd.weight", {E, V}, R::embedding});
    s.push_back({"output_norm.weight", {E}, R::norm});
    s.push_back({"output.weight", {E, V}, R::matrix, /*required=*/false});
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        s.push_back({p + "attn_norm.weight", {E}, R::norm});
        if (hp.is_recurrent[il]) {
            const int64_t conv = hp.conv_dim(), vd = hp.value_dim(), hv = hp.ssm_n_v_heads;
            s.push_back({p + "attn_qkv.weight", {E, conv}, R::matrix});
            s.push_back({p + "attn_gate.weight", {E, vd}, R::matrix});
            s.push_back({p + "ssm_conv1d.weight", {hp.ssm_d_conv, conv}, R::conv});
            s.push_back({p + "ssm_dt.bias", {hv}, R::vector});
            s.push_back({p + "ssm_a", {hv}, R::vector});
            s.push_back({p + "ssm_beta.weight", {E, hv}, R::matrix});
            s.push_back({p + "ssm_alpha.weight", {E, hv}, R::matrix});
            s.push_back({p + "ssm_norm.weight", {hp.ssm_d_state}, R::norm});
            s.push_back({p + "ssm_out.weight", {vd, E}, R::matrix});
        } else {
            const int64_t hd = hp.head_dim, q = 2 * hp.n_head * hd, kv = hp.n_head_kv * hd;
            s.push_back({p + "attn_q.weight", {E, q}, R::matrix});  // per head: hd query then hd gate
            s.push_back({p + "attn_k.weight", {E, kv}, R::matrix});
            s.push_back({p + "attn_v.weight", {E, kv}, R::matrix});
            s.push_back({p + "attn_output.weight", {hp.n_head * hd, E}, R::matrix});
            s.push_back({p + "attn_q_norm.weight", {hd}, R::norm});
            s.push_back({p + "attn_k_norm.weight", {hd}, R::norm});
        }
        s.push_back({p + "post_attention_norm.weight", {E}, R::norm});
        s.push_back({p + "ffn_gate.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_up.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_down.weight", {hp.n_ff, E}, R::matrix});
    }
    return s;
}

// ---------------------------------------------------------------------------------------------
// Runtime: weights, state, graph
// ---------------------------------------------------------------------------------------------

qwen35_weights bind_qwen35_weights(const qwen35_hparams & hp, const tensor_store & store) {
    return bind_qwen35_weights(hp, [&](const std::string & name) { return store.get(name); },
                               [](uint32_t) { return true; });
}

qwen35_weights bind_qwen35_weights(const qwen35_hparams & hp, const std::function<ggml_tensor *(const std::string &)> & get,
                                   const std::function<bool(uint32_t)> & want_layer) {
    struct getter {
        const std::function<ggml_tensor *(const std::string &)> & f;
        ggml_tensor * get(const std::string & name) const { return f(name); }
    } st{get};
    qwen35_weights w;
    w.token_embd = st.get("token_embd.weight");
    w.output_norm = st.get("output_norm.weight");
    w.output = hp.has_output ? st.get("output.weight") : w.token_embd;
    w.layers.resize(hp.n_layer);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!want_layer(il)) {
            continue;
        }
        const std::string p = "blk." + std::to_string(il) + ".";
        qwen35_layer_weights & l = w.layers[il];
        l.attn_norm = st.get(p + "attn_norm.weight");
        l.post_attention_norm = st.get(p + "post_attention_norm.weight");
        l.ffn_gate = st.get(p + "ffn_gate.weight");
        l.ffn_up = st.get(p + "ffn_up.weight");
        l.ffn_down = st.get(p + "ffn_down.weight");
        if (hp.is_recurrent[il]) {
            l.ssm_qkv = st.get(p + "attn_qkv.weight");
            l.ssm_gate = st.get(p + "attn_gate.weight");
            l.ssm_conv1d = st.get(p + "ssm_conv1d.weight");
            l.ssm_dt_bias = st.get(p + "ssm_dt.bias");
            l.ssm_a = st.get(p + "ssm_a");
            l.ssm_beta = st.get(p + "ssm_beta.weight");
            l.ssm_alpha = st.get(p + "ssm_alpha.weight");
            l.ssm_norm = st.get(p + "ssm_norm.weight");
            l.ssm_out = st.get(p + "ssm_out.weight");
        } else {
            l.wq = st.get(p + "attn_q.weight");
            l.wk = st.get(p + "attn_k.weight");
            l.wv = st.get(p + "attn_v.weight");
            l.wo = st.get(p + "attn_output.weight");
            l.q_norm = st.get(p + "attn_q_norm.weight");
            l.k_norm = st.get(p + "attn_k_norm.weight");
        }
    }
    return w;
}

namespace {

// A DeltaNet layer's [dk*dk*Hv, n] F32 state checkpoints (qwen35_state::ssm_ckpt), in ctx.
ggml_tensor * new_state_checkpoint(ggml_context * ctx, const qwen35_hparams & hp, uint32_t n, uint32_t il) {
    const int64_t d = int64_t(hp.ssm_d_state) * hp.ssm_d_state * hp.ssm_n_v_heads;
    ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n);
    ggml_format_name(t, "ckpt_ssm-%u", il);
    return t;
}

}  // namespace

qwen35_state qwen35_state::allocate(const qwen35_hparams & hp, uint32_t kv_size, ggml_type type_k, ggml_type type_v,
                                    const std::vector<int32_t> & capture_layers, uint32_t ring_size,
                                    uint32_t n_checkpoints, ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev,
                                    const std::vector<bool> * layers, const std::vector<bool> * fused,
                                    bool keep_states) {
    auto has_layer = [&](uint32_t il) { return layers == nullptr || (*layers)[il]; };
    qwen35_state s;
    s.n_checkpoints = n_checkpoints;
    s.ssm_ckpt.assign(hp.n_layer, nullptr);
    s.conv_ckpt.assign(hp.n_layer, nullptr);
    s.inputs_ckpt.assign(hp.n_layer, nullptr);
    s.kv_size = kv_size;
    s.capture_layers = capture_layers;
    s.ring_size = capture_layers.empty() ? 0 : ring_size;
    s.k.assign(hp.n_layer, nullptr);
    s.v.assign(hp.n_layer, nullptr);
    s.conv.assign(hp.n_layer, nullptr);
    s.ssm.assign(hp.n_layer, nullptr);
    s.ring.assign(capture_layers.size(), nullptr);
    const size_t n_tensors = 5 * size_t(hp.n_layer) + capture_layers.size();
    s.store = tensor_store::allocate(buft, dev, n_tensors, [&](ggml_context * ctx) {
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            if (!has_layer(il)) {
                continue;
            }
            if (hp.is_recurrent[il]) {
                s.conv[il] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp.ssm_d_conv - 1, hp.conv_dim());
                ggml_format_name(s.conv[il], "cache_conv-%u", il);
                s.ssm[il] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, int64_t(hp.ssm_d_state) * hp.ssm_d_state,
                                               hp.ssm_n_v_heads);
                ggml_format_name(s.ssm[il], "cache_ssm-%u", il);
                if (n_checkpoints > 0) {
                    const bool layer_fused = fused != nullptr && (*fused)[il];
                    if (keep_states || !layer_fused) {
                        s.ssm_ckpt[il] = new_state_checkpoint(ctx, hp, n_checkpoints, il);
                    }
                    s.conv_ckpt[il] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp.ssm_d_conv - 1 + n_checkpoints,
                                                         hp.conv_dim());
                    ggml_format_name(s.conv_ckpt[il], "ckpt_conv-%u", il);
                    if (layer_fused) {
                        s.inputs_ckpt[il] =
                            ggml_new_tensor_1d(ctx, GGML_TYPE_F32, int64_t(hp.fused_inputs_dim()) * n_checkpoints);
                        ggml_format_name(s.inputs_ckpt[il], "ckpt_inputs-%u", il);
                    }
                }
            } else {
                const int64_t row = int64_t(hp.n_head_kv) * hp.head_dim;
                s.k[il] = ggml_new_tensor_2d(ctx, type_k, row, kv_size);
                ggml_format_name(s.k[il], "cache_k-%u", il);
                s.v[il] = ggml_new_tensor_2d(ctx, type_v, row, kv_size);
                ggml_format_name(s.v[il], "cache_v-%u", il);
            }
        }
        for (size_t i = 0; i < capture_layers.size(); ++i) {
            if (!has_layer(std::min<uint32_t>(static_cast<uint32_t>(capture_layers[i]), hp.n_layer - 1))) {
                continue;
            }
            s.ring[i] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp.n_embd, ring_size);
            ggml_format_name(s.ring[i], "feature_ring-%d", capture_layers[i]);
        }
    }, "the sequence state (KV cache, recurrent state, feature ring)");
    s.store.clear();
    std::vector<int64_t> rows;  // the replay table (replay_layers): {x, state, conv source, conv} addresses a layer
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (s.inputs_ckpt[il] != nullptr) {
            for (const ggml_tensor * t : {s.inputs_ckpt[il], s.ssm[il], s.conv_ckpt[il], s.conv[il]})
                rows.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t->data)));
        }
    }
    if (!rows.empty()) {
        s.table_stores.push_back(tensor_store::allocate(buft, dev, 1, [&](ggml_context * ctx) {
            s.replay_table = ggml_new_tensor_2d(ctx, GGML_TYPE_I64, kernels::delta_net::REPLAY_COLUMNS,
                                                int64_t(rows.size()) / kernels::delta_net::REPLAY_COLUMNS);
            ggml_set_name(s.replay_table, "replay_table");
        }, "the DeltaNet replay table"));
        ggml_backend_tensor_set(s.replay_table, rows.data(), 0, rows.size() * sizeof(int64_t));
    }
    return s;
}

void qwen35_state::clear() {
    store.clear();
    for (tensor_store & more : more_stores) {
        more.clear();
    }
}

std::vector<uint32_t> qwen35_state::layers_without_state_checkpoints() const {
    std::vector<uint32_t> missing;
    for (size_t il = 0; il < ssm.size(); ++il) {
        if (ssm[il] != nullptr && n_checkpoints > 0 && ssm_ckpt[il] == nullptr) {
            missing.push_back(static_cast<uint32_t>(il));
        }
    }
    return missing;
}

bool qwen35_state::has_state_checkpoints() const { return layers_without_state_checkpoints().empty(); }

void qwen35_state::add_state_checkpoints(const qwen35_hparams & hp, ggml_backend_buffer_type_t buft,
                                         ggml_backend_dev_t dev) {
    const std::vector<uint32_t> missing = layers_without_state_checkpoints();
    if (missing.empty()) {
        return;
    }
    std::vector<ggml_tensor *> made(hp.n_layer, nullptr);
    tensor_store added = tensor_store::allocate(buft, dev, missing.size(), [&](ggml_context * ctx) {
        for (uint32_t il : missing) {
            made[il] = new_state_checkpoint(ctx, hp, n_checkpoints, il);
        }
    }, "the DeltaNet state checkpoints of tree verifies");
    for (uint32_t il : missing) {
        ssm_ckpt[il] = made[il];
    }
    more_stores.push_back(std::move(added));
}

namespace {

using graph::named;
namespace delta_net = kernels::delta_net;

// Whether a DeltaNet layer can run the fused step ops: their shape (fused_delta_net_shape), F32
// conv, gate and norm weights, on a backend that runs them (kernels::fused_ops_in).
bool fused_layer(const qwen35_hparams & hp, const qwen35_layer_weights & l) {
    if (l.ssm_conv1d == nullptr || !hp.fused_delta_net_shape()) return false;
    for (const ggml_tensor * t : {l.ssm_conv1d, l.ssm_dt_bias, l.ssm_a, l.ssm_norm})
        if (t == nullptr || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return false;
    return kernels::fused_ops_in(l.ssm_conv1d->buffer);
}

// Whether a chain's attention mask is built in the graph from each row's key range
// (kernels/range_mask.h) rather than written on the host and uploaded: where the attention layers'
// weights are on a backend that runs lucebox's custom ops (as for fused_layer).
bool mask_in_graph(const qwen35_hparams & hp, const qwen35_weights & w, uint32_t l0, uint32_t l1) {
    if (!kernels::range_mask::enabled()) return false;
    for (uint32_t il = l0; il < l1; ++il)
        if (!hp.is_recurrent[il]) return w.layers[il].q_norm != nullptr && kernels::fused_ops_in(w.layers[il].q_norm->buffer);
    return false;
}

// Whether the fused ops take T tokens of a layer that can run them (fused_layer): any number in host
// memory, where the CPU backend runs their reference code, a loop over the tokens (so every batch,
// a prefill's too, gives a token the bits of a decode step); at most MAX_TOKENS on a GPU (its kernels').
bool fused_takes(const qwen35_layer_weights & l, int64_t T) {
    return T <= delta_net::MAX_TOKENS || ggml_backend_buffer_is_host(l.ssm_conv1d->buffer);
}

// Whether a DeltaNet layer's T-token batch runs as the fused step ops (kernels/delta_net_step.h):
// a chain (not a tree) of a layer that can (fused_layer), of a length they take (fused_takes).
bool fused_step(const qwen35_hparams & hp, const qwen35_layer_weights & l, const qwen35_inputs & in, int64_t T) {
    return in.parents == nullptr && fused_layer(hp, l) && fused_takes(l, T);
}

// Whether a tree verify's DeltaNet layer runs the fused ops with the tree's conv windows and parents,
// so that each node's results are the bits of decode steps along its path (which run the same ops):
// a tree of a layer that can (fused_layer), of a size they take (fused_takes).
bool fused_tree(const qwen35_hparams & hp, const qwen35_layer_weights & l, const qwen35_inputs & in, int64_t T) {
    return in.parents != nullptr && fused_layer(hp, l) && fused_takes(l, T);
}

// A tree verify's conv sequence [carried window | batch] as [conv_dim, d_conv-1+T] (channels fastest),
// copied into the first floats of the layer's conv checkpoint as it is: the tree commit gathers the
// kept columns from there (build_qwen35_tree_commit_graph). Returns the sequence.
ggml_tensor * tree_conv_sequence(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * conv_state, ggml_tensor * qkv,
                                 ggml_tensor * conv_ckpt, int il) {
    const int64_t conv_dim = qkv->ne[0], n = conv_state->ne[0] + qkv->ne[1];
    ggml_tensor * seq = named(ggml_concat(ctx, ggml_cont(ctx, ggml_transpose(ctx, conv_state)), qkv, 1), "gdn_tree_conv_seq", il);
    ggml_tensor * dst = ggml_view_2d(ctx, conv_ckpt, conv_dim, n, conv_dim * ggml_element_size(conv_ckpt), 0);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, seq, dst));
    return seq;
}

// Whether a chain verify of T tokens keeps the fused inputs op's result (the layer has inputs_ckpt)
// for a commit that re-runs the kept tokens, instead of writing every token's state. The verify
// graph and the commit graph decide alike (from the state, not from switches that may change).
bool replays_commit(bool chain, const ggml_tensor * inputs_ckpt, int64_t T) {
    return chain && inputs_ckpt != nullptr && T <= delta_net::MAX_TOKENS;
}

// Gated DeltaNet mixer. x: the layer input [E, T] and its norm (each projection normalizes it) -> [E, T].
// Updates conv and ssm state in place.
ggml_tensor * build_delta_net(ggml_context * ctx, ggml_cgraph * gf, const qwen35_hparams & hp,
                              const qwen35_layer_weights & l, ggml_tensor * conv_state, ggml_tensor * ssm_state,
                              bool verify, ggml_tensor * conv_ckpt, ggml_tensor * ssm_ckpt, ggml_tensor * inputs_ckpt,
                              const qwen35_inputs & in, const graph::rms_normed & x, int il) {
    // verify: keep every token's state in ssm_ckpt (null where the layer replays its commits) and
    // conv input in conv_ckpt, leave the state alone;
    // in.parents non-null: tree verify (each node continues its parent's conv window and state);
    // a chain verify that replays_commit: the fused inputs op's result goes to inputs_ckpt instead
    // of the states to ssm_ckpt, and the commit re-runs the kept tokens (build_qwen35_commit_graph)
    const int64_t T = x.x->ne[1];
    const int64_t dk = hp.ssm_d_state, Hk = hp.ssm_n_k_heads, Hv = hp.ssm_n_v_heads;
    const int64_t key_dim = hp.key_dim(), conv_dim = hp.conv_dim(), d_conv = hp.ssm_d_conv;

    // one product when the four weights are stacked (qwen35_projection_stacks)
    const std::vector<ggml_tensor *> proj =
        graph::stacked_products(ctx, {l.ssm_qkv, l.ssm_gate, l.ssm_beta, l.ssm_alpha}, x);
    ggml_tensor * qkv = named(proj[0], "gdn_qkv", il);                            // [conv_dim, T]
    // the same layer as below in two fused ops (kernels/delta_net_step.h): the conv window goes back
    // into the state (decode) or whole into the checkpoint (verify); the state likewise
    const bool replayed = verify && replays_commit(in.parents == nullptr, inputs_ckpt, T);
    if (verify && !replayed && ssm_ckpt == nullptr) {
        throw error("internal: a verify of layer " + std::to_string(il) + " keeps states it has no checkpoints for");
    }
    // a layer with inputs_ckpt verifies fused exactly when it replays (its verify and commit graphs
    // agree whatever the kernel switches say now); other layers as fused_step says
    const bool fused = replayed || ((!verify || inputs_ckpt == nullptr) && fused_step(hp, l, in, T));
    if (fused_tree(hp, l, in, T)) {
        // a tree on the fused ops: the conv checkpoint in the tree commit's layout, each node's window
        // from the tree's table, each node's state from its parent's; the states go to the checkpoint
        // slots (slot T-1-t: node t)
        tree_conv_sequence(ctx, gf, conv_state, qkv, conv_ckpt, il);
        ggml_tensor * xin = named(delta_net::inputs(ctx, qkv, proj[2], proj[3], conv_state, l.ssm_conv1d, l.ssm_dt_bias,
                                                    l.ssm_a, nullptr, Hk, 0, hp.rms_eps, nullptr, in.conv_rows),
                                  "gdn_inputs", il);
        ggml_tensor * o = named(delta_net::recurrence(ctx, xin, T, proj[1], ssm_state, l.ssm_norm, ssm_ckpt, Hk,
                                                      delta_net::state_out::every_state, hp.rms_eps, in.parents),
                                "gdn_gated", il);
        return named(ggml_mul_mat(ctx, l.ssm_out, o), "gdn_out", il);
    }
    if (fused) {
        ggml_tensor * keep = replayed ? ggml_view_1d(ctx, inputs_ckpt, int64_t(hp.fused_inputs_dim()) * T, 0) : nullptr;
        ggml_tensor * xin = named(delta_net::inputs(ctx, qkv, proj[2], proj[3], conv_state, l.ssm_conv1d, l.ssm_dt_bias,
                                                    l.ssm_a, conv_ckpt != nullptr ? conv_ckpt : conv_state, Hk,
                                                    conv_ckpt != nullptr ? 0 : T, hp.rms_eps, keep),
                                  "gdn_inputs", il);  // replayed: kept for the commit, no state written
        const int64_t D = dk * dk * Hv;
        ggml_tensor * state_dst = verify && !replayed ? ssm_ckpt : ggml_view_2d(ctx, ssm_state, D, 1, D * sizeof(float), 0);
        const delta_net::state_out mode = replayed ? delta_net::state_out::none
                                          : verify ? delta_net::state_out::every_state
                                                   : delta_net::state_out::final_state;
        ggml_tensor * o = named(delta_net::recurrence(ctx, xin, T, proj[1], ssm_state, l.ssm_norm, state_dst, Hk, mode,
                                                      hp.rms_eps),
                                "gdn_gated", il);
        return named(ggml_mul_mat(ctx, l.ssm_out, o), "gdn_out", il);
    }
    ggml_tensor * z = named(graph::contiguous(ctx, proj[1]), "gdn_z", il);  // [value_dim, T]
    ggml_tensor * beta = ggml_sigmoid(ctx, graph::contiguous(ctx, proj[2]));  // [Hv, T]
    beta = named(ggml_reshape_4d(ctx, beta, 1, Hv, T, 1), "gdn_beta", il);
    ggml_tensor * alpha = ggml_add(ctx, proj[3], l.ssm_dt_bias);
    ggml_tensor * g = ggml_mul(ctx, ggml_softplus(ctx, alpha), l.ssm_a);  // log decay <= 0
    g = named(ggml_reshape_4d(ctx, g, 1, Hv, T, 1), "gdn_g", il);

    // causal depthwise conv over [carried d_conv-1 inputs, this batch] (weights in one device's memory:
    // a width ggml's CUDA conv has no kernel for runs padded with zero taps, graph::ssm_conv)
    const bool pad_conv = !ggml_backend_buffer_is_host(l.ssm_conv1d->buffer) &&
                          !is_meta(ggml_backend_buffer_get_type(l.ssm_conv1d->buffer));
    ggml_tensor * conv_out = nullptr;
    if (in.parents != nullptr) {
        // tree: gather each node's window [conv_dim, d_conv] from [carried state | batch] (channels
        // fastest; kept in the checkpoint), then one conv "sequence" of a single output per node
        ggml_tensor * seq = tree_conv_sequence(ctx, gf, conv_state, qkv, conv_ckpt, il);
        ggml_tensor * win = ggml_get_rows(ctx, seq, in.conv_rows);                                     // [conv_dim, d_conv*T]
        win = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, win, conv_dim, d_conv, T), 1, 0, 2, 3));  // [d_conv, conv_dim, T]
        named(win, "gdn_tree_conv_win", il);
        conv_out = ggml_reshape_3d(ctx, graph::ssm_conv(ctx, win, l.ssm_conv1d, pad_conv), conv_dim, T, 1);  // [conv_dim, T, 1]
    } else {
        ggml_tensor * conv_in = ggml_concat(ctx, conv_state, ggml_transpose(ctx, qkv), 0);  // [d_conv-1+T, conv_dim]
        named(conv_in, "gdn_conv_in", il);
        if (conv_ckpt != nullptr) {
            ggml_tensor * dst = ggml_view_2d(ctx, conv_ckpt, d_conv - 1 + T, conv_dim, conv_ckpt->nb[1], 0);
            ggml_build_forward_expand(gf, graph::copy_by_kernel(ctx, conv_in, dst));  // conv_dim narrow rows
        } else {
            ggml_tensor * new_conv = ggml_view_2d(ctx, conv_in, d_conv - 1, conv_dim, conv_in->nb[1],
                                                  T * ggml_element_size(conv_in));
            ggml_build_forward_expand(gf, graph::copy_by_kernel(ctx, new_conv, conv_state));
        }
        conv_out = graph::ssm_conv(ctx, ggml_reshape_3d(ctx, conv_in, d_conv - 1 + T, conv_dim, 1), l.ssm_conv1d,
                                   pad_conv);  // [conv_dim, T, 1]
    }
    conv_out = named(ggml_silu(ctx, conv_out), "gdn_conv_out", il);

    // conv_out per token: [q: Hk heads of dk | k: Hk heads | v: Hv heads]. q and k are L2-normed
    // per head as one [dk, 2 Hk, T] tensor (one kernel), then viewed apart; v stays a view (the
    // gated delta net reads rows of dk contiguous floats at any stride).
    const size_t es = ggml_element_size(conv_out);
    ggml_tensor * qk = ggml_view_3d(ctx, conv_out, dk, 2 * Hk, T, dk * es, conv_out->nb[1], 0);
    qk = named(graph::l2_norm(ctx, qk, hp.rms_eps), "gdn_qk", il);  // [dk, 2 Hk, T], contiguous
    ggml_tensor * q = ggml_view_4d(ctx, qk, dk, Hk, T, 1, qk->nb[1], qk->nb[2], qk->nb[2] * T, 0);
    ggml_tensor * k = ggml_view_4d(ctx, qk, dk, Hk, T, 1, qk->nb[1], qk->nb[2], qk->nb[2] * T, key_dim * es);
    ggml_tensor * v = ggml_view_4d(ctx, conv_out, dk, Hv, T, 1, dk * es, conv_out->nb[1], conv_out->nb[2], 2 * key_dim * es);
    ggml_tensor * s0 = ggml_reshape_4d(ctx, ssm_state, dk, dk, Hv, 1);
    const int64_t n_snap = verify ? T : 1;  // snapshots: slot s = state after token T-1-s
    ggml_tensor * res = in.parents != nullptr  // tree: n_snap = T, state of node i from its parent's
                            ? ggml_gated_delta_net_tree(ctx, q, k, v, g, beta, s0, in.parents)
                            : ggml_gated_delta_net(ctx, q, k, v, g, beta, s0, n_snap);
    named(res, "gdn_result", il);
    ggml_tensor * out = ggml_view_4d(ctx, res, dk, Hv, T, 1, ggml_row_size(res->type, dk),
                                     ggml_row_size(res->type, dk * Hv), ggml_row_size(res->type, dk * Hv * T), 0);
    // The snapshots [D, 1 seq, n_snap] go to the checkpoint columns (verify) or back into the state.
    // Both views have the shape the CUDA backend fuses into the kernel (gated_delta_net followed by a
    // cpy of its snapshot tail into a [D, n_seqs, n_snap] view with a D-float seq stride): the kernel
    // then writes the states straight into the cache, and neither the tail nor the copy is touched.
    const int64_t D = dk * dk * Hv;
    const size_t row = ggml_row_size(res->type, D);
    ggml_tensor * snaps = ggml_view_3d(ctx, res, D, 1, n_snap, row, row, ggml_row_size(res->type, dk * Hv * T));
    ggml_tensor * dst = verify ? ggml_view_3d(ctx, ssm_ckpt, D, 1, T, row, ssm_ckpt->nb[1], 0)
                                            : ggml_view_3d(ctx, ssm_state, D, 1, 1, row, row, 0);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, snaps, dst));

    // gated norm: RMSNorm per head * ssm_norm * silu(z)
    ggml_tensor * zr = ggml_reshape_4d(ctx, z, dk, Hv, T, 1);
    ggml_tensor * o = ggml_mul(ctx, graph::rms_norm(ctx, out, l.ssm_norm, hp.rms_eps), ggml_silu(ctx, zr));
    o = named(ggml_reshape_2d(ctx, o, dk * Hv, T), "gdn_gated", il);
    return named(ggml_mul_mat(ctx, l.ssm_out, o), "gdn_out", il);
}

// A gated attention layer's attention on ggml's ops: flash attention of q over the caches' first
// n_kv rows, then the gate's cont, sigmoid and product. q [hd, H, T] F32 (the roped queries);
// k_cache, v_cache [hd*Hkv, n_ctx] F16 or any type ggml's flash attention takes (rows nb[1] apart,
// KV head i at values i*hd .. i*hd + hd - 1 of a row; the first n_kv rows are read); mask
// [>= n_kv, >= T] F16, ggml_flash_attn_ext's; gate [hd, H, T] F32 (a strided view of the query
// projection). Returns [hd*H, T] F32.
ggml_tensor * gated_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache,
                              int64_t n_kv, ggml_tensor * mask, ggml_tensor * gate, float scale) {
    const int64_t hd = q->ne[0], H = q->ne[1], T = q->ne[2], Hkv = k_cache->ne[0] / hd;
    ggml_tensor * kv_k = ggml_view_3d(ctx, k_cache, hd, Hkv, n_kv, ggml_row_size(k_cache->type, hd), k_cache->nb[1], 0);
    ggml_tensor * kv_v = ggml_view_3d(ctx, v_cache, hd, Hkv, n_kv, ggml_row_size(v_cache->type, hd), v_cache->nb[1], 0);
    // [hd, T, H] queries, [hd, n_kv, Hkv] keys and values -> [hd, H, T]
    ggml_tensor * att = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), ggml_permute(ctx, kv_k, 0, 2, 1, 3),
                                            ggml_permute(ctx, kv_v, 0, 2, 1, 3), mask, scale, 0.0f, 0.0f);
    att = ggml_reshape_2d(ctx, att, hd * H, T);
    return ggml_mul(ctx, att, ggml_sigmoid(ctx, ggml_cont_2d(ctx, gate, hd * H, T)));
}

}  // namespace

ggml_tensor * build_gated_attention(ggml_context * ctx, ggml_cgraph * gf, const qwen35_hparams & hp,
                                    const qwen35_layer_weights & l, ggml_tensor * k_cache, ggml_tensor * v_cache,
                                    const qwen35_inputs & in, uint32_t n_kv, const graph::rms_normed & x, int il) {
    const int64_t T = x.x->ne[1];
    const int64_t hd = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;

    // one product when the three weights are stacked (qwen35_projection_stacks)
    const std::vector<ggml_tensor *> proj = graph::stacked_products(ctx, {l.wq, l.wk, l.wv}, x);
    ggml_tensor * qg = named(proj[0], "attn_qg", il);  // [2*hd*H, T]
    const size_t es = ggml_element_size(qg);
    ggml_tensor * q = ggml_view_3d(ctx, qg, hd, H, T, 2 * hd * es, qg->nb[1], 0);
    ggml_tensor * gate = ggml_view_3d(ctx, qg, hd, H, T, 2 * hd * es, qg->nb[1], hd * es);  // [hd, H, T]
    q = named(graph::rms_norm(ctx, q, l.q_norm, hp.rms_eps), "attn_q", il);  // [hd, H, T]

    ggml_tensor * k = ggml_view_3d(ctx, proj[1], hd, Hkv, T, hd * es, proj[1]->nb[1], 0);
    k = named(graph::rms_norm(ctx, k, l.k_norm, hp.rms_eps), "attn_k", il);
    ggml_tensor * v = named(proj[2], "attn_v", il);  // [hd*Hkv, T] (rows contiguous)

    // NEOX where that is the same rotation (rope_reads_positions_only), so that ggml's CUDA backend
    // runs each of q's and k's norm and rope as one kernel, k's with its cache write
    auto rope = [&](ggml_tensor * t) {
        if (hp.rope_reads_positions_only()) {
            return ggml_rope_ext(ctx, t, in.pos, nullptr, int(hp.n_rot), GGML_ROPE_TYPE_NEOX, int(hp.n_ctx_train),
                                 hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        }
        int sections[GGML_MROPE_SECTIONS] = {hp.rope_sections[0], hp.rope_sections[1], hp.rope_sections[2],
                                             hp.rope_sections[3]};
        return ggml_rope_multi(ctx, t, in.pos, nullptr, int(hp.n_rot), sections, GGML_ROPE_TYPE_IMROPE,
                               int(hp.n_ctx_train), hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    };
    q = rope(q);
    k = rope(k);
    named(q, "attn_q_rope", il);
    named(k, "attn_k_rope", il);

    ggml_build_forward_expand(gf, ggml_set_rows(ctx, k_cache, graph::cache_rows(ctx, k), in.kv_rows));
    ggml_build_forward_expand(gf, ggml_set_rows(ctx, v_cache, v, in.kv_rows));

    const float scale = hp.attn_scale != 0.0f ? hp.attn_scale : 1.0f / std::sqrt(float(hd));
    // [hd H, T]: ggml's flash attention and gate ops (an own fused op measured slower on an H200 at
    // every token count and cache depth: docs/benchmarks.md)
    ggml_tensor * att = gated_attention(ctx, q, k_cache, v_cache, n_kv, in.kq_mask, gate, scale);
    att = named(att, "attn_gated", il);
    return named(ggml_mul_mat(ctx, l.wo, att), "attn_proj", il);
}

qwen35_graph build_qwen35_graph(ggml_context * ctx, const qwen35_hparams & hp, const qwen35_weights & w,
                                const qwen35_state & st, uint32_t n_tokens, uint32_t n_kv, uint32_t n_out,
                                bool want_argmax, bool verify, bool tree, qwen35_layer_range range) {
    verify = verify || tree;
    const uint32_t l0 = range.end == 0 ? 0 : range.begin;
    const uint32_t l1 = range.end == 0 ? hp.n_layer : range.end;
    if (l0 >= l1 || l1 > hp.n_layer) {
        throw error("internal: layer range [" + std::to_string(l0) + ", " + std::to_string(l1) + ") of " +
                    std::to_string(hp.n_layer) + " layers");
    }
    const bool first = l0 == 0, last = l1 == hp.n_layer;
    bool range_has_attention = false;
    for (uint32_t il = l0; il < l1; ++il) {
        range_has_attention = range_has_attention || !hp.is_recurrent[il];
    }
    auto captured_here = [&](int32_t layer) {
        return (layer >= int32_t(l0) && layer < int32_t(l1)) || (last && layer == int32_t(hp.n_layer));
    };
    const bool range_captures = std::any_of(st.capture_layers.begin(), st.capture_layers.end(), captured_here);
    if (verify && n_tokens > st.n_checkpoints) {
        throw error("internal: verify of " + std::to_string(n_tokens) + " tokens exceeds the " +
                    std::to_string(st.n_checkpoints) + " checkpoint slots");
    }
    qwen35_graph g;
    g.gf = ggml_new_graph_custom(ctx, 16384, false);
    const int64_t T = n_tokens;

    qwen35_inputs & in = g.in;
    if (first) {
        in.tokens = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T), "inp_tokens");
    } else {
        in.hidden = named(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp.n_embd, T), "inp_hidden");
    }
    if (n_out != n_tokens && last) {
        in.out_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_out), "inp_out_rows");
    }
    const bool graph_mask = range_has_attention && mask_in_graph(hp, w, l0, l1);
    if (tree && (hp.n_recurrent_layers() > 0 || graph_mask)) {  // the DeltaNet layers' and the mask's
        in.parents = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T), "inp_tree_parents");
    }
    if (tree && hp.n_recurrent_layers() > 0) {
        in.conv_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, int64_t(hp.ssm_d_conv) * T), "inp_tree_conv_rows");
    }
    if (range_has_attention) {  // inputs only attention uses (an unused input has no buffer)
        // [T] positions for a NEOX rope, else [4 T] IMRoPE streams (rope_reads_positions_only)
        in.pos = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, hp.rope_reads_positions_only() ? T : 4 * T), "inp_pos");
        in.kv_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, T), "inp_kv_rows");
        if (graph_mask) {  // a tree's: the committed context, then each node's path (range_mask.h)
            in.kq_ranges = named(ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, T), "inp_kq_ranges");
            in.kq_mask = named(kernels::range_mask::build(ctx, in.kq_ranges, n_kv, tree ? in.parents : nullptr), "kq_mask");
        } else {
            in.kq_mask = named(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, T), "inp_kq_mask");
        }
    }
    if (range_captures) {
        in.ring_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, T), "inp_ring_rows");
    }
    for (ggml_tensor * t : {in.tokens, in.hidden, in.pos, in.kv_rows, in.out_rows, in.kq_ranges, in.ring_rows,
                            in.parents, in.conv_rows, in.kq_ranges != nullptr ? nullptr : in.kq_mask}) {
        if (t != nullptr) {
            ggml_set_input(t);
        }
    }

    auto capture = [&](ggml_tensor * hidden, int32_t layer) {
        for (size_t i = 0; i < st.capture_layers.size(); ++i) {
            if (st.capture_layers[i] == layer) {
                ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, st.ring[i], hidden, in.ring_rows));
            }
        }
    };

    ggml_tensor * cur = first ? named(ggml_get_rows(ctx, w.token_embd, in.tokens), "embd") : in.hidden;  // [E, T]
    for (uint32_t il = l0; il < l1; ++il) {
        const qwen35_layer_weights & l = w.layers[il];
        capture(cur, int32_t(il));
        const graph::rms_normed x{cur, l.attn_norm, hp.rms_eps, "attn_norm", int(il)};  // (each projection's own)
        ggml_tensor * mix = hp.is_recurrent[il]
                                ? build_delta_net(ctx, g.gf, hp, l, st.conv[il], st.ssm[il], verify,
                                                  verify ? st.conv_ckpt[il] : nullptr,
                                                  verify ? st.ssm_ckpt[il] : nullptr,
                                                  verify ? st.inputs_ckpt[il] : nullptr, in, x, il)
                                : build_gated_attention(ctx, g.gf, hp, l, st.k[il], st.v[il], in, n_kv, x, il);
        cur = named(ggml_add(ctx, mix, cur), "attn_residual", il);
        ggml_tensor * h = named(graph::rms_norm(ctx, cur, l.post_attention_norm, hp.rms_eps), "ffn_norm", il);
        cur = named(ggml_add(ctx, graph::swiglu_ffn(ctx, h, l.ffn_gate, l.ffn_up, l.ffn_down, il), cur), "l_out", il);
    }
    if (!last) {
        g.hidden = named(cur, "range_out");  // handed to the next range's in.hidden
        ggml_set_output(g.hidden);
        ggml_build_forward_expand(g.gf, g.hidden);
        return g;
    }
    capture(cur, int32_t(hp.n_layer));

    if (n_out != n_tokens) {
        cur = ggml_get_rows(ctx, cur, in.out_rows);
    }
    cur = named(graph::rms_norm(ctx, cur, w.output_norm, hp.rms_eps), "result_norm");
    g.logits = named(ggml_mul_mat(ctx, w.output, cur), "result_logits");  // [V, n_out]
    ggml_set_output(g.logits);
    ggml_build_forward_expand(g.gf, g.logits);
    if (want_argmax) {
        g.argmax = named(ggml_argmax(ctx, g.logits), "result_argmax");
        ggml_set_output(g.argmax);
        ggml_build_forward_expand(g.gf, g.argmax);
    }
    return g;
}

void set_qwen35_inputs(ggml_backend_sched_t sched, const qwen35_graph & g, const qwen35_hparams & hp,
                       const int32_t * tokens, uint32_t n_past, uint32_t T, uint32_t n_kv, uint32_t ring_size,
                       const std::vector<int32_t> * parents, std::vector<ggml_fp16_t> & staging) {
    const qwen35_inputs & in = g.in;
    if (in.tokens != nullptr) {
        graph::set(sched, in.tokens, tokens, sizeof(int32_t) * T);
    }
    if (in.pos != nullptr) {
        std::vector<int32_t> depth(T);
        for (uint32_t i = 0; i < T; ++i) {
            depth[i] = parents == nullptr ? int32_t(i) : (*parents)[i] < 0 ? 0 : depth[size_t((*parents)[i])] + 1;
        }
        // [T] positions, or [4 T] IMRoPE streams: t, h, w the position, extra 0
        std::vector<int32_t> pos(size_t(ggml_nelements(in.pos)), 0);
        const bool streams = pos.size() == 4 * size_t(T);
        std::vector<int64_t> rows(T);
        // a chain: row i sees keys 0 .. n_past + i; a tree: the committed context 0 .. n_past - 1, then
        // its path's keys n_past + j (range_mask.h)
        std::vector<int32_t> ranges(2 * size_t(T));
        for (uint32_t i = 0; i < T; ++i) {
            pos[i] = static_cast<int32_t>(n_past + uint32_t(depth[i]));
            if (streams) {
                pos[T + i] = pos[2 * T + i] = pos[i];
            }
            rows[i] = n_past + i;  // K/V rows in batch order (a tree commit compacts the kept path)
            ranges[2 * i] = 0, ranges[2 * i + 1] = int32_t(parents == nullptr ? n_past + i + 1 : n_past);
        }
        graph::set(sched, in.pos, pos.data(), sizeof(int32_t) * pos.size());
        graph::set(sched, in.kv_rows, rows.data(), sizeof(int64_t) * T);
        if (in.kq_ranges != nullptr) {
            graph::set(sched, in.kq_ranges, ranges.data(), sizeof(int32_t) * ranges.size());
        } else {  // the host writes the mask: a backend without lucebox's custom ops (a tensor split)
            const size_t n_mask = size_t(n_kv) * T;
            if (staging.capacity() > 4 * n_mask && staging.capacity() > (size_t(8) << 20)) {
                std::vector<ggml_fp16_t>().swap(staging);  // (a long prefill's mask, not kept for decoding)
            }
            if (staging.capacity() < n_mask) {
                staging.reserve(n_mask + n_mask / 4);  // (room for the next few, longer prefill batches)
            }
            staging.resize(n_mask);
            kernels::range_mask::fill(ranges.data(), n_kv, 0, T, staging.data(), T,
                                      parents != nullptr ? parents->data() : nullptr);
            graph::set(sched, in.kq_mask, staging.data(), sizeof(ggml_fp16_t) * n_mask);
        }
    }
    if (in.parents != nullptr) {
        graph::set(sched, in.parents, parents->data(), sizeof(int32_t) * T);
    }
    if (in.conv_rows != nullptr) {
        const std::vector<int32_t> conv_rows = qwen35_tree_conv_rows(*parents, hp.ssm_d_conv);
        graph::set(sched, in.conv_rows, conv_rows.data(), sizeof(int32_t) * conv_rows.size());
    }
    if (in.ring_rows != nullptr) {
        std::vector<int64_t> ring_rows(T);
        for (uint32_t i = 0; i < T; ++i) {
            ring_rows[i] = ring_size ? (n_past + i) % ring_size : 0;
        }
        graph::set(sched, in.ring_rows, ring_rows.data(), sizeof(int64_t) * T);
    }
    if (in.out_rows != nullptr) {
        const int32_t last = static_cast<int32_t>(T - 1);
        graph::set(sched, in.out_rows, &last, sizeof(int32_t));
    }
}

// ggml's argmax of a row whose logits are all NaN is -1 on CUDA (no value beats -FLT_MAX) and 0 on the
// CPU, so an id out of range, or id 0 with a non-finite logit (one 4-byte read, only when id 0 wins),
// is a forward pass that produced NaN: an error, not a token.
static void check_argmax(const qwen35_graph & g, size_t row, int32_t id) {
    const int64_t V = g.logits->ne[0];
    if (id > 0 && id < V) return;
    if (id == 0) {
        float v = 0.0f;
        ggml_backend_tensor_get(g.logits, &v, row * size_t(V) * sizeof(float), sizeof(float));
        if (std::isfinite(v)) return;
    }
    throw error("the target's logits of output row " + std::to_string(row) +
                " are not finite (NaN): the model's weights hold NaN or its computation overflowed");
}

std::vector<float> read_qwen35_outputs(const qwen35_graph & g, uint32_t T, bool all_logits, bool last_logits,
                                       int32_t * argmax_last, std::vector<int32_t> * argmax_rows) {
    const size_t V = size_t(g.logits->ne[0]);
    const size_t n_out = size_t(g.logits->ne[1]);
    std::vector<float> logits;
    if (all_logits) {
        logits.resize(size_t(T) * V);
        ggml_backend_tensor_get(g.logits, logits.data(), 0, sizeof(float) * logits.size());
    } else if (last_logits && argmax_last == nullptr && argmax_rows == nullptr) {
        logits.resize(V);
        ggml_backend_tensor_get(g.logits, logits.data(), (n_out - 1) * V * sizeof(float), sizeof(float) * V);
    }
    if (argmax_rows != nullptr) {
        argmax_rows->resize(T);
        ggml_backend_tensor_get(g.argmax, argmax_rows->data(), 0, sizeof(int32_t) * T);
        for (uint32_t r = 0; r < T; ++r) check_argmax(g, r, (*argmax_rows)[r]);
    }
    if (argmax_last != nullptr) {
        ggml_backend_tensor_get(g.argmax, argmax_last, (n_out - 1) * sizeof(int32_t), sizeof(int32_t));
        check_argmax(g, n_out - 1, *argmax_last);
    }
    return logits;
}

std::vector<bool> qwen35_fused_layers(const qwen35_hparams & hp, const qwen35_weights & w) {
    std::vector<bool> fused(hp.n_layer, false);
    for (uint32_t il = 0; il < hp.n_layer && il < w.layers.size(); ++il)
        fused[il] = hp.is_recurrent[il] && fused_layer(hp, w.layers[il]);
    return fused;
}

ggml_cgraph * build_qwen35_commit_graph(ggml_context * ctx, const qwen35_hparams & hp, const qwen35_state & st,
                                        uint32_t n_verified, uint32_t last_kept) {
    if (last_kept >= n_verified || n_verified > st.n_checkpoints) {
        throw error("internal: commit of token " + std::to_string(last_kept) + " of " + std::to_string(n_verified));
    }
    // nodes per DeltaNet layer that does not replay: the ssm copy (view, reshape, cpy), the conv copy
    // (view, view, cpy); the replaying layers' one node
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 6 * size_t(hp.n_layer) + 16, false);
    const int64_t D = int64_t(hp.ssm_d_state) * hp.ssm_d_state * hp.ssm_n_v_heads;
    int64_t replay_conv_stride = 0;  // floats between channels of the replaying layers' conv checkpoints
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!hp.is_recurrent[il] || st.ssm[il] == nullptr) {
            continue;
        }
        if (replays_commit(true, st.inputs_ckpt[il], n_verified)) {
            // the kept tokens' recurrence again from the state before the verify (the same bits as the
            // verify's state after token last_kept: the ops' results do not depend on the batch) and
            // the conv window after them, for every such layer in one node (replay_layers, below)
            replay_conv_stride = int64_t(st.conv_ckpt[il]->nb[1] / ggml_element_size(st.conv_ckpt[il]));
            continue;
        }
        ggml_tensor * ck = st.ssm_ckpt[il];
        if (ck == nullptr) {
            throw error("internal: commit of layer " + std::to_string(il) + " without its state checkpoints");
        }
        const size_t slot = n_verified - 1 - last_kept;
        ggml_tensor * src = ggml_view_1d(ctx, ck, D, slot * ck->nb[1]);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, src, ggml_reshape_1d(ctx, st.ssm[il], D)));
        ggml_tensor * cc = st.conv_ckpt[il];
        ggml_tensor * win = ggml_view_2d(ctx, cc, hp.ssm_d_conv - 1, hp.conv_dim(), cc->nb[1],
                                         (last_kept + 1) * ggml_element_size(cc));
        ggml_build_forward_expand(gf, graph::copy_by_kernel(ctx, win, st.conv[il]));
    }
    if (replay_conv_stride > 0) {
        if (st.replay_table == nullptr) {
            throw error("internal: a commit replays layers of a state without its replay table");
        }
        ggml_build_forward_expand(gf, delta_net::replay_layers(ctx, st.replay_table, n_verified, int64_t(last_kept) + 1,
                                                               hp.ssm_n_k_heads, hp.ssm_n_v_heads, hp.ssm_d_conv,
                                                               replay_conv_stride));
    }
    return gf;
}

std::vector<int32_t> qwen35_tree_conv_rows(const std::vector<int32_t> & parents, uint32_t d_conv) {
    const size_t T = parents.size();
    std::vector<int32_t> rows(T * d_conv);
    for (size_t i = 0; i < T; ++i) {
        // walk up from node i; past the root continue into the carried state, newest (d_conv-2) first
        int32_t node = int32_t(i), carried = int32_t(d_conv) - 2;
        for (int32_t w = int32_t(d_conv) - 1; w >= 0; --w) {
            if (node >= 0) {
                rows[i * d_conv + size_t(w)] = int32_t(d_conv) - 1 + node;
                node = parents[size_t(node)];
            } else {
                rows[i * d_conv + size_t(w)] = carried--;
            }
        }
    }
    return rows;
}

namespace {

void check_tree_commit_path(const qwen35_state & st, uint32_t n_verified, const std::vector<int32_t> & path) {
    if (path.empty() || path[0] != 0 || n_verified > st.n_checkpoints) {
        throw error("internal: tree commit of a path that does not start at the root");
    }
    for (size_t i = 1; i < path.size(); ++i) {
        if (path[i] <= path[i - 1] || uint32_t(path[i]) >= n_verified) {
            throw error("internal: tree commit path is not increasing within the " + std::to_string(n_verified) +
                        " verified nodes");
        }
    }
}

// conv_ckpt column of the new conv state's column w: the state is the last d_conv-1 entries of
// [carried state (conv_ckpt columns 0..d_conv-2) | path nodes (node j at column d_conv-1+j)]
int64_t tree_commit_conv_column(const qwen35_hparams & hp, const std::vector<int32_t> & path, int64_t w) {
    const int64_t n_keep = hp.ssm_d_conv - 1;
    const int64_t src_pos = int64_t(path.size()) + w;  // position in [carried (n_keep) | path (L)]
    return src_pos < n_keep ? src_pos : n_keep + path[size_t(src_pos - n_keep)];
}

}  // namespace

qwen35_tree_commit build_qwen35_tree_commit_graph(ggml_context * ctx, const qwen35_hparams & hp,
                                                  const qwen35_state & st) {
    qwen35_tree_commit g;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        for (ggml_tensor * t : {st.k[il], st.v[il]}) {
            if (t != nullptr && t->nb[1] % 4 != 0) {
                return g;  // no raw-word alias of these rows
            }
        }
    }
    if (!st.has_state_checkpoints()) {
        throw error("internal: a tree commit without the DeltaNet state checkpoints");
    }
    const int64_t N = st.n_checkpoints, n_keep = int64_t(hp.ssm_d_conv) - 1, C = hp.conv_dim();
    const bool recurrent = hp.n_recurrent_layers() > 0;
    g.n_slots = st.n_checkpoints;
    g.gf = ggml_new_graph_custom(ctx, 16 * size_t(hp.n_layer) + 4 * st.ring.size() + 32, false);
    g.moves = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4 * N + 1 + (recurrent ? n_keep : 0)),
                    "inp_tree_commit_moves");
    ggml_set_input(g.moves);
    const size_t i32 = sizeof(int32_t);
    ggml_tensor * kv_src = ggml_view_1d(ctx, g.moves, N, 0);
    ggml_tensor * kv_dst = ggml_view_1d(ctx, g.moves, N, N * i32);
    ggml_tensor * ring_src = ggml_view_1d(ctx, g.moves, N, 2 * N * i32);
    ggml_tensor * ring_dst = ggml_view_1d(ctx, g.moves, N, 3 * N * i32);
    ggml_tensor * ssm_slot = ggml_view_1d(ctx, g.moves, 1, 4 * N * i32);
    ggml_tensor * conv_cols = recurrent ? ggml_view_1d(ctx, g.moves, n_keep, (4 * N + 1) * i32) : nullptr;

    // `t` (new, unallocated) placed on the bytes of the state tensor `on` (same size)
    auto place = [&](ggml_tensor * t, ggml_tensor * on) {
        if (ggml_nbytes(t) != ggml_nbytes(on) ||
            ggml_backend_tensor_alloc(on->buffer, t, on->data) != GGML_STATUS_SUCCESS) {
            throw error(std::string("internal: cannot place a tree commit tensor on ") + on->name);
        }
        return t;
    };
    // rows [n_past + path[i]] -> [n_past + i] of a 2-D tensor: gather all, then scatter
    auto move_rows = [&](ggml_tensor * t, ggml_tensor * src, ggml_tensor * dst) {
        ggml_tensor * words = t;
        if (t->type != GGML_TYPE_F32) {  // an F32 alias of the same bytes: copies keep any type exactly
            words = place(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, int64_t(t->nb[1] / 4), t->ne[1]), t);
            ggml_format_name(words, "%s (words)", t->name);
        }
        ggml_tensor * rows = ggml_get_rows(ctx, words, src);  // [words per row, N]
        ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, words, rows, dst));
    };
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!hp.is_recurrent[il]) {
            if (st.k[il] != nullptr) {
                move_rows(st.k[il], kv_src, kv_dst);
                move_rows(st.v[il], kv_src, kv_dst);
            }
            continue;
        }
        if (st.ssm[il] == nullptr) {
            continue;
        }
        // [D, 1], gathered straight into the state (its output placed on the state's bytes)
        ggml_build_forward_expand(g.gf, place(ggml_get_rows(ctx, st.ssm_ckpt[il], ssm_slot), st.ssm[il]));
        // a tree verify's conv checkpoint: [C, d_conv-1+N] (channels fastest), column = [carried | node]
        ggml_tensor * seq = ggml_view_2d(ctx, st.conv_ckpt[il], C, n_keep + N, C * ggml_element_size(st.conv[il]), 0);
        ggml_tensor * conv = ggml_get_rows(ctx, seq, conv_cols);  // [C, n_keep]
        ggml_build_forward_expand(g.gf, ggml_cpy(ctx, ggml_transpose(ctx, conv), st.conv[il]));
    }
    for (ggml_tensor * ring : st.ring) {
        if (ring != nullptr) {
            move_rows(ring, ring_src, ring_dst);
        }
    }
    return g;
}

std::vector<int32_t> qwen35_tree_commit_moves(const qwen35_tree_commit & g, const qwen35_hparams & hp,
                                              const qwen35_state & st, uint32_t n_verified, uint32_t n_past,
                                              const std::vector<int32_t> & path) {
    check_tree_commit_path(st, n_verified, path);
    const size_t N = g.n_slots, L = path.size();
    const int64_t n_keep = hp.n_recurrent_layers() > 0 ? int64_t(hp.ssm_d_conv) - 1 : 0;
    if (L > N) {
        throw error("internal: tree commit path of " + std::to_string(L) + " nodes exceeds " + std::to_string(N));
    }
    std::vector<int32_t> m(4 * N + 1 + size_t(n_keep), 0);  // layout: qwen35_tree_commit::moves
    const uint32_t ring = std::max(st.ring_size, 1u);
    for (size_t i = 0; i < N; ++i) {  // past the path: the root row onto itself
        const uint32_t from = i < L ? uint32_t(path[i]) : 0, to = i < L ? uint32_t(i) : 0;
        m[i] = int32_t(n_past + from);
        m[N + i] = int32_t(n_past + to);
        m[2 * N + i] = int32_t((n_past + from) % ring);
        m[3 * N + i] = int32_t((n_past + to) % ring);
    }
    m[4 * N] = int32_t(n_verified - 1 - uint32_t(path.back()));
    for (int64_t w = 0; w < n_keep; ++w) {
        m[4 * N + 1 + size_t(w)] = int32_t(tree_commit_conv_column(hp, path, w));
    }
    return m;
}

ggml_cgraph * build_qwen35_tree_commit_copy_graph(ggml_context * ctx, const qwen35_hparams & hp,
                                                  const qwen35_state & st, uint32_t n_verified, uint32_t n_past,
                                                  const std::vector<int32_t> & path) {
    check_tree_commit_path(st, n_verified, path);
    if (!st.has_state_checkpoints()) {
        throw error("internal: a tree commit without the DeltaNet state checkpoints");
    }
    const size_t L = path.size();
    // nodes: a row copy is 3 (two views + cpy): 2 per path node per attention layer and ring, plus the
    // ssm copy (3) and the d_conv-1 conv column copies (4: two views, copy_by_kernel's view, cpy) per
    // DeltaNet layer
    const size_t n_nodes = (size_t(hp.n_layer) + st.ring.size()) * (6 * L + 4 * hp.ssm_d_conv + 8) + 16;
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, n_nodes, false);
    const int64_t D = int64_t(hp.ssm_d_state) * hp.ssm_d_state * hp.ssm_n_v_heads;
    auto copy_row = [&](ggml_tensor * t, int64_t from, int64_t to) {  // one row of a 2-D tensor, raw bytes
        ggml_tensor * src = ggml_view_1d(ctx, t, t->ne[0], from * t->nb[1]);
        ggml_tensor * dst = ggml_view_1d(ctx, t, t->ne[0], to * t->nb[1]);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, src, dst));
    };
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!hp.is_recurrent[il]) {
            for (size_t i = 1; i < L; ++i) {  // increasing i: no source is overwritten before it is read
                if (path[i] != int32_t(i)) {
                    copy_row(st.k[il], n_past + path[i], n_past + i);
                    copy_row(st.v[il], n_past + path[i], n_past + i);
                }
            }
            continue;
        }
        ggml_tensor * ck = st.ssm_ckpt[il];
        const size_t slot = n_verified - 1 - uint32_t(path.back());
        ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_view_1d(ctx, ck, D, slot * ck->nb[1]),
                                               ggml_reshape_1d(ctx, st.ssm[il], D)));
        ggml_tensor * cc = st.conv_ckpt[il];  // as a tree verify writes it: [conv_dim, d_conv-1+N]
        const size_t es = ggml_element_size(cc);
        for (int64_t w = 0; w < int64_t(hp.ssm_d_conv) - 1; ++w) {
            const int64_t col = tree_commit_conv_column(hp, path, w);
            ggml_tensor * src = ggml_view_2d(ctx, cc, 1, hp.conv_dim(), es, col * hp.conv_dim() * es);
            ggml_tensor * dst = ggml_view_2d(ctx, st.conv[il], 1, hp.conv_dim(), st.conv[il]->nb[1],
                                             w * ggml_element_size(st.conv[il]));
            ggml_build_forward_expand(gf, graph::copy_by_kernel(ctx, src, dst));  // 4-byte rows
        }
    }
    for (ggml_tensor * ring : st.ring) {
        for (size_t i = 1; i < L; ++i) {
            if (path[i] != int32_t(i)) {
                copy_row(ring, (n_past + path[i]) % st.ring_size, (n_past + i) % st.ring_size);
            }
        }
    }
    return gf;
}

ggml_cgraph * build_qwen35_backup_graph(ggml_context * ctx, const qwen35_hparams & hp, const qwen35_state & st,
                                        bool backup) {
    if (st.n_checkpoints == 0 || !st.has_state_checkpoints()) {
        throw error("internal: no checkpoint slot for a state backup");
    }
    // nodes per DeltaNet layer: the ssm copy (view, reshape, cpy), the conv copy (view, view, cpy)
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 6 * size_t(hp.n_layer) + 16, false);
    const int64_t D = int64_t(hp.ssm_d_state) * hp.ssm_d_state * hp.ssm_n_v_heads;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!hp.is_recurrent[il] || st.ssm[il] == nullptr) {
            continue;
        }
        ggml_tensor * ssm_slot = ggml_view_1d(ctx, st.ssm_ckpt[il], D, 0);
        ggml_tensor * ssm = ggml_reshape_1d(ctx, st.ssm[il], D);
        ggml_tensor * cc = st.conv_ckpt[il];
        ggml_tensor * conv_slot = ggml_view_2d(ctx, cc, hp.ssm_d_conv - 1, hp.conv_dim(), cc->nb[1], 0);
        if (backup) {
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ssm, ssm_slot));
            ggml_build_forward_expand(gf, graph::copy_by_kernel(ctx, st.conv[il], conv_slot));
        } else {
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ssm_slot, ssm));
            ggml_build_forward_expand(gf, graph::copy_by_kernel(ctx, conv_slot, st.conv[il]));
        }
    }
    return gf;
}

}  // namespace lucebox
